"""`headscope <verb>`: each verb lives in its own module under headscope.commands.

A verb module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
Only the CLI prints; the library logs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
import traceback
import warnings

import transformers

from . import commands, distributed
from .commands._common import check_common
from .errors import HeadscopeError
from .study import cli as study_cli
from .version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headscope",
        description="Measure what attention heads learn, whether more heads help, and which heads are redundant.",
    )
    parser.add_argument("--version", action="version", version=f"headscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{commands.__name__}.{info.name}").register(sub)
    study_cli.register(sub)  # the verb above the others: it runs them
    return parser


def _quiet_libraries(verbose: bool) -> None:
    """Keep transformers' progress bars and repeated warnings off a normal run's terminal."""
    if not verbose:
        transformers.utils.logging.disable_progress_bar()  # the "Loading weights" bar on every load
        transformers.utils.logging.set_verbosity_error()
    # One copy of each warning: the default filter can repeat one per call site and module.
    warnings.simplefilter("once")


def main(argv: list[str] | None = None) -> int:
    """Run one verb; user errors exit 2 with one line, unexpected ones exit 1 with one line (-v: traceback)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.verb == "study":  # run from the command line, a study counts the process's start against its budget
        args.from_command_line = argv is None
    try:
        _quiet_libraries(args.verbose)
        if getattr(args, "workers", 1) != 1 and not distributed.launched():  # --workers N: start N ranks
            distributed.check_workers(args.workers)
            check_common(args)  # refused once, here, before any process starts
            return distributed.launch(sys.argv[1:] if argv is None else list(argv), args.workers)
        with distributed.session(args):  # torchrun's ranks: join, stop together on failure (no-op alone)
            distributed.check_workers(getattr(args, "workers", 1))
            check_common(args)  # every shared option is checked before a verb loads anything
            return int(args.func(args) or 0)
    except (HeadscopeError, FileNotFoundError, KeyError) as e:
        if args.verbose:
            traceback.print_exc()
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        if distributed.is_main():  # one line per run: rank 0 speaks for every rank
            print(f"headscope {args.verb}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if distributed.is_main():
            print(f"headscope {args.verb}: interrupted; no output was left half-written", file=sys.stderr)
        return 130
    except Exception as e:  # the safety net: a bug or an unforeseen input, never a bare traceback
        if args.verbose:
            traceback.print_exc()
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if distributed.is_main():
            print(f"headscope {args.verb}: unexpected {type(e).__name__}: {detail} "
                  f"(run with -v for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
