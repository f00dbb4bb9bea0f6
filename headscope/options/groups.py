"""The option groups verbs share: model and placement, data, tokens and batch, seed, intervals, held-out data,
output, workers. Each group validates its own fields once; a verb's options inherit the groups it needs and
redeclare a field only where its default differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..io import check_writable_dir
from ..models.adapter import HeadModel
from ..models.loading import check_device_map, load_model, resolve_dtype
from ..uncertainty import IntervalSettings, check_settings
from .base import Options
from .placement import check_device, parse_max_memory, read_device_map
from .spec import OptionError, option

# One seed rule for every verb: what torch's generators, numpy's (legacy np.random.seed included) and
# Python's random all accept, so a seed that passes here never fails deep in a run.
SEED_MAX = 2**32 - 1
DEFAULT_LIMIT_TEXT = (
    "use only the first N passages (default: a built-in corpus gives its first {}, a file is read whole)")

MODEL = "model and device"
DATA = "data"
INTERVALS = "uncertainty (docs/uncertainty.md)"
OUTPUT = "output"
CHECK = "what it broke (docs/compare.md)"


@dataclass(frozen=True, kw_only=True)
class ModelOptions(Options):
    """The model a verb loads and where it goes."""

    model: str = option("minilm", "built-in name (minilm, smollm2), a model directory, or a hub id (default: minilm)",
                        positional=True, reads=True)
    device: str | None = option(None, "torch device for the whole model: cpu, cuda, cuda:1, mps (default: cpu; "
                                      "not with --device-map)", group=MODEL)
    dtype: str = option("float32", "weights' dtype (default float32); statistics accumulate in float64 whatever it "
                                   "is. float16 on CPU is slow (see docs/devices.md)",
                        metavar="{float32,bfloat16,float16}", group=MODEL)
    device_map: str | None = option(None, "spread a model too large for one device over GPUs, CPU memory and disk "
                                          "(accelerate's big-model dispatch), by a strategy or a JSON file "
                                          "{module: device}; not with --device",
                                    metavar="{auto,balanced,balanced_low_0,sequential,FILE.json}", group=MODEL)
    max_memory: str | None = option(None, "with --device-map: memory each device may hold, e.g. "
                                          "0=20GiB,1=20GiB,cpu=60GiB (the rest goes to disk)",
                                    metavar="DEV=SIZE,...", group=MODEL)
    offload_dir: str | None = option(None, "with --device-map: folder for weights offloaded to disk (default: a "
                                           "temporary folder, removed afterwards)", metavar="DIR", whole=True,
                                     group=MODEL)
    allow_random_weights: bool = option(False, "load a checkpoint whose weights do not fill its config (layers "
                                               "missing, tensors it has no place for), the gaps randomly "
                                               "initialised; refused without it", group=MODEL)

    def check(self) -> None:
        super().check()
        if self.device is not None:
            check_device(self.device)
        resolve_dtype(self.dtype)
        check_device_map(read_device_map(self.device_map), self.device)
        if self.device_map is None:
            for name, v in (("max_memory", self.max_memory), ("offload_dir", self.offload_dir)):
                if v is not None:
                    raise OptionError(name, "places a model spread over devices; give device_map='auto' with it",
                                      also=("device_map",))
        parse_max_memory(self.max_memory)

    def check_paths(self) -> None:
        super().check_paths()
        if self.offload_dir is not None:
            check_writable_dir(self.offload_dir, option="offload_dir")

    def load(self) -> HeadModel:
        """The model these options name, loaded as they place it."""
        return load_model(self.model, device=self.device, dtype=self.dtype,
                          device_map=read_device_map(self.device_map), max_memory=parse_max_memory(self.max_memory),
                          offload_folder=self.offload_dir, allow_random_weights=self.allow_random_weights)


@dataclass(frozen=True, kw_only=True)
class SeedOptions(Options):
    seed: int = option(0, "random seed (default 0)", group=DATA)

    def check(self) -> None:
        super().check()
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= SEED_MAX:
            raise OptionError("seed", f"must be a whole number from 0 to {SEED_MAX} (2**32 - 1, what torch, numpy "
                                      f"and random all accept); got {self.seed}")


@dataclass(frozen=True, kw_only=True)
class DataOptions(SeedOptions):
    """The passages a verb reads, how many, how long and how many at a time."""

    data: str | None = option(None, "a .txt (one passage a line), .jsonl (a 'text' field) or .conllu file "
                                    "(default: the built-in English sample)", reads=True, group=DATA)
    max_length: int | None = option(None, "tokens per passage (default 128, capped at the model's)", at_least=1,
                                    group=DATA)
    batch_size: int = option(16, "passages per forward pass (default 16)", at_least=1, group=DATA)
    limit: int | None = option(None, DEFAULT_LIMIT_TEXT.format(256), at_least=1, group=DATA)


@dataclass(frozen=True, kw_only=True)
class HeldoutOptions(Options):
    """A second, held-out text a verb evaluates on."""

    heldout: str | None = option(None, "held-out text the metric is measured on", reads=True, group=DATA)
    heldout_limit: int | None = option(None, "use only the first N held-out passages", at_least=1, group=DATA)


@dataclass(frozen=True, kw_only=True)
class IntervalOptions(SeedOptions):
    """Every figure's confidence interval (its bootstrap seeded by --seed)."""

    ci: float = option(0.95, "confidence level of every interval, in (0, 1) (default 0.95; BCa bootstrap over "
                             "passages)", metavar="LEVEL", group=INTERVALS)
    bootstrap: int = option(1000, "bootstrap resamples of the passages, at least 100 (default 1000, seeded by "
                                  "--seed)", metavar="B", group=INTERVALS)

    def check(self) -> None:
        super().check()
        check_settings(self.ci, self.bootstrap)

    def intervals(self) -> IntervalSettings:
        """The interval settings these options ask for."""
        return IntervalSettings(level=self.ci, B=self.bootstrap, seed=self.seed)


@dataclass(frozen=True, kw_only=True)
class StableOptions(IntervalOptions):
    """Intervals, and reading passages until a ranking is stable."""

    until_stable: float | None = option(None, "read passages in chunks until the ranking's split-half stability "
                                              "(Spearman-Brown) reaches R, e.g. 0.9, capped by --limit; the final "
                                              "line says whether it did", metavar="R", group=INTERVALS)

    def check(self) -> None:
        super().check()
        if self.until_stable is not None and not 0.0 < self.until_stable < 1.0:
            raise OptionError("until_stable", f"must be a split-half stability in (0, 1), e.g. 0.9; got "
                                              f"{self.until_stable}")


@dataclass(frozen=True, kw_only=True)
class OutputOptions(Options):
    """The folder a verb writes, and whether it may replace what is there."""

    out: str = option("headscope-out", "output directory (default: headscope-out/)", group=OUTPUT)
    force: bool = option(False, "overwrite results already in --out", group=OUTPUT)

    def check_paths(self) -> None:
        super().check_paths()
        check_writable_dir(self.out, option="out")


@dataclass(frozen=True, kw_only=True)
class CheckOptions(Options):
    """Whether a compressing verb's command ends with a short compare of what it wrote against its input model
    (`headscope.compare.check`); the field is named for what it does, its flag is --check / --no-check."""

    capability_check: bool = option(True, "end with a short compare of the compressed model against the input "
                                          "model (decoders: lm, induction, ioi, retrieval; encoders: fidelity, "
                                          "masked; kvcache: the input decoding through the chosen cache): one line "
                                          "per lost capability, compare.csv and compare.json in --out; --no-check "
                                          "skips it", flag="--check", group=CHECK)


@dataclass(frozen=True, kw_only=True)
class WorkerOptions(Options):
    workers: int = option(1, "processes that share the scan (default 1); the same as `torchrun --nproc-per-node N "
                             "-m headscope ...`, see docs/distributed.md", at_least=1)
