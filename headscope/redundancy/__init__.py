"""Question 3: which heads are redundant?

- `importance`: criteria for heads and units in one registry (ablation, gradient, Taylor, IG, entropy, ...);
- `pruning`: masks and physical pruning of heads, attention sub-layers, blocks and FFN neurons;
- `curves`: the one pruning-curve loop (with recovery and resume) for every unit;
- `protect`: the heads `prune --protect` keeps out of a curve (causal-task carriers, retrieval heads);
- `curve_checks`: the checks of a curve's settings the options and the engine share.

Imports the foundation and `learned` (pattern baselines, long-range retrieval scores, attribution patching).
"""
