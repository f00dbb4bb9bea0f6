"""The options of `headscope report`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import OptionError
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

    def check(self) -> None:
        super().check()
        check_report_args(self.sentences, self.max_length, self.limit)
        check_from_dirs(self.from_dirs)


def check_from_dirs(from_dirs: Sequence[str | Path] | None) -> None:
    """Each of `from_dirs` is an existing folder (a file is named, with the folder to give instead)."""
    for d in from_dirs or ():
        if not str(d).strip():  # Path('') is the current folder: never read it by accident
            raise OptionError("from_dirs", "is empty text; give a folder holding other verbs' outputs")
        p = Path(d)
        if p.is_file():
            raise OptionError("from_dirs", f"{str(p)!r} is a file; give the folder holding a verb's outputs: "
                                           f"{str(p.parent)!r}")
        if not p.is_dir():
            raise OptionError("from_dirs", f"{str(p)!r} does not exist; give a folder holding other verbs' outputs")


def check_report_args(sentences: int, max_length: int | None, limit: int | None) -> None:
    """Refuse report options out of range before anything is loaded or computed."""
    if not isinstance(sentences, int) or sentences < 0:
        raise OptionError("sentences", f"must be 0 or more (0 = no example maps); got {sentences}")
    if max_length is not None and max_length < 2:
        raise OptionError("max_length", f"must be at least 2 tokens; got {max_length}")
    if limit is not None and limit < 1:
        raise OptionError("limit", f"must be at least 1; got {limit}")
