"""`Result`: what a verb's library function returns. Nothing is written until `save`.

A result knows its files (`write` puts them in a folder), what the CLI prints (`lines`) and its main table
(`to_pandas`). `save(out)` stages the files beside `out` and moves them in together, so a reader never sees
half a result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from ..io import staged


class Result(ABC):
    """A verb's result in memory."""

    #: the file names `write` creates (what `--force` may replace and the CLI refuses to overwrite)
    files: tuple[str, ...] = ()

    @abstractmethod
    def write(self, folder: Path) -> None:
        """Write this result's files into `folder` (an empty staging folder when called by `save`)."""

    @abstractmethod
    def lines(self) -> list[str]:
        """What the CLI prints for this result, one string a line."""

    @abstractmethod
    def to_pandas(self) -> Any:
        """The result's main table as a pandas DataFrame."""

    def save(self, out: str | Path, force: bool = False) -> list[Path]:
        """Write the files into `out` together (staged beside it, then moved); returns their paths."""
        out = Path(out)
        with staged(out, force) as stage:
            self.write(stage)
            names = sorted(p.name for p in stage.iterdir())
        return [out / n for n in names]
