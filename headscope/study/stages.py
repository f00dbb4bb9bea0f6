"""The stages of a study: which verb each runs, with which options at each size, what it costs, and which
families it serves.

A stage is one verb's library function run on the study's loaded model with the verb's own Options (built here
from the plan's size; checked as the CLI checks them), its Result saved into the study's folder: a study's files
are the ones the verb writes (`verbs.py`). Its sizes go from cheapest to richest; the cost of a
size is in the probe's measured units (`Probe`): passage forwards, passage forward + backwards, and the
fixed CPU work, plus one model load. The counts are what the stage's passes do (e.g. exact ablation: one
forward per head and passage); the factors on them were fitted on this machine's runs and are corrected
during a study by the measured time of the stages already run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..artifacts import ROLES_CSV
from ..capacity.kvcache.cache import check_supported
from ..capacity.options import GqaOptions, KvcacheOptions, KvOptions, MlaOptions
from ..errors import HeadscopeError
from ..learned.causal.pairs import load_pairs
from ..learned.circuits.graph import check_model as check_circuit_model
from ..learned.options import AnalyzeOptions, CircuitOptions, RolesOptions, SimilarOptions
from ..models.adapter import HeadModel
from ..models.capabilities import CAPABILITIES, why_not
from ..options import Options
from ..redundancy.options import PruneOptions, ScoreOptions
from ..report.options import ReportOptions
from . import comparing, costs, patching
from .comparing import Candidate
from .probe import Probe
from .verbs import Call, Calls

# Tokens per passage of the short-text stages.
MAX_LENGTH = 64
# Decoders reaching this many positions get the long-range roles.
LONG_MIN = 512
# The importance criteria whose head rankings repeat on other text: split-half Spearman 0.91-0.995 (DESIGN.md,
# "Measured on main"); `gradient` (0.29 on MiniLM) is left out.
STABLE_METHODS = ("taylor", "output_norm", "entropy")
# Stages whose model/ would clash with prune's: each writes into its own folder (the report reads them, --from).
CONVERSIONS = {"gqa": "gqa", "mla": "mla"}
# Every stage that writes into a folder of its own: the conversions, and compare (a folder per compressed model).
SUBDIRS = {**CONVERSIONS, "compare": comparing.FOLDER}

@dataclass(frozen=True)
class Family:
    """What the stages need to know of the model: its kind and attention shape."""

    name: str
    model_type: str
    causal: bool
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    max_positions: int | None
    heads_total: int
    refuses: dict[str, str] = field(default_factory=dict)
    # capability -> why the family cannot serve it (its spec)
    cannot: dict[str, str] = field(default_factory=dict)
    kvcache_refusal: str | None = None
    # why edge-level circuits cannot take the model (learned.circuits)
    circuit_refusal: str | None = None
    lm_head: bool = True  # logits to read (patching)
    architecture: str = ""
    # the built-in pair tasks (compare's rows) whose pairs the tokenizer holds: at least 2 of the first 16
    pair_tasks: tuple[str, ...] = ()

    @classmethod
    def of(cls, hm: HeadModel) -> Family:
        try:
            check_supported(hm)
            kvc = None
        except HeadscopeError as e:
            kvc = str(e)
        try:
            check_circuit_model(hm)
            circuit = None
        except HeadscopeError as e:
            circuit = str(e)
        total = sum(hm.heads_in_layer(layer) for layer in range(hm.n_layers))
        mt = str(hm.config.model_type)
        cannot = {c.name: why for c in CAPABILITIES if (why := why_not(hm.spec, c.name, mt))}
        return cls(name=hm.name, model_type=mt, causal=bool(hm.causal), n_layers=hm.n_layers, n_heads=hm.n_heads,
                   n_kv_heads=hm.n_kv_heads, d_head=hm.d_head,
                   d_model=int(getattr(hm.config, "hidden_size", hm.n_heads * hm.d_head)),
                   max_positions=hm.max_positions, heads_total=total, refuses=dict(hm.spec.refuses), cannot=cannot,
                   kvcache_refusal=kvc, circuit_refusal=circuit, lm_head=hm.output_embeddings is not None,
                   architecture=type(hm.model).__name__, pair_tasks=_pair_tasks(hm))


def _pair_tasks(hm: HeadModel) -> tuple[str, ...]:
    """The built-in pair tasks of compare (study/comparing.py) whose pairs the model's tokenizer holds."""
    if hm.output_embeddings is None or hm.tokenizer is None:
        return ()  # no logits to read
    held = []
    for task in comparing.PAIR_TASKS[bool(hm.causal)]:
        try:
            if len(load_pairs(hm.tokenizer, bool(hm.causal), hm.vocab_size, task=task, limit=16)) >= 2:
                held.append(task)
        except HeadscopeError:  # none of the task's pairs fit the tokenizer
            continue
    return tuple(held)


@dataclass(frozen=True)
class Ctx:
    """The study's inputs every stage's options are built from."""

    model: str  # as the user gave it
    data: str  # the short text (analysis stages)
    prune_data: str  # the scoring text of the pruning curve
    heldout: str  # its held-out text
    out: str
    family: Family
    device: str | None = None
    # whether the roles stage measured retrieval scores (its long-range pass): kvcache then ranks by them
    retrieval_scores: bool = False
    # the compressed models the stages before saved, or why they saved none (the compare stage's inputs)
    candidates: tuple[Candidate, ...] = ()


@dataclass(frozen=True)
class Stage:
    """One verb of the study: its sizes, options, cost and the families it serves."""

    name: str
    verb: str
    question: str  # q1 | q2 | q3 | report
    levels: tuple[dict[str, Any], ...]
    options: Callable[[Ctx, dict[str, Any]], Options]
    cost: Callable[[Probe, Family, dict[str, Any]], float]
    refusal: Callable[[Family], str | None] = lambda f: None
    required: bool = False
    # a stage that runs its verb once per input the stages before left (compare: per compressed model): its Calls
    # from its options and the study's inputs
    split: Callable[[Ctx, Options, str], Calls] | None = None
    # the stages whose results it reads: their reuse keys join its own (a new pruned model, a new comparison)
    reads: tuple[str, ...] = ()

    def out_dir(self, out: str) -> str:
        return f"{out}/{SUBDIRS[self.name]}" if self.name in SUBDIRS else out

    def call(self, ctx: Ctx, level: int) -> Call | Calls:
        """The verb and its options at size `level`, writing into the stage's folder (a Calls for a split stage)."""
        options = self.options(ctx, self.levels[level]).replace(out=self.out_dir(ctx.out))
        return self.split(ctx, options, self.out_dir(ctx.out)) if self.split else Call(self.verb, options)


def _model(ctx: Ctx) -> dict[str, Any]:
    """The options every stage on the loaded model shares: the model as the user named it, and its device."""
    return {"model": ctx.model, "device": ctx.device}


def _short(n: int) -> dict[str, Any]:
    """A short-text stage's passages: `n` of at most MAX_LENGTH tokens."""
    return {"limit": n, "max_length": MAX_LENGTH}


def _load(p: Probe) -> float:
    """A stage's model load: none, since every stage runs on the study's one loaded model."""
    return 0.0


# --- question 1 ----------------------------------------------------------------------------------------
def _analyze_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    return AnalyzeOptions(**_model(ctx), data=ctx.data, **_short(lv["n"]))


def _analyze_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    # eager attention with the statistics kernel, then bootstrap intervals per statistic and head
    per_passage = costs.ANALYZE_CPU_PER_PASSAGE * f.heads_total / costs.FITTED_HEADS
    cpu = costs.ANALYZE_CPU_FIXED + per_passage * lv["n"]
    return _load(p) + lv["n"] * costs.ANALYZE_FWD * p.fwd_s + p.cpu_s * cpu


def _roles_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    o = RolesOptions(**_model(ctx), data=ctx.data, **_short(lv["n"]))
    if not ctx.family.causal:
        # gold dependency trees and coreference chains: encoder-only passes
        o = o.replace(treebank="ewt-test", coref="gum-test")
    if lv.get("long"):
        o = o.replace(long=lv["long"], long_windows=lv["windows"], haystacks=lv["haystacks"])
    return o


def _roles_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    n = lv["n"]
    # text pass, induction sequences (32 of 48 tokens), treebank and coreference passes (encoders)
    passes = costs.ROLES_FIXED_FWD + costs.ROLES_FWD[f.causal] * n
    long_s = 0.0
    if lv.get("long"):
        scale = lv["long"] / p.length
        # every long sequence costs its tokens' forwards and grows with its length (eager T x T)
        growth = 1 + lv["long"] / costs.LONG_QUADRATIC
        long_s = (lv["windows"] + lv["haystacks"]) * scale * p.fwd_s * costs.LONG_FWD * growth
    return _load(p) + passes * p.fwd_s + long_s + p.cpu_s * costs.ROLES_CPU


def _similar_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    return SimilarOptions(**_model(ctx), data=ctx.data, **_short(lv["n"]), js_max_tokens=lv["js"])


def _similar_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    pairs = f.heads_total * (f.heads_total - 1) / 2
    # passes for attention maps and head outputs, then the per-pair CPU work
    cpu = costs.SIMILAR_CPU_FIXED + pairs * lv["js"] * costs.JS_PAIR_TOKEN_CPU + pairs * costs.PAIR_CPU
    return _load(p) + costs.SIMILAR_FWD * lv["n"] * p.fwd_s + p.cpu_s * cpu


def _prefix(f: Family, what: str, capability: str | None = None) -> str | None:
    """Why the family refuses `what` (a stage): its spec's declared refusal, or what the `capability` needs."""
    why = f.cannot.get(capability) if capability else f.refuses.get(what)
    return f"{f.model_type} refuses {what}: {why}" if why else None


def _patch_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    return patching.options(ctx.model, ctx.device, ctx.family.causal, lv)


def _patch_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    return _load(p) + patching.cost(p.fwd_s, p.train_s, p.cpu_s, f.heads_total, lv)


def _patch_refusal(f: Family) -> str | None:
    return _prefix(f, "patch", "patch") or patching.refusal(f.causal, f.lm_head, f.model_type, f.architecture)


def _circuit_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    return CircuitOptions(**_model(ctx), task="ioi", limit=lv["n"], method=lv["method"])


def _circuit_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    senders = 1 + f.heads_total + f.n_layers  # the embeddings, every head, every MLP
    receivers = f.heads_total + 2 * f.n_kv_heads * f.n_layers + f.n_layers + 1  # q; k and v per group; MLPs; logits
    # each sender feeds the receivers after it: about half of all pairs
    edges = senders * receivers / 2
    return _load(p) + lv["n"] * costs.CIRCUIT_FWD[lv["method"]] * p.fwd_s + costs.CIRCUIT_CPU * edges / 1000 * p.cpu_s


def _circuit_refusal(f: Family) -> str | None:
    return f.circuit_refusal


# The circuit stage's sizes: EAP on few IOI pairs, then EAP-IG (MIB's recommended method) on more.
CIRCUIT_LEVELS: tuple[dict[str, Any], ...] = ({"n": 8, "method": "eap"}, {"n": 16, "method": "eap-ig"},
                                               {"n": 24, "method": "eap-ig"})


# --- question 3 ----------------------------------------------------------------------------------------
def _score_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    methods = STABLE_METHODS + (("ablation",) if lv["ablation"] else ())
    return ScoreOptions(**_model(ctx), data=ctx.data, **_short(lv["n"]), methods=methods)


def _score_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    n = lv["n"]
    # Taylor (forward + backward), then the output-norm and entropy passes
    s = costs.SCORE_TRAIN * n * p.train_s + costs.SCORE_FWD * n * p.fwd_s
    if lv["ablation"]:
        s += costs.ABLATION_FWD * f.heads_total * n * p.fwd_s + costs.ABLATION_CPU * f.heads_total * p.cpu_s
    # bootstrap intervals of every criterion, their rank correlations and split-half stabilities
    per_passage = costs.SCORE_CPU_PER_PASSAGE * f.heads_total / costs.FITTED_HEADS
    return _load(p) + s + p.cpu_s * (costs.SCORE_CPU_FIXED + per_passage * n)


# The drop question 3's answer is about: the curve stops once it is passed, and the saved model is the last point
# within it by the interval's upper bound (the model the answer describes).
PRUNE_TARGET = 0.05


def _prune_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    return PruneOptions(**_model(ctx), data=ctx.prune_data, heldout=ctx.heldout, **_short(lv["n"]),
                        heldout_limit=lv["heldout"], method="taylor", fraction=lv["fraction"], step=lv["step"],
                        recover_steps=lv["recover"], batch_size=costs.RECOVERY_BATCH, target_drop=PRUNE_TARGET,
                        save_model=True)


def _prune_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    points = prune_points(f, lv)
    # Per point: re-scoring by Taylor, the held-out metric (before and, with recovery, after it), and the recovery
    # steps on batches of 8 (AdamW over every weight: about 3 forward + backward passes a passage)
    passes = 1 + (costs.PRUNE_METRIC_PASSES - 1) * (lv["recover"] > 0)
    per_point = (lv["n"] * p.train_s + passes * lv["heldout"] * p.fwd_s
                 + lv["recover"] * costs.RECOVERY_BATCH * p.train_s * costs.RECOVERY_TRAIN)
    baseline = lv["heldout"] * p.fwd_s  # the unpruned model's metric (its own recovered model)
    return (_load(p) + baseline + points * per_point + costs.PRUNE_LOADS * p.load_s
            + p.cpu_s * (costs.PRUNE_CPU_FIXED + costs.PRUNE_CPU_PER_POINT * points))


def prune_points(f: Family, lv: dict[str, Any]) -> int:
    """The pruned points a target-stopped curve at size `lv` measures on this family: those expected within the
    target (costs.PRUNE_EXPECTED_WITHIN of the heads, by whether the size trains recovery) and the one that passes
    it, at most the fraction's points.

    A point removes `step` of the heads, in whole units: one head (MHA) or, on a GQA model, a slice of one query
    head from every KV group of a layer (redundancy/curves/plans.py, `HeadPlan`)."""
    unit = f.n_kv_heads if f.n_kv_heads < f.n_heads else 1
    per_point = math.ceil(max(1, round(lv["step"] * f.heads_total)) / unit) * unit
    within = costs.PRUNE_EXPECTED_WITHIN[lv["recover"] > 0] * f.heads_total
    expected = math.ceil(within / per_point) + 1
    return max(1, min(expected, math.floor(lv["fraction"] * f.heads_total / per_point)))


# --- question 2 ----------------------------------------------------------------------------------------
def _kv_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    return KvOptions(model=ctx.model)


def _kv_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    return costs.KV_S + p.cpu_s


def _gqa_target(f: Family) -> int:
    """The KV-head count a study converts to: the current count over its smallest prime factor (3 -> 1, 8 -> 4)."""
    k = next(d for d in range(2, f.n_kv_heads + 1) if f.n_kv_heads % d == 0)
    return f.n_kv_heads // k


def _conversion(ctx: Ctx, lv: dict[str, Any]) -> dict[str, Any]:
    """What GQA and MLA conversion share: the texts, their sizes and the uptraining steps."""
    return {**_model(ctx), "data": ctx.prune_data, "heldout": ctx.heldout, "limit": lv["n"],
            "heldout_limit": lv["heldout"], "max_length": MAX_LENGTH, "steps": lv["uptrain"]}


def _gqa_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    return GqaOptions(**_conversion(ctx, lv), kv_heads=_gqa_target(ctx.family))


def _gqa_refusal(f: Family) -> str | None:
    if f.cannot.get("gqa"):
        return f"GQA conversion cannot serve this {f.model_type} model: {f.cannot['gqa']}"
    if f.n_kv_heads < 2:
        return f"the model has {f.n_kv_heads} KV head per layer already (MQA): nothing to regroup"
    return None


def _conversion_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    # a copy of the model to convert (about a load), the held-out perplexities, the KL passes over the training
    # passages, the uptraining steps
    heldout = costs.CONVERSION_HELDOUT_FWD * lv["heldout"] * p.fwd_s
    uptrain = lv["uptrain"] * costs.RECOVERY_BATCH * p.train_s * costs.UPTRAIN_TRAIN
    return p.load_s + heldout + uptrain + lv["n"] * p.fwd_s + p.cpu_s * costs.CONVERSION_CPU


def _mla_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    # the conversion's SVDs and RoPE-frequency pass on top of what every conversion costs (fitted on SmolLM2)
    return costs.MLA_FACTOR * _conversion_cost(p, f, lv)


def _mla_rank(f: Family) -> int:
    """Half the full rank (MHA2MLA's d_head / 8 RoPE dimensions per KV head kept)."""
    rope = max(2, (f.d_head // 8) // 2 * 2)
    return max(1, min(f.d_model, f.n_kv_heads * (2 * f.d_head - rope)) // 2)


def _mla_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    rope = max(2, (ctx.family.d_head // 8) // 2 * 2)
    return MlaOptions(**_conversion(ctx, lv), kv_rank=_mla_rank(ctx.family), rope_dims=rope)


def _mla_refusal(f: Family) -> str | None:
    why = f.cannot.get("mla")
    return f"MLA conversion cannot serve this {f.model_type} model: {why}" if why else None


def _kvcache_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    o = KvcacheOptions(model=ctx.model, keep_full="25%", context=lv["context"], window=lv["window"],
                       limit=lv["passages"], needles=lv["needles"], haystacks=lv["haystacks"])
    if ctx.retrieval_scores:
        # the roles stage measured them (its long-range pass): ranked by them, not measured again
        o = o.replace(scores=str(Path(ctx.out) / ROLES_CSV.name), haystacks=KvcacheOptions().haystacks)
    # kvcache's own default device is cpu: the study's device only when it names one
    return o.replace(device=ctx.device) if ctx.device else o


def _kvcache_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    scale = lv["context"] / p.length
    # full, by score and random caches, each over passages and needles; the scoring haystacks once
    seqs = costs.KVCACHE_CACHES * (lv["passages"] + lv["needles"]) + lv["haystacks"] * costs.KVCACHE_HAYSTACK_FWD
    growth = 1 + lv["context"] / costs.KVCACHE_QUADRATIC
    return _load(p) + seqs * scale * p.fwd_s * growth + p.cpu_s * costs.KVCACHE_CPU


def _kvcache_refusal(f: Family) -> str | None:
    if f.kvcache_refusal:
        return f.kvcache_refusal
    if f.max_positions is not None and f.max_positions < LONG_MIN:
        return (f"the head-aware cache is measured on {LONG_MIN}-token contexts and the model has "
                f"{f.max_positions} positions")
    return None


def _compare_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    return comparing.options(ctx, lv, MAX_LENGTH)


def _compressors(f: Family) -> list[str]:
    """The stages that can save a compressed model of this family (the compare stage's inputs)."""
    refusals = {"prune": _prefix(f, "prune", "heads"), "gqa": _gqa_refusal(f), "mla": _mla_refusal(f)}
    return [name for name in comparing.COMPRESSED if not refusals[name]]


def _compare_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    return _load(p) + comparing.cost(p, f, lv, len(_compressors(f)))


def _compare_refusal(f: Family) -> str | None:
    if not _compressors(f):
        return "no stage of this study can compress the model (prune, gqa and mla are not supported)"
    return None


def _compare_split(ctx: Ctx, o: Options, out: str) -> Calls:
    return comparing.calls(ctx, o, out)


def _report_options(ctx: Ctx, lv: dict[str, Any]) -> Options:
    # the conversions' folders, where their stages ran (report refuses a missing one)
    subs = tuple(f"{ctx.out}/{sub}" for sub in CONVERSIONS.values() if (Path(ctx.out) / sub).is_dir())
    return ReportOptions(**_model(ctx), data=ctx.data, sentences=3, limit=8, from_dirs=subs)


def _report_cost(p: Probe, f: Family, lv: dict[str, Any]) -> float:
    cpu = costs.REPORT_CPU_FIXED + f.heads_total / costs.REPORT_HEADS_PER_CPU
    return _load(p) + costs.REPORT_FWD * p.fwd_s + p.cpu_s * cpu


def _long_levels(f: Family) -> list[int]:
    if not f.causal or f.max_positions is None:
        return [512, 1024] if f.causal else []
    return [n for n in (512, 1024) if n <= f.max_positions]


def stages_for(f: Family) -> list[Stage]:
    """Every stage of a study of this family, in running order (the report last)."""
    ns = (16, 32, 64, 128, 200)
    long = _long_levels(f)
    if long:
        roles_levels = tuple({"n": n, "long": long[min(i, len(long) - 1)], "windows": 1 + (i > 0),
                              "haystacks": 2 if i == 0 else 4} for i, n in enumerate(ns))
    else:
        roles_levels = tuple({"n": n} for n in ns)
    ablation = tuple({"n": n, "ablation": False} for n in (16, 32)) + tuple(
        {"n": n, "ablation": True} for n in (16, 32, 64, 128))
    # Fine steps from the first point on, so that every size can find heads within PRUNE_TARGET (SmolLM2: 24 of
    # 270 fit, docs/pruning.md; a step of 25% passed it at once); the curve stops once the target is passed, the
    # fraction only caps it. The cheapest size trains no recovery: one recovery step costs about twice a point.
    prune = ({"n": 8, "heldout": 16, "fraction": 0.5, "step": 0.02, "recover": 0},
             {"n": 16, "heldout": 16, "fraction": 0.5, "step": 0.02, "recover": 1},
             {"n": 32, "heldout": 32, "fraction": 0.5, "step": 0.02, "recover": 2},
             {"n": 64, "heldout": 64, "fraction": 0.5, "step": 0.01, "recover": 4},
             {"n": 64, "heldout": 128, "fraction": 0.6, "step": 0.01, "recover": 8})
    conversion = ({"n": 16, "heldout": 16, "uptrain": 0}, {"n": 32, "heldout": 32, "uptrain": 10},
                  {"n": 64, "heldout": 64, "uptrain": 30})
    kvc = ({"context": 512, "window": 128, "passages": 1, "needles": 2, "haystacks": 2},
           {"context": 1024, "window": 256, "passages": 2, "needles": 4, "haystacks": 4})
    return [
        Stage("analyze", "analyze", "q1", tuple({"n": n} for n in ns), _analyze_options, _analyze_cost, required=True),
        Stage("roles", "roles", "q1", roles_levels, _roles_options, _roles_cost),
        Stage("similar", "similar", "q1", tuple({"n": n, "js": 32 * n} for n in ns[:4]), _similar_options,
              _similar_cost, lambda fam: _prefix(fam, "similar")),
        Stage("score", "score", "q3", ablation, _score_options, _score_cost),
        Stage("patch", "patch", "q1", patching.LEVELS, _patch_options, _patch_cost, _patch_refusal),
        Stage("circuit", "circuit", "q1", CIRCUIT_LEVELS, _circuit_options, _circuit_cost, _circuit_refusal),
        Stage("prune", "prune", "q3", prune, _prune_options, _prune_cost, lambda fam: _prefix(fam, "prune", "heads")),
        Stage("kv", "kv", "q2", ({},), _kv_options, _kv_cost),
        Stage("gqa", "gqa", "q2", conversion, _gqa_options, _conversion_cost, _gqa_refusal),
        Stage("mla", "mla", "q2", conversion, _mla_options, _mla_cost, _mla_refusal),
        Stage("compare", "compare", "q3", comparing.LEVELS, _compare_options, _compare_cost, _compare_refusal,
              split=_compare_split, reads=tuple(comparing.COMPRESSED)),
        Stage("kvcache", "kvcache", "q2", kvc, _kvcache_options, _kvcache_cost, _kvcache_refusal),
        Stage("report", "report", "report", ({},), _report_options, _report_cost, required=True),
    ]


# When the budget is short, stages go in the reverse of this order (the report and statistics stay).
PRIORITY = ("report", "analyze", "kv", "roles", "patch", "score", "prune", "compare", "similar", "circuit", "gqa",
            "kvcache", "mla")
