"""Errors meant for users: each message says what was wrong and what would work."""

from __future__ import annotations

import difflib
from typing import Iterable


class HeadscopeError(ValueError):
    """A user-facing error (bad input, unsupported model, refused overwrite).

    A message that names options names them as a Python caller gives them (`l0_steps`, `force=True`) and lists
    them in `fields`; the CLI says each under its flag (`--l0-steps`, `--force`). The library never writes a flag.
    """

    def __init__(self, *args: object, fields: tuple[str, ...] = ()):
        super().__init__(*args)
        self.fields = tuple(fields)


class OutputConflict(HeadscopeError):
    """An output location already holds results (refused without force=True): the user's error on the command line,
    a bug where headscope chose the folder itself (a study's stage)."""


class OptionError(HeadscopeError):
    """A bad option value: `name` is the Python keyword, `problem` says what is wrong and what would work.

    The library's message names the keyword (`limit must be at least 1; got 0`); the CLI prints the same
    problem under the flag (`--limit must be at least 1; got 0`). `also` lists other fields the problem names
    (`OptionError("by", "'entropy' needs scores", also=("scores",))`): the CLI says them as flags too.
    """

    def __init__(self, name: str, problem: str, also: tuple[str, ...] = ()):
        self.name, self.problem = name, problem
        super().__init__(f"{name} {problem}", fields=(name, *also))


def plural(n: int, noun: str, many: str | None = None) -> str:
    """'1 head', '2 heads' (or `many` for irregular plurals): counts in user-facing messages."""
    return f"{n} {noun if n == 1 else (many or noun + 's')}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return a ' (did you mean X?)' hint when `word` is close to one of `choices`, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
