"""Saving and loading models headscope changed: physically pruned or GQA-converted checkpoints.

`save_model` writes `save_pretrained` output (weights, config) and the tokenizer, atomically. A
physically pruned model gets `headscope_pruning.json` (the kept heads, original ids). When every layer keeps
the same shape and the family's config can state it (`plain_shape`), the config says that shape and the
checkpoint is an ordinary one: plain `AutoModel*.from_pretrained(path)` loads it. Otherwise (per-layer head
counts or FFN widths) it gets its own model_type (`headscope_pruned_<base>`, `models/own_type.py`) and a
`modeling_headscope_pruned.py` loader: `load_checkpoint(path)` and
`AutoModel*.from_pretrained(path, trust_remote_code=True)` load it, plain `from_pretrained` refuses it. The
loader is the source of `headscope.models.layout` copied verbatim (it imports only torch), plus a class that builds the
original architecture and slices the recorded heads out of it before the weights load.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import logging
from pathlib import Path
from typing import Any, cast

import torch
import transformers
from safetensors.torch import load_file
from torch import nn

from ..errors import HeadscopeError
from ..heads import Head
from ..io import atomic_dir, inside
from . import layout
from .adapter import FFN_CONFIG_KEY, PRUNING_CONFIG_KEY, HeadModel
from .config import HEAD_KEYS, KV_KEYS, attn_implementation_for, config_refusal
from .files import check_complete, check_safetensors, check_tokenizer_files
from .own_type import BASE_KEY, config_class_source, mark_own_type, read_config

log = logging.getLogger(__name__)

PRUNING_FILE = "headscope_pruning.json"
# an MLA-converted model (headscope.capacity.mla.checkpoint saves and loads it)
MLA_FILE = "headscope_mla.json"
# Checkpoints in a layout a stage owns (not plain transformers, not a head pruning): marker file ->
# "module:function" of the stage's loader, imported by name when such a checkpoint is loaded, so the
# foundation never imports a stage (tests/test_import_graph.py).
STAGE_LOADERS = {MLA_FILE: "headscope.capacity.mla.checkpoint:load_mla"}
FORMAT_VERSION = 1
REMOTE_MODULE = "modeling_headscope_pruned"
LOAD_WITH = ("headscope.load_model(path) or headscope.models.checkpoint.load_checkpoint(path), "
             "or AutoModel*.from_pretrained(path, trust_remote_code=True)")
PLAIN_LOAD_WITH = "AutoModel*.from_pretrained(path) (a plain config: the same head count in every layer)"

# The spec attributes the copied slicing code reads.
_SPEC_FIELDS = ("layers", "attention", "out_proj", "q_proj", "k_proj", "v_proj", "qkv_proj", "conv1d",
                "qkv_layout", "head_count_attrs", "config_head_attrs", "ffn_in", "ffn_in_parts", "ffn_out",
               "head_params", "q_gate", "sink_logits", "head_row_projs")


def auto_class(config: Any) -> Any:
    """The transformers Auto class that keeps the model's head (LM or classifier)."""
    # -> Any: the Auto classes share only a private base (_BaseAutoModelClass), whose hints are partial.
    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in archs):
        return transformers.AutoModelForCausalLM
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return transformers.AutoModelForSequenceClassification
    if any(a.endswith("ForMaskedLM") for a in archs):  # keeps the masked-LM head patching reads logits from
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModel


def pruning_record(hm: HeadModel) -> dict[str, Any]:
    """What `headscope_pruning.json` holds: the kept heads per layer and the original shape."""
    kept = {layer: hm.kept_heads(layer) for layer in range(hm.n_layers) if hm.has_heads(layer)}
    return {
        "format": FORMAT_VERSION,
        "model_type": hm.config.model_type,
        "architecture": type(hm.model).__name__,
        "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head_record,
        "kept_heads": {str(l): k for l, k in kept.items()},
        "pruned_heads": [Head(l, h).name for l, k in kept.items() for h in range(hm.n_heads) if h not in k],
        "n_heads_kept": sum(map(len, kept.values())),
        **({"layers_without_heads": hm.headless_layers} if hm.headless_layers else {}),
        **({"kept_neurons": {str(l): hm.kept_neurons(l) for l in range(hm.n_layers)}} if hm.ffn_pruned else {}),
        "source": hm.source or hm.name,
        "transformers": transformers.__version__,
        "load_with": LOAD_WITH,
    }


def save_model(hm: HeadModel, path: str | Path, *, force: bool = False) -> Path:
    """Save `hm` (weights, config, tokenizer; plus the pruning record and loader if pruned) atomically.

    A pruned model whose layers all keep the same shape (heads, KV heads, FFN width) and whose family's config
    can state that shape is saved as a plain checkpoint (`plain_shape`); any other pruned model gets its own
    model_type and a `trust_remote_code` loader (`models/own_type.py`), so plain transformers refuses it instead
    of loading it wrong. Written into a temporary folder beside `path`, then renamed, so `path` is either absent,
    the old complete model or the new complete one; an existing `path` is replaced only with `force`.
    """
    path = Path(path)
    sliced = hm.pruned or hm.ffn_pruned
    plain = plain_shape(hm) if sliced else None
    needed = sum(t.numel() * t.element_size() for t in hm.model.state_dict().values())
    with atomic_dir(path, force=force, needed=needed) as tmp:
        # A pruned checkpoint with its own loader keeps the module's own parameter names: its loaders
        # (load_checkpoint, and the trust_remote_code class, which transformers treats as custom code) apply none
        # of transformers' renamings of legacy checkpoint keys (GPT-NeoX's embed_out <-> lm_head).
        cast(transformers.PreTrainedModel, hm.model).save_pretrained(
            tmp, save_original_format=not sliced or plain is not None)
        if hm.tokenizer is not None:
            hm.tokenizer.save_pretrained(tmp)
        if sliced:
            record = pruning_record(hm)
            if plain is not None:
                record.update(plain=True, load_with=PLAIN_LOAD_WITH)
                _write_plain_config(tmp, plain)
            else:
                _write_remote_code(hm, tmp)
            (tmp / PRUNING_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    log.info("saved %s to %s", hm.name, path)
    return path


def plain_shape(hm: HeadModel) -> dict[str, int] | None:
    """The config values that make a pruned `hm` an ordinary checkpoint of its family, or None when there are none.

    That needs the same query-head count (at least one), KV-head count and FFN width in every layer with heads,
    and a config that states them and that transformers accepts (its validators run, as from_pretrained runs
    them: Gemma-3 refuses a hidden size that is not a multiple of the head count even where head_dim is set);
    the candidate model is built (on the meta device, no memory) and must give exactly the pruned model's
    parameter names and shapes (BERT and GPT-2 derive d_head from the hidden size,
    so a BERT with fewer heads per layer has no plain config; LLaMA-like configs carry head_dim).
    """
    layers = [l for l in range(hm.n_layers) if hm.has_heads(l)]
    heads = {hm.heads_in_layer(l) for l in layers}
    kv = {len(hm.kv_heads_in_layer(l)) for l in layers}
    widths = {hm.ffn_size(l) for l in range(hm.n_layers)} if hm.has_ffn else set()
    if len(heads) != 1 or len(kv) != 1 or len(widths) > 1 or 0 in heads:
        return None
    d = hm.config.to_dict()
    head_key = next((k for k in HEAD_KEYS if d.get(k) is not None), None)
    if head_key is None:
        return None
    values = {head_key: heads.pop()}
    kv_key = next((k for k in KV_KEYS if d.get(k) is not None), None)
    if kv_key is not None:
        values[kv_key] = kv.pop()
    if "head_dim" in d and not hm.spec.d_head_attr and not isinstance(hm.d_head_record, list):
        # MLA (DeepSeek): head_dim is the rotary part, unchanged; per-layer head_dim (Gemma-4): kept as configured
        values["head_dim"] = hm.d_head
    if widths and hm.spec.ffn_size_attr:
        values[hm.spec.ffn_size_attr] = widths.pop()
    config = copy.deepcopy(hm.config)
    for key in (PRUNING_CONFIG_KEY, FFN_CONFIG_KEY):
        if hasattr(config, key):
            delattr(config, key)
    for k, v in values.items():
        setattr(config, k, v)
    refusal = config_refusal(config)
    # transformers' validation refuses this shape (e.g. hidden size vs head count)
    if refusal is not None:
        log.info("no plain config for the pruned %s: transformers refuses %s (%s)", hm.name, values, refusal)
        return None
    try:
        with torch.device("meta"):
            candidate = type(hm.model)(config)
    except (ValueError, TypeError, RuntimeError):  # the family's config cannot hold this shape
        return None
    want = {k: tuple(t.shape) for k, t in hm.model.state_dict().items()}
    got = {k: tuple(t.shape) for k, t in candidate.state_dict().items()}
    return values if want == got else None


def is_plain_checkpoint(path: str | Path) -> bool:
    """Whether the checkpoint saved at `path` has a plain config (plain `AutoModel*.from_pretrained(path)` loads
    it), not one of headscope's own model types (`trust_remote_code=True` or headscope's loaders): read from what
    was written, so what a verb prints about loading is what the folder holds."""
    cfg = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    return BASE_KEY not in cfg and "auto_map" not in cfg


def how_it_loads(path: str | Path) -> str:
    """What a verb prints about loading the checkpoint it wrote at `path`, read from what the folder holds."""
    if is_plain_checkpoint(path):
        return "a plain config: AutoModel*.from_pretrained(path) loads it"
    return ("headscope's own model_type: load it with headscope.load_model(path) or "
            "AutoModel*.from_pretrained(path, trust_remote_code=True)")


def _write_plain_config(folder: Path, values: dict[str, int]) -> None:
    """config.json of a uniformly pruned model: its shape as the family's own keys, no headscope records."""
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in (PRUNING_CONFIG_KEY, FFN_CONFIG_KEY):
        cfg.pop(key, None)
    cfg.update(values)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def remote_code(hm: HeadModel) -> tuple[str, str]:
    """Source of a self-contained `trust_remote_code` loader for the pruned `hm`, and its class name."""
    arch = type(hm.model).__name__
    cls = f"HeadscopePruned{arch}"
    spec = {k: getattr(hm.spec, k) for k in _SPEC_FIELDS}
    header = (
        "# Loader for a checkpoint pruned by headscope (written by headscope.models.checkpoint.save_model).\n"
        "# Everything above the class at the end is headscope/models/layout.py, copied verbatim; the class\n"
        f"# builds the original {arch}, then removes the heads recorded in config.headscope_pruning, so that\n"
        "# AutoModel*.from_pretrained(path, trust_remote_code=True) loads the pruned weights.\n"
    )
    tail = f'''

# --- written by headscope.models.checkpoint.remote_code ---
from types import SimpleNamespace
from typing import Any

import transformers

SPEC = SimpleNamespace(**{spec!r})
D_HEADS = {[hm.d_head_at(layer) for layer in range(hm.n_layers)]!r}
GROUP_SIZE = {hm.group_size}
N_HEADS = {hm.n_heads}


class {cls}(transformers.{arch}):
    """{arch} with the heads in config.headscope_pruning removed."""

    config_class = {cls}Config

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        layers = get_path(self.base_model, SPEC.layers)
        pruning = getattr(config, "headscope_pruning", None) or {{}}
        for layer, keep in sorted((int(k), list(v)) for k, v in pruning.items()):
            if len(keep) != N_HEADS:
                slice_block(layers[layer], SPEC, D_HEADS[layer], GROUP_SIZE, list(range(N_HEADS)), keep)
        # FFN neurons kept per layer (original ids = positions in the freshly built, unpruned layer).
        ffn = getattr(config, "headscope_ffn", None) or {{}}
        for layer, keep in sorted((int(k), list(v)) for k, v in ffn.items()):
            if len(keep) != linear_weight(get_path(layers[layer], SPEC.ffn_out), SPEC.conv1d).shape[1]:
                slice_ffn(layers[layer], SPEC, keep)
'''
    config_src = config_class_source(hm.config, "pruned", f"{cls}Config")
    return header + inspect.getsource(layout) + config_src + tail, cls


def _write_remote_code(hm: HeadModel, folder: Path) -> None:
    """Add the trust_remote_code loader and give config.json the own model_type pointing at it."""
    source, cls = remote_code(hm)
    (folder / f"{REMOTE_MODULE}.py").write_text(source, encoding="utf-8")
    auto = auto_class(hm.config).__name__
    mark_own_type(folder, hm.config, "pruned", REMOTE_MODULE, cls, f"{cls}Config", sorted({auto, "AutoModel"}))


def _kept_heads(path: Path, config: Any) -> dict[int, list[int]]:
    """Kept heads per layer from headscope_pruning.json, else from the config's record ({} if none)."""
    record_file = path / PRUNING_FILE
    if record_file.exists():
        try:
            record = json.loads(record_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise _damaged_record(record_file, f"not JSON: {e}") from None
        if not isinstance(record, dict):
            raise _damaged_record(record_file, "not a JSON object")
        if record.get("plain"):  # a plain config states the pruned shape itself
            return {}
        if "kept_heads" not in record:
            raise _damaged_record(record_file, "it has no kept_heads")
        recorded, source = record["kept_heads"], record_file
    else:
        recorded, source = getattr(config, PRUNING_CONFIG_KEY, None) or {}, path / "config.json"
    try:
        kept = {int(l): [int(h) for h in k] for l, k in recorded.items()}
    except (AttributeError, TypeError, ValueError):
        raise _damaged_record(source, f"kept_heads is {str(recorded)[:80]}, not {{layer: [head, ...]}}") from None
    n_layers = getattr(config, "num_hidden_layers", None)
    bad = [l for l, heads in kept.items() if l < 0 or (isinstance(n_layers, int) and l >= n_layers)
           or any(h < 0 for h in heads) or len(set(heads)) != len(heads)]
    if bad:
        raise _damaged_record(source, f"kept_heads of layer {bad[0]} ({kept[bad[0]]}) are not heads of this model")
    return kept


def _damaged_record(path: Path, problem: str) -> HeadscopeError:
    return HeadscopeError(f"{path} is damaged ({problem}): it records which heads this pruned checkpoint keeps; copy "
                          f"the checkpoint again from where it was saved (prune with save_model writes it)",
                          fields=("save_model",))


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    allow_random_weights: bool = False) -> HeadModel:
    """Load a model saved by `save_model`; a pruned one is rebuilt unpruned, sliced, then given its weights (a
    checkpoint whose weights do not fill its config is refused unless `allow_random_weights`)."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise HeadscopeError(f"{str(path)!r} is not a saved model (no config.json); give a folder written by "
                             f"save_model (prune and gqa write it to OUT/model)")
    for marker, loader in STAGE_LOADERS.items():  # a layout a stage owns: that stage's loader builds it
        if (path / marker).exists():
            module, fn = loader.split(":")
            return getattr(importlib.import_module(module), fn)(path, device=device, dtype=dtype)
    check_tokenizer_files(path)
    config = read_config(path)
    kept = _kept_heads(path, config)
    neurons = {int(l): [int(i) for i in k] for l, k in (getattr(config, FFN_CONFIG_KEY, None) or {}).items()}
    tokenizer = None
    if (path / "tokenizer_config.json").exists():
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, config=config)  # not AutoConfig: own types
    if not kept and not neurons:
        model, info = auto_class(config).from_pretrained(
            path, dtype=dtype, attn_implementation=attn_implementation_for(auto_class(config), config),
            output_loading_info=True)
        if not allow_random_weights:
            check_complete(str(path), info["missing_keys"], info["unexpected_keys"], model)
        model.to(device).eval()
        return HeadModel(model=model, tokenizer=tokenizer, name=str(path), source=str(path))
    for key in (PRUNING_CONFIG_KEY, FFN_CONFIG_KEY):
        if hasattr(config, key):
            # the model is built unpruned; slice_heads / slice_ffn record it again
            delattr(config, key)
    config._attn_implementation = attn_implementation_for(auto_class(config), config)
    hm = HeadModel(model=auto_class(config).from_config(config).eval(), tokenizer=tokenizer, name=str(path),
                   source=str(path))
    for layer, keep in sorted(kept.items()):
        hm.slice_heads(layer, keep)
    for layer, keep in sorted(neurons.items()):
        hm.slice_ffn(layer, keep)
    load_weights(hm.model, path)
    hm.model.to(device=device, dtype=dtype).eval()
    return hm


def _state_dict_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise HeadscopeError(f"{index} is damaged ({type(e).__name__}: {e}); save the model again") from None
        return [inside(path, n, index, "save the model again") for n in names]
    raise HeadscopeError(f"{str(path)!r} holds no model.safetensors (or its index); was it written by save_model?")


def load_weights(model: nn.Module, path: Path) -> None:
    """Load the checkpoint's safetensors into `model` (already shaped like them), tying shared weights back."""
    state: dict[str, torch.Tensor] = {}
    for f in _state_dict_files(path):
        check_safetensors(f)  # a truncated file: named, before safetensors' own error
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # save_pretrained omits tied weights (lm_head tied to the embeddings); tie them back.
    really_missing = [k for k in missing if k not in _tied_names(model)]
    if really_missing or unexpected:
        raise HeadscopeError(
            f"{str(path)!r} does not match the pruned architecture: missing {really_missing[:5]}, "
            f"unexpected {list(unexpected)[:5]}; was it saved by headscope.models.checkpoint.save_model?"
        )
    if missing:
        cast(transformers.PreTrainedModel, model).tie_weights()


def _tied_names(model: nn.Module) -> set[str]:
    """Parameter names that share storage with an earlier parameter (tied weights)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        else:
            seen[id(p)] = name
    return tied
