"""Data-parallel scans (headscope.distributed): 2 ranks on gloo (CPU) against one process.

Ranks are real processes (torch.multiprocessing spawn, or `--workers 2`, which starts
`python -m headscope` twice); they join a TCPStore this test process hosts, as torchrun's do.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from headscope import distributed as hd
from headscope.cli import main
from headscope.data import batches
from headscope.errors import HeadscopeError
from headscope.learned.analyze import analyze
from headscope.models.tiny import tiny_model
from headscope.redundancy.importance import ScoreSettings, score

SENTENCES = ["The cat sat on the mat.", "A dog barked loudly at night, then slept.",
             "Colorless green ideas sleep furiously.", "She sells sea shells by the sea shore.",
             "Time flies like an arrow; fruit flies like a banana."]


def passages(n_list=(12, 9, 5, 7, 10, 3, 11), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 120, (n,), generator=g).tolist() for n in n_list]


def _spawn(fn, world: int, *args) -> None:
    """Run fn(rank, *args) in `world` processes that form one gloo group (as torchrun would)."""
    store = hd.rendezvous_store()
    mp.start_processes(fn, args=(world, store.port, *args), nprocs=world, start_method="spawn", join=True)


def _join(rank: int, world: int, port: int) -> None:
    os.environ.update(hd.rank_env(rank, world, port))
    torch.set_num_threads(1)


@contextlib.contextmanager
def one_thread():
    """The single-process reference on 1 thread, as each rank runs: float32 kernels round differently on
    1 and 2 threads (~2e-8 relative), which is not what these tests compare."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- sharding, no processes -----------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3])
def test_shards_rebuild_the_single_process_batches(world):
    ids = passages((12, 9, 5, 7, 10, 3, 11, 4, 8, 6, 2))
    whole = [b.index for b in batches(ids, 3)]
    seen = []
    for r in range(world):
        shard = hd.shard_batches(ids, 3, rank=r, world=world)
        got = [[shard[i] for i in b.index] for b in batches(shard, 3)]
        want = [[ids[i] for i in idx] for k, idx in enumerate(whole) if hd.owner(k, world) == r]
        assert got == want, f"rank {r} of {world}: its batches differ from the single-process ones"
        seen += [tuple(t) for t in shard]
    assert sorted(seen) == sorted(tuple(t) for t in ids), "every passage is scanned exactly once"


def test_owner_snakes_so_sorted_work_balances():
    assert [hd.owner(i, 2) for i in range(6)] == [0, 1, 1, 0, 0, 1]
    assert [hd.owner(i, 3) for i in range(6)] == [0, 1, 2, 2, 1, 0]


def test_more_ranks_than_passages_is_refused():
    with pytest.raises(HeadscopeError, match="3 processes but only 2 passages; use at most 2"):
        hd.shard_batches(passages((4, 5)), 1, rank=0, world=3)


def test_workers_below_one_is_refused(capsys, tmp_path):
    assert main(["analyze", "--workers", "0", "--out", str(tmp_path / "res")]) == 2
    assert "--workers must be at least 1; got 0" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


# --- 2 ranks against 1 process, library level (tiny model) ---------------------------------
def _scan(rank: int, world: int, port: int, out: str) -> None:
    _join(rank, world, port)
    hd.init("cpu")
    try:
        hm = tiny_model("gpt2", init_std=0.2)
        stats = analyze(hm, passages(), batch_size=2).meta["stats"]
        t = score(hm, passages(), ScoreSettings(methods="ablation,ablation_mean,output_norm", batch_size=2))
        np.savez(f"{out}/rank{rank}.npz", sums=np.stack([np.array(stats["sums"][k]) for k in sorted(stats["sums"])]),
                 counts=np.stack([np.array(stats["counts"][k]) for k in sorted(stats["counts"])]),
                 tokens=stats["tokens"], **{c: t[c] for c in t.columns})
    finally:
        hd.shutdown()


def test_two_ranks_equal_one_process(tmp_path):
    _spawn(_scan, 2, str(tmp_path))
    hm = tiny_model("gpt2", init_std=0.2)
    with one_thread():
        stats = analyze(hm, passages(), batch_size=2).meta["stats"]
        t = score(hm, passages(), ScoreSettings(methods="ablation,ablation_mean,output_norm", batch_size=2))
    for rank in (0, 1):  # every rank ends with the merged numbers
        got = np.load(tmp_path / f"rank{rank}.npz")
        sums = np.stack([np.array(stats["sums"][k]) for k in sorted(stats["sums"])])
        counts = np.stack([np.array(stats["counts"][k]) for k in sorted(stats["counts"])])
        assert int(got["tokens"]) == stats["tokens"]
        np.testing.assert_array_equal(got["counts"], counts)
        np.testing.assert_allclose(got["sums"], sums, rtol=0, atol=1e-6,
                                   err_msg=f"rank {rank}: max |diff| {np.abs(got['sums'] - sums).max():.2e}")
        for col in ("importance_ablation", "importance_ablation_mean", "importance_output_norm"):
            assert np.isfinite(t[col]).all()
            np.testing.assert_allclose(got[col], t[col], rtol=0, atol=1e-6,
                                       err_msg=f"rank {rank} {col}: max |diff| {np.abs(got[col] - t[col]).max():.2e}")


# --- the CLI: a failing rank stops every rank, nothing is written ---------------------------
def _cli(rank: int, world: int, port: int, out: str, fail_rank: int) -> None:
    _join(rank, world, port)
    if rank == fail_rank:
        def broken(*args, **kwargs):
            raise ValueError("injected failure")

        importlib.import_module("headscope.learned.analyze").run_stats = broken  # the module, not the function
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["analyze", "minilm", "--data", f"{out}/s.txt", "--batch-size", "2", "--out", f"{out}/res"])
    Path(f"{out}/rank{rank}.json").write_text(json.dumps({"rc": rc, "err": err.getvalue()}))


def test_a_failing_rank_stops_all_and_nothing_is_written(tmp_path):
    (tmp_path / "s.txt").write_text("\n".join(SENTENCES) + "\n")
    _spawn(_cli, 2, str(tmp_path), 1)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["rc"] == 1 and r1["rc"] == 1, (r0, r1)
    lines = [line for line in r0["err"].splitlines() if "headscope analyze" in line]
    assert lines == ["headscope analyze: unexpected RankCrashed: rank 1 of 2: ValueError: injected failure "
                     "(run with -v for the traceback)"], r0["err"]
    assert "headscope analyze" not in r1["err"], "only rank 0 prints"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank1.json", "s.txt"], "nothing written"


# --- the CLI: --workers 2 writes once, equal to one process ---------------------------------
def test_workers_flag_equals_one_process(tmp_path):
    data = tmp_path / "s.txt"
    data.write_text("\n".join(SENTENCES) + "\n")
    common = ["analyze", "minilm", "--data", str(data), "--batch-size", "2"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    two = subprocess.run([sys.executable, "-m", "headscope", *common, "--workers", "2", "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr
    assert two.stderr.count("wrote ") == 1 and two.stdout.count("most notable heads") == 1, "rank 0 alone prints"
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["heads.csv", "heads.json"]
    with one_thread():  # --workers 2 gives each rank cores / 2 = 1 thread here
        assert main([*common, "--out", str(tmp_path / "one")]) == 0
    one, got = (json.loads((tmp_path / d / "heads.json").read_text())["meta"]["stats"] for d in ("one", "two"))
    assert (got["tokens"], got["passages"]) == (one["tokens"], one["passages"]) == (one["tokens"], 5)
    for k in one["sums"]:
        np.testing.assert_array_equal(got["counts"][k], one["counts"][k])
        np.testing.assert_allclose(got["sums"][k], one["sums"][k], rtol=0, atol=1e-6, err_msg=k)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "s.txt", "two"], "no temp folder left behind"


def test_more_ranks_than_passages_stops_analyze_before_the_model_loads(tmp_path, monkeypatch, capsys):
    """Each rank runs this check with torchrun's WORLD_SIZE (no group is needed for it); the CLI then
    prints rank 0's line once (test_a_failing_rank... shows the one-line path across real ranks)."""
    data = tmp_path / "s.txt"
    data.write_text(SENTENCES[0] + "\n")
    monkeypatch.setenv("WORLD_SIZE", "2")
    import headscope.commands.analyze as cmd
    from headscope.cli import build_parser
    from headscope.options import ModelOptions

    loaded = []
    monkeypatch.setattr(ModelOptions, "load", lambda options: loaded.append(options))
    args = build_parser().parse_args(["analyze", "minilm", "--data", str(data), "--out", str(tmp_path / "res")])
    with pytest.raises(HeadscopeError) as e:
        cmd.run(args)
    assert str(e.value) == ("2 processes (workers, or torchrun's nproc-per-node) but only 1 passage; "
                            "use at most 1 process, or more data")  # the CLI says --workers (e.value.fields)
    assert e.value.fields == ("workers",)
    assert not loaded and not (tmp_path / "res").exists()
