"""MHA -> GQA/MQA conversion of LLaMA-like decoders: group KV heads, mean-pool, uptrain, save.

A model with `n_heads` query heads and `n_kv_heads` key/value heads is turned into one with `G`
KV heads (G divides n_kv_heads). Each new KV head is the mean of the K and V projections (weights
and biases) of the old KV heads in its group (Ainslie et al. 2023, "GQA"). Which old KV heads share a
new one is the *grouping*, one registered function each in `GROUPINGS` (see `groupings`):

- ``mean``: adjacent groups (old heads 0..m-1 -> new 0, m..2m-1 -> new 1, ...), the paper's recipe.
- ``similarity``: groups chosen to minimise the mean-pooling error of the K and V outputs on data
  (or of the K/V weights without data), in equal-size groups.
- ``search``: per layer, the candidate grouping (adjacent, similarity from data and from weights, N
  seeded random ones) with the lowest KL from the original model on calibration data, chosen by one
  greedy pass over the layers.
- ``random``: a seeded random equal split per layer (a baseline).

For every grouping other than adjacent, the query heads (rows of q_proj and the matching columns of
o_proj) are then permuted so every new group's query heads are contiguous, because transformers'
`repeat_kv` maps query head h to KV head h // (n_heads / G).

RoPE needs no special care: keys are rotated *after* projection, by a rotation that is linear and
the same for every head, so mean-pooling the projection weights equals mean-pooling rotated keys.

Modules, lowest first: `convert` (checks, pooling in given groups, permutation, expansion),
`clustering` (K/V distances, balanced partitions), `search` (calibration-KL search), `groupings` (the
registry, `plan_groups`, `convert_to_gqa`), `regroup` (`convert_and_evaluate`). What every conversion
shares lives in `headscope.capacity.convert`: `evaluate` (perplexity / KL through `headscope.eval.lm`,
the KV report), `uptraining` (through `headscope.train.Trainer`), `texts` (default text). Saving is
`headscope.models.checkpoint.save_model`; text is `headscope.data.read_texts`.
"""

from ..convert.evaluate import (
    cache_bytes,
    compare,
    kl_divergence,
    kv_report,
    measure_kv_bytes,
    perplexity,
    token_batches,
)
from ..convert.texts import CALIBRATION_DATA, CALIBRATION_HELDOUT
from ..convert.uptraining import LOSSES, TRAINABLE, UptrainLog, check_uptrain, uptrain, uptrain_loss
from .clustering import (
    MAX_ENUMERATED_PARTITIONS,
    balanced_partition,
    enumerate_partitions,
    kv_distances,
    partition_cost,
    random_balanced_groups,
    similarity_groups,
)
from .convert import (
    SUPPORTED_MODEL_TYPES,
    LayerWeights,
    adjacent_groups,
    check_convertible,
    check_groups,
    expand_kv_heads,
    layer_weights,
    permute_query_heads,
    pool_kv_heads,
    write_layer_weights,
)
from .groupings import GROUPINGS, GroupingOptions, convert_to_gqa, plan_groups
from .regroup import convert_and_evaluate
from .search import search_groups

__all__ = [
    "CALIBRATION_DATA", "CALIBRATION_HELDOUT", "GROUPINGS", "LOSSES", "MAX_ENUMERATED_PARTITIONS",
    "SUPPORTED_MODEL_TYPES",
    "TRAINABLE", "GroupingOptions", "LayerWeights", "UptrainLog", "adjacent_groups", "balanced_partition",
    "cache_bytes", "check_convertible", "check_groups", "check_uptrain", "compare", "convert_and_evaluate",
    "convert_to_gqa", "enumerate_partitions", "expand_kv_heads", "kl_divergence", "kv_distances", "kv_report",
    "layer_weights", "measure_kv_bytes", "partition_cost", "perplexity", "permute_query_heads", "plan_groups",
    "pool_kv_heads", "random_balanced_groups", "search_groups", "similarity_groups", "token_batches", "uptrain",
    "uptrain_loss", "write_layer_weights",
]
