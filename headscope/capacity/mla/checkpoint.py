"""Saving and reloading MLA-converted models.

transformers' own MLA layout (DeepSeek-V3: kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
v_head_dim) cannot hold a converted LLaMA exactly: it RMS-normalises the latent (kv_a_layernorm;
c / rms(c) is not linear, so no weight choice makes it the identity), its RoPE key part is one head
shared by every query head (a GQA model has one per KV head), and it rotates the first
qk_rope_head_dim frequencies of its own rotary table, not the frequencies the 2-norm criterion keeps
per KV head. It also caches the up-projected K and V, not the latent. So a converted model is saved
as its own architecture plus `headscope_mla.json` and a `modeling_headscope_mla.py` loader (the
source of `headscope.capacity.mla.modeling`, copied verbatim): `headscope.load_model(path)`,
`headscope.models.checkpoint.load_checkpoint(path)` and
`AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)` all load it. Its config.json says
model_type `headscope_mla_<base>` (`models/own_type.py`), so plain `from_pretrained` refuses it rather than
building the base family with newly initialised K/V projections.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch
import transformers

from ...errors import HeadscopeError
from ...io import atomic_dir
from ...models.adapter import HeadModel
from ...models.checkpoint import MLA_FILE, auto_class, load_weights
from ...models.config import ATTN_IMPLEMENTATION
from ...models.own_type import config_class_source, mark_own_type, read_config
from . import modeling
from .modeling import MLA_CONFIG_KEY, install_mla

REMOTE_MODULE = "modeling_headscope_mla"


def remote_code(hm: HeadModel) -> tuple[str, str]:
    """Source of the `trust_remote_code` loader of the MLA model `hm`, and its class name."""
    arch = type(hm.model).__name__
    cls = f"HeadscopeMLA{arch}"
    tail = f'''

# --- written by headscope.capacity.mla.checkpoint.remote_code ---
import transformers


class {cls}(transformers.{arch}):
    """{arch} whose attention is the MLA of config.headscope_mla (converted by headscope)."""

    config_class = {cls}Config

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        install_mla(self, config.headscope_mla)
'''
    header = ("# Loader for a model converted to multi-head latent attention by headscope (headscope mla).\n"
              "# Everything above the class at the end is headscope/capacity/mla/modeling.py, copied verbatim.\n")
    config_src = config_class_source(hm.config, "mla", f"{cls}Config")
    return header + inspect.getsource(modeling) + config_src + tail, cls


def save_mla(hm: HeadModel, path: str | Path, *, force: bool = False) -> Path:
    """Save the MLA model `hm` (weights, config, tokenizer, record, loader) atomically."""
    record = getattr(hm.config, MLA_CONFIG_KEY, None)
    if not record:
        raise HeadscopeError(f"{hm.name!r} is not an MLA model (no config.{MLA_CONFIG_KEY}); convert it first")
    path = Path(path)
    with atomic_dir(path, force=force) as tmp:
        hm.hf_model.save_pretrained(tmp)
        if hm.tokenizer is not None:
            hm.tokenizer.save_pretrained(tmp)
        (tmp / MLA_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        source, cls = remote_code(hm)
        (tmp / f"{REMOTE_MODULE}.py").write_text(source, encoding="utf-8")
        auto = auto_class(hm.config).__name__
        mark_own_type(tmp, hm.config, "mla", REMOTE_MODULE, cls, f"{cls}Config", sorted({auto, "AutoModel"}))
    return path


def load_mla(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> HeadModel:
    """Load a model saved by `save_mla`: its architecture is built, given MLA modules, then its weights."""
    path = Path(path)
    try:
        record: dict[str, Any] = json.loads((path / MLA_FILE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _damaged(path / MLA_FILE, f"not JSON: {e}") from None
    if not isinstance(record, dict):
        raise _damaged(path / MLA_FILE, "not a JSON object")
    config = read_config(path)
    setattr(config, MLA_CONFIG_KEY, record)
    config._attn_implementation = ATTN_IMPLEMENTATION
    model = auto_class(config).from_config(config).eval()
    try:
        install_mla(model, record)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise _damaged(path / MLA_FILE, f"{type(e).__name__}: {e}") from None
    load_weights(model, path)
    model.to(device=device, dtype=dtype).eval()
    tokenizer = (transformers.AutoTokenizer.from_pretrained(path, config=config)
                 if (path / "tokenizer_config.json").exists() else None)
    return HeadModel(model=model, tokenizer=tokenizer, name=str(path), source=str(path))


def _damaged(path: Path, problem: str) -> HeadscopeError:
    return HeadscopeError(f"{path} is damaged ({problem}): it records this MLA checkpoint's latent attention; copy "
                          f"the checkpoint again from where it was saved (headscope mla writes OUT/model)")
