"""The unit curve's figure: the metric (perplexity for LMs) against the share of parameters removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def unit_curve_plot(records: Sequence[dict[str, Any]], *, metric: str, title: str, path: str | Path) -> Path:
    """Draw the curve (and the recovered curve, and measured vs FLOP-ideal speedup when present) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ...io import atomic_write_bytes

    name = "perplexity" if "perplexity" in records[0] else "metric"
    x = [100 * r["fraction_params"] for r in records]
    has_speed = records[0].get("speedup") is not None
    fig, axes = plt.subplots(1, 2 if has_speed else 1, figsize=(10 if has_speed else 5.5, 3.8), squeeze=False)
    ax = axes[0][0]
    ax.plot(x, [r[name] for r in records], "o-", label="removed")
    if records[0].get("metric_recovered") is not None:
        ax.plot(x, [r[f"{name}_recovered"] if name == "perplexity" else r["metric_recovered"] for r in records],
                "s--", label="removed + recovery")
    ax.set_xlabel("parameters removed (%)")
    ax.set_ylabel(name if name != "metric" else metric)
    if name == "perplexity":
        ax.set_yscale("log")
    ax.legend()
    ax.set_title(title, fontsize=9)
    if has_speed:
        ax2 = axes[0][1]
        ax2.plot(x, [r["speedup"] for r in records], "o-", label="measured")
        ax2.plot(x, [r["flop_speedup"] for r in records], "k:", label="FLOP-ideal")
        ax2.set_xlabel("parameters removed (%)")
        ax2.set_ylabel("forward speedup (x)")
        ax2.legend()
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path


def unit_curves_plot(curves: dict[str, Sequence[dict[str, Any]]], *, title: str, path: str | Path) -> Path:
    """Several unit curves on one figure: perplexity (log scale) against the share of parameters removed, solid
    without and dashed with recovery, one colour per curve (`curves`: label -> unit_curve.csv records, each with
    `fraction_params`, `perplexity` and, when recovered, `perplexity_recovered`)."""
    if not curves:
        raise ValueError("no curves to draw")
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ...io import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (label, records) in enumerate(curves.items()):
        colour = f"C{i}"
        x = [100 * float(r["fraction_params"]) for r in records]
        ax.plot(x, [float(r["perplexity"]) for r in records], "o-", color=colour, label=label)
        rec = [r.get("perplexity_recovered") for r in records]
        if all(v not in (None, "") for v in rec):
            ax.plot(x, [float(v) for v in rec], "s--", color=colour, label=f"{label} + recovery")
    ax.set_xlabel("parameters removed (%)")
    ax.set_ylabel("held-out perplexity")
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return path
