"""Look at any head, live: a text's attention for every head beside what the other verbs measured about it.

`headscope view MODEL` serves the page (`serve`, on `server.py`); in a notebook, `headscope.view(hm, "text")`
returns a `View` that displays the same page inline, self-contained (its maps embedded, nothing fetched).

This package module is callable (`headscope.view(hm, text)`): the package and the function share the name
`view`, and once `headscope.view` is imported as a package the attribute `headscope.view` is the package,
so the package itself forwards calls to `view()`.
"""

from __future__ import annotations

import html
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import HeadscopeError
from ..io import atomic_write_text
from ..models.adapter import HeadModel
from ..options import Result
from ..table import head_name, parse_head
from .attention import SMALL_MAX, all_heads, check_head, encode, one_head
from .heads import heads_table
from .options import DEFAULT_MAX_TOKENS, ViewOptions
from .page import EXAMPLES, model_info, page
from .server import ViewApp, ViewServer, make_server

__all__ = ["DEFAULT_MAX_TOKENS", "EXAMPLES", "View", "ViewOptions", "serve", "view"]


@dataclass
class View(Result):
    """One text's attention as the model computes it, with the heads table: shown inline by notebooks."""

    files = ("view.html",)

    info: dict[str, Any]
    text: str
    tokens: list[str]
    ids: list[int]
    heads: tuple[tuple[int, int], ...]
    maps: list[np.ndarray] | None  # every head (short texts): per layer [head, query, key]
    attention: dict[str, np.ndarray]  # the chosen heads of a long text: L3H7 -> [query, key]
    table: dict[str, Any]
    # what was done to the text (cut to the model's positions), else None
    note: str | None = None

    def weights(self, layer: int, head: int) -> np.ndarray:
        """One head's map `[query, key]` (rows are queries)."""
        per_layer = self.info["heads_in_layer"]
        for name, value in (("layer", layer), ("head", head)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
                raise HeadscopeError(f"{name} must be a whole number, got {value!r} ({type(value).__name__})")
        if not 0 <= layer < len(per_layer):
            raise HeadscopeError(f"layer {layer} does not exist: the model has layers 0..{len(per_layer) - 1}")
        if not 0 <= head < per_layer[layer]:
            raise HeadscopeError(f"head {head} does not exist in layer {layer}: it has heads 0..{per_layer[layer] - 1}"
                                 if per_layer[layer] else f"layer {layer} has no attention heads")
        layer, head = int(layer), int(head)
        if self.maps is not None:
            return self.maps[layer][head]
        if head_name(layer, head) not in self.attention:
            raise HeadscopeError(f"{head_name(layer, head)} was not computed for this long text; it holds "
                                 f"{', '.join(self.attention)} (pass ViewOptions(heads=...))")
        return self.attention[head_name(layer, head)]

    def to_pandas(self) -> pd.DataFrame:
        """One row per (layer, head, query, key) held: the weight and both tokens."""
        pairs = [(l, h) for l in range(len(self.maps)) for h in range(self.maps[l].shape[0])] \
            if self.maps is not None else list(self.heads)
        T = len(self.tokens)
        q, k = np.divmod(np.arange(T * T), T)
        frames = [pd.DataFrame({"layer": l, "head": h, "query": q, "key": k,
                                "query_token": np.asarray(self.tokens, dtype=object)[q],
                                "key_token": np.asarray(self.tokens, dtype=object)[k],
                                "weight": self.weights(l, h).ravel()}) for l, h in pairs]
        return pd.concat(frames, ignore_index=True)

    def html(self) -> str:
        """The page, self-contained: the view's maps and heads table embedded, nothing fetched."""
        digits = 4
        static = {"text": self.text, "tokens": self.tokens, "note": self.note, "slots": [list(h) for h in self.heads],
                  "maps": [np.round(m.astype(np.float64), digits).tolist() for m in self.maps]
                  if self.maps is not None else None,
                  "attention": {k: np.round(v.astype(np.float64), digits).tolist() for k, v in self.attention.items()},
                  "heads": self.table}
        return page(self.info, static=static)

    def _repr_html_(self) -> str:
        # An iframe keeps the page's script and styles apart from the notebook's; srcdoc keeps it self-contained.
        # Its width follows the cell's (the page stacks its panels in one column below 760 px).
        return (f'<iframe srcdoc="{html.escape(self.html(), quote=True)}" style="width:100%;max-width:100%;'
                f'box-sizing:border-box;height:900px;border:1px solid #ddd" title="headscope view"></iframe>')

    def __repr__(self) -> str:
        """A plain REPL's summary: the model, the text's token count and the heads shown."""
        shown = ", ".join(head_name(l, h) for l, h in self.heads)
        held = "every head" if self.maps is not None else "the shown heads"
        text = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"<headscope view of {self.info['name']}: {len(self.tokens)} tokens of {text!r}; showing {shown} " \
               f"(maps of {held}); .weights(layer, head), .to_pandas(), .save(folder)>"

    def write(self, folder: Path) -> None:
        """view.html: the page with this text's maps (`save(out)` stages it beside `out`, then moves it in)."""
        if not isinstance(folder, (str, os.PathLike)):
            raise HeadscopeError(f"folder must be a path, got {folder!r} ({type(folder).__name__})")
        atomic_write_text(Path(folder) / "view.html", self.html())

    def lines(self) -> list[str]:
        """What the CLI prints about this view."""
        shown = ", ".join(head_name(l, h) for l, h in self.heads)
        held = "every head" if self.maps is not None else f"{shown} only (longer than {SMALL_MAX} tokens)"
        return [f"{self.info['name']}: {len(self.tokens)} tokens; maps of {held}; showing {shown}",
                *([self.note] if self.note else [])]


def view(hm: HeadModel, text: str, options: ViewOptions | None = None, **changes: Any) -> View:
    """The live view's page for one text, for a notebook: every head's map (texts up to `SMALL_MAX` tokens) or
    the chosen heads' alone, beside the evidence in `options.from_dirs`; `changes` replace option fields
    (`heads=("L1H4",)`). Writes nothing."""
    if not isinstance(hm, HeadModel):
        raise HeadscopeError(f"hm must be a loaded model (headscope.load_model(...)), got {type(hm).__name__}")
    if options is not None and not isinstance(options, ViewOptions):
        raise HeadscopeError(f"options must be a ViewOptions, got {type(options).__name__}")
    options = (options or ViewOptions()).replace(**changes).validate()
    first = next((l for l in range(hm.n_layers) if hm.heads_in_layer(l)), 0)
    heads = tuple(parse_head(h) for h in options.heads) or ((first, 0),)
    for l, h in heads:
        check_head(hm, l, h)
    enc = encode(hm, text, options.max_tokens)
    short = len(enc.ids) <= SMALL_MAX
    maps = all_heads(hm, enc.ids) if short else None
    attention = {} if short else {head_name(l, h): one_head(hm, enc.ids, l, h) for l, h in heads}
    return View(info=model_info(hm, options.max_tokens), text=enc.text, tokens=enc.tokens, ids=enc.ids, heads=heads,
                maps=maps, attention=attention, table=heads_table(hm, options.from_dirs), note=enc.note)


def serve(hm: HeadModel, options: ViewOptions | None = None, *, server: ViewServer | None = None,
          **changes: Any) -> ViewServer:
    """The live view's server for a loaded model, listening on `options.host`:`options.port` (port 0: a free one),
    each head beside the evidence in `options.from_dirs`; the caller runs `serve_forever()` and closes it.
    `server`: one already listening (the command binds its port before the model loads), given the app."""
    options = (options or ViewOptions()).replace(**changes).validate()
    if hm.tokenizer is None:  # every request is text: refuse now, not on each request
        raise HeadscopeError(f"{hm.name} has no tokenizer, so the view cannot read text; give a model folder with "
                             f"its tokenizer files")
    app = ViewApp(hm, heads_table(hm, options.from_dirs), options.max_tokens, EXAMPLES)
    if server is None:
        return make_server(app, options.host, options.port)
    server.app = app
    return server


class _CallableModule(types.ModuleType):
    """The package, callable as `view()` (see the module's docstring)."""

    def __call__(self, hm: HeadModel, text: str, options: ViewOptions | None = None, **changes: Any) -> View:
        return view(hm, text, options, **changes)


sys.modules[__name__].__class__ = _CallableModule
