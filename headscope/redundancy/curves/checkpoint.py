"""The partial checkpoint of an unfinished pruning curve, so an interrupted run resumes where it stopped.

After every curve point the run writes `prune_curve.partial.json` (settings and finished points) and,
with recovery, `prune_curve.partial.pt`: the recovered copy's whole training state at that point
(`Trainer.save`: weights, optimizer, generator, step), so a resumed run draws the same batches and
takes the same steps as an uninterrupted one, and writes the same files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...errors import HeadscopeError
from ...io import atomic_write_text
from ...train import Trainer
from .points import CurvePoint
from .recovery import Recovery

log = logging.getLogger(__name__)

PARTIAL_JSON = "prune_curve.partial.json"  # checkpoint of an unfinished run, resumed on rerun
PARTIAL_STATE = "prune_curve.partial.pt"  # the recovered copy's training state at the last checkpoint
L0_STATE = "l0_gates.partial.pt"  # --method l0: the gates' training state (resumed to the same gates)


def save_partial(folder: Path, settings: dict[str, Any], rows: list[CurvePoint], recovery: Recovery | None) -> None:
    """Write the finished points (and the recovered copy's training state) to `folder`, atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    if recovery is not None:
        # Weights first, then the json: a crash in between leaves weights newer than the json,
        # which `resume` detects by the curve point stored with the weights.
        recovery.trainer.save(folder / PARTIAL_STATE, n_removed=recovery.n_removed)
    atomic_write_text(folder / PARTIAL_JSON, json.dumps(
        {"note": "unfinished headscope prune run; rerun the same command to resume, or delete this file",
         "settings": settings, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")


def resume(folder: Path, settings: dict[str, Any], recovery: Recovery | None
           ) -> list[CurvePoint]:
    """The finished points of the run saved in `folder` (its recovered copy's state loaded into `recovery`);
    refuses a run with other settings."""
    saved = json.loads((folder / PARTIAL_JSON).read_text(encoding="utf-8"))
    if saved.get("settings") != settings:
        diff = sorted(k for k in set(settings) | set(saved.get("settings", {}))
                      if saved.get("settings", {}).get(k) != settings.get(k))
        raise HeadscopeError(
            f"{folder / PARTIAL_JSON} holds an unfinished run with other settings (differs in: {', '.join(diff)}); "
            f"rerun with the same settings to resume it, or pass --force (or delete the file) to start over")
    rows = [CurvePoint(**r) for r in saved["rows"]]
    if recovery is not None:
        state_file = folder / PARTIAL_STATE
        blob = Trainer.read(state_file) if state_file.exists() else None
        valid = {r.n_removed for r in rows[-2:]}
        # A state without "model" was written by an older headscope, in another layout.
        if blob is None or "model" not in blob or blob.get("n_removed") not in valid:
            raise HeadscopeError(f"{folder} holds a curve checkpoint without matching recovered weights; "
                                 f"delete {PARTIAL_JSON} (or pass --force) to start over")
        recovery.trainer.load_state_dict(blob)
        recovery.n_removed = blob["n_removed"]
    log.info("resuming from %s: %d points, %d units removed", folder / PARTIAL_JSON, len(rows), rows[-1].n_removed)
    return rows


def clear_partial(folder: str | Path) -> None:
    """Delete a finished (or abandoned) run's checkpoint files."""
    for name in (PARTIAL_JSON, PARTIAL_STATE, L0_STATE):
        (Path(folder) / name).unlink(missing_ok=True)


__all__ = ["L0_STATE", "PARTIAL_JSON", "PARTIAL_STATE", "clear_partial", "resume", "save_partial"]
