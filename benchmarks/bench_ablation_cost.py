"""The cost of exact ablation against the study's probe units (docs/study.md, "Exact ablation, refit").

Runs the study's probe (`headscope.study.probe.probe`, PTB valid at the study's 64 tokens), then for each
passage count `headscope score MODEL --method taylor,output_norm,entropy` with and without `,ablation`; the
difference is exact ablation's cost, to set beside `ABLATION_FWD * heads * n * fwd_s + ABLATION_CPU * heads
* cpu_s` (`headscope.study.stages`). Prints one JSON line per run, then the probe and all runs.

    OMP_NUM_THREADS=1 python benchmarks/bench_ablation_cost.py MODEL N1,N2
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
import time

import torch

from headscope.cli import main
from headscope.data.sources import read_texts
from headscope.study.probe import probe
from headscope.study.stages import MAX_LENGTH, Family


def run(model: str, sizes: list[int]) -> dict:
    torch.set_num_threads(1)
    hm, p = probe(model, read_texts("ptb-valid"), MAX_LENGTH)
    fam = Family.of(hm)
    del hm
    out: dict = {"model": model, "heads": fam.heads_total, "fwd_s": p.fwd_s, "train_s": p.train_s,
                 "load_s": p.load_s, "cpu_s": p.cpu_s, "runs": []}
    for n in sizes:
        for methods in ("taylor,output_norm,entropy", "taylor,output_norm,entropy,ablation"):
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
                rc = main(["score", model, "--data", "ptb-valid", "--limit", str(n), "--max-length",
                           str(MAX_LENGTH), "--method", methods, "--out", d])
            out["runs"].append({"n": n, "methods": methods, "rc": rc, "s": time.perf_counter() - t0})
            print(json.dumps(out["runs"][-1]), flush=True)
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], [int(x) for x in sys.argv[2].split(",")])))
