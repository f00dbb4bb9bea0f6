"""Data-parallel scans on torch.distributed: one home for ranks, sharding, merging and failures.

A scan runs data-parallel when the process was started by `torchrun --nproc-per-node N -m headscope
VERB ...` (or by `--workers N`, which starts the same N processes itself: see `launch`). Every rank
loads the model and reads the data; each rank then scans its own share (`shard_batches`: whole
batches of passages for `analyze`; `owns`: ablation passes for `score`), and the sums and counts
are added across ranks with one `all_reduce` (`all_reduce_stats`, `all_reduce_totals`). Every rank
ends with the same merged numbers; only rank 0 writes and prints.

Failures: before every collective each rank first reports its status (`check`, one
`all_gather_object`), so a rank that raised anywhere (`fail`, called by the CLI) stops every rank
at their next collective with one clear error naming the rank, and no rank writes anything.

Backends: gloo on CPU; `cpu:gloo,cuda:nccl` when the device is CUDA (tensors reduce through NCCL,
status messages through gloo). Outside a distributed run every function here is a no-op that
returns its input, so library code calls them unconditionally.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from .errors import HeadscopeError, OptionError
from .stats import COUNT, HeadStats

log = logging.getLogger(__name__)
T = TypeVar("T")

# Seconds a rank waits at a collective for the others (a slow rank-0-only criterion counts too).
TIMEOUT_ENV = "HEADSCOPE_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 3600
_local_depth = 0  # > 0 inside `local()`: this process acts alone
_reduce_device = "cpu"


class RankFailed(HeadscopeError):
    """Another rank stopped on a user error (bad option, bad data): every rank stops with it."""


class RankCrashed(RuntimeError):
    """Another rank stopped on an unexpected error: every rank stops with it."""


# --- who am I -------------------------------------------------------------------------------
def rank() -> int:
    """This process's rank (0 outside a distributed run)."""
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    """Number of ranks that share the scan (1 outside a distributed run)."""
    return int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", rank()))


def is_main() -> bool:
    """Whether this process writes outputs and prints (rank 0, or a single process)."""
    return rank() == 0


def launched() -> bool:
    """Whether torchrun (or `--workers`) started this process as one of several ranks."""
    return world_size() > 1


def active() -> bool:
    """Whether collectives run now: several ranks, a process group, and not inside `local()`."""
    return _local_depth == 0 and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextmanager
def local() -> Iterator[None]:
    """Inside, this process acts alone: work only rank 0 does (no collective may wait on the others)."""
    global _local_depth
    _local_depth += 1
    try:
        yield
    finally:
        _local_depth -= 1


# --- set up and tear down -------------------------------------------------------------------
def backend_for(device: str) -> str:
    """gloo for CPU; NCCL for CUDA tensors with gloo beside it for status messages."""
    if str(device).startswith("cuda") and torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def rank_device(device: str) -> str:
    """`cuda` becomes this rank's own GPU, `cuda:<LOCAL_RANK>`; any other device is kept as given."""
    if launched() and device == "cuda":
        return f"cuda:{local_rank()}"
    return device


def init(device: str = "cpu") -> None:
    """Join the process group described by torchrun's environment (no-op in a single process)."""
    global _reduce_device
    if not launched() or dist.is_initialized():
        return
    backend = backend_for(device)
    if "nccl" in backend:
        torch.cuda.set_device(torch.device(rank_device(device)))
        _reduce_device = rank_device(device)
    timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)))
    dist.init_process_group(backend=backend, timeout=timeout)
    log.info("rank %d of %d joined (%s)", rank(), world_size(), backend)


def shutdown() -> None:
    global _reduce_device
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _reduce_device = "cpu"


# --- failures -------------------------------------------------------------------------------
def _describe(error: BaseException) -> tuple[bool, str]:
    """(is it a user error, one line saying what went wrong)."""
    user = isinstance(error, (HeadscopeError, FileNotFoundError, KeyError))
    text = (error.args[0] if isinstance(error, KeyError) and error.args else str(error)).strip()
    line = text.splitlines()[0] if text else ""
    return user, (line if user else f"{type(error).__name__}: {line}")


def _gather(status: tuple[bool, str] | None, payload: Any = None) -> list[Any]:
    """Every rank's (status, payload); raise on every healthy rank when some rank failed."""
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, (status, payload))
    failed = [(r, s) for r, (s, _) in enumerate(got) if s is not None]
    if failed and status is None:
        r, (user, msg) = failed[0]
        others = f" (and rank{'s' if len(failed) > 2 else ''} {', '.join(str(f[0]) for f in failed[1:])})" \
            if len(failed) > 1 else ""
        exc: Exception = (RankFailed if user else RankCrashed)(f"rank {r} of {len(got)}{others}: {msg}")
        exc._headscope_reported = True  # type: ignore[attr-defined]  # a marker: every rank already knows
        raise exc
    return [p for _, p in got]


def check(error: BaseException | None = None) -> None:
    """A status checkpoint every rank calls: raises on the healthy ranks when any rank failed."""
    if not active():
        return
    if error is not None:
        error._headscope_reported = True  # type: ignore[attr-defined]  # a marker: every rank already knows
    _gather(None if error is None else _describe(error))


def fail(error: BaseException) -> None:
    """Tell the other ranks that this one stopped (once), so they stop at their next collective."""
    if active() and not getattr(error, "_headscope_reported", False):
        try:
            check(error)
        except Exception:
            # the group may already be broken; the launcher stops what is left
            log.debug("could not report the failure to the other ranks", exc_info=True)


def run_on_main(fn: Callable[[], T]) -> T:
    """`fn()` on rank 0 only (acting alone), its result sent to every rank."""
    if not active():
        return fn()
    result: Any = None
    if is_main():
        try:
            with local():
                result = fn()
        except Exception as e:
            fail(e)
            raise
    check()
    box = [result]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# --- sharding -------------------------------------------------------------------------------
def check_ranks(n: int, what: str = "passages") -> None:
    """Refuse more ranks than units of work (each rank must get at least one)."""
    w = world_size()
    if w > n:
        raise HeadscopeError(f"{w} processes (workers, or torchrun's nproc-per-node) but only {n} "
                             f"{what if n != 1 else what.rstrip('s')}; use at most {n} process{'es' if n != 1 else ''}"
                             f", or more data", fields=("workers",))


def owner(i: int, world: int | None = None) -> int:
    """Which rank takes unit `i`: 0, 1, .., W-1, W-1, .., 0, 0, ... (a snake, so sorted work balances)."""
    w = world or (dist.get_world_size() if active() else 1)
    r = i % w
    return r if (i // w) % 2 == 0 else w - 1 - r


def owns(i: int) -> bool:
    """Whether this rank takes unit `i` (always true outside a distributed run)."""
    return not active() or owner(i) == dist.get_rank()


def shard_indices(ids: Sequence[Sequence[int]], batch_size: int, *, rank: int | None = None,
                  world: int | None = None) -> list[int]:
    """This rank's passages, as indices into `ids`: whole batches of the single-process run, in order.

    `data.batches` sorts passages by length and cuts batches of `batch_size`; this takes the batches
    `owner(k) == rank` and concatenates their passages, so `batches([ids[i] for i in shard], batch_size)`
    rebuilds exactly those batches (every batch but the last is full, and the shard is already sorted):
    each rank's sums are the single-process run's sums of the same batches, and the merged result
    equals it to rounding.
    """
    if world is None:
        world = dist.get_world_size() if active() else 1
        rank = dist.get_rank() if active() else 0
    if world == 1:
        return list(range(len(ids)))
    if world > len(ids):
        raise HeadscopeError(f"{world} processes but only {len(ids)} passages; use at most {len(ids)} processes")
    order = np.argsort([len(t) for t in ids], kind="stable")
    n_batches = (len(ids) + batch_size - 1) // batch_size
    if n_batches < world:
        log.warning("%d batches for %d processes: %d process(es) stay idle; a smaller --batch-size spreads the work",
                    n_batches, world, world - n_batches)
    return [int(i) for k in range(n_batches) if owner(k, world) == rank
            for i in order[k * batch_size:(k + 1) * batch_size]]


def shard_batches(ids: Sequence[Sequence[int]], batch_size: int, *, rank: int | None = None,
                  world: int | None = None) -> list[list[int]]:
    """This rank's passages (token ids): `shard_indices`' passages, whole batches of the single-process run."""
    return [list(ids[i]) for i in shard_indices(ids, batch_size, rank=rank, world=world)]


# --- merging --------------------------------------------------------------------------------
def _all_reduce(values: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(_reduce_device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().numpy()


def all_reduce_stats(stats: HeadStats) -> HeadStats:
    """The sum of every rank's HeadStats, on every rank (sums, counts, tokens and passages)."""
    if not active():
        return stats
    names = sorted(set().union(*_gather(None, sorted(stats.sums))))  # a rank with no batch has no names
    shape = (stats.n_layers, stats.n_heads)
    per_passage = _all_reduce_passages(stats, names)
    zero = np.zeros(shape)
    flat = np.concatenate([np.stack([stats.sums.get(n, zero), stats.counts.get(n, zero)]).ravel() for n in names]
                          + [np.array([stats.tokens, stats.passages], dtype=np.float64)])
    flat = _all_reduce(flat)
    size = 2 * shape[0] * shape[1]
    out = HeadStats(*shape, tokens=int(round(flat[-2])), passages=int(round(flat[-1])))
    for i, n in enumerate(names):
        pair = flat[i * size:(i + 1) * size].reshape(2, *shape)
        out.sums[n], out.counts[n] = pair[0].copy(), pair[1].copy()
    out.per_passage = per_passage
    return out


def _all_reduce_passages(stats: HeadStats, names: list[str]) -> Any:
    """The per-passage sums of every rank added (each rank filled the rows of its own passages)."""
    acc = stats.per_passage
    if acc is None:
        return None
    shape = (stats.n_layers, stats.n_heads)
    # a rank without batches has declared nothing: zeros of the same shape
    for n in names:
        acc.declare(n, shape)
        acc.declare(f"{n}{COUNT}", shape)
    keys = sorted(acc.arrays)
    flat = _all_reduce(np.concatenate([acc.arrays[k].ravel() for k in keys]))
    size = acc.n_rows * shape[0] * shape[1]
    for i, k in enumerate(keys):
        acc.arrays[k] = flat[i * size:(i + 1) * size].reshape(acc.n_rows, *shape).copy()
    return acc


def all_reduce_array(values: np.ndarray) -> np.ndarray:
    """An array added over ranks (each rank filled its own entries, zeros elsewhere); as is in one process."""
    if not active():
        return values
    return _all_reduce(values.ravel()).reshape(values.shape)


def all_reduce_totals(totals: list[list[dict[str, list[float]]]]) -> list[list[dict[str, list[float]]]]:
    """Per-head metric sums `[L][H] {name: [num, den]}` added over ranks (each rank held its own heads)."""
    if not active():
        return totals
    names = sorted(set().union(*_gather(None, sorted({k for row in totals for d in row for k in d}))))
    L, H = len(totals), len(totals[0]) if totals else 0
    flat = np.array([[d.get(k, [0.0, 0.0]) for k in names] for row in totals for d in row], dtype=np.float64)
    flat = _all_reduce(flat.reshape(-1)).reshape(L * H, len(names), 2)
    return [[{k: [float(flat[l * H + h, j, 0]), float(flat[l * H + h, j, 1])] for j, k in enumerate(names)}
             for h in range(H)] for l in range(L)]


# --- the CLI: --workers and the per-process session -----------------------------------------
@contextmanager
def session(verb: str, device: str | None, splits_work: bool) -> Iterator[str | None]:
    """One verb run in this process: join the group, stop every rank on a failure, sync at the end. Yields
    the device this rank runs on (`device` with the rank's own index under torchrun).

    Outside a distributed run it does nothing but yield `device`. Ranks other than 0 log errors only (rank 0
    speaks). `splits_work`: whether the verb shares its scan across ranks (the others are refused).
    """
    if not launched():
        yield device
        return
    if not is_main():
        logging.getLogger().setLevel(logging.ERROR)
    mine = rank_device(device) if device else device
    init(mine or "cpu")
    try:
        if not splits_work:
            raise HeadscopeError(f"{verb} does not run data-parallel; run it as one process "
                                 f"(data-parallel verbs: analyze, roles, score)")
        yield mine
        # rank 0 may still fail while writing: the others wait to hear
        check()
    except Exception as e:
        # Ctrl-C reaches every rank itself (and the launcher stops them)
        fail(e)
        raise
    finally:
        shutdown()


def check_workers(workers: int) -> None:
    if workers < 1:
        raise OptionError("workers", f"must be at least 1; got {workers}")
    if launched() and workers not in (1, world_size()):  # `launch` passes its own --workers on
        raise OptionError("workers", f"{workers} inside a torchrun job of {world_size()} processes; "
                                     f"give one or the other")


def rendezvous_store() -> Any:
    """A TCPStore hosted by this (launching) process on a free port the OS picks: ranks join it."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def rank_env(r: int, world: int, port: int) -> dict[str, str]:
    """torchrun's variables for rank `r` of `world` on this machine, joining the store on `port`."""
    return {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True"}  # the store is ours (as torchrun's agent hosts its own)


def launch(argv: Sequence[str], workers: int, *, grace_s: float = 30.0) -> int:
    """Run `python -m headscope ARGV` as `workers` ranks on this machine; return rank 0's exit code.

    What torchrun --standalone does, without its elastic agent: this process hosts the rendezvous
    store (a TCPStore on a port the OS picks, so no port can clash), each child gets torchrun's
    variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and, unless set,
    OMP_NUM_THREADS = cores / workers. When one rank exits with an error the others stop at their
    next collective; any still running `grace_s` seconds later are terminated.
    """
    check_workers(workers)
    store = rendezvous_store()
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // workers))
    procs = [subprocess.Popen([sys.executable, "-m", "headscope", *argv],
                              env={**os.environ, **rank_env(r, workers, store.port), "OMP_NUM_THREADS": threads})
             for r in range(workers)]
    try:
        deadline = None
        while any(p.poll() is None for p in procs):
            if deadline is None and any(p.poll() not in (None, 0) for p in procs):
                deadline = time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        # also on Ctrl-C (which the children, in our process group, received too)
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        del store
    codes = [p.returncode for p in procs]
    if codes[0] != 0:
        return codes[0]
    bad = [c for c in codes if c != 0]
    if bad:
        print(f"headscope: error: rank {codes.index(bad[0])} of {workers} exited with code {bad[0]}",
              file=sys.stderr)
        return 1
    return 0


__all__ = [
    "all_reduce_array",
    "RankCrashed",
    "RankFailed",
    "active",
    "all_reduce_stats",
    "all_reduce_totals",
    "backend_for",
    "check",
    "check_ranks",
    "check_workers",
    "fail",
    "init",
    "is_main",
    "launch",
    "launched",
    "local",
    "owner",
    "owns",
    "rank",
    "rank_device",
    "rank_env",
    "rendezvous_store",
    "run_on_main",
    "session",
    "shard_batches",
    "shard_indices",
    "shutdown",
    "world_size",
]
