"""The factors of the study's cost model: what each stage's estimate multiplies, where each number came from.

A stage's estimate (`stages.py`, the `_<stage>_cost` functions) counts what its passes do and multiplies the counts
by the probe's units (`probe.Probe`, timed on this machine at the study's start): `fwd_s`, one passage forward of
at most MAX_LENGTH tokens; `train_s`, one passage forward + backward; `cpu_s`, a fixed sort-and-resample workload
(what bootstraps do); `load_s`, one model load. The factors below say how many of those units one counted thing
costs. A study corrects every estimate by the measured/estimated ratio of the stages it has already run (runner,
`CORRECTION_RANGE`), so a factor that is off moves the plan, not the budget.

Where the numbers came from, in three kinds (each constant says which):
- fitted: chosen so a stage's estimate matched its measured time on a timed study on the project machine, in the
  commit named (54bbc45: a MiniLM study; cb20c9b and d119f2d: SmolLM2 studies);
- counted: a count of passes read off the code (e.g. full, by-score and random caches: 3);
- set by hand when the stage was written (commit 112cbeb) and never refitted: its error is what the correction
  absorbs.
"""

from __future__ import annotations

# --- shared ------------------------------------------------------------------------------------------------------
# The heads of MiniLM (6 layers x 12 heads), where the per-head CPU work (bootstrap intervals per statistic or
# criterion and head) was fitted: a model's share of that work is its heads over these.
FITTED_HEADS = 72

# --- analyze (fitted, 54bbc45) -------------------------------------------------------------------------------------
# Passage forwards per passage: eager attention with the statistics kernel reading every head's pattern costs a
# little less than the probe's (sdpa) forward on MiniLM's passages.
ANALYZE_FWD = 0.9
# CPU units: a fixed part (tables, files) and, per passage and FITTED_HEADS heads, the bootstrap of every statistic.
ANALYZE_CPU_FIXED, ANALYZE_CPU_PER_PASSAGE = 2.0, 0.05

# --- roles (fitted, 54bbc45; the long pass set by hand, 112cbeb) -----------------------------------------------
# Passage forwards every size pays: the 32 induction sequences of 48 tokens.
ROLES_FIXED_FWD = 16.0
# Passage forwards per text passage: the text pass (decoders), plus the gold treebank and coreference passes
# (encoders).
ROLES_FWD = {True: 1.3, False: 3.8}
# Forwards per long sequence, in passages of its length (windows and needle haystacks: their attention and the
# answer's teacher-forced tokens), and the length at which eager attention's T x T work doubles a forward.
LONG_FWD, LONG_QUADRATIC = 3.0, 1024
ROLES_CPU = 6.0  # CPU units: the census and its intervals

# --- similar (fitted on a SmolLM2 study, cb20c9b; 270 heads) --------------------------------------------------------
# Passage forwards per passage: one pass for the attention maps, one for the head outputs, their copies.
SIMILAR_FWD = 2.5
SIMILAR_CPU_FIXED = 5.0  # CPU units: tables, files, the clustering's setup
# CPU units per head pair and Jensen-Shannon query token (the pairwise divergence sums), and per head pair (CKA,
# subspace angles, clustering).
JS_PAIR_TOKEN_CPU, PAIR_CPU = 6e-6, 8e-3

# --- score ---------------------------------------------------------------------------------------------------------
# Exact ablation: forwards per head and passage (layers l..L-1 rerun, the prefix reused) and CPU units per head
# (its intervals); fitted on timed `score --method ablation` runs (MiniLM 16/32 passages, SmolLM2 8).
ABLATION_FWD, ABLATION_CPU = 0.57, 3.0
# Taylor's forward + backward per passage, and the output-norm and entropy passes (counted: 2 each).
SCORE_TRAIN, SCORE_FWD = 2.0, 2.0
# CPU units (set by hand, 112cbeb): a fixed part (the criteria's rank correlations, split-half stabilities) and, per
# passage and FITTED_HEADS heads, every criterion's bootstrap.
SCORE_CPU_FIXED, SCORE_CPU_PER_PASSAGE = 20.0, 2.0

# --- prune ---------------------------------------------------------------------------------------------------------
# Passages per recovery step (the stage's batch size, an option it passes to prune).
RECOVERY_BATCH = 8
# Forward + backward passes per passage of a recovery step: AdamW over every weight costs about three (fitted,
# 54bbc45, on MiniLM's curve).
RECOVERY_TRAIN = 3.0
# The held-out metric before and after recovery at each point (counted; one pass when the size trains no recovery).
PRUNE_METRIC_PASSES = 2
# The share of the heads a target-stopped curve removes before its point estimate passes the study's 5% target, which
# sets how many points it measures (those, and the one past the target), by whether the size trains recovery (the
# curve then stops on the recovered drop, which stays lower for longer): measured on SmolLM2 without recovery 9%
# (24 of 270 heads within by the upper bound, docs/pruning.md, `prune smollm2 --target-drop 5% --step 0.011`), with
# one recovery step a point 13% (36 heads: the study's prune stage, 16 + 16 passages, steps of 6 heads; docs/study.md,
# "The pruning curve"); MiniLM after 8 recovery steps a point 19% (14 of 72, docs/study.md). Set from those three
# runs, not fitted: the study's measured/estimated correction absorbs the rest.
PRUNE_EXPECTED_WITHIN = {False: 0.1, True: 0.13}
# Model loads' worth of work besides the curve: copying the model to prune and saving the pruned one (set by hand,
# 112cbeb).
PRUNE_LOADS = 2
# CPU units (set by hand, 112cbeb): a fixed part (the curve's files, the figure) and each point's claims and intervals.
PRUNE_CPU_FIXED, PRUNE_CPU_PER_POINT = 6.0, 10.0

# --- kv (set by hand, 112cbeb) ---------------------------------------------------------------------------------------
# Seconds of the KV table: a config's arithmetic, no forward.
KV_S = 1.0

# --- gqa and mla (set by hand, 112cbeb; MLA's factor fitted on SmolLM2, cb20c9b) ------------------------------------
# Held-out passes per held-out passage: perplexity before, after and uptrained (3), and one more for margin.
CONVERSION_HELDOUT_FWD = 4
# Forward + backward passes per passage of an uptraining step (batches of RECOVERY_BATCH passages): about the
# student's pass and the original's forward it is distilled from.
UPTRAIN_TRAIN = 2.0
# CPU units: the conversion's arithmetic, the KV-byte tables, files
CONVERSION_CPU = 4.0
# MLA against GQA: the joint SVDs and the RoPE-frequency pass on top of what every conversion costs.
MLA_FACTOR = 1.5

# --- kvcache (fitted on SmolLM2, d119f2d) --------------------------------------------------------------------------
# The caches each sequence runs through: full, by score and random (counted); forwards per scoring haystack
# (fitted).
KVCACHE_CACHES, KVCACHE_HAYSTACK_FWD = 3, 3
# The context length at which the head-aware cache's attention work doubles a forward.
KVCACHE_QUADRATIC = 2048
KVCACHE_CPU = 4.0  # CPU units: the plan, the tables, the card

# --- report (fitted, 54bbc45) ----------------------------------------------------------------------------------------
# Passage forwards: the example sentences' attention maps and the page's own passes.
REPORT_FWD = 6.0
# CPU units: the page and its figures, and one more unit per REPORT_HEADS_PER_CPU heads (the per-head panels).
REPORT_CPU_FIXED, REPORT_HEADS_PER_CPU = 40.0, 10

# --- circuit (fitted on SmolLM2) -------------------------------------------------------------------------------------
# Passage forwards per IOI pair of the edge scores and the faithfulness curves together (33 forwards of the circuit
# evaluator, which recomputes every receiver's q/k/v input: dearer than a plain forward), by method; fitted on one
# timed study stage on SmolLM2 (8 IOI pairs, EAP: 81 s at a probe forward of 0.12 s a passage; scores 8 s, curves
# 63 s, intervals 9 s), EAP-IG's share from benchmarks/bench_circuit.py's ratios (61 against EAP's 54 forwards of a
# batch). CIRCUIT_CPU: CPU units per thousand edges (their bootstrap intervals over pairs).
CIRCUIT_FWD = {"eap": 73.0, "eap-ig": 82.0}
CIRCUIT_CPU = 1.5
