"""docs/img/view-minilm.png and the view's request times (docs/view.md).

    python benchmarks/view_screenshot.py --from DIR [--model minilm] [--out docs/img/view-minilm.png]

DIR holds the evidence the page shows (docs/view.md says which commands wrote it). The script serves MODEL
on a free 127.0.0.1 port, types a sentence into the page in headless Chromium, opens two heads side by side
and takes the screenshot; then it times the API: every head of a short text (one eager forward), and one
head of a long text alone against every head of it under eager attention, each repeated and summarised as
median [min, max] over the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from view_support import get, serving  # the tests' server helper (tests/ is on sys.path above)

from headscope.models.loading import load_model
from headscope.view.attention import all_heads, encode, one_head
from headscope.view.heads import heads_table

SENTENCE = "When Mary and John went to the store, John gave a drink to Mary."
LONG = " ".join(["The lantern keeper counted the otters by the river while the boats drifted past the mill."] * 22)


def screenshot(base: str, out: Path, heads: tuple[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                              args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = b.new_page(viewport={"width": 1500, "height": 1350})
        page.goto(base + "/")
        page.wait_for_selector("body[data-ready='1']")
        page.fill("#text", SENTENCE)
        page.press("#text", "Enter")
        page.wait_for_selector("body[data-drawn='1']")
        page.select_option("#colour-by", "roles")
        page.locator(f"#grid .cell[data-name='{heads[0]}']").click()
        page.locator(f"#view-0 canvas[data-head='{heads[0]}']").wait_for()
        page.locator(f"#grid .cell[data-name='{heads[1]}']").click(modifiers=["Shift"])
        page.locator(f"#view-1 canvas[data-head='{heads[1]}']").wait_for()
        page.locator("#view-1 svg text[data-side='q'][data-i='15']").hover()  # the second "mary"
        page.screenshot(path=str(out), full_page=False)
        b.close()


def timed(fn, repeats: int) -> str:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return f"{statistics.median(times) * 1e3:.0f} ms [{min(times) * 1e3:.0f}, {max(times) * 1e3:.0f}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--from", dest="from_dir", required=True)
    ap.add_argument("--out", default="docs/img/view-minilm.png")
    ap.add_argument("--heads", default="L0H2,L4H11")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    hm = load_model(args.model)
    with serving(hm, heads_table(hm, [args.from_dir])) as (base, app):
        screenshot(base, Path(args.out), tuple(args.heads.split(",")))  # type: ignore[arg-type]
        app.maps.clear()
        short = f"{base}/api/maps?text={quote(SENTENCE)}"
        print(f"every head, {len(encode(hm, SENTENCE, 512).ids)} tokens (/api/maps, new text each time, server "
              f"round trip): {timed(lambda: (app.maps.clear(), get(short)), args.repeats)}")
    ids = encode(hm, LONG, 512).ids
    one = timed(lambda: one_head(hm, ids, hm.n_layers - 1, 3), args.repeats)  # the last layer: no early stop
    print(f"long text, {len(ids)} tokens, in-process: one head alone {one}"
          f"; every head under eager attention {timed(lambda: all_heads(hm, ids), args.repeats)}")


if __name__ == "__main__":
    main()
