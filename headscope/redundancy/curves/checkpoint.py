"""The partial checkpoint of an unfinished pruning curve, so an interrupted run resumes where it stopped.

After every curve point the run writes `prune_curve.partial.json` (settings and finished points) and,
with recovery, the recovered copy's whole training state at that point (`Trainer.save`: weights,
optimizer, generator, step) as `prune_curve.partial.<n>.pt`, n the units removed. The pair is
crash-consistent: the new state file is written first under its own name, then the json that names it
replaces the old json in one rename (the commit), then the older state file is deleted. A crash at any
moment leaves a json naming a complete state file of the same point, so a resumed run draws the same
batches and takes the same steps as an uninterrupted one, and writes the same files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...errors import HeadscopeError
from ...io import atomic_write_text, inside
from ...train import Trainer
from .points import CurvePoint
from .recovery import Recovery

log = logging.getLogger(__name__)

PARTIAL_JSON = "prune_curve.partial.json"  # checkpoint of an unfinished run, resumed on rerun
PARTIAL_STATE = "prune_curve.partial.{n}.pt"  # the recovered copy's training state after n units went
# --method l0: the gates' training state (resumed to the same gates)
L0_STATE = "l0_gates.partial.pt"
# every state file, the current one and leftovers of a crash
_STATES = "prune_curve.partial*.pt"


def state_name(n_removed: int) -> str:
    """The state file of the checkpoint taken after `n_removed` units were removed."""
    return PARTIAL_STATE.format(n=n_removed)


def save_partial(folder: Path, settings: dict[str, Any], rows: list[CurvePoint], recovery: Recovery | None) -> None:
    """Write the finished points (and the recovered copy's training state) to `folder`, crash-consistently."""
    folder.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] | None = None
    if recovery is not None:
        name = state_name(recovery.n_removed)
        state = {"file": name, "n_removed": recovery.n_removed}
        recovery.trainer.save(folder / name, n_removed=recovery.n_removed)
    atomic_write_text(folder / PARTIAL_JSON, json.dumps(  # the commit: this json names its state file
        {"note": "unfinished headscope prune run; rerun the same command to resume, or delete this file",
         "settings": settings, "rows": [asdict(r) for r in rows], "state": state}, indent=1) + "\n")
    _drop_states(folder, keep=str(state["file"]) if state else None)


def _drop_states(folder: Path, keep: str | None) -> None:
    """Delete every state file but `keep` (older points', or one a crash left before its json was written)."""
    for f in folder.glob(_STATES):
        if f.name != keep:
            f.unlink(missing_ok=True)


def _damaged(path: Path, why: str) -> HeadscopeError:
    return HeadscopeError(f"{path} is damaged ({why}), so the unfinished run cannot resume; pass force=True to "
                          f"start over (or delete {PARTIAL_JSON})", fields=("force",))


def _read_saved(folder: Path) -> dict[str, Any]:
    path = folder / PARTIAL_JSON
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise _damaged(path, "not UTF-8 text") from None
    except ValueError as e:
        raise _damaged(path, f"not JSON: {e}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("rows"), list) or not saved["rows"]:
        raise _damaged(path, "no finished points")
    return saved


def _row_problem(r: CurvePoint) -> str:
    """What is wrong with a point read back from the json ('' when its fields have their types)."""
    number = (int, float)
    for name, kinds in (("step", int), ("n_removed", int), ("fraction_removed", number), ("metric", number),
                        ("drop", number)):
        value = getattr(r, name)
        if isinstance(value, bool) or not isinstance(value, kinds):
            return f"{name} is {value!r}, not a number"
    if not isinstance(r.removed, list) or not all(isinstance(u, str) for u in r.removed):
        return f"removed is {r.removed!r}, not a list of unit names"
    for name in ("extra", "extra_recovered", "bounds", "passages"):
        if not isinstance(getattr(r, name), dict):
            return f"{name} is not a JSON object"
    return ""


def resume(folder: Path, settings: dict[str, Any], recovery: Recovery | None
           ) -> list[CurvePoint]:
    """The finished points of the run saved in `folder` (its recovered copy's state loaded into `recovery`);
    refuses a run with other settings, and names a damaged checkpoint file."""
    saved = _read_saved(folder)
    if saved.get("settings") != settings:
        diff = sorted(k for k in set(settings) | set(saved.get("settings", {}))
                      if saved.get("settings", {}).get(k) != settings.get(k))
        raise HeadscopeError(
            f"{folder / PARTIAL_JSON} holds an unfinished run with other settings (differs in: {', '.join(diff)}); "
            f"rerun with the same settings to resume it, or pass force=True (or delete the file) to start over",
            fields=("force",))
    try:
        rows = [CurvePoint(**r) for r in saved["rows"]]
    except TypeError as e:
        raise _damaged(folder / PARTIAL_JSON, f"a point does not read: {e}") from None
    for r in rows:
        problem = _row_problem(r)
        if problem:
            raise _damaged(folder / PARTIAL_JSON, f"point {r.step!r}: {problem}")
    if recovery is not None:
        state = saved.get("state") or {}
        if not isinstance(state, dict) or "file" not in state:
            raise HeadscopeError(f"{folder / PARTIAL_JSON} names no recovered weights; pass force=True to start over",
                                 fields=("force",))
        state_file = inside(folder, state["file"], folder / PARTIAL_JSON, "pass force=True to start over",
                            fields=("force",))
        if not state_file.is_file():
            raise HeadscopeError(f"{folder / PARTIAL_JSON} names no recovered weights ({state_file.name} "
                                 f"is missing); pass force=True to start over", fields=("force",))
        try:
            blob = Trainer.read(state_file)
        except HeadscopeError as e:
            # cut, or not a state headscope wrote (never run: weights_only)
            raise HeadscopeError(f"{e}; the unfinished run cannot resume: pass force=True to start over (or delete "
                                 f"{PARTIAL_JSON})", fields=("force",)) from None
        if not isinstance(blob, dict) or "model" not in blob or blob.get("n_removed") != state.get("n_removed"):
            raise _damaged(state_file, "not the recovered weights its json names")
        recovery.trainer.load_state_dict(blob)
        recovery.n_removed = blob["n_removed"]
        _drop_states(folder, keep=state_file.name)  # a crash's leftover newer state
    log.info("resuming from %s: %d points, %d units removed", folder / PARTIAL_JSON, len(rows), rows[-1].n_removed)
    return rows


def clear_partial(folder: str | Path) -> None:
    """Delete a finished (or abandoned) run's checkpoint files."""
    (Path(folder) / PARTIAL_JSON).unlink(missing_ok=True)
    (Path(folder) / L0_STATE).unlink(missing_ok=True)
    _drop_states(Path(folder), keep=None)


__all__ = ["L0_STATE", "PARTIAL_JSON", "PARTIAL_STATE", "clear_partial", "resume", "save_partial", "state_name"]
