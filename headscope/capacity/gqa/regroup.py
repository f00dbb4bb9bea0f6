"""The whole recipe as one call: choose groups, convert, optionally uptrain, evaluate, measure the KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...models.adapter import HeadModel
from ...options import OptionError
from ..convert.evaluate import compare, kv_report
from ..convert.texts import conversion_texts
from ..convert.uptraining import uptrain
from .convert import check_convertible, pool_kv_heads
from .groupings import plan_groups

# capacity/options.py imports this package (its groupings): no import at run time
if TYPE_CHECKING:
    from ..options import GqaOptions


def convert_and_evaluate(hm: HeadModel, options: GqaOptions, *, data: Any = None, heldout: Any = None,
                         progress: bool = False) -> tuple[HeadModel, dict[str, Any]]:
    """Convert, optionally uptrain, and report perplexity (before/after/uptrained) and KV bytes.

    `options` as `headscope gqa` takes them: `kv_heads`, `grouping` (with `search_candidates`, `no_fallback`),
    the uptraining (`steps`, `loss`, `lr`, `train`, `seed`) and the batches (`max_length`, `batch_size`).
    `data` is used for similarity grouping, search and uptraining; `heldout` only for perplexity. Passages in
    memory (a TextSource, a list) are used as they are; None reads `options.data` / `options.heldout` (PTB
    train / valid by default) with `options.limit` / `options.heldout_limit` (a built-in corpus gives its first
    `DEFAULT_LIMIT` passages otherwise). Returns the final model and a JSON-ready report.
    """
    kv_heads = options.kv_heads
    if kv_heads is None:
        raise OptionError("kv_heads", "is required")
    check_convertible(hm, kv_heads)
    data_src = conversion_texts(data, options.limit, options.data)
    held_src = conversion_texts(heldout, options.heldout_limit, options.heldout)
    ev: dict[str, Any] = dict(max_length=options.max_length, batch_size=options.batch_size, progress=progress)
    report: dict[str, Any] = {
        "model": hm.name, "model_type": hm.config.model_type, "n_layers": hm.n_layers, "n_heads": hm.n_heads,
        "n_kv_heads_before": hm.n_kv_heads, "n_kv_heads_after": kv_heads, "grouping": options.grouping,
        "data": getattr(data_src, "source", "in-memory"), "data_passages": len(data_src),
        "heldout": getattr(held_src, "source", "in-memory"), "heldout_passages": len(held_src),
        "max_length": options.max_length,
    }
    plan = plan_groups(hm, kv_heads, options.grouping, data_src, fallback=not options.no_fallback,
                       search_candidates=options.search_candidates, seed=options.seed, **ev)
    report["grouping_used"] = plan.pop("grouping_used")
    report["groups"] = plan.pop("groups")
    report.update({k: v for k, v in plan.items() if k != "grouping"})
    converted = pool_kv_heads(hm, kv_heads, report["groups"])
    final = converted
    if options.steps:
        final, up = uptrain(converted, data_src, options.steps, teacher=hm, loss=options.loss, lr=options.lr,
                            train=options.train, batch_size=options.batch_size, max_length=options.max_length,
                            seed=options.seed, progress=progress)
    candidates = {"converted": converted, **({"uptrained": final} if options.steps else {})}
    scores = compare(hm, candidates, held_src, **ev)
    report["heldout_tokens"] = scores["reference"]["tokens"]
    report["ppl_before"] = scores["reference"]["ppl"]
    report["ppl_after"] = scores["converted"]["ppl"]
    report["kl_after"] = scores["converted"]["kl"]
    report["ppl_uptrained"] = scores["uptrained"]["ppl"] if options.steps else None
    report["kl_uptrained"] = scores["uptrained"]["kl"] if options.steps else None
    if options.steps:
        report["uptrain"] = dict(up.settings, first_loss=up.losses[0], last_loss=up.losses[-1],
                                 mean_last_10=float(np.mean(up.losses[-10:])), losses=up.losses)
    report["kv_bytes_before"] = kv_report(hm)
    report["kv_bytes_after"] = kv_report(final)
    return final, report
