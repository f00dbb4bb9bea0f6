"""`headscope view [MODEL]`: a local page to type text and see any head's attention beside its measured evidence."""

from __future__ import annotations

import argparse
import sys
import webbrowser

from ..options.cli import verb_parser
from ..view import serve
from ..view.options import ViewOptions
from ..view.server import is_loopback, make_server
from ._common import load_from_args


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(sub, "view", ViewOptions,
                    help="a local page: type text, see any head's attention beside its measured roles, importance "
                         "and patching effect",
                    description="Load the model once and serve a page (and a JSON API, docs/view.md) where you "
                                "type text and see each head's attention as arcs and a heat map, beside what the "
                                "--from folders measured about that head. Binds 127.0.0.1 unless --host says "
                                "otherwise. Ctrl-C stops it.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = ViewOptions.from_namespace(args)  # validated by the CLI before this runs
    server = make_server(None, options.host, options.port)  # a busy port is refused before the model loads
    try:
        hm = load_from_args(args)
        serve(hm, options, server=server)  # the library builds the app; the command prints and serves
        host, port = options.host, int(server.server_address[1])  # port 0: the one the OS chose
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
        if not is_loopback(host):
            print(f"headscope view: warning: --host {host} exposes the model to every machine that can reach this "
                  f"one; anyone there can run text through it (use --host 127.0.0.1 for this machine only)",
                  file=sys.stderr, flush=True)
        print(f"headscope view: {hm.name} on {url} (Ctrl-C stops)", flush=True)
        if options.open:
            webbrowser.open(url)
        server.serve_forever()
    except KeyboardInterrupt as e:
        # SIGTERM (the CLI's KeyboardInterrupt subclass): exit 143 as documented
        if type(e) is not KeyboardInterrupt:
            raise
        print("headscope view: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
