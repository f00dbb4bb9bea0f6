"""gqa and mla as library functions: a model converted (and optionally uptrained) in memory, with one report
and one printout for both conversions; nothing is written until the result is saved."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..artifacts import GQA_JSON, MLA_JSON, MODEL_DIR
from ..data import read_texts
from ..io import atomic_write_text
from ..models.adapter import HeadModel
from ..options import Result, check_data
from ..provenance import provenance
from .kv_bytes import human_bytes
from .options import ConversionOptions, GqaOptions, MlaOptions
from .reports import GqaReport, MlaReport


@dataclass
class ConversionResult(Result):
    """A converted model and its report (perplexity before / converted / uptrained, KL, KV-cache bytes):
    OUT/model and OUT/gqa.json or OUT/mla.json."""

    verb: str  # "gqa" or "mla"
    model: HeadModel
    report: GqaReport | MlaReport
    options: ConversionOptions

    @property
    def files(self) -> tuple[str, ...]:  # type: ignore[override]
        return (MODEL_DIR.name, (GQA_JSON if self.verb == "gqa" else MLA_JSON).name)

    def to_pandas(self) -> pd.DataFrame:
        r = self.report
        stages = [("before", r.ppl_before, None), ("after", r.ppl_after, r.kl_after),
                  ("uptrained", r.ppl_uptrained, r.kl_uptrained)]
        return pd.DataFrame([{"stage": s, "perplexity": ppl, "kl": kl} for s, ppl, kl in stages if ppl is not None])

    def write(self, folder: Path) -> None:
        if self.verb == "mla":
            from .mla.checkpoint import save_mla  # deferred: the MLA modules load only for an MLA result

            save_mla(self.model, folder / MODEL_DIR.name)
        else:
            from ..models.checkpoint import save_model  # deferred: torch checkpoint writing, only when saving

            save_model(self.model, folder / MODEL_DIR.name)
        atomic_write_text(folder / self.files[1], json.dumps(self.report.to_json(), indent=2) + "\n")

    def lines(self) -> list[str]:
        r, o = self.report, self.options
        out = [self._header()]
        if isinstance(r, GqaReport) and r.search_trace:
            out.append(f"search: calibration KL on {r.data}: adjacent {r.calibration_kl_adjacent:.4f}, "
                       f"similarity {r.calibration_kl_similarity:.4f}, start ({r.search_start}) "
                       f"{r.calibration_kl_start:.4f} -> {r.calibration_kl_search:.4f} after "
                       f"{r.kl_evaluations} KL evaluations ({r.search_seconds:.1f} s); layers changed: "
                       f"{r.layers_changed_by_search}")
        out += [f"perplexity on {r.heldout} ({r.heldout_passages} passages, <= {r.max_length} tokens):",
                f"  before      {r.ppl_before:10.3f}",
                f"  converted   {r.ppl_after:10.3f}   KL to original {r.kl_after:.4f} nats/token"]
        if r.ppl_uptrained is not None:
            train = f"{o.train}, " if isinstance(o, GqaOptions) else ""
            out.append(f"  uptrained   {r.ppl_uptrained:10.3f}   ({o.steps} steps, {o.loss}, {train}lr {o.lr:g}, "
                       f"on {r.data})  KL to original {r.kl_uptrained:.4f}")
        for k, label in ((r.kv_bytes_before, "before"), (r.kv_bytes_after, "after")):
            if self.verb == "gqa":
                out.append(f"KV cache {label:<6} {k.measured:>10} B measured ({human_bytes(k.measured)}, batch "
                           f"{k.batch} x {k.seq_len} tokens, {k.dtype}), calculator {k.calculated} B "
                           f"{'(equal)' if k.match else '(DIFFERENT)'}")
            else:
                out.append(f"KV cache {label:<6} {k.bytes_per_token:>7} B/token; {k.measured:>9} B measured "
                           f"({human_bytes(k.measured)}, batch {k.batch} x {k.seq_len} tokens, "
                           f"{k.dtype}), formula {k.calculated} B {'(equal)' if k.match else '(DIFFERENT)'}")
        return out

    def _header(self) -> str:
        r = self.report
        if isinstance(r, GqaReport):
            return (f"{r.model}: {r.n_layers} layers, {r.n_heads} query heads, "
                    f"{r.n_kv_heads_before} -> {r.n_kv_heads_after} KV heads; grouping {r.grouping_used}")
        return (f"{r.model}: {r.n_layers} layers, {r.n_heads} query / {r.n_kv_heads} KV heads, d_head "
                f"{r.d_head} -> MLA: latent rank {r.kv_rank} (full rank {r.full_rank}), {r.rope_dims} "
                f"RoPE dims per KV head ({r.selection})")


def _named(data: Any, heldout: Any) -> dict[str, str]:
    """The texts given by name or path, as options (so the provenance records them)."""
    return {k: str(v) for k, v in (("data", data), ("heldout", heldout)) if isinstance(v, (str, Path))}


def _texts(opts: ConversionOptions, data: Any, heldout: Any) -> tuple[Any, Any]:
    """--data and --heldout: passages given in memory as they are; a corpus name or file read once (with
    --limit / --heldout-limit); None: the options' own."""
    def read(given: Any, default: str, limit: int | None) -> Any:
        return read_texts(str(given if given is not None else default), limit) \
            if given is None or isinstance(given, (str, Path)) else given
    return read(data, opts.data, opts.limit), read(heldout, opts.heldout, opts.heldout_limit)


def gqa(hm: HeadModel, data: Any = None, options: GqaOptions | None = None, *, heldout: Any = None,
        progress: bool = False, **changes: Any) -> ConversionResult:
    """`headscope gqa` on a loaded model: K/V heads pooled into `kv_heads` groups, optionally uptrained, with
    perplexity and KV bytes; `hm` is left untouched. `gqa(hm, kv_heads=1)` is MQA."""
    # deferred: the conversion's modules load only when converting
    from .gqa import convert_and_evaluate

    check_data(data)
    check_data(heldout, "heldout")
    opts = (options or GqaOptions(model=hm.name)).replace(**_named(data, heldout), **changes).validate()
    data, heldout = _texts(opts, data, heldout)
    final, report = convert_and_evaluate(hm, opts, data=data, heldout=heldout, progress=progress)
    prov = provenance("gqa", hm, data, opts.with_only(), heldout=heldout)  # the original model, untouched
    return ConversionResult("gqa", final, GqaReport.from_json({**report, "provenance": prov}), opts)


def mla(hm: HeadModel, data: Any = None, options: MlaOptions | None = None, *, heldout: Any = None,
        progress: bool = False, **changes: Any) -> ConversionResult:
    """`headscope mla` on a loaded model: keys and values factored into a rank-`kv_rank` latent (MHA2MLA),
    optionally uptrained, with perplexity and KV bytes; `hm` is left untouched."""
    from .mla.to_latent import convert_and_evaluate  # deferred: the MLA modules load only when converting

    check_data(data)
    check_data(heldout, "heldout")
    opts = (options or MlaOptions(model=hm.name)).replace(**_named(data, heldout), **changes).validate()
    data, heldout = _texts(opts, data, heldout)
    final, report = convert_and_evaluate(hm, opts, data=data, heldout=heldout, progress=progress)
    prov = provenance("mla", hm, data, opts.with_only(), heldout=heldout)  # the original model, untouched
    return ConversionResult("mla", final, MlaReport.from_json({**report, "provenance": prov}), opts)
