"""The options of question 2's verbs: kv, sweep, gqa, mla, kvcache."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..io import check_writable_file
from ..models.capabilities import supported_model_types_for
from ..options import (
    CheckOptions,
    HeldoutOptions,
    IntervalOptions,
    ModelOptions,
    OptionError,
    OutputOptions,
    SeedOptions,
    check_device,
    option,
)
from ..options.parse import int_list
from ..options.spec import haystacks_problem
from ..train import check_settings
from .gqa.groupings import GROUPINGS
from .kv_bytes import normalize_dtype
from .kvcache.cache import check_window
from .kvcache.choice import parse_budgets
from .kvcache.compare import check_context
from .kvcache.learned import LearnedSettings

LEARNED = "learned KV heads (--choose learned)"
IN_PROCESS_SCORES = ("retrieval_score",)  # the scores kvcache --by can compute without --scores
UPTRAIN = "uptraining"


@dataclass(frozen=True, kw_only=True)
class KvOptions(OutputOptions):
    """`headscope kv`: the KV-cache size of a model's layouts."""

    model: str | None = option(None, "built-in name, model directory, config.json, or classic name", positional=True)
    max_length: int = option(4096, "tokens per sequence (default 4096)", at_least=1, old=("--seq",))
    batch_size: int = option(8, "sequences in the batch (default 8)", at_least=1, old=("--batch",))
    cache_dtype: str = option("bf16", "cache dtype: fp32, fp16, bf16, fp8, int8, int4 (default bf16)",
                              old=("--dtype",))
    kv_heads: str | None = option(None, "extra KV-head counts to compare, e.g. 2,4 (must divide n_heads)")
    classic: bool = option(False, "also print the built-in table of classic configs")
    out: str | None = option(None, "directory to write kv.csv into (default: print only)")  # type: ignore[assignment]

    def check(self) -> None:
        super().check()
        normalize_dtype(self.cache_dtype)
        if self.model is None and not self.classic:
            raise OptionError("model", "or classic=True: give one (a built-in name, model directory or config.json, "
                                       "or the table of classic configs)", also=("classic",))
        self.kv_head_counts()

    def kv_head_counts(self) -> list[int]:
        """The extra KV-head counts to compare (--kv-heads)."""
        if not self.kv_heads:
            return []
        try:
            return [int(t) for t in self.kv_heads.split(",") if t.strip()]
        except ValueError:
            raise OptionError("kv_heads", f"must be comma-separated integers like 2,4; got {self.kv_heads!r}") \
                from None

    def check_paths(self) -> None:
        if self.out is not None:
            super().check_paths()


@dataclass(frozen=True, kw_only=True)
class SweepOptions(SeedOptions, OutputOptions):
    """`headscope sweep`: small LMs trained from scratch at fixed d_model, varying heads."""

    task: str = option("ptb", "ptb: next-byte LM on Penn Treebank, scored on PTB valid; xor: XOR of two bits of a "
                              "random bit string, which one attention-only head provably cannot compute (at most "
                              "75%); pair: output the pair of tokens at two offsets (default: ptb)",
                       choices=("ptb", "xor", "pair"))
    d_model: int | None = option(None, "model width (default 256; xor: 64)", at_least=1)
    heads: tuple[int, ...] | None = option(None, "query-head counts, comma-separated (default 1,2,4,8,16,32; xor: "
                                                 "1,2,4,8,16; pair: 1,2,4)", parse=int_list)
    kv_heads: tuple[int, ...] | None = option(None, "KV-head counts to try for each head count (default: = heads, "
                                                    "MHA); those not dividing h are skipped", parse=int_list)
    d_head: tuple[int, ...] | None = option(None, "d_head values, independent of the head count (default: "
                                                  "d_model/h)", parse=int_list)
    layers: int | None = option(None, "layers (default 2 for ptb, 1 for xor and pair)", at_least=1)
    steps: int | None = option(None, "training steps per configuration (default 400; xor: 1000)", at_least=1,
                               most="steps")
    max_length: int | None = option(None, "tokens per training window (default 64; xor: 17 = 16 bits + the query "
                                          "token)", at_least=1, old=("--seq",))
    batch_size: int | None = option(None, "windows per step (default 32; xor: 128)", at_least=1, old=("--batch",))
    lr: float | None = option(None, "peak AdamW learning rate (default 3e-3)", above=0)
    init_std: float | None = option(None, "draw every weight matrix from N(0, STD) (default: GPT-2's init; xor: 0.2)")
    eval_tokens: int = option(65536, "validation targets scored (default 65536)", at_least=1)
    tokenization: str = option("byte", "PTB tokens (default byte)", choices=("byte", "word"))
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)", most="threads")
    out: str = option("headscope-sweep", "output directory (default: headscope-sweep/)")
    no_progress: bool = option(False, "no progress bars")

    def check(self) -> None:
        super().check()
        if self.threads is not None and self.threads < 1:
            raise OptionError("threads", f"must be positive; got {self.threads}")
        full = self.with_task_defaults()
        assert full.max_length is not None  # every task has a default
        if full.eval_tokens < full.max_length:
            raise OptionError("eval_tokens", f"must be at least max_length ({full.max_length}); got {full.eval_tokens}",
                              also=("max_length",))
        if full.init_std is not None and not full.init_std > 0:
            raise OptionError("init_std", f"must be positive; got {full.init_std}")

    def with_task_defaults(self) -> SweepOptions:
        """A copy with the task's defaults where a value was not given (`SWEEP_DEFAULTS`)."""
        return self.replace(**{name: value for name, value in SWEEP_DEFAULTS[self.task].items()
                               if getattr(self, name) is None})


# Per-task defaults of the sweep; every one can be overridden on the command line.
SWEEP_DEFAULTS: dict[str, dict[str, Any]] = {
    "ptb": dict(d_model=256, heads=(1, 2, 4, 8, 16, 32), layers=2, steps=400, max_length=64, batch_size=32, lr=3e-3,
                init_std=None),
    # xor: 16 bits + the query token, one target per sequence, so more sequences per step. GPT-2's small
    # init leaves this model at the symmetric point where XOR's gradient vanishes; N(0, 0.2) does not.
    "xor": dict(d_model=64, heads=(1, 2, 4, 8, 16), layers=1, steps=1000, max_length=17, batch_size=128, lr=3e-3,
                init_std=0.2),
    "pair": dict(d_model=256, heads=(1, 2, 4), layers=1, steps=400, max_length=64, batch_size=32, lr=3e-3,
                 init_std=None),
}


@dataclass(frozen=True, kw_only=True)
class ConversionOptions(ModelOptions, SeedOptions, HeldoutOptions, OutputOptions, CheckOptions):
    """What gqa and mla share: calibration and held-out text, one uptraining loop."""

    model: str = option(None, "built-in name (smollm2), a model directory, or a hub id",
                        positional=True, required=True, reads=True)
    data: str = option("ptb-train", "calibration and uptraining text: a built-in corpus (ptb-train|ptb-valid|"
                                    "ptb-test, ewt-test, gum-test, sample) or a .txt/.jsonl/.conllu file (default: "
                                    "ptb-train)", reads=True)
    heldout: str = option("ptb-valid", "held-out text for perplexity, same forms as --data (default: ptb-valid)",
                          reads=True)
    limit: int | None = option(None, "passages of --data to use (default: the first 200 of a built-in corpus, all "
                                     "of a file)", metavar="N", at_least=1, old=("--data-limit",))
    max_length: int = option(64, "tokens per passage (default 64)", at_least=1)
    batch_size: int = option(8, "passages per step (default 8)", at_least=1)
    steps: int = option(0, "uptraining steps after conversion (default 0)", metavar="N", at_least=0, most="steps",
                        old=("--uptrain",), group=UPTRAIN)
    loss: str = option("kd", "uptraining loss: kd = KL to the original model's next-token distribution, lm = "
                             "next-token cross-entropy (default: kd)", choices=("kd", "lm"), group=UPTRAIN)
    lr: float = option(0.001, "AdamW learning rate for uptraining (default 1e-3)", above=0, group=UPTRAIN)

    def check(self) -> None:
        super().check()
        if self.max_length < 2:  # a passage needs a token and the one after it
            raise OptionError("max_length", f"must be at least 2 tokens, got {self.max_length}")


@dataclass(frozen=True, kw_only=True)
class GqaOptions(ConversionOptions):
    """`headscope gqa`: a LLaMA-like model converted to fewer KV heads."""

    kv_heads: int | None = option(None, "KV heads after conversion (1 = MQA); must divide the model's current KV "
                                        "heads", required=True)
    grouping: str = option("mean", "how KV heads are grouped: one of the groupings listed below, each registered in "
                                   "capacity/gqa/groupings.py (default: mean)", metavar="GROUPING")
    search_candidates: int = option(8, "--grouping search: seeded (--seed) random groupings tried per layer besides "
                                       "adjacent and similarity (default 8)", metavar="N", at_least=1)
    train: str = option("attention", "what uptraining updates: attention = q/k/v/o projections, all = every "
                                     "parameter (default: attention)", choices=("attention", "all"), group=UPTRAIN)
    no_fallback: bool = option(False, "keep similarity groups even when adjacent groups do better on --data")

    def check(self) -> None:
        super().check()
        # the registry as it is now: a grouping registered later is accepted
        GROUPINGS.get(self.grouping)


@dataclass(frozen=True, kw_only=True)
class MlaOptions(ConversionOptions):
    """`headscope mla`: a LLaMA-like model converted to multi-head latent attention (MHA2MLA)."""

    kv_rank: int | None = option(None, "latent width cached per token and layer (below the full rank, min(d_model, "
                                       "n_kv_heads x (2 d_head - rope dims)): 360 for SmolLM2 with --rope-dims 8)",
                                 metavar="R", required=True)
    rope_dims: int | None = option(None, "key dimensions per KV head that keep RoPE, even, 2..d_head (default: "
                                         "d_head / 8, MHA2MLA's d_head / 16 frequencies; 8 for SmolLM2)",
                                   metavar="D")
    selection: str = option("2-norm", "which rotary frequencies stay: 2-norm = largest mean ||q_f|| x ||k_f|| on "
                                      "--data (MHA2MLA), high = the fastest ones (default: 2-norm)",
                            choices=("2-norm", "high"))

    def check(self) -> None:
        if self.kv_rank is not None and self.kv_rank < 1:
            raise OptionError("kv_rank", f"must be at least 1; got {self.kv_rank}")
        if self.rope_dims is not None and (self.rope_dims < 2 or self.rope_dims % 2):
            raise OptionError("rope_dims", f"must be an even number of at least 2 (each rotary frequency rotates "
                                           f"2 dimensions); got {self.rope_dims}")
        super().check()
        if self.device_map is not None:
            raise OptionError("device_map", f"{self.device_map!r}: mla builds new latent-attention modules in memory "
                                            "and cannot convert a dispatched model; give a device instead (and "
                                            "dtype='bfloat16' to halve the memory)", also=("dtype",))


@dataclass(frozen=True, kw_only=True)
class KvcacheOptions(IntervalOptions, OutputOptions, CheckOptions):
    """`headscope kvcache`: the head-aware KV cache (full KV for chosen heads, sink + window for the rest)."""

    model: str = option(None, "built-in name (smollm2), a model directory, or a hub id; model types: "
                              f"{', '.join(supported_model_types_for('kvcache'))} with 2+ KV heads per layer",
                        positional=True,
                        required=True, reads=True)
    device: str = option("cpu", "torch device (default: cpu)")
    allow_random_weights: bool = option(False, "load a checkpoint whose weights do not fill its config, the gaps "
                                               "randomly initialised; refused without it")
    keep_full: str | None = option(None, "share of KV heads kept full, in (0, 1]: 25% or 0.25; several give one "
                                         "cache each (e.g. 12.5%,25%,50%; default 25%)", metavar="SHARE[,SHARE...]")
    threshold: float | None = option(None, "instead of --keep-full: keep full every KV head with a query head "
                                           "scoring at least this")
    by: str = option("retrieval_score", "the per-head score, higher = keep full ('-COLUMN': lower = keep full). "
                                        "Without --scores only retrieval_score, measured on --haystacks needles "
                                        "(default: retrieval_score)", metavar="COLUMN")
    scores: str | None = option(None, "a per-head CSV (heads.csv, roles.csv from `headscope roles --long N`, "
                                      "importance.csv) holding --by", metavar="FILE", reads=True, old=("--from",))
    haystacks: int = option(4, "needle haystacks that measure the retrieval score (other facts than the evaluation "
                               "needles; default 4)", metavar="N", most="haystacks", old=("--score-haystacks",))
    sink: int = option(4, "first tokens every windowed head keeps (default 4)")
    window: int = option(256, "recent tokens every windowed head keeps, the current one included (default 256)")
    context: int = option(2048, "tokens per passage and per needle prompt (default 2048)")
    data: str = option("ptb-long", "long text for perplexity: ptb-long, gum-long or a file; the first --context "
                                   "tokens of each passage that has them (default ptb-long)", reads=True)
    limit: int = option(2, "passages for perplexity (default 2)", old=("--passages",))
    needles: int = option(4, "needle-in-a-haystack prompts answered by greedy generation through each cache "
                             "(default 4; 0: none)")
    chunk: int = option(512, "tokens per prefill forward (default 512; memory ~ chunk x vocabulary)")
    uptrain_steps: int = option(0, "uptraining steps after conversion (default 0)", metavar="N", at_least=0,
                                most="steps", old=("--uptrain",), group=UPTRAIN)
    loss: str = option("kd", "uptraining loss: kd = KL to the original model's next-token distribution, lm = "
                             "next-token cross-entropy (default: kd)", choices=("kd", "lm"), group=UPTRAIN)
    uptrain_lr: float = option(0.001, "AdamW learning rate for uptraining (default 1e-3)", above=0, old=("--lr",),
                               group=UPTRAIN)
    train_data: str | None = option(None, "uptraining text, same forms as --data (default: the passages of --data "
                                          "after those perplexity is measured on, so training never sees them)",
                                    metavar="DATA", reads=True, group=UPTRAIN)
    train_length: int = option(512, "tokens per uptraining passage: the texts cut into consecutive pieces (default "
                                    "512)", metavar="N", group=UPTRAIN)
    batch_size: int = option(1, "passages per uptraining step (default 1)", metavar="N", at_least=1,
                             old=("--train-batch",),
                             group=UPTRAIN)
    choose: str = option("score", "score: full KV heads by --by (and the random control); learned: also "
                                  "DuoAttention's mixing weights trained on passkey prompts from --data, their rows "
                                  "beside the others at equal bytes (default score)", choices=("score", "learned"),
                         group=LEARNED)
    learn_steps: int = option(20, "training steps of the mixing weights (default 20)", most="steps", group=LEARNED)
    learn_lr: float = option(0.02, "Adam learning rate of the weights (default 0.02)", group=LEARNED)
    learn_l1: float = option(0.05, "L1 penalty on the mean weight (default 0.05)", group=LEARNED)
    learn_prompts: int = option(8, "passkey prompts of --context tokens to train on (default 8)", most="haystacks",
                                group=LEARNED)
    no_random: bool = option(False, "skip the random control at equal bytes")
    export_card: str | None = option(None, "also write the head scores as DuoAttention's pattern directory "
                                           "(full_attention_heads.tsv [layers, KV heads] in [0, 1] and config.json "
                                           "with --sink and --window), which kvpress's DuoAttentionPress reads: a KV "
                                           "head scores its best query head (the rule --keep-full uses), min-max "
                                           "scaled, so its top --keep-full share is the set this run keeps full",
                                     metavar="DIR", whole=True)

    def check(self) -> None:
        super().check()
        check_device(self.device)
        problem = haystacks_problem(self.haystacks, self.context)
        if problem:
            raise OptionError("haystacks", problem)
        self.budgets()
        check_window(self.sink, self.window)
        for name, value, low in (("context", self.context, 2), ("limit", self.limit, 1), ("needles", self.needles, 0),
                                 ("chunk", self.chunk, 1), ("haystacks", self.haystacks, 1)):
            if value < low:
                raise OptionError(name, f"must be at least {low}; got {value}")
        check_context(self.context, self.sink, self.window)
        self._check_uptraining()
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise OptionError("threshold", f"must be a finite number; got {self.threshold}")
        if self.scores is None and self.by not in IN_PROCESS_SCORES:
            raise OptionError("by", f"{self.by!r} needs scores=FILE (a heads.csv or roles.csv holding it); without "
                                    f"scores headscope measures only {', '.join(IN_PROCESS_SCORES)}", also=("scores",))
        self.learned()

    def _check_uptraining(self) -> None:
        if self.uptrain_steps < 0:
            raise OptionError("uptrain_steps", f"must be 0 or more steps; got {self.uptrain_steps}")
        if self.uptrain_steps:
            check_settings(self.uptrain_steps, self.uptrain_lr)
            for name, value, low in (("train_length", self.train_length, 2), ("batch_size", self.batch_size, 1)):
                if value < low:
                    raise OptionError(name, f"must be at least {low}; got {value}")
            if self.threshold is not None:
                raise OptionError("uptrain_steps", "trains one model per keep_full budget; it does not take threshold",
                                  also=("keep_full", "threshold"))

    def budgets(self) -> list[float]:
        """The shares of KV heads kept full, one cache each (--keep-full; 25% when neither it nor --threshold)."""
        if self.threshold is not None and self.keep_full is not None:
            raise OptionError("keep_full", "(a share of KV heads) or threshold (a score): give one, not both",
                              also=("threshold",))
        return parse_budgets(self.keep_full or "25%")

    def learned(self) -> LearnedSettings | None:
        """The settings of --choose learned (None for --choose score); bad --learn-* values refused either way."""
        settings = LearnedSettings(steps=self.learn_steps, lr=self.learn_lr, l1=self.learn_l1,
                                   prompts=self.learn_prompts)
        if self.choose != "learned":
            return None
        if self.threshold is not None:
            raise OptionError("choose", "'learned' keeps the largest weights at each keep_full budget; it does not "
                                        "take threshold", also=("keep_full", "threshold"))
        return settings

    def check_paths(self) -> None:
        super().check_paths()
        if self.export_card is not None and not Path(self.export_card).is_dir():
            check_writable_file(self.export_card, "export_card")
