"""Shared by the view's tests: tiny models with tokenizers, a server on a free loopback port, the reference
attentions transformers itself computes (eager), and a request helper that never raises on a 4xx."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from test_study import WORDS

from headscope.models.tiny import tiny_model
from headscope.view.page import EXAMPLES
from headscope.view.server import ViewApp, make_server

# A word whose token is markup: the page must show it as text (tests/test_view_browser.py).
MARKUP = "<img/src=x/onerror=window.pwned=1>"


def tokenizer_dir(base: Path, family: str, **overrides: Any) -> Path:
    """A tiny model of `family` with a word-level tokenizer over WORDS (and MARKUP); BERT adds [CLS] ... [SEP]."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if family == "bert" else ["<unk>", "<pad>"]
    vocab = {w: i for i, w in enumerate([*specials, ".", ",", MARKUP, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=specials[1] if family == "bert" else specials[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = base / family
    tiny_model(family, init_std=0.2, vocab_size=len(vocab), **overrides).model.save_pretrained(path)
    if family == "bert":
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                sep_token="[SEP]", mask_token="[MASK]").save_pretrained(path)
    else:
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>").save_pretrained(path)
    return path


def unseen_text(n_words: int, seed: int) -> str:
    """A sentence of random words, never written anywhere before the test runs."""
    return " ".join(np.random.default_rng(seed).choice(WORDS, n_words)) + " ."


def eager_reference(path: str | Path, text: str) -> tuple[list[str], list[np.ndarray]]:
    """transformers' own tokens and eager attentions (per layer [head, query, key]) for `text`."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        att = model(**enc, output_attentions=True).attentions
    return tok.convert_ids_to_tokens(enc["input_ids"][0].tolist()), [a[0].numpy() for a in att]


@contextmanager
def serving(hm: Any, heads: dict[str, Any] | None = None, max_tokens: int = 512) -> Iterator[tuple[str, ViewApp]]:
    """A view server for `hm` on a free 127.0.0.1 port, in a thread; yields its base URL and app."""
    from headscope.view.heads import heads_table

    app = ViewApp(hm, heads if heads is not None else heads_table(hm, []), max_tokens, EXAMPLES)
    server = make_server(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", app
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def get(url: str, method: str = "GET", headers: dict[str, str] | None = None,
        timeout: float = 60) -> tuple[int, Any]:
    """(status, JSON body or text) of one request; 4xx and 5xx answers are returned, not raised."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, body, kind = r.status, r.read().decode("utf-8"), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, body, kind = e.code, e.read().decode("utf-8"), e.headers.get("Content-Type", "")
    return status, (json.loads(body) if kind.startswith("application/json") else body)
