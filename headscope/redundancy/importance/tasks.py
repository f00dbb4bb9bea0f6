"""Importance across tasks: the same heads scored under several tasks, and where the rankings disagree.

A task is an entry of `TASKS`, registered beside its scoring function: `fn(ctx) -> [L, H]` (higher = more
important for that task), with its default `data`, `usable(hm)` (why the model cannot do it, or None),
`needs_labels` and, optionally, `check_data(hm or None, data)` (refuses bad task data before, and again
after, the model loads). The built-in ones:

- `lm_ptb`, `lm_gum`: next-token loss on PTB (`ptb-valid`) or on GUM's text (`gum-test`, other genres:
  interviews, travel guides, fiction, ...), by an importance criterion of `CRITERIA` (`--method`);
- `fidelity`: how far the final hidden states move from the unpruned model's (what sentence embeddings,
  e.g. MiniLM's, depend on), same criterion, on `ptb-valid`;
- `wordsim`: word similarity (wordsim353 Spearman), exact ablation: the Spearman lost when the head is
  zeroed (one wordsim evaluation per head);
- `syntax`: the head's own dependency accuracy (Clark et al. 2019, `syntax.dependency_accuracy`, best
  relation, dependent to head) on `ewt-test`: what the "syntax heads" are;
- `classification`: accuracy on labelled data (default the built-in `polarity` sentences, or a jsonl with
  `text` and `label` given as the task's data), same criterion. A sequence-classification model is scored
  as it is; a model without a classification head gets a linear probe (`eval.probe`) fitted on a stratified
  half of the data with every head on, and the heads are scored on the other half through it;
- `retrieval`: Wu et al.'s needle-copy retrieval score (`headscope.learned.longctx`) at a long context (the task's
  data: the context length, default 2,048 tokens or the model's positions if fewer) on
  `RETRIEVAL_HAYSTACKS` needle haystacks: the heads that copy the needle when the model retrieves it.
  Averaged over the haystacks the model answered, or over all of them when it answered none (tasks.json
  says which). Causal LMs only.

`task_importance` scores every chosen task into one `HeadTable` (columns `importance_<task>`);
`task_correlations` is the task x task Spearman matrix; `task_specific` lists the heads in the top of one
task and the bottom half of another.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ...attention import DEFAULT_BLOCK
from ...data import LABELLED, Tokens, pad_id, read_conllu
from ...errors import HeadscopeError, did_you_mean
from ...eval.evaluate import is_labelled
from ...eval.metrics import METRICS, has_classifier
from ...eval.probe import fit_probe
from ...eval.wordsim import wordsim_spearman
from ...heads import Head
from ...learned.longctx import long_roles
from ...learned.longctx.long_roles import check_long_args
from ...learned.syntax import dependency_accuracy
from ...models.adapter import HeadModel
from ...registry import Registry
from ...table import HeadTable
from ...uncertainty import spearman, spearman_interval
from ...version import versions
from .criteria import CRITERIA
from .scoring import ScoreSettings, rank_correlations, score

log = logging.getLogger(__name__)


@dataclass
class TaskContext:
    """What a task's scoring function reads."""

    hm: HeadModel
    # the task's data: a built-in name, a path, or None for the task's default
    data: Any
    method: str  # the importance criterion for metric tasks
    limit: int | None
    max_length: int | None
    batch_size: int
    seed: int
    progress: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # what a task reports about itself (tasks.json's task_info)


TaskFn = Callable[[TaskContext], np.ndarray]
TASKS: Registry[TaskFn] = Registry("task")


def _metric_task(ctx: TaskContext, data: Any, metric: str) -> np.ndarray:
    settings = ScoreSettings(methods=(ctx.method,), metric=metric, max_length=ctx.max_length,
                             batch_size=ctx.batch_size, seed=ctx.seed, limit=ctx.limit)
    table = score(ctx.hm, data, settings, progress=ctx.progress)
    return np.asarray(table[f"importance_{ctx.method}"], float)


def _needs_lm(hm: HeadModel) -> str | None:
    return METRICS.get("lm_loss").usable(hm, False)


@TASKS.register("lm_ptb", help="next-token loss on PTB sentences (ptb-valid), by --method",
                data="ptb-valid", usable=_needs_lm, needs_labels=False)
def lm_ptb(ctx: TaskContext) -> np.ndarray:
    return _metric_task(ctx, ctx.data or "ptb-valid", "lm_loss")


@TASKS.register("lm_gum", help="next-token loss on GUM's multi-genre text (gum-test), by --method",
                data="gum-test", usable=_needs_lm, needs_labels=False)
def lm_gum(ctx: TaskContext) -> np.ndarray:
    return _metric_task(ctx, ctx.data or "gum-test", "lm_loss")


@TASKS.register("fidelity", help="closeness of the final hidden states to the unpruned model's (ptb-valid), "
                "by --method", data="ptb-valid", usable=lambda hm: None, needs_labels=False)
def fidelity(ctx: TaskContext) -> np.ndarray:
    return _metric_task(ctx, ctx.data or "ptb-valid", "fidelity")


def _needs_tokenizer(hm: HeadModel) -> str | None:
    return None if hm.tokenizer is not None else "it needs the model's tokenizer"


@TASKS.register("wordsim", help="wordsim353 Spearman lost when the head is zeroed (exact ablation)",
                data="wordsim353", usable=_needs_tokenizer, needs_labels=False)
def wordsim(ctx: TaskContext) -> np.ndarray:

    hm = ctx.hm
    which = ctx.data or "wordsim353"
    base = wordsim_spearman(hm, which)
    out = np.full((hm.n_layers, hm.n_heads), np.nan)
    for layer in tqdm(range(hm.n_layers), desc="wordsim ablation", disable=not ctx.progress, leave=False):
        for head in hm.kept_heads(layer):
            gates = torch.ones(hm.n_layers, hm.n_heads)
            gates[layer, head] = 0.0
            out[layer, head] = base - wordsim_spearman(hm, which, gates=gates)
    return out


@TASKS.register("syntax", help="the head's own dependency accuracy (best relation, dependent to head; ewt-test)",
                data="ewt-test", usable=_needs_tokenizer, needs_labels=False)
def syntax(ctx: TaskContext) -> np.ndarray:

    sentences = read_conllu(ctx.data or "ewt-test")[: ctx.limit or None]
    bar = tqdm(total=len(sentences), desc="syntax", unit="sentence", disable=not ctx.progress, leave=False)
    try:
        counts = dependency_accuracy(ctx.hm, sentences, ctx.max_length or 128, ctx.batch_size,
                                     pad_id=pad_id(ctx.hm), progress=bar)
    finally:
        bar.close()
    rels = counts.relations(min_count=5) or counts.relations()
    return np.nanmax(np.stack([counts.accuracy(r, "dep_to_head") for r in rels]), axis=0)


@TASKS.register("classification", help="accuracy on labelled data (default: the built-in polarity sentences; or "
                "classification=FILE.jsonl), by --method; a model without a classification head gets a linear "
                "probe fitted on half of the data and is scored on the other half", data="polarity",
                usable=_needs_tokenizer, needs_labels=True)
def classification(ctx: TaskContext) -> np.ndarray:

    data = ctx.data or "polarity"
    if has_classifier(ctx.hm):
        ctx.info["classifier"] = "the model's own classification head"
        return _metric_task(ctx, data, "accuracy")
    probe = fit_probe(ctx.hm, data, max_length=ctx.max_length, batch_size=ctx.batch_size, seed=ctx.seed)
    ctx.info["classifier"] = probe.summary()
    test = probe.test
    if ctx.limit is not None and ctx.limit < len(test):
        assert test.labels is not None, "a probe's test split is labelled"
        test = Tokens(test.ids[: ctx.limit], test.source, test.max_length, test.truncated, None, None,
                      test.labels[: ctx.limit])
    ctx.info["scored_passages"] = len(test)
    settings = ScoreSettings(methods=(ctx.method,), metric="accuracy", batch_size=ctx.batch_size, seed=ctx.seed)
    table = score(probe.hm, test, settings, progress=ctx.progress)
    ctx.info["accuracy"] = table.meta["metric_value"]
    return np.asarray(table[f"importance_{ctx.method}"], float)


# Needle haystacks the retrieval task scores on (depths 0.1, 0.35, 0.6, 0.85 in turn).
RETRIEVAL_HAYSTACKS = 4
RETRIEVAL_LENGTH = 2048


def retrieval_length(hm: HeadModel | None, data: Any) -> int:
    """The retrieval task's context length: its data (an integer), else 2,048 or the model's positions.
    Refuses a bad length (with `hm` None: what needs no model; with `hm`: beyond its positions too)."""
    if data is not None:
        try:
            length = int(str(data))
        except ValueError:
            raise HeadscopeError(f"the retrieval task's data is a context length in tokens (retrieval=2048); "
                                 f"got {data!r}") from None
    else:
        length = RETRIEVAL_LENGTH if hm is None or hm.max_positions is None else min(RETRIEVAL_LENGTH, hm.max_positions)

    check_long_args(hm, length, RETRIEVAL_HAYSTACKS, 0, None, DEFAULT_BLOCK)
    return length


def _needs_causal_tokenizer(hm: HeadModel) -> str | None:
    if not hm.causal:
        return "the needle test needs a causal LM (a decoder)"
    return _needs_tokenizer(hm)


@TASKS.register("retrieval", help="Wu et al.'s needle-copy retrieval score at long context (data: the context "
                f"length, default {RETRIEVAL_LENGTH}; {RETRIEVAL_HAYSTACKS} needle haystacks; causal LMs)",
                data=str(RETRIEVAL_LENGTH), usable=_needs_causal_tokenizer, needs_labels=False,
                check_data=retrieval_length)
def retrieval(ctx: TaskContext) -> np.ndarray:

    length = retrieval_length(ctx.hm, ctx.data)
    lc = long_roles(ctx.hm, length, windows=0, haystacks=RETRIEVAL_HAYSTACKS, seed=ctx.seed, progress=ctx.progress)
    needles = lc["needles"]
    answered = int(needles["succeeded"])
    ctx.info.update({"length": length, "haystacks": RETRIEVAL_HAYSTACKS, "answered": answered,
                     "needle_accuracy": needles["needle_accuracy"], "token_accuracy": needles["token_accuracy"]})
    if answered:
        ctx.info["score"] = "retrieval_score (answered haystacks, as Wu et al.)"
        return np.asarray(lc["scores"]["retrieval_score"], float)
    ctx.info["score"] = "retrieval_score_all (the model answered no haystack: every haystack's copy score)"
    log.warning("retrieval task: %s answered none of the %d haystacks at %d tokens; scoring every haystack's "
                "copy score", ctx.hm.name, RETRIEVAL_HAYSTACKS, length)
    return np.asarray(lc["scores"]["retrieval_score_all"], float)


def parse_tasks(spec: str | Sequence[str]) -> dict[str, Any]:
    """`"lm_ptb,classification=labels.jsonl"` -> {task: data or None}; unknown tasks and a labelled task
    without labelled data are refused here (before any model loads)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: dict[str, Any] = {}
    for item in (s.strip() for s in items):
        if not item:
            continue
        name, _, data = item.partition("=")
        name = name.strip()
        if name not in TASKS:
            raise HeadscopeError(f"unknown task {name!r}{did_you_mean(name, TASKS)}; choose from {', '.join(TASKS)} "
                                 f"(a task's data after '=', e.g. classification=labels.jsonl)")
        given = data.strip() or None
        entry = TASKS.get(name)
        if entry.needs_labels and not is_labelled(given or entry.data):
            raise HeadscopeError(f"task {name!r} needs labelled data: give {name}=FILE.jsonl with a 'text' and a "
                                 f"'label' on every line, or a labelled built-in ({', '.join(LABELLED)})"
                                 + (f" ({given!r} has no labels)" if given else ""))
        # a task that checks its own data (retrieval: a context length)
        if "check_data" in entry.meta:
            entry.check_data(None, given)
        out[name] = given
    if len(out) < 2:
        raise HeadscopeError(f"give at least two tasks to compare (got {', '.join(out) or 'none'}); "
                             f"choose from {', '.join(TASKS)}")
    return out


def check_tasks_usable(hm: HeadModel, tasks: dict[str, Any]) -> None:
    """Refuse a task the model cannot do (an LM task on an encoder, classification without a classifier)."""
    for name, data in tasks.items():
        entry = TASKS.get(name)
        why = entry.usable(hm)
        if why:
            raise HeadscopeError(f"task {name!r} does not apply to {hm.name}: {why}")
        if "check_data" in entry.meta:
            entry.check_data(hm, data)


def task_importance(hm: HeadModel, tasks: dict[str, Any] | str, *, method: str = "taylor",
                    limit: int | None = 64, max_length: int | None = 64, batch_size: int = 16, seed: int = 0,
                    progress: bool = False) -> HeadTable:
    """Every head's importance under each task: one column `importance_<task>` (higher = more important)."""

    tasks = parse_tasks(tasks) if isinstance(tasks, str) else dict(tasks)
    CRITERIA.get(method)
    check_tasks_usable(hm, tasks)
    cols: dict[str, np.ndarray] = {}
    seconds: dict[str, float] = {}
    info: dict[str, dict[str, Any]] = {}
    for name, data in tasks.items():
        t0 = time.perf_counter()
        ctx = TaskContext(hm, data=data, method=method, limit=limit, max_length=max_length, batch_size=batch_size,
                          seed=seed, progress=progress)
        v = np.asarray(TASKS.get(name).fn(ctx), float)
        if ctx.info:
            info[name] = ctx.info
        if v.shape != (hm.n_layers, hm.n_heads):
            raise HeadscopeError(f"task {name!r} returned shape {v.shape}; expected {(hm.n_layers, hm.n_heads)}")
        cols[f"importance_{name}"] = v
        seconds[name] = time.perf_counter() - t0
    meta = {"model": hm.name, "model_type": hm.config.model_type, "n_layers": hm.n_layers, "n_heads": hm.n_heads,
            "tasks": {n: (d if d is not None else TASKS.get(n).data) for n, d in tasks.items()}, "method": method,
            "limit": limit, "max_length": max_length, "seed": seed, "seconds": seconds, "task_info": info,
            "convention": "higher importance = more important for that task", "versions": versions()}
    return HeadTable(hm.n_layers, hm.n_heads, cols, meta)


def task_correlations(table: HeadTable) -> Any:
    """The task x task Spearman rank-correlation matrix (a pandas DataFrame)."""
    return rank_correlations(table)


def task_correlation_intervals(table: HeadTable, level: float = 0.95) -> list[dict[str, Any]]:
    """Each pair of tasks' Spearman over the heads both score, with its interval over heads
    (`uncertainty.spearman_interval`: Fisher z, Bonett-Wright variance; the tasks' own data noise is not in it)."""
    names = [c.removeprefix("importance_") for c in table.columns
             if c.startswith("importance_") and not c.endswith(("_lo", "_hi"))]
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            va, vb = (np.asarray(table[f"importance_{t}"], float).ravel() for t in (a, b))
            ok = np.isfinite(va) & np.isfinite(vb)
            r = spearman(va, vb)
            lo, hi = spearman_interval(r, int(ok.sum()), level)
            out.append({"a": a, "b": b, "spearman": r, "lo": lo, "hi": hi, "heads": int(ok.sum())})
    return out


def task_specific(table: HeadTable, top: float = 0.1) -> list[dict[str, Any]]:
    """Heads in the top `top` share of one task's ranking that rank in the bottom half of another's.

    Ranks are 1 = most important; `percentile_other` is the head's place in the other task's ranking
    (0 = most important, 1 = least).
    """
    names = [c.removeprefix("importance_") for c in table.columns if c.startswith("importance_")]
    n = table.n_layers * table.n_heads
    k = max(3, int(math.ceil(top * n)))
    ranks = {}
    for t in names:
        v = np.asarray(table[f"importance_{t}"], float).ravel()
        order = np.argsort(-np.nan_to_num(v, nan=-np.inf), kind="stable")
        r = np.empty(n, int)
        r[order] = np.arange(1, n + 1)
        ranks[t] = r
    rows = []
    for t in names:
        for o in names:
            if t == o:
                continue
            for idx in np.argsort(ranks[t])[:k]:
                if ranks[o][idx] > n / 2:
                    layer, head = divmod(int(idx), table.n_heads)
                    rows.append({"task": t, "other": o, "head": Head(layer, head).name, "layer": layer, "head_id": head,
                                 "rank_task": int(ranks[t][idx]), "rank_other": int(ranks[o][idx]),
                                 "percentile_other": float((ranks[o][idx] - 1) / max(n - 1, 1))})
    return rows


__all__ = ["TASKS", "TaskContext", "check_tasks_usable", "parse_tasks", "task_correlation_intervals",
           "task_correlations", "task_importance", "task_specific"]
