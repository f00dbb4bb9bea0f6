"""What leaves headscope for other tools: files in the formats those tools read, written from headscope's
own results. Today the head cards of the long-range roles (`cards`: the Retrieval Head / HeadKV
`{"layer-head": [scores]}` file); this is the layer for checkpoints that load in plain transformers,
GGUF files and head patterns as they move here. It may read every question package; none of them
imports it."""
