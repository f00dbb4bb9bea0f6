"""DuoAttention head patterns (`--card-format duo`, `kvcache --export-card`): the directory reads back with
np.loadtxt to [layers, KV heads] in [0, 1], a KV head scores its best query head (kvcache's rule), and the top
heads of the file are exactly the KV heads kvcache keeps full."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_artifacts import WORDS, tiny_llama_dir

from headscope.capacity.kvcache.choice import choose_top
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.export.cards import card_scores, check_card_path, duo_pattern, write_duo

SMALL = ["--sink", "2", "--window", "8", "--context", "64", "--limit", "1", "--chunk", "16"]


def _top(pattern: np.ndarray, k: int) -> list[list[int]]:
    """The k highest-valued KV heads of a pattern, per layer (as kvcache.json's full_heads)."""
    flat = np.argsort(-pattern.ravel(), kind="stable")[:k]
    return [sorted(int(i % pattern.shape[1]) for i in flat if i // pattern.shape[1] == l) for l in range(len(pattern))]


def test_rule_is_the_best_query_head_min_max_scaled():
    # 2 layers x 4 query heads over 2 KV heads (group size 2).
    scores = np.array([[0.1, 0.5, 0.2, 0.2], [np.nan, 0.9, 0.3, np.nan]])
    got = duo_pattern(scores, 2)
    # KV maxima: [[0.5, 0.2], [0.9, 0.3]], scaled by min 0.2 and max 0.9
    want = (np.array([[0.5, 0.2], [0.9, 0.3]]) - 0.2) / 0.7
    assert np.allclose(got, want), got
    assert np.allclose(duo_pattern(np.full((2, 4), 0.3), 2), 1.0)  # nothing tells them apart: all full
    assert duo_pattern(np.array([[np.nan, np.nan, 0.4, 0.1]]), 2).tolist() == [[0.0, 1.0]]  # unscored -> 0
    with pytest.raises(HeadscopeError, match="NaN"):
        duo_pattern(np.full((1, 4), np.nan), 2)


def test_written_directory_reads_back_and_ranks_like_kvcache(tmp_path):
    rng = np.random.default_rng(1)
    scores = rng.random((3, 6))  # 3 layers x 6 query heads over 3 KV heads
    path = write_duo(tmp_path / "duo", duo_pattern(scores, 3), sink=4, recent=256)
    back = np.loadtxt(path / "full_attention_heads.tsv", delimiter="\t")
    assert back.shape == (3, 3) and back.min() >= 0 and back.max() <= 1
    assert json.loads((path / "config.json").read_text())["sink_size"] == 4
    for budget in (0.2, 0.5, 0.8):
        choice = choose_top(scores, 3, budget, "x")
        assert _top(back, choice.n_full) == choice.full_heads(), budget


def test_card_scores_average_each_heads_list():
    card = {"0-0": [0.2, 0.4], "0-1": [], "1-0": [1.0], "1-1": [float("nan"), 0.5]}
    got = card_scores(card, 2, 2)
    assert np.allclose(got, [[0.3, np.nan], [1.0, 0.5]], equal_nan=True)


def test_card_path_refusals(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    with pytest.raises(HeadscopeError, match="is a file; the duo format is a directory"):
        check_card_path(tmp_path / "file", "duo", True)
    with pytest.raises(HeadscopeError, match="exists; pass force=True"):
        check_card_path(tmp_path / "dir", "duo", False)
    with pytest.raises(HeadscopeError, match="is a directory; give a file name"):
        check_card_path(tmp_path / "dir", "retrieval-head", True)
    with pytest.raises(HeadscopeError, match="not one of"):
        check_card_path(tmp_path / "new", "kvpress", False)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("duo")
    src, _ = tiny_llama_dir(base, num_key_value_heads=3, max_position_embeddings=128, init_std=0.2)
    rng = np.random.default_rng(0)
    text = base / "long.txt"
    text.write_text("\n".join(" ".join(rng.choice(WORDS, 100)) for _ in range(3)) + "\n")
    return src, text


def test_kvcache_export_card_holds_the_heads_it_keeps(llama, tmp_path):
    src, text = llama
    out, card, scores = tmp_path / "out", tmp_path / "duo", tmp_path / "heads.csv"
    values = np.random.default_rng(2).permutation(12) / 12  # distinct: kvcache breaks ties at random
    scores.write_text("layer,head,retrieval_score\n" + "".join(
        f"{l},{h},{values[l * 6 + h]}\n" for l in range(2) for h in range(6)))
    assert main(["kvcache", str(src), "--keep-full", "34%,67%", "--scores", str(scores), "--data", str(text),
                 "--needles", "0", "--no-random", *SMALL, "--out", str(out), "--export-card", str(card)]) == 0
    pattern = np.loadtxt(card / "full_attention_heads.tsv", delimiter="\t")
    assert pattern.shape == (2, 3) and pattern.min() >= 0 and pattern.max() <= 1
    assert json.loads((card / "config.json").read_text())["recent_size"] == 8
    rows = json.loads((out / "kvcache.json").read_text())["rows"]
    for row in rows[1:]:
        n = sum(map(len, row["full_heads"]))
        assert _top(pattern, n) == row["full_heads"], (row["budget"], pattern)


def test_export_card_from_python_writes_what_the_cli_writes(llama, tmp_path):
    """`export_card(result, hm, path)` is the library function behind `kvcache --export-card`: the same directory,
    byte for byte, from Python as from the command line."""
    from headscope import load_model
    from headscope.capacity.options import KvcacheOptions
    from headscope.capacity.verbs import kvcache
    from headscope.export.card_export import export_card

    src, text = llama
    scores = tmp_path / "heads.csv"
    values = np.random.default_rng(3).permutation(12) / 12
    scores.write_text("layer,head,retrieval_score\n" + "".join(
        f"{l},{h},{values[l * 6 + h]}\n" for l in range(2) for h in range(6)))
    assert main(["kvcache", str(src), "--keep-full", "34%", "--scores", str(scores), "--data", str(text),
                 "--needles", "0", "--no-random", *SMALL, "--out", str(tmp_path / "o"), "--export-card",
                 str(tmp_path / "cli")]) == 0
    hm = load_model(str(src))
    options = KvcacheOptions(model=str(src), keep_full="34%", scores=str(scores), data=str(text), needles=0,
                             no_random=True, sink=2, window=8, context=64, limit=1, chunk=16)
    result = kvcache(hm, None, options)
    written = export_card(result, hm, tmp_path / "py")
    assert written.path == tmp_path / "py"
    for name in ("full_attention_heads.tsv", "config.json"):
        assert (tmp_path / "py" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    with pytest.raises(HeadscopeError, match="needs the folder"):
        export_card(result, hm)


def test_kvcache_export_card_refuses_an_existing_directory_before_work(llama, tmp_path, capsys):
    src, text = llama
    card = tmp_path / "duo"
    card.mkdir()
    out = tmp_path / "out"
    assert main(["kvcache", str(src), "--data", str(text), *SMALL, "--out", str(out), "--export-card", str(card)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err and list(card.iterdir()) == []


def test_roles_duo_card_path_refused_before_the_model_loads(tmp_path, capsys):
    card = tmp_path / "card.json"
    card.write_text("{}")
    assert main(["roles", "nomodel", "--out", str(tmp_path / "o"), "--long", "256", "--export-card", str(card),
                 "--card-format", "duo"]) == 2
    assert "the duo format is a directory" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_kvcache_card_records_how_stable_its_ranking_is(llama, tmp_path, capsys):
    """Scores measured by kvcache itself: the card's config holds their ranking's split-half stability and the
    haystacks it came from, as kvcache.json does; scores read from a file say where their record is."""
    src, text = llama
    out, card = tmp_path / "out", tmp_path / "duo"
    assert main(["kvcache", str(src), "--keep-full", "50%", "--haystacks", "4", "--data", str(text), "--needles", "0",
                 "--no-random", *SMALL, "--out", str(out), "--export-card", str(card)]) == 0
    record = json.loads((card / "config.json").read_text())["headscope"]
    kvcache_json = json.loads((out / "kvcache.json").read_text())
    assert record == kvcache_json["settings"]["scores"]["ranking"] and record["haystacks"] == 4
    # the tiny random model answers none of the 4 haystacks: its scores are over all of them, too few to split
    assert kvcache_json["settings"]["scores"]["over"].startswith("every haystack")
    assert record["score"] == "retrieval_score_all" and record["stable"] is False
    assert "ranking is not stable" in capsys.readouterr().err  # said on stderr, as roles says it
    scores = tmp_path / "heads.csv"
    scores.write_text("layer,head,retrieval_score\n" + "".join(f"{l},{h},{l + h / 10}\n" for l in range(2)
                                                                 for h in range(6)))
    assert main(["kvcache", str(src), "--keep-full", "50%", "--scores", str(scores), "--data", str(text),
                 "--needles", "0", "--no-random", *SMALL, "--out", str(tmp_path / "o2"), "--export-card",
                 str(tmp_path / "duo2")]) == 0
    read = json.loads((tmp_path / "duo2" / "config.json").read_text())["headscope"]
    assert read["ranking_stability"] is None and read["from"] == str(scores) and "roles.json" in read["note"]
