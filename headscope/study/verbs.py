"""Running one verb of a study on the library: its Options, its function on the study's one loaded model, its
Result saved into the stage's folder.

A stage is a `Call`: the verb's name and its typed Options (built by `stages.py` from the plan's size). The
options are checked as the CLI checks every verb's (`options.cli.check_options`: values, output folder, where
outputs lie against inputs), the verb's library function runs on the loaded model and the corpora the study
has read once (`data.shared`), and `result.save(out)` writes the files the verb's command would. What the verb
would print (its tables, its progress) goes to the stage's log in OUT/study-logs/, leaving the terminal to the
study's one progress view. The logged command line is rendered from the Options' own flags
(`options.cli.command_line`), so it reproduces the stage by hand.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..artifacts import KV_CSV, KV_JSON, MODEL_DIR, outputs
from ..capacity import verbs as capacity
from ..compare import compare
from ..io import prepare_out_dir
from ..learned import verbs as learned
from ..learned.causal import verb as causal
from ..learned.circuits import verb as circuits
from ..models.adapter import HeadModel
from ..models.loading import load_model
from ..options import Options, Result
from ..options.cli import check_options, command_line
from ..redundancy import verbs as redundancy
from ..redundancy.curves import clear_partial
from ..report import REPORT_NAME, report
from ..report.build import figure_names
from ..table import to_jsonable

__all__ = ["Call", "Calls", "Several", "run_call", "run_calls", "verb_files"]


@dataclass(frozen=True)
class Call:
    """One verb with its options: what a stage runs, what its reuse key hashes and what its log shows."""

    verb: str
    options: Options

    def canonical(self) -> str:
        """The options as stable JSON (every field, sorted): the stage's identity in its reuse key."""
        return json.dumps({"verb": self.verb, "options": to_jsonable(self.options.with_only())}, sort_keys=True)

    def command(self) -> str:
        """The shell command that reproduces the stage."""
        return command_line(self.verb, self.options)


@dataclass(frozen=True)
class Calls:
    """Several runs of one verb in one stage (compare: one per compressed model), each into its own folder named
    by the run; `why`: what the stages before left nothing to run on, and why."""

    verb: str
    parts: tuple[tuple[str, Call], ...]
    why: str = ""

    def canonical(self) -> str:
        """Every run's canonical options, by name: the stage's identity in its reuse key."""
        return json.dumps([[name, call.canonical()] for name, call in self.parts])

    def command(self) -> str:
        """The shell commands that reproduce the stage, one after the other."""
        return " && ".join(call.command() for _, call in self.parts)


@dataclass
class Several(Result):
    """The Results of a stage's `Calls`, by run (each saved into its own folder by `run_calls`)."""

    by: dict[str, Result]

    def write(self, folder: Path) -> None:
        for name, result in self.by.items():
            (folder / name).mkdir()
            result.write(folder / name)

    def lines(self) -> list[str]:
        return [line for result in self.by.values() for line in result.lines()]

    def to_pandas(self) -> Any:
        import pandas as pd  # only for this table; pandas costs ~0.5 s to import

        return pd.concat([r.to_pandas().assign(run=name) for name, r in self.by.items()], ignore_index=True)


# The runs of the compare stage (study/comparing.py): one folder each, by the stage whose model it judges.
COMPARED = ("prune", "gqa", "mla")


def verb_files(verb: str) -> list[str]:
    """The files (and folders) a stage's verb may write into its out folder."""
    if verb == "compare":  # a folder per compressed model (study/comparing.py)
        return list(COMPARED)
    names = outputs(verb, optional=True)
    if verb == "prune":
        names = [*names, MODEL_DIR.name]
    if verb == "report":
        names = [*names, *figure_names()]
    return names


def _analyze(hm: HeadModel, o: Any) -> Result:
    return learned.analyze(hm, None, o, progress=True)


def _roles(hm: HeadModel, o: Any) -> Result:
    return learned.roles(hm, None, o, progress=True)


def _similar(hm: HeadModel, o: Any) -> Result:
    return learned.similar(hm, None, o, progress=True)


def _score(hm: HeadModel, o: Any) -> Result:
    return redundancy.score(hm, None, o, progress=True)


def _patch(hm: HeadModel, o: Any) -> Result:
    return causal.patch(hm, None, o)


def _circuit(hm: HeadModel, o: Any) -> Result:
    return circuits.circuit(hm, None, o)


def _prune(hm: HeadModel, o: Any) -> Result:
    # the folder keeps an interrupted curve's finished points (the CLI's --out), cleared once the curve is saved
    return redundancy.prune(hm, redundancy.read_prune_data(o), o, checkpoint=Path(o.out), progress=True)


def _kv(hm: HeadModel, o: Any) -> Result:
    return capacity.kv(None, o)  # a config's arithmetic: the loaded weights are not used


def _gqa(hm: HeadModel, o: Any) -> Result:
    return capacity.gqa(hm, None, o, progress=True)


def _mla(hm: HeadModel, o: Any) -> Result:
    return capacity.mla(hm, None, o, progress=True)


def _kvcache(hm: HeadModel, o: Any) -> Result:
    return capacity.kvcache(hm, None, o, progress=True)


def _compare(hm: HeadModel, o: Any) -> Result:
    # OTHER is a compressed model an earlier stage saved: loaded here, compared with the study's model (BASE)
    other = load_model(o.other, device=o.device, dtype=o.dtype)
    return compare(hm, other, o)


def _report(hm: HeadModel, o: Any) -> Result:
    return report(None if o.no_model else hm, None, o, progress=True)


# verb -> its library function on a loaded model, taking the data its options name (read once per study)
RUNS: dict[str, Callable[[HeadModel, Any], Result]] = {
    "analyze": _analyze, "roles": _roles, "similar": _similar, "score": _score, "patch": _patch,
    "circuit": _circuit, "prune": _prune, "kv": _kv, "gqa": _gqa, "mla": _mla, "kvcache": _kvcache, "report": _report,
    "compare": _compare,
}


def _will_write(verb: str, o: Any) -> list[str]:
    """What the verb's command refuses to overwrite in its folder (without force)."""
    if verb == "kv":
        return [KV_CSV.name, KV_JSON.name]
    if verb == "report":
        return [REPORT_NAME, *figure_names()]
    names = outputs(verb, optional=verb in ("roles", "patch"))
    return [*names, MODEL_DIR.name] if verb == "prune" and o.save_model else names


def run_calls(calls: Calls, hm: HeadModel, log: Path) -> Result:
    """Run each of `calls` in turn as `run_call` does (their logs one after the other in `log`)."""
    by: dict[str, Result] = {}
    for k, (name, call) in enumerate(calls.parts):
        by[name] = run_call(call, hm, log, append=k > 0)
    return Several(by)


def run_call(call: Call, hm: HeadModel, log: Path, append: bool = False) -> Result:
    """Run `call` on the loaded model `hm` and save its result into its options' folder; what the verb would print
    goes into `log` (after what it holds, `append`). Refusals raise as from the library (a HeadscopeError), an
    interrupt as KeyboardInterrupt."""
    # every stage's Options have an output folder (OutputOptions: out, force)
    o: Any = call.options
    check_options(o, call.verb)
    out = prepare_out_dir(o.out, o.force, _will_write(call.verb, o))  # refuse before any slow work
    if call.verb == "prune" and o.force:
        clear_partial(out)
    log.parent.mkdir(parents=True, exist_ok=True)
    with (open(log, "a" if append else "w", encoding="utf-8") as f, contextlib.redirect_stdout(f),
          contextlib.redirect_stderr(f), _logging_to(f)):
        print("$ " + call.command(), flush=True)
        result = RUNS[call.verb](hm, o)
        written = result.save(out, o.force)
        if call.verb == "prune":
            clear_partial(out)  # the curve is complete: its checkpoint is no longer needed
        print("\n".join(result.lines()))
        print(f"\nwrote {', '.join(map(str, written))}", flush=True)
    return result


@contextlib.contextmanager
def _logging_to(stream: TextIO) -> Iterator[None]:
    """The library's log lines (warnings) go to the stage's log too, then back to where they went."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)]
    old = [h.setStream(stream) for h in handlers]
    try:
        yield
    finally:
        for h, s in zip(handlers, old, strict=True):
            h.setStream(s)
