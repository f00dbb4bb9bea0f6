"""Typed options: one frozen dataclass per verb, composed from shared groups; the CLI is built from them."""

from .base import Options
from .given import check_data
from .groups import (
    SEED_MAX,
    CheckOptions,
    DataOptions,
    HeldoutOptions,
    IntervalOptions,
    ModelOptions,
    OutputOptions,
    SeedOptions,
    StableOptions,
    WorkerOptions,
)
from .placement import check_device, parse_max_memory, read_device_map
from .record import Record
from .result import Result
from .spec import OptionError, Spec, bound_problem, check_bounds, flag_of, option, spec_of

__all__ = [
    "SEED_MAX", "CheckOptions", "DataOptions", "HeldoutOptions", "IntervalOptions", "ModelOptions", "OptionError",
    "Options", "OutputOptions", "Record", "Result", "SeedOptions", "Spec", "StableOptions", "WorkerOptions",
    "bound_problem", "check_bounds", "check_data", "check_device", "flag_of", "option", "parse_max_memory",
    "read_device_map", "spec_of",
]
