"""The one training loop: pruning recovery, GQA uptraining and the head-count sweep all run through it.

A `Trainer` owns the optimizer (AdamW), the learning-rate schedule, gradient clipping, the seeded
generator batches are drawn from, the step counter and a progress bar. Callers give two functions:
`batch_fn(generator) -> batch` (draws the next batch with the trainer's generator, so a resumed run
draws exactly the batches an uninterrupted one would) and `loss_fn(batch) -> scalar loss`. Its whole
state (weights, optimizer, generator, step, losses) round-trips through `state_dict`, and `save` writes
it atomically, so an interrupted run resumes where its last checkpoint left it.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn
from tqdm.auto import tqdm

from .errors import HeadscopeError
from .io import disk_full_error, is_disk_full

SCHEDULES = ("constant", "cosine")
BatchFn = Callable[[torch.Generator], Any]
LossFn = Callable[[Any], torch.Tensor]


def lr_at(lr: float, step: int, steps: int, warmup: float = 0.0, schedule: str = "constant",
          min_lr_ratio: float = 0.1) -> float:
    """Learning rate at `step` of `steps`: linear warmup over `warmup` of the steps, then constant or
    cosine decay to `min_lr_ratio * lr`."""
    warm = max(1, int(warmup * steps))  # with no warmup, step 0 still runs at the full rate
    if step < warm:
        return lr * (step + 1) / warm
    if schedule == "constant":
        return lr
    progress = (step - warm) / max(1, steps - warm)
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def check_settings(steps: int, lr: float, weight_decay: float = 0.0, grad_clip: float | None = None,
                   warmup: float = 0.0, schedule: str = "constant") -> None:
    """Raise a clear error on training settings no run could use."""
    if steps < 0:
        raise HeadscopeError(f"training steps must be 0 or more, got {steps}")
    if not (lr > 0 and math.isfinite(lr)):
        raise HeadscopeError(f"learning rate must be a positive number, got {lr}; e.g. 1e-4")
    if weight_decay < 0:
        raise HeadscopeError(f"weight decay must be >= 0, got {weight_decay}")
    if grad_clip is not None and not grad_clip > 0:
        raise HeadscopeError(f"gradient clipping norm must be > 0 (or None for no clipping), got {grad_clip}")
    if not 0.0 <= warmup < 1.0:
        raise HeadscopeError(f"warmup must be a share of the steps in [0, 1), got {warmup}")
    if schedule not in SCHEDULES:
        raise HeadscopeError(f"unknown learning-rate schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


class Trainer:
    """AdamW on `params` of `model`, a seeded batch generator, and the step loop.

    `params` is an iterable of parameters or of AdamW parameter groups (dicts with "params" and, e.g.,
    "weight_decay"). `steps` is the length of the whole run, which the schedule is laid over; `run` may
    be called several times (pruning recovery trains a few steps at every curve point) and continues the
    schedule and the generator where the last call stopped.
    """

    def __init__(self, model: nn.Module, params: Iterable[Any], *, lr: float, steps: int,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 grad_clip: float | None = None, warmup: float = 0.0, schedule: str = "constant",
                 min_lr_ratio: float = 0.1, seed: int = 0, desc: str = "train") -> None:
        check_settings(steps, lr, weight_decay, grad_clip, warmup, schedule)
        self.model = model
        groups = list(params)
        chosen = {id(p) for g in groups for p in (g["params"] if isinstance(g, dict) else [g])}
        # In the model's own order, whatever the grouping: the gradient norm that clipping computes is a
        # float sum, and its order decides the last bits (a plain AdamW over model.parameters() sums so).
        self.params = [p for p in model.parameters() if id(p) in chosen]
        if len(self.params) != len(chosen):
            raise HeadscopeError(f"{len(chosen) - len(self.params)} of the parameters to train are not "
                                 f"parameters of the model being trained")
        if not self.params:
            raise HeadscopeError("nothing to train: no parameter requires a gradient")
        # offloaded by a device map: reloaded from its store every forward
        if any(p.is_meta for p in self.params):
            raise HeadscopeError("cannot train parameters offloaded by a device map (device_map); train a model "
                                 "that fits on one device (device), or train fewer parameters",
                                 fields=("device_map", "device"))
        self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay)
        self.lr, self.steps, self.warmup, self.schedule, self.min_lr_ratio = lr, steps, warmup, schedule, min_lr_ratio
        self.grad_clip = grad_clip
        self.generator = torch.Generator().manual_seed(seed)
        self.step = 0  # optimizer steps taken so far
        self.losses: list[float] = []
        self.train_s = 0.0  # wall seconds inside loss + backward + optimizer step
        # the same in CPU seconds (unlike wall time, not inflated by other jobs)
        self.cpu_s = 0.0
        self.desc = desc

    def run(self, n_steps: int, batch_fn: BatchFn, loss_fn: LossFn, *, progress: bool = False,
            on_step: Callable[[int, float], None] | None = None) -> list[float]:
        """Take `n_steps` optimizer steps; returns their losses. The model is in train mode only inside."""
        if n_steps < 0:
            raise HeadscopeError(f"training steps must be 0 or more, got {n_steps}")
        out: list[float] = []
        bar = tqdm(total=n_steps, desc=self.desc, unit="step", disable=not progress, leave=False)
        self.model.train()
        try:
            for _ in range(n_steps):
                batch = batch_fn(self.generator)
                t0, c0 = time.perf_counter(), time.process_time()
                for group in self.optimizer.param_groups:
                    group["lr"] = lr_at(self.lr, self.step, self.steps, self.warmup, self.schedule,
                                        self.min_lr_ratio)
                loss = loss_fn(batch)
                value = float(loss.detach())
                if not math.isfinite(value):  # stop before a NaN step spoils the weights
                    raise HeadscopeError(f"{self.desc}: training diverged (loss {value}) at step {self.step}; "
                                         f"try a lower learning rate")
                self.optimizer.zero_grad(set_to_none=True)
                loss.float().backward()
                if self.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
                self.optimizer.step()
                self.train_s += time.perf_counter() - t0
                self.cpu_s += time.process_time() - c0
                self.step += 1
                out.append(value)
                if on_step is not None:
                    on_step(self.step - 1, value)
                bar.update(1)
                if self.step % 10 == 0:
                    bar.set_postfix(loss=f"{value:.3f}")
        finally:
            bar.close()
            self.model.eval()
        self.losses += out
        return out

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs: weights, optimizer, generator, step and losses (copies)."""
        return {"model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": _clone(self.optimizer.state_dict()), "generator": self.generator.get_state(),
                "step": self.step, "losses": list(self.losses)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from `state_dict` (or from a file written by `save`); one that does not fit this
        trainer (other shapes, a damaged optimizer state) is a HeadscopeError."""
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.generator.set_state(state["generator"])
            self.step, self.losses = int(state["step"]), [float(x) for x in state["losses"]]
        except (KeyError, RuntimeError, ValueError, TypeError, IndexError) as e:
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
            raise HeadscopeError(f"the saved training state does not fit this run ({type(e).__name__}: {first}); "
                                 f"pass force=True (or delete the partial files) to start over",
                                 fields=("force",)) from None

    def save(self, path: str | Path, **extra: Any) -> None:
        """Write the state (plus `extra` entries) to `path` atomically: a crash leaves the old file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        state = {**self.state_dict(), **extra}
        try:
            torch.save(state, tmp)
            os.replace(tmp, path)
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            # torch reports a short write as "enforce fail ... unexpected pos"
            if is_disk_full(e):
                raise disk_full_error(path, _tensor_bytes(state)) from None
            raise

    @staticmethod
    def read(path: str | Path) -> dict[str, Any]:
        """A state written by `save`, read with `torch.load(weights_only=True)`: tensors, numbers, strings, lists
        and dicts only, so a crafted file (a results folder someone sent) cannot run code; anything else, or a
        cut file, is a HeadscopeError naming the file."""
        try:
            blob = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as e:
            # a cut file (EOFError, RuntimeError) or a pickle of objects (UnpicklingError)
            first = str(e).strip().splitlines()[0][:160] if str(e).strip() else "unreadable"
            raise HeadscopeError(f"{path} is damaged ({type(e).__name__}: {first}): not a training state headscope "
                                 f"wrote, and nothing in it was run (headscope loads only tensors and plain values "
                                 f"from such files)") from None
        missing = [k for k in ("model", "optimizer", "generator", "step", "losses") if not isinstance(blob, dict)
                   or k not in blob]
        if missing or not isinstance(blob["model"], dict) or not isinstance(blob["generator"], torch.Tensor):
            raise HeadscopeError(f"{path} is damaged ({'no ' + ', '.join(missing) if missing else 'wrong types'} in "
                                 f"it): not a training state headscope wrote")
        return blob


@contextmanager
def frozen_weights(model: Any) -> Iterator[None]:
    """`model`'s parameters (an nn.Module, or anything with `.model`, e.g. a HeadModel) with requires_grad off
    while active, restored after: training something else through it (gates, mixing weights) computes no weight
    gradient at all."""
    params = list(getattr(model, "model", model).parameters())
    was = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, w in zip(params, was, strict=True):
            p.requires_grad_(w)


def _tensor_bytes(obj: Any) -> int:
    """Bytes of every tensor in a nested state (what a checkpoint of it needs on disk, about)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj
