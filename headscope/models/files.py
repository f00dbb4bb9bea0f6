"""Checks of a model folder's files before transformers reads them: a damaged file is a user's error, named."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

from ..errors import HeadscopeError, plural


def check_safetensors(path: Path) -> None:
    """Refuse a .safetensors file whose header does not parse or whose tensors run past its end (a truncated
    copy or download), naming the file and its sizes; reads the header only."""
    size = path.stat().st_size
    redo = "copy or save it again (save_pretrained), or give another model"
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"its header claims {n:,} bytes")
            header = json.loads(f.read(n))
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError) as e:
        raise HeadscopeError(f"{str(path)!r} is not a readable safetensors file ({size:,} bytes; {e}); "
                             f"{redo}") from None
    if 8 + n + end > size:
        raise HeadscopeError(f"{str(path)!r} is truncated: it holds {size:,} bytes but its tensors need "
                             f"{8 + n + end:,}; {redo}")


def check_weight_files(folder: Path) -> None:
    """Every .safetensors file of a model folder checked (see `check_safetensors`)."""
    for f in sorted(folder.glob("*.safetensors")):
        check_safetensors(f)


# The JSON files a tokenizer is read from (transformers parses them with json.load and lets its error through).
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json")


def check_tokenizer_files(folder: Path) -> None:
    """Refuse a model folder whose tokenizer JSON files do not parse (a truncated copy or download), naming the file,
    before the weights load (transformers would raise a bare JSONDecodeError while building the tokenizer)."""
    for name in TOKENIZER_JSON:
        f = folder / name
        if not f.is_file():
            continue
        try:
            json.loads(f.read_bytes())
        except (ValueError, OSError) as e:
            why = e.strerror if isinstance(e, OSError) else f"not JSON: {str(e).splitlines()[0]}"
            size = f.stat().st_size
            raise HeadscopeError(f"{str(f)!r} cannot be read ({why}; {size:,} bytes): is it truncated? copy the "
                                 f"tokenizer files again from the model it came from (save_pretrained writes "
                                 f"them)") from None


def check_head_geometry(config: dict[str, Any], name: str) -> None:
    """Refuse a config whose attention heads do not divide its hidden size (and which gives no head_dim),
    before a model is built from it."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    d, h = text.get("hidden_size"), text.get("num_attention_heads")
    if not isinstance(d, int) or not isinstance(h, int) or text.get("head_dim") is not None:
        return
    if h < 1:
        raise HeadscopeError(f"{name!r}: num_attention_heads is {h} in its config.json; it must be at least 1")
    if d % h:
        divisors = [k for k in range(1, min(d, 64) + 1) if d % k == 0]
        raise HeadscopeError(f"{name!r}: hidden_size {d} is not divisible by num_attention_heads {h} and the config "
                             f"gives no head_dim; use a head count that divides it (e.g. "
                             f"{', '.join(map(str, divisors[-4:]))}) or add head_dim")


class IncompleteCheckpoint(HeadscopeError):
    """A checkpoint whose weight files do not fill the model its config describes."""


def _layer_span(keys: list[str]) -> str:
    """'; layers 2-5' ('; layer 5', '; layers 2, 4') for the layer indices in weight names, '' when none appear."""
    found = sorted({int(n) for k in keys for n in re.findall(r"\.(\d+)\.", k)[:1]})
    if len(found) == 1:
        return f"; layer {found[0]}"
    if len(found) > 2 and found == list(range(found[0], found[-1] + 1)):
        return f"; layers {found[0]}-{found[-1]}"
    return f"; layers {', '.join(map(str, found[:8]))}{', ...' if len(found) > 8 else ''}" if found else ""


def body_keys(model: Any, keys: Any) -> list[str]:
    """The names among `keys` (unexpected weights transformers reports) that claim a place in the model's own body:
    under its base model (`model.`, `transformer.`, ...) or one of the base model's modules. A head for another
    task (BERT's `cls.seq_relationship` in a masked-LM checkpoint, a classifier beside an LM) is not the body:
    transformers drops it as its notes say, and the measured model is whole without it."""
    base = getattr(model, "base_model", model)
    prefix = getattr(model, "base_model_prefix", "")
    own = {name for name, _ in base.named_children()}
    body = []
    for key in sorted(keys):
        prefixed = bool(prefix) and key.startswith(prefix + ".")
        inner = key[len(prefix) + 1:] if prefixed else key  # a bare base model may be given prefixed names
        if (prefixed and base is not model) or inner.split(".")[0] in own:
            body.append(key)
    return body


def check_complete(name: str, missing: Any, unexpected: Any, model: Any) -> None:
    """Refuse a checkpoint whose weights lack tensors the config needs (transformers would fill them with random
    values, silently) or hold tensors of the body the config has no place for (a checkpoint of another shape).

    `missing` and `unexpected` are transformers' loading info (`from_pretrained(output_loading_info=True)`), which
    already leaves out what it ignores by design (tied weights, rotary `inv_freq` buffers, ...)."""
    missing = sorted(missing)
    extra = body_keys(model, unexpected)
    if not missing and not extra:
        return
    problems = []
    if missing:
        problems.append(f"its weights lack {plural(len(missing), 'tensor')} the config needs ("
                        f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}{_layer_span(missing)}), "
                        f"which would be random")
    if extra:
        problems.append(f"it holds {plural(len(extra), 'tensor')} the config has no place for ("
                        f"{', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}{_layer_span(extra)})")
    raise IncompleteCheckpoint(
        f"model {name!r} does not match its config: {' and '.join(problems)}; give the whole checkpoint (its "
        f"config.json and every weight file it was saved with), or allow_random_weights=True to measure randomly "
        f"initialised weights on purpose", fields=("allow_random_weights",))
