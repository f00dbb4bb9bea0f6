"""`roles` data-parallel (headscope.distributed): 2 ranks on gloo (CPU) against one process.

The text pass is split across ranks (whole batches) and its sums and counts merged with all_reduce;
the induction, treebank and coreference passes run on rank 0 and are broadcast; outputs are written
once, by rank 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_distributed import SENTENCES, _join, _spawn, one_thread, passages

from headscope import distributed as hd
from headscope.cli import main
from headscope.learned.roles import RoleSettings, roles
from headscope.models.tiny import tiny_model


def _arrays(table) -> dict[str, np.ndarray]:
    """Every score and baseline of a roles table, plus the raw statistics sums and counts."""
    r = table.meta["roles"]
    out = {f"score:{k}": np.asarray(v, float) for k, v in r["scores"].items()}
    out.update({f"baseline:{k}": np.asarray(v, float) for k, v in r["baselines"].items()})
    stats = table.meta["stats"]
    out.update({f"sum:{k}": np.asarray(v, float) for k, v in stats["sums"].items()})
    out.update({f"count:{k}": np.asarray(v, float) for k, v in stats["counts"].items()})
    out["tokens"] = np.array(stats["tokens"], float)
    out["roles"] = np.array([";".join(v) for v in r["roles"].values()])
    return out


def _roles_rank(rank: int, world: int, port: int, out: str) -> None:
    _join(rank, world, port)
    hd.init("cpu")
    try:
        hm = tiny_model("gpt2", init_std=0.2)
        np.savez(f"{out}/rank{rank}.npz", **_arrays(roles(hm, passages(), RoleSettings(batch_size=2, n_sequences=4))))
    finally:
        hd.shutdown()


def test_two_ranks_equal_one_process(tmp_path):
    _spawn(_roles_rank, 2, str(tmp_path))
    hm = tiny_model("gpt2", init_std=0.2)
    with one_thread():
        want = _arrays(roles(hm, passages(), RoleSettings(batch_size=2, n_sequences=4)))
    assert {"score:offset_m1_mass", "score:rare_word_mass", "baseline:sink_mass_uniform", "sum:entropy"} <= set(want)
    for rank in (0, 1):  # every rank ends with the merged census
        got = np.load(tmp_path / f"rank{rank}.npz")
        assert sorted(got.files) == sorted(want), f"rank {rank}: other scores"
        np.testing.assert_array_equal(got["roles"], want["roles"])
        for k, v in want.items():
            if k == "roles":
                continue
            if k.startswith("count:") or k == "tokens":
                np.testing.assert_array_equal(got[k], v, err_msg=f"rank {rank} {k}")
            else:
                diff = np.nanmax(np.abs(got[k] - v)) if np.isfinite(v).any() else 0.0
                np.testing.assert_allclose(got[k], v, rtol=0, atol=1e-6, equal_nan=True,
                                           err_msg=f"rank {rank} {k}: max |diff| {diff:.2e}")


def test_workers_flag_equals_one_process_and_writes_once(tmp_path):
    data = tmp_path / "s.txt"
    data.write_text("\n".join(SENTENCES) + "\n")
    common = ["roles", "minilm", "--data", str(data), "--batch-size", "2", "--treebank", "ewt-test", "--limit", "5"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    two = subprocess.run([sys.executable, "-m", "headscope", *common, "--workers", "2", "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr
    assert two.stderr.count("wrote ") == 1 and two.stdout.count("role census") == 1, "rank 0 alone prints"
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["roles.csv", "roles.json", "syntax.csv"]
    with one_thread():  # --workers 2 gives each rank cores / 2 = 1 thread here
        assert main([*common, "--out", str(tmp_path / "one")]) == 0
    one, got = (json.loads((tmp_path / d / "roles.json").read_text()) for d in ("one", "two"))
    assert got["text"]["passages"] == one["text"]["passages"] == 5
    assert got["roles"] == one["roles"] and got["census"].keys() == one["census"].keys()
    for part in ("scores", "baselines"):
        assert got[part].keys() == one[part].keys()
        for k in one[part]:
            a, b = np.array(got[part][k], float), np.array(one[part][k], float)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, equal_nan=True, err_msg=f"{part} {k}")
    assert got["syntax"] == one["syntax"], "the treebank pass (rank 0) is the single process's"
    assert (tmp_path / "two" / "syntax.csv").read_text() == (tmp_path / "one" / "syntax.csv").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "s.txt", "two"], "no temp folder left behind"


def test_more_ranks_than_passages_stops_roles_before_the_model_loads(tmp_path, monkeypatch):
    data = tmp_path / "s.txt"
    data.write_text(SENTENCES[0] + "\n")
    monkeypatch.setenv("WORLD_SIZE", "2")
    import headscope.commands.roles as cmd
    from headscope.cli import build_parser
    from headscope.errors import HeadscopeError
    from headscope.options import ModelOptions

    loaded = []
    monkeypatch.setattr(ModelOptions, "load", lambda options: loaded.append(options))
    args = build_parser().parse_args(["roles", "minilm", "--data", str(data), "--out", str(tmp_path / "res")])
    with pytest.raises(HeadscopeError) as e:
        cmd.run(args)
    assert str(e.value) == ("2 processes (workers, or torchrun's nproc-per-node) but only 1 passage; "
                            "use at most 1 process, or more data")  # the CLI says --workers (e.value.fields)
    assert e.value.fields == ("workers",)
    assert not loaded and not (tmp_path / "res").exists()
