"""Issue 40 (faults and hostile input, round four): incomplete checkpoints, pairs files, repeated receivers, a
single-method report, output names that collide with a verb's own files, a truncated tokenizer.json, the CLI's
own parse errors and the Python API's argument types. Each case: one line, exit 2 (or the project's error from
Python), before any heavy work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_artifacts import tiny_bert_dir, tiny_llama_dir
from test_bad_input import refused
from test_faults import _run  # main() run inside a folder, as the round-three tests do
from users import as_user

from headscope.cli import main
from headscope.errors import HeadscopeError

SMALL = ["--limit", "3", "--max-length", "16"]


# --- 1. a checkpoint whose weights do not fill its config ---------------------------------------------------------
@pytest.fixture(scope="module")
def six_layers(tmp_path_factory) -> dict[str, Path]:
    """A tiny LLaMA and a tiny BERT of 6 layers each, saved whole, with a word-level tokenizer and a text."""
    base = tmp_path_factory.mktemp("six")
    llama, text = tiny_llama_dir(base, num_hidden_layers=6)
    bert_base = base / "b"
    bert_base.mkdir()
    from headscope.models.tiny import tiny_model

    bert = tiny_bert_dir(bert_base)
    tiny_model("bert", init_std=0.2, num_hidden_layers=6).model.save_pretrained(bert)  # same tokenizer, 6 layers
    return {"llama": llama, "bert": bert, "text": text}


def _layer_of(key: str) -> int | None:
    """The layer a weight name belongs to (its first number), None for embeddings and heads."""
    return next((int(p) for p in key.split(".") if p.isdigit()), None)


def _edit_weights(src: Path, dst: Path, drop_layers=(), add: dict[str, torch.Tensor] | None = None) -> Path:
    """A copy of checkpoint `src` whose safetensors lose layers `drop_layers` and gain the tensors `add`."""
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    state = {k: v for k, v in state.items() if _layer_of(k) not in drop_layers}
    state.update(add or {})
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("family,names", [("llama", "model.layers.2."), ("bert", "encoder.layer.2.")])
def test_a_checkpoint_missing_layers_is_refused(tmp_path, capsys, six_layers, family, names):
    cut = _edit_weights(six_layers[family], tmp_path / "cut", drop_layers=(2, 3, 4, 5))
    n_missing = 9 * 4 if family == "llama" else 16 * 4  # the tensors of layers 2-5, counted in transformers' module
    line = refused(tmp_path, capsys, ["analyze", str(cut), "--data", str(six_layers["text"]), *SMALL, "--out", "o"],
                   f"its weights lack {n_missing} tensors the config needs ({names}")
    assert "layers 2-5" in line and "--allow-random-weights" in line, line
    # asked for on purpose: the gaps are random, and the run goes on
    assert _run(tmp_path, ["analyze", str(cut), "--data", str(six_layers["text"]), *SMALL, "--out", "o",
                           "--allow-random-weights"]) == 0
    assert (tmp_path / "o" / "heads.csv").exists()


@pytest.mark.parametrize("family,extra", [("llama", "model.layers.6.self_attn.q_proj.weight"),
                                          ("bert", "encoder.layer.6.attention.self.query.weight"),
                                          ("llama", "model.extra.weight")])
def test_a_checkpoint_with_tensors_its_config_has_no_place_for_is_refused(tmp_path, capsys, six_layers, family,
                                                                          extra):
    more = _edit_weights(six_layers[family], tmp_path / "more", add={extra: torch.zeros(4, 4)})
    refused(tmp_path, capsys, ["analyze", str(more), "--data", str(six_layers["text"]), *SMALL, "--out", "o"],
            f"it holds 1 tensor the config has no place for ({extra}")


def test_whole_checkpoints_and_ignored_buffers_load(tmp_path, six_layers):
    """A whole checkpoint loads; so does one carrying what transformers ignores by design (a rotary inv_freq buffer,
    another task's head), and the Python API says the same as the CLI."""
    from headscope.models.files import IncompleteCheckpoint
    from headscope.models.loading import load_model

    assert load_model(str(six_layers["llama"])).n_layers == 6
    extras = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}
    assert load_model(str(_edit_weights(six_layers["llama"], tmp_path / "rot", add=extras))).n_layers == 6
    head = {"cls.seq_relationship.weight": torch.zeros(2, 32)}  # BERT's next-sentence head: not the encoder's
    assert load_model(str(_edit_weights(six_layers["bert"], tmp_path / "nsp", add=head))).n_layers == 6
    cut = _edit_weights(six_layers["bert"], tmp_path / "cut", drop_layers=(5,))
    says = r"lack 16 tensors .*encoder\.layer\.5\..*; layer 5\).*allow_random_weights"
    with pytest.raises(IncompleteCheckpoint, match=says):
        load_model(str(cut))
    assert load_model(str(cut), allow_random_weights=True).n_layers == 6



def test_only_unexpected_tensors_of_the_body_count():
    """Another task's head beside the body (BERT's next-sentence head, a classifier's score) is what transformers
    drops by design; a tensor under the base model or one of its modules is a checkpoint of another shape."""
    import transformers

    from headscope.models.files import body_keys
    from headscope.models.tiny import tiny_model

    bert = tiny_model("bert").model  # a bare BertModel: its modules are embeddings, encoder, pooler
    assert body_keys(bert, ["cls.seq_relationship.weight", "encoder.layer.6.output.dense.weight",
                            "bert.encoder.layer.7.output.dense.weight"]) == [
        "bert.encoder.layer.7.output.dense.weight", "encoder.layer.6.output.dense.weight"]
    mlm = transformers.BertForMaskedLM(bert.config)  # the body under `bert.`, its own head under `cls.`
    assert body_keys(mlm, ["cls.seq_relationship.bias", "bert.encoder.layer.6.output.dense.weight"]) == [
        "bert.encoder.layer.6.output.dense.weight"]
    llama = tiny_model("llama").model
    assert body_keys(llama, ["score.weight", "model.extra.weight"]) == ["model.extra.weight"]

# --- 2. pairs files -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A tiny LLaMA (64 positions) with a word-level tokenizer over WORDS and <unk>."""
    return tiny_llama_dir(tmp_path_factory.mktemp("pairs"))[0]


GOOD = {"clean": "the of and to a in is", "corrupt": "the of and to he in is", "answer": "a", "wrong": "he"}


def _line(**changes: str) -> str:
    return json.dumps({**GOOD, **changes}) + "\n"


def _patch(llama: Path, pairs: str) -> list[str]:
    return ["patch", str(llama), "--pairs", pairs, "--out", "o", "--bootstrap", "200"]


@pytest.mark.parametrize("content,says", [
    (_line().encode() + b'{"clean": "caf\xe9"}\n', "pairs.jsonl:2: not valid UTF-8 (byte 0xe9"),
    (_line().encode() + json.dumps({**GOOD, "clean": "the " * 2_600_000}).encode() + b"\n",
     "pairs.jsonl, line 2: 10,400,0"),
])
def test_a_pairs_file_that_is_no_text_is_refused_by_line_before_the_model(tmp_path, capsys, content, says):
    (tmp_path / "pairs.jsonl").write_bytes(content)
    # the model named does not exist: the file is refused before any model would load
    line = refused(tmp_path, capsys, _patch(tmp_path / "no-model", "pairs.jsonl"), says)
    assert str(tmp_path / "no-model") not in line


def test_a_folder_or_a_fifo_as_the_pairs_file_is_named_as_such(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    refused(tmp_path, capsys, _patch(tmp_path / "no-model", "d"), "pairs path 'd' is a directory")
    os.mkfifo(tmp_path / "fifo")
    refused(tmp_path, capsys, _patch(tmp_path / "no-model", "fifo"), "pairs path 'fifo' is not a regular file")


@pytest.mark.parametrize("pair,says", [
    ({"clean": " ".join(["the"] * 80), "corrupt": " ".join(["the"] * 79 + ["a"])},
     "line 1: the clean text is 80 tokens, more than the model's 64 positions"),
    ({"answer": "zebra"}, "line 1: answer 'zebra' reads as the tokenizer's unknown token '<unk>'"),
    ({"wrong": "zebra"}, "line 1: wrong 'zebra' reads as the tokenizer's unknown token '<unk>'"),
    ({"answer": "zebra", "wrong": "okapi"}, "line 1: answer 'zebra' and wrong 'okapi' are the same token"),
])
def test_a_pair_the_model_cannot_measure_is_refused_by_line(tmp_path, capsys, llama, pair, says):
    (tmp_path / "pairs.jsonl").write_text(_line(**pair))
    refused(tmp_path, capsys, _patch(llama, "pairs.jsonl"), f"pairs.jsonl, {says}")


def test_unknown_answers_are_refused_on_every_path(llama):
    """Built-in sets leave such a pair out (counted); a PairBatch or a list of pairs from Python is refused."""
    import headscope
    from headscope.learned.causal.pairs import Pair, tokenize_pairs
    from headscope.models.loading import load_model

    hm = load_model(str(llama))
    unk = Pair(GOOD["clean"], GOOD["corrupt"], "zebra", "he")
    kept = tokenize_pairs(hm.tokenizer, [Pair(**GOOD), unk], True, "task x", strict=False)
    assert len(kept) == 1 and kept.skipped == 1
    with pytest.raises(HeadscopeError, match="pairs given in Python, line 2: answer 'zebra' reads as"):
        headscope.patch(hm, [GOOD, unk], bootstrap=200)
    batch = tokenize_pairs(hm.tokenizer, [Pair(**GOOD)], True, "hand-made")
    batch.answer[0] = hm.tokenizer.unk_token_id
    with pytest.raises(HeadscopeError, match="hand-made, pair 1: answer 0 or wrong .* unknown token"):
        headscope.patch(hm, batch, bootstrap=200)
    batch.answer[0] = batch.wrong[0]
    with pytest.raises(HeadscopeError, match="hand-made, pair 1: answer and wrong are the same token"):
        headscope.patch(hm, batch, bootstrap=200)


def test_a_list_of_pairs_runs_and_is_never_silently_dropped_beside_a_task(llama):
    import headscope
    from headscope.models.loading import load_model
    from headscope.options import OptionError

    hm = load_model(str(llama))
    res = headscope.patch(hm, [GOOD, {**GOOD, "answer": "in", "wrong": "is"}], bootstrap=200, methods=("attribution",))
    assert len(res.pairs) == 2 and res.record.pairs["source"] == "pairs given in Python"
    with pytest.raises(OptionError, match="pairs and task 'induction' are both given") as e:
        headscope.patch(hm, [GOOD], task="induction")
    assert e.value.name == "pairs"
    for bad, says in ((5, "pairs must be a .jsonl path, a PairBatch or a list of pairs"),
                      ([{**GOOD, "extra": "x"}], r"pairs \[0\] must be a dict of exactly"),
                      ([], "pairs is an empty list")):
        with pytest.raises(OptionError, match=says):
            headscope.patch(hm, bad)


def test_an_unreadable_pairs_file_is_refused_for_a_user_without_roots_override(tmp_path, llama):
    pairs = tmp_path / "secret.jsonl"
    pairs.write_text(_line())
    pairs.chmod(0)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), "OMP_NUM_THREADS": "1"}
    try:
        r = subprocess.run([*as_user(), sys.executable, "-m", "headscope", *_patch(llama, str(pairs))[:-4],
                            "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=300)
    finally:
        pairs.chmod(0o644)
    lines = [l for l in r.stderr.splitlines() if l.startswith("headscope ")]
    assert r.returncode == 2, r.stderr
    assert lines == [f"headscope patch: error: {str(pairs)!r} cannot be read (Permission denied); give a file this "
                     f"user can read (check its permissions, e.g. chmod u+r, or its owner)"], r.stderr
    assert not (tmp_path / "o").exists()


# --- 3. a head named twice in --paths or --senders ---------------------------------------------------------------
@pytest.mark.parametrize("extra,says", [
    (["--paths", "L1H0,L1H2,L1H0"], "--paths names L1H0 twice; name each head once"),
    (["--paths", "L1H0", "--senders", "L0H1,l0h1"], "--senders names L0H1 twice"),
])
def test_a_head_named_twice_is_refused(tmp_path, capsys, llama, extra, says):
    refused(tmp_path, capsys, ["patch", str(llama), "--task", "induction", *extra, "--out", "o"], says)


def test_paths_rows_are_one_per_path(llama):
    """Each (sender, receiver, via) once in paths.csv: what a repeated receiver used to double."""
    import headscope
    from headscope.models.loading import load_model

    hm = load_model(str(llama))
    res = headscope.patch(hm, task="induction", limit=4, paths="L1H0,L1H2", bootstrap=200, methods=("attribution",))
    keys = [(r["sender"], r["receiver"], r["via"]) for r in res.paths]
    assert len(keys) == len(set(keys)) and {k[1] for k in keys} >= {"L1H0", "L1H2"}


# --- 4. a report of an importance.csv with one method ------------------------------------------------------------
def test_report_draws_a_single_method_importance(tmp_path):
    bert = tiny_bert_dir(tmp_path)
    assert _run(tmp_path, ["analyze", str(bert), *SMALL, "--out", "s"]) == 0
    assert _run(tmp_path, ["score", str(bert), "--method", "output_norm", *SMALL, "--bootstrap", "200",
                           "--out", "s"]) == 0
    assert _run(tmp_path, ["report", "--no-model", "--from", "s", "--out", "r"]) == 0
    png = tmp_path / "r" / "report-importance.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from headscope import plots

    one = plots.importance_grids({"importance_taylor": np.arange(8.0).reshape(2, 4)})
    assert one[:8] == b"\x89PNG\r\n\x1a\n"


# --- 5. an output named like a verb's own file --------------------------------------------------------------------
@pytest.mark.parametrize("argv,flag,name,verb", [
    (["roles", "--long", "64", "--export-card", "res/heads.csv", "--out", "o"], "--export-card", "heads.csv",
     "analyze"),
    (["roles", "--long", "64", "--export-card", "o/importance.csv", "--out", "o"], "--export-card",
     "importance.csv", "score"),
    (["kvcache", "smollm2", "--export-card", "kvcache.json", "--out", "o"], "--export-card", "kvcache.json",
     "kvcache"),
    (["export", "d", "--to", "gguf", "--file", "roles.csv"], "--file", "roles.csv", "roles"),
])
def test_an_output_named_like_a_verbs_own_file_is_refused(tmp_path, capsys, argv, flag, name, verb):
    (tmp_path / "res").mkdir()
    (tmp_path / "d").mkdir()
    refused(tmp_path, capsys, argv, f"is named like headscope {verb}'s own {name}: a folder holding it would read "
                                    f"as {verb}'s results")


# --- 6. a truncated tokenizer.json --------------------------------------------------------------------------------
def test_a_truncated_tokenizer_json_is_named(tmp_path, capsys):
    """Round two's answer, held by a test now: transformers 5 json.loads tokenizer.json itself and lets the
    JSONDecodeError through, after the weights load; headscope reads the tokenizer files first."""
    src, text = tiny_llama_dir(tmp_path)
    tok = src / "tokenizer.json"
    tok.write_bytes(tok.read_bytes()[:300])
    refused(tmp_path, capsys, ["analyze", str(src), "--data", str(text), *SMALL, "--out", "o"],
            f"{str(tok)!r} cannot be read (not JSON: ")
    from headscope.models.loading import load_model

    with pytest.raises(HeadscopeError, match="is it truncated"):
        load_model(str(src))


# --- 7. the command line's own refusals ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv,line", [
    (["analyze", "--ci", "x"], "headscope analyze: error: argument --ci: invalid float value: 'x'"),
    (["analyze", "--f"], "headscope analyze: error: unrecognized arguments: --f (did you mean '--force'?)"),
    (["analyze", "--limt", "5", "x"], "unrecognized arguments: --limt (did you mean '--limit'?)"),
    (["analyze", "--lim", "5"], "unrecognized arguments: --lim"),  # no abbreviations
    (["anlyze"], "(did you mean 'analyze'?)"),
    (["patch", "m", "--task", "ioj"], "argument --task: invalid choice: 'ioj' (choose from 'ioi', 'greater-than', "
                                      "'induction', 'masked') (did you mean 'ioi'?)"),
])
def test_parse_errors_are_one_line(capsys, argv, line):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals exit from inside parse_known_args
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "usage:" not in err and line in err, err


def test_retired_spellings_still_read():
    from headscope.cli import build_parser

    args = build_parser().parse_args(["gqa", "m", "--kv-heads", "1", "--data-limit", "5"])
    assert args.limit == 5


# --- 8. the Python API checks its arguments' types ---------------------------------------------------------------
def _typed_fields() -> list[tuple[str, str, object]]:
    """(verb, field, a value of the wrong type) for every command-line field of every verb's options."""
    import argparse
    import dataclasses
    import typing

    from headscope.cli import build_parser
    from headscope.options import spec_of
    from headscope.options.spec import _hints

    wrong = {int: "5", float: "0.5", str: 5, bool: "yes"}
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    cases = []
    for verb, parser in sorted(sub.choices.items()):
        cls = parser.get_default("options_class")
        if cls is None:
            continue
        for f in dataclasses.fields(cls):
            if spec_of(f) is None or spec_of(f).positional:
                continue
            kind = _hints(cls)[f.name]
            base = [a for a in typing.get_args(kind) if a is not type(None)] or [kind]
            if typing.get_origin(base[0]) is tuple:
                cases.append((verb, f.name, "a,b"))  # a tuple field given text
            elif base[0] in wrong:
                cases.append((verb, f.name, wrong[base[0]]))
    return cases


REQUIRED_FIELDS = {"gqa": {"model": "m", "kv_heads": 1}, "mla": {"model": "m", "kv_rank": 4},
                   "kvcache": {"model": "m"}, "export": {"model": "d", "to": "gguf", "file": "f.gguf"},
                   "patch": {"task": "induction"}, "prune": {"fraction": 0.1}, "kv": {"classic": True}}


@pytest.mark.parametrize("verb,field,bad", _typed_fields())
def test_a_wrongly_typed_option_is_refused_naming_it(verb, field, bad):
    from headscope.cli import build_parser
    from headscope.options import OptionError

    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    cls = sub.choices[verb].get_default("options_class")
    with pytest.raises(OptionError) as e:
        cls(**{**REQUIRED_FIELDS.get(verb, {}), field: bad}).validate()
    assert e.value.name == field and repr(bad) in e.value.problem, e.value


def test_every_verb_function_checks_its_arguments():
    import headscope
    from headscope.models.tiny import tiny_model
    from headscope.options import OptionError

    hm = tiny_model("llama")
    cases = [
        (lambda: headscope.score(hm, 123), "data", "must be a corpus name or file path"),
        (lambda: headscope.analyze(hm, ["a", None]), "data", r"\[1\] is NoneType None, not text"),
        (lambda: headscope.roles(hm, [[1, 2], [3, "x"]]), "data", r"\[1\] holds 'x', not a token id"),
        (lambda: headscope.similar(hm, {"text": "a"}), "data", "must be"),
        (lambda: headscope.prune(hm, 1.5, fraction=0.1), "data", "must be"),
        (lambda: headscope.tasks(hm, 7), "data", "names the tasks"),
        (lambda: headscope.score(hm, ["a b c"], limit="5"), "limit", "must be a whole number; got str '5'"),
        (lambda: headscope.analyze(hm, ["a b c"], batch_size=True), "batch_size", "got bool True"),
        (lambda: headscope.patch(hm, task="induction", paths=5), "paths", "must be text; got int 5"),
        (lambda: headscope.patch(hm, task="induction", paths="L1H0", senders=["L0H0"]), "senders",
         "must be text; got list"),
        (lambda: headscope.gqa(hm, 5, kv_heads=1), "data", "must be"),
        (lambda: headscope.gqa(hm, ["a b"], heldout=3, kv_heads=1), "heldout", "must be"),
        (lambda: headscope.kvcache(hm, None, train_data=2.5), "train_data", "must be"),
    ]
    for call, name, says in cases:
        with pytest.raises(OptionError, match=says) as e:
            call()
        assert e.value.name == name, (name, e.value)
