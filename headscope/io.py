"""Atomic writes and the output-directory guard: nothing half-written, nothing overwritten silently."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import HeadscopeError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(tmp: str, path: Path) -> None:
    # mkstemp creates files readable by the owner only; give them the usual permissions.
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temp file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        _publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Binary twin of `atomic_write_text`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_out_dir(out: str | Path, force: bool, will_write: list[str]) -> Path:
    """Refuse (without `force`) to write into an output folder that already holds results."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise HeadscopeError(f"output path {str(out)!r} exists and is not a directory; choose another --out")
    if out.is_dir() and not force:
        clash = [n for n in will_write if (out / n).exists()]
        if clash:
            raise HeadscopeError(
                f"output directory {str(out)!r} already holds {', '.join(clash)}; "
                f"pass --force to overwrite them or choose another --out"
            )
    return out
