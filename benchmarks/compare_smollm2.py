"""The must-hold case of `headscope compare` on SmolLM2 (docs/compare.md): two variants with heads zeroed, one
whose heads carry IOI (the name movers L23H3, L29H1 of docs/patching.md) and one whose heads do not (L26H6, L27H7:
attribution patching effect on IOI within +-0.0002, intervals holding 0), each compared with the original on an
IOI pairs file; the pairs row's change checked against an independent measurement with plain transformers.

    OMP_NUM_THREADS=1 python benchmarks/compare_smollm2.py --out /tmp/compare_smollm2 [--items 24] [--all-rows]

A variant is written the way a user would: the model loaded with headscope, the heads' columns of the output
projection set to 0 (exactly Michel et al.'s head mask, under every kernel), saved with `headscope.save_model`.
Without --all-rows the compare runs the pairs row only (`--tasks` left to the pairs file); with it, every default
row (lm, ioi, induction, greater-than, retrieval) as well.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import transformers as tf

import headscope
from headscope.learned.causal.pairs import builtin_pairs
from headscope.models.loading import float_copy_dir

VARIANTS = {"name-movers": [(23, 3), (29, 1)], "null-heads": [(26, 6), (27, 7)]}


def zeroed_copy(heads: list[tuple[int, int]], folder: Path) -> Path:
    """SmolLM2 with `heads` zeroed at the output projection, saved to `folder`."""
    hm = headscope.load_model("smollm2")
    d = hm.d_head
    for layer, head in heads:
        w = hm.out_weight(layer).clone()
        w[:, head * d:(head + 1) * d] = 0.0
        hm.set_out_weight(layer, w)
    return headscope.save_model(hm, folder, force=True)


def by_hand(folder: Path, pairs: list[dict[str, str]]) -> np.ndarray:
    """logit(answer) - logit(wrong) at the last token of each clean text, plain transformers, one pair at a time."""
    tok = tf.AutoTokenizer.from_pretrained(folder)
    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in pairs:
            ids = torch.tensor([tok(p["clean"])["input_ids"]])
            logits = model(input_ids=ids).logits[0, -1]
            a, w = (tok(p[k], add_special_tokens=False)["input_ids"][0] for k in ("answer", "wrong"))
            out.append(float(logits[a] - logits[w]))
    return np.array(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--all-rows", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = [p.__dict__ for p in builtin_pairs("ioi")][:args.items]
    pairs_file = args.out / "ioi_pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    base_dir = float_copy_dir("smollm2")
    base_by_hand = by_hand(base_dir, pairs)
    summary = {}
    for name, heads in VARIANTS.items():
        folder = zeroed_copy(heads, args.out / f"smollm2-{name}")
        out = args.out / f"compare-{name}"
        cmd = [sys.executable, "-m", "headscope", "compare", "smollm2", str(folder), "--pairs", str(pairs_file),
               "--items", str(args.items), "--out", str(out), "--force"]
        if not args.all_rows:
            cmd[cmd.index("--pairs"):cmd.index("--pairs")] = ["--tasks", "ioi"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        seconds = time.perf_counter() - t0
        rows = {r["capability"]: r for r in csv_rows(out / "compare.csv")}
        row = rows[f"pairs:{pairs_file.stem}"]
        independent = float((by_hand(folder, pairs) - base_by_hand).mean())
        summary[name] = {"heads": [f"L{l}H{h}" for l, h in heads], "command": " ".join(cmd[1:]), "seconds": seconds,
                         "pairs_row": row, "independent_delta": independent,
                         "difference": abs(float(row["delta"]) - independent)}
        print(f"{name} ({', '.join(summary[name]['heads'])}): pairs row {row['verdict']}, change {row['delta']} "
              f"[{row['delta_lo']}, {row['delta_hi']}], n {row['n']}; independent {independent:+.4f}; |difference| "
              f"{summary[name]['difference']:.2e}; {seconds:.0f} s")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    ok = summary["name-movers"]["pairs_row"]["verdict"] == "lost" and \
        summary["null-heads"]["pairs_row"]["verdict"] != "lost" and \
        all(s["difference"] <= 0.02 for s in summary.values())
    print("must hold:", "yes" if ok else "NO")
    return 0 if ok else 1


def csv_rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open() as f:
        return list(csv.DictReader(f))


if __name__ == "__main__":
    raise SystemExit(main())
