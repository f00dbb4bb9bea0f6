"""A short timed probe of the model on this machine: what every stage's estimate is built from.

It loads the model once, timed (the stages share that model; only a stage that writes a checkpoint and
reads it back pays a load again), runs one batch of the study's passages forward (timed, twice: the first
pass pays one-off costs) and once forward and backward, and times a fixed piece of CPU work that stands
for the stages' bookkeeping (bootstrap intervals, pair tables), so that a busy machine slows every
estimate alike.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ..data import TextSource
from ..data.prepare import batches, pad_id, prepare_tokens
from ..models import load_model
from ..models.adapter import HeadModel

PROBE_PASSAGES = 8
# passages whose mean token length scales the probe's padded batch to the stages' batches
SAMPLE = 64
# The CPU work `cpu_s` times: on an idle core of the machine these constants were fitted on it takes ~0.05 s.
_CPU_N = 200_000


@dataclass(frozen=True)
class Probe:
    """Seconds measured here: a model load, one passage forward (no grad), one passage forward + backward,
    one token of a long forward, and the fixed CPU work."""

    load_s: float
    # per passage of the data's mean length (at most `length` tokens), batched
    fwd_s: float
    train_s: float  # per passage, forward + backward
    cpu_s: float
    length: int
    passages: int

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _cpu_work() -> float:
    """Seconds of a fixed sort-and-resample workload (what bootstraps and pair tables do)."""
    rng = np.random.default_rng(0)
    t = time.perf_counter()
    x = rng.standard_normal(_CPU_N)
    for _ in range(5):
        idx = rng.integers(0, _CPU_N, _CPU_N)
        np.sort(x[idx])
    return time.perf_counter() - t


def probe(model: str, text: TextSource, max_length: int, device: str | None = None,
          batch_size: int = PROBE_PASSAGES, allow_random_weights: bool = False) -> tuple[HeadModel, Probe]:
    """Load `model` and time the passes every estimate is built from; returns the loaded model too."""
    t0 = time.perf_counter()
    # the study's one load: every stage shares this model
    hm = load_model(model, device=device, allow_random_weights=allow_random_weights)
    load_s = time.perf_counter() - t0
    if hm.tokenizer is None:
        return hm, Probe(load_s, 0.0, 0.0, _cpu_work(), max_length, 0)
    toks = prepare_tokens(hm, TextSource(text.texts[:batch_size], text.source), max_length)
    batch = next(batches(toks.ids, len(toks.ids), pad_id=pad_id(hm)))
    # The stages batch passages of similar length (little padding): a passage costs its mean length in tokens,
    # not the probe batch's padded width.
    sample = prepare_tokens(hm, TextSource(text.texts[:SAMPLE], text.source), max_length)
    mean_len = sum(map(len, sample.ids)) / len(sample.ids)
    scale = min(1.0, mean_len / batch.input_ids.shape[1])
    inputs = batch.model_inputs(hm.device if hasattr(hm, "device") else "cpu")
    n = len(toks.ids)
    with torch.no_grad():
        hm.model(**inputs)  # one-off costs (kernels, allocations) paid here, not timed
        t = time.perf_counter()
        hm.model(**inputs)
        fwd = (time.perf_counter() - t) / n * scale
    t = time.perf_counter()
    out = hm.model(**inputs)
    first = out[0] if isinstance(out, tuple) else getattr(out, "logits", None)
    if first is None:
        first = out.last_hidden_state
    first.float().pow(2).mean().backward()
    train = (time.perf_counter() - t) / n * scale
    hm.model.zero_grad(set_to_none=True)
    return hm, Probe(load_s, fwd, train, _cpu_work(), max_length, n)
