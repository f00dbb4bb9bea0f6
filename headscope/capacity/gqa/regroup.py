"""The whole recipe as one call: choose groups, convert, optionally uptrain, evaluate, measure the KV cache."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...models.adapter import HeadModel
from ..convert.evaluate import compare, kv_report
from ..convert.texts import CALIBRATION_DATA, CALIBRATION_HELDOUT, conversion_texts
from ..convert.uptraining import uptrain
from .convert import check_convertible, pool_kv_heads
from .groupings import plan_groups


def convert_and_evaluate(hm: HeadModel, kv_heads: int, grouping: str = "mean", *, data: Any = None,
                         heldout: Any = None, uptrain_steps: int = 0, loss: str = "kd", lr: float = 1e-3,
                         train: str = "attention",
                         max_length: int = 64, batch_size: int = 8, data_limit: int | None = None,
                         heldout_limit: int | None = None, fallback: bool = True, seed: int = 0,
                         search_candidates: int = 8, progress: bool = False) -> tuple[HeadModel, dict[str, Any]]:
    """Convert, optionally uptrain, and report perplexity (before/after/uptrained) and KV bytes.

    `data` (default PTB train) is used for similarity grouping, search and uptraining; `heldout`
    (default PTB valid) only for perplexity. Names and paths are read by `headscope.data.read_texts`
    (a built-in corpus gives its first `DEFAULT_LIMIT` passages unless `data_limit` / `heldout_limit`
    say otherwise). Returns the final model and a JSON-ready report.
    """
    check_convertible(hm, kv_heads)
    data_src = conversion_texts(data, data_limit, CALIBRATION_DATA)
    held_src = conversion_texts(heldout, heldout_limit, CALIBRATION_HELDOUT)
    ev: dict[str, Any] = dict(max_length=max_length, batch_size=batch_size, progress=progress)
    report: dict[str, Any] = {
        "model": hm.name, "model_type": hm.config.model_type, "n_layers": hm.n_layers, "n_heads": hm.n_heads,
        "n_kv_heads_before": hm.n_kv_heads, "n_kv_heads_after": kv_heads, "grouping": grouping,
        "data": getattr(data_src, "source", "in-memory"), "data_passages": len(data_src),
        "heldout": getattr(held_src, "source", "in-memory"), "heldout_passages": len(held_src),
        "max_length": max_length,
    }
    plan = plan_groups(hm, kv_heads, grouping, data_src, fallback=fallback, search_candidates=search_candidates,
                       seed=seed, **ev)
    report["grouping_used"] = plan.pop("grouping_used")
    report["groups"] = plan.pop("groups")
    report.update({k: v for k, v in plan.items() if k != "grouping"})
    converted = pool_kv_heads(hm, kv_heads, report["groups"])
    final = converted
    if uptrain_steps:
        final, up = uptrain(converted, data_src, uptrain_steps, teacher=hm, loss=loss, lr=lr, train=train,
                            batch_size=batch_size, max_length=max_length, seed=seed, progress=progress)
    candidates = {"converted": converted, **({"uptrained": final} if uptrain_steps else {})}
    scores = compare(hm, candidates, held_src, **ev)
    report["heldout_tokens"] = scores["reference"]["tokens"]
    report["ppl_before"] = scores["reference"]["ppl"]
    report["ppl_after"] = scores["converted"]["ppl"]
    report["kl_after"] = scores["converted"]["kl"]
    report["ppl_uptrained"] = scores["uptrained"]["ppl"] if uptrain_steps else None
    report["kl_uptrained"] = scores["uptrained"]["kl"] if uptrain_steps else None
    if uptrain_steps:
        report["uptrain"] = dict(up.settings, first_loss=up.losses[0], last_loss=up.losses[-1],
                                 mean_last_10=float(np.mean(up.losses[-10:])), losses=up.losses)
    report["kv_bytes_before"] = kv_report(hm)
    report["kv_bytes_after"] = kv_report(final)
    return final, report
