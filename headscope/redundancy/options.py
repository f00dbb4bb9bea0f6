"""The options of question 3's verbs: score, prune, tasks."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HeadscopeError, OptionError, did_you_mean
from ..eval.metrics import METRICS
from ..options import (
    CheckOptions,
    DataOptions,
    HeldoutOptions,
    ModelOptions,
    OutputOptions,
    SeedOptions,
    StableOptions,
    WorkerOptions,
    option,
)
from ..options.parse import share
from .curve_checks import check_args, check_target_drop
from .importance import CRITERIA, check_method, parse_methods
from .importance.hard_concrete import BETA
from .importance.l0 import L0Settings, check_l0
from .importance.tasks import parse_tasks
from .protect import check_names, parse_protect
from .unit_kinds import UNITS, unit_kind

L0 = "L0 gates (--method l0)"
DEFAULT_METHODS = ("gradient", "ablation")
UNIT_CHOICES = ("head", "slice", "group", "attention", "block", "ffn", "mix")


@dataclass(frozen=True, kw_only=True)
class L0Options(DataOptions):
    """The settings of `--method l0` (hard-concrete head gates) that score and prune share."""

    l0_steps: int = option(200, "gate training steps (default 200)", most="steps", group=L0)
    l0_lr: float = option(0.1, "Adam learning rate of the gates' log-alpha (default 0.1)", group=L0)
    l0_temperature: float = option(BETA, f"hard-concrete temperature beta (default {BETA:.3g}, as Louizos et al.)",
                                   group=L0)
    l0_penalty: float | None = option(None, "penalty weight on the expected share of open gates (instead of a "
                                            "target)", group=L0)
    l0_target: float | None = option(None, "share of heads the gates are trained to close, in [0, 1) (score: "
                                           "default 0.5 unless --l0-penalty; prune: default --fraction)", group=L0)

    def l0_settings(self, default_target: float | None = None) -> L0Settings:
        """The L0 gate settings these options give (checked: a bad value is refused even when l0 is not run)."""
        given = self.l0_target is not None or self.l0_penalty is not None
        target = self.l0_target if given else default_target
        check_l0(self.l0_steps, self.l0_lr, self.l0_temperature, self.l0_penalty, target)
        return L0Settings(steps=self.l0_steps, lr=self.l0_lr, temperature=self.l0_temperature,
                          penalty=self.l0_penalty, target=target)


@dataclass(frozen=True, kw_only=True)
class ScoreOptions(ModelOptions, L0Options, StableOptions, OutputOptions, WorkerOptions):
    """`headscope score`: head (or unit) importance by one or more criteria."""

    unit: str = option("head", "what to score: head (default), attention = whole attention sub-layers, block = whole "
                               "layers, ffn = FFN neurons; units beyond heads write unit_importance.csv/.json",
                       choices=("head", "attention", "block", "ffn"))
    methods: tuple[str, ...] | None = option(None, "comma-separated criteria (see the description), or all "
                                                   "(default: gradient,ablation)", flag="--method",
                                             parse=lambda text: tuple(m.strip() for m in text.split(",")))
    metric: str = option("auto", "auto (lm_loss for causal LMs, accuracy for classifiers on labelled jsonl, else "
                                 "fidelity), or a metric's name")
    ig_steps: int = option(16, "integrated-gradients steps (default 16)", at_least=1, most="ig_steps")
    pruned: str | None = option(None, "heads already pruned (gate 0; scored NaN), e.g. L0H3,L5H1")

    def check(self) -> None:
        super().check()
        if self.unit != "head":
            for m in self.methods or ():
                if m != "all":
                    check_method(self.unit, m)
            if self.metric != "auto":
                METRICS.get(self.metric)
            if self.pruned:
                raise OptionError("pruned", f"applies to heads; with unit={self.unit} score the whole model",
                                  also=("unit",))
            return
        parse_methods(",".join(self.methods or DEFAULT_METHODS))  # an unknown method: did you mean
        if self.metric != "auto" and self.metric not in METRICS:
            raise HeadscopeError(f"unknown metric {self.metric!r}{did_you_mean(self.metric, METRICS)}; "
                                 f"choose auto or one of {', '.join(METRICS)}")
        self.l0_settings(0.5)


@dataclass(frozen=True, kw_only=True)
class PruneOptions(ModelOptions, L0Options, HeldoutOptions, StableOptions, OutputOptions, CheckOptions):
    """`headscope prune`: the pruning curve, with recovery, and the smaller model."""

    fraction: float | None = option(None, "share of heads to remove, in [0, 1), e.g. 0.4 or 40%", parse=share)
    target_drop: float | None = option(None, "stop once the metric drops by more than this, e.g. 1% (for LMs: "
                                             "perplexity increase); with --fraction too, the fraction is the cap",
                                       parse=share)
    method: str | None = option(None, "importance criterion (see `headscope score --help`; default: gradient). With "
                                      "--unit attention/block/ffn/mix the unit's own criteria (defaults: attention: "
                                      "ablation, block: block_influence, ffn: taylor, mix: ablation+taylor)")
    metric: str = option("auto", "auto or a metric's name")
    step: float = option(0.05, "share of heads removed per step (default 5%)", parse=share)
    unit: str | None = option(None, "what goes at once: head (MHA), slice = one query head of every KV group, group = "
                                    "a whole KV group (default: head for MHA, slice for GQA); or beyond heads: "
                                    "attention = a whole attention sub-layer, block = a whole layer, ffn = FFN "
                                    "neurons, mix = attention sub-layers and FFN neurons; these write "
                                    "unit_curve.csv/.png and units.json, with --fraction and --step as shares of all "
                                    "parameters", choices=UNIT_CHOICES)
    latency: bool = option(False, "with --unit attention/block/ffn/mix: prune each point physically and time a "
                                  "forward pass against the original's (in turn, 5 repeats, median ratio) beside the "
                                  "FLOP-ideal speedup")
    uniform: bool = option(False, "head units: every point removes the same units from every layer (its least "
                                  "important ones), so every layer keeps the same number of query heads (per KV "
                                  "group with --unit slice, whole KV groups alike with --unit group) and "
                                  "--save-model writes an ordinary config that plain transformers loads where "
                                  "transformers accepts that shape (else its own model_type; the last line says "
                                  "which); --fraction is rounded down to whole rounds")
    protect: tuple[str, ...] = option((), "capabilities whose heads are never pruned, comma-separated: ioi, induction, "
                                          "greater-than, retrieval (decoders), masked (masked-LM encoders); measured "
                                          "on the unpruned model before pruning (causal tasks: heads whose patching "
                                          "effect's interval lies above 0; retrieval: Wu et al.'s retrieval heads); "
                                          "the curve stops early if only protected heads remain (docs/pruning.md)",
                                      parse=parse_protect, metavar="CAPS")
    recover_steps: int = option(0, "fine-tuning steps between pruning steps (default 0: no recovery)", metavar="N",
                                at_least=0, most="steps", old=("--recover",))
    recover_lr: float = option(5e-05, "recovery learning rate (default 5e-5)", above=0)
    wordsim: bool = option(False, "also record wordsim353 and simlex999 Spearman at each point (encoders)")
    wordsim_recovered: bool = option(False, "with --wordsim and --recover-steps, also measure them on the recovered "
                                            "model (slower)")
    save_model: bool = option(False, "write the physically pruned model (at --fraction, or the largest fraction "
                                     "within --target-drop) to OUT/model")

    @property
    def heads(self) -> bool:
        """Whether the curve removes heads (head, slice, group), not units beyond heads."""
        return self.unit is None or unit_kind(self.unit).scope == "heads"

    def check(self) -> None:
        super().check()
        heads = self.heads
        if self.uniform and not heads:
            raise OptionError("uniform", f"is for head units (head, slice, group); unit={self.unit} removes "
                                         f"whole units already", also=("unit",))
        check_names(self.protect)
        if self.protect and not heads:
            raise OptionError("protect", f"keeps heads out of head curves (unit head, slice or group); "
                                         f"unit={self.unit} removes whole units", also=("unit",))
        if heads and self.latency:
            raise OptionError("latency", "needs unit=attention, block, ffn or mix (head curves: see "
                                         "benchmarks/bench_prune.py)", also=("unit",))
        if not heads:
            if self.target_drop is not None:
                raise OptionError("target_drop", f"is for head units; with unit={self.unit} give fraction, the "
                                                 f"share of parameters to remove (e.g. 0.3)", also=("unit", "fraction"))
            if self.fraction is None:
                raise OptionError("unit", f"{self.unit} needs fraction, the share of all parameters to remove "
                                          f"(e.g. 0.3)", also=("fraction",))
            if self.wordsim or self.wordsim_recovered:
                raise OptionError("wordsim", "is for head units; unit curves record the metric only")
        method = self.method or ("gradient" if heads else UNITS.get(str(self.unit)).default_method)
        # the --l0-* options given, named in their own words before --fraction's checks
        self.l0_settings()
        check_args(self.fraction, self.target_drop, self.step, self.recover_steps, method, self.unit)
        if self.metric != "auto":
            METRICS.get(self.metric)  # an unknown metric raises, with a did-you-mean
            check_target_drop(self.metric, self.target_drop)
        # checked even when l0 is not chosen: no bad value is ignored
        self.l0_settings(self.fraction)
        if self.until_stable is not None and (not heads or method == "l0"):
            raise OptionError("until_stable", "reads scoring passages until the head ranking is stable: it is for "
                                              "head curves scored per passage (not unit=attention/block/ffn/mix or "
                                              "method=l0)", also=("unit", "method"))
        if method == "l0" and self.fraction is None and self.l0_penalty is None and self.l0_target is None:
            raise OptionError("method", "l0 with only target_drop needs l0_penalty or l0_target (what the gates are "
                                        "trained towards); or give fraction",
                              also=("target_drop", "l0_penalty", "l0_target", "fraction"))


@dataclass(frozen=True, kw_only=True)
class TasksOptions(ModelOptions, SeedOptions, OutputOptions):
    """`headscope tasks`: head importance under several tasks and their rank correlation."""

    tasks: str = option("fidelity,wordsim,syntax", "comma-separated, at least two of lm_ptb, lm_gum, fidelity, "
                                                   "wordsim, syntax, classification, retrieval; a task's own data "
                                                   "after '=', e.g. classification=labels.jsonl (default: the "
                                                   "built-in polarity sentences), lm_ptb=ptb-test, retrieval=4096 "
                                                   "(the context length) (default: fidelity,wordsim,syntax)")
    method: str = option("taylor", "criterion for the metric tasks (lm_*, fidelity, classification) (default taylor)")
    limit: int = option(64, "passages (sentences) per task (default 64; classification through a probe: passages "
                            "scored, the probe is fitted on its whole half)", at_least=1)
    max_length: int = option(64, "tokens per passage (default 64)", at_least=1)
    batch_size: int = option(16, "passages per forward pass (default 16)", at_least=1)

    def check(self) -> None:
        super().check()
        # unknown tasks, labelled tasks without labels: before anything loads
        parse_tasks(self.tasks)
        CRITERIA.get(self.method)
