"""The capability suite: which rows a comparison measures, their items prepared once for both models, and how each
row's per-item numbers become its value.

A row is prepared before either model runs (`prepare_rows`), so a bad pairs file, a task the family cannot do or a
haystack that does not fit is refused before any forward. Each `Row` then measures one model (`measure`), giving
per-item sums, and names the statistic of those sums that is the row's value (`statistic`).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..data import Tokens, prepare_tokens, resolve_max_length
from ..errors import HeadscopeError, OptionError
from ..eval.metrics import cosine64
from ..heads import Head
from ..learned.causal.attribution import attribution_scan
from ..learned.causal.pairs import PairBatch, load_pairs, read_pairs, tokenize_pairs
from ..learned.causal.run import pairs_fingerprint
from ..learned.longctx.needle import DEPTHS, Haystack, build_haystack, gum_sentences
from ..models.adapter import HeadModel
from ..uncertainty import IntervalSettings, Statistic, ratio
from .census import census_rows
from .measure import fidelity_items, lm_items, needle_items, pair_items
from .options import DECODER_TASKS, ENCODER_TASKS, CompareOptions

log = logging.getLogger(__name__)

Sums = dict[str, np.ndarray]


def _mean(s: Any) -> np.ndarray:
    return ratio("v", "n")(s)


def _perplexity(s: Any) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(ratio("nll", "n")(s))


@dataclass
class Row:
    """One capability: its name, metric, direction, items (prepared once) and how a model is measured on them.

    `run` is called on BASE first, then on OTHER: the rows whose OTHER side depends on BASE (fidelity's cosine to
    BASE's outputs, the heads rows' carriers found in BASE) keep what the first call found."""

    capability: str
    metric: str
    higher_is_better: bool
    statistic: Statistic
    items: Any  # Tokens, PairBatch or list[Haystack]
    run: Callable[[HeadModel], Sums]
    describe: dict[str, Any] = field(default_factory=dict)
    # sha256 of the items' token ids (and answers, spans): a BASE measurement is reused only on the same items
    fingerprint: str = ""
    # whether BASE's per-item sums alone are the row's BASE side (fidelity's OTHER side needs BASE's outputs)
    reusable: bool = True
    # what a row whose OTHER side depends on BASE takes from an earlier record when BASE's side is reused
    restore: Callable[[dict[str, Any]], None] | None = None

    @property
    def n(self) -> int:
        return len(self.items)

    def measure(self, hm: HeadModel) -> Sums:
        return self.run(hm)


def _pair_row(name: str, b: PairBatch, batch_size: int, what: str) -> Row:
    def run(hm: HeadModel) -> Sums:
        v = pair_items(hm, b, batch_size)
        return {"v": v, "n": np.ones_like(v)}

    return Row(name, "logit_diff", True, _mean, b, run,
               {"what": what, "source": b.source, "pairs": len(b), "left_out": b.skipped},
               fingerprint=pairs_fingerprint(b)["sha256"])


def carriers_row(task: Row, batch_size: int, settings: IntervalSettings) -> Row:
    """heads:<task>: the logit difference that BASE's carrier heads of a pair task move from corrupt to clean (first
    order, attribution patching), per pair, in each model. Carriers: the heads whose attribution effect in BASE has
    an interval above 0 (`learned.causal`); one gone from OTHER (pruned) carries 0."""
    b: PairBatch = task.items
    found: dict[str, list[Head]] = {}

    def run(hm: HeadModel) -> Sums:
        runs = attribution_scan(hm, b, batch_size=batch_size)
        moved = np.nan_to_num(runs.patched - runs.corrupt[:, None, None], nan=0.0)  # [pairs, layer, head]
        # the first model measured is BASE: its carriers are the row's heads
        if "carriers" not in found:
            try:
                lo = np.nan_to_num(runs.effect(settings).lo, nan=-1.0)
            except HeadscopeError:  # the pairs do not move the metric: no head carries them
                lo = np.full(moved.shape[1:], -1.0)
            found["carriers"] = [Head(int(l), int(h)) for l, h in zip(*np.nonzero(lo > 0), strict=True)]
            row.describe["carriers"] = [head.name for head in found["carriers"]]
        v = np.zeros(len(b))
        for l, h in found["carriers"]:
            if l < moved.shape[1] and h < moved.shape[2]:
                v += moved[:, l, h]
        return {"v": v, "n": np.ones_like(v)}

    def restore(earlier: dict[str, Any]) -> None:  # BASE reused (--base-from): its carriers come with it
        found["carriers"] = [Head.parse(name) for name in earlier.get("carriers", [])]
        row.describe["carriers"] = list(earlier.get("carriers", []))

    row = Row(f"heads:{task.capability}", "carried_logit_diff", True, _mean, b, run,
              {"what": f"logit difference moved from corrupt to clean by BASE's carrier heads of {task.capability} "
                       f"(attribution effect interval above 0), first order, per pair", "source": b.source},
              fingerprint=task.fingerprint, restore=restore)
    return row


def lm_row(tokens: Tokens, batch_size: int) -> Row:
    def run(hm: HeadModel) -> Sums:
        nll, n = lm_items(hm, tokens, batch_size)
        return {"nll": nll, "n": n}

    return Row("lm", "perplexity", False, _perplexity, tokens, run,
               {"what": "perplexity of next-token prediction on held-out passages (exp of the mean NLL over counted "
                        "positions)", "source": tokens.source, "passages": len(tokens),
                "tokens": tokens.n_tokens, "max_length": tokens.max_length},
               fingerprint=ids_sha256(tokens.ids))


def fidelity_row(tokens: Tokens, batch_size: int) -> Row:
    """Cosine between each passage's mean-pooled final hidden states in OTHER and in BASE (BASE's own is 1)."""
    row = Row("fidelity", "cosine", True, _mean, tokens, lambda hm: {},
              {"what": "cosine of each passage's mean-pooled final hidden states to BASE's (BASE: 1)",
               "source": tokens.source, "passages": len(tokens)}, fingerprint=ids_sha256(tokens.ids), reusable=False)
    pooled: dict[str, torch.Tensor] = {}

    def run(hm: HeadModel) -> Sums:
        got = fidelity_items(hm, tokens, batch_size)
        ref = pooled.setdefault("base", got)  # the first model measured is BASE
        v = cosine64(got, ref).numpy()
        return {"v": v, "n": np.ones_like(v)}

    row.run = run
    return row


def needle_row(haystacks: list[Haystack], length: int) -> Row:
    def run(hm: HeadModel) -> Sums:
        v = needle_items(hm, haystacks)
        return {"v": v, "n": np.ones_like(v)}

    return Row("retrieval", "needle_token_accuracy", True, _mean, haystacks, run,
               {"what": "share of the needle's answer tokens the model predicts, teacher-forced (roles --long's "
                        "token accuracy)", "length": length, "haystacks": len(haystacks),
                "depths": [h.depth for h in haystacks]},
               fingerprint=ids_sha256([[*h.ids, *h.needle, *h.answer] for h in haystacks]))


def ids_sha256(ids: list[list[int]]) -> str:
    """sha256 of token-id sequences (each one's length, then its ids)."""
    h = hashlib.sha256()
    for seq in ids:
        h.update(np.asarray([len(seq), *seq], dtype=np.int64).tobytes())
    return h.hexdigest()


def default_tasks(hm: HeadModel) -> tuple[str, ...]:
    return DECODER_TASKS if hm.causal else ENCODER_TASKS


def _refuse_family(task: str, hm: HeadModel) -> None:
    fits = DECODER_TASKS if hm.causal else ENCODER_TASKS
    if task not in fits:
        kind = "a decoder" if hm.causal else "an encoder"
        raise HeadscopeError(f"row {task!r} does not apply to {hm.name}, {kind}; its rows: {', '.join(fits)}")


def _haystacks(hm: HeadModel, opts: CompareOptions) -> list[Haystack]:
    if hm.max_positions is not None and opts.long > hm.max_positions:
        raise OptionError("long", f"is {opts.long}: the retrieval row's haystacks of {opts.long} tokens exceed "
                                  f"{hm.name}'s {hm.max_positions} positions; give {hm.max_positions} or less")
    sents = gum_sentences()
    return [build_haystack(hm.tokenizer, opts.long, DEPTHS[i % len(DEPTHS)], i, opts.seed, sents)
            for i in range(opts.haystacks)]


def prepare_rows(hm: HeadModel, opts: CompareOptions, data: Any = None, *, cached: bool = False,
                 lenient: bool = False) -> tuple[list[Row], list[str]]:
    """Every row the options ask for, with its items, and notes on default rows left out (a built-in task the
    tokenizer cannot hold). A row asked for by name that cannot be measured is refused (one line), unless `lenient`
    (a verb's check: its rows are a wish list, each left out with a note where the model cannot do it). `cached`:
    OTHER decodes through a head-aware cache (the heads rows are left out)."""
    asked = bool(opts.tasks) and not lenient
    tasks = opts.tasks or default_tasks(hm)
    rows: list[Row] = []
    notes: list[str] = []
    # files first: a bad file is the user's to fix, whatever else runs
    for path in opts.pairs:
        read_pairs(path)
    for task in tasks:
        if asked:
            _refuse_family(task, hm)
        elif task not in default_tasks(hm):
            continue
        if task == "heads":  # added below, one per pair row
            continue
        try:
            rows.append(_row(task, hm, opts, data))
        except HeadscopeError as e:
            if asked:
                raise
            notes.append(f"{task}: left out ({e})")
    for path in opts.pairs:
        check_lm_head(hm, f"pairs:{Path(path).stem}")
        b = tokenize_pairs(hm.tokenizer, read_pairs(path)[:opts.items], hm.causal, str(path),
                           pad_id=getattr(hm.tokenizer, "pad_token_id", None) or 0)
        rows.append(_pair_row(f"pairs:{Path(path).stem}", b, opts.batch_size, "logit(answer) - logit(wrong) on the "
                                                                               "clean texts of a pairs file"))
    if "heads" in tasks:
        if cached:
            notes.append("heads: left out (attribution patching and the role census through a head-aware cache are "
                         "not measured)")
        else:
            pair_rows = [r for r in rows if isinstance(r.items, PairBatch)]
            rows += [carriers_row(r, opts.batch_size, opts.intervals()) for r in pair_rows]
            rows += _census(hm, opts, data, asked, notes)
    if not rows:
        raise HeadscopeError("nothing to compare: no row could be measured (" + "; ".join(notes) + ")")
    return rows, notes


def _census(hm: HeadModel, opts: CompareOptions, data: Any, asked: bool, notes: list[str]) -> list[Row]:
    """The heads rows' role census (`census`): one roles:<role> row per role, on the lm row's passages and
    `items` repeated random sequences. Left out with a note (refused when asked) when they cannot be built."""
    def make(capability: str, metric: str, higher: bool, statistic: Statistic, items: Any, run: Callable[..., Sums],
             describe: dict[str, Any], fingerprint: str, restore: Callable[[dict[str, Any]], None]) -> Row:
        return Row(capability, metric, higher, statistic, items, run, describe, fingerprint=fingerprint,
                   restore=restore)

    try:
        tokens = prepare_tokens(hm, data if data is not None else opts.data, resolve_max_length(hm, opts.max_length),
                                opts.limit)
        return census_rows(hm, tokens, data=data if data is not None else opts.data, limit=opts.limit,
                           sequences=opts.items, seed=opts.seed, batch_size=opts.batch_size, make_row=make)
    except HeadscopeError as e:
        if asked:
            raise
        notes.append(f"heads: the role census left out ({e})")
        return []


def _row(task: str, hm: HeadModel, opts: CompareOptions, data: Any) -> Row:
    if task in ("lm", "fidelity"):
        tokens = prepare_tokens(hm, data if data is not None else opts.data, resolve_max_length(hm, opts.max_length),
                                opts.limit)
        if len(tokens) < 2:
            raise HeadscopeError(f"the {task} row needs at least 2 passages for an interval; {tokens.source} gave "
                                 f"{len(tokens)}")
        return lm_row(tokens, opts.batch_size) if task == "lm" else fidelity_row(tokens, opts.batch_size)
    if task == "retrieval":
        if hm.tokenizer is None or not getattr(hm.tokenizer, "is_fast", False):
            raise HeadscopeError("the retrieval row builds needle haystacks from text: it needs a fast tokenizer")
        return needle_row(_haystacks(hm, opts), opts.long)
    check_lm_head(hm, task)
    what = {"ioi": "indirect-object identification (Wang et al. 2022): logit(IO) - logit(S)",
            "induction": "repeated random tokens: logit(the copied token) - logit(a fresh one)",
            "greater-than": "years (Hanna et al. 2023): logit(a later year) - logit(1701's)",
            "masked": "country of a capital at the mask: logit(answer) - logit(wrong)"}[task]
    b = load_pairs(hm.tokenizer, hm.causal, hm.vocab_size, task=task, seed=opts.seed, limit=opts.items)
    return _pair_row(task, b, opts.batch_size, what)


def check_lm_head(hm: HeadModel, row: str) -> None:
    """A pair row reads logits: refuse (before any forward) a model without a language-model head."""
    if hm.output_embeddings is None:
        raise HeadscopeError(f"row {row} reads logits and {hm.name} ({type(hm.model).__name__}) has no language-model "
                             f"head; load a causal LM or a masked-LM checkpoint")


def check_rows_fit(rows: list[Row]) -> None:
    """Every row holds at least two items: an interval needs them."""
    for r in rows:
        if r.n < 2:
            raise HeadscopeError(f"row {r.capability} holds {r.n} item(s); a paired interval needs at least 2")


__all__ = ["Row", "check_rows_fit", "default_tasks", "prepare_rows"]
