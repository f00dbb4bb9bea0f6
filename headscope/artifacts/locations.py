"""Where a verb writes, checked against itself and against what it reads, before any work.

A results folder, a card and an exported file must not be one path or hold one another, and nothing a verb
reads (its model folder, --data, ...) may lie where it writes: it would be overwritten (or, with --force,
replaced) after it was read, and a rerun would find it gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..errors import HeadscopeError

MODEL = "the model"  # `read`'s key for the model folder a verb loads


def _at_or_under(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def check_locations(out: tuple[str, Path, list[str]] | None, whole: dict[str, Path], read: dict[str, Path],
                    reserved: Mapping[str, str] | None = None) -> None:
    """Refuse, before any work, output locations that collide with each other or with an input.

    `out`: (option, folder, the names written into it); `whole`: outputs replaced whole (a card, export's file,
    an offload folder), by option; `read`: inputs by option (a model folder, --data, ...); `reserved`: the file
    names verbs write ({name: verb}). Refused: two outputs at one path; an output folder inside one replaced whole;
    an input at or under anything written (it would be overwritten, or replaced with --force, after it was read);
    --out being the model's own folder; an output replaced whole named like a verb's own file (a card called
    heads.csv: the folder holding it would later read as that verb's results).
    """
    real = {k: Path(v).expanduser().resolve() for k, v in whole.items()}
    targets = dict(real)
    if out is not None:
        option, folder, names = out
        top = Path(folder).expanduser().resolve()
        for k, p in real.items():
            if p == top or _at_or_under(top, p):
                raise HeadscopeError(f"{k} {str(whole[k])!r} and {option} {str(folder)!r} are the same place or one "
                                     f"holds the other: writing {k} would replace {option}; give them separate paths")
            if p.parent == top and p.name in names:
                raise HeadscopeError(f"{k} {str(whole[k])!r} is a file {option} writes ({p.name}); give {k} another "
                                     f"name")
        targets.update({f"{option} {str(folder)!r} ({n})": top / n for n in names})
        # a model's folder is not a results folder (--from OUT --out OUT is: report)
        for k, v in read.items():
            if k == MODEL and Path(v).expanduser().resolve() == top:
                raise HeadscopeError(f"{option} {str(folder)!r} is {k}'s own folder: results would mix with its "
                                     f"files; choose another {option}")
    for k, given in whole.items():
        name = Path(given).name
        verb = (reserved or {}).get(name)
        if verb is not None:
            raise HeadscopeError(f"{k} {str(given)!r} is named like headscope {verb}'s own {name}: a folder "
                                 f"holding it would read as {verb}'s results (where report and view look); give "
                                 f"{k} another name")
    keys = list(real)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if _at_or_under(real[a], real[b]) or _at_or_under(real[b], real[a]):
                raise HeadscopeError(f"{a} {str(whole[a])!r} and {b} {str(whole[b])!r} are the same place or one "
                                     f"holds the other; give them separate paths")
    for k, v in read.items():
        p = Path(v).expanduser().resolve()
        for label, t in targets.items():
            if _at_or_under(p, t):
                raise HeadscopeError(f"{k} {str(v)!r} lies where {label} writes: it would be overwritten; read it "
                                     f"from elsewhere or choose another output path")


__all__ = ["MODEL", "check_locations"]
