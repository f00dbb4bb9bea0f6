"""Question 2: are more heads better?

- `kv_bytes`: KV-cache bytes of MHA/GQA/MQA layouts (the one formula) and the KV report of a model;
- `mha`: a readable reference MHA/GQA/MQA attention module;
- `sweep`: small LMs trained from scratch per head count at fixed d_model;
- `convert`: what every conversion shares (uptraining, perplexity/KL evaluation);
- `gqa`, `mla`: converting a trained model to fewer KV heads or to latent attention;
- `kvcache`: the head-aware KV cache (full KV for some heads, sink + window for the rest).

Imports the foundation and `learned` (the needle tests of long-range roles).
"""
