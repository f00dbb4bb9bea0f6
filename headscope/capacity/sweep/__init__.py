"""Head-count sweeps: train small decoder-only models from scratch at fixed width, vary the heads.

Everything but the attention layout is held fixed (d_model, depth, MLP, optimizer, learning-rate
schedule, training tokens, the exact batches seen, the seed), and each configuration is trained with
`headscope.capacity.mha.MultiHeadAttention` (MHA, GQA or MQA by `n_kv_heads`) through the shared loop
`headscope.train.Trainer`. Three tasks:

- ``ptb``: next-byte language modelling on the Penn Treebank (`headscope.capacity.sweep.corpora`), validation
  loss / bits per byte / perplexity on PTB valid.
- ``xor``: a one-layer attention-only model reads a string of random bits and, at a final query
  token, must output the XOR of the bits at two fixed positions. One head provably cannot: its
  logit difference times its softmax normaliser is a sum of one term per position, so in every
  block of four inputs that differ only in the two bits it gets one wrong; accuracy over all
  inputs is at most 75 %, for any weights and any width (proof in docs/sweep.md). Two heads can
  (an explicit construction is tested), and trained ones reach 100 %. Scored on every input.
- ``pair``: the same kind of model must output the ordered pair ``(x[i-1], x[i-7])`` of the
  tokens at two offsets. The folklore says one head cannot mix two sources; it can (unequal
  weights keep them apart), and a trained single head learns it fully (docs/sweep.md).

Resumable: each finished configuration is written at once to ``runs/<key>.json`` and ``sweep.csv``
is rewritten (atomically) after it; a rerun skips every configuration whose key (a hash of the full
configuration, the seed, the data fingerprint and the sweep code version) already has a result.

Modules: `tasks` (the data of each task), `config` (SweepConfig, keys, the plan), `model` (TinyLM and
its costs), `training` (one configuration through the shared loop, and its evaluation), `run` (the
resumable sweep and sweep.csv), `plots` (the two figures, also drawn by the report).
"""

from __future__ import annotations

from .config import SWEEP_VERSION, SweepConfig, config_key, plan_sweep
from .model import (
    KV_DTYPE,
    Block,
    TinyLM,
    build_model,
    kv_bytes_per_token,
    model_flops_per_token,
)
from .plots import mean_by_heads, plot_sweep, sweep_figure
from .resumable import CSV_COLUMNS, run_sweep
from .tasks import (
    PAIR_OFFSETS,
    PAIR_VOCAB,
    SYNTHETIC_TASKS,
    TASKS,
    XOR_EXHAUSTIVE_BITS,
    XOR_POSITIONS,
    XOR_QUERY,
    pair_batch,
    synthetic_fingerprint,
    xor_all_inputs,
    xor_batch,
)
from .training import evaluate, train_config

__all__ = [
    "CSV_COLUMNS", "KV_DTYPE", "PAIR_OFFSETS", "PAIR_VOCAB", "SWEEP_VERSION", "SYNTHETIC_TASKS", "TASKS",
    "XOR_EXHAUSTIVE_BITS", "XOR_POSITIONS", "XOR_QUERY", "Block", "SweepConfig", "TinyLM", "build_model",
    "config_key", "evaluate", "kv_bytes_per_token", "mean_by_heads", "model_flops_per_token", "pair_batch",
    "plan_sweep", "plot_sweep", "run_sweep", "sweep_figure", "synthetic_fingerprint", "train_config",
    "xor_all_inputs", "xor_batch",
]
