"""`study(...)`: every stage a family supports, sized to the budget, into one folder; then the report.

Order of work: refuse bad options, read the data and probe the model (nothing is written until the budget
is known to cover the least a study needs), plan, then run the stages in order. Before each stage the plan
of what is left is redone with the time left and the measured/estimated ratio of the stages run so far;
after each, study.json records it (so an interrupted study continues where it stopped).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..data import read_texts
from ..data.shared import shared_data
from ..errors import HeadscopeError, OutputConflict
from ..io import check_writable_dir
from ..models.adapter import HeadModel
from ..options import OptionError, Result
from ..provenance import data_fingerprint, model_fingerprint
from ..version import versions
from . import answers as answers_mod
from .budget import FILL, Choice, Plan, fmt_duration, make_plan, tolerance_s
from .comparing import COMPRESSED, Candidate
from .leftover import widths
from .options import StudyOptions
from .probe import probe
from .progress import Progress
from .records import Records, retrieval_measured
from .stages import MAX_LENGTH, PRIORITY, Ctx, Family, Stage, stages_for
from .state import LOG_DIR, State, clear_stage_files, clear_study, file_hashes, stage_key
from .unpruned import kept_original
from .verbs import Call, Calls, run_call, run_calls, verb_files

log = logging.getLogger(__name__)

DEFAULT_DATA, DEFAULT_PRUNE_DATA, DEFAULT_HELDOUT = "ptb-valid", "ptb-train", "ptb-valid"
CORRECTION_RANGE = (0.3, 5.0)


@dataclass
class Outcome:
    """What a study did: the state written, the answers, the elapsed time and whether a stage failed."""

    state: State
    answers: dict[str, str]
    elapsed: float
    failed: list[str]


def check_out(out: Path, force: bool) -> State | None:
    """The folder's study.json (to continue), or None; refuses a folder holding another verb's results."""
    check_writable_dir(out)
    if force or not out.is_dir():
        return None
    state = State.load(out)
    if state is not None:
        return state
    verbs = ("analyze", "roles", "similar", "score", "patch", "circuit", "prune", "kv", "kvcache", "report")
    clash = sorted({n for v in verbs for n in verb_files(v) if (out / n).exists()})
    if clash:
        shown = ", ".join(clash[:4]) + (", ..." if len(clash) > 4 else "")
        raise HeadscopeError(f"out {str(out)!r} holds results no study recorded ({shown}); pass force=True to "
                             f"replace them or choose another out", fields=("out", "force"))
    return None


def _estimate(stage: Stage, level: int, probe_: Any, family: Family, corr: float) -> float:
    return stage.cost(probe_, family, stage.levels[level]) * corr


def _plan(stages: list[Stage], probe_: Any, family: Family, corr: float, available: float,
          fixed: dict[str, int] | None = None) -> Plan:
    """A plan of `stages` within `available` seconds (`fixed`: sizes a resumed study keeps)."""
    by = {s.name: s for s in stages}

    def cost(name: str, lv: int) -> float:
        return _estimate(by[name], lv, probe_, family, corr)

    if fixed is not None and any(lv is not None and (name not in by or lv >= len(by[name].levels))
                                 for name, lv in fixed.items()):
        # sizes this version's stages do not have (an edited study.json): plan anew
        fixed = None
    if fixed is not None:
        return Plan([Choice(s.name, fixed.get(s.name), cost(s.name, fixed[s.name]) if s.name in fixed else 0.0,
                            "" if s.name in fixed else "left out when the study was planned")
                     for s in stages])
    return make_plan([s.name for s in stages], cost, lambda n: len(by[n].levels), lambda n: by[n].required,
                     PRIORITY, available)


def minimum_s(stages: list[Stage], probe_: Any, family: Family) -> float:
    """The least a study of this model needs here: its required stages at their cheapest."""
    return sum(s.cost(probe_, family, s.levels[0]) for s in stages if s.required)


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 elsewhere): the budget counts Python's start and the
    imports too, which is what the user's clock sees."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def study(opts: StudyOptions, stream: TextIO, live: bool | None = None, started_ago: float = 0.0) -> Outcome:
    """Run (or continue) the study `opts` describes; the progress view goes to `stream`. `started_ago`: seconds
    of the user's wall clock already spent (the process's start), counted against the budget. Every stage runs
    on the one loaded model, and each corpus is read and tokenised once (`data.shared.shared_data`)."""
    with shared_data():
        return _study(opts, stream, live, started_ago)


def _study(opts: StudyOptions, stream: TextIO, live: bool | None, started_ago: float) -> Outcome:
    start = time.perf_counter() - started_ago
    out = Path(opts.out)
    previous = check_out(out, opts.force)
    data = opts.data or DEFAULT_DATA
    texts = read_texts(data)  # bad data fails before the model loads
    prune_data, heldout = (opts.data, opts.data) if opts.data else (DEFAULT_PRUNE_DATA, DEFAULT_HELDOUT)
    hm, probe_ = probe(opts.model, texts, MAX_LENGTH, opts.device, allow_random_weights=opts.allow_random_weights)
    if hm.tokenizer is None:
        raise HeadscopeError(f"{hm.name} has no tokenizer: no stage of a study can read text with it; give a model "
                             f"directory with its tokenizer")
    family = Family.of(hm)
    model_fp = model_fingerprint(hm.model, hm.config)
    all_stages = stages_for(family)
    refused = {s.name: s.refusal(family) for s in all_stages}
    stages = [s for s in all_stages if not refused[s.name]]
    need = time.perf_counter() - start + minimum_s(stages, probe_, family)
    if opts.budget_s < need:
        raise OptionError("budget", f"{fmt_duration(opts.budget_s)} is below what a study of {family.name} needs "
                                    f"on this machine now: ~{fmt_duration(need)} (the probe, then analyze and the "
                                    f"report at their cheapest); give {int(need // 60) + 1}m or more")
    data_fp = {"data": data_fingerprint(texts), "prune_data": prune_data, "heldout": heldout}
    if opts.force:
        clear_study(out)
    state = previous or State(out)
    study_key = stage_key(model_fp, data_fp, [f"budget={opts.budget_s}", f"device={opts.device}"])
    fixed = state.data.get("plan") if state.data.get("study_key") == study_key else None
    ctx = Ctx(opts.model, data, prune_data, heldout, str(out), family, opts.device)
    state.data.update({
        "format": state.data.get("format", 1), "study_key": study_key,
        "model": {"name": family.name, "given": opts.model, "model_type": family.model_type,
                  "causal": family.causal, "n_layers": family.n_layers, "n_heads": family.n_heads,
                  "n_kv_heads": family.n_kv_heads, "heads": family.heads_total,
                  "max_positions": family.max_positions, "fingerprint": model_fp},
        "data": data_fp, "budget_s": opts.budget_s, "tolerance_s": tolerance_s(opts.budget_s),
        "probe": probe_.as_dict(), "versions": versions()})
    for stage in all_stages:
        why = refused[stage.name]
        # a previous study's files of this stage (another model's) must not reach the report
        if why:
            clear_stage_files(Path(stage.out_dir(str(out))), stage.verb)
            name = stage.name
            state.stage(name).clear()
            state.stage(name).update({"status": "not supported", "reason": why})
    plan = _plan(stages, probe_, family, 1.0, opts.budget_s * FILL - (time.perf_counter() - start), fixed)
    state.data["plan"] = {c.stage: c.level for c in plan.chosen()}
    state.data.setdefault("answers", {})
    state.data["elapsed_s"] = 0.0
    out.mkdir(parents=True, exist_ok=True)
    state.save()
    progress = Progress(stream, opts.budget_s, start, len(stages), live)
    try:
        failed = _Runner(stages=stages, plan=plan, state=state, ctx=ctx, probe_=probe_, family=family, hm=hm,
                         keys=(model_fp, data_fp), opts=opts, start=start, progress=progress).run_all()
    finally:
        progress.close()
    state.data["elapsed_s"] = round(time.perf_counter() - start, 1)
    state.save()
    return Outcome(state, state.data.get("answers", {}), time.perf_counter() - start, failed)


class _Runner:
    """The stages in turn: reused, left out, downsized to the time left, or run; then the time left goes to
    the stage whose intervals are widest; then the report."""

    def __init__(self, stages: list[Stage], plan: Plan, state: State, ctx: Ctx, probe_: Any, family: Family,
                 hm: HeadModel, keys: tuple[str, dict[str, Any]], opts: StudyOptions, start: float,
                 progress: Progress) -> None:
        self.stages, self.plan, self.state, self.ctx, self.probe, self.family = stages, plan, state, ctx, probe_, family
        # the study's one loaded model: every stage runs on it (they copy before they change it)
        self.hm = hm
        self.model_fp, self.data_fp = keys
        self.opts, self.start, self.progress = opts, start, progress
        self.spent_est, self.spent_real = 0.0, 0.0
        self.failed: list[str] = []
        # a continued study spends no time left: its reruns reuse everything
        self.reused_any = False
        # the Results of the stages run in this process, by stage (what the answers and later stages read first)
        self.results: dict[str, Result] = {}

    def corr(self) -> float:
        if not self.spent_est:
            return 1.0
        return min(max(self.spent_real / self.spent_est, CORRECTION_RANGE[0]), CORRECTION_RANGE[1])

    def left(self) -> float:
        """Seconds of the plan's share of the budget not yet used."""
        return self.opts.budget_s * FILL - (time.perf_counter() - self.start)

    def tag(self, i: int, stage: Stage) -> str:
        return f"[{i}/{len(self.stages)}] {stage.name}"

    def leave_out(self, i: int, stage: Stage, reason: str, status: str = "left out") -> None:
        rec = self.state.stage(stage.name)
        rec.clear()
        rec.update({"status": status, "reason": reason})
        self.results.pop(stage.name, None)
        clear_stage_files(Path(stage.out_dir(self.ctx.out)), stage.verb)  # no stale result reaches the report
        self.progress.say(f"{self.tag(i, stage)}: {reason}")
        self.state.save()

    def run_all(self) -> list[str]:
        for i, stage in enumerate(self.stages, 1):
            choice = self.plan.get(stage.name)
            if choice.level is None:
                self.leave_out(i, stage, choice.reason or "left out by the plan")
                continue
            level = _fit(stage, self.stages[i - 1:], self.plan, self.probe, self.family, self.corr(), self.left())
            if level is None:
                self.leave_out(i, stage, f"the time left ({fmt_duration(self.left() / FILL)}) does not cover its "
                                         f"cheapest size and the cheapest of the more important stages after it")
                continue
            if stage.name == "report":
                self.spend_leftover(i, stage)
                self.state.data["answers"] = answers_mod.answers(self.records(), self.state.data)
                self.state.save()
            self.one(i, stage, level)
        return self.failed

    def spend_leftover(self, i: int, report: Stage) -> None:
        """Time left before the report: first the stages left out, at their cheapest, by priority; then, while
        it fits, the stage whose intervals are widest again one size larger."""
        by = {s.name: s for s in self.stages}
        if self.reused_any:
            return
        # first the stages left out (estimates come out high on a busy probe), by priority
        for name in PRIORITY:
            rec = self.state.data["stages"].get(name) or {}
            if name not in by or rec.get("status") != "left out":
                continue
            cost = _estimate(by[name], 0, self.probe, self.family, self.corr()) + self.readers_cost(name)
            if cost + _estimate(report, 0, self.probe, self.family, self.corr()) <= self.left():
                self.progress.say(f"{self.tag(i, report)}: time left: {name}, left out before, at its cheapest size")
                self.state.data["plan"][name] = 0
                self.one(self.stages.index(by[name]) + 1, by[name], 0)
                self.rerun_readers(name)
        for _ in range(3):
            reserve = _estimate(report, 0, self.probe, self.family, self.corr())
            options, too_dear = [], []
            for name, width in widths(self.records()).items():
                rec = self.state.data["stages"].get(name) or {}
                lv = rec.get("level")
                if rec.get("status") != "done" or lv is None or lv + 1 >= len(by[name].levels):
                    continue
                cost = _estimate(by[name], lv + 1, self.probe, self.family, self.corr()) + self.readers_cost(name)
                if cost + reserve <= self.left():
                    options.append((width, name, lv + 1))
                else:
                    too_dear.append((width, name, cost))
            if not options:
                self.note_leftover(too_dear, reserve)
                return
            width, name, lv = max(options)
            self.progress.say(f"{self.tag(i, report)}: time left: {name} again one size larger (its intervals are "
                              f"the widest, relative width {width:.2f})")
            self.state.data["plan"][name] = lv
            self.state.stage(name)["widened_from"] = lv - 1
            self.one(self.stages.index(by[name]) + 1, by[name], lv)
            self.rerun_readers(name)

    def readers(self, name: str) -> list[Stage]:
        """The planned stages that read stage `name`'s results (compare reads the compressed models)."""
        return [s for s in self.stages if name in s.reads and self.state.data["plan"].get(s.name) is not None]

    def readers_cost(self, name: str) -> float:
        """What running `name` again costs its readers, run again after it."""
        return sum(_estimate(s, self.state.data["plan"][s.name], self.probe, self.family, self.corr())
                   for s in self.readers(name))

    def rerun_readers(self, name: str) -> None:
        """After `name` ran again (time left), the stages reading its results run again on them."""
        for s in self.readers(name):
            self.one(self.stages.index(s) + 1, s, self.state.data["plan"][s.name])

    def note_leftover(self, too_dear: list[tuple[float, str, float]], reserve: float) -> None:
        """Record, for the closing lines, the time left and what the study would have done with more: the
        stage whose intervals are widest, one size larger, and about what it costs (estimate)."""
        left = max(self.left() / FILL, 0.0)
        note: dict[str, Any] = {"left_s": round(left, 1)}
        if too_dear:
            width, name, cost = max(too_dear)
            note.update({"next": name, "next_cost_s": round(cost + reserve, 1), "width": round(width, 3)})
        self.state.data["leftover"] = note

    def records(self) -> Records:
        """The stages' artifacts: the Results of those run in this process, the files of those reused."""
        return Records(Path(self.ctx.out), self.results)

    def measured(self) -> Ctx:
        """The study's inputs with what earlier stages measured that a later one's options depend on: the retrieval
        scores of the roles stage (its Result here, or its roles.csv when it was reused), the compressed models
        the stages before saved."""
        roles = self.state.data["stages"].get("roles") or {}
        done = roles.get("status") == "done"
        scores = done and retrieval_measured(self.results.get("roles"), Path(self.ctx.out))
        return dataclasses.replace(self.ctx, retrieval_scores=scores, candidates=self.candidates())

    def candidates(self) -> tuple[Candidate, ...]:
        """Each compressing stage of this study: the model it saved, or why there is none (its status, reason)."""
        found = []
        for name, rel in COMPRESSED.items():
            if name not in {s.name for s in self.stages}:
                continue  # refused for this family: no reason to repeat
            rec = self.state.data["stages"].get(name) or {}
            folder = Path(self.ctx.out) / rel
            if rec.get("status") == "done" and (folder / "config.json").is_file():
                # a pruned model with every head is the original: nothing to compare it with
                kept = kept_original(self.records()) if name == "prune" else None
                found.append(Candidate(name, None, kept.reason()) if kept else Candidate(name, str(folder)))
                continue
            status = rec.get("status", "not run")
            why = "saved no model" if status == "done" else status + (f": {rec['reason']}" if rec.get("reason") else "")
            found.append(Candidate(name, None, why))
        return tuple(found)

    def one(self, i: int, stage: Stage, level: int) -> None:
        """Reuse `stage` at `level` when study.json has it, else run it and record it."""
        state, ctx, rec = self.state, self.measured(), self.state.stage(stage.name)
        call = stage.call(ctx, level)
        if isinstance(call, Calls) and not call.parts:
            self.leave_out(i, stage, f"no compressed model to {stage.verb}: {call.why}", "not supported")
            return
        extra: dict[str, Any] = {}
        # the report depends on every other stage's result and the answers
        if stage.name == "report":
            extra = {"stages": {n: r.get("key") for n, r in state.data["stages"].items() if n != "report"},
                     "answers": state.data["answers"]}
        elif stage.reads:
            # a stage reading others' results: theirs are part of its identity
            extra = {"stages": {n: (state.data["stages"].get(n) or {}).get("key") for n in stage.reads}}
        key = stage_key(self.model_fp, {**self.data_fp, **extra}, call.canonical())
        if state.reusable(stage.name, key):
            self.progress.say(f"{self.tag(i, stage)}: reused (same model, data and options; "
                              f"{rec.get('seconds', 0):.0f} s when it ran)")
            rec["reused"] = True
            self.reused_any = True
            # its files, recorded unchanged, are what later readers read
            self.results.pop(stage.name, None)
            state.save()
            return
        estimate = _estimate(stage, level, self.probe, self.family, self.corr())
        root = Path(stage.out_dir(ctx.out))
        self.results.pop(stage.name, None)
        clear_stage_files(root, stage.verb)
        widened = rec.get("widened_from")
        rec.clear()
        rec.update({"status": "running", "command": call.command(), "level": level, "size": stage.levels[level],
                    "estimate_s": round(estimate, 1), "dir": str(root.relative_to(Path(ctx.out)))})
        if widened is not None:
            rec["widened_from"] = widened
        state.save()
        self.progress.stage(i, stage.name, estimate)
        t0 = time.perf_counter()
        if not self.attempt(i, stage, call, rec):
            return
        seconds = time.perf_counter() - t0
        self.spent_est, self.spent_real = self.spent_est + estimate / self.corr(), self.spent_real + seconds
        rec.update({"status": "done", "key": key, "seconds": round(seconds, 1),
                    "files": file_hashes(root, verb_files(stage.verb))})
        self.progress.say(f"{self.tag(i, stage)}: done in {fmt_duration(seconds)} (estimate {fmt_duration(estimate)})"
                          f" | study {fmt_duration(time.perf_counter() - self.start)} / "
                          f"{fmt_duration(self.opts.budget_s)}")
        state.save()

    def attempt(self, i: int, stage: Stage, call: Call | Calls, rec: dict[str, Any]) -> bool:
        """Run the verb; False (recorded) when it refused or failed. An interrupt is recorded, then raised."""
        log_file = Path(self.ctx.out) / LOG_DIR / f"{stage.name}.txt"
        try:
            # compare: the original must be what the study loaded, unchanged
            if isinstance(call, Calls):
                if model_fingerprint(self.hm.model, self.hm.config) != self.model_fp:
                    raise RuntimeError(f"the study's model changed before the {stage.name} stage (a stage before "
                                       f"modified it in place): it is no longer the original to compare with")
                self.results[stage.name] = run_calls(call, self.hm, log_file)
            else:
                self.results[stage.name] = run_call(call, self.hm, log_file)
            return True
        except OutputConflict as e:
            # the study chose and cleared this folder: a clash there is a bug, not a refusal
            self._failed(i, stage, rec, e)
        except HeadscopeError as e:  # the verb refused this model or these sizes: say so, go on
            rec.update({"status": "not supported", "reason": str(e).splitlines()[0]})
            self.progress.say(f"{self.tag(i, stage)}: refused: {rec['reason']}")
        except KeyboardInterrupt:
            rec.update({"status": "interrupted"})
            self.state.save()
            raise
        except Exception as e:
            # a bug in one stage must not lose the others; the log has the details
            self._failed(i, stage, rec, e)
        self.state.save()
        return False

    def _failed(self, i: int, stage: Stage, rec: dict[str, Any], e: Exception) -> None:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        rec.update({"status": "failed", "reason": f"{type(e).__name__}: {first}"})
        log.warning("stage %s failed: %s", stage.name, rec["reason"])
        self.failed.append(stage.name)
        self.progress.say(f"{self.tag(i, stage)}: FAILED ({rec['reason']}); see {LOG_DIR}/{stage.name}.txt")


def _fit(stage: Stage, rest: list[Stage], plan: Plan, probe_: Any, family: Family, corr: float,
         available: float) -> int | None:
    """The planned size of `stage`, or a smaller one, such that it and the cheapest sizes of the planned stages
    after it that rank above it in PRIORITY fit in `available` seconds (estimates times `corr`); None when even
    its cheapest does not (a required stage always gets its cheapest). Later stages of lower priority shrink
    or go in their turn."""
    rank = {name: k for k, name in enumerate(PRIORITY)}
    after = sum(_estimate(s, 0, probe_, family, corr) for s in rest[1:]
                if plan.get(s.name).level is not None and rank.get(s.name, 99) < rank.get(stage.name, 99))
    planned = plan.get(stage.name).level or 0
    for level in range(planned, -1, -1):
        if _estimate(stage, level, probe_, family, corr) + after <= available:
            if level != planned:
                log.info("%s: size %d instead of %d to fit the time left", stage.name, level, planned)
            return level
    return 0 if stage.required else None
