"""The `search` grouping: per layer, the candidate grouping with the lowest calibration KL, in one greedy pass.

Only one layer's attention weights change between trials, so one converted working copy is kept and
each candidate's weights are swapped into it; the original model's logits are computed once per batch
for all candidates of a layer. KL is `headscope.eval.lm.kl_sums`, the formula `compare` uses, so the
search's figures equal a fresh conversion's `kl_divergence` on the same text.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ...data import Batch
from ...errors import HeadscopeError, OptionError
from ...eval.lm import counted_positions, kl_sums
from ...models.adapter import HeadModel
from ..convert.evaluate import token_batches
from . import clustering
from .convert import LayerWeights, adjacent_groups, check_convertible, layer_weights, pool_kv_heads, write_layer_weights

log = logging.getLogger(__name__)


def _canonical(groups: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(tuple(sorted(int(h) for h in g)) for g in groups))


def _trial_kls(hm: HeadModel, work: HeadModel, todo: list[Batch], trials: list[dict[int, LayerWeights]],
               current: dict[int, LayerWeights], bar: Any) -> list[float]:
    """Mean per-token KL(hm || work with each trial's layers swapped in) over the token batches `todo`.

    `trials[i]` maps layer -> `layer_weights`; the other layers keep `current`'s weights (what `work`
    holds on entry and on return).
    """
    kl = [0.0] * len(trials)
    count = 0.0
    dirty: set[int] = set()
    try:
        with torch.no_grad():
            for b in todo:
                ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
                ref = hm.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
                for i, trial in enumerate(trials):
                    for layer in dirty - trial.keys():
                        write_layer_weights(work, layer, current[layer])
                    for layer, weights in trial.items():
                        write_layer_weights(work, layer, weights)
                    dirty = set(trial)
                    logits = work.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
                    kl[i] += float(kl_sums(ref, logits, mask)[0].sum())
                    bar.update(1)
                count += float(counted_positions(mask).sum())
    finally:
        for layer in dirty:
            write_layer_weights(work, layer, current[layer])
    if count == 0:
        raise HeadscopeError("calibration data needs passages of at least 2 tokens; all were shorter")
    return [k / count for k in kl]


def _check_search(data: Any, candidates: Any) -> None:
    """Refuse a search without calibration text or with a candidate count that is not a whole number >= 0."""
    if data is None:
        raise OptionError(
            "data", "is needed by grouping='search', which picks groups by their KL divergence from the original model "
                    "on calibration text: give data (texts, token-id lists, a corpus such as ptb-train or a "
                    ".txt/.jsonl/.conllu file), or use grouping='similarity', which works from weights",
            also=("grouping",))
    if isinstance(candidates, bool) or not isinstance(candidates, (int, np.integer)) or candidates < 0:
        raise OptionError("search_candidates", f"must be a whole number >= 0, got {candidates!r}")


def _candidates(hm: HeadModel, kv_heads: int, data: Any, adjacent: list[list[list[int]]], candidates: int,
                seed: int, progress: bool, kw: dict[str, Any]) -> tuple[list[list[list[int]]], list[dict[tuple, str]]]:
    """Per layer, the similarity-from-data grouping, and every distinct candidate (canonical grouping -> the first
    name that proposed it: adjacent, similarity-data, similarity-weights, random-0 ...)."""
    n_kv, n_layers = hm.n_kv_heads, hm.n_layers
    d_data = clustering.kv_distances(hm, data, progress=progress, **kw)
    d_weights = clustering.kv_distances(hm)
    sim = [clustering.balanced_partition(d_data[l], kv_heads) for l in range(n_layers)]
    rng = np.random.default_rng(seed)
    options: list[dict[tuple, str]] = []
    for l in range(n_layers):
        named = [("adjacent", adjacent[l]), ("similarity-data", sim[l]),
                 ("similarity-weights", clustering.balanced_partition(d_weights[l], kv_heads))]
        named += [(f"random-{i}", clustering.random_balanced_groups(n_kv, kv_heads, rng)) for i in range(candidates)]
        opts: dict[tuple, str] = {}
        for name, g in named:
            opts.setdefault(_canonical(g), name)
        options.append(opts)
    return sim, options


def _greedy_pass(hm: HeadModel, work: HeadModel, todo: list[Batch], kv_heads: int, options: list[dict[tuple, str]],
                 chosen: list[list[list[int]]], current: dict[int, LayerWeights], kl_now: float,
                 bar: Any) -> tuple[list[dict[str, Any]], float]:
    """Visit the layers in order, keeping each layer's candidate of strictly lower KL; `chosen`, `current` and
    `work` are updated in place. Returns the per-layer trace and the final calibration KL."""
    trace = []
    for l in range(hm.n_layers):
        here = _canonical(chosen[l])
        others = [(key, name) for key, name in options[l].items() if key != here]
        trial_weights = [layer_weights(hm, l, [list(g) for g in key], kv_heads) for key, _ in others]
        kls = _trial_kls(hm, work, todo, [{l: w} for w in trial_weights], current, bar)
        tried = {options[l][here]: kl_now, **{name: k for (_, name), k in zip(others, kls, strict=True)}}
        best = int(np.argmin(kls)) if kls else -1
        if kls and kls[best] < kl_now:
            chosen[l] = [list(g) for g in others[best][0]]
            current[l] = trial_weights[best]
            write_layer_weights(work, l, current[l])
            kl_now = kls[best]
        trace.append({"layer": l, "chosen": options[l][_canonical(chosen[l])], "groups": chosen[l],
                      "calibration_kl": kl_now, "candidate_kl": tried})
    return trace, kl_now


def search_groups(hm: HeadModel, kv_heads: int, data: Any, *, candidates: int = 8, seed: int = 0,
                  max_length: int = 64, batch_size: int = 8, limit: int | None = None,
                  progress: bool = False) -> dict[str, Any]:
    """Per layer, the candidate grouping with the lowest KL from `hm` on calibration `data` (greedy, one pass).

    Candidates per layer: adjacent, similarity from `data`, similarity from the weights, and
    `candidates` seeded random balanced groupings (duplicates dropped). The search starts from the
    better of adjacent / similarity (whole model, calibration KL; similarity on ties, as `plan_groups`),
    then visits the layers in order: for layer l it converts with each other candidate for l, the other
    layers fixed at their current choice, and keeps the lowest KL if it is strictly lower. The current
    choice stays among the options, so the calibration KL never increases. Cost: 1-2 + sum over layers
    of (distinct candidates - 1) KL evaluations, each one forward pass over `data`.

    Returns {"groups", "search_start", "calibration_kl_adjacent", "calibration_kl_similarity",
    "calibration_kl_start", "calibration_kl_search", "search_trace" (per layer: chosen candidate, its
    groups, the KL after the layer, every candidate's KL), "kl_evaluations", "search_seconds", ...}.
    `data` is the calibration text; never pass the held-out text.
    """
    check_convertible(hm, kv_heads)
    _check_search(data, candidates)
    n_kv, n_layers = hm.n_kv_heads, hm.n_layers
    adjacent = [adjacent_groups(n_kv, kv_heads) for _ in range(n_layers)]
    settings = {"search_candidates": int(candidates), "search_seed": int(seed)}
    if kv_heads in (1, n_kv):
        # One group of all heads, or every head its own group: nothing to search.
        return {"groups": adjacent, **settings, "search_skipped": "only one grouping possible", "kl_evaluations": 0}
    t0 = time.perf_counter()
    kw = dict(max_length=max_length, batch_size=batch_size, limit=limit)
    sim, options = _candidates(hm, kv_heads, data, adjacent=adjacent, candidates=candidates, seed=seed,
                               progress=progress, kw=kw)
    todo = token_batches(hm, data, max_length, batch_size, limit)
    work = pool_kv_heads(hm, kv_heads, adjacent)
    current = {l: layer_weights(hm, l, adjacent[l], kv_heads) for l in range(n_layers)}
    sim_layers = [l for l in range(n_layers) if _canonical(sim[l]) != _canonical(adjacent[l])]
    start_trials: list[dict[int, LayerWeights]] = [{}]
    if sim_layers:
        start_trials.append({l: layer_weights(hm, l, sim[l], kv_heads) for l in sim_layers})
    n_evals = len(start_trials) + sum(len(o) - 1 for o in options)
    log.info("search: %d KL evaluations (%d layers, up to %d candidates each) on %d calibration batches",
             n_evals, n_layers, 3 + candidates, len(todo))
    with tqdm(total=n_evals * len(todo), desc=f"search ({n_evals} KL evaluations)", disable=not progress) as bar:
        kls = _trial_kls(hm, work, todo, start_trials, current, bar)
        kl_adj, kl_sim = kls[0], kls[-1]
        start = "similarity" if kl_sim <= kl_adj else "adjacent"
        started = sim if start == "similarity" else adjacent
        chosen = [[list(g) for g in layer_groups] for layer_groups in started]
        if start == "similarity":
            for l in sim_layers:
                current[l] = start_trials[1][l]
                write_layer_weights(work, l, current[l])
        trace, kl_now = _greedy_pass(hm, work, todo, kv_heads=kv_heads, options=options, chosen=chosen, current=current,
                                     kl_now=min(kl_adj, kl_sim), bar=bar)
    seconds = time.perf_counter() - t0
    log.info("search: calibration KL %.4f (start, %s) -> %.4f after %d KL evaluations in %.1f s",
             min(kl_adj, kl_sim), start, kl_now, n_evals, seconds)
    return {"groups": chosen, **settings, "search_start": start, "calibration_kl_adjacent": kl_adj,
            "calibration_kl_similarity": kl_sim, "calibration_kl_start": min(kl_adj, kl_sim),
            "calibration_kl_search": kl_now, "search_trace": trace,
            "layers_changed_by_search": [l for l in range(n_layers) if _canonical(chosen[l]) != _canonical(started[l])],
            "kl_evaluations": n_evals, "calibration_batches": len(todo), "search_seconds": round(seconds, 2)}
