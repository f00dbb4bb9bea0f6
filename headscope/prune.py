"""Physical pruning of attention heads, and saving/loading the smaller model.

`prune_heads` slices each layer's Q/K/V output rows and the output projection's input columns,
so the returned model really is smaller and faster; the input model is never touched. Heads are
always named by their ORIGINAL index (`config.num_attention_heads` numbering), also after
pruning: the kept heads per layer are recorded in `config.headscope_pruning` (so they travel in
config.json) and in `headscope_pruning.json` beside a saved checkpoint.

GQA: a layer stays loadable by transformers' `repeat_kv` only if every KV head it keeps serves
the same number of query heads. So a set of heads is prunable when, in each layer, every KV group
either loses all its query heads (then its K/V rows go too) or keeps exactly as many as every
other surviving group. That covers both "prune whole KV groups" and "remove the same number of
query heads from every group"; anything else raises an error naming a prunable alternative.

A layer whose heads are all pruned has its attention module replaced by `EmptyAttention`, whose
output is exactly the output projection's bias (or zero). (torch handles zero-width matmuls, but
GPT-2's `split(split_size)` of an empty fused QKV output does not, so no family's attention
forward runs on an empty layer.)

`save_pruned` writes `save_pretrained` output plus `headscope_pruning.json` and, for a pruned
model, a `modeling_headscope_pruned.py` built from this module's own slicing code, so both
`load_pruned(path)` and `AutoModel*.from_pretrained(path, trust_remote_code=True)` load it.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from .errors import HeadscopeError
from .models.adapter import HeadModel
from .models.specs import SPECS, get_path
from .table import head_name

log = logging.getLogger(__name__)

PRUNING_FILE = "headscope_pruning.json"
CONFIG_KEY = "headscope_pruning"  # config attribute: {"layer": [kept original head ids]}
FORMAT_VERSION = 1

# The attention attributes each family's forward reads live in its AttentionSpec
# (`head_count_attrs`, read from transformers 5 source): BERT keeps num_attention_heads and
# all_head_size; GPT-2 splits the fused c_attn output by split_size; LLaMA views by head_dim and
# repeats K/V num_key_value_groups times.


# --- which heads ---------------------------------------------------------------------------------
def kept_heads(hm: HeadModel) -> dict[int, list[int]]:
    """Original head ids still present in each layer (all of them for an unpruned model)."""
    return {layer: hm.kept_heads(layer) for layer in range(hm.n_layers)}


def normalize_heads(hm: HeadModel, heads: Any) -> dict[int, list[int]]:
    """Turn `{layer: [heads]}`, `[(layer, head)]` or `["L3H7", ...]` into `{layer: sorted heads}`, checked."""
    from .table import parse_head

    out: dict[int, set[int]] = {}
    if isinstance(heads, Mapping):
        pairs = [(int(l), int(h)) for l, hs in heads.items() for h in hs]
    else:
        pairs = []
        for item in heads:
            if isinstance(item, str):
                pairs.append(parse_head(item))
            else:
                try:
                    layer, head = item
                except (TypeError, ValueError):
                    raise HeadscopeError(
                        f"cannot read head {item!r}; give (layer, head) pairs, 'L3H7' strings or {{layer: [heads]}}"
                    ) from None
                pairs.append((int(layer), int(head)))
    for layer, head in pairs:
        hm.check_head(layer, head)
        out.setdefault(layer, set()).add(head)
    return {l: sorted(hs) for l, hs in sorted(out.items())}


def _layer_plan(hm: HeadModel, layer: int, keep_q: list[int]) -> list[int]:
    """KV heads a layer keeps for query heads `keep_q` (original ids); error if repeat_kv cannot express it."""
    g = hm.group_size
    if g == 1:
        return list(keep_q)
    per_group: dict[int, int] = {}
    for h in keep_q:
        per_group[h // g] = per_group.get(h // g, 0) + 1
    counts = set(per_group.values())
    if len(counts) > 1:
        # Suggest the nearest prunable set: keep the smallest surviving count in every group.
        least = min(counts)
        raise HeadscopeError(
            f"layer {layer}: the kept query heads {[head_name(layer, h) for h in keep_q]} leave KV groups with "
            f"{dict(sorted(per_group.items()))} query heads each; transformers' repeat_kv needs the same number "
            f"in every KV head that stays (group size {g}). Prune whole KV groups, or the same number of query "
            f"heads from every group (e.g. keep {least} per surviving group)"
        )
    return sorted(per_group)


class EmptyAttention(nn.Module):
    """Stands in for the attention module of a layer whose heads were all pruned.

    Returns `(out_proj bias broadcast, None)` when the family's output projection lives inside
    the attention module (GPT-2, LLaMA), else `(zeros[..., 0], None)` for the block's own output
    projection to map (BERT). Either way the layer's attention output is exactly the bias.
    """

    def __init__(self, out_proj_name: str | None = None, out_proj: nn.Module | None = None) -> None:
        super().__init__()
        self.out_proj_name = out_proj_name
        if out_proj_name is not None:
            self.add_module(out_proj_name, out_proj)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        if self.out_proj_name is None:
            return hidden_states.new_zeros(*hidden_states.shape[:-1], 0), None  # [batch, pos, 0 heads * d_head]
        # GPT-2's Conv1D cannot view an empty input, so add the bias by hand: out_proj(0) = bias.
        out = hidden_states.new_zeros(hidden_states.shape)  # [batch, pos, d_model]
        bias = getattr(getattr(self, self.out_proj_name), "bias", None)
        return (out + bias if bias is not None else out), None


def _slice(module: nn.Module, idx: torch.Tensor, conv1d: bool, side: str) -> nn.Module:
    """A copy of a Linear/Conv1D keeping output features ('out') or input features ('in') at `idx`."""
    new = copy.deepcopy(module)
    w = module.weight.detach()
    # Linear stores [out, in]; GPT-2's Conv1D stores [in, out].
    dim = {("out", False): 0, ("in", False): 1, ("out", True): 1, ("in", True): 0}[(side, conv1d)]
    new.weight = nn.Parameter(w.index_select(dim, idx).clone(), requires_grad=module.weight.requires_grad)
    if side == "out" and getattr(module, "bias", None) is not None:
        new.bias = nn.Parameter(module.bias.detach().index_select(0, idx).clone(),
                                requires_grad=module.bias.requires_grad)
    n = int(idx.numel())
    if conv1d:
        if side == "out":
            new.nf = n
        else:
            new.nx = n
    elif side == "out":
        new.out_features = n
    else:
        new.in_features = n
    return new


def _rows(units: list[int], width: int, offset: int = 0) -> torch.Tensor:
    """Feature indices of whole heads: head u covers [offset + u*width, offset + (u+1)*width)."""
    if not units:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat([torch.arange(offset + u * width, offset + (u + 1) * width) for u in units])


def _kv_heads(keep_q: list[int], group_size: int) -> list[int]:
    """KV heads that serve the query heads `keep_q` (original ids)."""
    return sorted({h // group_size for h in keep_q})


def slice_layer(block: nn.Module, spec: Any, attrs: tuple[tuple[str, str], ...], d_head: int, group_size: int,
                now: list[int], keep: list[int]) -> None:
    """Slice one layer block in place from query heads `now` to `keep` (original ids, already validated).

    Self-contained on purpose (plain arguments, nothing from headscope but `get_path`/`hm_set`):
    `save_pruned` copies its source into the checkpoint as the `trust_remote_code` loader.
    """
    d = d_head
    keep_kv, now_kv = _kv_heads(keep, group_size), _kv_heads(now, group_size)
    pos_q = [now.index(h) for h in keep]  # positions in the current (possibly already pruned) layout
    pos_kv = [now_kv.index(k) for k in keep_kv]
    if spec.qkv_proj:
        # Fused [q; k; v] output: q, k and v blocks each len(now) heads wide (GPT-2 is MHA).
        width = len(now) * d
        idx = torch.cat([_rows(pos_q, d), _rows(pos_kv, d, width), _rows(pos_kv, d, 2 * width)])
        hm_set(block, spec.qkv_proj, _slice(get_path(block, spec.qkv_proj), idx, spec.conv1d, "out"))
    else:
        for path, pos in ((spec.q_proj, pos_q), (spec.k_proj, pos_kv), (spec.v_proj, pos_kv)):
            hm_set(block, path, _slice(get_path(block, path), _rows(pos, d), spec.conv1d, "out"))
    hm_set(block, spec.out_proj, _slice(get_path(block, spec.out_proj), _rows(pos_q, d), spec.conv1d, "in"))
    attention = get_path(block, spec.attention)
    if not keep:
        inner = spec.out_proj[len(spec.attention) + 1:] if spec.out_proj.startswith(spec.attention + ".") else None
        hm_set(block, spec.attention, EmptyAttention(inner, get_path(block, spec.out_proj) if inner else None))
        return
    values = {"heads": len(keep), "width": len(keep) * d, "kv_heads": len(keep_kv),
              "groups": len(keep) // len(keep_kv)}
    for attr, quantity in attrs:
        if hasattr(attention, attr):
            setattr(attention, attr, values[quantity])


def _prune_layer(hm: HeadModel, layer: int, now: list[int], keep: list[int]) -> None:
    """Slice one layer of `hm` (modified in place; callers pass a copy) from heads `now` to `keep`."""
    _layer_plan(hm, layer, keep)  # validate (GQA) before touching anything
    slice_layer(hm.layers[layer], hm.spec, hm.spec.head_count_attrs, hm.d_head, hm.group_size,
                now, keep)


def hm_set(block: nn.Module, path: str, module: nn.Module) -> None:
    """Replace the module at a dotted path inside one layer block."""
    parent, _, last = path.rpartition(".")
    setattr(get_path(block, parent) if parent else block, last, module)


def check_prunable(hm: HeadModel) -> None:
    """Raise a clear error when headscope cannot physically prune this model's family."""
    if not hm.spec.head_count_attrs:
        raise HeadscopeError(
            f"physical pruning is not implemented for the {hm.spec.family!r} family "
            f"(model type {hm.config.model_type!r}); supported families: {', '.join(s.family for s in SPECS if s.head_count_attrs)}. "
            f"Use head gates (headscope.head_gates) to mask heads instead"
        )


def prune_heads(hm: HeadModel, heads: Any) -> HeadModel:
    """A new, physically smaller model without `heads` (`{layer: [head]}` or `[(layer, head)]`, original ids).

    The input model is left untouched. The result equals the input run with gates of 0 on the
    pruned heads. For GQA layers, see the module docstring for which sets are prunable.
    """
    check_prunable(hm)
    drop = normalize_heads(hm, heads)
    current = kept_heads(hm)
    gone = [head_name(l, h) for l, hs in drop.items() for h in hs if h not in current[l]]
    if gone:
        raise HeadscopeError(f"head(s) {', '.join(gone)} were already pruned from this model; "
                             f"it still has {sum(map(len, current.values()))} heads (see headscope.prune.kept_heads)")
    target = {l: [h for h in current[l] if h not in drop.get(l, ())] for l in current}
    for layer, keep in target.items():  # validate every layer before copying anything
        _layer_plan(hm, layer, keep)
    model = copy.deepcopy(hm.model)
    new = HeadModel(model=model, tokenizer=hm.tokenizer, name=hm.name, source=hm.source)
    for layer, keep in target.items():
        if keep != current[layer]:
            _prune_layer(new, layer, current[layer], keep)
    if any(len(k) != hm.n_heads for k in target.values()):
        setattr(model.config, CONFIG_KEY, {str(l): k for l, k in target.items()})
    n_before = sum(map(len, current.values()))
    n_after = sum(map(len, target.values()))
    log.info("pruned %d of %d heads from %s", n_before - n_after, n_before, hm.name)
    return new


def pruned_gates(hm: HeadModel, heads: Any = None) -> torch.Tensor:
    """Gates `[n_layers, n_heads]` that mask `heads` (default: the heads already pruned from `hm`)."""
    gates = torch.ones(hm.n_layers, hm.n_heads)
    if heads is None:
        for layer, keep in kept_heads(hm).items():
            gates[layer] = 0.0
            gates[layer, keep] = 1.0
        return gates
    for layer, hs in normalize_heads(hm, heads).items():
        gates[layer, hs] = 0.0
    return gates


def n_parameters(hm: HeadModel) -> int:
    """Number of parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in hm.model.parameters()}.values())


# --- save / load ---------------------------------------------------------------------------------
def save_pruned(hm: HeadModel, path: str | Path, *, force: bool = False) -> Path:
    """Save a (pruned) model with `save_pretrained`, its tokenizer and `headscope_pruning.json`, atomically.

    Written into a temporary folder beside `path`, then renamed, so `path` is either absent,
    the old complete model (until the rename) or the new complete one. Load it with `load_pruned`.
    """
    import transformers

    path = Path(path)
    if path.exists() and not force:
        raise HeadscopeError(f"{str(path)!r} already exists; pass force=True (--force) or choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the saved model should not be
        hm.model.save_pretrained(tmp)
        if hm.tokenizer is not None:
            hm.tokenizer.save_pretrained(tmp)
        kept = kept_heads(hm)
        record = {
            "format": FORMAT_VERSION,
            "model_type": hm.config.model_type,
            "architecture": type(hm.model).__name__,
            "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head,
            "kept_heads": {str(l): k for l, k in kept.items()},
            "pruned_heads": [head_name(l, h) for l, k in kept.items() for h in range(hm.n_heads) if h not in k],
            "n_heads_kept": sum(map(len, kept.values())),
            "source": hm.source or hm.name,
            "transformers": transformers.__version__,
            "load_with": "headscope.prune.load_pruned(path), or AutoModel*.from_pretrained(path, trust_remote_code=True)",
        }
        (tmp / PRUNING_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if any(len(k) != hm.n_heads for k in kept.values()):
            _write_remote_code(hm, tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("saved pruned model to %s", path)
    return path


REMOTE_MODULE = "modeling_headscope_pruned"


def _remote_code(hm: HeadModel) -> tuple[str, str]:
    """Source of a self-contained loader for `trust_remote_code=True`, and its class name."""
    import inspect

    arch = type(hm.model).__name__
    cls = f"HeadscopePruned{arch}"
    spec = {k: getattr(hm.spec, k) for k in ("layers", "attention", "out_proj", "q_proj", "k_proj", "v_proj",
                                              "qkv_proj", "conv1d")}
    parts = [inspect.getsource(f) for f in (get_path, hm_set, _rows, _slice, _kv_heads, slice_layer)]
    return (
        f'''"""Loader for a checkpoint pruned by headscope (written by headscope.prune.save_pruned).

Builds the original {arch}, then removes the attention heads recorded in config.headscope_pruning
(per-layer head counts differ, which a plain config cannot express), so that
`AutoModel*.from_pretrained(path, trust_remote_code=True)` loads the pruned weights.
"""

import copy
from types import SimpleNamespace
from typing import Any

import torch
import transformers
from torch import nn

SPEC = SimpleNamespace(**{spec!r})
ATTRS = {hm.spec.head_count_attrs!r}
D_HEAD = {hm.d_head}
GROUP_SIZE = {hm.group_size}
N_HEADS = {hm.n_heads}


{inspect.getsource(EmptyAttention)}

''' + "\n\n".join(parts) + f'''

class {cls}(transformers.{arch}):
    """{arch} with the heads in config.headscope_pruning removed."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        layers = get_path(self.base_model, SPEC.layers)
        for layer, keep in sorted((int(k), list(v)) for k, v in config.headscope_pruning.items()):
            if len(keep) != N_HEADS:
                slice_layer(layers[layer], SPEC, ATTRS, D_HEAD, GROUP_SIZE, list(range(N_HEADS)), keep)
''', cls)


def _write_remote_code(hm: HeadModel, folder: Path) -> None:
    """Add the trust_remote_code loader and point config.json's auto_map at it."""
    from .models.loading import _auto_class

    source, cls = _remote_code(hm)
    (folder / f"{REMOTE_MODULE}.py").write_text(source, encoding="utf-8")
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    auto = _auto_class(hm.config).__name__
    cfg["auto_map"] = {auto: f"{REMOTE_MODULE}.{cls}"}
    if auto != "AutoModel":
        cfg["auto_map"]["AutoModel"] = f"{REMOTE_MODULE}.{cls}"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _state_dict_files(path: Path) -> list[Path]:
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    index = path / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    raise HeadscopeError(f"{str(path)!r} holds no model.safetensors (or its index); was it written by save_pruned?")


def load_pruned(path: str | Path, *, device: str | torch.device = "cpu") -> HeadModel:
    """Load a model saved by `save_pruned`: rebuild the original architecture, prune, load the weights."""
    import transformers as tf
    from safetensors.torch import load_file

    from .models.loading import _auto_class

    path = Path(path)
    record_file = path / PRUNING_FILE
    if not (path / "config.json").exists():
        raise HeadscopeError(f"{str(path)!r} is not a saved model (no config.json)")
    config = tf.AutoConfig.from_pretrained(path)
    if record_file.exists():
        record = json.loads(record_file.read_text(encoding="utf-8"))
        kept = {int(l): list(k) for l, k in record["kept_heads"].items()}
    else:
        kept = {int(l): list(k) for l, k in (getattr(config, CONFIG_KEY, None) or {}).items()}
    if hasattr(config, CONFIG_KEY):
        delattr(config, CONFIG_KEY)  # the base model is unpruned; prune_heads records it again
    config._attn_implementation = "eager"
    model = _auto_class(config).from_config(config)
    model.eval()
    tokenizer = None
    if (path / "tokenizer_config.json").exists():
        tokenizer = tf.AutoTokenizer.from_pretrained(path)
    base = HeadModel(model=model, tokenizer=tokenizer, name=str(path), source=str(path))
    drop = {l: [h for h in range(base.n_heads) if h not in k] for l, k in kept.items()}
    hm = prune_heads(base, {l: hs for l, hs in drop.items() if hs}) if any(drop.values()) else base
    del base, model
    state: dict[str, torch.Tensor] = {}
    for f in _state_dict_files(path):
        state.update(load_file(str(f)))
    missing, unexpected = hm.model.load_state_dict(state, strict=False)
    # save_pretrained omits tied weights (lm_head tied to the embeddings); tie them back.
    tied = _tied_names(hm.model)
    really_missing = [k for k in missing if k not in tied]
    if really_missing or unexpected:
        raise HeadscopeError(
            f"{str(path)!r} does not match the pruned architecture: missing {really_missing[:5]}, "
            f"unexpected {list(unexpected)[:5]}; was it saved by headscope.save_pruned?"
        )
    if missing:
        hm.model.tie_weights()
    hm.model.to(device).eval()
    return hm


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
