"""Question 3: which heads are redundant?

- `importance`: criteria for heads and units in one registry (ablation, gradient, Taylor, IG, entropy, ...);
- `pruning`: masks and physical pruning of heads, attention sub-layers, blocks and FFN neurons;
- `curves`: the one pruning-curve loop (with recovery and resume) for every unit.

Imports the foundation and `learned` (pattern baselines, long-range retrieval scores).
"""
