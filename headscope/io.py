"""Atomic writes and the output-directory guard: nothing half-written, nothing overwritten silently.

A verb's output set: written whole into a staging folder beside --out, then moved into place; and the lock
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

import csv
import errno
import fcntl
import hashlib
import io
import json
import math
import os
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import HeadscopeError, OptionError, OutputConflict

# What torch's zip writer says when a write comes up short (it checks the position, not errno): a full disk.
_TORCH_SHORT_WRITE = ("unexpected pos", "PytorchStreamWriter failed writing", "file write failed")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def is_disk_full(e: BaseException) -> bool:
    """ENOSPC (or a quota's EDQUOT) from the OS, or torch's zip writer failing a write part way (what it raises
    on a full disk: "enforce fail at inline_container.cc ... unexpected pos")."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(e, Exception) and ("No space left on device" in str(e) or "StorageFull" in str(e)):
        # safetensors' writer (a Rust IoError inside its own exception type)
        return True
    return isinstance(e, RuntimeError) and any(t in str(e) for t in _TORCH_SHORT_WRITE)


def disk_full_error(where: str | Path, needed: int | None = None) -> HeadscopeError:
    """One line: the disk holding `where` is full, how much was free and (when known) how much was needed."""
    probe = _nearest_existing(Path(where), "", Path(where)) if str(where) else Path(".")
    try:
        free = f"{_size(shutil.disk_usage(probe).free)} free"
    except OSError:
        free = "its free space unknown"
    need = f" needed about {_size(needed)} and" if needed else ""
    return HeadscopeError(f"the disk is full: writing {str(where)!r}{need} the filesystem holding {str(probe)!r} has "
                          f"{free}; nothing was left half-written: free some space there or write elsewhere "
                          f"(another folder as out), then rerun", fields=("out",))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(tmp: str, path: Path) -> None:
    # mkstemp creates files readable by the owner only; give them the usual permissions.
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def temp_prefix(path: Path) -> str:
    """`.NAME.PID.`: how every temporary beside `path` starts, so a later run can tell whose writer is gone."""
    return f".{path.name}.{os.getpid()}."


def process_alive(pid: int) -> bool:
    """Whether process `pid` still runs (another user's live process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Remove the temporaries a killed writer of `path` left beside it (`.NAME.PID.*.tmp` files, `.NAME.PID.*.partial`
    folders) whose process is gone; a live writer's are left alone. Returns what was removed."""
    path = Path(path)
    gone: list[Path] = []
    if not path.parent.is_dir():
        return gone
    for p in path.parent.glob(f".{glob_escape(path.name)}.*"):
        pid, _, rest = p.name[len(path.name) + 2:].partition(".")
        if not pid.isdigit() or not (rest.endswith("tmp") or rest.endswith("partial")) or process_alive(int(pid)):
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        gone.append(p)
    return gone


def glob_escape(name: str) -> str:
    """`name` with glob's special characters taken literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temp file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        _publish(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full_error(path, len(text.encode("utf-8"))) from None
        raise


# The one float format of every CSV headscope writes: six significant digits (what a reader compares at a
# glance; the JSON beside a CSV keeps full precision). NaN and None are empty cells, as pandas reads them.
FLOAT_FORMAT = ".6g"


def format_cell(value: Any) -> str:
    """One CSV cell: floats in FLOAT_FORMAT, NaN/None empty, everything else as `str` gives it."""
    if value is None:
        return ""
    if isinstance(value, float):  # numpy floats are floats too
        return "" if math.isnan(value) else format(value, FLOAT_FORMAT)
    return str(value)


def csv_columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every key of `rows`, in the order they first appear."""
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    return list(keys)


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """CSV text of `rows` (dicts) under a header of `columns` (default: `csv_columns(rows)`); a key a row
    lacks is an empty cell. The one CSV writer: `headscope.artifacts.write_csv` and `HeadTable.to_csv` use it."""
    cols = list(columns) if columns is not None else csv_columns(rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([format_cell(r.get(c)) for c in cols])
    return buf.getvalue()


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Binary twin of `atomic_write_text`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _publish(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full_error(path, len(data)) from None
        raise


def _normal_modes(folder: Path) -> None:
    """Give every file and folder under `folder` the modes plain `open`/`mkdir` would (umask applied).

    Some writers create private files (safetensors writes model.safetensors 0600 through a temp
    file); a saved model should be as readable as every other output.
    """
    mask = _umask()
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o777 & ~mask)
        for name in files:
            p = os.path.join(root, name)
            mode = os.lstat(p).st_mode
            if stat.S_ISREG(mode):  # leave symlinks alone
                os.chmod(p, (0o777 if mode & 0o111 else 0o666) & ~mask)
    os.chmod(folder, 0o777 & ~mask)


def _sibling(path: Path, kind: str) -> Path:
    """A fresh hidden name beside `path` (same filesystem, so renames are atomic)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.{kind}")


@contextmanager
def atomic_dir(path: str | Path, *, force: bool = False, needed: int | None = None) -> Iterator[Path]:
    """Yield an empty temp folder beside `path`; on success it becomes `path` in one rename.

    `path` is therefore absent, the old complete folder, or the new complete one, never half
    written. An existing `path` is refused before anything is written unless `force`; with
    `force` it is replaced only once the new folder is complete, and put back if the final
    rename fails. On any exception inside the block the temp folder is removed and `path` is
    left as it was. Files written inside end with the usual umask modes (0644 under umask 022). A full disk is
    said in one line (`needed`: about how many bytes the folder takes, when the caller knows).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise HeadscopeError(f"{str(path)!r} exists and is not a directory; choose another path")
    if path.exists() and not force:
        raise OutputConflict(f"{str(path)!r} already exists; pass force=True to replace it or choose another path",
                             fields=("force",))
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)  # a killed writer's half-written folder beside it
    tmp = _sibling(path, "partial")
    tmp.mkdir()  # os.mkdir honours the umask (mkdtemp would make it 0700)
    try:
        try:
            yield tmp
        except BaseException as e:
            if is_disk_full(e):
                raise disk_full_error(path, needed) from None
            raise
        _normal_modes(tmp)
        if not path.exists():
            os.replace(tmp, path)
            return
        if not force:  # appeared while we were writing
            raise OutputConflict(f"{str(path)!r} appeared while it was being written; pass force=True to replace it")
        old = _sibling(path, "old")
        # a folder cannot be renamed over a non-empty one: move the old aside first
        os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old, path)  # put the user's folder back
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def inside(folder: str | Path, name: Any, source: str | Path, remedy: str, fields: tuple[str, ...] = ()) -> Path:
    """`folder / name` for a file name read back from one of headscope's own records (`source`: a partial
    checkpoint's json, study.json, a model's weight index), refused unless it stays inside `folder`.

    A results folder someone sent you cannot point headscope at other files: an absolute path, a `..` part or a
    symlink that leaves the folder is refused with one line naming `source` and the name (`remedy`: what to do;
    `fields`: the options it names, `HeadscopeError.fields`).
    """
    folder = Path(folder)
    text = name if isinstance(name, str) else ""
    parts = Path(text).parts
    if not text or Path(text).is_absolute() or ".." in parts or "\x00" in text:
        why = "not a file name" if not text or "\x00" in text else "a path outside its folder"
        raise HeadscopeError(f"{source} names {name!r}, {why}: headscope reads back only files inside "
                             f"{str(folder)!r}; {remedy}", fields=fields)
    path = folder / text
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        raise HeadscopeError(f"{source} names {name!r}, which leads outside {str(folder)!r} (through a symlink): "
                             f"headscope reads back only files inside it; {remedy}", fields=fields) from None
    return path


def _nearest_existing(path: Path, option: str, shown: Path) -> Path:
    """The nearest ancestor of `path` (or `path`) that exists; a dangling symlink on the way is refused (mkdir
    would fail on it only once the results exist)."""
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise _refused(option, f"{str(shown)!r} cannot be created: {str(probe)!r} is a symlink to "
                                   f"{os.readlink(probe)!r}, which does not exist; create its target or choose "
                                   f"another path")
        if probe.parent == probe:
            break
        probe = probe.parent
    return probe


def _probe_writable(folder: Path, option: str, shown: Path) -> None:
    """A real probe, not os.access: root passes access checks on read-only mounts and /proc."""
    try:
        fd, name = tempfile.mkstemp(prefix=".headscope-probe.", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise _refused(option, f"{str(shown)!r} cannot be written: {str(folder)!r} refuses new files "
                               f"({e.strerror or e}); choose a writable directory") from None


def _refused(option: str, problem: str) -> HeadscopeError:
    """The option's problem (an `OptionError` naming the field `option`), or the bare problem without an option."""
    return OptionError(option, problem) if option else HeadscopeError(problem)


def check_writable_dir(out: str | Path, option: str = "out") -> Path:
    """Refuse an output folder that is empty text, names a file, passes through a dangling symlink, or cannot be
    created or written, before any work (an `OptionError` naming the field `option`).

    Nothing is left behind: a probe file is created and removed in the nearest existing ancestor,
    and the folder itself is made later, when the results exist.
    """
    if not str(out).strip():
        raise OptionError(option, f"is empty; give a directory path (e.g. {option}='results')", also=(option,))
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OptionError(option, f"{str(out)!r} is a file, not a directory; choose a directory path")
    probe = _nearest_existing(out, option, out)
    if probe.exists() and not probe.is_dir():
        raise OptionError(option, f"{str(out)!r} cannot be created: {str(probe)!r} is a file; "
                                  f"choose a path under a directory")
    _probe_writable(probe, option, out)
    return out


def check_writable_file(path: str | Path, option: str) -> Path:
    """Refuse an output file path that is empty, names a directory, or whose folder cannot be created or
    written (see `check_writable_dir`), before any work (an `OptionError` naming the field `option`)."""
    if not str(path).strip():
        raise OptionError(option, "is empty; give a file path")
    p = Path(path)
    if p.is_dir():
        raise OptionError(option, f"{str(p)!r} is a directory; give a file name")
    if p.is_symlink() and not p.exists():
        raise OptionError(option, f"{str(p)!r} is a symlink to {os.readlink(p)!r}, which does not exist; "
                                  f"choose another path")
    try:
        check_writable_dir(p.parent if str(p.parent) else ".", option=option)
    except OptionError as e:
        raise OptionError(option, f"{str(p)!r}: folder {e.problem}") from None
    return p


def prepare_out_dir(out: str | Path, force: bool, will_write: list[str]) -> Path:
    """Refuse (without `force`) to write into an output folder that already holds results, or one that
    cannot be written (see `check_writable_dir`)."""
    out = check_writable_dir(out)
    if out.is_dir() and not force:
        clash = [n for n in dict.fromkeys(will_write) if (out / n).exists()]
        if clash:
            raise OutputConflict(f"output directory {str(out)!r} already holds {', '.join(clash)}; pass force=True "
                                 f"to overwrite them or choose another folder as out", fields=("force", "out"))
    return out


# --- a verb's output set, staged and moved into place together; the lock on --out -------------------------------

# .<out name>.staging.<pid>.<hex>: a run's output set before it is moved into place
STAGE = "staging"
# the pid holding the lock, for the ranks it launches (its children)
LOCK_ENV = "HEADSCOPE_OUT_LOCKED"


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
        try:
            yield stage
        except BaseException as e:
            if is_disk_full(e):
                raise disk_full_error(out) from None
            raise
        _publish_set(stage, out, force)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _publish_set(stage: Path, out: Path, force: bool) -> None:
    """Move every entry of `stage` into `out` (renames on one filesystem: no copy can fail half way)."""
    _normal_modes(stage)
    if not out.exists():
        os.replace(stage, out)
        return
    entries = sorted(stage.iterdir())
    clash = [e.name for e in entries if (out / e.name).exists()]
    if clash and not force:
        raise OutputConflict(f"{', '.join(clash)} appeared in {str(out)!r} while this run was writing; pass "
                             f"force=True to replace them or choose another folder as out", fields=("force", "out"))
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
        gone += [p for p in out.glob(".*.old.*") if p.is_dir()]  # _publish_set's moved-aside folders
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
            raise OptionError("out", f"{str(out)!r} is in use by {_holder(path)}; wait for it to finish, or "
                                     f"choose another folder as out") from None
        # the holder before us may have unlinked the file after we opened it: lock the live one
        try:
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
