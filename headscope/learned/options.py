"""The options of question 1's verbs: analyze, roles, similar."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import HeadscopeError
from ..heads import Head
from ..io import check_writable_file
from ..options import (
    DataOptions,
    IntervalOptions,
    ModelOptions,
    OptionError,
    OutputOptions,
    StableOptions,
    WorkerOptions,
    option,
)
from ..options.spec import haystacks_problem
from .longctx import check_long_args
from .longctx.confidence import check_until_stable_long
from .similarity import check_cka_batch, check_thresholds

LONG = "long-range roles (docs/long_context.md)"
# beyond any model's positions: a block or a stride larger than --long is --long
MOST_POSITIONS = 1 << 24


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions(ModelOptions, DataOptions, IntervalOptions, OutputOptions, WorkerOptions):
    """`headscope analyze`: per-head attention statistics."""


@dataclass(frozen=True, kw_only=True)
class RolesOptions(ModelOptions, DataOptions, StableOptions, OutputOptions, WorkerOptions):
    """`headscope roles`: the role census."""

    treebank: str | None = option(None, "treebank for syntactic roles (Clark et al. 2019): ewt-test (built in: UD "
                                        "English-EWT test split) or a CoNLL-U file", reads=True)
    coref: str | None = option(None, "coreference data: gum-test (built in: UD English-GUM test split) or a CoNLL-U "
                                     "file with CorefUD Entity= annotations", reads=True)
    long: int | None = option(None, "also score retrieval (needle copy, Wu et al. 2024), streaming (sink + recent "
                                    "share), echo and induction at long range on sequences of N tokens (at most the "
                                    "model's positions)", metavar="N", group=LONG)
    long_data: str = option("gum-long", "long text for the streaming/echo/induction windows: gum-long, ptb-long "
                                        "(default gum-long) or a file; passages longer than N are cut into windows, "
                                        "never truncated", reads=True, group=LONG)
    long_windows: int = option(2, "windows of long text to score (default 2)", most="windows", group=LONG)
    stride: int | None = option(None, "tokens between the starts of a long passage's windows (default N: side by "
                                      "side); each position's query is counted in one window only",
                                at_most=MOST_POSITIONS, group=LONG)
    haystacks: int = option(4, "needle-in-a-haystack sequences for the retrieval score (default 4; depths 0.1, 0.35, "
                               "0.6, 0.85 in turn)", most="haystacks", group=LONG)
    block: int = option(128, "queries per block of the statistics kernel (default 128; memory ~ block x N per head)",
                        at_most=MOST_POSITIONS, group=LONG)
    export_card: str | None = option(None, "write per-head scores for KV-compression code; needs --long. "
                                           "--card-format retrieval-head: a file {\"layer-head\": [scores]} (Retrieval "
                                           "Head / HeadKV); duo: a directory (DuoAttention, kvpress "
                                           "DuoAttentionPress)", metavar="FILE", whole=True, group=LONG)
    card_format: str = option("retrieval-head", "retrieval-head (default) or duo: full_attention_heads.tsv [layers, "
                                                "KV heads] in [0, 1] (a KV head scores its best query head's "
                                                "--card-score, min-max scaled) and config.json (sink_size 4, "
                                                "recent_size 256: kvcache's defaults)",
                              choices=("retrieval-head", "duo"), group=LONG)
    card_score: str = option("retrieval", "score the card holds (default retrieval: one value per answered "
                                          "haystack)", choices=("retrieval", "streaming", "echo", "induction"),
                             group=LONG)

    def check(self) -> None:
        super().check()
        if self.long is not None:
            check_long_args(None, self.long, self.haystacks, self.long_windows, self.stride, self.block)
            check_until_stable_long(self.until_stable, self.haystacks, self.long_windows)
        if self.export_card is not None and self.long is None:
            raise OptionError("export_card", "needs long=N (the card holds long-range scores)", also=("long",))
        problem = haystacks_problem(self.haystacks, self.long) if self.long is not None else None
        if problem:
            raise OptionError("haystacks", problem)

    def check_paths(self) -> None:
        super().check_paths()
        check_card_path(self.export_card)


@dataclass(frozen=True, kw_only=True)
class SimilarOptions(ModelOptions, DataOptions, IntervalOptions, OutputOptions):
    """`headscope similar`: head-to-head similarity and near-duplicate clusters."""

    top: int = option(20, "pairs to print (default 20); these get js's interval over passages (js_lo, js_hi)",
                      at_least=0)
    js_max_tokens: int | None = option(None, "average JS over at most N query tokens, a seeded random sample (for "
                                             "big models; default: every query)", at_least=1)
    js_max: float = option(0.05, "near-duplicate: every pair in a cluster has js <= this (default 0.05)")
    cka_min: float = option(0.8, "near-duplicate: every pair in a cluster has cka >= this (default 0.8)")
    cka: str = option("minibatch", "CKA estimator: minibatch unbiased HSIC (Nguyen et al. 2021; memory heads x "
                                   "batch^2, the default) or exact (the full-data CKA of the (heads x d_head)^2 "
                                   "cross-covariance, computed in blocks of at most --cka-memory with the head "
                                   "outputs spilled to the temporary folder, TMPDIR: heads x d_head x 4 bytes a "
                                   "token)", choices=("minibatch", "exact"))
    cka_batch: int = option(256, "tokens per CKA minibatch (default 256, at least 8)")
    cka_pool: int = option(2048, "tokens pooled before minibatches are drawn at random from them, mixing passages "
                                 "(default 2048; memory pool x heads x d_head)")
    cka_memory: int = option(192, "with --cka exact: MiB of the cross-covariance held at once (default 192); less "
                                  "memory means more reads of the spilled outputs", metavar="MiB", most="memory_mib")

    def check(self) -> None:
        super().check()
        if self.top < 0:
            raise OptionError("top", f"must be 0 or more, got {self.top}")
        check_thresholds(self.js_max, self.cka_min)
        check_cka_batch(self.cka_batch)
        if self.cka_pool < 0:
            raise OptionError("cka_pool", f"must be 0 or more tokens, got {self.cka_pool}")
        if self.cka_memory < 1:
            raise OptionError("cka_memory", f"must be at least 1 MiB, got {self.cka_memory}")


PATCH = "patching (docs/patching.md)"


def _methods(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


# each receiver costs about 3 x (heads before it) / copies forwards per batch of pairs
MOST_RECEIVERS = 256


def path_receivers(text: str) -> int | list[Head]:
    """--paths read: 0 for `logits` (paths to the logits alone), N for the N heads of largest |effect|, or the
    heads named (L5H1,L6H0)."""
    t = text.strip()
    if t.lower() == "logits":
        return 0
    if t.isdigit():
        n = int(t)
        if not 1 <= n <= MOST_RECEIVERS:
            raise OptionError("paths", f"takes 1 to {MOST_RECEIVERS} receivers (the heads of largest effect); got {n}")
        return n
    return head_list(t, "paths", "must be a number of receivers, heads such as L5H1,L6H0, or logits")


def head_list(text: str, name: str, what: str) -> list[Head]:
    """Heads written L5H1,L6H0 (1 to MOST_RECEIVERS of them), or the option's problem naming `what` it takes."""
    try:
        heads = [Head.parse(h) for h in text.split(",") if h.strip()]
    except HeadscopeError as e:
        raise OptionError(name, f"{what}; {e}") from e
    if not 1 <= len(heads) <= MOST_RECEIVERS:
        raise OptionError(name, f"takes 1 to {MOST_RECEIVERS} heads; got {len(heads)}")
    twice = next((h for i, h in enumerate(heads) if h in heads[:i]), None)
    # a receiver named twice would write its paths twice; a sender twice is a typo
    if twice is not None:
        raise OptionError(name, f"names {twice} twice; name each head once (got {text.strip()!r})")
    return heads


@dataclass(frozen=True, kw_only=True)
class PatchOptions(ModelOptions, IntervalOptions, OutputOptions):
    """`headscope patch`: each head's causal effect on clean/corrupt prompt pairs (activation patching)."""

    pairs: str | None = option(None, "JSONL of {\"clean\", \"corrupt\", \"answer\", \"wrong\"} objects, one a line "
                                     "(clean and corrupt of the same token length; answer and wrong one token each)",
                               metavar="FILE", reads=True, group=PATCH)
    task: str | None = option(None, "a built-in pair set instead of --pairs: ioi, greater-than, induction (decoders) "
                                    "or masked (encoders)", choices=("ioi", "greater-than", "induction", "masked"),
                              group=PATCH)
    metric: str = option("logit_diff", "logit_diff (default: logit(answer) - logit(wrong)), prob (p(answer)) or loss "
                                       "(-log p(answer)), at the last position (the mask's on encoders)",
                         choices=("logit_diff", "prob", "loss"), group=PATCH)
    direction: str = option("denoising", "denoising (default: the corrupt run with one head's clean output) or "
                                         "noising (the clean run with one head's corrupt output)",
                            choices=("denoising", "noising"), group=PATCH)
    positions: str = option("all", "all (default: patch every position at once) or each (one position at a time: "
                                   "patching_positions.csv)", choices=("all", "each"), group=PATCH)
    methods: tuple[str, ...] = option(("exact", "attribution"), "exact,attribution (default) or attribution alone "
                                                                "(first order: one forward and backward per batch)",
                                      flag="--method", parse=_methods, group=PATCH)
    limit: int | None = option(None, "pairs to use (default: all)", at_least=1, group=PATCH)
    batch_size: int = option(8, "pairs per forward pass (default 8)", at_least=1, at_most=65_536, group=PATCH)
    paths: str | None = option(None, "path patching (paths.csv): every head to the logits and every earlier head to "
                                     "the queries, keys and values of the receivers: N (the N heads of largest "
                                     "effect), heads (L5H1,L6H0) or logits (no receivers)", metavar="N|HEADS|logits",
                               group=PATCH)
    senders: str | None = option(None, "with --paths: these heads patched together as one sender (L17H4,L20H0: a "
                                       "class of heads, as Wang et al.'s S-inhibition heads), instead of each head "
                                       "alone", metavar="HEADS", group=PATCH)
    copies: int = option(16, "heads patched per forward, each in its own copy of the batch (default 16; memory "
                             "copies x batch)", at_least=1, at_most=4096, group=PATCH)

    def check(self) -> None:
        super().check()
        if (self.pairs is None) == (self.task is None):
            raise OptionError("pairs", "or task: give exactly one (a JSONL file of pairs, or a built-in set: "
                                       "ioi, greater-than, induction, masked)", also=("task",))
        bad = [m for m in self.methods if m not in ("exact", "attribution")]
        if bad or not self.methods:
            raise OptionError("methods", f"must be exact,attribution or attribution; got {','.join(self.methods)!r}")
        if self.positions == "each" and "exact" not in self.methods:
            raise OptionError("positions", "each needs the exact method (attribution is per head only)")
        if self.paths is not None:
            path_receivers(self.paths)
        if self.senders is not None:
            if self.paths is None:
                raise OptionError("senders", "needs paths: the receivers (or logits) the set's heads send to",
                                  also=("paths",))
            head_list(self.senders, "senders", "must be heads such as L17H4,L20H0")


CIRCUIT = "circuits (docs/circuits.md)"


@dataclass(frozen=True, kw_only=True)
class CircuitOptions(ModelOptions, IntervalOptions, OutputOptions):
    """`headscope circuit`: edge attribution over heads, their q/k/v inputs and MLPs, and circuits at every size
    with their faithfulness (MIB's circuit track)."""

    pairs: str | None = option(None, "JSONL of {\"clean\", \"corrupt\", \"answer\", \"wrong\"} objects, one a line "
                                     "(as headscope patch reads them)", metavar="FILE", reads=True, group=CIRCUIT)
    task: str | None = option(None, "a built-in pair set instead of --pairs: ioi, greater-than or induction",
                              choices=("ioi", "greater-than", "induction"), group=CIRCUIT)
    method: str = option("eap-ig", "eap-ig (default: integrated gradients over the inputs, MIB's recommended "
                                   "variant) or eap (the gradient on the clean run)", choices=("eap", "eap-ig"),
                         group=CIRCUIT)
    ig_steps: int = option(5, "EAP-IG's runs between the corrupt and clean embeddings (default 5, MIB's)",
                           at_least=1, at_most=64, group=CIRCUIT)
    limit: int | None = option(None, "pairs to use (default: all)", at_least=1, group=CIRCUIT)
    batch_size: int = option(8, "pairs per forward pass (default 8)", at_least=1, at_most=4096, group=CIRCUIT)

    def check(self) -> None:
        super().check()
        if (self.pairs is None) == (self.task is None):
            raise OptionError("pairs", "or task: give exactly one (a JSONL file of pairs, or a built-in set: "
                                       "ioi, greater-than, induction)", also=("task",))


def check_card_path(path: str | None) -> None:
    """An --export-card target: a file whose folder is writable (an existing folder: the duo format's)."""
    if path is not None and not Path(path).is_dir():
        check_writable_file(path, "export_card")


__all__ = ["AnalyzeOptions", "CircuitOptions", "OptionError", "PatchOptions", "RolesOptions", "SimilarOptions",
           "check_card_path"]
