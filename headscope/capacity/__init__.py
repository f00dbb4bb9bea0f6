"""Question 2: are more heads better?

- `kv_formula`: the one KV-cache bytes formula and cache dtypes (standard library only);
- `kv_bytes`: KV-cache bytes of MHA/GQA/MQA layouts of any config, through that formula;
- `mha`: a readable reference MHA/GQA/MQA attention module;
- `sweep`: small LMs trained from scratch per head count at fixed d_model;
- `convert`: what every conversion shares (uptraining, perplexity/KL evaluation, the KV report, default text);
- `gqa`, `mla`: converting a trained model to fewer KV heads or to latent attention;
- `kvcache`: the head-aware KV cache (full KV for some heads, sink + window for the rest).

Imports the foundation and `learned` (the needle tests of long-range roles).
"""
