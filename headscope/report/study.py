"""A report built from a study (study.json beside the files): its three answers at the top of the page, and
one plain line, not a to-do box, for each section whose stage the model's family does not support or the
budget left out (what `headscope study` recorded and why)."""

from __future__ import annotations

from typing import Any

from ..artifacts import STUDY_JSON
from .sources import Part, Sources, clean

# the shortest long-range length a study measures (headscope.study.stages.LONG_MIN)
LONG_MIN = 512

# page key (data["missing"]) -> the study stage that fills it; None: no stage of a study does
SECTION_STAGE: dict[str, str | None] = {
    "heads": "analyze", "roles": "roles", "syntax": "roles", "similarity": "similar", "kv": "kv", "gqa": "gqa",
    "importance": "score", "rank_correlation": "score", "prune_curve": "prune", "prune_summary": "prune",
    "redundancy": "prune", "examples": "report", "sweep": None}
# panel title -> the stage(s) that fill it (None: not a study stage), and what the line says instead
PANEL_STAGES: dict[str, tuple[str, ...] | None] = {
    "Long-range roles": ("roles",), "KV-cache bytes against quality": ("gqa", "mla", "kvcache"),
    "Units beyond heads": None, "Head importance across tasks": None}
NOT_A_STAGE = {
    "sweep": "not part of a study: the head-count sweep trains new small models from scratch, whatever the model "
             "(headscope sweep, docs/sweep.md)",
    "Units beyond heads": "not part of a study: curves of attention sub-layers, blocks and FFN neurons are "
                          "headscope prune --unit ... (docs/pruning.md)",
    "Head importance across tasks": "not part of a study: importance on labelled tasks is headscope tasks "
                                    "(docs/importance.md)"}
WHY_ENCODER = {"syntax": "the study measures treebank syntax and coreference on encoders (a decoder's head sees only "
                         "earlier words)",
               "Long-range roles": "long-range roles are measured on decoders that reach 512 positions"}


def _line(stage: dict[str, Any] | None, name: str) -> str | None:
    """One line for a stage that did not fill its section, or None when it ran (then the section's own note
    stands: a file problem is worth the box)."""
    if not stage or stage.get("status") == "done":
        return None
    status = stage.get("status", "not run")
    reason = stage.get("reason", "")
    if status == "not supported":
        return f"not supported for this model ({name}): {reason}"
    if status == "left out":
        return f"left out of this study ({name}): {reason}"
    return f"{name} {status} in this study" + (f": {reason}" if reason else "")


def study_part(src: Sources) -> Part:
    """study.json's answers (shown first) and its stage records (used by `apply`)."""
    part = Part()
    st = src.json(STUDY_JSON.name)
    if st is None:
        return part
    answers = st.get("answers") or {}
    part.data["study"] = clean({
        "answers": [answers[q] for q in ("q1", "q2", "q3") if answers.get(q)],
        "budget_s": st["budget_s"], "elapsed_s": st["elapsed_s"], "tolerance_s": st["tolerance_s"],
        "stages": [{"stage": n, "status": r.get("status"), "reason": r.get("reason", ""),
                    "seconds": r.get("seconds"), "command": r.get("command", "")} for n, r in st["stages"].items()],
        "causal": (st.get("model") or {}).get("causal"),
        "max_positions": (st.get("model") or {}).get("max_positions")})
    return part


def apply(data: dict[str, Any]) -> None:
    """With a study: every missing section whose stage was refused or left out becomes one line (data["na"]);
    the sections no study stage fills say so in one line too. Sections of stages that ran keep their notes."""
    st = data.get("study")
    if not st:
        return
    stages = {s["stage"]: s for s in st["stages"]}
    na: dict[str, str] = {}
    for key in list(data["missing"]):
        stage = SECTION_STAGE.get(key, "")
        if stage is None:
            na[key] = NOT_A_STAGE[key]
        elif key in WHY_ENCODER and st.get("causal"):
            na[key] = WHY_ENCODER[key]
        elif stage:
            line = _line(stages.get(stage), stage)
            if line:
                na[key] = line
    for key in na:
        data["missing"].pop(key, None)
    data["na"] = na
    for p in data["panels"]:
        if p.get("rows") or not p.get("note"):
            continue
        title = p["title"]
        owners = PANEL_STAGES.get(title, ())
        if owners is None:
            p["note"], p["na"] = NOT_A_STAGE[title], True
        elif title in WHY_ENCODER and not st.get("causal"):
            p["note"], p["na"] = WHY_ENCODER[title], True
        elif title in WHY_ENCODER and (st.get("max_positions") or LONG_MIN) < LONG_MIN:
            p["note"], p["na"] = (f"long-range roles are measured at {LONG_MIN}+ tokens; this model has "
                                  f"{st['max_positions']} positions"), True
        elif owners and not st.get("causal") and all((stages.get(o) or {}).get("status") == "not supported"
                                                     for o in owners):
            p["note"], p["na"] = ("not applicable: GQA, MLA and the head-aware cache change a decoder's KV cache; "
                                  "an encoder keeps none"), True
        elif owners:
            lines = [ln for o in owners if (ln := _line(stages.get(o), o))]
            if len(lines) == len(owners):
                p["note"], p["na"] = "; ".join(lines), True
