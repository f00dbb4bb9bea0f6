"""Upper bounds on what a user sizes: each refused before the work, in one line with the limit and why.

A count a user gives (resamples, steps, passages, haystacks, tokens, a memory cap) decides how much memory or
time a run takes. Too large a value must not run until the kernel's OOM killer ends it (taking other jobs
with it) or until the user gives up: each is bounded here, by what the machine has (memory available now) or
by a fixed limit where more cannot help (the reason is in the message).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OptionError

# Fixed limits (option -> (most, why)): counts of work where more cannot change a result, only its time.
STEPS_MAX = 10_000_000
STEPS_WHY = "optimizer steps: a run of more is days of work and keeps a loss per step; train in stages from a saved "\
            "model instead"
WORK = {
    "bootstrap": (100_000, "bootstrap resamples: beyond ~10,000 an interval's ends move by less than their own "
                           "Monte Carlo error, and each resample costs a pass over the passages' sums"),
    "haystacks": (100_000, "haystacks (or prompts): each is built and held as token ids, then a forward pass of "
                           "its tokens; a retrieval share over 100,000 is known to within 0.3% already"),
    "windows": (100_000, "windows of long text: each is a forward pass of a whole window, and a score's ranking is "
                         "stable over far fewer (reading until stable stops as soon as it is)"),
    "ig_steps": (10_000, "integrated-gradients steps: the path integral converges by ~300 (Sundararajan et al. use "
                         "20-300), and each step is a forward and backward pass over every batch"),
}


def available_memory() -> int | None:
    """Bytes of memory this process may still take: MemAvailable (Linux), capped by a cgroup's limit when one is
    set; None when the machine does not say."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit.isdigit() and used.isdigit():
            found.append(max(0, int(limit) - int(used)))
    except OSError:
        pass
    if not found:
        try:
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return min(found)


def human(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_at_most(option: str, value: int | float, most: int | float, why: str) -> None:
    """Refuse `value` above `most` in one line: the option (its field name), the limit and the reason."""
    if value > most:
        raise OptionError(option, f"must be at most {most:,}; got {value:,} ({why})")


def fits_memory_problem(value: int, bytes_each: float, what: str, share: float = 0.5, power: int = 1) -> str | None:
    """What is wrong with a `value` whose memory (`value ** power * bytes_each` bytes, for `what`) exceeds `share` of
    the memory available now, naming the largest value that fits; None when it fits (or memory is unknown)."""
    free = available_memory()
    if free is None or bytes_each <= 0:
        return None
    need = float(value) ** power * bytes_each
    if need <= share * free:
        return None
    most = max(1, int((share * free / bytes_each) ** (1.0 / power)))
    return (f"{value:,} needs about {human(need)} of memory for {what}, but this machine has {human(free)} available "
            f"now; give {most:,} or less")


def check_fits_memory(option: str, value: int, bytes_each: float, what: str, share: float = 0.5,
                      power: int = 1) -> None:
    """Refuse (an `OptionError` naming the field `option`) a `value` whose memory does not fit
    (`fits_memory_problem`)."""
    problem = fits_memory_problem(value, bytes_each, what, share, power)
    if problem:
        raise OptionError(option, problem)


__all__ = ["STEPS_MAX", "STEPS_WHY", "WORK", "available_memory", "check_at_most", "check_fits_memory",
           "fits_memory_problem", "human"]
