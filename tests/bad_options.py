"""The table of bad values: for every option of every verb, an input headscope must refuse (one line, exit 2,
nothing written) and a piece of the line it prints. tests/test_bad_input.py runs every row and fails, naming
the option, when a verb has an option without a row here.

To add an option: add one line to SHARED (the same row for every verb that has the option) or to the verb's
block of BY_VERB (`"--option": bad(ARGS..., says="...")`). An option whose Spec states a bound (at_least, above,
at_most, below, most, choices) needs no row: one is generated from the bound (`spec_rows`, below), so rows here
are for what no single bound states (combinations, files, parsing, checks in `Options.check`). A flag that no
single value can make bad still needs a row: the combination it refuses, or `FLAG` with the reason it cannot be
wrong.

Placeholders in ARGS: {bert} (a tiny BERT folder with a tokenizer), {llama} (a tiny LLaMA folder, 6 query /
3 KV heads, 128 positions), {text} (a small text file), {long} (a text file of 100-word lines).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    args: tuple[str, ...]  # appended after `headscope VERB` and the verb's REQUIRED arguments
    says: str  # a piece of the one error line
    required: bool = True  # False: ARGS replace the verb's REQUIRED arguments


def bad(*args: str, says: str, required: bool = True) -> Row:
    return Row(tuple(args), says, required)


FLAG = None  # a flag no value can make bad, on its own (its combinations are refused where they apply)

# What a verb needs before its options are read.
REQUIRED = {"gqa": ("{llama}", "--kv-heads", "1"), "mla": ("{llama}", "--kv-rank", "8"), "kvcache": ("{llama}",),
            "prune": ("--fraction", "0.1"), "patch": ("{llama}", "--task", "induction"),
            "circuit": ("{llama}", "--task", "induction"), "export": ("{llama}", "--to", "gguf", "--file", "o.gguf"),
            "compare": ("{llama}", "{llama}")}
L0 = ("--method", "l0")
L0_ROWS = {  # prune's and score's --method l0 options
    "--l0-steps": bad(*L0, "--l0-steps", "0", says="--l0-steps (steps of L0 gate training) must be at least 1"),
    "--l0-lr": bad(*L0, "--l0-lr", "0", says="--l0-lr (the L0 gates' learning rate) must be a positive number"),
    "--l0-temperature": bad(*L0, "--l0-temperature", "0", says="--l0-temperature (the hard-concrete temperature) "
                                                                "must be a positive"),
    "--l0-penalty": bad(*L0, "--l0-penalty", "-1", says="--l0-penalty (the L0 penalty) must be a positive number"),
    "--l0-target": bad(*L0, "--l0-target", "1.5", says="--l0-target (the L0 gates' target share"),
}
LEARNED = ("--choose", "learned", "--context", "64", "--sink", "4", "--window", "16")  # a context the tiny model has

SEED = "--seed must be a whole number from 0 to 4294967295"
SHARED: dict[str, Row | None] = {
    "model": bad("no-such-model", says="unknown model 'no-such-model'"),
    "--device": bad("--device", "bogus", says="--device 'bogus' is not a torch device"),
    "--dtype": bad("--dtype", "float8", says="dtype 'float8' is not supported"),
    "--device-map": bad("--device-map", "bogus", says="device map 'bogus' is not a placement strategy"),
    "--max-memory": bad("--max-memory", "0=1GiB", says="--max-memory places a model spread over devices"),
    "--allow-random-weights": FLAG,  # what it allows is refused without it (tests/test_faults_round4.py)
    "--offload-dir": bad("--offload-dir", "od", says="--offload-dir places a model spread over devices"),
    "--data": bad("--data", "missing.txt", says="data file 'missing.txt' does not exist"),
    "--heldout": bad("--heldout", "missing.txt", says="data file 'missing.txt' does not exist"),
    "--limit": bad("--limit", "0", says="--limit must be at least 1; got 0"),
    "--seed": bad("--seed", "-1", says=SEED),
    "--out": bad("--out", "", says="--out is empty"),
    "--force": FLAG,
    "--ci": bad("--ci", "1.5", says="--ci must be a confidence level in (0, 1)"),
    "--bootstrap": bad("--bootstrap", "5", says="--bootstrap must be an integer of at least 100"),
    "--until-stable": bad("--until-stable", "1.5", says="--until-stable must be a split-half stability in (0, 1)"),
    "--lr": bad("--lr", "-1", says="--lr must be a positive number"),
}

BY_VERB: dict[str, dict[str, Row | None]] = {
    "analyze": {},
    "patch": {
        "model": bad("no-such-model", "--task", "induction", says="unknown model 'no-such-model'", required=False),
        "--pairs": bad("{llama}", "--pairs", "missing.jsonl", says="pairs file 'missing.jsonl' does not exist",
                       required=False),
        "--method": bad("--method", "exakt", says="--method must be exact,attribution or attribution"),
        "--positions": bad("--positions", "each", "--method", "attribution", says="--positions each needs the exact"),
        "--paths": bad("--paths", "L1Hx", says="--paths must be a number of receivers, heads such as L5H1,L6H0, or "
                                              "logits; cannot read head 'L1Hx'"),
        "--senders": bad("--senders", "L0H1", says="--senders needs --paths: the receivers (or logits) the set's "
                                                    "heads send to"),
    },
    "circuit": {
        "model": bad("no-such-model", "--task", "induction", says="unknown model 'no-such-model'", required=False),
        "--pairs": bad("{llama}", "--pairs", "missing.jsonl", says="pairs file 'missing.jsonl' does not exist",
                       required=False),
        "--ig-steps": bad("--ig-steps", "0", says="--ig-steps must be at least 1; got 0"),
    },
    "compare": {
        "base": bad("no-such-model", "{llama}", says="BASE 'no-such-model' is not a built-in model", required=False),
        "other": bad("{llama}", "no-such-model", says="OTHER 'no-such-model' is not a built-in model",
                     required=False),
        "--tasks": bad("--tasks", "bogus", says="--tasks takes lm, ioi"),
        "--pairs": bad("--pairs", "missing.jsonl", says="pairs file 'missing.jsonl' does not exist"),
        "--items": bad("--items", "1", says="--items must be at least 2; got 1"),
        "--long": bad("--long", "10", says="--long must be at least 64; got 10"),
        "--haystacks": bad("--haystacks", "0", says="--haystacks must be at least 2; got 0"),
        "--base-from": bad("--base-from", "missing", says="--base-from 'missing' holds no compare.json"),
        "--cache": bad("--cache", "missing", says="--cache 'missing' is no DuoAttention pattern"),
        "--keep-full": bad("--keep-full", "2", says="--keep-full must be at most 1; got 2.0"),
        "--cache-reversed": bad("--cache-reversed", says="--cache-reversed turns a --cache pattern upside down"),
        "--cache-row": bad("--cache-row", "score@25%", says="--cache-row picks a row of a kvcache plan; give --cache"),
        "--tolerance": bad("--tolerance", "-1", says="--tolerance must be a positive number"),
    },
    "gqa": {
        "model": bad("no-such-model", "--kv-heads", "1", says="unknown model 'no-such-model'", required=False),
        "--kv-heads": bad("{llama}", "--kv-heads", "4", says="--kv-heads 4 is larger than the model's current 3",
                          required=False),
        "--grouping": bad("--grouping", "meen", says="unknown grouping 'meen' (did you mean 'mean'?)"),
        "--no-fallback": FLAG,
        "--check": FLAG,  # on or off, both are runs (--no-check skips the check); tests/test_compare_check.py
    },
    "kv": {
        "model": bad("no-such-model", says="no such model or config 'no-such-model'"),
        "--cache-dtype": bad("minilm", "--cache-dtype", "float7", says="unknown cache dtype 'float7'"),
        "--kv-heads": bad("minilm", "--kv-heads", "x", says="--kv-heads must be comma-separated integers"),
        "--classic": FLAG,
        "--out": bad("minilm", "--out", "", says="--out is empty"),
    },
    "kvcache": {
        "model": bad("no-such-model", says="unknown model 'no-such-model'", required=False),
        "--keep-full": bad("--keep-full", "200%", says="--keep-full '200%' must lie in (0, 1]"),
        "--threshold": bad("--threshold", "nan", says="--threshold must be a finite number"),
        "--by": bad("--by", "entropy", says="--by 'entropy' needs --scores FILE"),
        "--scores": bad("--scores", "missing.csv", says="--scores 'missing.csv' is not a file"),
        "--haystacks": bad("--haystacks", "0", says="--haystacks must be at least 1"),
        "--sink": bad("--sink", "-1", says="--sink must be 0 or more tokens"),
        "--window": bad("--window", "0", says="--window must be at least 1 token"),
        "--context": bad("--context", "1", says="--context must be at least 2"),
        "--needles": bad("--needles", "-1", says="--needles must be at least 0"),
        "--chunk": bad("--chunk", "0", says="--chunk must be at least 1"),
        "--train-data": bad("--uptrain-steps", "1", "--train-data", "missing.txt", says="'missing.txt' does not exist"),
        "--train-length": bad("--uptrain-steps", "1", "--train-length", "1", says="--train-length must be at least 2"),
        "--uptrain-lr": bad("--uptrain-lr", "0", says="--uptrain-lr must be a positive number"),
        "--no-random": FLAG,
        "--check": FLAG,  # on or off, both are runs (--no-check skips the check)
        "--learn-steps": bad(*LEARNED, "--learn-steps", "0", says="--learn-steps must be at least 1"),
        "--learn-lr": bad(*LEARNED, "--learn-lr", "0", says="--learn-lr must be a positive number"),
        "--learn-l1": bad(*LEARNED, "--learn-l1", "-1", says="--learn-l1 must be a positive number"),
        "--learn-prompts": bad(*LEARNED, "--learn-prompts", "0", says="--learn-prompts must be at least 1"),
        "--export-card": bad("--export-card", "{text}", says="is a file; the duo format is a directory"),
    },
    "export": {
        "model": bad("missing-dir", "--to", "gguf", "--out", "o.gguf", says="missing-dir", required=False),
        "--to": bad("--to", "onnx", says="--to 'onnx' is not a format headscope exports"),
        "--file": bad("--file", "{text}", says="already holds a file"),
        "--file-type": bad("--file-type", "f8", says="--file-type 'f8' is not one of"),
        "--force": FLAG,
    },
    "mla": {
        "model": bad("no-such-model", "--kv-rank", "8", says="unknown model 'no-such-model'", required=False),
        "--kv-rank": bad("{llama}", "--kv-rank", "0", says="--kv-rank must be at least 1; got 0", required=False),
        "--rope-dims": bad("--rope-dims", "3", says="--rope-dims must be an even number"),
        "--check": FLAG,  # on or off, both are runs (--no-check skips the check)
    },
    "models": {},
    "prune": {
        "--fraction": bad("--fraction", "1.5", says="fraction must be in [0, 1)"),
        "--target-drop": bad("--target-drop=-1%", says="target"),
        "--method": bad("--method", "gradeint", says="did you mean 'gradient'"),
        "--metric": bad("--metric", "bogus", says="unknown metric 'bogus'"),
        "--step": bad("--step", "0", says="step must be in"),
        "--latency": bad("--latency", says="--latency needs --unit attention, block, ffn or mix"),
        "--recover-lr": bad("--recover-lr", "nan", says="--recover-lr must be a positive number"),
        "--wordsim": bad("--unit", "ffn", "--wordsim", says="--wordsim is for head units"),
        "--wordsim-recovered": bad("--unit", "ffn", "--wordsim-recovered",
                                   says="--wordsim is for head units"),
        "--save-model": FLAG,
        "--check": FLAG,  # on or off, both are runs; without --save-model there is no model to check
        "--uniform": bad("--unit", "attention", "--uniform", says="--uniform is for head units"),
        "--protect": bad("--protect", "inductoin", says="--protect names 'inductoin', no capability (did you mean "
                                                        "'induction'?)"),
        **L0_ROWS,
    },
    "report": {
        "--no-model": bad("--no-model", "--out", "empty", says="nothing to report"),
        "--from": bad("--from", "missing", says="--from 'missing' does not exist"),
        "--sentences": bad("--sentences=-1", says="--sentences must be 0 or more"),
    },
    "roles": {
        "--treebank": bad("--treebank", "missing.conllu", says="treebank file 'missing.conllu' does not exist"),
        "--coref": bad("--coref", "missing.conllu", says="treebank file 'missing.conllu' does not exist"),
        "--long": bad("--long", "10", says="--long must be an integer of at least 64"),
        "--long-data": bad("--long", "128", "--long-windows", "1", "--long-data", "missing.txt",
                           says="'missing.txt' does not exist"),
        "--long-windows": bad("--long", "128", "--long-windows", "-1", says="--long-windows must be an integer"),
        "--stride": bad("--long", "128", "--stride", "0", says="--stride must be between 1 and --long"),
        "--haystacks": bad("--long", "128", "--haystacks", "-1", says="--haystacks must be an integer"),
        "--block": bad("--long", "128", "--block", "0", says="block size must be a positive number"),
        "--export-card": bad("--export-card", "card.json", says="--export-card needs --long N"),
    },
    "score": {
        "--method": bad("--method", "gradeint", says="did you mean 'gradient'"),
        "--metric": bad("--metric", "bogus", says="unknown metric 'bogus'"),
        "--pruned": bad("{bert}", "--limit", "2", "--pruned", "L99H0",
                        says="--pruned names head L99H0, which does not exist", required=False),
        **L0_ROWS,
    },
    "study": {
        "--budget": bad("--budget", "10x", says="--budget '10x' is not a duration"),
    },
    "similar": {
        "--js-max": bad("--js-max", "-1", says="near-duplicate thresholds need 0 < js_max <= ln 2"),
        "--cka-min": bad("--cka-min", "2", says="0 <= cka_min < 1; got js_max=0.05, cka_min=2.0"),
        "--cka-batch": bad("--cka-batch", "0", says="the CKA minibatch must be a whole number of tokens, at least 8"),
        "--cka-pool": bad("--cka-pool", "-1", says="--cka-pool must be 0 or more tokens"),
        "--cka-memory": bad("--cka-memory", "0", says="--cka-memory must be at least 1 MiB"),
    },
    "sweep": {
        "--heads": bad("--heads", "x", says="expected comma-separated integers"),
        "--kv-heads": bad("--kv-heads", "x", says="expected comma-separated integers"),
        "--d-head": bad("--d-head", "0", says="--d-head must be positive"),
        "--init-std": bad("--init-std", "-1", says="--init-std must be positive"),
        "--threads": bad("--threads", "0", says="--threads must be positive"),
        "--no-progress": FLAG,
    },
    "view": {
        "--from": bad("--from", "missing", says="--from 'missing' does not exist"),
        "--host": bad("--host", "", says="--host is empty"),
        "--open": FLAG,
    },
    "tasks": {
        "--tasks": bad("--tasks", "bogus", says="unknown task 'bogus'"),
        "--method": bad("--method", "gradeint", says="did you mean 'gradient'"),
    },
}

# Upper bounds (issue 31): for every option that sizes memory or work, too large a value refused before the work,
# in one line with the limit and why (tests/test_bad_input.py, test_every_size_has_an_upper_bound). HUGE would
# allocate until the OOM killer ended the run, or run for days.
HUGE = "100000000000"
TOO_LARGE: dict[str, dict[str, Row]] = {  # beside the rows generated from every Spec's at_most and most
    "analyze": {"--bootstrap": bad("--bootstrap", HUGE, says="--bootstrap must be at most 100,000")},
    "patch": {"--bootstrap": bad("--bootstrap", HUGE, says="--bootstrap must be at most 100,000"),
              "--paths": bad("--paths", HUGE, says="--paths takes 1 to 256 receivers (the heads of largest effect)")},
    "compare": {"--bootstrap": bad("--bootstrap", HUGE, says="--bootstrap must be at most 100,000"),
                "--items": bad("--items", HUGE, says="--items must be at most 4096"),
                "--long": bad("--long", HUGE, says="--long must be at most 1048576"),
                "--haystacks": bad("--haystacks", HUGE, says="--haystacks must be at most 100,000"),
                "--keep-full": bad("--keep-full", "2", says="--keep-full must be at most 1")},
    "circuit": {"--bootstrap": bad("--bootstrap", HUGE, says="--bootstrap must be at most 100,000"),
                "--ig-steps": bad("--ig-steps", HUGE, says="--ig-steps must be at most 64"),
                "--batch-size": bad("--batch-size", HUGE, says="--batch-size must be at most 4096")},
    "score": {"--bootstrap": bad("--bootstrap", "200000", says="--bootstrap must be at most 100,000"),
              "--l0-steps": bad(*L0, "--l0-steps", HUGE, says="--l0-steps must be at most 10,000,000")},
    "prune": {"--l0-steps": bad(*L0, "--l0-steps", HUGE, says="--l0-steps must be at most 10,000,000")},
    "roles": {"--haystacks": bad("--long", "128", "--haystacks", HUGE, says="--haystacks must be at most 100,000"),
              "--long-windows": bad("--long", "128", "--long-windows", HUGE, says="--long-windows must be at most "
                                                                                  "100,000"),
              "--block": bad("--long", "128", "--block", HUGE, says="--block must be at most 16777216"),
              "--stride": bad("--long", "128", "--stride", HUGE, says="--stride must be at most 16777216")},
    "kvcache": {"--learn-prompts": bad(*LEARNED, "--learn-prompts", HUGE, says="--learn-prompts must be at most"),
                "--learn-steps": bad(*LEARNED, "--learn-steps", HUGE, says="--learn-steps must be at most")},
    "similar": {"--cka-memory": bad("--cka", "exact", "--cka-memory", HUGE, says="of memory for the memory it may "
                                    "take (MiB), but this machine has"),
                "--cka-pool": bad("{bert}", "--limit", "2", "--cka-pool", HUGE, required=False,
                                  says="needs about"),
                "--cka-batch": bad("{bert}", "--limit", "2", "--cka-batch", HUGE, required=False,
                                   says="--cka-batch 100,000,000,000 needs about")},
    "view": {"--port": bad("--port", "70000", says="--port must be at most 65535; got 70000")},
    "sweep": {"--d-model": bad("--d-model", HUGE, says="of memory, but this machine has"),
              "--layers": bad("--layers", HUGE, says="of memory, but this machine has"),
              "--batch-size": bad("--batch-size", HUGE, says="of memory, but this machine has")},
}


# --- rows generated from the option specs (as scikit-learn's `_param_validation` generates invalid values) --------
# Every bound an option's Spec states (at_least, above, at_most, below, most, choices) gives one bad value just past
# it; tests/test_options.py checks each from Python (an OptionError naming the field, no flag) and from the CLI (the
# same problem under the flag), and tests/test_bad_input.py takes them as the rows of options without a hand row.
# Hand rows above stay only for what no single bound states (combinations, files, parsing).

# What the verbs need before their options are read, as Python keywords (REQUIRED's flags, same values).
GIVEN = {"gqa": {"model": "m", "kv_heads": 1}, "mla": {"model": "m", "kv_rank": 4}, "kvcache": {"model": "m"},
         "export": {"model": "d", "to": "gguf", "file": "f.gguf"}, "compare": {"base": "a", "other": "b"}}
GIVEN_ARGS = {"gqa": ("m", "--kv-heads", "1"), "mla": ("m", "--kv-rank", "4"), "kvcache": ("m",),
              "export": ("d", "--to", "gguf", "--file", "f.gguf"), "compare": ("a", "b")}


@dataclass(frozen=True)
class SpecRow:
    verb: str
    field: str
    bound: str  # the Spec keyword the value breaks
    value: object  # as Python passes it (the CLI gets str(value))


def _past(kind: type, bound: float, step: int) -> object:
    """The value `step` past `bound` (below it for -1, above for +1, the bound itself for 0), of the field's type."""
    v = bound + step
    return int(v) if kind is int else float(v)


def _most(kind: str) -> int:
    import os

    from headscope.data.limits import STEPS_MAX, WORK

    if kind == "steps":
        return STEPS_MAX
    if kind == "threads":
        return os.cpu_count() or 1
    if kind == "memory_mib":
        return 2**40  # MiB: more than any machine has
    return int(WORK[kind][0])


def spec_rows(classes: dict[str, type]) -> list[SpecRow]:
    """One bad value per bound of every command-line field of every verb's Options class (`classes`: verb -> class)."""
    import dataclasses
    import typing

    from headscope.options import spec_of

    rows = []
    for verb, cls in sorted(classes.items()):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            spec = spec_of(f)
            if spec is None or spec.positional:
                continue
            args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
            kind = args[0] if args[0] in (int, float, str) else None
            if kind is None:
                continue
            bounds = []
            if spec.choices is not None:
                bounds.append(("choices", "no-such-choice" if kind is str else _past(kind, max(spec.choices), 1)))
            if kind is not str:
                if spec.at_least is not None:
                    bounds.append(("at_least", _past(kind, spec.at_least, -1)))
                if spec.above is not None:
                    bounds.append(("above", _past(kind, spec.above, 0)))
                if spec.at_most is not None:
                    bounds.append(("at_most", _past(kind, spec.at_most, 1)))
                if spec.below is not None:
                    bounds.append(("below", _past(kind, spec.below, 0)))
                if spec.most is not None:
                    bounds.append(("most", _past(kind, _most(spec.most), 1)))
            rows += [SpecRow(verb, f.name, bound, (value,) if spec.append else value) for bound, value in bounds]
    return rows
