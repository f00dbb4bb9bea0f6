"""What a `headscope.compare` costs beyond the forwards it needs, and what `--base-from` saves.

On SmolLM2 (one thread): OTHER = SmolLM2 with two heads zeroed (in memory). Three timings, side by side in one run:

1. `compare(base, other)` with the default rows (lm, ioi, induction, greater-than, retrieval);
2. the plain forwards of the same items, both models, the same batches (plain `model(...)` calls, no headscope);
3. `compare(base, other, base_from=DIR)` with DIR the first run's output: BASE's forwards reused.

    OMP_NUM_THREADS=1 python benchmarks/bench_compare.py [--out /tmp/bench_compare.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

import headscope
from headscope.compare.suite import prepare_rows
from headscope.data import batches, pad_id
from headscope.learned.causal.patching import chunks


def zeroed(hm: headscope.HeadModel, heads: list[tuple[int, int]]) -> headscope.HeadModel:
    import copy

    other = headscope.HeadModel(model=copy.deepcopy(hm.model), tokenizer=hm.tokenizer, name=f"{hm.name}-zeroed")
    for layer, head in heads:
        w = other.out_weight(layer).clone()
        w[:, head * hm.d_head:(head + 1) * hm.d_head] = 0.0
        other.set_out_weight(layer, w)
    return other


def plain_forwards(hm: headscope.HeadModel, rows: list, batch_size: int) -> float:
    """Seconds of the bare passes over every row's items, batched as compare batches them: one forward per batch,
    and for a heads:<row> row what attribution patching needs, a forward of the clean texts and a forward and
    backward of the corrupt ones."""
    t0 = time.perf_counter()
    for row in rows:
        if row.capability.startswith("heads:"):
            for r in chunks(len(row.items), batch_size):
                part = row.items.take(r)
                with torch.no_grad():
                    hm.model(input_ids=part.clean, attention_mask=part.mask, use_cache=False)
                out = hm.model(input_ids=part.corrupt, attention_mask=part.mask, use_cache=False).logits
                out[:, -1].sum().backward()
                hm.model.zero_grad(set_to_none=True)
    with torch.inference_mode():
        for row in rows:
            if row.capability.startswith("heads:"):
                continue
            items = row.items
            if row.capability == "lm":
                for b in batches(items.ids, batch_size, pad_id(hm)):
                    hm.model(input_ids=b.input_ids, attention_mask=b.attention_mask, use_cache=False)
            elif row.capability == "retrieval":
                for hay in items:
                    ids = torch.tensor([hay.ids])
                    hm.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                             logits_to_keep=hay.answer[1] - hay.answer[0] + 1)
            else:
                for r in chunks(len(items), batch_size):
                    part = items.take(r)
                    hm.model(input_ids=part.clean, attention_mask=part.mask, use_cache=False)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_compare.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = headscope.load_model("smollm2")
    other = zeroed(base, [(23, 3), (29, 1)])
    opts = headscope.CompareOptions(base="smollm2", other="zeroed")
    t0 = time.perf_counter()
    first = headscope.compare(base, other, opts)
    t_compare = time.perf_counter() - t0
    rows, _ = prepare_rows(base, opts)
    t_plain = plain_forwards(base, rows, opts.batch_size) + plain_forwards(other, rows, opts.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        first.save(Path(tmp) / "first")
        t0 = time.perf_counter()
        headscope.compare(base, other, opts.replace(base_from=str(Path(tmp) / "first")))
        t_reused = time.perf_counter() - t0
    t_plain_other = plain_forwards(other, rows, opts.batch_size)
    got = {"compare_s": t_compare, "plain_forwards_both_s": t_plain, "ratio": t_compare / t_plain,
           "compare_base_from_s": t_reused, "plain_forwards_other_s": t_plain_other,
           "ratio_base_from": t_reused / t_plain_other,
           "rows": {r.capability: r.n for r in rows}, "threads": torch.get_num_threads()}
    args.out.write_text(json.dumps(got, indent=1) + "\n")
    print(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
