"""Checkpoints in a layout plain transformers cannot build get a model_type of their own.

A checkpoint with per-layer head counts or FFN widths, or with MLA attention, keeps its base family's
weight names but not its shapes (or not its modules). Saved under the base's model_type (`llama`), plain
`AutoModel*.from_pretrained` would build the base architecture and either fail on a size mismatch or,
worse, load it with newly initialised weights (an MLA model's missing k_proj / v_proj). So such a checkpoint
says what it is: `model_type` `headscope_<kind>_<base>` (e.g. `headscope_mla_llama`), `architectures` its own
class, `auto_map` pointing AutoConfig and the Auto model classes at the loader shipped beside the weights,
and `headscope_base` recording the base's model_type and architectures. Plain transformers then refuses it
with "contains custom code which must be executed ... pass trust_remote_code=True"; every engine that reads
model_type (vLLM, llama.cpp's converter) refuses an unknown type. `read_config` gives headscope's own loaders
the base family's config back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import transformers

from ..errors import HeadscopeError

#: config.json key holding the base family's model_type and architectures.
BASE_KEY = "headscope_base"


def own_model_type(kind: str, base_model_type: str) -> str:
    """`headscope_pruned_llama`, `headscope_mla_qwen2`, ..."""
    return f"headscope_{kind}_{base_model_type}"


def config_class_source(config: Any, kind: str, cls: str) -> str:
    """Source of the config class the shipped loader registers: the base config class under the own model_type."""
    base = type(config).__name__
    return (f"\n\nimport transformers\n\n\nclass {cls}(transformers.{base}):\n"
            f'    """{base} of a checkpoint headscope changed ({kind}): its own model_type, so plain '
            f'transformers refuses it."""\n\n'
            f"    model_type = {own_model_type(kind, config.model_type)!r}\n")


def mark_own_type(folder: Path, config: Any, kind: str, module: str, model_cls: str, config_cls: str,
                  auto_names: list[str]) -> None:
    """Rewrite `folder`/config.json (written by save_pretrained from `config`) to the own model_type."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg[BASE_KEY] = {"model_type": config.model_type, "architectures": list(config.architectures or [])}
    cfg["model_type"] = own_model_type(kind, config.model_type)
    cfg["architectures"] = [model_cls]
    cfg["auto_map"] = {"AutoConfig": f"{module}.{config_cls}",
                       **{name: f"{module}.{model_cls}" for name in auto_names}}
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_config(path: str | Path) -> Any:
    """The transformers config of a saved checkpoint, as its base family's config class (a checkpoint of an own
    model_type is read back as the base it was made from, without running its shipped code)."""
    path = Path(path)
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise HeadscopeError(f"{path / 'config.json'} is damaged (not JSON: {e}); copy the checkpoint again") from None
    base = cfg.get(BASE_KEY) if isinstance(cfg, dict) else None
    if not base:
        return transformers.AutoConfig.from_pretrained(path)
    if not isinstance(base, dict) or base.get("model_type") not in transformers.CONFIG_MAPPING or \
            not isinstance(base.get("architectures") or [], list):
        raise HeadscopeError(f"{path / 'config.json'} is damaged ({BASE_KEY} is {str(base)[:80]}, not the base "
                             f"family's model_type and architectures); copy the checkpoint again")
    cfg = {k: v for k, v in cfg.items() if k not in (BASE_KEY, "auto_map")}
    cfg["model_type"] = base["model_type"]
    cfg["architectures"] = base["architectures"] or None
    return transformers.CONFIG_MAPPING[base["model_type"]].from_dict(cfg)


__all__ = ["BASE_KEY", "config_class_source", "mark_own_type", "own_model_type", "read_config"]
