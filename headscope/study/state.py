"""study.json: what a study planned, ran, reused and left out, written after every stage.

A stage is reused when study.json records it done under the same key (the model's fingerprint, the data's
sha256 and the stage's exact options: its verb and Options in canonical form, `verbs.Call.canonical`) and every
file it wrote is still there with the recorded sha256.
An interrupted study left the finished stages recorded: the same command continues after them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from ..artifacts import STUDY_JSON
from ..errors import HeadscopeError
from ..io import atomic_write_text, inside
from ..redundancy.curves import PARTIAL_JSON
from .stages import SUBDIRS
from .verbs import verb_files

STUDY_NAME = STUDY_JSON.name
LOG_DIR = "study-logs"
FORMAT = 1
# the report's figures (report.build.figure_names: the ones it names)
FIGURE_GLOB = "report-*.png"


def stage_key(model_fp: str, data_fp: dict[str, Any], call: str | list[str]) -> str:
    """The identity of one stage's result: model fingerprint, data hashes and the verb's options (a Call's
    canonical JSON; the study's own settings as a list)."""
    blob = json.dumps({"model": model_fp, "data": data_fp, "options": call, "format": FORMAT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def file_hashes(root: Path, names: list[str]) -> dict[str, str]:
    """sha256 of every file under `root` named by `names` (a folder: each file inside, by relative path)."""
    out: dict[str, str] = {}
    for name in names:
        p = root / name
        files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else ([p] if p.is_file() else [])
        for q in files:
            out[str(q.relative_to(root))] = hashlib.sha256(q.read_bytes()).hexdigest()
    return out


STATUSES = ("running", "done", "left out", "not supported", "failed", "interrupted")
_NUMBER = (int, float)
# study.json's schema: each key's allowed types (top level, and a stage's record); unknown keys are refused.
_TOP = {"format": int, "stages": dict, "study_key": str, "model": dict, "data": dict, "budget_s": _NUMBER,
        "tolerance_s": _NUMBER, "probe": dict, "versions": dict, "plan": dict, "answers": dict, "elapsed_s": _NUMBER,
        "leftover": dict}
_STAGE = {"status": str, "reason": str, "key": str, "files": dict, "dir": str, "level": int, "size": object,
          "seconds": _NUMBER, "estimate_s": _NUMBER, "command": str, "reused": bool, "widened_from": int}


def _typed(value: Any, kinds: Any) -> bool:
    if kinds is object:
        return True
    if isinstance(value, bool):  # JSON's true is not a number here
        return kinds is bool
    return isinstance(value, kinds)


def schema_problem(data: Any, out: Path) -> str:
    """What makes `data` not a study.json this version writes ('' when nothing): wrong types, unknown statuses,
    plan sizes that are not sizes, and file paths that leave the study's folder."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("format") != FORMAT:
        return f"format {data.get('format')!r}, this headscope writes format {FORMAT}"
    for key, value in data.items():
        if key not in _TOP:
            return f"unknown key {key!r}"
        if not _typed(value, _TOP[key]):
            return f"{key} is {value!r}"
    if "stages" not in data:
        return "no stages"
    for name, lv in (data.get("plan") or {}).items():
        if lv is not None and not (_typed(lv, int) and lv >= 0):
            return f"plan.{name} is {lv!r}, not a size (0, 1, ...) or null"
    if not all(isinstance(v, str) for v in (data.get("answers") or {}).values()):
        return "answers are not text"
    for name, rec in data["stages"].items():
        if not isinstance(rec, dict):
            return f"stages.{name} is {rec!r}"
        for key, value in rec.items():
            if key not in _STAGE:
                return f"stages.{name} has an unknown key {key!r}"
            if not (key in ("level", "size") and value is None) and not _typed(value, _STAGE[key]):
                return f"stages.{name}.{key} is {value!r}"
        if rec and rec.get("status") not in STATUSES:
            return f"stages.{name}.status is {rec.get('status')!r}, not one of {', '.join(STATUSES)}"
        where = rec.get("dir", ".")
        for rel, sha in [(".", "0" * 64), *(rec.get("files") or {}).items()]:
            try:
                inside(inside(out, where, STUDY_NAME, ""), rel, STUDY_NAME, "")
            except HeadscopeError:
                return f"stages.{name} names {str(Path(where) / str(rel))!r}, outside the study's folder"
            if not (isinstance(sha, str) and len(sha) == 64):
                return f"stages.{name}.files[{rel!r}] is not a sha256"
    return ""


class State:
    """study.json in memory; `save` writes it atomically."""

    def __init__(self, out: Path, data: dict[str, Any] | None = None) -> None:
        self.out = out
        self.data: dict[str, Any] = data or {"format": FORMAT, "stages": {}}

    @classmethod
    def load(cls, out: Path) -> State | None:
        """The folder's study.json, or None when there is none; a damaged or edited one is refused, named."""
        p = out / STUDY_NAME
        if not p.is_file() and not p.is_symlink():
            return None
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            problem = f"not JSON: {e}" if isinstance(e, ValueError) else f"unreadable: {e.strerror or e}"
            data = None
        else:
            problem = schema_problem(data, out)
        if problem:
            raise HeadscopeError(f"{p} is damaged or edited ({problem}), so the study cannot continue from it; pass "
                                 f"force=True to start the study over (or delete {STUDY_NAME})", fields=("force",))
        return cls(out, data)

    def save(self) -> None:
        atomic_write_text(self.out / STUDY_NAME, json.dumps(self.data, indent=1, sort_keys=False) + "\n")

    def stage(self, name: str) -> dict[str, Any]:
        return self.data["stages"].setdefault(name, {})

    def reusable(self, name: str, key: str) -> bool:
        """Whether stage `name` is recorded done under `key` with every file it wrote unchanged."""
        rec = self.data["stages"].get(name) or {}
        if rec.get("status") != "done" or rec.get("key") != key or not rec.get("files"):
            return False
        root = self.out / rec.get("dir", ".")
        for rel, sha in rec["files"].items():
            p = root / rel
            if not p.is_file() or hashlib.sha256(p.read_bytes()).hexdigest() != sha:
                return False
        return True


def clear_stage_files(root: Path, verb: str) -> None:
    """Remove what an unfinished or outdated run of `verb` left in `root` (prune keeps its resume point)."""
    for name in verb_files(verb):
        p = root / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    # every figure a report wrote, named or not: a stale one would block the next report
    if verb == "report":
        for p in root.glob(FIGURE_GLOB):
            p.unlink(missing_ok=True)


def clear_study(out: Path) -> None:
    """--force: remove every file a study writes (study.json, logs, every stage's outputs)."""
    for verb in ("analyze", "roles", "similar", "score", "prune", "kv", "kvcache", "report"):
        clear_stage_files(out, verb)
    (out / PARTIAL_JSON).unlink(missing_ok=True)
    for sub in SUBDIRS.values():
        if (out / sub).is_dir():
            shutil.rmtree(out / sub)
    if (out / LOG_DIR).is_dir():
        shutil.rmtree(out / LOG_DIR)
    (out / STUDY_NAME).unlink(missing_ok=True)
