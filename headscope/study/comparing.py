"""The study's `compare` stage (issue 42): what each compressed model the study saved kept and lost against the
original, through `headscope compare`.

The stages before it save compressed models: `prune` (model/), and on decoders `gqa` (gqa/model/) and `mla`
(mla/model/). This stage runs the compare library function once per saved model, each against the study's one
loaded original, with the study's sizes: language modelling (decoders: perplexity; encoders: fidelity of the final
hidden states), the built-in pair tasks the tokenizer holds (decoders: IOI, induction; encoders with a masked-LM
head: masked) and, on decoders that reach RETRIEVAL_LENGTH positions, needle retrieval. Each result goes to
compare/<prune|gqa|mla>/compare.csv and compare.json (the report's "what it cost" section reads them there).

The original is measured once: the second and third comparisons take its per-item values from the first one's
compare.json (`base_from`, compare's own reuse of BASE on the same items). A compressed model that its stage did
not save (refused, left out, failed) is not compared; with none, the stage is skipped with their reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..artifacts import MODEL_DIR
from ..compare import CompareOptions
from ..options import Options
from .costs import LONG_QUADRATIC
from .verbs import Call, Calls

if TYPE_CHECKING:  # stages.py builds this stage from this module
    from .probe import Probe
    from .stages import Ctx, Family

# The stages whose saved model the compare stage judges, in the plan's order, and where each saved it (relative to
# the study's folder).
COMPRESSED = {"prune": MODEL_DIR.name, "gqa": f"gqa/{MODEL_DIR.name}", "mla": f"mla/{MODEL_DIR.name}"}
# Where the compare stage writes (one folder per compressed model under it).
FOLDER = "compare"
# Tokens per needle haystack of the retrieval row: short, as a study's compare must be cheap; decoders with fewer
# positions get no retrieval row.
RETRIEVAL_LENGTH = 256
# The built-in pair tasks a study compares: decoders, encoders with a masked-LM head.
PAIR_TASKS = {True: ("ioi", "induction"), False: ("masked",)}
# Sizes, cheapest first: held-out passages of the language-model row, pairs per pair task, needle haystacks.
LEVELS: tuple[dict[str, Any], ...] = ({"n": 16, "items": 16, "haystacks": 4}, {"n": 32, "items": 32, "haystacks": 8},
                                      {"n": 64, "items": 64, "haystacks": 16})

# The change, against the original's value, within which a capability counts as kept (compare's tolerance).
TOLERANCE = 0.05
# What the answers call each row and its metric.
CAPABILITY_WORDS = {"lm": "language modelling", "fidelity": "its outputs", "ioi": "IOI", "induction": "induction",
                    "retrieval": "needle retrieval", "masked": "masked capital-country"}
METRIC_WORDS = {"perplexity": "perplexity", "cosine": "cosine to the original's outputs",
                "logit_diff": "logit difference", "needle_token_accuracy": "needle token accuracy"}
# Metrics whose change reads best as a share of the original's value (perplexity +3.1%).
RELATIVE = ("perplexity",)

# --- the cost model's factors (the probe's units: a passage forward of MAX_LENGTH tokens, a unit of CPU work) ---
# Fitted on one timed run, the compare stage of `headscope study smollm2 --budget 10m` (1 thread, the shared 2-core
# machine; probe forward 0.246 s a passage; 16 passages, 16 pairs per task, 4 haystacks of 256 tokens, the pruned
# and GQA models: 76.5 s), from compare.json's per-row seconds of each model (docs/study.md, "What compression
# cost"): passage forwards per held-out passage of the language-model row (7.0-7.4 s for 16 passages; where the
# 0.8 beyond the probe's forward goes was not measured: the NLL's log-softmax over the whole vocabulary at every
# position, the padding to the batch's widest passage, which the probe scales away, are the candidates);
LM_FWD = 1.8
# per pair of a pair task (its clean forward, batched; IOI 3.0-3.3 s and induction 3.3-3.5 s for 16 pairs);
PAIR_FWD = 0.85
# per needle haystack, in passages of its length and times the T x T growth of its attention (10 s for 4
# haystacks of 256 tokens: the long forward and its teacher-forced answer);
HAYSTACK_FWD = 2.0
# CPU units per row and compared model: the paired BCa bootstrap of its change (1000 resamples) and compare.json
# (with the compared models' loads, the 4.8 s the rows' forwards leave of the stage).
ROW_CPU = 1.0


@dataclass(frozen=True)
class Candidate:
    """A compressed model an earlier stage of this study saved (`model`: its folder), or why it saved none."""

    stage: str
    model: str | None
    why: str = ""


def tasks_for(f: Family) -> tuple[str, ...]:
    """The compare rows a study measures on this family: language modelling, the pair tasks its tokenizer holds and
    (decoders reaching RETRIEVAL_LENGTH positions) retrieval."""
    rows: tuple[str, ...] = ("lm",) if f.causal else ("fidelity",)
    rows += tuple(t for t in PAIR_TASKS[f.causal] if t in f.pair_tasks)
    if f.causal and (f.max_positions is None or f.max_positions >= RETRIEVAL_LENGTH):
        rows += ("retrieval",)
    return rows


def options(ctx: Ctx, lv: dict[str, Any], max_length: int) -> CompareOptions:
    """The comparison every compressed model gets (its `other` and `out` filled in per model by `calls`): passages
    of `max_length` tokens."""
    o = CompareOptions(base=ctx.model, other=ctx.model, device=ctx.device, data=ctx.heldout, limit=lv["n"],
                       max_length=max_length, tasks=tasks_for(ctx.family), items=lv["items"], tolerance=TOLERANCE)
    return o.replace(long=RETRIEVAL_LENGTH, haystacks=lv["haystacks"]) if "retrieval" in o.tasks else o


def cost(p: Probe, f: Family, lv: dict[str, Any], models: int) -> float:
    """Seconds to compare `models` compressed models at size `lv`: each model's load, the original's forwards once
    and each compressed model's, and the bootstrap of every row."""
    tasks = tasks_for(f)
    fwd = LM_FWD * lv["n"] + PAIR_FWD * lv["items"] * sum(t in tasks for t in ("ioi", "induction", "masked"))
    if "retrieval" in tasks:
        scale = RETRIEVAL_LENGTH / p.length
        fwd += HAYSTACK_FWD * lv["haystacks"] * scale * (1 + RETRIEVAL_LENGTH / LONG_QUADRATIC)
    return models * p.load_s + (1 + models) * fwd * p.fwd_s + models * len(tasks) * ROW_CPU * p.cpu_s


def calls(ctx: Ctx, template: Options, out: str) -> Calls:
    """One compare per saved compressed model, into `out`/<stage>; the first one's BASE values serve the others."""
    parts: list[tuple[str, Call]] = []
    first = None
    for c in ctx.candidates:
        if c.model is None:
            continue
        folder = f"{out}/{c.stage}"
        parts.append((c.stage, Call("compare", template.replace(other=c.model, out=folder, base_from=first))))
        first = first or folder
    why = "; ".join(f"{c.stage} {c.why}" for c in ctx.candidates if c.model is None)
    return Calls("compare", tuple(parts), why)


def _change(r: dict[str, str]) -> str:
    """A compare.csv row's change with its interval, in words: "perplexity +3.1% [+1.2%, +5.0%]"."""
    metric = METRIC_WORDS.get(r["metric"], r["metric"])
    delta, lo, hi, base = (float(r[k]) for k in ("delta", "delta_lo", "delta_hi", "base"))
    if r["metric"] in RELATIVE and base:
        return f"{metric} {delta / abs(base):+.1%} [{lo / abs(base):+.1%}, {hi / abs(base):+.1%}]"
    return f"{metric} {float(r['base']):.2f} -> {float(r['other']):.2f}, {delta:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def _listed(rows: list[dict[str, str]]) -> str:
    words = [f"{CAPABILITY_WORDS.get(r['capability'], r['capability'])} ({_change(r)})" for r in rows]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def verdicts(rows: list[dict[str, str]], who: str, where: str) -> str:
    """What `who` (the pruned model, ...) kept, lost and gained against the original, each capability with its change
    and 95% interval, from compare.csv's `rows` (read at `where`); "" when there are none."""
    if not rows:
        return ""
    parts = []
    for verdict, verb in (("kept", "kept"), ("lost", "lost"), ("gained", "gained"), ("cannot tell", "cannot tell")):
        got = [r for r in rows if r.get("verdict") == verdict]
        if got:
            parts.append(f"{verb}{' for' if verdict == 'cannot tell' else ''} {_listed(got)}")
    n = sorted({r["n"] for r in rows}, key=int)
    return (f"against the original, {who} " + "; ".join(parts) + f" ({where}: 95% intervals of the paired change "
            f"over {'/'.join(n)} items; kept = within {TOLERANCE:.0%} of the original's value)")


__all__ = ["COMPRESSED", "FOLDER", "LEVELS", "Candidate", "calls", "cost", "options", "tasks_for",
           "verdicts"]
