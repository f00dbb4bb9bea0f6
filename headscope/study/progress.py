"""The study's one progress view: the stage being run, its bar, and the time used against the budget.

The stage's bar fills with its elapsed time against its estimate (the verbs' own bars go to the stage's
log, not the terminal). On a terminal one line is redrawn twice a second; elsewhere (a log, a pipe) one
line is written when a stage starts and one when it ends.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from .budget import fmt_duration

WIDTH = 24


def bar(done: float, width: int = WIDTH) -> str:
    """[#########---------------] for a share in [0, 1]."""
    k = int(round(max(0.0, min(1.0, done)) * width))
    return "[" + "#" * k + "-" * (width - k) + "]"


class Progress:
    """One line for the whole study; `stage(...)` starts a stage's bar, `done(...)` ends it."""

    def __init__(self, stream: TextIO, budget: float, start: float, n_stages: int, live: bool | None = None) -> None:
        self.stream, self.budget, self.start, self.n = stream, budget, start, n_stages
        self.live = stream.isatty() if live is None else live
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._label, self._estimate, self._t0, self._index = "", 1.0, start, 0

    def line(self, now: float | None = None) -> str:
        now = time.perf_counter() if now is None else now
        spent = now - self._t0
        share = spent / self._estimate if self._estimate > 0 else 1.0
        return (f"[{self._index}/{self.n}] {self._label:<8} {bar(share)} {fmt_duration(spent)} of "
                f"~{fmt_duration(self._estimate)} | study {fmt_duration(now - self.start)} / "
                f"{fmt_duration(self.budget)}")

    def _draw(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                self.stream.write("\r" + self.line() + "\x1b[K")
                self.stream.flush()

    def stage(self, index: int, label: str, estimate: float) -> None:
        with self._lock:
            self._index, self._label, self._estimate, self._t0 = index, label, estimate, time.perf_counter()
        if self.live:
            if self._thread is None:
                self._thread = threading.Thread(target=self._draw, daemon=True)
                self._thread.start()
        else:
            self.stream.write(f"[{index}/{self.n}] {label}: started, estimate ~{fmt_duration(estimate)} | study "
                              f"{fmt_duration(time.perf_counter() - self.start)} / {fmt_duration(self.budget)}\n")
            self.stream.flush()

    def say(self, text: str) -> None:
        """A line that stays (a stage done, reused or left out)."""
        with self._lock:
            self.stream.write(("\r\x1b[K" if self.live else "") + text + "\n")
            self.stream.flush()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        if self.live:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
