"""`prune --until-stable R`: the scoring passages are read in chunks until the unpruned ranking by --method
reaches split-half stability R (as `score --until-stable`), and the curve scores on those passages only."""

from __future__ import annotations

import json

import numpy as np

from headscope.cli import main
from tests.test_artifacts import WORDS, tiny_llama_dir


def _long_text(path, n):
    rng = np.random.default_rng(1)
    path.write_text("\n".join(" ".join(rng.choice(WORDS, 12)) for _ in range(n)) + "\n")
    return path


def test_prune_reads_until_stable_and_records_it(tmp_path, capsys):
    src, _ = tiny_llama_dir(tmp_path)
    text = _long_text(tmp_path / "long.txt", 80)
    for target, out in ((0.05, tmp_path / "easy"), (0.999999, tmp_path / "hard")):
        assert main(["prune", str(src), "--fraction", "0.34", "--step", "0.34", "--method", "taylor", "--data",
                     str(text), "--limit", "80", "--max-length", "16", "--until-stable", str(target),
                     "--out", str(out)]) == 0
        u = json.loads((out / "prune.json").read_text())["until_stable"]
        assert u["target"] == target and u["available"] == 80
        if target < 0.5:  # an easy target is reached with the first chunk, not all passages
            assert u["reached"] and u["passages"] < 80, u
        else:  # a target no ranking of 80 passages reaches: all of them are read, and the line says so
            assert not u["reached"] and u["passages"] == 80, u
            assert "--until-stable 0.999999: NOT reached with 80 of the 80" in capsys.readouterr().out


def test_until_stable_is_refused_where_it_means_nothing(tmp_path, capsys):
    src, text = tiny_llama_dir(tmp_path)  # 12 passages
    for extra, says in ((["--unit", "attention"], "--until-stable reads scoring passages until the head ranking"),
                        (["--method", "l0"], "--until-stable reads scoring passages until the head ranking")):
        out = tmp_path / "o"
        capsys.readouterr()
        assert main(["prune", str(src), "--fraction", "0.3", *extra, "--data", str(text), "--until-stable", "0.9",
                     "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0] and not out.exists(), err
