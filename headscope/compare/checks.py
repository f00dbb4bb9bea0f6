"""What must hold before two models are compared: the same tokenizer and the same kind of model.

The same tokenizer means the same ids for the same text: the same vocabulary (every token to the same id) and the
same ids for a probe text with special tokens, so that every item gives both models the same input. Object identity
is not asked: a pruned or converted folder loads its own copy of the tokenizer files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import HeadscopeError
from ..models.adapter import HeadModel
from ..models.loading import BUILTINS
from ..options import OptionError

PROBE = "The quick brown fox, 1701 years later, met Mary and John at the café.\n\tÆsop's 42 fables!"


def check_model_name(name: str, field: str) -> None:
    """Refuse, before anything loads, a BASE or OTHER that is no built-in name and no existing folder or file."""
    if name in BUILTINS or Path(name).expanduser().exists():
        return
    raise OptionError(field, f"{name!r} is not a built-in model ({', '.join(BUILTINS)}) nor an existing model "
                             f"folder or .gguf file")


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text)["input_ids"])


def check_same_tokenizer(base: HeadModel, other: HeadModel) -> None:
    """Refuse two models whose tokenizers give different ids, or which are not the same kind of model."""
    if base.causal != other.causal:
        kinds = {True: "a decoder", False: "an encoder"}
        raise HeadscopeError(f"{base.name} is {kinds[base.causal]} and {other.name} is {kinds[other.causal]}: "
                             f"compare needs two models of the same kind")
    a, b = base.tokenizer, other.tokenizer
    if a is None or b is None:
        if a is not b:
            missing = base.name if a is None else other.name
            raise HeadscopeError(f"{missing} has no tokenizer and the other model has one: compare needs both "
                                 f"with the same tokenizer (copy the tokenizer files into its folder)")
        if base.vocab_size != other.vocab_size:
            raise HeadscopeError(f"{base.name} and {other.name} have no tokenizer and different vocabularies "
                                 f"({base.vocab_size} vs {other.vocab_size} ids)")
        return
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        only = sorted(set(va.items()) ^ set(vb.items()), key=lambda kv: kv[1])[:3]
        raise HeadscopeError(f"{base.name} and {other.name} have different tokenizers ({len(va)} vs {len(vb)} "
                             f"tokens; e.g. {', '.join(f'{t!r}={i}' for t, i in only)}): compare runs the same ids "
                             f"through both, so they must share one")
    ia, ib = _ids(a, PROBE), _ids(b, PROBE)
    if ia != ib:
        raise HeadscopeError(f"{base.name} and {other.name} tokenize the same text differently ({len(ia)} vs "
                             f"{len(ib)} ids for a probe sentence): compare needs one tokenizer for both")


__all__ = ["PROBE", "check_model_name", "check_same_tokenizer"]
