"""The study's `patch` stage (activation patching, issue 33) and the causal sentence of question 1's answer.

The stage runs `headscope patch` on a built-in pair set: `ioi` on decoders, `masked` on encoders with a
masked-LM head; a model without an LM head has no logits to patch and is left out with that reason (a task
the tokenizer cannot hold is refused by the verb itself, and the study records its reason). Its sizes go from
attribution patching alone (one forward and backward per batch of pairs) on few pairs to the exact scan on
more: the plan takes the exact scan only when it fits the budget.

The answer names the heads whose exact effect's interval excludes 0 (the largest first) with their
intervals (none when the pairs' clean and corrupt metrics overlap: the model does not do the task, and a share
of no difference means little), and, when the roles stage ran in the same study, the role labels those heads carry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..artifacts import PATCHING_CSV, PATCHING_JSON, ROLES_CSV
from ..heads import Head
from ..learned.options import PatchOptions

# records.py reads the stages' folders (stages.py), which import this module
if TYPE_CHECKING:
    from .records import Records

# Factors fitted on one timed run (SmolLM2, 270 heads, 8 IOI pairs, 1 thread; docs/study.md): the exact scan's
# patched copies run the layers from their head's own on (the prefix is shared) over pairs shorter than the
# probe's passages, EXACT_FWD of a passage forward per head and pair; attribution's passes ATTR_SHARE of a
# passage's forward + backward and two forwards per pair; composition scores, DLA and the bootstrap of every
# head's interval grow with heads squared (OVERHEAD, in the probe's CPU units, more with the exact scan's).
EXACT_FWD, ATTR_SHARE, OVERHEAD = 0.4, 0.4, {False: 0.025, True: 0.04}
ATTRIBUTION, BOTH = "attribution", "exact,attribution"
# Sizes, cheapest first (study.json's `size` of the stage says which was chosen): attribution alone where the
# exact scan does not fit, then the exact scan (with attribution beside it, for their agreement) on more pairs.
LEVELS: tuple[dict[str, Any], ...] = (
    {"n": 8, "methods": ATTRIBUTION}, {"n": 16, "methods": ATTRIBUTION},
    {"n": 8, "methods": BOTH}, {"n": 16, "methods": BOTH}, {"n": 24, "methods": BOTH}, {"n": 48, "methods": BOTH},
)
TOP = 3  # heads named in the answer
TASK_WORDS = {"ioi": "IOI", "masked": "masked capital-country", "greater-than": "greater-than",
              "induction": "induction"}
METRIC_WORDS = {"logit_diff": "logit difference", "prob": "probability of the answer", "loss": "loss"}


def task_for(causal: bool) -> str:
    """The built-in pair set a model's study patches on: ioi (decoders) or masked (encoders)."""
    return "ioi" if causal else "masked"


def options(model: str, device: str | None, causal: bool, lv: dict[str, Any]) -> PatchOptions:
    """The patch verb's options at size `lv` (the pairs and the methods)."""
    return PatchOptions(model=model, device=device, task=task_for(causal), limit=lv["n"],
                        methods=tuple(lv["methods"].split(",")))


def cost(fwd_s: float, train_s: float, cpu_s: float, heads: int, lv: dict[str, Any]) -> float:
    """Seconds of the stage at size `lv`, in the probe's units (a passage forward, forward + backward, CPU)."""
    n, exact = lv["n"], "exact" in lv["methods"]
    # attribution: clean and corrupt runs, one forward + backward
    s = n * ATTR_SHARE * (train_s + 2 * fwd_s)
    s += n * fwd_s  # direct logit attribution's clean pass
    # per batch: clean and corrupt runs, then (heads / copies) forwards of copies x batch rows
    if exact:
        s += n * (2 + EXACT_FWD * heads) * fwd_s
    return s + cpu_s * (3 + OVERHEAD[exact] * heads ** 2)


def refusal(causal: bool, lm_head: bool, model_type: str, architecture: str) -> str | None:
    """Why a model's study cannot patch (None when it can)."""
    if not lm_head:
        want = "a causal LM" if causal else "a masked-LM checkpoint (*ForMaskedLM)"
        return (f"patching reads the answer's logits and this {model_type} model ({architecture}) has no LM head; "
                f"study {want} to get the causal heads")
    return None


# --- the answer ----------------------------------------------------------------------------------------
def _num(text: str | None) -> float | None:
    try:
        v = float(text or "nan")
    except ValueError:
        return None
    return None if v != v else v


def heads_by(rows: list[dict[str, str]], col: str) -> list[tuple[str, float, float, float]]:
    """(name, value, lo, hi) of every head with an interval in `col`, largest |value| first."""
    out = []
    for r in rows:
        v, lo, hi = _num(r.get(col)), _num(r.get(f"{col}_lo")), _num(r.get(f"{col}_hi"))
        if v is not None and lo is not None and hi is not None:
            out.append((Head(int(r["layer"]), int(r["head"])).name, v, lo, hi))
    return sorted(out, key=lambda t: -abs(t[1]))


def role_labels(rec: Records) -> dict[str, list[str]] | None:
    """Each head's role labels from roles.csv ({"L0H1": ["induction"]}), or None without roles.csv."""
    rows = rec.rows(ROLES_CSV.name)
    if not rows or "roles" not in rows[0]:
        return None
    return {Head(int(r["layer"]), int(r["head"])).name: [x for x in (r.get("roles") or "").split(";") if x]
            for r in rows}


def _label(name: str, labels: dict[str, list[str]] | None, words: dict[str, str]) -> str:
    if labels is None:
        return ""
    got = labels.get(name) or []
    named = (words.get(x, x.replace("_", " ")).removesuffix(" heads") for x in got)  # "sink heads" -> "sink"
    return f" ({', '.join(named)})" if got else " (no role label)"


def separated(mc: dict[str, Any], mx: dict[str, Any]) -> bool:
    """Whether M(clean)'s and M(corrupt)'s intervals are disjoint: the pairs move the metric, so an effect (a share
    of the difference) has a settled denominator."""
    try:
        return bool(mc["hi"] < mx["lo"] or mx["hi"] < mc["lo"])
    except (KeyError, TypeError):
        return False


def sentence(rec: Records, why: str, words: dict[str, str], roles_ran: bool) -> str:
    """Question 1's causal clause ('; causally, on 24 IOI pairs, L23H3 restores ...'), from patching.csv/json;
    `why` is said when the stage did not run. Role labels are compared when `roles_ran` (this study's roles)."""
    run = rec.json(PATCHING_JSON.name)
    rows = rec.rows(PATCHING_CSV.name)
    if run is None or not rows:
        return f"; no causal patching ({why})"
    pairs = run.get("pairs") or {}
    source = str(pairs.get("source", ""))
    task = TASK_WORDS.get(source.removeprefix("task "), source)
    metric = METRIC_WORDS.get(str(run.get("metric")), str(run.get("metric")))
    exact = "effect" in rows[0]
    heads = heads_by(rows, "effect" if exact else "attribution")
    if not heads:
        return "; no causal patching (patching.csv holds no head with an interval)"
    labels = role_labels(rec) if roles_ran else None
    called = [h for h in heads if h[2] > 0 or h[3] < 0]  # the interval excludes 0
    mc, mx = run.get("M_clean") or {}, run.get("M_corrupt") or {}
    s = (f"; causally, on {pairs.get('n', '?')} {task} pairs ({metric} {mc.get('value', float('nan')):.2f} clean vs "
         f"{mx.get('value', float('nan')):.2f} corrupt), ")
    if not exact:
        s = s.replace("causally", "by attribution patching alone (a first-order estimate: the exact scan did not "
                                   "fit the budget)", 1)
    verb = "restores" if exact else "is estimated to restore"
    name, v, lo, hi = heads[0]
    largest = f"largest: {name} {v:+.2f} [{lo:+.2f}, {hi:+.2f}]{_label(name, labels, words)}"
    # effects are shares of M(clean) - M(corrupt): with no difference, no share means much
    if not separated(mc, mx):
        if not all(isinstance(d.get(k), (int, float)) for d in (mc, mx) for k in ("lo", "hi")):
            return s + (f"no head is called causal: patching.json does not record M(clean)'s and M(corrupt)'s "
                        f"intervals, so whether the model tells the pairs apart is unknown ({largest})")
        return s + (f"no head is called causal: the model does not tell the pairs apart (M(clean) "
                    f"[{mc['lo']:.2f}, {mc['hi']:.2f}] and M(corrupt) [{mx['lo']:.2f}, {mx['hi']:.2f}] overlap), so "
                    f"shares of their difference are unsettled ({largest})")
    if not called:
        return s + f"no head's interval excludes 0 ({largest}), so none is called causal"
    parts = []
    for i, (name, v, lo, hi) in enumerate(called[:TOP]):
        if i == 0:
            what = (f"{verb} {v:.2f} [{lo:.2f}, {hi:.2f}] of the clean {metric}" if v > 0 else
                    f"works against the clean {metric}: {v:+.2f} [{lo:+.2f}, {hi:+.2f}]")
        else:
            what = f"{v:+.2f} [{lo:+.2f}, {hi:+.2f}]"
        parts.append(f"{name} {what}{_label(name, labels, words)}")
    s += ", ".join(parts) + f"; {len(called)} of {len(heads)} heads' intervals exclude 0"
    if labels is not None:
        labelled = sum(1 for name, *_ in called if labels.get(name))
        s += f", {labelled} of them carry a role label"
    elif exact:
        s += " (no role census in this study to compare with)"
    return s
