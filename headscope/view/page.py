"""The view's one page: HTML, CSS and script shipped in the package (headscope/view/assets), inlined.

The same page serves both uses: live (`headscope view`: the script asks the JSON API of the server that sent
it) and static (`headscope.view(hm, text)` in a notebook: the maps are embedded and nothing is fetched).
Nothing is loaded from anywhere else, and the script writes every piece of data with `textContent`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from importlib import resources
from typing import Any

from ..eval.metrics import has_lm_head
from ..models.adapter import HeadModel
from ..report.html import embed_json
from .attention import MAX_CHARS, SMALL_MAX
from .card_schema import PageInfo, to_json
from .generate import MAX_NEW_TOKENS
from .norms import WEIGHTINGS
from .windows import MAX_WINDOW

__all__ = ["EXAMPLES", "PAGE_CSP", "STATIC_CSP", "asset", "model_info", "page"]

EXAMPLES = (
    "The cat sat on the mat because it was tired.",
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The keys to the cabinet are on the table.",
    "Harry Potter went to Hogwarts. Later, Harry Potter saw Hermione.",
    "The war lasted from 1732 to 17",
)


# Live: the page may call its own server's API and nothing else. Static: it calls nothing at all.
_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
        "font-src 'none'; form-action 'none'; base-uri 'none'; connect-src ")
PAGE_CSP = _CSP + "'self'"
STATIC_CSP = _CSP + "'none'"


def asset(name: str) -> str:
    """The text of a file in headscope/view/assets."""
    # joinpath one part at a time: Python 3.10's Traversable.joinpath takes a single child
    return resources.files("headscope.view").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def model_info(hm: HeadModel, max_tokens: int, examples: Sequence[str] = EXAMPLES) -> dict[str, Any]:
    """What the page needs to know about the model: name, shape, limits and example sentences (JSON-ready, as
    declared by `card_schema.PageInfo`)."""
    info = PageInfo(name=hm.name, model_type=hm.config.model_type, n_layers=hm.n_layers, n_heads=hm.n_heads,
                    n_kv_heads=hm.n_kv_heads, heads_in_layer=[hm.heads_in_layer(l) for l in range(hm.n_layers)],
                    causal=bool(hm.causal), max_tokens=max_tokens, max_chars=MAX_CHARS, small_max=SMALL_MAX,
                    examples=list(examples), **features(hm))
    return to_json(info)


def features(hm: HeadModel) -> dict[str, Any]:
    """Issue 43's parts of the page's model info: generation, weightings, windows of long maps."""
    return {"generates": has_lm_head(hm), "max_new_tokens": MAX_NEW_TOKENS, "weightings": list(WEIGHTINGS),
            "max_window": MAX_WINDOW, "max_positions": hm.max_positions}


def page(info: dict[str, Any], static: dict[str, Any] | None) -> str:
    """The page for a model (`info`: name, shape, limits, examples); `static` embeds a text's maps and the
    heads table for a page that runs without a server."""
    title = html.escape(f"headscope view: {info.get('name', 'model')}")
    csp = STATIC_CSP if static is not None else PAGE_CSP
    js = asset("view.js").replace("</script", "<\\/script")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>
{asset("view.css")}
</style>
</head>
<body>
{asset("view.html")}
<script type="application/json" id="hs-view-data">{embed_json({"info": info, "static": static})}</script>
<script>
{js}
</script>
</body>
</html>
"""
