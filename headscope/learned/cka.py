"""Linear CKA estimators between N groups of features (heads): the exact full-data one and minibatch unbiased HSIC.

- `linear_cka(x, y)`: the batch formula of Kornblith et al. 2019 on two feature matrices (the reference).
- `StreamingCKA`: the centred cross-covariance of all groups, accumulated batch by batch; exact over
  all samples (the biased estimator), memory `(N dim)^2` float64 (the in-memory reference).
- `SpilledExactCKA`: the same exact CKA in bounded memory, the samples spilled to disk and read back
  once per block of groups (`headscope similar --cka exact`).
- `hsic1_linear(x, y)`: unbiased HSIC (Song et al. 2012) from the Gram matrices (the reference for
  `MinibatchCKA`).
- `MinibatchCKA`: CKA from minibatch unbiased HSIC (Nguyen, Raghu and Kornblith 2021), memory
  O(N batch^2) plus N^2 sums (the default of `headscope similar`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.limits import check_fits_memory
from ..errors import HeadscopeError, OptionError
from ..io import process_alive

log = logging.getLogger(__name__)

# Tokens per CKA minibatch: Gram matrices of N x 256^2 floats (see MinibatchCKA).
DEFAULT_CKA_BATCH = 256
# CKA estimators: minibatch (memory O(N batch^2)), or the exact full-data scatter ((N d_head)^2 float64).
CKA_ESTIMATORS = ("minibatch", "exact")
# Tokens waiting in the CKA pool, from which minibatches are drawn at random (mixing passages).
DEFAULT_CKA_POOL = 2048
# Bytes the exact CKA may hold in memory (`SpilledExactCKA`: one block of cross-covariance rows at a time).
DEFAULT_CKA_MEMORY = 192 * 2**20

# Elements in one chunk of the pairwise computations: small enough to stay in cache and reuse
# allocator memory (measured: 2^19 is 3x faster than 2^23 for JS on 2 cores).
_CHUNK = 1 << 19


def linear_cka(x: Any, y: Any) -> float:
    """Linear CKA of two feature matrices `[samples, features]` (Kornblith et al. 2019, feature-space form)."""
    x = torch.as_tensor(np.asarray(x), dtype=torch.float64)
    y = torch.as_tensor(np.asarray(y), dtype=torch.float64)
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
        raise HeadscopeError(f"CKA needs two [samples, features] matrices with the same samples; "
                             f"got {tuple(x.shape)} and {tuple(y.shape)}")
    x = x - x.mean(0)
    y = y - y.mean(0)
    num = torch.linalg.matrix_norm(y.T @ x) ** 2
    den = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    return float(num / den) if den > 0 else float("nan")


class StreamingCKA:
    """Centred cross-covariance of N groups of d features, accumulated batch by batch.

    Each batch is centred on its own mean and merged with the running total by the parallel update
    of Chan et al. (scatter += batch scatter + n_a n_b / n (mean_a - mean_b)(mean_a - mean_b)^T):
    the same matrix as sum(x x^T) - n mean mean^T, without its cancellation in float32.
    """

    def __init__(self, n_groups: int, dim: int, device: torch.device | str = "cpu") -> None:
        self.n_groups, self.dim = n_groups, dim
        self.count = 0
        self.mean = torch.zeros(n_groups * dim, dtype=torch.float64, device=device)
        self.scatter = torch.zeros(n_groups * dim, n_groups * dim, dtype=torch.float64, device=device)

    def update(self, x: torch.Tensor) -> None:
        """Add samples `x [T, n_groups, dim]` (or `[T, n_groups * dim]`)."""
        x = x.reshape(x.shape[0], -1)
        t = x.shape[0]
        if t == 0:
            return
        if x.shape[1] != self.mean.shape[0]:
            raise HeadscopeError(f"features have width {x.shape[1]}; expected {self.n_groups} x {self.dim}")
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        x = x.to(self.mean.device, work)
        mb = x.mean(0)
        xc = x - mb
        # Row blocks keep the float32 -> float64 temporary small (SmolLM2: 17280^2 features).
        rows = max(1, _CHUNK * 16 // xc.shape[1])
        for r0 in range(0, xc.shape[1], rows):
            self.scatter[r0:r0 + rows] += (xc[:, r0:r0 + rows].T @ xc).to(torch.float64)
        delta = mb.to(torch.float64) - self.mean
        total = self.count + t
        self.scatter.addr_(delta, delta, alpha=self.count * t / total)
        self.mean += delta * (t / total)
        self.count = total

    def cka(self, transform: torch.Tensor | None = None) -> np.ndarray:
        """`[N, N]` linear CKA between groups; `transform [N, k, dim]` maps group i's features x to R_i x first.

        With R_i the triangular factor of W_O^h (W_O^h = Q R), the CKA is that of the head's
        residual-stream contributions: they have the same sample Gram matrix as R_i x.
        """
        n, d = self.n_groups, self.dim
        r = None if transform is None else transform.to(self.scatter.device, torch.float64)
        return _cka_from_squares(_squared_norms(self.scatter.view(n, d, n, d), 0, r))


def _squared_norms(c: torch.Tensor, i0: int, r: torch.Tensor | None) -> torch.Tensor:
    """|R_i C_ij R_j^T|_F^2 for the rows `c [b, d, N, d]` of the cross-covariance (groups i0 .. i0 + b) and every
    group j: `[b, N]` float64 (R = identity when `r` is None)."""
    b, d, n, _ = c.shape
    num = torch.empty(b, n, dtype=torch.float64, device=c.device)
    rows = max(1, _CHUNK // max(1, n * d * d))
    for k0 in range(0, b, rows):
        block = c[k0:k0 + rows]  # [rows, d, N, d]
        if r is not None:
            block = torch.einsum("iab,ibjc->iajc", r[i0 + k0:i0 + k0 + block.shape[0]], block)
            block = torch.einsum("iajc,jdc->iajd", block, r)
        num[k0:k0 + rows] = (block ** 2).sum((1, 3))
    return num


def _cka_from_squares(num: torch.Tensor) -> np.ndarray:
    """CKA_ij = |C_ij|^2 / (|C_ii| |C_jj|) from the `[N, N]` squared norms (NaN where a group has no variance)."""
    self_norm = num.diagonal().sqrt()
    den = self_norm[:, None] * self_norm[None, :]
    out = torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, float("nan")))
    out = (out + out.T) / 2
    return out.cpu().numpy()


class SpilledExactCKA:
    """The exact full-data CKA of `StreamingCKA` (the same numbers) in bounded memory, the samples on disk.

    `StreamingCKA` holds the whole centred cross-covariance, `(N dim)^2` float64: 2.4 GB for SmolLM2's 270
    heads, 137 GB for Llama-3-8B's 1,024. Here samples are appended to a file as they come (`spill_dir`,
    default the system's temporary folder; `N dim` floats a token: 69 KB for SmolLM2) with their float64
    sum, and `ckas()` reads the file back once per block of groups: centred on the exact mean, each token
    chunk adds its block rows `[b, dim, N, dim]` of the cross-covariance (float32 products, float64 sums,
    as `StreamingCKA` does per batch), whose squared norms `|R_i C_ij R_j^T|^2` are all the CKA needs. The
    block is as many groups as fit in `memory` bytes (with one chunk of samples and the float32 product),
    so the peak stays near `memory` whatever N and the data; the cost is one read of the file per block
    and the same arithmetic as the in-memory scatter, `(N dim)^2` per sample.
    """

    def __init__(self, n_groups: int, dim: int, memory: int = DEFAULT_CKA_MEMORY, spill_dir: str | None = None,
                 device: torch.device | str = "cpu") -> None:
        self.n_groups, self.dim, self.device = n_groups, dim, torch.device(device)
        width = n_groups * dim
        self.block = check_cka_memory(memory, n_groups, dim)
        # token chunk read back at once: about a quarter of the budget as float32
        self.chunk = max(1, int(memory) // 4 // (width * 4))
        self.count = 0
        self.dtype: torch.dtype | None = None
        self._sum: torch.Tensor | None = None
        remove_stale_spills(spill_dir)
        # The pid in the name lets a later run tell a dead process's folder (SIGKILL, power) from a live one's.
        self._dir = tempfile.TemporaryDirectory(prefix=f"{SPILL_PREFIX}{os.getpid()}-", dir=spill_dir)
        self._path = Path(self._dir.name) / "samples.bin"
        self._file = open(self._path, "wb")

    def update(self, x: torch.Tensor) -> None:
        """Add samples `x [T, n_groups, dim]` (or `[T, n_groups * dim]`): appended to the spill file."""
        x = x.reshape(x.shape[0], -1)
        if x.shape[1] != self.n_groups * self.dim:
            raise HeadscopeError(f"features have width {x.shape[1]}; expected {self.n_groups} x {self.dim}")
        if x.shape[0] == 0:
            return
        if self._sum is None:  # the first samples set the spill file's dtype
            self.dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
            self._sum = torch.zeros(x.shape[1], dtype=torch.float64)
        x = x.detach().to("cpu", self.dtype).contiguous()
        self._file.write(x.numpy().tobytes())
        self._sum += x.sum(0, dtype=torch.float64)
        self.count += x.shape[0]

    def ckas(self, transforms: dict[str, torch.Tensor | None]) -> dict[str, np.ndarray]:
        """{name: `[N, N]` CKA} for each transform (`[N, k, dim]` or None), from one read of the file per block."""
        total, dtype = self._sum, self.dtype
        if total is None or dtype is None:  # = no samples were added (count 0)
            raise HeadscopeError("CKA needs samples; none were added")
        self._file.flush()
        n, d = self.n_groups, self.dim
        mean = (total / self.count).to(dtype)
        rs = {k: None if r is None else r.to(self.device, torch.float64) for k, r in transforms.items()}
        num = {k: torch.empty(n, n, dtype=torch.float64, device=self.device) for k in transforms}
        # One reused buffer read straight from the file (a memory map would count its pages as resident).
        buf = torch.empty(min(self.chunk, self.count), n * d, dtype=self.dtype)
        view = buf.numpy().data.cast("B")
        row_bytes = n * d * buf.element_size()
        with open(self._path, "rb", buffering=0) as f:
            for g0 in range(0, n, self.block):
                g1 = min(n, g0 + self.block)
                c = torch.zeros((g1 - g0) * d, n * d, dtype=torch.float64, device=self.device)
                f.seek(0)
                for t0 in range(0, self.count, self.chunk):
                    rows = min(self.chunk, self.count - t0)
                    got = f.readinto(view[: rows * row_bytes])
                    if got != rows * row_bytes:
                        raise HeadscopeError(f"the CKA spill file {self._path} is short: read {got} bytes")
                    xc = buf[:rows].sub_(mean).to(self.device)  # centred in place on the exact mean
                    c += xc[:, g0 * d:g1 * d].T @ xc  # float32 product added into float64
                c = c.view(g1 - g0, d, n, d)
                for k, r in rs.items():
                    num[k][g0:g1] = _squared_norms(c, g0, r)
                del c
        return {k: _cka_from_squares(v) for k, v in num.items()}

    def cka(self, transform: torch.Tensor | None = None) -> np.ndarray:
        """`[N, N]` CKA, as `StreamingCKA.cka`."""
        return self.ckas({"cka": transform})["cka"]

    def close(self) -> None:
        """Delete the spill file (also done when the object is garbage-collected)."""
        if not self._file.closed:
            self._file.close()
        self._dir.cleanup()


SPILL_PREFIX = "headscope-cka-"  # spill folders: headscope-cka-<pid>-<random>


def remove_stale_spills(spill_dir: str | None = None) -> list[Path]:
    """Delete spill folders that processes now dead left in `spill_dir` (default: the temporary folder); a
    SIGINT or SIGTERM removes its own on the way out, a SIGKILL cannot. Returns what was removed."""
    root = Path(spill_dir or tempfile.gettempdir())
    gone = []
    for d in root.glob(f"{SPILL_PREFIX}*-*"):
        pid = d.name[len(SPILL_PREFIX):].split("-", 1)[0]
        try:
            mine = d.is_dir() and d.stat().st_uid == os.getuid()
        except OSError:
            continue
        if pid.isdigit() and mine and not process_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    if gone:
        log.info("removed %d spill folder(s) of dead headscope runs from %s", len(gone), root)
    return gone


def check_cka_memory(memory: int, n_groups: int, dim: int) -> int:
    """The groups per block `SpilledExactCKA` can hold in `memory` bytes, or a clear error when not even one fits."""
    if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
        raise HeadscopeError(f"the exact CKA's memory budget must be a positive number of bytes; got {memory!r}")
    # a budget beyond what the machine has would be spent until the OOM killer ends the run
    check_fits_memory("cka_memory", -(-memory // 2**20), 2**20, "the exact CKA's blocks (MiB)", share=0.9)
    # its float64 rows of the cross-covariance and their float32 product
    per_group = dim * n_groups * dim * 12
    usable = memory - memory // 4  # a quarter goes to the chunk of samples read back
    if usable < per_group:
        need = -(-per_group * 4 // 3) // 2**20 + 1
        raise OptionError("cka_memory", f"{memory / 2**20:.0f} MiB holds no block of the exact CKA "
                                        f"({n_groups} heads x d_head {dim}: one head's rows need "
                                        f"{per_group / 2**20:.1f} MiB); give at least {need} MiB")
    return min(n_groups, usable // per_group)


def hsic1_linear(x: Any, y: Any) -> float:
    """Unbiased HSIC (Song et al. 2012) of two feature matrices `[samples, features]`, linear kernel,
    computed directly from the Gram matrices with zeroed diagonals (the reference for `MinibatchCKA`)."""
    x = torch.as_tensor(np.asarray(x), dtype=torch.float64)
    y = torch.as_tensor(np.asarray(y), dtype=torch.float64)
    n = x.shape[0]
    if x.dim() != 2 or y.dim() != 2 or y.shape[0] != n or n < 4:
        raise HeadscopeError(f"unbiased HSIC needs two [samples, features] matrices with the same samples, at "
                             f"least 4; got {tuple(x.shape)} and {tuple(y.shape)}")
    k = (x @ x.T).fill_diagonal_(0)
    l = (y @ y.T).fill_diagonal_(0)
    one = torch.ones(n, dtype=torch.float64)
    value = (torch.trace(k @ l) + (one @ k @ one) * (one @ l @ one) / ((n - 1) * (n - 2))
             - 2 / (n - 2) * (one @ k @ l @ one))
    return float(value / (n * (n - 3)))


class MinibatchCKA:
    """Linear CKA between N groups of d features from minibatch unbiased HSIC (Nguyen, Raghu and Kornblith 2021).

    CKA_ij = mean HSIC_1(i, j) / sqrt(mean HSIC_1(i, i) * mean HSIC_1(j, j)), the means over
    minibatches weighted by their size. Memory: the pool `[pool, N, dim]`, one minibatch's Gram
    matrices `[N, batch, batch]` and the `[N, N]` sums; never `(N dim)^2`.

    HSIC_1 treats a minibatch's samples as independent; tokens of one passage are not, so a minibatch
    drawn from few passages overstates CKA (measured on MiniLM, PTB: up to +0.17 with minibatches cut
    from consecutive passages, within 0.007 of the full-data CKA when shuffled over all the data).
    Samples therefore wait in a pool of `pool` rows and minibatches are drawn from it at random
    (seeded) whenever it overflows, and from what is left at the end: data that fits in the pool is
    mixed completely; beyond it, the share of same-passage pairs is about L / pool for passages of L
    tokens (see docs/similarity.md).

    With the linear kernel HSIC_1 is unchanged by adding a constant to the features, so each
    minibatch is centred first (less cancellation in float32). For centred X (K = X X^T, a_t = K_tt):
    n (n - 3) HSIC_1 = tr(K L) + tr K tr L / ((n - 1)(n - 2)) - n / (n - 2) a.b, and tr(K L) is the
    inner product of the two Gram matrices: one `[N, n^2] @ [n^2, N]` product gives every pair.
    `transforms` maps an output name to `[N, k, dim]` (group i's features x -> R_i x first) or None.
    """

    def __init__(self, n_groups: int, dim: int, batch: int = DEFAULT_CKA_BATCH,
                 transforms: dict[str, torch.Tensor | None] | None = None, pool: int = DEFAULT_CKA_POOL,
                 seed: int = 0, device: torch.device | str = "cpu") -> None:
        check_cka_batch(batch)
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 0:
            raise HeadscopeError(f"the CKA pool must be a whole number of tokens >= 0; got {pool!r}")
        # Before any pass: the pool's buffer [pool + batch, N, dim] and a minibatch's Gram matrices [N, batch, batch]
        # (two, and their centred copies; float64 at most) must fit the memory available now.
        check_fits_memory("cka_batch", batch, 4 * 8 * n_groups, f"the minibatch Gram matrices of {n_groups} heads",
                          power=2)
        check_fits_memory("cka_pool", pool, 8 * n_groups * dim, f"the CKA pool of {n_groups} heads x d_head {dim}")
        self.n_groups, self.dim, self.batch, self.pool = n_groups, dim, batch, pool
        self.transforms = {"cka": None} if transforms is None else dict(transforms)
        self.sums = {k: torch.zeros(n_groups, n_groups, dtype=torch.float64, device=device) for k in self.transforms}
        self.count = 0  # samples in the minibatches added so far
        self.minibatches = 0
        # The pool: one buffer of pool + batch rows [rows, N, dim], filled in place (never concatenated
        # and copied: that doubled SmolLM2's 140 MB pool at every batch); `_n` rows hold samples.
        self._buf: torch.Tensor | None = None
        self._n = 0
        self._gen = torch.Generator().manual_seed(seed)

    def update(self, x: torch.Tensor) -> None:
        """Add samples `x [T, n_groups, dim]` (or `[T, n_groups * dim]`)."""
        x = x.reshape(x.shape[0], self.n_groups, -1)
        if x.shape[2] != self.dim:
            raise HeadscopeError(
                f"features have width {x.shape[1] * x.shape[2]}; expected {self.n_groups} x {self.dim}")
        if x.shape[0] == 0:
            return
        # Full minibatches leave once the pool overflows, keeping at least 4 samples behind so that
        # the last minibatch is never too small for the unbiased estimator (n >= 4).
        keep = max(self.pool, 4)
        if self._buf is None:
            self._buf = x.new_empty(keep + self.batch, self.n_groups, self.dim)
        buf = self._buf
        while x.shape[0]:
            take = min(buf.shape[0] - self._n, x.shape[0])
            buf[self._n:self._n + take] = x[:take]
            self._n += take
            x = x[take:]
            if self._n - keep >= self.batch:
                self._draw_one(buf)

    def finish(self) -> None:
        """Draw every sample left in the pool: full minibatches, then the last one of 4 .. batch + 3 samples."""
        left, buf = self._n, self._buf
        if left == 0 or buf is None:  # (the pool holds samples only once its buffer exists)
            return
        if left < 4 and self.count == 0:
            raise HeadscopeError(f"CKA needs at least 4 tokens; the data gave {left}")
        k = max(0, (left - 4) // self.batch)
        perm = torch.randperm(left, generator=self._gen).to(buf.device)
        for i in range(k):
            self._add(buf[perm[i * self.batch:(i + 1) * self.batch]])
        rest = perm[k * self.batch:]
        if len(rest) >= 4:
            self._add(buf[rest])
        elif len(rest):
            log.warning("CKA: %d token(s) left after %d minibatches were not used", len(rest), self.minibatches)
        self._buf, self._n = None, 0

    def _draw_one(self, buf: torch.Tensor) -> None:
        """Add one minibatch of `batch` samples drawn at random from the pool `buf`, and close the gaps they
        leave with the last rows (moved in place: at most `batch` rows are copied)."""
        n, b = self._n, self.batch
        perm = torch.randperm(n, generator=self._gen).to(buf.device)
        drawn = perm[:b]
        self._add(buf[drawn])
        holes = drawn[drawn < n - b].sort().values
        tail = torch.ones(b, dtype=torch.bool, device=drawn.device)
        tail[drawn[drawn >= n - b] - (n - b)] = False
        fillers = torch.arange(n - b, n, device=drawn.device)[tail]  # tail rows not drawn: one per hole
        buf[holes] = buf[fillers]
        self._n = n - b

    def _add(self, x: torch.Tensor) -> None:
        """One minibatch `x [n, N, dim]`: add n * HSIC_1 of every pair, per output."""
        n = x.shape[0]
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        x = x.to(self.sums[next(iter(self.sums))].device, work)
        for name, r in self.transforms.items():
            f = x if r is None else torch.einsum("tnd,nkd->tnk", x, r.to(x.device, work))  # [n, N, k]
            f = (f - f.mean(0)).permute(1, 0, 2)  # [N, n, k], centred per group
            gram = f @ f.transpose(1, 2)  # [N, n, n]
            diag = gram.diagonal(dim1=1, dim2=2)  # [N, n]: |x_t|^2
            flat = gram.reshape(self.n_groups, n * n)
            tr_kl = (flat @ flat.T).double()  # [N, N]
            a_b = (diag @ diag.T).double()
            tr = diag.sum(-1).double()
            hsic = (tr_kl + tr[:, None] * tr[None, :] / ((n - 1) * (n - 2)) - n / (n - 2) * a_b) / (n * (n - 3))
            self.sums[name] += n * hsic  # minibatches weighted by their size
            del gram, flat, f
        self.count += n
        self.minibatches += 1

    def cka(self) -> dict[str, np.ndarray]:
        """{output name: `[N, N]` CKA}; draws what waits in the pool first. NaN where a group's HSIC is not positive."""
        self.finish()
        out = {}
        for name, s in self.sums.items():
            self_hsic = s.diagonal().clamp_min(0)
            den = (self_hsic[:, None] * self_hsic[None, :]).sqrt()
            m = torch.where(den > 0, s / den.clamp_min(1e-300), torch.full_like(s, float("nan")))
            out[name] = ((m + m.T) / 2).cpu().numpy()  # unbiased: may dip below 0 for unrelated heads
        return out


def check_cka_batch(batch: int) -> int:
    """`batch` as an int, or a clear error unless it is a whole number of tokens >= 8."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 8:
        raise HeadscopeError(f"the CKA minibatch must be a whole number of tokens, at least 8; got {batch!r} "
                             f"(default {DEFAULT_CKA_BATCH}; memory grows as heads x batch^2)")
    return batch
