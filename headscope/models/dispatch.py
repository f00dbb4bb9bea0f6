"""Models dispatched over several devices by accelerate (`device_map`): where inputs go, and their weights.

A dispatched model (`from_pretrained(..., device_map=...)`) keeps some modules on GPUs, some in CPU
memory and some on disk; accelerate's hooks move each module's weights and inputs to its execution
device as it runs. Parameters offloaded to disk (or to CPU when a GPU computes) sit on the `meta`
device between forwards, so `next(model.parameters()).device` says nothing useful and
`model.state_dict()` holds no values for them. The helpers here answer both questions for every
model, dispatched or not, and load offloaded weights one module at a time when something must
read or rewrite them (provenance fingerprints, physical pruning).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Any, Iterator

import torch
from torch import nn

# Device-map values that hold weights but never compute: their modules run on the main device.
_STORAGE = ("cpu", "disk")


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate dispatched `model` over devices (loaded with a `device_map`)."""
    return bool(getattr(model, "hf_device_map", None))


def main_device(device_map: dict) -> torch.device:
    """The device a dispatched model computes on first: accelerate's rule (the first value that is
    neither "cpu" nor "disk", else cpu), where offloaded modules also run and inputs belong."""
    computing = [d for d in device_map.values() if d not in _STORAGE]
    if not computing:
        return torch.device("cpu")
    d = computing[0]
    # An int is an accelerator index (cuda:N); strings ("cuda:1", "mps") parse as they are.
    return torch.device("cuda", d) if isinstance(d, int) else torch.device(d)


def input_device(model: nn.Module) -> torch.device:
    """Where a batch for `model` belongs: its main device when dispatched, else its parameters' device."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map:  # = is_dispatched(model)
        return main_device(device_map)
    return next(model.parameters()).device


def _offload_hook(module: nn.Module) -> Any:
    """The accelerate hook of `module` that holds its weights off the device (or None)."""
    hook = getattr(module, "_hf_hook", None)
    hooks = getattr(hook, "hooks", None) or ([hook] if hook is not None else [])  # SequentialHook or one hook
    for h in hooks:
        if getattr(h, "offload", False) and getattr(h, "weights_map", None) is not None:
            return h
    return None


def offloaded(module: nn.Module) -> bool:
    """Whether `module`'s own weights live in an offload store (disk, or CPU while a GPU computes)."""
    return _offload_hook(module) is not None


@contextmanager
def loaded(modules: list[nn.Module]) -> Iterator[None]:
    """Within the block, offloaded `modules` hold their real weights (on their execution device); after it,
    the weights go back to their store. Read them here, write nothing (see `materialize`)."""
    from accelerate.utils import align_module_device  # accelerate only for offloaded device maps (optional)

    with ExitStack() as stack:
        for module in modules:
            if offloaded(module):
                stack.enter_context(align_module_device(module))
        yield


def state_items(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`sorted(model.state_dict().items())` with real values for offloaded tensors.

    An offloaded tensor is read from its module's offload store (disk or CPU) when its turn comes,
    so at most one of them is held at a time: a model larger than memory can be fingerprinted.
    """
    state = model.state_dict()
    owners = {}
    if is_dispatched(model):
        for prefix, module in model.named_modules():
            hook = _offload_hook(module)
            if hook is not None:
                owners[prefix] = hook
    for name in sorted(state):
        value = state[name]
        if value.is_meta and owners:
            prefix, _, local = name.rpartition(".")
            hook = owners.get(prefix)
            if hook is not None:
                value = hook.weights_map[local]
        yield name, value


def materialize(modules: list[nn.Module]) -> None:
    """Give offloaded `modules` their real weights on their execution device, for good.

    Their offload hooks are replaced by hooks that only move inputs: a module rewritten afterwards
    (resized by pruning) keeps the weights it was given instead of reloading the stale ones from
    the offload store at its next forward. Modules already in memory are left as they are.
    """
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module, remove_hook_from_module  # optional, as above

    for module in modules:
        hook = _offload_hook(module)
        if hook is None:
            continue
        hook.pre_forward(module)  # puts the stored weights on hook.execution_device
        device = hook.execution_device
        remove_hook_from_module(module)
        # Keep moving inputs to where the weights now are, as the removed hook did.
        add_hook_to_module(module, AlignDevicesHook(execution_device=device))
