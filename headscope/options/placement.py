"""Where a model goes: the checks of --device, --device-map and --max-memory (the model group's options)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..errors import HeadscopeError
from .spec import OptionError


def check_device(device: str) -> str:
    """Refuse a torch device string that does not parse or names hardware this machine lacks."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise OptionError("device", f"{device!r} is not a torch device; use cpu, cuda, cuda:0 or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise OptionError("device", f"{device!r}: CUDA is not available on this machine "
                                 f"(torch {torch.__version__}); use cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise OptionError("device", f"{device!r}: this machine has {torch.cuda.device_count()} CUDA "
                                 f"device(s), numbered from 0; use cuda:0")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise OptionError("device", f"{device!r}: MPS is not available on this machine; use cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise OptionError("device", f"{device!r}: headscope runs on cpu, cuda or mps; use cpu")
    return device


def read_device_map(value: str | None) -> str | dict | None:
    """--device-map as accelerate takes it: a strategy name as given, or a .json file's {module: device} dict."""
    if value is None or not value.endswith(".json"):
        return value
    try:
        mapping = json.loads(Path(value).read_text(encoding="utf-8"))
    except OSError as e:
        raise OptionError("device_map", f"{value!r} cannot be read ({e.strerror or type(e).__name__}); give a "
                             f"JSON file {{\"module name\": device}} or a strategy such as auto") from None
    except ValueError as e:
        raise OptionError("device_map", f"{value!r} is not JSON ({e}); write {{\"model.layers.0\": 0, "
                             f"\"model.layers.1\": \"cpu\", \"lm_head\": \"disk\"}}") from None
    if not isinstance(mapping, dict) or not mapping:
        raise OptionError("device_map", f"{value!r} must hold a non-empty JSON object {{module name: device}}")
    for module, device in mapping.items():
        if isinstance(device, bool) or not isinstance(device, (int, str)):
            raise OptionError("device_map", f"{value!r}: module {module!r} has device {device!r}; use a GPU "
                                 f"index, \"cpu\", \"disk\", \"mps\" or \"cuda:N\"")
        if device != "disk":
            try:
                check_device(f"cuda:{device}" if isinstance(device, int) else device)
            except HeadscopeError as e:
                what = f"device {e.problem}" if isinstance(e, OptionError) else str(e)
                raise OptionError("device_map", f"{value!r}, module {module!r}: {what}", also=("device",)) from None
    return mapping


def parse_max_memory(text: str | None) -> dict[int | str, int | str] | None:
    """`--max-memory 0=20GiB,cpu=60GiB` as accelerate's max_memory dict, each device and size checked."""
    if text is None:
        return None
    out: dict[int | str, int | str] = {}
    for item in text.split(","):
        key, sep, size = (part.strip() for part in item.partition("="))
        if not sep or not key or not size:
            raise OptionError("max_memory", f"{text!r}: {item.strip()!r} is not DEVICE=SIZE; write e.g. "
                                 f"0=20GiB,cpu=60GiB (a GPU index, cpu or mps, then bytes or a size like 500MiB)")
        dev: int | str
        if key.isdigit():
            dev = int(key)
            if dev >= torch.cuda.device_count():
                raise OptionError("max_memory", f"{text!r}: GPU {dev} does not exist (this machine has "
                                     f"{torch.cuda.device_count()} CUDA device(s)); name cpu, or GPUs from 0")
        elif key in ("cpu", "mps"):
            dev = key
        else:
            raise OptionError("max_memory", f"{text!r}: {key!r} is not a device; use a GPU index (0, 1, ...), "
                                 f"cpu or mps")
        if not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B)?", size, flags=re.IGNORECASE):
            raise OptionError("max_memory", f"{text!r}: {size!r} is not a size; use bytes or e.g. 500MiB, 20GiB, 2GB")
        out[dev] = size if not size.isdigit() else int(size)
    return out


