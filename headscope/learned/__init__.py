"""Question 1: what does each head learn?

- `analyze`: per-head attention statistics (entropy, distance, sink mass, output norm, ...);
- `roles`: the role census, each role a score beside a baseline with a decision rule;
- `syntax`, `coref`: dependency-relation and coreference accuracy of every head (Clark et al. 2019);
- `similarity`, `cka`: head-to-head similarity (JS, CKA, subspace angles) and near-duplicate clusters;
- `longctx`: long-range roles (retrieval, streaming, echo, induction at long context).

Imports only the foundation (models, attention, data, eval, hooks, stats, table, ...).
"""
