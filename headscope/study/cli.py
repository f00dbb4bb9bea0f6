"""The `study` verb's parser and printing (registered by headscope.cli beside the verbs in commands/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..options.cli import verb_parser
from .budget import FILL, fmt_duration, tolerance_s
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


def leftover_line(note: dict[str, Any] | None, budget: float, elapsed: float) -> str | None:
    """A study that ended with a minute or more of its budget left says so, and what a larger budget buys."""
    left = budget - elapsed
    if not note or left < 60:
        return None
    line = f"{fmt_duration(left)} of the budget was left"
    if note.get("next"):
        need = (elapsed + float(note["next_cost_s"])) / FILL  # the plan fills FILL of the budget
        line += (f": the next step, {note['next']} one size larger (its intervals are the widest), needs about "
                 f"{fmt_duration(float(note['next_cost_s']))} with the report after it; --budget "
                 f"{int(max(need, budget) // 60) + 1}m would run it")
    else:
        line += ": every stage ran at its largest size"
    return line


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
    more = leftover_line(st.get("leftover"), budget, outcome.elapsed)
    if more:
        print(more)
    page = f"{args.out}/report.html, " if (Path(args.out) / "report.html").exists() else ""
    print(f"\nwrote {page}{args.out}/{STUDY_NAME} (commands, sizes, times) and each stage's "
          f"output; logs in {args.out}/{LOG_DIR}/", file=sys.stderr)
    return 1 if outcome.failed else 0
