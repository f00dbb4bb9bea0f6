"""The whole MLA recipe as one call: choose RoPE frequencies, factor K/V, optionally uptrain, evaluate, measure
the cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...models.adapter import HeadModel
from ...options import OptionError
from ..convert.evaluate import compare, kv_report
from ..convert.texts import conversion_texts
from .convert import check_mla, convert_to_mla, full_rank
from .modeling import MLA_CONFIG_KEY
from .uptraining import uptrain_mla

# capacity/options.py imports the capacity packages: no import at run time
if TYPE_CHECKING:
    from ..options import MlaOptions


def convert_and_evaluate(hm: HeadModel, options: MlaOptions, *, data: Any = None, heldout: Any = None,
                         progress: bool = False) -> tuple[HeadModel, dict[str, Any]]:
    """Convert to MLA, optionally uptrain, and report perplexity (before/after/uptrained), KL and KV bytes.

    `options` as `headscope mla` takes them: `kv_rank`, `rope_dims` (None: d_head / 8), `selection`, the
    uptraining (`steps`, `loss`, `lr`, `seed`) and the batches (`max_length`, `batch_size`). `data` ranks the
    RoPE frequencies and is the uptraining text; `heldout` is only evaluated. Passages in memory are used as
    they are; None reads `options.data` / `options.heldout` (PTB train / valid by default) with
    `options.limit` / `options.heldout_limit`. Returns the final model and a JSON-ready report.
    """
    kv_rank = options.kv_rank
    if kv_rank is None:
        raise OptionError("kv_rank", "is required")
    rope_dims = check_mla(hm, kv_rank, options.rope_dims)
    data_src = conversion_texts(data, options.limit, options.data)
    held_src = conversion_texts(heldout, options.heldout_limit, options.heldout)
    ev: dict[str, Any] = dict(max_length=options.max_length, batch_size=options.batch_size, progress=progress)
    converted = convert_to_mla(hm, kv_rank, rope_dims, selection=options.selection, data=data_src, **ev)
    record = getattr(converted.config, MLA_CONFIG_KEY)
    final = converted
    if options.steps:
        final, up = uptrain_mla(converted, data_src, options.steps, teacher=hm, loss=options.loss, lr=options.lr,
                                batch_size=options.batch_size, max_length=options.max_length, seed=options.seed,
                                progress=progress)
    scores = compare(hm, {"converted": converted, **({"uptrained": final} if options.steps else {})}, held_src, **ev)
    before, after = kv_report(hm, per_token=True), kv_report(final, per_token=True)
    report: dict[str, Any] = {
        "model": hm.name, "model_type": hm.config.model_type, "n_layers": hm.n_layers, "n_heads": hm.n_heads,
        "n_kv_heads": hm.n_kv_heads, "d_head": hm.d_head, "d_model": hm.d_model,
        "kv_rank": kv_rank, "full_rank": full_rank(hm, rope_dims), "rope_dims": rope_dims,
        "selection": options.selection, "frequencies": record["frequencies"],
        "data": getattr(data_src, "source", "in-memory"), "data_passages": len(data_src),
        "heldout": getattr(held_src, "source", "in-memory"), "heldout_passages": len(held_src),
        "max_length": options.max_length, "heldout_tokens": scores["reference"]["tokens"],
        "ppl_before": scores["reference"]["ppl"], "ppl_after": scores["converted"]["ppl"],
        "kl_after": scores["converted"]["kl"],
        "ppl_uptrained": scores["uptrained"]["ppl"] if options.steps else None,
        "kl_uptrained": scores["uptrained"]["kl"] if options.steps else None,
        "kv_bytes_before": before, "kv_bytes_after": after,
        "kv_bytes_per_token_before": before["bytes_per_token"], "kv_bytes_per_token_after": after["bytes_per_token"],
        "kv_fraction": after["bytes_per_token"] / before["bytes_per_token"],
    }
    if options.steps:
        report["uptrain"] = dict(up.settings, first_loss=up.losses[0], last_loss=up.losses[-1],
                                 mean_last_10=float(np.mean(up.losses[-10:])), losses=up.losses)
    return final, report
