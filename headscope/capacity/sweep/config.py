"""What a sweep trains: one frozen `SweepConfig` per configuration, its resumable key, and the plan
that expands head counts x KV-head counts x d_head values into valid configurations."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ...data.limits import available_memory, human
from ...errors import HeadscopeError, OptionError, did_you_mean
from .tasks import PAIR_OFFSETS, TASKS, XOR_POSITIONS

__all__ = ["SWEEP_VERSION", "SweepConfig", "config_key", "plan_sweep"]

# Bump when training or evaluation changes in a way that changes results: old results then no longer match.
SWEEP_VERSION = 1


@dataclass(frozen=True)
class SweepConfig:
    """One configuration of a sweep; everything that changes the trained model is a field (and in the key)."""

    task: str
    d_model: int
    n_heads: int
    n_layers: int
    steps: int
    seq: int
    batch: int
    seed: int = 0
    n_kv_heads: int | None = None  # None: = n_heads (MHA)
    d_head: int | None = None  # None: d_model // n_heads
    lr: float = 3e-3
    # fraction of steps with linear warm-up, then cosine decay to lr/10
    warmup: float = 0.05
    weight_decay: float = 0.01
    d_ff_mult: int = 4
    eval_tokens: int = 65536
    tokenization: str = "byte"
    # None: GPT-2 init (std 0.02, residual projections scaled down)
    init_std: float | None = None

    @property
    def kv_heads(self) -> int:
        """Resolved number of KV heads."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        """Resolved d_head."""
        return self.d_model // self.n_heads if self.d_head is None else self.d_head

    @property
    def label(self) -> str:
        """Short text name, e.g. 'h=8 kv=8 d_head=32'."""
        return f"h={self.n_heads} kv={self.kv_heads} d_head={self.head_dim}"


def config_key(cfg: SweepConfig, data_fingerprint: str) -> str:
    """Stable 16-hex-digit key of a configuration on some data: the name of its result file."""
    config = asdict(cfg)
    if config["init_std"] is None:
        # added later: configurations without it keep the keys they had
        del config["init_std"]
    payload = json.dumps({"config": config, "data": data_fingerprint, "version": SWEEP_VERSION}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _check_shape(task: str, d_model: int, n_layers: int, steps: int, seq: int, batch: int) -> None:
    if task not in TASKS:
        raise HeadscopeError(f"unknown task {task!r}{did_you_mean(task, TASKS)}; choose one of {', '.join(TASKS)}")
    for name, v in (("d_model", d_model), ("layers", n_layers), ("steps", steps), ("max_length", seq),
                    ("batch_size", batch)):  # the SweepOptions fields these arguments come from
        if v < 1:
            raise OptionError(name, f"must be positive; got {v}")
    if task == "pair" and seq <= max(PAIR_OFFSETS):
        raise OptionError("max_length", f"must exceed {max(PAIR_OFFSETS)}: the pair task reads offsets "
                                        f"{PAIR_OFFSETS}; got {seq}")
    if task == "xor" and seq <= max(XOR_POSITIONS) + 1:
        raise OptionError("max_length", f"(bits + 1) must be at least {max(XOR_POSITIONS) + 2}: the xor task reads "
                                        f"the bits at positions {XOR_POSITIONS} and ends with a query token; got {seq}")


def training_bytes(cfg: SweepConfig, vocab: int = 10_001) -> float:
    """About the memory training `cfg` takes (float32): weights, gradients and Adam's two moments (16 bytes a
    parameter), and the activations kept for the backward pass (the attention maps included); `vocab`: the
    largest tokenization's (PTB words + <eos>)."""
    d, h = cfg.d_model, cfg.n_heads
    dh = cfg.d_head or max(1, d // h)
    params = cfg.n_layers * (4 * d * h * dh + 8 * d * d) + 2 * vocab * d
    activations = cfg.n_layers * cfg.batch * cfg.seq * (16 * d + 2 * h * cfg.seq) + cfg.batch * cfg.seq * vocab
    return 16.0 * params + 4.0 * activations


def plan_sweep(
    task: str, d_model: int, heads: Sequence[int], n_layers: int, steps: int, seq: int, batch: int, seed: int = 0,
    kv_heads: Sequence[int] | None = None, d_heads: Sequence[int] | None = None, **extra: object,
) -> tuple[list[SweepConfig], list[str]]:
    """Expand heads x kv_heads x d_heads into configurations; return (valid configs, messages for skipped ones).

    Without `d_heads`, d_head = d_model / h, so an `h` that does not divide d_model is skipped. A KV-head
    count that does not divide h (or exceeds it) is skipped for that h. Raises when nothing valid remains.
    """
    _check_shape(task, d_model, n_layers, steps, seq, batch)
    if not heads or any(h < 1 for h in heads):
        raise OptionError("heads", f"must be positive integers; got {list(heads)}")
    configs: list[SweepConfig] = []
    skipped: list[str] = []
    for h in heads:
        if not d_heads and d_model % h:
            skipped.append(f"h={h}: d_model={d_model} is not divisible by {h} heads, so a head's width d_model/h is "
                           f"not an integer (give d_head to set it independently)")
            continue
        kv_options: Sequence[int | None] = kv_heads or [None]
        for kv in kv_options:
            if kv is not None and (kv < 1 or kv > h or h % kv):
                skipped.append(f"h={h} kv={kv}: the KV-head count must divide the {h} query heads "
                               f"(choose from {[g for g in range(1, h + 1) if h % g == 0]})")
                continue
            d_options: Sequence[int | None] = d_heads or [None]
            for dh in d_options:
                if dh is not None and dh < 1:
                    raise OptionError("d_head", f"must be positive; got {dh}")
                # Store the defaults as None, so "--kv-heads 8" at h=8 (MHA) or "--d-head 32" at d_model/h = 32
                # is the same configuration, with the same key, as leaving them out: results are reused.
                kv_norm = None if kv == h else kv
                dh_norm = None if dh is not None and dh * h == d_model else dh
                cfg = SweepConfig(task=task, d_model=d_model, n_heads=h, n_layers=n_layers, steps=steps, seq=seq,
                                  batch=batch, seed=seed, n_kv_heads=kv_norm, d_head=dh_norm, **extra)  # type: ignore[arg-type]
                if cfg not in configs:
                    configs.append(cfg)
    free = available_memory()
    # before any model is built: each must fit in half the memory available now
    for cfg in configs:
        need = training_bytes(cfg)
        if free is not None and need > free / 2:
            raise HeadscopeError(
                f"training d_model {cfg.d_model} with {cfg.n_layers:,} layer(s) of {cfg.n_heads} attention "
                f"head(s) on {cfg.batch:,} x {cfg.seq:,} tokens needs about {human(need)} of memory, but this "
                f"machine has {human(free)} available now; lower d_model, layers, heads, batch_size or max_length",
                fields=("d_model", "layers", "heads", "batch_size", "max_length"))
    if not configs:
        divisors = ", ".join(str(h) for h in range(1, min(d_model, 64) + 1) if d_model % h == 0)
        raise HeadscopeError(f"no valid configuration to train ({'; '.join(skipped)}); head counts dividing "
                             f"d_model={d_model}: {divisors}", fields=("d_head",))
    return configs, skipped
