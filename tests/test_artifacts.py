"""Every verb's real output against its declaration in headscope.artifacts: file names, CSV columns (in
order), JSON and .npz keys. The verbs run on small inputs; a writer that adds, drops, renames or reorders
a column without updating its declaration (which the report reads by) fails here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from headscope import artifacts as A
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.models.tiny import tiny_model

TREEBANK = """# sent_id = 1
# text = The cat saw a dog.
1	The	the	DET	_	_	2	det	_	_
2	cat	cat	NOUN	_	_	3	nsubj	_	_
3	saw	see	VERB	_	_	0	root	_	_
4	a	a	DET	_	_	5	det	_	_
5	dog	dog	NOUN	_	_	3	obj	_	SpaceAfter=No
6	.	.	PUNCT	_	_	3	punct	_	_

# sent_id = 2
# text = A small bird sang.
1	A	a	DET	_	_	3	det	_	_
2	small	small	ADJ	_	_	3	amod	_	_
3	bird	bird	NOUN	_	_	4	nsubj	_	_
4	sang	sing	VERB	_	_	0	root	_	SpaceAfter=No
5	.	.	PUNCT	_	_	4	punct	_	_

"""
COREF = """# newdoc id = d1
# sent_id = 1
# text = Mary saw John.
1	Mary	Mary	PROPN	_	_	2	nsubj	_	Entity=(e1-person)
2	saw	see	VERB	_	_	0	root	_	_
3	John	John	PROPN	_	_	2	obj	_	Entity=(e2-person)|SpaceAfter=No
4	.	.	PUNCT	_	_	2	punct	_	_

# sent_id = 2
# text = She smiled at him.
1	She	she	PRON	_	_	2	nsubj	_	Entity=(e1-person)
2	smiled	smile	VERB	_	_	0	root	_	_
3	at	at	ADP	_	_	4	case	_	_
4	him	he	PRON	_	_	2	obl	_	Entity=(e2-person)|SpaceAfter=No
5	.	.	PUNCT	_	_	2	punct	_	_

"""
WORDS = "the of and to a in is was for on that with as by at it from he his".split()


def tiny_llama_dir(base: Path, **overrides) -> tuple[Path, Path]:
    """A tiny LLaMA checkpoint with a word-level tokenizer, and a text file over its words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<pad>", *WORDS])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    src = base / "llama"
    tiny_model("llama", **overrides).model.save_pretrained(src)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>").save_pretrained(src)
    text = base / "t.txt"
    rng = np.random.default_rng(0)
    text.write_text("\n".join(" ".join(rng.choice(WORDS, 12)) for _ in range(12)) + "\n")
    return src, text


def tiny_bert_dir(base: Path) -> Path:
    """A tiny BERT checkpoint with a word-level WordPiece vocabulary (the words of TREEBANK and COREF)."""
    from transformers import BertTokenizerFast

    words = ("the of and to a in is was for on that with as by at it from he his she her they them we you i "
             "cat dog saw bird sang small mary john smiled him . , ' s").split()
    path = base / "bert"
    path.mkdir()
    tiny_model("bert", init_std=0.2).model.save_pretrained(path)
    # The vocabulary as a dict: transformers 5's BertTokenizerFast(vocab_file=...) maps every word to [UNK].
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    BertTokenizerFast(vocab=vocab).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Each verb run once on small inputs (a tiny BERT and LLaMA, MiniLM for roles, a tiny sweep): name ->
    output directory."""
    base = tmp_path_factory.mktemp("verbs")
    (base / "tb.conllu").write_text(TREEBANK)
    (base / "coref.conllu").write_text(COREF)
    llama, text = tiny_llama_dir(base, num_key_value_heads=6)
    bert = str(tiny_bert_dir(base))
    small = ["--limit", "3", "--max-length", "16"]
    commands = {
        "analyze": ["analyze", bert, *small],
        # roles needs a real vocabulary (its induction test draws ordinary tokens): MiniLM.
        "roles": [
            "roles",
            "minilm",
            *small,
            "--treebank",
            str(base / "tb.conllu"),
            "--coref",
            str(base / "coref.conllu"),
        ],
        "similar": ["similar", bert, *small],
        "score": ["score", bert, "--method", "all", *small],
        "prune": [
            "prune",
            bert,
            "--fraction",
            "25%",
            "--step",
            "0.125",
            "--recover-steps",
            "1",
            "--wordsim",
            "--wordsim-recovered",
            "--save-model",
            *small,
        ],
        "prune_lm": ["prune", str(llama), "--fraction", "20%", "--step", "0.2", "--data", str(text), *small],
        "kv": ["kv", bert, "--classic"],  # the report below is for this BERT: kv.csv must be of the same model
        "sweep": [
            "sweep",
            "--d-model",
            "8",
            "--heads",
            "1,2",
            "--steps",
            "2",
            "--max-length",
            "16",
            "--batch-size",
            "2",
            "--eval-tokens",
            "32",
            "--no-progress",
        ],
        "gqa": ["gqa", str(llama), "--kv-heads", "3", "--steps", "1", "--data", str(text), "--heldout", str(text)],
        "gqa_similarity": [
            "gqa",
            str(llama),
            "--kv-heads",
            "2",
            "--grouping",
            "similarity",
            "--data",
            str(text),
            "--heldout",
            str(text),
        ],
        "gqa_search": [
            "gqa",
            str(llama),
            "--kv-heads",
            "2",
            "--grouping",
            "search",
            "--search-candidates",
            "1",
            "--data",
            str(text),
            "--heldout",
            str(text),
        ],
    }
    out = {}
    for name, argv in commands.items():
        out[name] = base / name
        assert main([*argv, "--out", str(out[name])]) == 0, name
    out["report"] = base / "report"
    from_dirs = [a for n in ("analyze", "similar", "score", "prune", "kv", "sweep") for a in ("--from", str(out[n]))]
    assert main(["report", bert, "--sentences", "1", "--limit", "3", *from_dirs, "--out", str(out["report"])]) == 0
    return out


def header(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[0].split(",")


def expected_columns(art: A.Artifact, conditions: set[str]) -> list[str]:
    """The declared columns (families left out) a writer writes when exactly `conditions` hold."""
    return [f.name for f in art.fields if not f.is_family and (not f.when or f.when in conditions)]


def check_csv(path: Path, art: A.Artifact, conditions: set[str], families: dict[str, list[str]] | None = None) -> None:
    """The file's header is exactly the declared columns for `conditions`, plus the given family members."""
    got = header(path)
    assert art.check(got) == [], (path.name, art.check(got))
    fams = {f.name for f in art.fields if f.is_family}
    # an interval's bounds (<column>_lo, <column>_hi) belong to their column; they follow it, both or neither
    bounds = [c for c in got if art.bounds and A.bound_of(c) is not None and A.bound_of(c) in got]
    for c in bounds:
        stem = A.bound_of(c)
        assert f"{stem}_lo" in got and f"{stem}_hi" in got and got.index(stem) < got.index(c), (path.name, c)
    got = [c for c in got if c not in bounds]
    plain = [c for c in got if not any(art.field_for(c) is f and f.is_family for f in art.fields)]
    assert plain == expected_columns(art, conditions), (path.name, plain)
    for family, members in (families or {}).items():
        assert family in fams and art.members(family, got) == members, (family, art.members(family, got))


def check_keys(path: Path, art: A.Artifact, present: set[str] = frozenset()) -> dict:
    """The file's keys are all declared, and the required ones plus `present` (optional ones this run
    writes) are there."""
    data = json.loads(path.read_text(encoding="utf-8"))
    assert art.check(list(data)) == [], (path.name, art.check(list(data)))
    assert {f.name for f in art.fields if f.name in present} == set(present), sorted(present)
    want = set(art.required()) | set(present)
    assert want <= set(data), (path.name, sorted(want - set(data)))
    return data


def test_each_verb_writes_exactly_its_declared_files(runs):
    expect = {"analyze": A.outputs("analyze"), "roles": A.outputs("roles", optional=True),
              "similar": A.outputs("similar"), "score": A.outputs("score"),
              "prune": A.outputs("prune", optional=True), "prune_lm": A.outputs("prune"),
              "kv": A.outputs("kv", optional=True), "sweep": A.outputs("sweep"),
              "gqa": A.outputs("gqa", optional=True)}  # gqa and prune --save-model end with the check
    for run, names in expect.items():
        assert sorted(p.name for p in runs[run].iterdir()) == sorted(names), run
    # The report writes its page and its figures (the names are what render_report refuses to overwrite).
    from headscope.report.build import figure_names

    written = {p.name for p in runs["report"].iterdir()}
    assert A.REPORT_HTML.name in written and written - {A.REPORT_HTML.name} <= set(figure_names())


def test_command_outputs_are_the_declared_names():
    from headscope.commands import analyze, gqa, prune, roles, score, similar, sweep

    assert analyze.OUTPUTS == ["heads.csv", "heads.json"]
    assert roles.OUTPUTS == ["roles.csv", "roles.json", "syntax.csv"]
    assert similar.OUTPUTS == ["similar_pairs.csv", "similarity.npz", "clusters.json"]
    assert score.OUTPUTS == ["importance.csv", "importance.json", "rank_correlation.csv"]
    assert prune.OUTPUTS == ["prune_curve.csv", "prune_curve.png", "redundancy.csv", "prune.json"]
    assert sweep.OUTPUTS == ["sweep.csv", "runs", "sweep_quality.png", "sweep_speed.png"]
    assert gqa.OUTPUTS == ["model", "gqa.json"]


def test_heads_csv_from_analyze_and_roles(runs):
    from headscope.learned.syntax import RELATIONS

    check_csv(runs["analyze"] / "heads.csv", A.HEADS_CSV, set())
    assert all(f"{k}_lo" in header(runs["analyze"] / "heads.csv") for k in A.STATISTICS)
    check_csv(runs["roles"] / "roles.csv", A.ROLES_CSV, {"roles", "roles --treebank", "roles --coref"},
              {"offset_<offset>_mass": ["offset_m3_mass", "offset_m2_mass", "offset_p2_mass", "offset_p3_mass"]})
    syntax = A.ROLES_CSV.members("syntax_<relation>", header(runs["roles"] / "roles.csv"))
    assert syntax and set(syntax) <= {f"syntax_{r}" for r in RELATIONS}, syntax
    check_keys(runs["analyze"] / "heads.json", A.HEADS_JSON)


def test_roles_files(runs):
    data = check_keys(runs["roles"] / "roles.json", A.ROLES_JSON)
    assert data["syntax"] is not None and data["coreference"] is not None
    check_csv(runs["roles"] / "syntax.csv", A.SYNTAX_CSV, set())


def test_similar_files(runs):
    check_csv(runs["similar"] / "similar_pairs.csv", A.SIMILAR_PAIRS_CSV, set())
    check_keys(runs["similar"] / "clusters.json", A.CLUSTERS_JSON)
    with np.load(runs["similar"] / "similarity.npz") as z:
        assert A.SIMILARITY_NPZ.check(z.files) == [] and set(A.SIMILARITY_MATRICES) <= set(z.files), z.files


def test_score_files(runs):
    from headscope.redundancy.importance import parse_methods

    methods = parse_methods("all")
    check_csv(runs["score"] / "importance.csv", A.IMPORTANCE_CSV, set(),
              {"importance_<method>": [f"importance_{m}" for m in methods]})
    check_keys(runs["score"] / "importance.json", A.IMPORTANCE_JSON)
    got = header(runs["score"] / "rank_correlation.csv")
    assert A.RANK_CORRELATION_CSV.check(got) == [] and got == ["", *methods], got


def test_prune_files(runs):
    check_csv(runs["prune"] / "prune_curve.csv", A.PRUNE_CURVE_CSV, {"--wordsim", "--wordsim-recovered"})
    check_csv(runs["prune_lm"] / "prune_curve.csv", A.PRUNE_CURVE_CSV, {"lm_loss metric"})
    check_csv(runs["prune"] / "redundancy.csv", A.REDUNDANCY_CSV, {"--recover-steps"})
    check_csv(runs["prune_lm"] / "redundancy.csv", A.REDUNDANCY_CSV, set())
    check_keys(runs["prune"] / "prune.json", A.PRUNE_JSON, {"saved_model"})
    assert "saved_model" not in check_keys(runs["prune_lm"] / "prune.json", A.PRUNE_JSON)
    assert (runs["prune"] / "prune_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_kv_and_sweep_files(runs):
    check_csv(runs["kv"] / "kv.csv", A.KV_CSV, set())
    check_csv(runs["sweep"] / "sweep.csv", A.SWEEP_CSV, set())
    record = json.loads(next((runs["sweep"] / "runs").glob("*.json")).read_text())
    assert set(A.SWEEP_CSV.columns()) <= set(record["row"])


def test_gqa_files(runs):
    for run in ("gqa", "prune"):  # the check's files, as compare writes them
        check_csv(runs[run] / "compare.csv", A.COMPARE_CSV, set())
        check_keys(runs[run] / "compare.json", A.COMPARE_JSON)
    check_keys(runs["gqa"] / "gqa.json", A.GQA_JSON, {"uptrain"})
    check_keys(runs["gqa_similarity"] / "gqa.json", A.GQA_JSON,
               {"similarity_on", "pooling_error_adjacent", "pooling_error_similarity", "layers_regrouped"})
    check_keys(runs["gqa_search"] / "gqa.json", A.GQA_JSON,
               {"search_candidates", "search_seed", "search_start", "calibration_kl_adjacent",
                "calibration_kl_similarity", "calibration_kl_start", "calibration_kl_search", "search_trace",
                "layers_changed_by_search", "kl_evaluations", "calibration_batches", "search_seconds"})


def test_report_reads_every_verbs_real_files(runs):
    """The report finds the real files (not hand-made ones) and notes no problem with any of them."""
    import re

    html = (runs["report"] / "report.html").read_text(encoding="utf-8")
    d = json.loads(re.search(r'<script type="application/json" id="hs-data">(.*?)</script>', html, re.DOTALL)[1])
    assert d["problems"] == [], d["problems"]
    for key in ("importance", "rank_correlation", "similarity", "prune_curve", "redundancy", "prune_summary",
                "sweep", "kv"):
        assert key not in d["missing"], (key, d["missing"].get(key))
    assert d["sweep"]["plot"] and d["prune"]["curve"]["plot"] and d["importance_columns"]


def test_declaration_helpers():
    assert (
        A.producers("heads.csv") == ["analyze"]
        and A.producers("roles.csv") == ["roles"]
        and A.artifact("kv.csv").verb == "kv"
    )
    with pytest.raises(HeadscopeError, match="did you mean 'heads.csv'"):
        A.artifact("head.csv")
    with pytest.raises(HeadscopeError, match="did you mean 'prune'"):
        A.outputs("prun")
    fam = A.IMPORTANCE_CSV.field_for("importance_taylor")
    assert fam is not None and fam.is_family and A.IMPORTANCE_CSV.field_for("taylor") is None
    # Out of order, missing and undeclared columns are all reported.
    cols = A.REDUNDANCY_CSV.columns()
    assert A.REDUNDANCY_CSV.check(cols) == []
    problems = A.REDUNDANCY_CSV.check([cols[1], cols[0], "extra"])
    assert any("missing removable" in p for p in problems) and any("undeclared extra" in p for p in problems)
    assert any("order" in p for p in problems)
