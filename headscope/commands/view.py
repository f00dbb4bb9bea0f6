"""`headscope view [MODEL]`: a local page to type text and see any head's attention beside its measured evidence."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from ..errors import HeadscopeError
from ..view import DEFAULT_MAX_TOKENS, ViewOptions
from ..view.heads import heads_table
from ..view.page import EXAMPLES
from ..view.server import LOOPBACK, ViewApp, make_server
from ._common import add_model_arg, load_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("view", help="a local page: type text, see any head's attention beside its measured "
                                    "roles, importance and patching effect",
                       description="Load the model once and serve a page (and a JSON API, docs/view.md) where "
                                   "you type text and see each head's attention as arcs and a heat map, beside "
                                   "what the --from folders measured about that head. Binds 127.0.0.1 unless "
                                   "--host says otherwise. Ctrl-C stops it.")
    add_model_arg(p)
    p.add_argument("--from", dest="from_dirs", action="append", default=None, metavar="DIR",
                   help="a folder holding analyze, roles, score, kvcache or patch outputs, or a study folder "
                        "(repeatable; earlier folders win)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; anything else exposes the "
                        "model to the network)")
    p.add_argument("--open", action="store_true", help="open the page in the default browser")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"longest text a request may send, in tokens (default {DEFAULT_MAX_TOKENS})")
    p.set_defaults(func=run)


def check_address(host: str, port: int) -> None:
    """Refuse an address no server can listen on, before the model loads."""
    if not host.strip():
        raise HeadscopeError("--host is empty; give an address to listen on, e.g. 127.0.0.1 (this machine only)")
    if not 0 <= port <= 65535:
        raise HeadscopeError(f"--port must be from 1 to 65535 (0: any free port); got {port}")


def run(args: argparse.Namespace) -> int:
    options = ViewOptions(from_dirs=tuple(args.from_dirs or ()), max_tokens=args.max_tokens).validate()
    check_address(args.host, args.port)
    hm = load_from_args(args)
    if hm.tokenizer is None:  # every request is text: refuse now, not on each request
        raise HeadscopeError(f"{args.model} has no tokenizer, so the view cannot read text; give a model folder "
                             f"with its tokenizer files")
    app = ViewApp(hm, heads_table(hm, options.from_dirs), options.max_tokens, EXAMPLES)
    server = make_server(app, args.host, args.port)
    host, port = str(args.host), int(server.server_address[1])  # port 0: the one the OS chose
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
    if args.host not in LOOPBACK:
        print(f"headscope view: warning: --host {args.host} exposes the model to every machine that can reach this "
              f"one; anyone there can run text through it (use --host 127.0.0.1 for this machine only)",
              file=sys.stderr, flush=True)
    print(f"headscope view: {hm.name} on {url} (Ctrl-C stops)", flush=True)
    if args.open:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("headscope view: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
