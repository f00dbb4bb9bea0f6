"""The study's patch stage: its estimated seconds (stages.py's cost of a size, from the study's probe) against the
measured time of `headscope.patch` at that size, on one model.

  python benchmarks/bench_study_patch.py [--model smollm2] [--levels 0,2]

--levels: indexes into the stage's sizes (headscope/study/patching.py LEVELS: 0 = 8 pairs by attribution alone,
2 = 8 pairs exact and attribution, ...). Prints the probe and one JSON line per size. Threads: BENCH_THREADS
(default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--levels", default="0,2")
    args = ap.parse_args()
    import torch  # after the environment is set

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    # after the thread count is set: headscope imports torch's users
    from headscope.data import read_texts
    from headscope.learned.causal.verb import patch
    from headscope.study.patching import task_for
    from headscope.study.probe import probe
    from headscope.study.stages import MAX_LENGTH, Family, stages_for

    hm, p = probe(args.model, read_texts("ptb-valid"), MAX_LENGTH)
    fam = Family.of(hm)
    stage = next(s for s in stages_for(fam) if s.name == "patch")
    print(json.dumps({"probe": p.as_dict(), "heads": fam.heads_total}), flush=True)
    for k in (int(x) for x in args.levels.split(",")):
        lv = stage.levels[k]
        estimate = stage.cost(p, fam, lv)
        t = time.perf_counter()
        r = patch(hm, task=task_for(fam.causal), limit=lv["n"], methods=tuple(lv["methods"].split(",")))
        measured = time.perf_counter() - t
        print(json.dumps({"size": lv, "estimate_s": round(estimate, 1), "measured_s": round(measured, 1),
                          "ratio": round(estimate / measured, 2), "parts_s": r.record.get("seconds"),
                          "pairs": len(r.pairs)}), flush=True)


if __name__ == "__main__":
    main()
