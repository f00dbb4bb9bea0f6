"""`headscope <verb>`: each verb lives in its own module under headscope.commands.

A verb module defines `register(subparsers)`, which adds its parser and sets `func(args) -> int`.
Only the CLI prints; the library logs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import signal
import sys
import threading
import traceback
import warnings

import transformers

from . import commands, distributed
from .commands._common import check_options, flag_message
from .errors import HeadscopeError
from .io import disk_full_error, is_disk_full, out_lock
from .options.cli import Parser, unknown_words
from .study import cli as study_cli
from .version import __version__

# `headscope --help` lists the verbs by the question they answer, the main job first; a verb in no group is listed
# last, under "tools".
VERB_GROUPS = (("start here", ("study", "view")),
               ("what the heads learn", ("analyze", "roles", "similar", "patch", "circuit")),
               ("are more heads better", ("kv", "gqa", "mla", "kvcache", "sweep")),
               ("which heads are redundant", ("score", "prune", "tasks")),
               ("what compression cost", ("compare",)))


def _group_verbs(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """Show the verbs' one-line helps in VERB_GROUPS' sections instead of one alphabetical list."""
    lines = {a.dest: a for a in sub._choices_actions}
    grouped = [*VERB_GROUPS, ("tools", tuple(n for n in lines if all(n not in g for _, g in VERB_GROUPS)))]
    for title, names in grouped:
        group = parser.add_argument_group(title)
        group._group_actions.extend(lines[n] for n in names if n in lines)
    sub.help = argparse.SUPPRESS  # the sections above replace the flat list


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="headscope", usage="headscope [-h] [--version] [-v] VERB ...",
        description="Measure what attention heads learn, whether more heads help, and which heads are redundant. "
                    "New here: headscope study MODEL answers all three within a time budget.",
    )
    parser.add_argument("--version", action="version", version=f"headscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", prog="headscope")  # verbs read "headscope VERB"
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{commands.__name__}.{info.name}").register(sub)
    study_cli.register(sub)  # the verb above the others: it runs them
    _group_verbs(parser, sub)
    return parser


def _verb_parser(parser: argparse.ArgumentParser, verb: str | None) -> argparse.ArgumentParser:
    """The verb's own parser (the top-level one without a verb)."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return sub.choices[verb] if sub is not None and verb in sub.choices else parser


def _quiet_libraries(verbose: bool) -> None:
    """Keep transformers' progress bars and repeated warnings off a normal run's terminal."""
    if not verbose:
        transformers.utils.logging.disable_progress_bar()  # the "Loading weights" bar on every load
        transformers.utils.logging.set_verbosity_error()
    # One copy of each warning: the default filter can repeat one per call site and module.
    warnings.simplefilter("once")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so it unwinds like Ctrl-C: temp files, spill folders and staging
    folders are removed on the way out."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Run one verb; user errors exit 2 with one line, unexpected ones exit 1 with one line (-v: traceback)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse would blame `headscope`, not the verb, for words the verb does not take
    if extra:
        verb = getattr(args, "verb", None)
        print(f"headscope{' ' + verb if verb else ''}: error: unrecognized arguments: "
              f"{unknown_words(_verb_parser(parser, verb), extra)} (see headscope{' ' + verb if verb else ''} --help)",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    # run from the command line, a study counts the process's start against its budget
    if args.verb == "study":
        args.from_command_line = argv is None
    try:
        _quiet_libraries(args.verbose)
        # One run at a time per --out: rank 0 (or the launching parent, for its ranks) holds the lock.
        lock = getattr(args, "out", None) if distributed.is_main() else None
        if getattr(args, "workers", 1) != 1 and not distributed.launched():  # --workers N: start N ranks
            distributed.check_workers(args.workers)
            check_options(args)  # refused once, here, before any process starts
            with out_lock(lock, f"headscope {args.verb}"):
                return distributed.launch(sys.argv[1:] if argv is None else list(argv), args.workers)
        # torchrun's ranks: join, stop together on failure (no-op alone); each rank on its own device
        with distributed.session(args.verb, getattr(args, "device", None), hasattr(args, "workers")) as device:
            if device is not None:
                args.device = device
            distributed.check_workers(getattr(args, "workers", 1))
            check_options(args)  # every option is checked before a verb loads anything
            with out_lock(lock, f"headscope {args.verb}"):
                return int(args.func(args) or 0)
    except (HeadscopeError, FileNotFoundError, KeyError) as e:
        if args.verbose:
            traceback.print_exc()
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        if isinstance(e, HeadscopeError) and e.fields:  # the library names fields; the command line, flags
            msg = flag_message(args, e)
        if distributed.is_main():  # one line per run: rank 0 speaks for every rank
            print(f"headscope {args.verb}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if distributed.is_main():
            how = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
            print(f"headscope {args.verb}: {how}; no output was left half-written", file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    except Exception as e:
        # the safety net: a bug or an unforeseen input, never a bare traceback
        if is_disk_full(e) and distributed.is_main():  # a writer that did not say it itself
            where = getattr(e, "filename", None) or getattr(args, "out", None) or "."
            print(f"headscope {args.verb}: error: {flag_message(args, disk_full_error(where))}", file=sys.stderr)
            return 2
        if args.verbose:
            traceback.print_exc()
        detail = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if distributed.is_main():
            print(f"headscope {args.verb}: unexpected {type(e).__name__}: {detail} "
                  f"(run with -v for the traceback)", file=sys.stderr)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
