"""A verb's output set: written whole into a staging folder beside --out, then moved into place; and the lock
that keeps two runs from writing one --out at once.

`staged(out, force)` yields an empty folder on the same filesystem as `out`; when the block ends without an
error every entry is renamed into `out` (the whole folder in one rename when `out` does not exist yet). A
failure inside the block (a full disk, an interrupt, a bug) removes the staging folder and leaves `out` as it
was, so a rerun finds nothing of the failed run. A run killed outright (SIGKILL, power) can leave a staging
folder; it never blocks a rerun, and the next run that takes the lock on the same --out removes it.

`out_lock(out)` holds an advisory lock (fcntl.flock, released by the kernel when the process dies, so a
killed run never leaves a lock that blocks) for one run; a second run on the same --out is refused with the
holder's pid, command and start time.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import HeadscopeError

STAGE = "staging"  # .<out name>.staging.<pid>.<hex>: a run's output set before it is moved into place
LOCK_ENV = "HEADSCOPE_OUT_LOCKED"  # the pid holding the lock, for the ranks it launches (its children)


def _stage_prefix(out: Path) -> str:
    return f".{out.name}.{STAGE}."


@contextmanager
def staged(out: str | Path, force: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder beside `out`; on success its entries replace those of `out` together."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = out.parent / f"{_stage_prefix(out)}{os.getpid()}.{secrets.token_hex(4)}"
    stage.mkdir()
    try:
        yield stage
        _publish(stage, out, force)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _publish(stage: Path, out: Path, force: bool) -> None:
    """Move every entry of `stage` into `out` (renames on one filesystem: no copy can fail half way)."""
    from .io import _normal_modes  # the modes every output gets (umask applied)

    _normal_modes(stage)
    if not out.exists():
        os.replace(stage, out)
        return
    entries = sorted(stage.iterdir())
    clash = [e.name for e in entries if (out / e.name).exists()]
    if clash and not force:
        raise HeadscopeError(f"{', '.join(clash)} appeared in {str(out)!r} while this run was writing; pass "
                             f"--force to replace them or choose another --out")
    for e in entries:
        target = out / e.name
        if target.is_dir() and not target.is_symlink():  # a folder cannot be renamed over a non-empty one
            old = out / f".{e.name}.old.{os.getpid()}.{secrets.token_hex(4)}"
            os.replace(target, old)
            os.replace(e, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(e, target)


def remove_leftovers(out: str | Path) -> list[Path]:
    """Remove what killed runs left around `out`: staging folders beside it and atomic writers' temp files in
    it. Call only while holding `out_lock(out)` (then no live run owns them). Returns what was removed."""
    out = Path(out)
    gone: list[Path] = []
    if out.parent.is_dir():
        gone += [p for p in out.parent.glob(_stage_prefix(out) + "*") if p.is_dir()]
    if out.is_dir():
        gone += [p for p in out.glob(".*.tmp") if p.is_file()]  # io.atomic_write_*, Trainer.save
        gone += [p for p in out.glob(".*.old.*") if p.is_dir()]  # _publish's moved-aside folders
    for p in gone:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return gone


def _lock_path(out: Path) -> Path:
    """One lock file per output folder (by its resolved path), in the temporary folder: it exists before `out`
    and its parents do, and a refused run leaves nothing beside `out`."""
    key = hashlib.sha256(str(out.expanduser().resolve()).encode()).hexdigest()[:24]
    folder = Path(tempfile.gettempdir()) / f"headscope-locks-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / f"{key}.lock"


def _holder(path: Path) -> str:
    try:
        info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        since = time.strftime("%H:%M:%S", time.localtime(info["started"]))
        return f"pid {info['pid']} ({info['command']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another headscope run"


@contextmanager
def out_lock(out: str | Path | None, command: str = "headscope") -> Iterator[None]:
    """Hold the lock on output folder `out` for the block (nothing when `out` is None or a launching parent
    already holds it); a second holder is refused with who holds it (`command`: what the holder runs)."""
    if out is None or not str(out).strip() or os.environ.get(LOCK_ENV) == str(os.getppid()):
        yield
        return
    out = Path(out)
    path = _lock_path(out)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise HeadscopeError(f"--out {str(out)!r} is in use by {_holder(path)}; wait for it to finish, or "
                                 f"choose another --out") from None
        try:  # the holder before us may have unlinked the file after we opened it: lock the live one
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    previous = os.environ.get(LOCK_ENV)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time(), "out": str(out),
                                 "command": command}).encode())
        os.environ[LOCK_ENV] = str(os.getpid())  # ranks this process launches share its lock
        remove_leftovers(out)
        yield
    finally:
        if previous is None:
            os.environ.pop(LOCK_ENV, None)
        else:
            os.environ[LOCK_ENV] = previous
        path.unlink(missing_ok=True)
        os.close(fd)  # closing releases the flock
