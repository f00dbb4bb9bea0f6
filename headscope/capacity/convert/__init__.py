"""What every conversion shares: uptraining through the shared Trainer, perplexity / KL evaluation.

`gqa`, `mla` and `kvcache --uptrain` use these; none of them reaches into another's modules.
"""
