"""Running one existing verb in-process: its own parser, shared checks, run function and writers.

The study does not shell out: each stage parses its options with the verb's own parser (so a study's
options are refused exactly as the verb refuses them), runs the verb's `run` function, and sends what
the verb prints (its tables and bars) to the stage's log in OUT/study-logs/, leaving the terminal to the
study's one progress view.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from ..commands._common import check_options
from ..models.adapter import HeadModel
from ..options.cli import Parser

__all__ = ["command_line", "parse_verb", "run_verb"]


def parse_verb(argv: list[str]) -> argparse.Namespace:
    """`argv` (verb first) parsed by that verb's own parser and refused by the checks every verb shares."""
    module = importlib.import_module(f"headscope.commands.{argv[0]}")
    parser = Parser(prog="headscope", exit_on_error=False)
    module.register(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(argv)
    check_options(args)
    return args


def run_verb(argv: list[str], log: Path, model: HeadModel | None = None) -> int:
    """Run the verb `argv` names with its output into `log`; its return code (errors raise as from the CLI).

    `model`: the study's loaded model, which the verb uses instead of loading its own (argv names the same
    model, so the logged command line still reproduces the stage on its own)."""
    args = parse_verb(argv)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f), \
            _logging_to(f):
        print("$ " + command_line(argv), flush=True)
        return int(args.func(args, model) or 0)


@contextlib.contextmanager
def _logging_to(stream: TextIO) -> Iterator[None]:
    """The library's log lines (warnings) go to the stage's log too, then back to where they went."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)]
    old = [h.setStream(stream) for h in handlers]
    try:
        yield
    finally:
        for h, s in zip(handlers, old, strict=True):
            h.setStream(s)


def command_line(argv: list[str]) -> str:
    """The shell command that reproduces a stage."""
    return "headscope " + " ".join(shlex.quote(a) for a in argv)
