"""Question 2's MHA -> GQA conversion: gqa.json's numbers and one sentence, or why it does not apply."""

from __future__ import annotations

from typing import Any

from ..artifacts import GQA_JSON
from ..capacity.gqa import SUPPORTED_MODEL_TYPES
from .sources import Part, Sources, clean


def gqa_sentence(g: dict[str, Any]) -> str:
    """Perplexity before, after conversion and after uptraining, and the measured KV-cache shrink."""
    s = (
        f"Converting {g['model']} from {g['n_kv_heads_before']} to {g['n_kv_heads_after']} KV heads "
        f"({g['grouping_used']} grouping) moves held-out perplexity from {g['ppl_before']:.3g} to {g['ppl_after']:.3g}"
    )
    if g["ppl_uptrained"] is not None:
        s += f", and {g['ppl_uptrained']:.3g} after uptraining"
    before, after = g["kv_bytes_before"]["measured"], g["kv_bytes_after"]["measured"]
    if before:
        s += f"; its KV cache shrinks to {after / before:.0%} of the original"
    return s + "."


def gqa_part(src: Sources, model_type: str | None) -> Part:
    """gqa.json as a summary (scalars) and details (nested values); for encoders, why there is none."""
    part = Part()
    g = src.json(GQA_JSON.name)
    if g is None:
        if GQA_JSON.name not in src.problems and model_type and model_type not in SUPPORTED_MODEL_TYPES:
            part.missing["gqa"] = (f"not applicable: `headscope gqa` converts LLaMA-like decoders "
                                   f"({', '.join(SUPPORTED_MODEL_TYPES)}); this model is {model_type}")
        else:
            part.missing["gqa"] = src.note(GQA_JSON.name)
        return part
    part.data["gqa"] = {"summary": {k: clean(v) for k, v in g.items() if not isinstance(v, (dict, list))},
                        "details": {k: clean(v) for k, v in g.items() if isinstance(v, (dict, list))}}
    part.say("q2", gqa_sentence(g))
    return part
