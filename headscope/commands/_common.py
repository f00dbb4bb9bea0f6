"""Arguments and printing shared by several verbs."""

from __future__ import annotations

import argparse

from ..errors import HeadscopeError
from ..models.adapter import HeadModel
from ..models.loading import load_model
from ..options import OptionError, Options, parse_max_memory, read_device_map
from ..options.cli import as_flags
from ..options.cli import check_options as check_verb_options
from ..table import HeadTable, fmt, grid  # noqa: F401  (re-exported for the verbs)
from ..uncertainty import IntervalSettings


def verb_options(args: argparse.Namespace) -> Options | None:
    """The verb's typed options from its parsed arguments (None for a verb without an Options class)."""
    cls = getattr(args, "options_class", None)
    return cls.from_namespace(args) if cls is not None else None


def check_options(args: argparse.Namespace) -> Options | None:
    """Validate the verb's options, then the files and folders it will write and where they lie against what it
    reads, before any verb does work (`options.cli.check_options`)."""
    options = verb_options(args)
    if options is not None:
        check_verb_options(options, args.verb)
    return options


def flag_message(args: argparse.Namespace, error: HeadscopeError) -> str:
    """An error as the CLI says it: an option's problem under the flag the user typed (`--limit must be ...`), every
    other option the message names as its flag too (`options.cli.as_flags`)."""
    cls = getattr(args, "options_class", None)
    flags = cls.flags() if cls is not None else {}
    if isinstance(error, OptionError):
        flag = flags.get(error.name, "--" + error.name.replace("_", "-"))
        return f"{flag} {as_flags(error.problem, error.fields[1:], flags)}"
    return as_flags(str(error), error.fields, flags)


def load_from_args(args: argparse.Namespace) -> HeadModel:
    """The verb's model, loaded as --device / --dtype / --device-map (--max-memory, --offload-dir) say (a model
    without a tokenizer is told what to copy where its text is tokenised: headscope.data.prepare)."""
    return load_model(args.model, device=args.device, dtype=args.dtype, device_map=read_device_map(args.device_map),
                      max_memory=parse_max_memory(args.max_memory), offload_folder=args.offload_dir,
                      allow_random_weights=getattr(args, "allow_random_weights", False))


def interval_settings(args: argparse.Namespace) -> IntervalSettings:
    """The interval settings a verb's --ci, --bootstrap and --seed ask for."""
    return IntervalSettings(level=args.ci, B=args.bootstrap, seed=args.seed)
