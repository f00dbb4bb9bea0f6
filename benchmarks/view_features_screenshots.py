"""docs/img/view-norm.png, view-long.png, view-generate.png and the timings of docs/view.md's new features.

    python benchmarks/view_features_screenshots.py --from DIR [--repeats 3]

DIR holds MiniLM's evidence (the commands in docs/view.md). The script serves MiniLM, opens the page at an
address that asks for norm-based weights of two heads, and takes view-norm.png; then serves SmolLM2
(max 4,096 tokens), draws one head over the whole built-in sample (headscope/resources/sample_en.txt) as a
window and takes view-long.png, and continues a prompt greedily and takes view-generate.png. Timings are
median [min, max] over the repeats, through the server.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from view_support import get, serving  # the tests' server helper (tests/ is on sys.path above)

from headscope.models.loading import load_model
from headscope.view.heads import heads_table

SENTENCE = "When Mary and John went to the store, John gave a drink to Mary."
SAMPLE = Path(__file__).resolve().parents[1] / "headscope" / "resources" / "sample_en.txt"
PROMPT = "The capital of France is Paris. The capital of Germany is"
IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def browser():
    from playwright.sync_api import sync_playwright

    p = sync_playwright().start()
    b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                          args=["--headless", "--no-sandbox", "--disable-gpu"])
    return p, b


def shoot(b, url: str, out: Path, size: tuple[int, int], then=None) -> None:
    page = b.new_page(viewport={"width": size[0], "height": size[1]})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=600_000)
    page.wait_for_selector("body[data-drawn]", timeout=600_000)
    if then:
        then(page)
    page.mouse.move(0, 0)
    page.screenshot(path=str(out), full_page=False)
    page.close()
    if problems:
        raise SystemExit(f"console problems on {url}: {problems}")


def timed(fn, repeats: int) -> str:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return f"{statistics.median(times):.2f} s [{min(times):.2f}, {max(times):.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="from_dir", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--long-head", default="L6H0")
    args = ap.parse_args()
    pw, b = browser()
    try:
        hm = load_model("minilm")
        with serving(hm, heads_table(hm, [args.from_dir])) as (base, app):
            q = urlencode({"text": SENTENCE, "head": "L0H2", "head2": "L4H11", "weighting": "norm"})
            shoot(b, f"{base}/?{q}", IMG / "view-norm.png", (1500, 1100),
                  lambda page: page.select_option("#colour-by", "roles"))
            for w in ("attention", "norm"):
                def ask(w=w):
                    app.maps.clear()
                    app.long.clear()
                    get(f"{base}/api/maps?text={quote(SENTENCE)}&weighting={w}")
                print(f"minilm, every head of the {SENTENCE!r} ({w}): {timed(ask, args.repeats)}")
        hm = load_model("smollm2")
        text = SAMPLE.read_text(encoding="utf-8")
        n = len(hm.tokenizer(text)["input_ids"])
        layer, head = args.long_head.removeprefix("L").split("H")
        with serving(hm, max_tokens=4096) as (base, app):
            def find(page):
                page.fill("#view-0 input.find", "Netherfield")
                page.press("#view-0 input.find", "Enter")
                page.wait_for_selector("#view-0 .found", timeout=120_000)
                page.locator("#view-0 canvas.heat").hover(position={"x": 150, "y": 200})

            shoot(b, f"{base}/?{urlencode({'text': text, 'head': args.long_head})}", IMG / "view-long.png",
                  (1500, 900), find)

            def window():
                app.long.clear()
                get(f"{base}/api/attention?text={quote(text)}&layer={layer}&head={head}&window=0,0,128")
            print(f"smollm2, one head ({args.long_head}) over the {n}-token sample, first window (a forward pass "
                  f"up to its layer): {timed(window, args.repeats)}")
            moved = f"{base}/api/attention?text={quote(text)}&layer={layer}&head={head}&window=640,512,128"
            print(f"  the window moved (the kept map, no forward pass): {timed(lambda: get(moved), args.repeats)}")
            shoot(b, f"{base}/?{urlencode({'text': PROMPT, 'head': 'L6H0', 'head2': 'L20H3', 'gen': 12})}",
                  IMG / "view-generate.png", (1500, 1000))
            print(f"smollm2, /api/generate 12 tokens after {PROMPT!r}: " +
                  timed(lambda: get(f"{base}/api/generate?text={quote(PROMPT)}&tokens=12"), args.repeats))
            status, body = get(f"{base}/api/generate?text={quote(PROMPT)}&tokens=12")
            print(f"  continuation: {body['continuation']!r} ({body['stopped']})")
    finally:
        b.close()
        pw.stop()


if __name__ == "__main__":
    main()
