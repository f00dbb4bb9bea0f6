"""The options of `headscope compare BASE OTHER`: the two models, the capabilities, their sizes, the tolerance."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..models.loading import resolve_dtype
from ..options import DataOptions, IntervalOptions, OptionError, OutputOptions, option
from ..options.groups import DATA
from ..options.placement import check_device

COMPARE = "capabilities (docs/compare.md)"
CACHE = "OTHER through a head-aware KV cache (docs/compare.md)"
MODELS = "model and device"
# Rows a decoder supports, in the table's order; `pairs:<stem>` rows come from --pairs files.
DECODER_TASKS = ("lm", "ioi", "induction", "greater-than", "retrieval", "heads")
# Rows an encoder supports: fidelity of the final hidden states and the masked-LM pairs. `heads` adds, for each pair
# row, a row heads:<row>: what BASE's carrier heads of that task still carry in OTHER; and one row roles:<role> per
# role of the census (compare.census): how many heads hold it in each model.
ENCODER_TASKS = ("fidelity", "masked", "heads")
TASKS = tuple(dict.fromkeys((*DECODER_TASKS, *ENCODER_TASKS)))  # every row once (heads serves both)


def parse_tasks(text: str) -> tuple[str, ...]:
    """--tasks read: a comma-separated list of rows."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def parse_share(text: str) -> float:
    """A share read from the command line: '5%' or 0.05 (--tolerance, --keep-full)."""
    t = text.strip()
    try:
        return float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
    except ValueError:
        raise ValueError(f"must be a share such as 5% or 0.05; got {text!r}") from None


@dataclass(frozen=True, kw_only=True)
class CompareOptions(DataOptions, IntervalOptions, OutputOptions):
    """`headscope compare`: which capabilities OTHER kept, lost or gained against BASE, with paired intervals."""

    base: str = option(None, "the reference model: a built-in name (smollm2), a model directory or a .gguf file",
                       positional=True, required=True, reads=True)
    other: str = option(None, "the model to judge against BASE (what prune --save-model, gqa or mla wrote), with "
                              "BASE's tokenizer", positional=True, required=True, reads=True)
    device: str | None = option(None, "torch device for both models: cpu, cuda, cuda:1, mps (default: cpu)",
                                group=MODELS)
    dtype: str = option("float32", "weights' dtype (default float32); statistics accumulate in float64 whatever it "
                                   "is. float16 on CPU is slow (see docs/devices.md)",
                        metavar="{float32,bfloat16,float16}", group=MODELS)
    limit: int | None = option(32, "held-out passages of the language-model row (default 32)", at_least=1,
                               group=DATA)
    tasks: tuple[str, ...] = option((), "rows to measure, comma-separated: lm, ioi, induction, greater-than, "
                                        "retrieval (decoders), fidelity, masked (encoders), heads (the carrier heads "
                                        "of each pair row, and the role census: heads per role) (default: every row "
                                        "the family supports)",
                                    parse=parse_tasks, metavar="ROWS", group=COMPARE)
    pairs: tuple[str, ...] = option((), "a JSONL file of clean/corrupt pairs (the patch format), measured as its own "
                                        "row pairs:<file stem>; repeatable", metavar="FILE", append=True, reads=True,
                                    group=COMPARE)
    items: int = option(32, "pairs per pair task, built-in or --pairs (default 32)", at_least=2, at_most=4096,
                        group=COMPARE)
    long: int = option(512, "tokens per needle haystack of the retrieval row (default 512)", at_least=64,
                       at_most=1 << 20, metavar="N", group=COMPARE)
    haystacks: int = option(8, "needle haystacks of the retrieval row (default 8; depths 0.1, 0.35, 0.6, 0.85 in "
                               "turn)", at_least=2, most="haystacks", group=COMPARE)
    base_from: str | None = option(None, "the --out folder of an earlier compare against the same BASE: its BASE "
                                         "measurements are reused on the same items, so a second candidate costs one "
                                         "model's forwards", metavar="DIR", reads=True, group=COMPARE)
    cache: str | None = option(None, "run OTHER decoding through a head-aware KV cache: a kvcache --out folder (or "
                                     "its kvcache.json: the cache that run chose) or a DuoAttention pattern "
                                     "directory (full_attention_heads.tsv, config.json: what kvcache --export-card "
                                     "writes); `compare smollm2 smollm2 --cache DIR` judges the cache alone",
                               metavar="DIR", reads=True, group=CACHE)
    cache_row: str | None = option(None, "with --cache KVCACHE_OUT: the kvcache.json row to decode through, by name "
                                         "(full, score@25%, random@25%, learned@25%; default: the score's choice at "
                                         "the run's first budget)", metavar="ROW", group=CACHE)
    keep_full: float = option(0.5, "with --cache PATTERN: share of KV heads kept in full, those of highest score "
                                   "(default 50%; a kvcache plan holds its own)", parse=parse_share, above=0,
                              at_most=1, metavar="SHARE", group=CACHE)
    cache_reversed: bool = option(False, "with --cache PATTERN: keep the lowest-scoring KV heads in full instead (the "
                                         "same bytes, the pattern's choice turned upside down)", group=CACHE)
    tolerance: float = option(0.05, "the change, against BASE's value, within which a capability counts as kept: "
                                    "5%% or 0.05 (default 5%%)", parse=parse_share, above=0, below=1,
                              metavar="SHARE", group=COMPARE)

    def check(self) -> None:
        super().check()
        for name in ("base", "other"):
            if not getattr(self, name):
                raise OptionError(name, "is required: a built-in name, a model directory or a .gguf file")
        if self.device is not None:
            check_device(self.device)
        resolve_dtype(self.dtype)
        bad = [t for t in self.tasks if t not in TASKS]
        if bad:
            raise OptionError("tasks", f"takes {', '.join(TASKS)}; got {', '.join(bad)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise OptionError("tasks", f"names a row twice: {','.join(self.tasks)}")
        if self.cache is None and self.cache_row is not None:
            raise OptionError("cache_row", "picks a row of a kvcache plan; give cache, that kvcache run's output "
                                           "folder", also=("cache",))
        if self.cache is None and self.cache_reversed:
            raise OptionError("cache_reversed", "turns a cache pattern upside down; give cache, the pattern's folder",
                              also=("cache",))

    def check_paths(self) -> None:
        super().check_paths()
        if self.base_from is not None and not (Path(self.base_from) / "compare.json").is_file():
            raise OptionError("base_from", f"'{self.base_from}' holds no compare.json: give the output folder of an "
                                           f"earlier headscope compare against the same BASE")


__all__ = ["COMPARE", "DECODER_TASKS", "ENCODER_TASKS", "TASKS", "CompareOptions", "parse_share", "parse_tasks"]
