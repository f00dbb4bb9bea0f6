"""`headscope compare BASE OTHER`: which capabilities a pruned, regrouped or cache-compressed model kept and which it
lost, each row a paired change with its interval and a verdict (docs/compare.md).

It reads two models and runs the measurements of several questions (the language-model loss of `eval`, the causal
tasks of `learned.causal`, the needle retrieval of `learned.longctx`), so it sits at the export layer.

This package module is callable (`headscope.compare(base_hm, other_hm, options)`): the package and the function share
the name `compare`, and once `headscope.compare` is imported as a package the attribute `headscope.compare` is the
package, so the package itself forwards calls to `compare()` (as `headscope.view` does).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ..models.adapter import HeadModel
from .check import check, check_cache, check_kvcache, check_lines
from .checks import check_model_name, check_same_tokenizer
from .options import CompareOptions
from .verb import CompareResult, compare
from .verdict import VERDICTS, Change, decide, paired_change

__all__ = ["VERDICTS", "Change", "CompareOptions", "CompareResult", "check", "check_cache", "check_kvcache",
           "check_lines", "check_model_name", "check_same_tokenizer", "compare", "decide", "paired_change"]


class _CallableModule(types.ModuleType):
    """The package, callable as `compare()` (see the module's docstring)."""

    def __call__(self, base: HeadModel, other: HeadModel, options: CompareOptions | None = None,
                 **changes: Any) -> CompareResult:
        return compare(base, other, options, **changes)


sys.modules[__name__].__class__ = _CallableModule
