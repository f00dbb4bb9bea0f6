"""Coreference heads: CorefUD documents (GUM's `Entity=` annotations) and per-head coreference accuracy.

Clark et al. (2019)'s coreference probe: for each anaphor (a mention whose entity was mentioned
before), a head is right when the word it attends to most, from the anaphor's head word, is the head
word of any earlier mention of the same entity; beside the nearest-mention, same-head-word and
chance baselines. Word-level attention comes from `syntax.stream_word_attention`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data import Sentence, read_conllu
from ..errors import HeadscopeError
from ..heads import Head
from ..uncertainty import Accumulator, PassageSums, ratio
from .syntax import SENTENCE_ROWS, Aligned, align_words, stream_word_attention

log = logging.getLogger(__name__)


# --- CoNLL-U documents and coreference -----------------------------------------------------------
@dataclass
class Mention:
    """A mention inside one sentence: entity id, word span [start, end] (0-based, inclusive), head word."""

    entity: str
    start: int
    end: int
    head: int


@dataclass
class Document:
    """Sentences of one `# newdoc` document and their mentions (per sentence)."""

    doc_id: str
    sentences: list[Sentence]
    mentions: list[list[Mention]]


_BRACKET = re.compile(r"\(([^()]+)\)|\(([^()]+)|([^()]+)\)")


def parse_entity_field(value: str) -> list[tuple[str, str]]:
    """Parse a CorefUD `Entity=` value into events: ('open'|'close'|'single', entity id), in order.

    `(e1-person-...` opens, `e1)` closes, `(e1-...)` is a one-word mention. Discontinuous parts
    (`e1[1/2]`) keep only the entity id.
    """
    events = []
    pos = 0
    for m in _BRACKET.finditer(value):
        if m.start() != pos:
            raise HeadscopeError(f"cannot read Entity={value!r} at character {pos}")
        pos = m.end()
        full, opening, closing = m.groups()
        kind, text = ("single", full) if full else ("open", opening) if opening else ("close", closing)
        eid = text.split("-", 1)[0].split("[", 1)[0].strip()
        if not eid:
            raise HeadscopeError(f"Entity={value!r} has a mention without an entity id")
        events.append((kind, eid))
    if pos != len(value):
        raise HeadscopeError(f"cannot read Entity={value!r} at character {pos}")
    return events


def mention_head(start: int, end: int, heads: Sequence[int]) -> int:
    """The span's syntactic head: its first word whose UD head lies outside the span."""
    for w in range(start, end + 1):
        g = heads[w] - 1
        if not start <= g <= end:
            return w
    return end


def sentence_mentions(sent: Sentence, where: str = "") -> tuple[list[Mention], int]:
    """Mentions of one sentence from its MISC `Entity=` fields, and how many crossed its boundary."""
    open_: dict[str, list[int]] = defaultdict(list)
    mentions, crossing = [], 0
    for w, misc in enumerate(sent.misc):
        for item in misc.split("|"):
            if not item.startswith("Entity="):
                continue
            try:
                events = parse_entity_field(item[len("Entity="):])
            except HeadscopeError as e:
                log.warning("%s word %d: %s; ignoring this field", where or sent.sent_id, w + 1, e)
                continue
            for kind, eid in events:
                if kind == "single":
                    mentions.append(Mention(eid, w, w, w))
                elif kind == "open":
                    open_[eid].append(w)
                elif open_[eid]:
                    s = open_[eid].pop()
                    mentions.append(Mention(eid, s, w, mention_head(s, w, sent.heads)))
                else:
                    crossing += 1  # opened in an earlier sentence
    crossing += sum(len(v) for v in open_.values())  # closes in a later sentence
    mentions.sort(key=lambda m: (m.head, m.start, -m.end))
    return mentions, crossing


def read_documents(path: str | Path) -> tuple[list[Document], dict[str, int]]:
    """Read a CoNLL-U file with `Entity=` coreference into documents (split at `# newdoc`).

    Mentions that cross a sentence boundary are dropped and counted (attention needs both ends in
    one input, and such spans are rare).
    """
    sentences = read_conllu(path)  # a path or a built-in treebank name (`gum-test`)
    docs: list[Document] = []
    counts = {"mentions": 0, "crossing_mentions": 0}
    for i, s in enumerate(sentences):
        d = s.doc_id
        if not docs or docs[-1].doc_id != d:
            docs.append(Document(d, [], []))
        ms, crossing = sentence_mentions(s, f"{path}:{s.sent_id or i + 1}")
        docs[-1].sentences.append(s)
        docs[-1].mentions.append(ms)
        counts["mentions"] += len(ms)
        counts["crossing_mentions"] += crossing
    if counts["mentions"] == 0:
        raise HeadscopeError(f"{path} has no Entity= mentions in its MISC column; coreference needs a "
                             f"CorefUD-style file such as UD English-GUM")
    return docs, counts


@dataclass
class CorefItem:
    """One model input (a window of sentences) and the anaphors scored in it (word positions)."""

    aligned: Aligned
    anaphors: list[int]  # word index of each anaphor's head
    # per anaphor: candidate head-word positions (preceding mentions)
    candidates: list[list[int]]
    correct: list[list[bool]]  # per anaphor and candidate: coreferent?
    # per anaphor: index into candidates picked by the nearest-mention baseline
    nearest: list[int]
    same_head: list[int]  # per anaphor: index picked by the same-head-word baseline


def coref_items(docs: Sequence[Document], tokenizer: Any, max_length: int, max_context: int = 3,
                min_candidates: int = 2) -> tuple[list[CorefItem], dict[str, int]]:
    """Windows (a sentence plus up to `max_context` earlier sentences of its document that fit in
    `max_length` tokens) and the anaphors of the window's last sentence whose antecedent is in it.

    An anaphor is a mention with an earlier coreferent mention in the window; candidates are the
    head words of all mentions whose head precedes the anaphor's head; anaphors with fewer than
    `min_candidates` candidates are left out (the choice would be trivial).
    """
    items: list[CorefItem] = []
    counts: Counter[str] = Counter()
    for doc in docs:
        for i in range(len(doc.sentences)):
            if not doc.mentions[i]:
                continue
            best = None
            for j in range(i, max(-1, i - max_context - 1), -1):
                words: list[str] = []
                space: list[bool] = []
                offs: list[int] = []
                for s in doc.sentences[j:i + 1]:
                    offs.append(len(words))
                    words += s.words
                    space += s.space_after or [True] * len(s.words)
                aligned = align_words(tokenizer, words, space)
                if len(aligned.ids) > max_length:
                    break
                best = (j, aligned, offs)
            if best is None:
                counts["skipped_long"] += 1
                continue
            j, aligned, offs = best
            mentions = [(m.entity, offs[k] + m.head) for k, sent in enumerate(range(j, i + 1))
                        for m in doc.mentions[sent]]
            last = offs[-1]
            words_lc = [w.lower() for s in doc.sentences[j:i + 1] for w in s.words]
            aligned_words = set(aligned.word_of) - {-1}
            item = CorefItem(aligned, [], [], [], [], [])
            for m in doc.mentions[i]:
                a = last + m.head
                if a not in aligned_words:
                    continue
                cand: dict[int, bool] = {}
                for ent, pos in mentions:
                    if pos < a and pos in aligned_words:
                        cand[pos] = cand.get(pos, False) or ent == m.entity
                if not any(cand.values()):
                    continue
                if len(cand) < min_candidates:
                    counts["too_few_candidates"] += 1
                    continue
                pos_list = sorted(cand)
                nearest = len(pos_list) - 1
                same = [k for k, p in enumerate(pos_list) if words_lc[p] == words_lc[a]]
                item.anaphors.append(a)
                item.candidates.append(pos_list)
                item.correct.append([cand[p] for p in pos_list])
                item.nearest.append(nearest)
                item.same_head.append(same[-1] if same else nearest)
                counts["anaphors"] += 1
            if item.anaphors:
                items.append(item)
    return items, dict(counts)


@dataclass
class CorefCounts:
    """Antecedent-selection hits per head `[n_layers, n_heads]` and the baselines' hits."""

    n_layers: int
    n_heads: int
    hits: np.ndarray = field(init=False)
    total: int = 0
    nearest_hits: int = 0
    same_head_hits: int = 0
    chance: float = 0.0
    per_window: Accumulator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.hits = np.zeros((self.n_layers, self.n_heads))

    def track_windows(self, n_windows: int) -> "CorefCounts":
        """Keep each window's hits and anaphors from now on (`window_sums`); returns self."""
        self.per_window = Accumulator(n_windows, max_rows=SENTENCE_ROWS)
        self.per_window.declare("hits", (self.n_layers, self.n_heads))
        self.per_window.declare("hits|count", (self.n_layers, self.n_heads))
        return self

    def window_sums(self) -> PassageSums | None:
        """Per-window hits and anaphors (`hits`, `hits|count`, `[rows, n_layers, n_heads]`), or None."""
        return self.per_window.result() if self.per_window is not None else None

    def add_item(self, layer: int, wattn: np.ndarray, item: CorefItem, row: int | None = None) -> None:
        """Score one window's word attention `[head, word, word]` at `layer` (baselines at layer 0); `row` (the
        window's index) keeps its hits per window too, when tracked."""
        for a, cands, ok, near, same in zip(item.anaphors, item.candidates, item.correct, item.nearest,
                                            item.same_head, strict=True):
            row_w = np.nan_to_num(wattn[:, a, cands], nan=-np.inf)  # [head, candidate]
            pick = row_w.argmax(-1)
            hit = np.asarray(ok, float)[pick]
            self.hits[layer] += hit
            if self.per_window is not None and row is not None:
                self.per_window.add("hits", [row], hit[None], (layer,))
                self.per_window.add("hits|count", [row], np.ones((1, self.n_heads)), (layer,))
            if layer == 0:
                self.total += 1
                self.nearest_hits += ok[near]
                self.same_head_hits += ok[same]
                self.chance += sum(ok) / len(ok)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able accuracies and baselines."""
        n = max(self.total, 1)
        acc = self.hits / n if self.total else np.full_like(self.hits, np.nan)
        li, hi = np.unravel_index(int(np.nanargmax(acc)), acc.shape) if self.total else (0, 0)
        return {"anaphors": self.total, "accuracy": acc.tolist(),
                "best_head": Head(int(li), int(hi)).name, "best_accuracy": float(acc[li, hi]),
                "nearest_mention_baseline": self.nearest_hits / n if self.total else float("nan"),
                "same_head_word_baseline": self.same_head_hits / n if self.total else float("nan"),
                "chance": self.chance / n if self.total else float("nan")}



# The antecedent accuracy as a statistic of per-window sums (`CorefCounts.window_sums`).
COREF_ACCURACY = ratio("hits", "hits|count")


def coreference_accuracy(hm: Any, docs: Sequence[Document], max_length: int, batch_size: int = 16, pad_id: int = 0,
                         max_context: int = 3, progress: Any = None) -> tuple[CorefCounts, dict[str, int]]:
    """Per-head antecedent-selection accuracy of `hm` on coreference `docs` (streamed)."""
    if hm.tokenizer is None:
        raise HeadscopeError("coreference accuracy needs the model's tokenizer to align words to tokens")
    items, info = coref_items(docs, hm.tokenizer, max_length, max_context)
    if info.get("skipped_long"):
        log.warning("%d sentence(s) longer than %d tokens were skipped for coreference",
                    info["skipped_long"], max_length)
    counts = CorefCounts(hm.n_layers, hm.n_heads)
    if not items:
        return counts, info
    counts.track_windows(len(items))

    def fn(layer: int, idx: int, w: np.ndarray) -> None:
        counts.add_item(layer, w, items[idx], row=idx)

    if progress is not None and hasattr(progress, "refresh"):
        # known only now: windows are built from the documents first
        progress.total = len(items)
        progress.refresh()

    stream_word_attention(hm, [it.aligned for it in items], batch_size, fn, pad_id, progress)
    return counts, info
