"""`headscope export` as a library function: a checkpoint folder read and checked for GGUF, nothing written
until the result is saved (`headscope.options.Result`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..options import Result
from .gguf import GgufPlan, check_out, plan_gguf, write_gguf
from .options import ExportOptions

#: the file's name when the result is written into a folder (`write`); `save` takes the file's own path
GGUF_NAME = "model.gguf"


@dataclass
class ExportResult(Result):
    """A checkpoint ready to be written as one GGUF file."""

    plan: GgufPlan
    files = (GGUF_NAME,)

    def to_pandas(self) -> pd.DataFrame:
        s = self.plan.shape
        return pd.DataFrame({"layer": range(len(s.n_heads)), "n_heads": s.n_heads, "n_kv_heads": s.n_kv_heads,
                             "n_ff": s.n_ff})

    def write(self, folder: Path) -> None:
        write_gguf(self.plan, folder / GGUF_NAME)

    def save(self, out: str | Path, force: bool = False) -> list[Path]:
        """Write the GGUF file at `out` (a file path, as `--file`): a temporary name beside it, then renamed."""
        write_gguf(self.plan, out, force)
        return [Path(out)]

    def lines(self) -> list[str]:
        p, heads = self.plan, self.plan.shape.n_heads
        out = [f"{p.src}: {p.hm.n_layers} layers, query heads {min(heads)}..{max(heads)} per layer, llama.cpp "
               f"architecture {p.shape.arch!r}, {p.dtype}, pre-tokenizer {p.tokenizer['pre']!r}"]
        if p.fallback:
            out.append(f"{len(p.fallback)} tensors written f16 (rows not a multiple of 32): "
                       f"{', '.join(p.fallback[:4])}{' ...' if len(p.fallback) > 4 else ''}")
        return out


def export(folder: str | Path, options: ExportOptions | None = None, **changes: Any) -> ExportResult:
    """`headscope export`: the checkpoint `folder` read and checked for GGUF export; `.save(path)` writes it.

    Keywords override single options: `export("pruned/", file_type="q8_0").save("small.gguf")`.
    """
    opts = (options or ExportOptions(model=str(folder), to="gguf")).replace(model=str(folder), **changes)
    opts.check()  # the target and file type; the file is named at save
    if opts.file is not None:
        check_out(Path(opts.file), opts.force)
    return ExportResult(plan=plan_gguf(opts.model, opts.file_type))
