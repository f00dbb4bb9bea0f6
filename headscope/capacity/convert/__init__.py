"""What every conversion shares: uptraining through the shared Trainer, perplexity / KL evaluation, the KV
report (bytes measured from a generation cache beside the formula), and the default text.

`gqa`, `mla` and `kvcache --uptrain` use these; none of them reaches into another's modules.
Modules: `texts` (CALIBRATION_DATA, CALIBRATION_HELDOUT, `conversion_texts`), `evaluate` (`compare`, `kv_report`,
`CACHE_FORMULAS`), `uptraining` (`uptrain`, `run_uptraining`).
"""
