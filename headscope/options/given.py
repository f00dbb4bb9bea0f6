"""The `data` argument every verb's Python function takes, checked once for all of them before any work.

The CLI only ever passes a name or a path; Python callers can pass anything, and a wrong kind used to fail deep in a
run (`score(hm, 123)`: "can only join an iterable") or be read as something else (`['a', None]`). The forms a verb
reads: None (its default corpus), a corpus name or file path, a list of texts, a list of token-id lists (or a 2-D
integer array), a list of {"text", "label"} dicts, or an object headscope built (TextSource, Tokens, ...), passed
through.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .spec import OptionError

FORMS = ("a corpus name or file path, a list of texts, a list of token-id lists, a list of {'text', 'label'} "
         "dicts, or a TextSource; or None for the default corpus")
_ARRAYS = (np.ndarray, torch.Tensor)


def _integer_array(a: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return not a.is_floating_point() and not a.is_complex() and a.dtype is not torch.bool
    return np.issubdtype(a.dtype, np.integer)


def _ids_problem(seq: Any) -> str | None:
    """What is wrong with one token-id sequence, or None."""
    if isinstance(seq, _ARRAYS):
        return None if _integer_array(seq) else f"holds {seq.dtype} values, not token ids (whole numbers)"
    bad = next((t for t in seq if isinstance(t, bool) or not isinstance(t, numbers.Integral)), None)
    return None if bad is None else f"holds {bad!r}, not a token id (a whole number)"


def check_data(data: Any, name: str = "data") -> None:
    """Refuse a `data` argument that is none of the forms a verb reads, naming the parameter and the element."""
    if data is None or isinstance(data, (str, Path)):
        return
    if isinstance(data, (bool, numbers.Number, bytes, bytearray, dict, set, frozenset)):
        raise OptionError(name, f"must be {FORMS}; got {type(data).__name__} {data!r}"[:300])
    if isinstance(data, _ARRAYS):
        if data.ndim != 2 or not _integer_array(data):
            raise OptionError(name, f"as an array must be 2-D token ids [passages, tokens] of whole numbers; got "
                                  f"{data.ndim}-D {data.dtype}")
        return
    if not isinstance(data, (list, tuple)):
        # an object headscope built (TextSource, Tokens, labelled task data, ...): its own reader checks it
        return
    if not data:
        raise OptionError(name, f"is empty; give {FORMS}")
    first = "text" if isinstance(data[0], str) else "labelled" if isinstance(data[0], dict) else "ids"
    for i, item in enumerate(data):
        if first == "text" and not isinstance(item, str):
            raise OptionError(name, f"[{i}] is {type(item).__name__} {item!r}, not text: a list of texts holds "
                                    f"strings only")
        if first == "labelled" and not isinstance(item, dict):
            raise OptionError(name, f"[{i}] is {type(item).__name__} {item!r}, not a {{'text', 'label'}} dict: a "
                                    f"list of labelled passages holds dicts only")
        if first == "ids":
            if not isinstance(item, (list, tuple, *_ARRAYS)):
                raise OptionError(name, f"[{i}] is {type(item).__name__} {item!r}; give {FORMS}"[:300])
            problem = _ids_problem(item)
            if problem:
                raise OptionError(name, f"[{i}] {problem}; a list of token-id lists holds whole numbers only")
