"""Arguments and printing shared by several verbs."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import torch

from ..artifacts import outputs
from ..artifacts.locations import MODEL, check_locations
from ..data import DEFAULT_LIMIT
from ..data.limits import STEPS_MAX, WORK, check_at_most, check_fits_memory
from ..errors import HeadscopeError
from ..io import check_writable_dir, check_writable_file
from ..models.adapter import HeadModel
from ..models.loading import check_device_map, load_model, resolve_dtype
from ..table import HeadTable
from ..uncertainty import IntervalSettings, check_settings

# Count options any verb may define (argparse dest -> the option as the user typed it); each must be >= 1.
POSITIVE = {"batch_size": "--batch-size", "max_length": "--max-length", "limit": "--limit",
            "heldout_limit": "--heldout-limit", "data_limit": "--data-limit", "steps": "--steps",
            "seq": "--seq", "batch": "--batch", "layers": "--layers", "d_model": "--d-model",
            "eval_tokens": "--eval-tokens", "ig_steps": "--ig-steps", "search_candidates": "--search-candidates"}
# Options that must be >= 0.
NON_NEGATIVE = {"sentences": "--sentences", "recover": "--recover", "uptrain": "--uptrain", "top": "--top"}
# Training steps (optimizer steps of one run, or between two points): bounded (data.limits.STEPS_MAX).
STEPS = {"steps": "--steps", "recover": "--recover", "uptrain": "--uptrain", "l0_steps": "--l0-steps",
         "learn_steps": "--learn-steps"}
# Work counts with a fixed bound of their own (data.limits.WORK: the most, and why).
WORK_COUNTS = {"ig_steps": ("--ig-steps", "ig_steps"), "haystacks": ("--haystacks", "haystacks"),
               "score_haystacks": ("--score-haystacks", "haystacks"), "learn_prompts": ("--learn-prompts", "haystacks")}
# Memory caps a user gives in MiB: at most what the machine has available now.
MEMORY_MIB = {"cka_memory": "--cka-memory"}
# Learning rates: finite and > 0.
RATES = {"lr": "--lr", "recover_lr": "--recover-lr"}
# Folders and files a verb writes: checked (creatable, writable, no dangling symlink) before any work.
OUTPUT_DIRS = {"out": "--out", "offload_dir": "--offload-dir"}
OUTPUT_FILES = {"export_card": "--export-card", "out_file": "--out"}  # out_file: export's --out, one file
# One seed rule for every verb: what torch's generators, numpy's (legacy np.random.seed included) and
# Python's random all accept, so a seed that passes here never fails deep in a run.
SEED_MAX = 2**32 - 1


def check_device(device: str) -> str:
    """Refuse a torch device string that does not parse or names hardware this machine lacks."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise HeadscopeError(f"--device {device!r} is not a torch device; use cpu, cuda, cuda:0 or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HeadscopeError(f"--device {device!r}: CUDA is not available on this machine "
                                 f"(torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise HeadscopeError(f"--device {device!r}: this machine has {torch.cuda.device_count()} CUDA "
                                 f"device(s), numbered from 0; use cuda:0")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise HeadscopeError(f"--device {device!r}: MPS is not available on this machine; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise HeadscopeError(f"--device {device!r}: headscope runs on cpu, cuda or mps; use --device cpu")
    return device


def check_common(args: argparse.Namespace) -> None:
    """Validate the options many verbs share (counts, rates, device), before any verb does work.

    The CLI calls this for every verb, so a verb gets these checks by naming its options as here.
    """
    for dest, flag in POSITIVE.items():
        v = getattr(args, dest, None)
        if v is not None and v < 1:
            raise HeadscopeError(f"{flag} must be at least 1; got {v}")
    for dest, flag in NON_NEGATIVE.items():
        v = getattr(args, dest, None)
        if v is not None and v < 0:
            raise HeadscopeError(f"{flag} must be 0 or more; got {v}")
    check_upper_bounds(args)
    for dest, flag in RATES.items():
        v = getattr(args, dest, None)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise HeadscopeError(f"{flag} must be a positive number like 1e-3; got {v}")
    if getattr(args, "ci", None) is not None:
        check_settings(args.ci, args.bootstrap)
    if getattr(args, "until_stable", None) is not None and not (0.0 < args.until_stable < 1.0):
        raise HeadscopeError(f"--until-stable must be a split-half stability in (0, 1), e.g. 0.9; got "
                             f"{args.until_stable}")
    seed = getattr(args, "seed", None)
    if seed is not None and not (0 <= seed <= SEED_MAX):
        raise HeadscopeError(f"--seed must be a whole number from 0 to {SEED_MAX} (2**32 - 1, what torch, numpy "
                             f"and random all accept); got {seed}")
    for dest, flag in OUTPUT_DIRS.items():
        if getattr(args, dest, None) is not None:
            check_writable_dir(getattr(args, dest), option=flag)
    for dest, flag in OUTPUT_FILES.items():
        path = getattr(args, dest, None)
        if path is not None and not (dest == "export_card" and Path(path).is_dir()):  # a duo card is a folder
            check_writable_file(path, flag)
    check_output_locations(args)
    if getattr(args, "device", None) is not None:
        check_device(args.device)
    if hasattr(args, "device_map"):  # the verbs that load a model (kv's own --dtype is a cache dtype)
        check_placement(args)


# Inputs a verb reads (argparse dest -> the option as typed), checked against every place it writes.
INPUTS = {"model": MODEL, "data": "--data", "heldout": "--heldout", "train_data": "--train-data",
          "long_data": "--long-data", "treebank": "--treebank", "scores_file": "--from"}
WHOLE = {"export_card": "--export-card", "out_file": "--out", "offload_dir": "--offload-dir"}  # replaced whole


def check_output_locations(args: argparse.Namespace) -> None:
    """Output locations that collide with each other or with an input, refused before any model loads
    (`io.check_locations`): --export-card equal to --out, --out being the model's folder, --data where a result
    goes, ..."""
    read = {flag: Path(v) for dest, flag in INPUTS.items()
            if isinstance(v := getattr(args, dest, None), str) and v and Path(v).exists()}
    read.update({f"--from {d!r}": Path(d) for d in getattr(args, "from_dirs", None) or [] if Path(d).exists()})
    whole = {flag: Path(v) for dest, flag in WHOLE.items() if isinstance(v := getattr(args, dest, None), str) and v}
    out = None
    if isinstance(getattr(args, "out", None), str) and args.out.strip():
        try:
            names = outputs(args.verb, optional=True) if getattr(args, "verb", None) else []
        except HeadscopeError:  # a verb that declares no files
            names = []
        out = ("--out", Path(args.out), names)
    check_locations(out, whole, read)


def check_upper_bounds(args: argparse.Namespace) -> None:
    """The sizes with an upper bound (data.limits), each refused before any work with the limit and why."""
    for dest, flag in STEPS.items():
        v = getattr(args, dest, None)
        if isinstance(v, int):
            check_at_most(flag, v, STEPS_MAX, "optimizer steps: a run of more is days of work and keeps a loss per "
                                              "step; train in stages from a saved model instead")
    tokens = getattr(args, "context", None) or getattr(args, "long", None)  # one haystack's length
    for dest, (flag, kind) in WORK_COUNTS.items():
        v = getattr(args, dest, None)
        if isinstance(v, int):
            check_at_most(flag, v, *WORK[kind])
            if kind == "haystacks" and isinstance(tokens, int) and tokens > 0:  # held as token ids (a Python int each)
                check_fits_memory(flag, v, 40 * tokens, f"haystacks of {tokens:,} tokens held as token ids")
    threads, cpus = getattr(args, "threads", None), os.cpu_count() or 1
    if isinstance(threads, int):
        check_at_most("--threads", threads, cpus, "the CPUs this machine has: more threads only wait on each other")
    for dest, flag in MEMORY_MIB.items():
        v = getattr(args, dest, None)
        if isinstance(v, int) and v > 0:
            check_fits_memory(flag, v, 2**20, "the memory it may take (MiB)", share=0.9)


def check_placement(args: argparse.Namespace) -> None:
    """Validate --dtype, --device-map, --max-memory and --offload-dir (and their combinations)."""
    resolve_dtype(args.dtype)
    check_device_map(read_device_map(args.device_map), args.device)
    if args.device_map is None:
        for flag, v in (("--max-memory", args.max_memory), ("--offload-dir", args.offload_dir)):
            if v is not None:
                raise HeadscopeError(f"{flag} places a model spread over devices; give --device-map auto with it")
        return
    parse_max_memory(args.max_memory)  # --offload-dir: checked with every output folder (OUTPUT_DIRS)


def read_device_map(value: str | None) -> str | dict | None:
    """--device-map as accelerate takes it: a strategy name as given, or a .json file's {module: device} dict."""
    if value is None or not value.endswith(".json"):
        return value
    try:
        mapping = json.loads(Path(value).read_text(encoding="utf-8"))
    except OSError as e:
        raise HeadscopeError(f"--device-map {value!r} cannot be read ({e.strerror or type(e).__name__}); give a "
                             f"JSON file {{\"module name\": device}} or a strategy such as auto") from None
    except ValueError as e:
        raise HeadscopeError(f"--device-map {value!r} is not JSON ({e}); write {{\"model.layers.0\": 0, "
                             f"\"model.layers.1\": \"cpu\", \"lm_head\": \"disk\"}}") from None
    if not isinstance(mapping, dict) or not mapping:
        raise HeadscopeError(f"--device-map {value!r} must hold a non-empty JSON object {{module name: device}}")
    for module, device in mapping.items():
        if isinstance(device, bool) or not isinstance(device, (int, str)):
            raise HeadscopeError(f"--device-map {value!r}: module {module!r} has device {device!r}; use a GPU "
                                 f"index, \"cpu\", \"disk\", \"mps\" or \"cuda:N\"")
        if device != "disk":
            try:
                check_device(f"cuda:{device}" if isinstance(device, int) else device)
            except HeadscopeError as e:
                raise HeadscopeError(f"--device-map {value!r}, module {module!r}: {e}") from None
    return mapping


def parse_max_memory(text: str | None) -> dict[int | str, int | str] | None:
    """`--max-memory 0=20GiB,cpu=60GiB` as accelerate's max_memory dict, each device and size checked."""
    if text is None:
        return None
    out: dict[int | str, int | str] = {}
    for item in text.split(","):
        key, sep, size = (part.strip() for part in item.partition("="))
        if not sep or not key or not size:
            raise HeadscopeError(f"--max-memory {text!r}: {item.strip()!r} is not DEVICE=SIZE; write e.g. "
                                 f"0=20GiB,cpu=60GiB (a GPU index, cpu or mps, then bytes or a size like 500MiB)")
        dev: int | str
        if key.isdigit():
            dev = int(key)
            if dev >= torch.cuda.device_count():
                raise HeadscopeError(f"--max-memory {text!r}: GPU {dev} does not exist (this machine has "
                                     f"{torch.cuda.device_count()} CUDA device(s)); name cpu, or GPUs from 0")
        elif key in ("cpu", "mps"):
            dev = key
        else:
            raise HeadscopeError(f"--max-memory {text!r}: {key!r} is not a device; use a GPU index (0, 1, ...), "
                                 f"cpu or mps")
        if not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B)?", size, flags=re.IGNORECASE):
            raise HeadscopeError(f"--max-memory {text!r}: {size!r} is not a size; use bytes or e.g. 500MiB, 20GiB, 2GB")
        out[dev] = size if not size.isdigit() else int(size)
    return out


def load_from_args(args: argparse.Namespace) -> HeadModel:
    """The verb's model, loaded as --device / --dtype / --device-map (--max-memory, --offload-dir) say (a model
    without a tokenizer is told what to copy where its text is tokenised: headscope.data.prepare)."""
    return load_model(args.model, device=args.device, dtype=args.dtype, device_map=read_device_map(args.device_map),
                      max_memory=parse_max_memory(args.max_memory), offload_folder=args.offload_dir)


def add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default="minilm",
                   help="built-in name (minilm, smollm2), a model directory, or a hub id (default: minilm)")
    add_device_args(p)


def add_device_args(p: argparse.ArgumentParser) -> None:
    """--device, --dtype and the big-model placement options every model-loading verb shares."""
    p.add_argument("--device", default=None, help="torch device for the whole model: cpu, cuda, cuda:1, mps "
                                                  "(default: cpu; not with --device-map)")
    p.add_argument("--dtype", default="float32", metavar="{float32,bfloat16,float16}",
                   help="weights' dtype (default float32); statistics accumulate in float64 whatever it is. "
                        "float16 on CPU is slow (see docs/devices.md)")
    p.add_argument("--device-map", default=None, metavar="{auto,balanced,balanced_low_0,sequential,FILE.json}",
                   help="spread a model too large for one device over GPUs, CPU memory and disk "
                        "(accelerate's big-model dispatch), by a strategy or a JSON file {module: device}; "
                        "not with --device")
    p.add_argument("--max-memory", default=None, metavar="DEV=SIZE,...",
                   help="with --device-map: memory each device may hold, e.g. 0=20GiB,1=20GiB,cpu=60GiB "
                        "(the rest goes to disk)")
    p.add_argument("--offload-dir", default=None, metavar="DIR",
                   help="with --device-map: folder for weights offloaded to disk (default: a temporary folder, "
                        "removed afterwards)")


def add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None,
                   help="a .txt (one passage a line), .jsonl (a 'text' field) or .conllu file "
                        "(default: the built-in English sample)")
    p.add_argument("--max-length", type=int, default=None,
                   help="tokens per passage (default 128, capped at the model's)")
    p.add_argument("--batch-size", type=int, default=16, help="passages per forward pass (default 16)")
    p.add_argument("--limit", type=int, default=None,
                   help=f"use only the first N passages (default: a built-in corpus gives its first {DEFAULT_LIMIT}, "
                        f"a file is read whole)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def add_interval_args(p: argparse.ArgumentParser, until_stable: bool = False) -> None:
    """--ci and --bootstrap (every figure's confidence interval) and, for rankings, --until-stable."""
    g = p.add_argument_group("uncertainty (docs/uncertainty.md)")
    g.add_argument("--ci", type=float, default=0.95, metavar="LEVEL",
                   help="confidence level of every interval, in (0, 1) (default 0.95; BCa bootstrap over passages)")
    g.add_argument("--bootstrap", type=int, default=1000, metavar="B",
                   help="bootstrap resamples of the passages, at least 100 (default 1000, seeded by --seed)")
    if until_stable:
        g.add_argument("--until-stable", type=float, default=None, metavar="R",
                       help="read passages in chunks until the ranking's split-half stability (Spearman-Brown) "
                            "reaches R, e.g. 0.9, capped by --limit; the final line says whether it did")


def interval_settings(args: argparse.Namespace) -> IntervalSettings:
    """The interval settings a verb's --ci, --bootstrap and --seed ask for."""
    return IntervalSettings(level=args.ci, B=args.bootstrap, seed=args.seed)


def add_out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="headscope-out", help="output directory (default: headscope-out/)")
    p.add_argument("--force", action="store_true", help="overwrite results already in --out")



def fmt(v: float, width: int = 5) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(width)
    return f"{v:{width}.2f}"


def grid(table: HeadTable, column: str, title: str) -> str:
    """A layers x heads grid of one column as text."""
    values = table[column]
    lines = [f"{title} ({column})", "layer " + "".join(f"{'H' + str(h):>6}" for h in range(table.n_heads))]
    for layer in range(table.n_layers):
        lines.append(f"L{layer:<4} " + "".join(" " + fmt(float(v)) for v in np.asarray(values[layer], float)))
    return "\n".join(lines)
