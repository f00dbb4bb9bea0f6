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

from . import commands
from .version import __version__
from .errors import HeadscopeError


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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (HeadscopeError, FileNotFoundError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"headscope {args.verb}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"headscope {args.verb}: interrupted; no output was left half-written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
