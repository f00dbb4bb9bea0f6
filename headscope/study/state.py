"""study.json: what a study planned, ran, reused and left out, written after every stage.

A stage is reused when study.json records it done under the same key (the model's fingerprint, the data's
sha256 and the stage's exact options) and every file it wrote is still there with the recorded sha256.
An interrupted study left the finished stages recorded: the same command continues after them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from ..artifacts import MODEL_DIR, STUDY_JSON, outputs
from ..io import atomic_write_text
from ..redundancy.curves import PARTIAL_JSON
from ..report.build import figure_names
from .stages import SUBDIRS

STUDY_NAME = STUDY_JSON.name
LOG_DIR = "study-logs"
FORMAT = 1


def stage_key(model_fp: str, data_fp: dict[str, Any], argv: list[str]) -> str:
    """The identity of one stage's result: model fingerprint, data hashes and the verb's options."""
    blob = json.dumps({"model": model_fp, "data": data_fp, "argv": argv, "format": FORMAT}, sort_keys=True)
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


def verb_files(verb: str) -> list[str]:
    """The files (and folders) a stage's verb may write into its --out."""
    names = outputs(verb, optional=True)
    if verb == "prune":
        names = [*names, MODEL_DIR.name]
    if verb == "report":
        names = [*names, *figure_names()]
    return names


class State:
    """study.json in memory; `save` writes it atomically."""

    def __init__(self, out: Path, data: dict[str, Any] | None = None) -> None:
        self.out = out
        self.data: dict[str, Any] = data or {"format": FORMAT, "stages": {}}

    @classmethod
    def load(cls, out: Path) -> State | None:
        p = out / STUDY_NAME
        if not p.is_file():
            return None
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("stages"), dict):
            return None
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
