"""What leaves headscope for other tools: files in the formats those tools read, written from headscope's
own results: head cards (`cards`: the Retrieval Head / HeadKV `{"layer-head": [scores]}` file and
DuoAttention's pattern directory, which kvpress reads) and GGUF files for llama.cpp (`gguf`). Checkpoints
that load in plain transformers are written by `models/checkpoint.py` (the foundation, which every verb
saves through). It may read every question package; none of them imports it."""
