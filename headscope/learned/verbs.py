"""Question 1's verbs as library functions: each takes a loaded model, the data and its Options, writes
nothing, and returns a result the CLI saves and prints (`headscope.options.Result`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts import HEADS_CSV, HEADS_JSON
from ..data import read_texts
from ..models.adapter import HeadModel
from ..options import Result
from ..provenance import provenance
from ..table import HeadTable, grid
from .analyze import analyze as analyze_table
from .options import AnalyzeOptions


def _texts(data: Any, limit: int | None) -> Any:
    """Data as given (a TextSource, passages, token ids), or read when it names a corpus or a file."""
    return read_texts(data, limit) if data is None or isinstance(data, (str, Path)) else data


@dataclass
class TableResult(Result):
    """A result whose main record is one HeadTable."""

    table: HeadTable

    def to_pandas(self) -> Any:
        return self.table.to_pandas()


@dataclass
class AnalyzeResult(TableResult):
    """Per-head attention statistics: heads.csv and heads.json."""

    name: str
    files = (HEADS_CSV.name, HEADS_JSON.name)

    def write(self, folder: Path) -> None:
        self.table.to_csv(folder / HEADS_CSV.name)
        self.table.to_json(folder / HEADS_JSON.name)

    def lines(self) -> list[str]:
        table, m = self.table, self.table.meta
        out = [f"{self.name}: {m['n_layers']} layers x {m['n_heads']} heads ({m['n_kv_heads']} KV), "
               f"{m['passages']} passages, {m['tokens_seen']} tokens from {m['data']}"]
        for col, title in (("entropy_norm", "normalised entropy: 1 = uniform, 0 = one key"),
                           ("mean_distance", "mean attention distance, tokens"),
                           ("first_token_mass", "mass on the first token (sink)")):
            out += ["", grid(table, col, title)]
        out += ["", "most notable heads:"]
        for col, label in (("prev_token_mass", "previous token"), ("self_mass", "self"),
                           ("next_token_mass", "next token"), ("first_token_mass", "first token / sink"),
                           ("special_mass", "special tokens"), ("punct_mass", "punctuation")):
            top = [t for t in table.top(col, 3) if t[2] == t[2]]
            if top:
                lo, hi = table[f"{col}_lo"], table[f"{col}_hi"]
                out.append(f"  {label:<20}" + ", ".join(f"L{l}H{h} {v:.2f} [{lo[l, h]:.2f}, {hi[l, h]:.2f}]"
                                                        for l, h, v in top))
        iv = m["intervals"]
        out += ["", f"[lo, hi]: {iv['level']:.0%} intervals, {iv['method']} bootstrap over the {m['passages']} "
                    f"passages ({iv['B']} resamples); split-half stability of each statistic's ranking in heads.json"]
        return out


def analyze(hm: HeadModel, data: Any = None, options: AnalyzeOptions | None = None, *, progress: bool = False,
            **changes: Any) -> AnalyzeResult:
    """`headscope analyze` on a loaded model: per-head attention statistics with intervals.

    `data`: a TextSource, passages, token-id lists, or a corpus name / file read with `options.limit`.
    Keywords override single options: `analyze(hm, texts, limit=64)`.
    """
    opts = (options or AnalyzeOptions()).replace(**changes).validate()
    source = _texts(data, opts.limit)
    table = analyze_table(hm, source, max_length=opts.max_length, batch_size=opts.batch_size, seed=opts.seed,
                          progress=progress, intervals=opts.intervals())
    table = table.with_columns(meta={"provenance": provenance("analyze", hm, source, opts.with_only())})
    return AnalyzeResult(table=table, name=hm.name)

