"""One self-contained HTML page: inline CSS and JS, data embedded as JSON, nothing fetched."""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any

# The browser itself refuses any network load: only inline code and data: images are allowed.
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
       "connect-src 'none'; font-src 'none'; form-action 'none'; base-uri 'none'")


def asset(name: str) -> str:
    """The text of a file in headscope/report/assets."""
    # joinpath one part at a time: Python 3.10's Traversable.joinpath takes a single child
    return resources.files("headscope.report").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON safe inside a <script> element: every '<' (only ever inside a JSON string) is written \\u003c, so no
    '</script' or '<!--' can close or confuse it, and the text is still valid JSON."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False, default=str)
    text = text.replace("<", "\\u003c")
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page(data: dict[str, Any]) -> str:
    """The report page for `data` (as built by `headscope.report.build.collect`)."""
    title = html.escape(f"headscope report: {data.get('model', {}).get('model', 'model')}")
    css = asset("report.css")
    js = asset("report.js").replace("</script", "<\\/script")
    # the sections the script fills, in the order of the three questions
    main = asset("main.html")
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<header><h1 id="title">{title}</h1><div class="meta" id="meta"></div></header>
<nav><a href="#q1">1. What do the heads learn?</a><a href="#q2">2. Are more heads better?</a>
<a href="#q3">3. Which heads are redundant?</a><a href="#about">About</a></nav>
{main}<footer>Written by headscope; works offline (no scripts, fonts or images are loaded from anywhere).</footer>
<script type="application/json" id="hs-data">{embed_json(data)}</script>
<script>
{js}
</script>
</body>
</html>
"""
