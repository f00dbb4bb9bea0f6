"""Every file a verb writes into its output directory: name, producing verb(s), and its columns or keys.

This module is the one place output names are spelled. The verbs build their OUTPUTS lists and write
through these declarations; the report finds files and reads columns by the names declared here, and
says so (naming the file and the missing columns) when a file lacks them, instead of guessing.
`tests/test_artifacts.py` runs every verb and checks its real output against these declarations, so
they cannot drift.

A field is a CSV column (in the order the writer writes it) or a top-level key of a JSON or .npz
file. `when` says what makes a writer add an optional field ("" = always written). A name with
`<...>` declares a family of fields, e.g. `importance_<method>`: one column per chosen method.
"""

from __future__ import annotations

from ..errors import HeadscopeError, did_you_mean
from ..stats import STATISTICS
from .circuits import CIRCUIT_JSON, COMPARE_CSV, COMPARE_ITEMS_NPZ, COMPARE_JSON, EDGES_CSV
from .schema import BOUNDS, KINDS, PROVENANCE, Artifact, Field, bound_of, write_csv

__all__ = [
    "ARTIFACTS", "BOUNDS", "KINDS", "Artifact", "Field", "PROVENANCE_FILES", "artifact", "bound_of", "outputs",
    "producers", "provenance_file", "write_csv",
    "HEADS_CSV", "HEADS_JSON", "ROLES_CSV", "KV_JSON", "ROLES_JSON", "SYNTAX_CSV", "SIMILAR_PAIRS_CSV",
    "SIMILARITY_NPZ", "CLUSTERS_JSON",
    "IMPORTANCE_CSV", "IMPORTANCE_JSON", "RANK_CORRELATION_CSV", "PRUNE_CURVE_CSV", "PRUNE_CURVE_PNG",
    "REDUNDANCY_CSV", "PRUNE_JSON", "UNIT_CURVE_CSV", "UNIT_CURVE_PNG", "UNITS_JSON", "UNIT_IMPORTANCE_CSV",
    "UNIT_IMPORTANCE_JSON", "TASKS_CSV", "TASK_CORRELATION_CSV", "TASK_SPECIFIC_CSV", "TASKS_JSON", "MODEL_DIR",
    "KV_CSV", "SWEEP_CSV", "SWEEP_RUNS", "SWEEP_QUALITY_PNG",
    "SWEEP_SPEED_PNG", "GQA_JSON", "MLA_JSON", "KVCACHE_CSV", "KVCACHE_JSON", "REPORT_HTML", "SIMILARITY_MATRICES",
    "STUDY_JSON", "PATCHING_CSV", "PATCHING_POSITIONS_CSV", "PATCHING_JSON", "COMPOSITION_NPZ", "COMPARE_CSV",
    "COMPARE_JSON", "COMPARE_ITEMS_NPZ", "EDGES_CSV", "CIRCUIT_JSON",
]

def _f(name: str, meaning: str = "", when: str = "") -> Field:
    return Field(name, meaning, when)


_HEAD_KEYS = (_f("layer", "layer index, from 0"), _f("head", "head index within the layer, from 0"))
_ROLES = "roles"  # the verb that writes the role columns
_PROVENANCE = PROVENANCE
# Keys every run writes since intervals were recorded: optional so that older files still read.
_SINCE_INTERVALS = "every run (absent from files written before headscope recorded intervals)"
_TABLE_JSON = (_f("n_layers"), _f("n_heads"),
               _f("meta", "model, data, settings and versions behind the numbers; meta.provenance: see "
                          "headscope.provenance"),
               _f("columns", "column names"), _f("rows", "one object per head: layer, head, then the columns"))

_STATS = (*_HEAD_KEYS, *(_f(k, v) for k, v in STATISTICS.items()))
HEADS_CSV = Artifact("heads.csv", "csv", {"analyze": ""}, "per-head attention statistics (one row per head), each "
                     "followed by its confidence interval's bounds", _STATS, bounds=True)
# roles writes its own table (analyze's statistics on its passages, then the role columns) so that it
# never replaces analyze's heads.csv beside heads.json; roles.json holds its metadata and provenance.
ROLES_CSV = Artifact(
    "roles.csv", "csv", {"roles": ""}, "heads.csv's statistics on the roles passages, then every role column",
    (*_STATS,
     _f("roles", "roles whose rule passes on the score's conservative confidence bound (';'-separated)", _ROLES),
     _f("uncertain_roles", "roles whose point estimate passes but whose bound does not (';'-separated)", _ROLES),
     _f("offset_<offset>_mass", "weight on the token at a fixed offset (m3 = three back, p2 = two ahead)", _ROLES),
     _f("sink_mass", "weight on the sink: the first token, or the special token the model rests on", _ROLES),
     _f("delimiter_mass", "weight on delimiter tokens ([SEP], periods, commas)", _ROLES),
     _f("rare_word_mass", "weight on the passage's rarest words", _ROLES),
     _f("uniform_distance", "mean distance a uniform head would have: the baseline of mean_distance", _ROLES),
     _f("induction_score", "weight on the token after the earlier copy of the current token (repeated text)", _ROLES),
     _f("duplicate_score", "weight on earlier copies of the current token (repeated text)", _ROLES),
     _f("syntax_<relation>", "accuracy of the head at finding this dependency relation's other word",
        "roles --treebank"),
     _f("coref_accuracy", "how often the head's strongest antecedent is the gold one", "roles --coref"),
     _f("retrieval_score", "Wu et al. 2024's needle-copy score at --long tokens (docs/long_context.md)",
        "roles --long"),
     _f("streaming_share", "weight on sink + recent window at --long tokens (DuoAttention's split)", "roles --long"),
     _f("echo_far", "weight on earlier copies of the current token at least 256 tokens back", "roles --long"),
     _f("induction_far", "weight on the tokens after such copies (induction at long range)", "roles --long")),
    bounds=True)
HEADS_JSON = Artifact("heads.json", "json", {"analyze": ""}, "heads.csv with its metadata", _TABLE_JSON)
ROLES_JSON = Artifact(
    "roles.json", "json", {"roles": ""}, "every role score, its baseline and threshold, and the census",
    (_f("model"), _f("n_layers"), _f("n_heads"), _f("causal"), _f("thresholds", "the decision rule of each role"),
     _f("text", "the passages scored"), _f("induction", "the repeated random sequences of the induction test"),
     _f("scores", "score name -> [layer][head] matrix"),
     _f("baselines", "baseline name -> [layer][head] matrix: score X's is X_uniform, X_baseline, or "
                     "uniform_distance for mean_distance"),
     _f("intervals", "level, B, method and seed of every interval (bootstrap over passages / sequences)",
        _SINCE_INTERVALS),
     _f("score_intervals", "score or baseline name -> {lo, hi: [layer][head] matrices, rows resampled}",
        _SINCE_INTERVALS),
     _f("held_share", "role -> [layer][head] share of bootstrap resamples in which the head passes the rule",
        _SINCE_INTERVALS),
     _f("decided_on", "role -> 'bound' (its conservative confidence bound) or 'estimate' (no interval)",
        _SINCE_INTERVALS),
     _f("roles", "L3H7 -> the roles the head holds"),
     _f("uncertain", "L3H7 -> roles whose point estimate passes but whose bound does not", _SINCE_INTERVALS),
     _f("uncertain_heads", "how many heads hold an uncertain role", _SINCE_INTERVALS),
     _f("census", "role -> [{head, score, baseline, lo, hi, held_share}], best first"),
     _f("stability", "score -> split-half stability of its ranking over heads", _SINCE_INTERVALS),
     _f("syntax", "per relation: accuracies and the best fixed-offset baseline (null without --treebank)"),
     _f("coreference", "antecedent accuracies and baselines (null without --coref)"),
     _f("long_context", "long-range scores, baselines, census, needle haystacks and text windows", "roles --long"),
     _PROVENANCE))
SYNTAX_CSV = Artifact(
    "syntax.csv", "csv", {"roles": "--treebank"}, "dependency-relation accuracy of every head, then each "
    "relation's best fixed-offset baseline",
    (_f("kind", "'head' (one head's row) or 'offset_baseline' (the relation's best fixed offset)"),
     _f("layer"), _f("head"), _f("relation", "Universal Dependencies relation"),
     _f("count", "arcs of this relation scored"), _f("dep_to_head", "accuracy from the dependent to its head word"),
     _f("head_to_dep", "accuracy from the head word to its dependent"),
     _f("accuracy", "the better direction's accuracy (with its interval over sentences on head rows)"),
     _f("baseline_offset", "offset of the baseline row (empty on head rows)")), bounds=True)
SIMILAR_PAIRS_CSV = Artifact(
    "similar_pairs.csv", "csv", {"similar": ""}, "one row per pair of heads, most similar (lowest js) first; the "
    "--top pairs' js has its interval over passages (js_lo, js_hi; empty for the others)",
    (_f("head_a", "a head, written L3H7"), _f("head_b", "the other head"),
     _f("js", "Jensen-Shannon divergence of their attention on the same tokens, nats (0 = same)"),
     _f("cka", "linear CKA of their outputs (1 = same up to rotation and scale)"),
     _f("ov_angle_cos", "mean cosine of the principal angles between their OV subspaces"),
     _f("qk_angle_cos", "mean cosine of the principal angles between their QK subspaces"),
     _f("cka_z", "cka against its permutation baseline, in standard deviations"),
     _f("ov_read_cos", "OV read subspaces' cosine"), _f("ov_write_cos", "OV write subspaces' cosine"),
     _f("qk_query_cos", "QK query subspaces' cosine"), _f("qk_key_cos", "QK key subspaces' cosine"),
     _f("same_layer", "1 when both heads are in one layer")), bounds=True)
SIMILARITY_MATRICES = ("js", "cka", "cka_z", "ov_write_cos", "ov_read_cos", "qk_query_cos", "qk_key_cos",
                       "ov_angle_cos", "qk_angle_cos")
SIMILARITY_NPZ = Artifact(
    "similarity.npz", "npz", {"similar": ""}, "the full head x head similarity matrices",
    (_f("heads", "head names in layer order, the matrices' row and column order"), _f("n_layers"), _f("n_heads"),
     _f("meta", "JSON text: model, data and settings"),
     *(_f(m, f"[heads, heads] matrix of {m} (see similar_pairs.csv)") for m in SIMILARITY_MATRICES)))
CLUSTERS_JSON = Artifact(
    "clusters.json", "json", {"similar": ""}, "near-duplicate clusters of heads",
    (_f("js_max", "every pair in a cluster has js <= this"), _f("cka_min", "every pair in a cluster has cka >= this"),
     _f("rule"), _f("clusters", "[{heads, size, max_js, mean_js, min_cka, mean_cka}]"), _f("meta"),
     _f("intervals", "level, B, method, seed of the --top pairs' js intervals", _SINCE_INTERVALS), _PROVENANCE))
IMPORTANCE_CSV = Artifact(
    "importance.csv", "csv", {"score": ""}, "importance of every head by each criterion (higher = more important), "
    "each followed by its confidence interval's bounds",
    (*_HEAD_KEYS, _f("importance_<method>", "importance by this criterion (higher = more important; NaN = pruned)")),
    bounds=True)
IMPORTANCE_JSON = Artifact("importance.json", "json", {"score": ""}, "importance.csv with its metadata",
                           _TABLE_JSON)
RANK_CORRELATION_CSV = Artifact(
    "rank_correlation.csv", "csv", {"score": ""}, "Spearman rank correlation between the criteria (a square "
    "matrix: the first column and the header name the criteria)",
    (_f("", "criterion names (the index column)"), _f("<method>", "correlation with this criterion")))
PRUNE_CURVE_CSV = Artifact(
    "prune_curve.csv", "csv", {"prune": ""}, "the metric after each pruning step",
    (_f("step", "pruning step, 0 = unpruned"), _f("fraction_removed", "share of all heads removed"),
     _f("n_removed", "heads removed"), _f("metric", "the metric with those heads gated off"),
     _f("drop", "relative drop of the metric (for lm_loss: perplexity increase)"),
     _f("perplexity", "exp(metric)", "lm_loss metric"),
     _f("metric_recovered", "the metric after recovery training (empty without --recover-steps)"),
     _f("drop_recovered", "drop after recovery training"),
     _f("perplexity_recovered", "exp(metric_recovered)", "lm_loss metric"),
     _f("wordsim353", "Spearman correlation with wordsim353 similarity judgements", "--wordsim"),
     _f("simlex999", "Spearman correlation with simlex999 similarity judgements", "--wordsim"),
     _f("wordsim353_recovered", "wordsim353 after recovery training", "--wordsim-recovered"),
     _f("simlex999_recovered", "simlex999 after recovery training", "--wordsim-recovered"),
     _f("removed", "heads removed at this step, space-separated (L3H7)")), bounds=True)
PRUNE_CURVE_PNG = Artifact("prune_curve.png", "png", {"prune": ""}, "the pruning curve")
REDUNDANCY_CSV = Artifact(
    "redundancy.csv", "csv", {"prune": ""}, "per layer: heads removable within the target drop",
    (_f("layer"), _f("heads", "heads in the layer"), _f("removable", "heads of this layer removable within the drop"),
     _f("removable_recovered", "the same with recovery training", "--recover-steps")))
PRUNE_JSON = Artifact(
    "prune.json", "json", {"prune": ""}, "settings, baseline and the largest fractions within each drop",
    (_f("model"), _f("n_layers"), _f("n_heads"), _f("n_kv_heads"), _f("method", "importance criterion"),
     _f("metric"), _f("higher_is_better"), _f("unit", "head, slice or group"), _f("recover_steps"),
     _f("target_drop"), _f("baseline", "the unpruned metric"), _f("baseline_perplexity", "null unless lm_loss"),
     _f("largest_fraction_within_target", "the largest fraction whose drop's upper bound stays within the target "
                                          "(the point estimate's on a curve without intervals)"),
     _f("heads_removed_within_target", "the heads removed at that fraction"),
     _f("largest_fraction_within_target_recovered", "the same after recovery; null without --recover-steps"),
     _f("within_target_by", "what decided them: the upper bound of the drop's interval, or the point estimate"),
     _f("within", "'1%' -> {fraction_removed, n_removed, metric, drop, drop_lo, drop_hi, confident (the largest "
                  "fraction whose drop's upper bound stays within: fraction_removed, n_removed, drop, drop_lo, "
                  "drop_hi), next_step (whether the next point differs beyond noise), recovered?}"),
     _f("claims", "'5%' -> the decision on the interval's upper bound (after recovery when it ran): level, "
                  "verdict (can go / cannot tell / none / no interval), fraction, count, drop, lo, hi, the point "
                  "estimate's point_fraction, point_count, point_drop, point_lo, point_hi, passages, needed "
                  "(held-out passages that would settle a 'cannot tell'); headscope.redundancy.curves.claims"),
     _f("points"),
     _f("intervals", "level, B, method, seed of every interval (headscope.uncertainty)"),
     _f("data"), _f("heldout"), _f("passages"), _f("heldout_passages"), _f("max_length"), _f("step"),
     _f("fraction"), _f("seed"), _f("recover_lr"),
     _f("target_mode", "whether the curve stopped past --target-drop (a --fraction given too only caps it); the "
                       "saved model is then the point the target's claim names",
        "every run (absent from files written before --fraction capped a target run)"),
     _f("uniform", "whether every layer lost the same heads' worth (--uniform: one shape, a plain config)"),
     _f("learned", "{l0: the gate training's settings and record, open_probability: [L][H] P(gate open)}; no "
                   "interval (learned over all passages)", "--method l0"),
     _f("saved_model", "{path, parameters, parameters_original, plain_config, heads_kept, recovered_weights}",
        "--save-model"),
     _PROVENANCE))
# Units beyond heads: `prune --unit attention|block|ffn|mix` and `score --unit attention|block|ffn` write these
# files instead of the head files, so they are declared under those modes (outputs("prune --unit")), not
# as files every prune or score run writes.
_UNIT = ""
UNIT_CURVE_CSV = Artifact(
    "unit_curve.csv", "csv", {"prune --unit": _UNIT}, "the metric against the share of parameters removed, for units "
    "beyond heads (attention sub-layers, blocks, FFN neurons, a mix); written instead of prune_curve.csv",
    (_f("step", "point, 0 = unpruned"), _f("unit", "attention, block, ffn or mix"),
     _f("fraction_params", "share of all parameters removed"), _f("params_removed"),
     _f("metric", "the metric with those units switched off"),
     _f("drop", "relative drop (lm_loss: perplexity increase)"),
     _f("perplexity", "exp(metric)", "lm_loss metric"),
     _f("metric_recovered", "after distillation recovery (empty without --recover-steps)"), _f("drop_recovered"),
     _f("perplexity_recovered", "exp(metric_recovered)", "lm_loss metric"),
     _f("latency_s", "median seconds of one forward pass of the physically pruned model (empty without --latency)"),
     _f("speedup", "original latency / this latency"), _f("flop_speedup", "original FLOPs / these FLOPs (ideal)"),
     _f("removed", "units removed: A3 = attention of layer 3, B7 = block 7, F2:n = n FFN neurons of layer 2")),
    bounds=True)
UNIT_CURVE_PNG = Artifact("unit_curve.png", "png", {"prune --unit": _UNIT}, "the unit curve (and speedups)")
UNITS_JSON = Artifact(
    "units.json", "json", {"prune --unit": _UNIT},
    "the unit curve's settings, points and the unit scores behind its order",
    (_f("model"), _f("unit"), _f("method"), _f("metric"), _f("higher_is_better"), _f("n_parameters"),
     _f("baseline"), _f("points", "the rows of unit_curve.csv"), _f("scores", "unit kind -> scores (ffn: per layer)"),
     _f("intervals", "level, B, method, seed of every interval (headscope.uncertainty)"),
     _f("data"), _f("heldout"), _f("passages"), _f("heldout_passages"), _f("max_length"), _f("fraction"),
     _f("step"), _f("seed"), _f("recover_steps"), _f("recover_lr"), _f("score_seconds"), _f("n_layers"),
     _f("saved_model", "{path, parameters, parameters_original, plain_config}", "--save-model"), _PROVENANCE))
UNIT_IMPORTANCE_CSV = Artifact(
    "unit_importance.csv", "csv", {"score --unit": ""},
    "importance of every attention sub-layer, block or FFN neuron (higher = more important); written instead "
    "of importance.csv",
    (_f("unit", "attention, block or ffn"), _f("layer"), _f("index", "neuron id (ffn), else 0"),
     _f("importance_<method>", "importance by this criterion (higher = more important)")))
UNIT_IMPORTANCE_JSON = Artifact(
    "unit_importance.json", "json", {"score --unit": ""},
    "settings of unit_importance.csv, the unablated metric and the time each method took",
    (_f("model"), _f("unit"), _f("methods"), _f("metric"), _f("metric_value"), _f("data"), _f("passages"),
     _f("tokens_seen"), _f("seconds", "method -> seconds"), _f("forward_passes", "per batch, for ablation"),
     _PROVENANCE))
UNIT_ARTIFACTS = (UNIT_CURVE_CSV, UNIT_CURVE_PNG, UNITS_JSON, UNIT_IMPORTANCE_CSV, UNIT_IMPORTANCE_JSON)
TASKS_CSV = Artifact(
    "tasks.csv", "csv", {"tasks": ""}, "importance of every head under each task (higher = more important)",
    (*_HEAD_KEYS, _f("importance_<task>", "importance for this task")))
TASK_CORRELATION_CSV = Artifact(
    "task_correlation.csv", "csv", {"tasks": ""}, "task x task Spearman rank correlation of head importance (a "
    "square matrix: the first column and the header name the tasks)",
    (_f("", "task names (the index column)"), _f("<task>", "correlation with this task")))
TASK_SPECIFIC_CSV = Artifact(
    "task_specific.csv", "csv", {"tasks": ""}, "heads in the top 10% for one task and the bottom half for another",
    (_f("task"), _f("other"), _f("head", "L3H7"), _f("layer"), _f("head_id"),
     _f("rank_task", "1 = most important for task"), _f("rank_other"),
     _f("percentile_other", "place in the other task's ranking, 0 = most important, 1 = least")))
TASKS_JSON = Artifact("tasks.json", "json", {"tasks": ""}, "tasks.csv with its metadata (tasks, data, method)",
                      _TABLE_JSON)
TASK_ARTIFACTS = (TASKS_CSV, TASK_CORRELATION_CSV, TASK_SPECIFIC_CSV, TASKS_JSON)
MODEL_DIR = Artifact("model", "dir", {"prune": "--save-model", "gqa": "", "mla": "", "prune --unit": "--save-model"},
                     "a loadable checkpoint of the pruned or converted model")
KV_CSV = Artifact(
    "kv.csv", "csv", {"kv": "--out"}, "KV-cache bytes of the model's layouts and of classic configs",
    (_f("source", "'model' (this model's layouts) or 'classic'"), _f("name"),
     _f("layout", "MHA, GQA or MQA"), _f("is_model", "whether the row is the model's own layout"),
     _f("n_layers"), _f("n_heads", "query heads"), _f("n_kv_heads"), _f("group_size", "query heads per KV head"),
     _f("d_head"), _f("n_sliding_layers", "layers with a sliding window"), _f("dtype", "cache dtype"),
     _f("bytes_per_token", "K and V of every layer for one token"), _f("seq_len"), _f("batch"),
     _f("bytes_per_sequence"), _f("cache_bytes", "the whole batch"), _f("vs_mha", "bytes relative to MHA"),
     _f("note")))
KV_JSON = Artifact("kv.json", "json", {"kv": "--out"}, "kv.csv's provenance: the model (config fingerprint) "
                   "and settings behind it", (_PROVENANCE,))
# headscope kvcache: one row per cache evaluated (the full cache, then per budget the score-chosen
# and the random control). The quality-vs-bytes chart reads kv_bytes_per_token / kv_fraction against
# perplexity and needle_accuracy; rows of other methods (MLA, GQA) can share these column names.
KVCACHE_CSV = Artifact(
    "kvcache.csv", "csv", {"kvcache": ""}, "head-aware KV caches against the full cache: bytes, perplexity, needles",
    (_f("method", "'full' (every KV head full), 'score' (full KV heads chosen by chosen_by), 'random' (the same "
                  "number of full KV heads at random: the control at equal bytes), 'learned' (--choose learned: the "
                  "largest DuoAttention mixing weights, the same number of full KV heads)"),
     _f("chosen_by", "the score that chose the full heads (e.g. retrieval_score, or a column of a heads/roles "
                     "file; duo_alpha for learned); empty for full and random"),
     _f("budget", "asked share of KV heads kept full, in (0, 1] (1 for full)"),
     _f("kv_fraction", "share of KV heads kept full as done (bytes per token relative to the full cache)"),
     _f("full_kv_heads", "KV heads kept full, all layers"), _f("windowed_kv_heads", "KV heads freed: sink + window"),
     _f("windowed_query_heads", "query heads reading a windowed KV head"),
     _f("sink", "tokens at the start every windowed head keeps"),
     _f("window", "recent tokens every windowed head keeps, the current one included"),
     _f("context", "tokens per passage (perplexity) and per needle prompt"), _f("dtype", "cache dtype"),
     _f("kv_bytes_per_token", "bytes one more token costs once windows are full: 2 x d_head x bytes x full KV heads"),
     _f("kv_bytes_formula", "K and V bytes one decoding step reads at `context` tokens, by the formula"),
     _f("kv_bytes_measured", "the same, measured from the tensors the cache handed to attention"),
     _f("kv_ratio", "kv_bytes_measured relative to the full cache's"),
     _f("perplexity", "on the long text, every position predicted through this cache"),
     _f("ppl_tokens", "predictions perplexity averages over"),
     _f("needle_accuracy", "share of needle prompts whose generated answer holds the needle (exact binomial "
                           "interval: Clopper-Pearson)"),
     _f("needles", "needle prompts asked"), _f("uptrain_steps", "training steps after windowing (0: none)"),
     _f("seed", "seed of the random choice and of the needle set"),
     _f("ppl_vs_random", "score rows: perplexity minus the random control's at the same budget, on the same "
                         "passages (paired interval over passages; below 0 = the chosen heads predict better)",
        "a score row with its random control")), bounds=True)
KVCACHE_JSON = Artifact(
    "kvcache.json", "json", {"kvcache": ""}, "kvcache.csv's settings, each cache's full KV heads, answers, provenance",
    (_f("model"), _f("n_layers"), _f("n_heads"), _f("n_kv_heads"), _f("d_head"),
     _f("settings", "sink, window, context, budgets, score source, data, needle settings"),
     _f("rows", "kvcache.csv's rows, each with `full_heads` (per layer, the KV heads kept full), needle answers, "
                "per-passage NLL and, on score rows, `vs_random` (the paired difference, its interval and verdict)"),
     _f("scores", "[layer][head] the score that chose the full heads (as used: '-COLUMN' negated)"),
     _PROVENANCE))
SWEEP_CSV = Artifact(
    "sweep.csv", "csv", {"sweep": ""}, "one row per trained configuration",
    (_f("task", "ptb, xor or pair"), _f("d_model"), _f("n_layers"), _f("n_heads", "query heads"),
     _f("n_kv_heads"), _f("d_head"), _f("layout", "MHA, GQA or MQA"), _f("steps"), _f("seq"), _f("batch"),
     _f("lr", "peak learning rate"), _f("init_std", "empty: GPT-2 init"), _f("seed"),
     _f("train_tokens", "tokens read in training"), _f("params"), _f("params_non_embedding"),
     _f("flops_per_token", "forward FLOPs per token"), _f("train_flops_per_token", "3 x forward"),
     _f("kv_bytes_per_token"), _f("kv_dtype"), _f("val_loss", "validation loss, nats per target"),
     _f("val_ppl", "exp(val_loss)"), _f("val_bits_per_token", "val_loss / ln 2 (lower is better)"),
     _f("val_word_ppl", "PTB word perplexity (empty for synthetic tasks)"),
     _f("val_acc", "validation accuracy (the synthetic tasks' score; xor: every input)"),
     _f("train_loss", "mean of the last 20 training losses"), _f("tokens_per_s", "training tokens per wall second"),
     _f("tokens_per_cpu_s", "training tokens per CPU second"), _f("train_s"), _f("train_cpu_s"), _f("wall_s"),
     _f("threads"), _f("data", "fingerprint of the data"), _f("key", "the configuration's runs/<key>.json")))
SWEEP_RUNS = Artifact("runs", "dir", {"sweep": ""}, "runs/<key>.json: each configuration's row, config and loss curve")
SWEEP_QUALITY_PNG = Artifact("sweep_quality.png", "png", {"sweep": ""}, "quality against the number of heads")
SWEEP_SPEED_PNG = Artifact("sweep_speed.png", "png", {"sweep": ""}, "training speed against the number of heads")
_SEARCH = "--grouping search"
_SIM = "--grouping similarity"
GQA_JSON = Artifact(
    "gqa.json", "json", {"gqa": ""}, "perplexity before / after conversion / after uptraining, KV bytes",
    (_f("model"), _f("model_type"), _f("n_layers"), _f("n_heads"), _f("n_kv_heads_before"), _f("n_kv_heads_after"),
     _f("grouping", "as asked"), _f("data"), _f("data_passages"), _f("heldout"), _f("heldout_passages"),
     _f("max_length"), _f("grouping_used", "as done (similarity may fall back to mean)"),
     _f("groups", "per layer, the old KV heads pooled into each new one"),
     _f("similarity_on", "'data' or 'weights': what the KV heads were compared on", _SIM),
     _f("pooling_error_adjacent", "summed within-group KV distance of adjacent groups", _SIM),
     _f("pooling_error_similarity", "the same for the similarity groups", _SIM),
     _f("layers_regrouped", "layers whose similarity groups differ from adjacent ones", _SIM),
     _f("search_candidates", "", _SEARCH), _f("search_seed", "", _SEARCH),
     _f("search_skipped", "why no search was needed", _SEARCH), _f("search_start", "", _SEARCH),
     _f("calibration_kl_adjacent", "KL from the original on --data with adjacent groups", f"{_SIM} or {_SEARCH}"),
     _f("calibration_kl_similarity", "the same with similarity groups", f"{_SIM} or {_SEARCH}"),
     _f("calibration_kl_start", "", _SEARCH), _f("calibration_kl_search", "", _SEARCH),
     _f("search_trace", "per layer: the chosen candidate and every candidate's KL", _SEARCH),
     _f("layers_changed_by_search", "", _SEARCH), _f("kl_evaluations", "", _SEARCH),
     _f("calibration_batches", "", _SEARCH), _f("search_seconds", "", _SEARCH),
     _f("heldout_tokens"), _f("ppl_before"), _f("ppl_after"), _f("kl_after", "KL to the original, nats/token"),
     _f("ppl_uptrained", "null without --steps"), _f("kl_uptrained", "null without --steps"),
     _f("uptrain", "uptraining settings and losses", "--steps"),
     _f("kv_bytes_before", "{measured, calculated, seq_len, batch, dtype, match}"), _f("kv_bytes_after"),
     _PROVENANCE))
MLA_JSON = Artifact(
    "mla.json", "json", {"mla": ""},
    "MHA/GQA -> MLA: perplexity before / after conversion / after uptraining, KV bytes",
    (_f("model"), _f("model_type"), _f("n_layers"), _f("n_heads"), _f("n_kv_heads"), _f("d_head"), _f("d_model"),
     _f("kv_rank", "latent width per token and layer"), _f("full_rank", "the rank that loses nothing"),
     _f("rope_dims", "key dimensions per KV head that keep RoPE"), _f("selection", "2-norm or high"),
     _f("frequencies", "per layer, the kept rotary frequencies of each KV head"),
     _f("data"), _f("data_passages"), _f("heldout"), _f("heldout_passages"), _f("max_length"),
     _f("heldout_tokens"), _f("ppl_before"), _f("ppl_after"), _f("kl_after", "KL to the original, nats/token"),
     _f("ppl_uptrained", "null without --steps"), _f("kl_uptrained", "null without --steps"),
     _f("uptrain", "uptraining settings and losses", "--steps"),
     _f("kv_bytes_before", "{measured, calculated, bytes_per_token, formula, seq_len, batch, dtype, match}"),
     _f("kv_bytes_after"), _f("kv_bytes_per_token_before"), _f("kv_bytes_per_token_after"),
     _f("kv_fraction", "cache bytes after / before"), _PROVENANCE))
REPORT_HTML = Artifact("report.html", "html", {"report": ""}, "the offline report page")
STUDY_JSON = Artifact(
    "study.json", "json", {"study": ""}, "what `headscope study` planned, ran, reused and left out, and its answers",
    (_f("format"), _f("model", "name, type, shape and weights fingerprint"), _f("data", "the texts' sha256"),
     _f("budget_s", "the budget in seconds"), _f("tolerance_s", "how far past the budget the study may end"),
     _f("probe", "the timed passes every estimate is built from"),
     _f("stages", "per stage: status (done, left out, not supported), command, size, estimate, seconds, files"),
     _f("answers", "the three paragraphs, one per question"), _f("elapsed_s", "wall time of the last run")))

# headscope patch (issue 33); `headscope view` reads patching.csv when present (layer, head, effect and its bounds).
_EXACT = "--method with exact (the default)"
_ATTR = "--method with attribution (the default)"
PATCHING_CSV = Artifact(
    "patching.csv", "csv", {"patch": ""}, "activation patching: each head's causal effect on the metric, each "
    "followed by its bootstrap interval over pairs",
    (*_HEAD_KEYS,
     _f("effect", "(M(corrupt, head patched) - M(corrupt)) / (M(clean) - M(corrupt)), mean over pairs (1 = the "
                  "head alone restores the clean metric); noising: (M(clean, head's corrupt output) - M(clean)) / "
                  "(M(clean) - M(corrupt))", _EXACT),
     _f("attribution", "the first-order estimate of effect: (z_source - z_base) . dM/dz on the base run, in the "
                       "same normalisation", _ATTR),
     _f("dla", "direct logit attribution: the head's write at the metric position through the final norm (scale "
               "frozen) onto logit(answer) - logit(wrong), clean run, mean over pairs (empty where the model has "
               "no such path: encoders, sandwich-normed families)",
        "every run of headscope patch (optional so that a patching.csv made elsewhere with effect alone still reads)")),
    bounds=True)
PATCHING_POSITIONS_CSV = Artifact(
    "patching_positions.csv", "csv", {"patch": "--positions each"}, "activation patching one position at a time: "
    "each head's effect at each token position", (*_HEAD_KEYS, _f("position", "token position, from 0"),
                                                  _f("effect", "as patching.csv's, patching that position only")),
    bounds=True)
PATCHING_JSON = Artifact(
    "patching.json", "json", {"patch": ""}, "patching.csv's run: metric, M(clean) and M(corrupt) with intervals, "
    "the pairs, exact-vs-attribution agreement, provenance",
    (_f("metric"), _f("direction"), _f("positions"), _f("methods"),
     _f("M_clean", "the metric on the clean texts, mean over pairs, with its interval"),
     _f("M_corrupt", "the metric on the corrupt texts, mean over pairs, with its interval"),
     _f("pairs", "source, count, pairs left out, token counts and the pairs' texts"),
     _f("agreement", "Spearman of exact and attribution effects over heads, and the heads where they differ most",
        "--method exact,attribution (the default)"),
     _f("forwards", "forward passes of the exact scan", _EXACT),
     _f("dla", "what the dla column holds, or why it is empty"),
     _f("composition", "the strongest Q-, K- and V-composition pairs (composition.npz), or why none were computed"),
     _f("paths", "the receivers path patching chose and why, its senders (each head alone, or the set of "
                 "--senders), its forward passes and the strongest paths", "--paths"),
     _f("intervals"), _f("seconds"), _PROVENANCE))

PATHS_CSV = Artifact(
    "paths.csv", "csv", {"patch": "--paths"}, "path patching: the effect of one sender head along one path, to a "
    "later head's queries, keys or values or straight to the logits, each followed by its bootstrap interval over "
    "pairs",
    (_f("sender", "the head whose output is patched, L<layer>H<head>, or the heads patched together (--senders), "
                  "joined by +: L17H4+L20H0"),
     _f("receiver", "L<layer>H<head>, a later head (its KV group for via k and v under GQA/MQA), or logits"),
     _f("via", "q, k or v (the receiver's input the path enters), or direct (to the logits, MLPs included)"),
     _f("effect", "M with only this path patched, normalised as patching.csv's effect (1 = the path alone restores "
                  "the clean metric)")),
    bounds=True)
COMPOSITION_NPZ = Artifact(
    "composition.npz", "npz", {"patch": "models with heads in two layers or more and readable Q/K/V weights"},
    "Q-, K- and V-composition scores (Elhage et al. 2021) between every pair of heads in different layers",
    (_f("q", "[sender layer, sender head, receiver layer, receiver head]: the receiver's queries read the sender's "
             "output; NaN unless the receiver's layer comes later"),
     _f("k", "as q, through the receiver's keys"), _f("v", "as q, through the receiver's values"),
     _f("meta", "model and axis names (JSON text)")))

ARTIFACTS: dict[str, Artifact] = {a.name: a for a in (
    HEADS_CSV, HEADS_JSON, ROLES_CSV, ROLES_JSON, SYNTAX_CSV, SIMILAR_PAIRS_CSV, SIMILARITY_NPZ, CLUSTERS_JSON,
    IMPORTANCE_CSV, IMPORTANCE_JSON, RANK_CORRELATION_CSV, PRUNE_CURVE_CSV, PRUNE_CURVE_PNG, REDUNDANCY_CSV,
    PRUNE_JSON, *UNIT_ARTIFACTS, *TASK_ARTIFACTS, MODEL_DIR, KV_CSV, KV_JSON, SWEEP_CSV, SWEEP_RUNS, SWEEP_QUALITY_PNG,
    SWEEP_SPEED_PNG, GQA_JSON,
    MLA_JSON, KVCACHE_CSV, KVCACHE_JSON, REPORT_HTML, STUDY_JSON, PATCHING_CSV, PATCHING_POSITIONS_CSV,
    PATCHING_JSON, PATHS_CSV, COMPOSITION_NPZ, EDGES_CSV, CIRCUIT_JSON, COMPARE_CSV, COMPARE_JSON,
    COMPARE_ITEMS_NPZ)}


# The JSON file of each verb that carries its provenance (headscope.provenance); CSV files cannot hold
# it, so a CSV's provenance is its verb's JSON in the same folder.
PROVENANCE_FILES: dict[str, str] = {"prune --unit": UNITS_JSON.name, "score --unit": UNIT_IMPORTANCE_JSON.name,
                                    "tasks": TASKS_JSON.name,
                                    "analyze": HEADS_JSON.name, "roles": ROLES_JSON.name, "similar": CLUSTERS_JSON.name,
                                    "score": IMPORTANCE_JSON.name, "prune": PRUNE_JSON.name, "kv": KV_JSON.name,
                                    "gqa": GQA_JSON.name, "mla": MLA_JSON.name,
                                    "kvcache": KVCACHE_JSON.name, "patch": PATCHING_JSON.name,
                                    "circuit": CIRCUIT_JSON.name, "compare": COMPARE_JSON.name}


def provenance_file(name: str) -> str | None:
    """The JSON file (same folder) holding the provenance of output file `name`, or None (sweep, report)."""
    return PROVENANCE_FILES.get(artifact(name).verb)


def artifact(name: str) -> Artifact:
    """The declaration of output file `name`."""
    try:
        return ARTIFACTS[name]
    except KeyError:
        raise HeadscopeError(f"no output file {name!r} is declared{did_you_mean(name, ARTIFACTS)}; "
                             f"declared: {', '.join(ARTIFACTS)}") from None


def outputs(verb: str, optional: bool = False) -> list[str]:
    """Names of the files `verb` writes on every run (and, with `optional`, those some options add),
    in declaration order."""
    names = [a.name for a in ARTIFACTS.values() if verb in a.verbs and (optional or not a.verbs[verb])]
    if not names and not any(verb in a.verbs for a in ARTIFACTS.values()):
        verbs = sorted({v for a in ARTIFACTS.values() for v in a.verbs})
        raise HeadscopeError(f"no verb {verb!r} writes files{did_you_mean(verb, verbs)}; verbs: {', '.join(verbs)}")
    return names


def producers(name: str) -> list[str]:
    """The verbs that write file `name`, first the one to suggest."""
    return list(artifact(name).verbs)
