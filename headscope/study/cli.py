"""The `study` verb's parser and printing (registered by headscope.cli beside the verbs in commands/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..commands._common import check_device
from .budget import fmt_duration, parse_duration, tolerance_s
from .runner import StudyOptions, process_age, study
from .state import LOG_DIR, STUDY_NAME


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study", help="answer the three questions for a model in one command, within a time budget",
        description="Run every stage the model's family supports (statistics and roles, similarity, importance, "
                    "a pruning curve with recovery and a pruned model, the KV cost; for decoders long-range "
                    "roles, GQA/MLA conversion and the head-aware cache) into one folder, sized to --budget from "
                    "a timed probe, then the report. Rerunning reuses finished stages; --force starts over. "
                    "See docs/study.md.")
    p.add_argument("model", nargs="?", default="minilm",
                   help="built-in name (minilm, smollm2), a model directory, or a hub id (default: minilm)")
    p.add_argument("--budget", default="10m",
                   help="wall time for the whole study, e.g. 10m, 90s, 1h30m (default 10m); it ends within the "
                        "budget plus 10%% (at least 30 s)")
    p.add_argument("--data", default=None,
                   help="text for every stage: a built-in corpus (ptb-valid, ptb-train, sample, ...) or a .txt, "
                        ".jsonl or .conllu file (default: PTB valid for the statistics, roles, similarity and "
                        "scores; PTB train to score and PTB valid to measure the pruning curve)")
    p.add_argument("--device", default=None, help="torch device (default: cpu)")
    p.add_argument("--out", default="headscope-study", help="output folder (default: headscope-study/)")
    p.add_argument("--force", action="store_true", help="start over: remove a previous study's files in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    budget = parse_duration(args.budget)  # a bad budget fails before anything loads
    if args.device is not None:
        check_device(args.device)
    opts = StudyOptions(model=args.model, budget_s=budget, data=args.data, out=args.out, force=args.force,
                        device=args.device)
    try:
        ago = process_age() if getattr(args, "from_command_line", False) else 0.0
        outcome = study(opts, sys.stderr, started_ago=ago)
    except KeyboardInterrupt:
        print(f"headscope study: interrupted; the finished stages are recorded in {args.out}/{STUDY_NAME}: rerun "
              f"the same command to continue (--force starts over)", file=sys.stderr)
        return 130
    st = outcome.state.data
    for q in ("q1", "q2", "q3"):
        print(outcome.answers.get(q, ""))
        print()
    ran = [n for n, r in st["stages"].items() if r.get("status") == "done" and not r.get("reused")]
    reused = [n for n, r in st["stages"].items() if r.get("status") == "done" and r.get("reused")]
    other = {n: r for n, r in st["stages"].items() if r.get("status") != "done"}
    print(f"study of {st['model']['name']}: {fmt_duration(outcome.elapsed)} of a {fmt_duration(budget)} budget "
          f"(tolerance +{fmt_duration(tolerance_s(budget))}); ran {', '.join(ran) or 'nothing'}"
          + (f"; reused {', '.join(reused)}" if reused else ""))
    for n, r in other.items():
        print(f"  {n}: {r.get('status')}: {r.get('reason', '')}")
    page = f"{args.out}/report.html, " if (Path(args.out) / "report.html").exists() else ""
    print(f"\nwrote {page}{args.out}/{STUDY_NAME} (commands, sizes, times) and each stage's "
          f"output; logs in {args.out}/{LOG_DIR}/", file=sys.stderr)
    return 1 if outcome.failed else 0
