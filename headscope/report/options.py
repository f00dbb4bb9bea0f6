"""The options of `headscope report`."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import ModelOptions, OutputOptions, option


@dataclass(frozen=True, kw_only=True)
class ReportOptions(ModelOptions, OutputOptions):
    """`headscope report`: the offline HTML report of every result in an output folder."""

    no_model: bool = option(False, "do not load the model: report only what the files hold (no example attention "
                                   "maps)")
    from_dirs: tuple[str, ...] = option((), "a directory holding other verbs' outputs; repeat for several (searched "
                                            "before --out)", flag="--from", metavar="DIR", append=True,
                                  reads=True)
    data: str | None = option(None, "text for the statistics (if computed here) and the example sentences (.txt, "
                                    ".jsonl or .conllu; default: the built-in English sample)")
    sentences: int = option(3, "example sentences (of at most 24 tokens) whose full attention maps are embedded "
                               "(default 3)", at_least=0)
    max_length: int | None = option(None, "tokens per passage for computed statistics", at_least=1)
    limit: int | None = option(None, "use only the first N passages for computed statistics", at_least=1)
