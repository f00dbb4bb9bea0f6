"""Errors meant for users: each message says what was wrong and what would work."""

from __future__ import annotations

import difflib
from typing import Iterable


class HeadscopeError(ValueError):
    """A user-facing error (bad input, unsupported model, refused overwrite)."""


class OutputConflict(HeadscopeError):
    """An output location already holds results (refused without --force): the user's error on the command line,
    a bug where headscope chose the folder itself (a study's stage)."""


def plural(n: int, noun: str, many: str | None = None) -> str:
    """'1 head', '2 heads' (or `many` for irregular plurals): counts in user-facing messages."""
    return f"{n} {noun if n == 1 else (many or noun + 's')}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return a ' (did you mean X?)' hint when `word` is close to one of `choices`, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
