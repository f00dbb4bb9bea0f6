"""`Result`: what a verb's library function returns. Nothing is written until `save`.

A result knows its files (`write` puts them in a folder), what the CLI prints (`lines`) and its main table
(`to_pandas`). `save(out)` stages the files beside `out` and moves them in together, so a reader never sees
half a result.

Some verbs write a different set of files on different runs (optional files in headscope.artifacts, such as
patch's composition.npz). `save` finds the declared verb whose set this result's files are, refuses (without
`force`, before anything is written) a folder already holding any file that verb may write, and removes those
this run does not write once the new set is in place: no file of an earlier run stays beside this one's.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from ..artifacts import ARTIFACTS, outputs
from ..errors import OutputConflict
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
        """Write the files into `out` together (staged beside it, then moved); returns their paths. The files of
        an earlier run of the same verb that this run does not write are removed once the new ones are in."""
        out = Path(out)
        earlier = earlier_outputs(out, self.files, force)
        with staged(out, force) as stage:
            self.write(stage)
            names = sorted(p.name for p in stage.iterdir())
        for name in earlier - set(names):
            _remove(out / name)
        return [out / n for n in names]


def declared_set(files: tuple[str, ...] | list[str]) -> list[str]:
    """Every file the declared verb writing `files` may write (its optional ones included): the verb whose
    declared files hold all of `files` and whose every-run files are among them. [] when no single verb is
    (a report's figures, a study's folders: their sets are not declared)."""
    verbs = {v for a in ARTIFACTS.values() for v in a.verbs}
    got = set(files)
    fits = [v for v in sorted(verbs) if got <= set(outputs(v, optional=True)) and set(outputs(v)) <= got]
    return outputs(fits[0], optional=True) if got and len(fits) == 1 else []


def earlier_outputs(out: Path, files: tuple[str, ...] | list[str], force: bool) -> set[str]:
    """The files of `files`' declared verb that `out` already holds: refused without `force`."""
    held = [n for n in declared_set(files) if (out / n).exists() or (out / n).is_symlink()]
    if held and not force:
        raise OutputConflict(f"output directory {str(out)!r} already holds {', '.join(held)}; pass force=True "
                             f"to replace them or choose another folder as out", fields=("force", "out"))
    return set(held)


def _remove(path: Path) -> None:
    """An earlier run's file, or folder (model/), gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
