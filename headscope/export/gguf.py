"""GGUF export for llama.cpp: a LLaMA-family checkpoint (SmolLM2, and anything headscope pruned or converted from
one) as one .gguf file that llama.cpp, llama-cpp-python and Ollama run.

Which llama.cpp architecture: `llama` when every layer has the same query heads, KV heads and FFN width (the
original model, a GQA conversion, a uniform pruning, dropped blocks: llama.cpp's `llama` graph sizes every layer
by layer 0's counts); `deci` (the Nemotron-NAS layout, in llama.cpp since 2024) when they differ: it reads
`deci.attention.head_count`, `head_count_kv` and `feed_forward_length` as per-layer arrays and runs a layer with
no heads as attention-free (what `EmptyAttention` computes for a bias-free family: nothing). Both are written
with `key_length` / `value_length` (d_head, which no longer equals d_model / heads after pruning).

What llama.cpp needs that differs from transformers' layout: Q and K rows are permuted per head from
rotate_half's [first halves; second halves] into interleaved pairs (llama.cpp's `llama`/`deci` RoPE rotates
adjacent pairs), with each layer's own head count. The tokenizer must be a GPT-2 byte-level BPE (tokenizer.json);
its pre-tokenizer is written as llama.cpp's `gpt-2` (ByteLevel with the GPT-2 regex) or `smollm` (digits split
one by one first), the two llama.cpp splits identically to transformers; any other is refused, since llama.cpp
would tokenize text differently from the checkpoint's own tokenizer.

The file is written to a temporary name beside `out` and renamed when complete: a failure or an interrupt
leaves no half-written GGUF.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..errors import HeadscopeError, OptionError
from ..io import disk_full_error, is_disk_full, remove_stale_temps, temp_prefix
from ..models.adapter import HeadModel
from ..models.capabilities import supported_model_types_for, why_not
from ..models.checkpoint import MLA_FILE, load_checkpoint
from ..models.specs import spec_for
from .options import DTYPES, TARGETS, check_target

log = logging.getLogger(__name__)

#: base model types GGUF export covers, as their specs say (`AttentionSpec.gguf_arch`; their transformers layout is
#: LLaMA's: no biases, SiLU gated FFN, RMSNorm).
MODEL_TYPES = supported_model_types_for("gguf")
#: the llama.cpp graphs this writer writes (a spec's gguf_arch must be one); `deci` when layer sizes differ.
WRITES = ("llama",)
_ROPE_OK = (None, "default")


@dataclass(frozen=True)
class Shape:
    """Per-layer sizes of the model as it is: query heads, KV heads and FFN width of every layer."""

    n_heads: list[int]
    n_kv_heads: list[int]
    n_ff: list[int]

    @property
    def uniform(self) -> bool:
        return len(set(self.n_heads)) == 1 and len(set(self.n_kv_heads)) == 1 and len(set(self.n_ff)) == 1 \
            and self.n_heads[0] > 0

    @property
    def arch(self) -> str:
        return "llama" if self.uniform else "deci"


def check_out(out: Path, force: bool) -> None:
    """Refuse a target `file` that is a folder, holds a file (without force), or lies in a missing folder."""
    if out.is_dir():
        raise OptionError("file", f"{str(out)!r} is a directory; give the path of the .gguf file to write")
    if out.exists() and not force:
        raise OptionError("file", f"{str(out)!r} already holds a file; pass force=True to replace it, or choose "
                                  f"another path", also=("force",))
    if not out.parent.is_dir():
        raise OptionError("file", f"{str(out)!r} lies in {str(out.parent)!r}, which does not exist; create it first")


def check_source(path: Path) -> None:
    """Refuse a folder that is no checkpoint, or one GGUF export does not cover, before loading weights."""
    cfg = path / "config.json"
    if not path.is_dir() or not cfg.is_file():
        raise HeadscopeError(f"{str(path)!r} is not a checkpoint folder (no config.json); give a folder written by "
                             f"save_pretrained or by headscope (prune with save_model, gqa, mla: OUT/model)",
                             fields=("save_model",))
    if (path / MLA_FILE).exists():
        raise HeadscopeError(f"{str(path)!r} is an MLA conversion (headscope mla): llama.cpp has no graph for its "
                             f"latent attention with per-KV-head RoPE dimensions, so it cannot be exported to GGUF; "
                             f"export the model before conversion, or a gqa / prune checkpoint")
    d = json.loads(cfg.read_text(encoding="utf-8"))
    base = (d.get("headscope_base") or {}).get("model_type", d.get("model_type"))
    refusal = gguf_refusal(str(base))
    if refusal:
        families = ", ".join(dict.fromkeys(spec_for(t).family for t in MODEL_TYPES))
        raise HeadscopeError(f"GGUF export covers the {families} family (model type {', '.join(MODEL_TYPES)}: SmolLM2 "
                             f"and what headscope pruned or converted from it); {str(path)!r} has model type "
                             f"{base!r}: {refusal}")
    if (d.get("rope_scaling") or {}).get("rope_type") not in _ROPE_OK or d.get("attention_bias") \
            or d.get("mlp_bias") or d.get("hidden_act", "silu") != "silu":
        raise HeadscopeError(f"{str(path)!r} uses RoPE scaling, biases or an activation other than SiLU, which "
                             f"this exporter does not write; it covers plain LLaMA layers (as SmolLM2's)")
    if not (path / "tokenizer.json").is_file():
        raise HeadscopeError(f"{str(path)!r} has no tokenizer.json; llama.cpp needs the tokenizer inside the GGUF "
                             f"file, so save the model with its (byte-level BPE) tokenizer")


def gguf_refusal(model_type: str) -> str | None:
    """Why a checkpoint of base `model_type` cannot be exported (its family and the spec's reason), or None."""
    # The caller's message names the model type; this names the family and the reason.
    try:
        spec = spec_for(model_type)
    except HeadscopeError:
        return "no family spec covers it"
    why = why_not(spec, "gguf", model_type)
    if why:
        return f"the {spec.family} family: {why}"
    if spec.gguf_arch not in WRITES:
        return (f"the {spec.family} family maps to llama.cpp's {spec.gguf_arch!r} graph, which this writer does not "
                f"write (it writes {', '.join(WRITES)})")
    return None


def model_shape(hm: HeadModel) -> Shape:
    """The per-layer sizes of `hm` as it is now (after pruning)."""
    return Shape(n_heads=[hm.heads_in_layer(l) for l in range(hm.n_layers)],
                 n_kv_heads=[len(hm.kv_heads_in_layer(l)) if hm.heads_in_layer(l) else 0
                             for l in range(hm.n_layers)],
                 n_ff=[hm.ffn_size(l) for l in range(hm.n_layers)])


def rope_permute(w: np.ndarray, d_head: int) -> np.ndarray:
    """Q or K rows of each head from rotate_half's [x_0..x_{d/2-1}; x_{d/2}..] into llama.cpp's interleaved pairs."""
    n = w.shape[0] // d_head
    return w.reshape(n, 2, d_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class GgufPlan:
    """A checkpoint read and checked for GGUF export: its model, per-layer sizes, tokenizer and file type."""

    src: Path
    hm: HeadModel
    shape: Shape
    tokenizer: dict[str, Any]
    dtype: str
    fallback: list[str]  # tensors q8_0 writes as f16 (rows not a multiple of 32)

    def info(self, out: Path) -> dict[str, Any]:
        """What `write_gguf` wrote to `out`."""
        return {"path": str(out), "arch": self.shape.arch, "dtype": self.dtype, "bytes": out.stat().st_size,
                "n_layers": self.hm.n_layers, "n_heads": self.shape.n_heads, "n_kv_heads": self.shape.n_kv_heads,
                "n_ff": self.shape.n_ff, "pre_tokenizer": self.tokenizer["pre"], "f16_fallback": self.fallback}


def plan_gguf(src: str | Path, dtype: str = "f16") -> GgufPlan:
    """Read and check the checkpoint folder `src` for export (nothing is written)."""
    src = Path(src)
    check_target("gguf", dtype)
    check_source(src)
    hm = load_checkpoint(src)
    shape = model_shape(hm)
    # refuses an unsupported tokenizer before anything is written
    tok = tokenizer_fields(src)
    return GgufPlan(src=src, hm=hm, shape=shape, tokenizer=tok, dtype=dtype,
                    fallback=_write_tensors(None, hm, shape, dtype))


def write_gguf(plan: GgufPlan, out: str | Path, force: bool = False) -> dict[str, Any]:
    """Write a planned export as the GGUF file `out` (temporary name, then renamed); returns what was written."""
    import gguf  # the `gguf` package: only export needs it

    out = Path(out)
    check_out(out, force)
    # what a killed export of the same file left (its process is gone)
    remove_stale_temps(out)
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(out), suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, plan.shape.arch)
        _write_header(writer, plan.hm, plan.shape, plan.dtype, plan.src)
        _write_tokenizer(writer, plan.src, plan.tokenizer, plan.hm)
        _write_tensors(writer, plan.hm, plan.shape, plan.dtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException as e:  # an error or an interrupt: no half-written file stays
        tmp.unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full_error(out) from None
        raise
    return plan.info(out)


def export_gguf(src: str | Path, out: str | Path, *, dtype: str = "f16", force: bool = False) -> dict[str, Any]:
    """Write the checkpoint folder `src` as a GGUF file `out` (module docstring); returns what was written."""
    check_target("gguf", dtype)
    check_out(Path(out), force)
    return write_gguf(plan_gguf(src, dtype), out, force)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_header(writer: Any, hm: HeadModel, shape: Shape, dtype: str, src: Path) -> None:
    # deferred: the writer is needed only when exporting (commands/export.py checks it is there)
    import gguf

    c = hm.config
    uniform = shape.uniform
    writer.add_name(Path(hm.source or src).name)
    writer.add_description(f"exported by headscope from {src}")
    writer.add_block_count(hm.n_layers)
    writer.add_context_length(int(c.max_position_embeddings))
    writer.add_embedding_length(hm.d_model)
    writer.add_feed_forward_length(shape.n_ff[0] if uniform else shape.n_ff)
    writer.add_head_count(shape.n_heads[0] if uniform else shape.n_heads)
    writer.add_head_count_kv(shape.n_kv_heads[0] if uniform else shape.n_kv_heads)
    writer.add_key_length(hm.d_head)
    writer.add_value_length(hm.d_head)
    writer.add_rope_dimension_count(hm.d_head)
    rope = getattr(c, "rope_parameters", None) or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(c.rms_norm_eps))
    writer.add_vocab_size(hm.vocab_size)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def tokenizer_fields(src: Path) -> dict[str, Any]:
    """Tokens, token types and merges of `src`'s tokenizer.json, and llama.cpp's name of its pre-tokenizer."""
    t = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    model = t.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or (t.get("decoder") or {}).get("type") != "ByteLevel":
        raise HeadscopeError(f"{str(src)!r}: GGUF export writes GPT-2 byte-level BPE tokenizers; this tokenizer.json "
                             f"has a {model.get('type')!r} model with a {(t.get('decoder') or {}).get('type')!r} "
                             f"decoder")
    pre = _pre_name(t.get("pre_tokenizer"))
    if pre is None:
        raise HeadscopeError(f"{str(src)!r}: its pre-tokenizer {json.dumps(t.get('pre_tokenizer'))[:200]} is not one "
                             f"llama.cpp reproduces here (GPT-2's ByteLevel regex, optionally after splitting digits "
                             f"one by one); llama.cpp would split text differently from the checkpoint's tokenizer")
    added = {a["id"]: a for a in t.get("added_tokens", [])}
    n = max([*model["vocab"].values(), *added]) + 1
    tokens = [""] * n
    for text, i in model["vocab"].items():
        tokens[i] = text
    # gguf.TokenType: 1 normal, 3 control (special added tokens), 4 user-defined
    types = [1] * n
    for i, a in added.items():
        tokens[i] = a["content"]
        types[i] = 3 if a.get("special") else 4
    missing = [i for i, s in enumerate(tokens) if not s]
    if missing:
        raise HeadscopeError(f"{str(src)!r}: tokenizer.json names no token for id(s) {missing[:5]}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return {"tokens": tokens, "types": types, "merges": merges, "pre": pre}


def _pre_name(pre: Any) -> str | None:
    """llama.cpp's pre-tokenizer type for a tokenizers pre_tokenizer, or None when none reproduces it."""
    def byte_level(p: Any) -> bool:
        return isinstance(p, dict) and p.get("type") == "ByteLevel" and p.get("use_regex", True) \
            and not p.get("add_prefix_space", False)
    if byte_level(pre):
        return "gpt-2"
    if isinstance(pre, dict) and pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers") or []
        if len(parts) == 2 and parts[0].get("type") == "Digits" and parts[0].get("individual_digits") \
                and byte_level(parts[1]):
            return "smollm"
    return None


def _write_tokenizer(writer: Any, src: Path, tok: dict[str, Any], hm: HeadModel) -> None:
    # deferred: the writer is needed only when exporting (commands/export.py checks it is there)
    import gguf

    if len(tok["tokens"]) > hm.vocab_size:
        raise HeadscopeError(f"{str(src)!r}: the tokenizer has {len(tok['tokens'])} tokens, more than the model's "
                             f"{hm.vocab_size} embeddings")
    pad = hm.vocab_size - len(tok["tokens"])  # embedding rows beyond the tokenizer: unused placeholders
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(tok["tokens"] + [f"[PAD{i}]" for i in range(pad)])
    writer.add_token_types(tok["types"] + [5] * pad)  # 5: unused
    special = gguf.SpecialVocab(src, load_merges=False, n_vocab=hm.vocab_size)
    special.merges = tok["merges"]
    # whether the tokenizer adds BOS / EOS to a text, as llama.cpp should
    if hm.tokenizer is not None:
        with_special = hm.tokenizer("a")["input_ids"]
        plain = hm.tokenizer("a", add_special_tokens=False)["input_ids"]
        extra = len(with_special) - len(plain)
        special.add_special_token["bos"] = extra > 0 and with_special[0] == hm.tokenizer.bos_token_id
        special.add_special_token["eos"] = extra > 0 and with_special[-1] == hm.tokenizer.eos_token_id
    special.add_to_gguf(writer, quiet=True)


def _tensor(writer: Any, name: str, t: torch.Tensor, dtype: str, fallback: list[str]) -> None:
    """Add one tensor: 1-D ones (norms) stay float32, as llama.cpp's converter keeps them."""
    # deferred: the writer is needed only when exporting (commands/export.py checks it is there)
    import gguf

    if dtype == "q8_0" and t.ndim > 1 and t.shape[-1] % 32:
        # rows not a multiple of Q8_0's 32-value blocks: f16, as llama.cpp's converter does
        fallback.append(name)
    if writer is None:  # planning: which tensors fall back, nothing written
        return
    a = t.detach().to(torch.float32).cpu().numpy()
    if a.ndim == 1 or dtype == "f32":
        writer.add_tensor(name, a)
        return
    if dtype == "q8_0" and a.shape[-1] % 32 == 0:
        q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        return
    writer.add_tensor(name, a.astype(np.float16))


def _write_tensors(writer: Any, hm: HeadModel, shape: Shape, dtype: str) -> list[str]:
    """Every weight under llama.cpp's tensor names; returns the tensors written f16 instead of q8_0 (with no
    writer: only that list)."""
    fallback: list[str] = []
    base = hm.base_model
    state = {k: v for k, v in base.state_dict().items()}
    _tensor(writer, "token_embd.weight", state["embed_tokens.weight"], dtype, fallback)
    d = hm.d_head
    for l in range(hm.n_layers):
        p, b = f"layers.{l}.", f"blk.{l}."
        if shape.n_heads[l]:
            _tensor(writer, b + "attn_norm.weight", state[p + "input_layernorm.weight"], dtype, fallback)
            for name, key in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
                w = state[p + f"self_attn.{key}.weight"]
                permuted = w if writer is None else torch.from_numpy(rope_permute(w.float().numpy(), d))
                _tensor(writer, b + f"{name}.weight", permuted, dtype, fallback)
            _tensor(writer, b + "attn_v.weight", state[p + "self_attn.v_proj.weight"], dtype, fallback)
            _tensor(writer, b + "attn_output.weight", state[p + "self_attn.o_proj.weight"], dtype, fallback)
        _tensor(writer, b + "ffn_norm.weight", state[p + "post_attention_layernorm.weight"], dtype, fallback)
        for name, key in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
            _tensor(writer, b + f"{name}.weight", state[p + f"mlp.{key}.weight"], dtype, fallback)
    _tensor(writer, "output_norm.weight", state["norm.weight"], dtype, fallback)
    head = hm.output_embeddings
    weight = None if head is None else cast(torch.Tensor, head.weight)
    if weight is not None and weight is not hm._transformers_api.get_input_embeddings().weight:  # untied LM head
        _tensor(writer, "output.weight", weight, dtype, fallback)
    return fallback


__all__ = ["DTYPES", "MODEL_TYPES", "TARGETS", "WRITES", "GgufPlan", "Shape", "check_out", "check_source",
           "check_target", "export_gguf", "gguf_refusal", "model_shape", "plan_gguf", "rope_permute",
           "tokenizer_fields", "write_gguf"]
