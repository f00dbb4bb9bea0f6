"""Declarative adapters: where each model family keeps its attention pieces.

One small `AttentionSpec` per family; every family-specific attribute name lives here and
nowhere else. Paths are dotted attribute paths relative to `model.base_model` (the layer list)
or to one layer block (the rest).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import HeadscopeError, did_you_mean
from .layout import get_path, set_path

__all__ = ["SPECS", "AttentionSpec", "families_table", "get_path", "register_spec", "set_path", "spec_for",
           "supported_model_types", "unregister_spec"]

# Where users read how to add a family (named in the error for unsupported model types).
ADDING_A_FAMILY = 'docs/families.md, "Adding a family"'


@dataclass(frozen=True)
class AttentionSpec:
    """Where a family keeps its attention pieces, and how they are laid out."""

    family: str
    model_types: tuple[str, ...]
    layers: str  # ModuleList of blocks, relative to model.base_model
    # module whose forward returns (output, attention_weights) under eager
    attention: str
    # output projection; its input is the concatenation of head outputs
    out_proj: str
    q_proj: str | None = None  # separate projections (BERT, LLaMA)
    k_proj: str | None = None
    v_proj: str | None = None
    qkv_proj: str | None = None  # fused projection (GPT-2, Phi-3, GPT-NeoX)
    # How a fused projection orders its rows: "stacked" = all q, then all k, then all v (GPT-2, Phi-3);
    # "per_head" = each head's q, k, v together, head after head (GPT-NeoX).
    qkv_layout: str = "stacked"
    conv1d: bool = False  # GPT-2's Conv1D stores weights as [in, out]
    causal: bool = False
    # Attributes of the attention module that its forward reads and physical pruning must update,
    # with the quantity each holds: "heads" (query heads kept), "width" (heads * d_head) or
    # "groups" (query heads per kept KV head). Attributes a module lacks are skipped.
    head_count_attrs: tuple[tuple[str, str], ...] = ()
    # Config attributes the attention forward reads for its own sizes (Phi-3 splits its fused output at
    # config.num_attention_heads * head_dim), same quantities: a pruned layer gets its own view of them.
    config_head_attrs: tuple[tuple[str, str], ...] = ()
    # Whether the family's config stores the number of KV heads (`num_key_value_heads`), so a
    # checkpoint with fewer KV heads than query heads (GQA/MQA) loads in plain transformers.
    kv_heads_in_config: bool = False
    # Multi-head latent attention (DeepSeek): no per-head Linear K/V, but projections whose output rows are equal
    # blocks per query head (the query projection, q_proj or the low-rank q_b_proj, and kv_b_proj, which expands
    # the latent into each head's key part and value); slicing a head removes its block from each (whichever
    # exist) and its columns of out_proj. `d_head_attr` names the config attribute holding the width of one
    # head's output, the out_proj input slice (v_head_dim), where it is not head_dim.
    head_row_projs: tuple[str, ...] = ()
    d_head_attr: str | None = None
    # Whether q_proj holds, per head, the query (d_head rows) then an output gate (d_head rows) that scales the
    # head's output by sigmoid(gate) before the output projection (Qwen3.5's gated attention).
    q_gate: bool = False
    # config.layer_types values whose layers have no softmax heads (Qwen3.5's linear-attention layers): they hold
    # no attention module of this spec, count no heads, and every verb skips them.
    headless_layer_types: tuple[str, ...] = ()
    # Added to config.sliding_window to give the window headscope uses: a query sees key k when q - k < window
    # (causal layers) or |q - k| < window (bidirectional ones). ModernBERT's mask allows |q - k| <= sliding_window,
    # hence 1 there (its attention module holds sliding_window + 1 for flash attention likewise).
    window_offset: int = 0
    # Whether the position table reserves `pad_token_id + 1` leading slots (RoBERTa counts positions
    # from padding_idx + 1), so usable positions are max_position_embeddings minus that.
    position_offset_from_pad: bool = False
    # Feed-forward (MLP) sub-layer, relative to one layer block: the input-side projections whose output
    # rows are the hidden neurons (up / gate, fc1, BERT's intermediate.dense), each holding `ffn_in_parts`
    # stacked blocks of n_neurons rows (Phi-3's fused gate_up_proj: 2), and the output projection whose
    # input columns are the neurons (down_proj, fc2, BERT's output.dense). Empty: neurons cannot be pruned.
    ffn_in: tuple[str, ...] = ()
    ffn_in_parts: int = 1
    ffn_out: str | None = None
    # Config attribute holding the FFN width (intermediate_size, n_inner, ffn_dim); per-layer widths after
    # pruning are recorded beside it in config.headscope_ffn.
    ffn_size_attr: str | None = None
    # Parameters laid out per head beside the projections, which move (permute_heads) and go (slicing) with their
    # heads: (path relative to one layer block, what each head owns there: "q" = d_head features per query head,
    # "kv" = d_head features per KV head, "q1" = one value per query head). OLMo-2's q_norm / k_norm weights span
    # every head's features; GPT-OSS's sinks hold one logit per query head.
    head_params: tuple[tuple[str, str], ...] = ()
    # Whether the attention output passes a norm before it joins the residual stream (sandwich norms: Gemma-2/3/4,
    # OLMo-2/3), so a head's write there is not W_O z (direct logit attribution is left out).
    attn_out_normed: bool = False
    # Attribute of the attention module holding one learned logit per query head that joins every row's softmax
    # without a value (GPT-OSS's sinks; transformers passes it to attention functions as s_aux).
    sink_logits: str | None = None
    # What the family's layout cannot serve, each with its reason (one clause, shown in errors and the table):
    # "prune" (physical head pruning), "convert" (changing the number of KV heads: gqa, expand), "ffn" (FFN
    # neurons as units of score / prune), "similar" (head-to-head similarity), "qkv" (per-head Linear Q/K/V
    # weights), "block" (dropping layers). A verb asked for one of these refuses with the reason, exit 2.
    refuses: tuple[tuple[str, str], ...] = ()
    # Refusals that hold for one model type of the family only: (model_type, what, reason), same keys as `refuses`.
    refuses_types: tuple[tuple[str, str, str], ...] = ()
    # The llama.cpp graph the GGUF writer maps the family's layers to ("llama": every layer of one shape; the writer
    # switches to llama.cpp's `deci` when pruning made layers differ). None: GGUF export refuses the family.
    gguf_arch: str | None = None
    # For the supported-families table: well-known models of the family, and what is special about it.
    examples: str = ""
    notes: str = ""

    def describe(self) -> str:
        """One line for listings: family and the model types it covers."""
        return f"{self.family}: {', '.join(self.model_types)}"

    def refusal(self, what: str, model_type: str | None = None) -> str | None:
        """Why the family (or its `model_type`) cannot serve `what` (a key of REFUSABLE), or None when the spec
        declares no refusal. What the layout itself rules out is derived in `capabilities.why_not`."""
        if what not in REFUSABLE:
            raise ValueError(f"unknown capability {what!r}; choose one of {', '.join(REFUSABLE)}")
        for t, w, why in self.refuses_types:
            if t == model_type and w == what:
                return why
        return dict(self.refuses).get(what)


# What a spec may refuse (AttentionSpec.refuses), and what that means.
REFUSABLE = {"prune": "physical head pruning", "convert": "changing the number of KV heads (gqa, expand)",
             "ffn": "FFN neurons as units", "similar": "head-to-head similarity across all layers",
             "qkv": "per-head Linear Q/K/V weights (qkv_weights, set_qkv_weights, permute_heads)",
             "block": "dropping whole layers (unit block)", "mla": "MLA conversion",
             "kvcache": "the head-aware KV cache", "gguf": "GGUF export for llama.cpp",
             "patch": "activation and attribution patching of heads"}

# Declared refusals shared by several families (what their layout facts alone do not show).
QK_NORM_MLA = ("q_norm / k_norm normalise each head's queries and keys, which MLA's attention (keys rebuilt from a "
               "latent) does not apply")
SLIDING_KVCACHE = ("its sliding-window layers (layer_types) are windowed already; the head-aware cache needs "
                   "full-attention layers")
UNVERIFIED_MLA = "MLA conversion is not verified on its attention (it is tested on llama, mistral and qwen2)"
UNVERIFIED_KVCACHE = ("the head-aware cache is not verified on its attention (it is tested on llama, mistral, qwen2, "
                      "qwen3, starcoder2 and phi3)")


BERT = AttentionSpec(
    family="bert",
    model_types=("bert", "electra"),
    layers="encoder.layer",
    attention="attention.self",
    out_proj="attention.output.dense",
    q_proj="attention.self.query",
    k_proj="attention.self.key",
    v_proj="attention.self.value",
    head_count_attrs=(("num_attention_heads", "heads"), ("all_head_size", "width")),
    ffn_in=("intermediate.dense",), ffn_out="output.dense", ffn_size_attr="intermediate_size",
    examples="BERT, all-MiniLM-L6-v2 (built-in `minilm`), ELECTRA",
    notes="encoder; output projection outside the self-attention module",
)

# The BERT layout with RoBERTa's position numbering.
ROBERTA = replace(BERT, family="roberta", model_types=("roberta", "xlm-roberta", "camembert"),
                  position_offset_from_pad=True, examples="RoBERTa, XLM-R, CamemBERT",
                  notes="BERT layout; positions counted from pad_token_id + 1")

GPT2 = AttentionSpec(
    family="gpt2",
    model_types=("gpt2",),
    layers="h",
    attention="attn",
    out_proj="attn.c_proj",
    qkv_proj="attn.c_attn",
    conv1d=True,
    causal=True,
    head_count_attrs=(("num_heads", "heads"), ("split_size", "width")),
    ffn_in=("mlp.c_fc",), ffn_out="mlp.c_proj", ffn_size_attr="n_inner",
    examples="GPT-2, DistilGPT-2",
    notes="Conv1D stores weights [in, out]; learned positions",
)

LLAMA = AttentionSpec(
    family="llama",
    model_types=("llama", "mistral", "qwen2"),
    layers="layers",
    attention="self_attn",
    out_proj="self_attn.o_proj",
    q_proj="self_attn.q_proj",
    k_proj="self_attn.k_proj",
    v_proj="self_attn.v_proj",
    causal=True,
    head_count_attrs=(("num_key_value_groups", "groups"), ("num_heads", "heads"), ("num_key_value_heads", "kv_heads")),
    kv_heads_in_config=True,
    ffn_in=("mlp.gate_proj", "mlp.up_proj"), ffn_out="mlp.down_proj", ffn_size_attr="intermediate_size",
    gguf_arch="llama",
    refuses_types=(("mistral", "gguf", "Mistral's sliding window (sliding_window) is not written: the GGUF writer "
                                       "writes plain LLaMA layers"),
                   ("qwen2", "gguf", "Qwen2's q/k/v biases are not written: the GGUF writer writes plain LLaMA "
                                     "layers (no biases)")),
    examples="LLaMA 2/3, SmolLM2 (built-in `smollm2`), Mistral, Qwen2/2.5",
    notes="RoPE; Mistral and Qwen2 may use a sliding window",
)

# The LLaMA layout plus extras that change no weight layout: q_norm / k_norm normalise each head's
# d_head features with one weight shared by every head, so slicing heads never touches them.
QWEN3 = replace(LLAMA, family="qwen3", model_types=("qwen3",), examples="Qwen3 0.6B-32B", gguf_arch=None,
                refuses=(("mla", QK_NORM_MLA),),
                notes="q_norm / k_norm per head (shared by all heads, not sliced); head_dim != d_model / heads")
GEMMA3 = replace(
    LLAMA, family="gemma3", model_types=("gemma3_text",), gguf_arch=None, attn_out_normed=True,
    refuses=(("mla", QK_NORM_MLA), ("kvcache", SLIDING_KVCACHE)), examples="Gemma-3 270M (built-in `gemma3`, MQA), 1B",
    notes="q_norm / k_norm per head; scale query_pre_attn_scalar^-0.5; head_dim != d_model / heads; sliding and "
          "global layers (layer_types)")
# Gemma-4's text model: Gemma-3's layout; v_norm (no weight) normalises each head's values, and the norms do the
# scaling (scaling 1.0, which the kernel receives). Its full-attention layers' own head_dim (global_head_dim) is
# held per layer (HeadModel.d_head_at); KV heads per layer (num_global_key_value_heads), shared KV layers and keys
# reused as values are refused when the model loads, naming the feature (geometry.feature_refusal).
GEMMA4 = replace(
    GEMMA3, family="gemma4", model_types=("gemma4_text",),
    examples="Gemma-4 text models (`Gemma4ForCausalLM`) without shared KV layers or keys as values",
    refuses=(("mla", QK_NORM_MLA), ("kvcache", SLIDING_KVCACHE),
             ("block", "its per-layer inputs are packed for all layers in one table (embed_tokens_per_layer, "
                       "per_layer_model_projection), so a dropped layer would shift every later layer's input "
                       "(slicing them is not implemented)"),),
    notes="q_norm / k_norm / v_norm per head (shared, not sliced); scaling 1 (the norms scale); sliding and global "
          "layers; per-layer inputs and the optional MoE block leave attention alone (--unit ffn: the dense MLP's "
          "neurons); head_dim per layer (global_head_dim: full-attention layers 512, sliding 256 in the config "
          "defaults): statistics, gates, roles, scores, pruning, reloading, the KV calculator, gqa; similar and the "
          "head-aware cache refuse it. Refused when loading, naming the feature: KV shared across layers "
          "(num_kv_shared_layers), keys as values (attention_k_eq_v), KV heads per layer")
GEMMA2 = replace(LLAMA, family="gemma2", model_types=("gemma2",), examples="Gemma-2 2B/9B", gguf_arch=None,
                 attn_out_normed=True,
                 refuses=(("mla", "its attention logits are soft-capped (attn_logit_softcapping), which MLA's "
                                  "attention does not apply"),
                          ("kvcache", "its attention logits are soft-capped (attn_logit_softcapping), which the "
                                      "cache's attention function (sdpa) does not apply")),
                 notes="attention logits soft-capped (attn_logit_softcapping); sliding and global layers")
# SmolLM3 stores Q, K and V like LLaMA; its NoPE layers (config.no_rope_layers[layer] == 0) only skip the
# rotary step inside the forward, so the kernel sees their queries and keys as they are.
SMOLLM3 = replace(LLAMA, family="smollm3", model_types=("smollm3",), examples="SmolLM3-3B", gguf_arch=None,
                  refuses=(("mla", "its NoPE layers (no_rope_layers) rotate no key dimensions, while MLA conversion "
                                   "keeps rotary key dimensions in every layer"),
                           ("kvcache", UNVERIFIED_KVCACHE)),
                  notes="GQA; NoPE on every fourth layer (no_rope_layers: no rotary there); optional sliding window")
STARCODER2 = replace(LLAMA, family="starcoder2", model_types=("starcoder2",), examples="StarCoder2 3B/7B",
                     gguf_arch=None, refuses=(("mla", UNVERIFIED_MLA),),
                     ffn_in=("mlp.c_fc",), ffn_out="mlp.c_proj",
                     notes="biases on every projection; sliding window")

PHI3 = AttentionSpec(
    family="phi3",
    model_types=("phi3",),
    layers="layers",
    attention="self_attn",
    out_proj="self_attn.o_proj",
    qkv_proj="self_attn.qkv_proj",
    causal=True,
    head_count_attrs=(("num_key_value_groups", "groups"), ("num_key_value_heads", "kv_heads")),
    config_head_attrs=(("num_attention_heads", "heads"),),
    kv_heads_in_config=True,
    ffn_in=("mlp.gate_up_proj",), ffn_in_parts=2, ffn_out="mlp.down_proj", ffn_size_attr="intermediate_size",
    examples="Phi-3 mini/medium, Phi-4-mini",
    notes="GQA inside one fused projection, split at config.num_attention_heads (a pruned layer gets its own "
          "view of the config)",
)

GPT_NEOX = AttentionSpec(
    family="gpt_neox",
    model_types=("gpt_neox",),
    layers="layers",
    attention="attention",
    out_proj="attention.dense",
    qkv_proj="attention.query_key_value",
    qkv_layout="per_head",
    causal=True,
    # Its forward infers the head count from the fused width; the one size it reads, head_size, is
    # d_head, which pruning keeps.
    head_count_attrs=(("head_size", "d_head"),),
    ffn_in=("mlp.dense_h_to_4h",), ffn_out="mlp.dense_4h_to_h", ffn_size_attr="intermediate_size",
    examples="Pythia 14M-12B, GPT-NeoX-20B",
    notes="partial rotary (rotary_pct); the head count is inferred from the fused width",
)

OPT = AttentionSpec(
    family="opt",
    model_types=("opt",),
    layers="decoder.layers",
    attention="self_attn",
    out_proj="self_attn.out_proj",
    q_proj="self_attn.q_proj",
    k_proj="self_attn.k_proj",
    v_proj="self_attn.v_proj",
    causal=True,
    head_count_attrs=(("num_heads", "heads"),),
    ffn_in=("fc1",), ffn_out="fc2", ffn_size_attr="ffn_dim",
    refuses=(("mla", "it has no rotary embedding (learned positions), and MLA conversion keeps rotary key "
                     "dimensions"),),
    examples="OPT 125M-66B",
    notes="biases on every projection; learned positions; queries scaled before the attention call",
)

# OLMo-2 / OLMo-3 store Q, K and V like LLaMA, but q_norm / k_norm are RMSNorms over the whole projected query
# (key) vector, all heads at once: a head's normalisation depends on the other heads.
OLMO2 = replace(
    LLAMA, family="olmo2", model_types=("olmo2", "olmo3"), examples="OLMo-2 1B-32B, OLMo-3 7B/32B", gguf_arch=None,
    attn_out_normed=True,
    head_params=(("self_attn.q_norm.weight", "q"), ("self_attn.k_norm.weight", "kv")),
    refuses=(("prune", "q_norm / k_norm are RMSNorms over all heads' features together, so removing a head changes "
                       "the normalisation of the heads that stay and the pruned model would not compute the gated "
                       "one (gates, scores and whole attention sub-layers, unit attention, are exact)"),
             ("convert", "k_norm is an RMSNorm over all KV heads' features together, so merging or repeating KV "
                         "heads changes the keys' normalisation"),
             ("kvcache", UNVERIFIED_KVCACHE)),
    notes="q_norm / k_norm over all heads together (their weights move with permuted heads); OLMo-3: sliding and "
          "global layers (layer_types)")

# Mixture-of-experts decoders: attention as LLaMA's (Qwen3-MoE: as Qwen3's), so heads are analysed, gated and
# pruned alike; their feed-forward is a router over experts stored as 3D tensors, which has no FFN neurons in
# one pair of Linear layers.
MOE_FFN = ("the feed-forward is a mixture of experts (a router over experts stored as 3D tensors), not one pair "
           "of Linear layers, so FFN neurons are not units here (experts as units are not implemented)")
MIXTRAL = replace(LLAMA, family="mixtral", model_types=("mixtral",), examples="Mixtral 8x7B, 8x22B",
                  ffn_in=(), ffn_out=None, ffn_size_attr=None, gguf_arch=None,
                  refuses=(("ffn", MOE_FFN), ("mla", UNVERIFIED_MLA), ("kvcache", UNVERIFIED_KVCACHE)),
                  notes="GQA; sliding window; MoE feed-forward: --unit ffn refused (attention, block and head units "
                        "work)")
QWEN3_MOE = replace(QWEN3, family="qwen3_moe", model_types=("qwen3_moe",), examples="Qwen3-30B-A3B, 235B-A22B",
                    ffn_in=(), ffn_out=None, ffn_size_attr=None,
                    refuses=(("ffn", MOE_FFN), ("mla", QK_NORM_MLA), ("kvcache", UNVERIFIED_KVCACHE)),
                    notes="q_norm / k_norm per head (shared, not sliced); MoE feed-forward (some layers dense: "
                          "mlp_only_layers): --unit ffn refused")

# Qwen3.5's text model: Qwen3's layout with a gated query projection; three of every four layers are linear
# attention (Gated DeltaNet, no softmax heads).
QWEN3_5 = replace(
    QWEN3, family="qwen3_5", model_types=("qwen3_5_text",), q_gate=True, headless_layer_types=("linear_attention",),
    refuses=(("similar", "its linear-attention layers have no softmax heads, and similarity compares every layer's "
                         "heads (maps, outputs and weights) with every other's"),
             ("convert", "its linear-attention layers have no K/V heads, and GQA conversion (grouping, pooling, "
                         "uptraining) walks every layer's KV heads; not implemented for mixed layers")),
    examples="Qwen3.5 text models (`Qwen3_5ForCausalLM`)",
    notes="softmax heads only in its full-attention layers: the linear-attention layers (layer_types) have none, "
          "so statistics, roles and scores are NaN there, gates and pruning skip them and the KV calculator counts "
          "no cache for them; q_proj holds per head [query; output gate] (the gate rows go with their head); "
          "q_norm / k_norm per head; partial rotary")

# GPT-OSS: LLaMA's separate projections (with biases) plus a learned sink logit per head in the softmax; the MoE
# feed-forward (router + experts as 3D tensors) has no FFN neurons in one pair of Linear layers.
GPT_OSS = replace(
    LLAMA, family="gpt_oss", model_types=("gpt_oss",), sink_logits="sinks", head_params=(("self_attn.sinks", "q1"),),
    ffn_in=(), ffn_out=None, ffn_size_attr=None, refuses=(("ffn", MOE_FFN),), gguf_arch=None,
    examples="gpt-oss-20b, gpt-oss-120b",
    notes="a learned sink logit per head joins the softmax (statistics, the kernel and gates include it; "
          "sink_logit_mass column; the sinks go and move with their heads); alternating sliding and global layers; "
          "biases on q/k/v/o; MoE feed-forward: --unit ffn refused")

# DeepSeek-V3: multi-head latent attention. Each head's query comes from q_b_proj (after a low-rank q_a_proj and
# an RMSNorm) or q_proj; its key is [its rows of kv_b_proj applied to the normed latent ; one rotary key shared by
# all heads], its value its other rows of kv_b_proj. The attention function receives those per-head queries and
# keys (the absorbed form), so statistics, roles and gates are per head; removing a head removes its rows of
# q_b_proj / kv_b_proj and its output columns, exactly. The cache holds the latent, not K/V heads.
MLA_NO_QKV = ("multi-head latent attention has no per-head Linear Q/K/V: queries and keys come from low-rank "
              "latents through RMSNorms (and a rotary key shared by all heads)")
DEEPSEEK_V3 = AttentionSpec(
    family="deepseek_v3",
    model_types=("deepseek_v3",),
    layers="layers",
    attention="self_attn",
    out_proj="self_attn.o_proj",
    causal=True,
    head_row_projs=("self_attn.q_proj", "self_attn.q_b_proj", "self_attn.kv_b_proj"),
    d_head_attr="v_head_dim",
    head_count_attrs=(("num_heads", "heads"), ("num_key_value_groups", "groups")),
    refuses=(("qkv", MLA_NO_QKV), ("similar", "its weight-space similarity needs per-head Q/K/V: " + MLA_NO_QKV),
             ("convert", "its cache is already one shared latent (kv_lora_rank + qk_rope_head_dim per token and "
                         "layer), so there are no KV heads to merge"),
             ("ffn", MOE_FFN)),
    examples="DeepSeek-V3, DeepSeek-R1, Kimi-K2 (model_type deepseek_v3)",
    notes="MLA: per-head statistics, roles and gates on the absorbed per-head queries and keys; heads prune exactly "
          "(their rows of q_b_proj / kv_b_proj, their output columns); head output width v_head_dim; KV calculator: "
          "the latent cache; the first first_k_dense_replace layers dense, the rest MoE")

MODERNBERT = AttentionSpec(
    family="modernbert",
    model_types=("modernbert",),
    layers="layers",
    attention="attn",
    out_proj="attn.Wo",
    qkv_proj="attn.Wqkv",
    # Its forward views the fused output as [3, heads, head_dim] (heads inferred) and reads only head_dim.
    head_count_attrs=(("head_dim", "d_head"),),
    window_offset=1,
    ffn_in=("mlp.Wi",), ffn_in_parts=2, ffn_out="mlp.Wo", ffn_size_attr="intermediate_size",
    examples="ModernBERT base/large",
    notes="encoder; RoPE; local layers see |q - k| <= local_attention / 2 (bidirectional window), one global "
          "layer every global_attn_every_n_layers; Wi fuses [input; gate]",
)

SPECS: tuple[AttentionSpec, ...] = (BERT, ROBERTA, GPT2, LLAMA, QWEN3, GEMMA3, GEMMA2, STARCODER2, PHI3, GPT_NEOX,
                                    OPT, SMOLLM3, MIXTRAL, QWEN3_MOE, OLMO2, GEMMA4,
                                    MODERNBERT, QWEN3_5, GPT_OSS, DEEPSEEK_V3)
_BY_TYPE = {t: s for s in SPECS for t in s.model_types}


def register_spec(spec: AttentionSpec) -> None:
    """Serve a family headscope does not ship (a notebook's or a test's own model type) from now on: `spec_for`
    finds its model types, and every verb asks its capabilities as it asks a built-in family's."""
    taken = [t for t in spec.model_types if t in _BY_TYPE]
    if taken:
        raise HeadscopeError(f"model type(s) {', '.join(taken)} already have a spec "
                             f"({', '.join(sorted({_BY_TYPE[t].family for t in taken}))} family)")
    _BY_TYPE.update({t: spec for t in spec.model_types})


def unregister_spec(spec: AttentionSpec) -> None:
    """Forget a family added by `register_spec` (the built-in ones stay)."""
    for t in spec.model_types:
        if _BY_TYPE.get(t) is spec and spec not in SPECS:
            del _BY_TYPE[t]


def supported_model_types() -> list[str]:
    """All `config.model_type` values headscope has an adapter for."""
    return sorted(_BY_TYPE)


def spec_for(model_type: str) -> AttentionSpec:
    """The adapter for a `config.model_type`, or a clear error naming the supported ones."""
    try:
        return _BY_TYPE[model_type]
    except KeyError:
        raise HeadscopeError(
            f"model type {model_type!r} is not supported{did_you_mean(model_type, _BY_TYPE)}; "
            f"supported: {', '.join(supported_model_types())}. A new family is one AttentionSpec in "
            f"headscope/models/specs.py plus a tiny config: see {ADDING_A_FAMILY}"
        ) from None


def _layout_text(spec: AttentionSpec) -> str:
    if spec.head_row_projs:
        return "latent (MLA): per-head rows of q_b_proj / kv_b_proj"
    if not spec.qkv_proj:
        return "separate q, k, v" + (" (q_proj: [query; gate] per head)" if spec.q_gate else "")
    order = "per head [h0 q, k, v, h1 ...]" if spec.qkv_layout == "per_head" else "stacked [q; k; v]"
    return f"fused, {order}" + (", Conv1D" if spec.conv1d else "")


# Refusals of what is no verb's capability (capabilities.py lists the others), as the list under the table calls them.
_REFUSED_AS = {"similar": "`similar`", "qkv": "`qkv_weights` and what reads Q/K/V weights (`mla`, permuting heads)"}


def families_table() -> str:
    """The supported families' layouts as a Markdown table, generated from SPECS, then what each family's layout
    refuses beyond the verbs' capabilities (docs/families.md holds a copy; `capabilities.capability_table()` gives
    what each family supports)."""
    rows = ["| family | model_type | examples | kind | Q/K/V layout | KV heads | notes |",
            "|---|---|---|---|---|---|---|"]
    for s in SPECS:
        kv = ("none: one latent per token (kv_lora_rank + qk_rope_head_dim)" if s.head_row_projs else
              "from num_key_value_heads (MHA, GQA or MQA)" if s.kv_heads_in_config else "one per query head (MHA)")
        rows.append(" | ".join([
            f"| {s.family}", ", ".join(f"`{t}`" for t in s.model_types), s.examples,
            "decoder" if s.causal else "encoder", _layout_text(s), kv, f"{s.notes} |"]))
    refused = [f"- {s.family}, {_REFUSED_AS[what]}: {why}." for s in SPECS for what, why in s.refuses
               if what in _REFUSED_AS]
    if refused:
        rows += ["", "What a family's layout refuses besides the capabilities below (one line naming the family and "
                     "the reason, exit code 2, nothing written):", "", *refused]
    return "\n".join(rows) + "\n"
