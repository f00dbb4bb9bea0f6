"""`kvcache` as a library function: head-aware KV caches (full KV for chosen heads, sink + window for the rest)
against the full cache and a random choice at equal bytes; nothing written until `KvcacheResult.save`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..artifacts import KVCACHE_CSV, KVCACHE_JSON, write_csv
from ..data import TextSource, read_texts
from ..errors import HeadscopeError, OptionError
from ..io import atomic_write_text
from ..models.adapter import HeadModel
from ..options import Result, check_data
from ..provenance import check_made_for, provenance
from ..table import to_jsonable
from .kv_bytes import human_bytes
from .kvcache.cache import check_supported
from .kvcache.choice import ScoresFile, read_scores_file, scores_matrix
from .kvcache.compare import Settings, check_positions, compare, retrieval_scores
from .kvcache.evaluate import long_passages
from .kvcache.learned import learned_rows, passkey_prompts
from .kvcache.uptrain import training_batches
from .options import KvcacheOptions
from .reports import KvcacheReport, KvcacheRow


def _label(r: KvcacheRow) -> str:
    """`full`, or the method and its budget: `score 34.0%`."""
    return r.method if r.method == "full" else f"{r.method} {r.budget:.1%}"


def _row_line(r: KvcacheRow) -> str:
    label = _label(r) + (f" +{r.uptrain_steps}" if r.uptrain_steps else "")
    return (f"{label:<16} {r.full_kv_heads:>8} {r.windowed_kv_heads:>6} {r.riders:>6} "
            f"{human_bytes(r.kv_bytes_measured):>12} {r.kv_ratio:>6.3f} {r.perplexity:>11.3f} "
            f"{r.needle_accuracy:>8.2f}")


def _print_row(r: dict[str, Any]) -> None:
    """Each cache's row on stderr as soon as it is measured (a long run shows its results as it goes)."""
    print(f"done: {_row_line(KvcacheRow.from_json(r))}", file=sys.stderr, flush=True)


def _uncertainty_lines(rows: list[KvcacheRow], level: float) -> list[str]:
    """Whether each choice beats its random control beyond noise, and the needles' exact intervals."""
    out = []
    for r in rows:
        if r.vs_random is not None:
            v = r.vs_random
            out.append(f"vs random at {r.budget:.1%}: {v['verdict']} ({level:.0%} paired {v['method']} interval "
                       f"over {v['passages']} passage(s))")
    parts = []
    for r in rows:
        if r.needles:
            parts.append(f"{_label(r)} {r.needle_accuracy:.2f} [{r.needle_accuracy_lo:.2f}, "
                         f"{r.needle_accuracy_hi:.2f}] of {r.needles}")
    if parts:
        out.append(f"needles ({level:.0%} exact binomial intervals): " + "; ".join(parts))
    return out


@dataclass
class KvcacheResult(Result):
    """Each cache's row (kvcache.csv) and the report (kvcache.json, with every head's score and, with --choose
learned, the learned alphas: what --export-card writes as DuoAttention's pattern)."""

    report: KvcacheReport
    options: KvcacheOptions
    group_size: int
    files = (KVCACHE_CSV.name, KVCACHE_JSON.name)

    @property
    def rows(self) -> list[KvcacheRow]:
        return self.report.rows

    def records(self) -> list[dict[str, Any]]:
        """kvcache.csv's rows as JSON objects, their keys in the order they were measured in."""
        return [r.to_json() for r in self.rows]

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(self.records())

    def write(self, folder: Path) -> None:
        # The rows also hold full_heads, riders, answers and bytes_stored: kvcache.json's, not columns.
        records = self.records()
        columns = [x for c in KVCACHE_CSV.columns() for x in (c, f"{c}_lo", f"{c}_hi")
                   if any(x in r for r in records)]
        write_csv(folder, KVCACHE_CSV, records, columns)
        atomic_write_text(folder / KVCACHE_JSON.name, json.dumps(to_jsonable(self.report.to_json()), indent=2) + "\n")

    def lines(self) -> list[str]:
        r, o = self.report, self.options
        s = r.settings
        out = [f"{r.model}: {r.n_layers} layers x {r.n_kv_heads} KV heads ({self.group_size} query heads "
               f"each); sink {o.sink} + window {o.window}; {s.passages} passage(s) of {o.context} tokens from "
               f"{s.data}; {o.needles} needle(s); full heads by {o.by}{' from ' + o.scores if o.scores else ''}",
               f"{'cache':<16} {'KV full':>8} {'freed':>6} {'riders':>6} {'bytes/step':>12} {'ratio':>6} "
               f"{'perplexity':>11} {'needles':>8}"]
        out += [_row_line(row) for row in self.rows]
        if o.uptrain_steps and s.uptrain is not None:
            t = s.uptrain
            out.append(f"+N: after N uptraining steps ({o.loss}, lr {o.uptrain_lr:g}) on {t['batches']} batch(es) "
                       f"of {o.batch_size} x {o.train_length} tokens from {t['data']}")
        out.append(f"bytes/step: K and V read by one decoding step at {o.context} tokens, measured = formula in "
                   f"every row")
        return out + _uncertainty_lines(self.rows, o.ci)


def _after_evaluation(texts: list[str], used: int, passages: int) -> list[str]:
    """The texts after the last one the evaluation passages came from (`used` of them)."""
    rest = texts[used:]
    if not rest:
        raise OptionError("data", f"has no text left for uptraining after the {passages} evaluation passage(s); "
                                  f"give train_data or a lower limit", also=("train_data", "limit"))
    return rest


def _training(hm: HeadModel, o: KvcacheOptions, data: TextSource, train: TextSource | None, used: int,
              passages: int) -> tuple[list[Any], dict[str, Any] | None]:
    """The uptraining batches and their record (none without --uptrain-steps)."""
    if not o.uptrain_steps:
        return [], None
    texts = train.texts if train is not None else _after_evaluation(data.texts, used, passages)
    batches = training_batches(hm.tokenizer, texts, o.train_length, o.batch_size)
    return batches, {"data": train.source if train is not None else f"{data.source} after the evaluation passages",
                     "texts": len(texts), "passage_tokens": o.train_length, "batch": o.batch_size,
                     "batches": len(batches), "steps": o.uptrain_steps, "loss": o.loss, "lr": o.uptrain_lr}


def kvcache(hm: HeadModel, data: Any = None, options: KvcacheOptions | None = None, *,
            scores: ScoresFile | None = None, train_data: Any = None, progress: bool = False,
            **changes: Any) -> KvcacheResult:
    """`headscope kvcache` on a loaded model: head-aware caches at each --keep-full budget, evaluated.

    `data`: the long text (a TextSource, or a corpus name / file; None: `options.data`); `scores`: a read
    --scores file (None: read from `options.scores`, or the retrieval score measured here); `train_data`: the
    uptraining text (None: `options.train_data`, else the rest of `data`). Keywords override single options:
    `kvcache(hm, keep_full="12.5%,25%", context=1024)`.
    """
    check_data(data)
    check_data(train_data, "train_data")
    o = (options or KvcacheOptions(model=hm.name)).replace(**changes).validate()
    budgets, learned = o.budgets(), o.learned()
    data = read_texts(o.data if data is None else data) if data is None or isinstance(data, (str, Path)) else data
    if train_data is None and o.uptrain_steps and o.train_data is not None:
        train_data = o.train_data
    train = read_texts(train_data) if isinstance(train_data, (str, Path)) else train_data
    if scores is None and o.scores is not None:
        scores = read_scores_file(o.scores, o.by)
    check_positions(o.context, hm.max_positions)
    check_supported(hm)  # before any pass over the model
    if hm.tokenizer is None:
        raise HeadscopeError(f"{hm.name} has no tokenizer; kvcache builds text")
    passages, used = long_passages(hm.tokenizer, data.texts, o.context, o.limit)
    # Passkey prompts from the text after the perplexity passages; too little of it refuses before any slow work.
    prompts = passkey_prompts(hm.tokenizer, data.texts[used:], o.context, learned.prompts, o.seed) \
        if learned is not None else []
    settings = Settings(sink=o.sink, window=o.window, context=o.context, budgets=tuple(budgets),
                        threshold=o.threshold, needles=o.needles, chunk=o.chunk, random_control=not o.no_random,
                        seed=o.seed, uptrain=o.uptrain_steps, loss=o.loss, lr=o.uptrain_lr, intervals=o.intervals())
    batches, train_info = _training(hm, o, data, train, used, len(passages))
    score_info: dict[str, Any] = {"by": o.by, "from": o.scores}
    if scores is not None:
        check_made_for(scores.path, hm, "scores")  # its provenance: another model's file is refused
        matrix = scores_matrix(scores, hm.n_layers, hm.n_heads)
    else:
        matrix, info = retrieval_scores(hm, o.context, o.haystacks, o.seed, progress=progress)
        score_info.update(info)
    on_row = _print_row if progress else None
    rows = compare(hm, passages, matrix, o.by, settings, progress=progress, on_row=on_row, train_batches=batches)
    # DuoAttention's learned alphas: rows beside the score's and random's at equal bytes
    if learned is not None:
        more, score_info["learned"] = learned_rows(hm, passages, prompts, settings, learned, progress=progress,
                                                   on_row=on_row)
        rows += more
    report = {"model": hm.name, "n_layers": hm.n_layers, "n_heads": hm.n_heads, "n_kv_heads": hm.n_kv_heads,
              "d_head": hm.d_head,
              "settings": {"sink": o.sink, "window": o.window, "context": o.context, "budgets": budgets,
                           "threshold": o.threshold, "scores": score_info, "data": data.source,
                           "passages": len(passages), "needles": o.needles, "chunk": o.chunk,
                           "random_control": not o.no_random, "seed": o.seed, "uptrain": train_info},
              "rows": rows, "scores": matrix.tolist(), "provenance": provenance("kvcache", hm, data, o.with_only())}
    return KvcacheResult(report=KvcacheReport.from_json(report), options=o, group_size=hm.group_size)
