"""The whole MLA recipe as one call: choose RoPE frequencies, factor K/V, optionally uptrain, evaluate, measure
the cache."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...models.adapter import HeadModel
from ..convert.evaluate import compare, kv_report
from ..convert.texts import CALIBRATION_DATA, CALIBRATION_HELDOUT, conversion_texts
from .convert import check_mla, convert_to_mla, full_rank
from .modeling import MLA_CONFIG_KEY
from .uptraining import uptrain_mla


def convert_and_evaluate(hm: HeadModel, kv_rank: int, rope_dims: int | None = None, *, selection: str = "2-norm",
                         data: Any = None, heldout: Any = None, uptrain_steps: int = 0, loss: str = "kd",
                         lr: float = 1e-3, max_length: int = 64, batch_size: int = 8,
                         data_limit: int | None = None, heldout_limit: int | None = None, seed: int = 0,
                         progress: bool = False) -> tuple[HeadModel, dict[str, Any]]:
    """Convert to MLA, optionally uptrain, and report perplexity (before/after/uptrained), KL and KV bytes.

    `data` (default PTB train) ranks the RoPE frequencies and is the uptraining text; `heldout`
    (default PTB valid) is only evaluated. Returns the final model and a JSON-ready report.
    """
    rope_dims = check_mla(hm, kv_rank, rope_dims)
    data_src = conversion_texts(data, data_limit, CALIBRATION_DATA)
    held_src = conversion_texts(heldout, heldout_limit, CALIBRATION_HELDOUT)
    ev: dict[str, Any] = dict(max_length=max_length, batch_size=batch_size, progress=progress)
    converted = convert_to_mla(hm, kv_rank, rope_dims, selection=selection, data=data_src, **ev)
    record = getattr(converted.config, MLA_CONFIG_KEY)
    final = converted
    if uptrain_steps:
        final, up = uptrain_mla(converted, data_src, uptrain_steps, teacher=hm, loss=loss, lr=lr,
                                batch_size=batch_size, max_length=max_length, seed=seed, progress=progress)
    scores = compare(hm, {"converted": converted, **({"uptrained": final} if uptrain_steps else {})}, held_src, **ev)
    before, after = kv_report(hm, per_token=True), kv_report(final, per_token=True)
    report: dict[str, Any] = {
        "model": hm.name, "model_type": hm.config.model_type, "n_layers": hm.n_layers, "n_heads": hm.n_heads,
        "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head, "d_model": hm.d_model,
        "kv_rank": kv_rank, "full_rank": full_rank(hm, rope_dims), "rope_dims": rope_dims,
        "selection": selection, "frequencies": record["frequencies"],
        "data": getattr(data_src, "source", "in-memory"), "data_passages": len(data_src),
        "heldout": getattr(held_src, "source", "in-memory"), "heldout_passages": len(held_src),
        "max_length": max_length, "heldout_tokens": scores["reference"]["tokens"],
        "ppl_before": scores["reference"]["ppl"], "ppl_after": scores["converted"]["ppl"],
        "kl_after": scores["converted"]["kl"],
        "ppl_uptrained": scores["uptrained"]["ppl"] if uptrain_steps else None,
        "kl_uptrained": scores["uptrained"]["kl"] if uptrain_steps else None,
        "kv_bytes_before": before, "kv_bytes_after": after,
        "kv_bytes_per_token_before": before["bytes_per_token"], "kv_bytes_per_token_after": after["bytes_per_token"],
        "kv_fraction": after["bytes_per_token"] / before["bytes_per_token"],
    }
    if uptrain_steps:
        report["uptrain"] = dict(up.settings, first_loss=up.losses[0], last_loss=up.losses[-1],
                                 mean_last_10=float(np.mean(up.losses[-10:])), losses=up.losses)
    return final, report
