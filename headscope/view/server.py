"""The live view's HTTP server: the page and a small JSON API over one loaded model.

The standard library's `ThreadingHTTPServer`: no new dependency, and each request gets its own thread, so
the page, the heads table and waiting requests are served while the model computes. The model itself runs
one request at a time under a lock (a forward pass switches the model's attention function, and torch
already uses every core for one pass). At most `MAX_WAITING` requests wait for it; more get 429.

Requests name no file: the page is built in memory at start, and the only routes are `ROUTES`. Every
refusal is a 4xx (or a 503) with `{"error": "..."}`, and no traceback ever reaches a client. Only the Host
names the bound address is reached by are answered (`hosts.py`); no answer may be framed; a client has
`REQUEST_SECONDS` for its whole request; a long text's map is sent row by row, `LONG_AT_ONCE` at a time.
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from ..errors import HeadscopeError
from ..models.adapter import HeadModel
from .attention import SMALL_MAX, Encoded, TooLong, all_heads, check_head, encode, one_head
from .generate import MAX_NEW_TOKENS, check_generates, continue_greedily
from .hosts import HostCheck, is_loopback
from .norms import WEIGHTINGS, norm_weights, value_norms
from .page import PAGE_CSP, model_info, page
from .windows import encode_ids, overview, parse_window, window

log = logging.getLogger(__name__)

__all__ = ["HEADER_CSP", "LONG_AT_ONCE", "LONG_TOKENS", "MAX_WAITING", "REQUEST_SECONDS", "ROUTES", "ViewApp",
           "ViewServer", "is_loopback", "make_server"]

# requests queued for the model at once; more are told to retry (429)
MAX_WAITING = 64
# texts whose every-head maps are kept (switching heads needs no new forward pass)
CACHE = 16
# A long text's one-head map is T x T: its answer holds the float32 map and the JSON text (docs/view.md, memory).
# At most LONG_AT_ONCE such answers are computed or sent at once; another is told to retry (503).
LONG_TOKENS = 1024
LONG_AT_ONCE = 1
# a client must send its whole request (line and headers) within this, however it drips
REQUEST_SECONDS = 30
# The page may not be framed by another site (clickjacking): only an HTTP header can say so, not the page's meta.
HEADER_CSP = PAGE_CSP + "; frame-ancestors 'none'"
ROUTES = {"/api/attention": ("text", "layer", "head"), "/api/maps": ("text",), "/api/heads": (),
          "/api/model": ()}
# Issue 43: token ids in place of a text (a generated continuation), norm-based weights, windows of long maps.
ROUTES["/api/attention"] += ("ids", "weighting", "window")
ROUTES["/api/maps"] += ("ids", "weighting")
ROUTES["/api/generate"] = ("text", "tokens")
# long texts' one-head maps kept, so moving a window needs no new forward pass
LONG_CACHE = 2
_INT = re.compile(r"[0-9]{1,6}")


class BadRequest(Exception):
    """A request the API refuses: its status and the one-line message sent as {"error": ...}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _params(route: str, query: str) -> dict[str, str]:
    """The query string's parameters, each given once and each one the route takes."""
    try:
        parsed = parse_qs(query, keep_blank_values=True, max_num_fields=8)
    except ValueError as e:
        raise BadRequest(400, f"bad query string ({e})") from None
    allowed = ROUTES[route]
    for name, values in parsed.items():
        if name not in allowed:
            takes = ", ".join(allowed) if allowed else "no parameters"
            raise BadRequest(400, f"unknown parameter {name!r}; {route} takes {takes}")
        if len(values) != 1:
            raise BadRequest(400, f"parameter {name!r} is given {len(values)} times; give it once")
    return {k: v[0] for k, v in parsed.items()}


def _int(params: dict[str, str], name: str) -> int:
    if name not in params:
        raise BadRequest(400, f"missing parameter {name!r}: a whole number from 0")
    if not _INT.fullmatch(params[name]):
        raise BadRequest(400, f"parameter {name}={params[name][:40]!r} is not a whole number from 0")
    return int(params[name])


def _weighting(params: dict[str, str]) -> str:
    """`weighting`: the probabilities ("attention", the default) or Kobayashi's norms ("norm", norms.py)."""
    w = params.get("weighting", "attention")
    if w not in WEIGHTINGS:
        raise BadRequest(400, f"parameter weighting={w[:40]!r} is not known; choose {' or '.join(WEIGHTINGS)}")
    return w


def _rounded(a: np.ndarray, digits: int) -> list[Any]:
    out: list[Any] = np.round(a.astype(np.float64), digits).tolist()
    return out


def _dumps(data: Any) -> bytes:
    """JSON as the API sends it: nothing that is not JSON (NaN, inf) ever leaves the server."""
    return json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _with_map(head: dict[str, Any], key: str, matrix: np.ndarray, digits: int) -> list[bytes]:
    """`head` as JSON with `key` set to `matrix` (rounded to `digits` decimals), in pieces of one row each: the
    map is never a Python list of T x T floats, only one row at a time (a 3000-token map is 9 million)."""
    start = _dumps({**head, key: None})
    assert start.endswith(b"null}")
    pieces = [start[:-len(b"null}")] + b"["]
    for i, row in enumerate(matrix):
        pieces.append((b"," if i else b"") + _dumps(_rounded(row, digits)))
    pieces.append(b"]}")
    return pieces


class ViewApp:
    """What every request reads: the model (behind its lock), its limits, the heads table and the page."""

    def __init__(self, hm: HeadModel, heads: dict[str, Any], max_tokens: int, examples: Sequence[str]) -> None:
        self.hm, self.heads, self.max_tokens, self.examples = hm, heads, max_tokens, examples
        self.lock = threading.Lock()  # the model: one forward pass at a time
        self.cache_lock = threading.Lock()  # the maps cache, read by every request thread
        # A fast tokenizer's Rust object refuses concurrent calls that reset its truncation ("Already borrowed").
        self.tokenizer_lock = threading.Lock()
        self.waiting = threading.BoundedSemaphore(MAX_WAITING)
        self.long = threading.BoundedSemaphore(LONG_AT_ONCE)  # long answers being computed or sent
        self.maps: OrderedDict[str, tuple[Encoded, list[np.ndarray]]] = OrderedDict()
        # (ids, layer, head, weighting) -> one head's long map, the last LONG_CACHE asked (windows move over it)
        self.long_maps: OrderedDict[tuple[Any, ...], np.ndarray] = OrderedDict()
        self.info = model_info(hm, max_tokens, examples)
        self.page = page(self.info, static=None).encode("utf-8")

    def _model(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the model once it is free; refuse when too many requests already wait."""
        if not self.waiting.acquire(blocking=False):
            raise BadRequest(429, f"busy: {MAX_WAITING} requests are already waiting for the model; retry shortly")
        try:
            with self.lock:
                return fn()
        finally:
            self.waiting.release()

    def _every_head(self, enc: Encoded) -> list[np.ndarray]:
        def cached() -> list[np.ndarray] | None:
            with self.cache_lock:
                if enc.text in self.maps and self.maps[enc.text][0].ids == enc.ids:
                    self.maps.move_to_end(enc.text)
                    return self.maps[enc.text][1]
            return None

        # under the model's lock: a request that waited finds its text done
        def compute() -> list[np.ndarray]:
            found = cached()
            if found is not None:
                return found
            maps = all_heads(self.hm, enc.ids)
            with self.cache_lock:
                self.maps[enc.text] = (enc, maps)
                while len(self.maps) > CACHE:
                    self.maps.popitem(last=False)
            return maps

        found = cached()
        return found if found is not None else self._model(compute)

    def encode(self, params: dict[str, str]) -> Encoded:
        if "ids" in params:
            return self.encode_ids(params)
        if "text" not in params:
            raise BadRequest(400, "missing parameter 'text'")
        try:
            with self.tokenizer_lock:
                return encode(self.hm, params["text"], self.max_tokens)
        except TooLong as e:
            raise BadRequest(413, str(e)) from None
        except HeadscopeError as e:
            raise BadRequest(400, str(e)) from None

    @contextmanager
    def _long_slot(self, n_tokens: int) -> Iterator[None]:
        """Hold one of the LONG_AT_ONCE places for a long answer while it is computed and sent; refuse (503)
        when they are all taken, before any work."""
        if n_tokens < LONG_TOKENS:
            yield
            return
        if not self.long.acquire(blocking=False):
            raise BadRequest(503, f"busy: a long text ({LONG_TOKENS} tokens or more) is already being answered and "
                                  f"the view answers {LONG_AT_ONCE} at a time (each needs memory for its "
                                  f"tokens^2 map); retry when it is done")
        try:
            yield
        finally:
            self.long.release()

    def attention(self, params: dict[str, str], send: Callable[[list[bytes]], None]) -> None:
        """{"tokens", "ids", "layer", "head", "note", "weights"}: rows are queries, the model's own
        probabilities; `note` says when the text was cut to the model's positions (else null)."""
        layer, head = _int(params, "layer"), _int(params, "head")
        try:
            check_head(self.hm, layer, head)
        except HeadscopeError as e:
            raise BadRequest(400, str(e)) from None
        enc = self.encode(params)
        weighting = _weighting(params)
        with self._long_slot(len(enc.ids)):
            if "window" in params:
                send([_dumps(self.attention_window(enc, layer, head, weighting, params["window"]))])
                return
            if len(enc.ids) <= SMALL_MAX:
                weights = self._every_head(enc)[layer][head]
            else:  # long inputs: this head alone
                weights = self._model(lambda: one_head(self.hm, enc.ids, layer, head))
            if weighting == "norm":
                weights = norm_weights(weights, self._norms(enc, layer)[head])
            send(_with_map({"tokens": enc.tokens, "ids": enc.ids, "layer": layer, "head": head, "note": enc.note,
                            "weighting": weighting}, "weights", weights, 6))

    # ---- issue 43: token ids, norm-based weights, windows of long maps, generation ------------------------
    def encode_ids(self, params: dict[str, str]) -> Encoded:
        if "text" in params:
            raise BadRequest(400, "give either 'text' or 'ids', not both")
        try:
            with self.tokenizer_lock:
                return encode_ids(self.hm, params["ids"], self.max_tokens)
        except TooLong as e:
            raise BadRequest(413, str(e)) from None
        except HeadscopeError as e:
            raise BadRequest(400, str(e)) from None

    def _norms(self, enc: Encoded, layer: int) -> np.ndarray:
        """`|| f(x_j) ||` of `layer`'s heads, `[head, key]` (norms.py)."""
        try:
            return self._model(lambda: value_norms(self.hm, enc.ids, [layer]))[layer]
        except HeadscopeError as e:
            raise BadRequest(400, str(e)) from None

    def _long_map(self, enc: Encoded, layer: int, head: int, weighting: str) -> np.ndarray:
        """One head's whole map, kept for the last `LONG_CACHE` asks (a moving window needs no new pass)."""
        key = (tuple(enc.ids), layer, head, weighting)
        with self.cache_lock:
            if key in self.long_maps:
                self.long_maps.move_to_end(key)
                return self.long_maps[key]
        if len(enc.ids) <= SMALL_MAX:
            weights = self._every_head(enc)[layer][head]
        else:
            weights = self._model(lambda: one_head(self.hm, enc.ids, layer, head))
        if weighting == "norm":
            weights = norm_weights(weights, self._norms(enc, layer)[head])
        with self.cache_lock:
            self.long_maps[key] = weights
            while len(self.long_maps) > LONG_CACHE:
                self.long_maps.popitem(last=False)
        return weights

    def attention_window(self, enc: Encoded, layer: int, head: int, weighting: str, raw: str) -> dict[str, Any]:
        """A window of one head's map (`window=Q0,K0,SIZE`), with the whole map's max-pooled overview."""
        try:
            q0, k0, size = parse_window(raw)
        except HeadscopeError as e:
            raise BadRequest(400, str(e)) from None
        full = self._long_map(enc, layer, head, weighting)
        block, q0, k0 = window(full, q0, k0, min(size, len(enc.ids)))
        return {"tokens": enc.tokens, "ids": enc.ids, "layer": layer, "head": head, "weighting": weighting,
                "note": enc.note, "window": {"q0": q0, "k0": k0, "size": block.shape[0]}, "weights": _rounded(block, 6),
                "max": round(float(full.max()), 6), "overview": _rounded(overview(full), 4)}

    def generate(self, params: dict[str, str]) -> dict[str, Any]:
        """The text continued greedily by `tokens` tokens: every id and token, and where the continuation starts."""
        try:
            check_generates(self.hm)
        except HeadscopeError as e:
            raise BadRequest(400, str(e)) from None
        n = _int(params, "tokens")
        if not 1 <= n <= MAX_NEW_TOKENS:
            raise BadRequest(400, f"parameter tokens={n}: generate from 1 to {MAX_NEW_TOKENS} tokens")
        enc = self.encode(params)
        if len(enc.ids) + n > self.max_tokens:
            raise BadRequest(413, f"text has {len(enc.ids)} tokens; with tokens={n} more it would pass the limit "
                                  f"of {self.max_tokens} tokens (ask for fewer tokens)")
        done = self._model(lambda: continue_greedily(self.hm, enc.ids, n))
        ids = done.prompt + done.generated
        with self.tokenizer_lock:
            tokens = [str(t) for t in self.hm.tokenizer.convert_ids_to_tokens(ids)]
            continuation = str(self.hm.tokenizer.decode(done.generated))
        return {"text": enc.text, "continuation": continuation, "ids": ids, "tokens": tokens, "note": enc.note,
                "prompt_tokens": len(done.prompt), "generated": len(done.generated), "stopped": done.stopped}

    def every_map(self, params: dict[str, str]) -> dict[str, Any]:
        """Every head's map for a short text (small multiples), rounded to 4 decimals."""
        enc = self.encode(params)
        if len(enc.ids) > SMALL_MAX:
            raise BadRequest(413, f"text has {len(enc.ids)} tokens; every head's map is given up to {SMALL_MAX} "
                                  f"tokens (ask /api/attention for one head of a longer text)")
        maps = self._every_head(enc)
        weighting = _weighting(params)
        if weighting == "norm":
            norms = self._model(lambda: value_norms(self.hm, enc.ids, range(self.hm.n_layers)))
            maps = [norm_weights(m, norms[l]) if m.shape[0] else m for l, m in enumerate(maps)]
        return {"tokens": enc.tokens, "ids": enc.ids, "note": enc.note, "maps": [_rounded(m, 4) for m in maps],
                "weighting": weighting}

    def answer(self, route: str, params: dict[str, str], send: Callable[[list[bytes]], None]) -> None:
        """Answer `route` by calling `send` with the JSON body's pieces (a refusal raises BadRequest first)."""
        if route == "/api/attention":
            self.attention(params, send)
        elif route == "/api/maps":
            send([_dumps(self.every_map(params))])
        elif route == "/api/generate":
            send([_dumps(self.generate(params))])
        elif route == "/api/heads":
            send([_dumps(self.heads)])
        else:
            send([_dumps(self.info)])


class _DeadlineReader(io.RawIOBase):
    """The connection's reading side under one deadline per request: every receive may wait only for the time
    left, so a client dripping a byte every few seconds is cut off when the deadline passes, not reset by it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + REQUEST_SECONDS

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the request was not complete within {REQUEST_SECONDS} s")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


# a client that went away or stalled: one quiet log line, no traceback
_GONE = (ConnectionError, TimeoutError)


class ViewHandler(BaseHTTPRequestHandler):
    """One request: the page at /, the API under /api/, a JSON 4xx for anything else."""

    server: ViewServer
    server_version = "headscope-view"
    sys_version = ""
    # also the most one send may wait for a client that stopped reading
    timeout = REQUEST_SECONDS

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + REQUEST_SECONDS  # the whole request, from its first byte
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.connection.settimeout(self.timeout)  # read; the answer's sends get the full timeout again
        return ok

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)

    def _head(self, status: int, length: int, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", HEADER_CSP)
        self.send_header("X-Frame-Options", "DENY")
        if status == 429 or status == 503:
            self.send_header("Retry-After", "1")
        self.end_headers()

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self._head(status, len(body), content_type)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, pieces: list[bytes]) -> None:
        """A 200 JSON answer sent piece by piece (a long map is never joined into one string)."""
        self._head(200, sum(len(p) for p in pieces), "application/json; charset=utf-8")
        for piece in pieces:
            self.wfile.write(piece)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, _dumps(data), "application/json; charset=utf-8")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a request line too long, malformed, an unknown method) as JSON 4xx too."""
        # an HTTP method http.server does not know: a method refusal like any other
        if code == 501:
            code, message = 405, f"{self.command or 'this method'} is not served; the view answers GET requests only"
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "refused"
        self._json(code, {"error": message or phrase})

    def do_GET(self) -> None:
        try:
            if not self.server.hosts.allows(self.headers.get("Host")):
                raise BadRequest(403, f"this server answers requests addressed to {self.server.hosts.describe()} "
                                      f"only")
            url = urlsplit(self.path)
            if url.path in ("/", "/index.html"):
                self._send(200, self.server.app.page, "text/html; charset=utf-8")
                return
            if url.path not in ROUTES:
                raise BadRequest(404, f"no such page {url.path[:80]!r}; the page is / and the API is "
                                      f"{', '.join(ROUTES)} (docs/view.md)")
            self.server.app.answer(url.path, _params(url.path, url.query), self._send_json)
        except BadRequest as e:
            self._json(e.status, {"error": str(e)})
        except _GONE:
            # the client left mid-answer: ViewServer.handle_error logs one line
            raise
        except Exception as e:
            # a fault of headscope's, not the request's: one line, no traceback
            log.exception("view request %s failed", self.path[:200])
            self._json(500, {"error": f"internal error ({type(e).__name__}: {str(e)[:200]}); see the server's log"})

    def _refuse_method(self) -> None:
        self._json(405, {"error": f"{self.command} is not served; the view answers GET requests only"})

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method


class ViewServer(ThreadingHTTPServer):
    """ThreadingHTTPServer bound to one ViewApp; a thread per request, none kept alive past shutdown."""

    daemon_threads = True
    # connections the OS holds before accept(): a burst of requests is not refused
    request_queue_size = 128

    app: ViewApp

    def __init__(self, address: tuple[str, int], app: ViewApp | None) -> None:
        if app is not None:
            self.app = app
        super().__init__(address, ViewHandler)
        self.hosts = HostCheck(address[0], str(self.server_address[0]), int(self.server_address[1]))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that disconnected or stalled is one quiet line; anything else is logged with its traceback
        (never sent to a client)."""
        error = sys.exc_info()[1]
        if isinstance(error, _GONE):
            log.info("%s left before its answer was complete (%s)", client_address[0], type(error).__name__)
            return
        log.exception("view connection from %s failed", client_address[0])


class _ViewServer6(ViewServer):
    address_family = socket.AF_INET6  # an IPv6 host such as ::1


def make_server(app: ViewApp | None, host: str, port: int) -> ViewServer:
    """A ViewServer listening on host:port (port 0: a free port); an OS refusal is a clear error. `app` may come
    later (`server.app = ...`, before `serve_forever`): the command takes its port before the model loads."""
    cls = _ViewServer6 if ":" in host else ViewServer
    try:
        return cls((host, port), app)
    except OSError as e:
        raise HeadscopeError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another port or host",
                             fields=("port", "host")) from None
