"""The end of a compressing verb's command (prune --save-model, gqa, mla, kvcache): the check of what it broke
(`compare.check`), saved beside the verb's own files and printed as one line per lost capability."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ..artifacts import outputs
from ..compare import CompareResult
from ..compare.check import check_lines
from ..errors import HeadscopeError

# compare.csv, compare.json: what the check writes into the verb's --out; and compare_items.npz, which the check's
# rows never need but an earlier compare into the same folder may have left: refused without --force, removed
CHECK_OUTPUTS = outputs("compare", optional=True)


def check_files() -> list[str]:
    """The check's files in a verb's --out, refused there without --force whether the check is on (it replaces
    them) or off (the verb's save removes an earlier run's, Result.save)."""
    return list(CHECK_OUTPUTS)


def finish_check(run: Callable[[], CompareResult], out: Path, force: bool) -> list[str]:
    """Run the check once the verb's own files are saved, save compare.csv and compare.json into `out` (an earlier
    run's compare_items.npz goes), print its lines; returns the files written. A check that cannot run (no row the
    model can measure) says why in one line and writes nothing: the verb's files are complete without it, and an
    earlier run's compare files (there only under --force) are removed so that none describes another model."""
    try:
        result = run()
    except HeadscopeError as e:
        for name in CHECK_OUTPUTS:
            (out / name).unlink(missing_ok=True)
        print(f"check: not run: {e}", file=sys.stderr)
        return []
    result.save(out, force)
    print("\n".join(check_lines(result)))
    return list(result.files)
