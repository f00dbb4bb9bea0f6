"""The `study` verb's parser and printing (registered by headscope.cli beside the verbs in commands/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..options.cli import verb_parser
from .budget import fmt_duration, tolerance_s
from .options import StudyOptions
from .runner import process_age, study
from .state import LOG_DIR, STUDY_NAME


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "study", StudyOptions,
        help="answer the three questions for a model in one command, within a time budget",
        description="Run every stage the model's family supports (statistics and roles, similarity, causal heads "
                    "by activation patching (LM heads only), importance, "
                    "a pruning curve with recovery and a pruned model, the KV cost; for decoders long-range "
                    "roles, GQA/MLA conversion and the head-aware cache) into one folder, sized to --budget from "
                    "a timed probe, then the report. Rerunning reuses finished stages; --force starts over. "
                    "See docs/study.md.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    opts = StudyOptions.from_namespace(args).validate()  # a bad budget fails before anything loads
    budget = opts.budget_s
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
