"""The options of `headscope study`."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import OutputOptions, check_device, option
from .budget import parse_duration


@dataclass(frozen=True, kw_only=True)
class StudyOptions(OutputOptions):
    """`headscope study`: every stage the model's family supports, within a time budget, then the report."""

    # A decoder by default: the first study a newcomer runs answers all three questions, causal heads included
    # (MiniLM, the built-in encoder, ships no LM head, so it has no logits to patch).
    model: str = option("smollm2", "built-in name (smollm2, minilm, gemma3), a model directory, or a hub id "
                                   "(default: smollm2)", positional=True)
    budget: str = option("10m", "wall time for the whole study, e.g. 10m, 90s, 1h30m (default 10m); it ends within "
                                "the budget plus 10% (at least 30 s)")
    data: str | None = option(None, "text for every stage: a built-in corpus (ptb-valid, ptb-train, sample, ...) or a "
                                    ".txt, .jsonl or .conllu file (default: PTB valid for the statistics, roles, "
                                    "similarity and scores; PTB train to score and PTB valid to measure the pruning "
                                    "curve)")
    device: str | None = option(None, "torch device (default: cpu)")
    allow_random_weights: bool = option(False, "study a checkpoint whose weights do not fill its config (the missing "
                                               "ones start random), on purpose")
    out: str = option("headscope-study", "output folder (default: headscope-study/)")
    force: bool = option(False, "start over: remove a previous study's files in --out")

    @property
    def budget_s(self) -> float:
        """The budget in seconds."""
        return parse_duration(self.budget)

    def check(self) -> None:
        super().check()
        parse_duration(self.budget)
        if self.device is not None:
            check_device(self.device)
