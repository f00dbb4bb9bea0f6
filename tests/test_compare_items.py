"""compare_items.npz: the per-item sums of more than one value per item (the role census's per head) go beside
compare.json, exact, and compare.json names each one's key and shape. A compare without census rows writes the files
it wrote before, byte for byte; `--base-from` reads the npz back to the same numbers as a fresh run; a stale npz does
not survive a rerun; a missing or damaged one is refused in one line before any forward."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_compare import TEXTS, planted_model
from test_compare_census import silenced

import headscope
from headscope.artifacts import COMPARE_ITEMS_NPZ
from headscope.cli import main
from headscope.commands._check import finish_check
from headscope.compare.verb import per_item
from headscope.errors import OptionError, OutputConflict
from headscope.table import to_jsonable

NPZ = COMPARE_ITEMS_NPZ.name
CENSUS = dict(tasks=("induction", "heads"), items=8, bootstrap=200, data=TEXTS)  # the induction row: 1-D sums
PLAIN = dict(tasks=("lm", "induction"), items=8, bootstrap=200, data=TEXTS)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _census_rows(result: headscope.compare.CompareResult) -> list[str]:
    return [c for c in result.record.rows if c.startswith("roles:")]


def _forwards(*models: headscope.HeadModel) -> tuple[list[int], list]:
    """Count the forwards of `models` (hooks to remove with `h.remove()`)."""
    calls: list[int] = []
    return calls, [hm.model.register_forward_pre_hook(lambda *a: calls.append(1)) for hm in models]


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> tuple[headscope.compare.CompareResult, Path]:
    """A census compare of the planted model against it with the induction head silenced, saved."""
    result = headscope.compare(planted_model(), silenced(1, 0), **CENSUS)
    out = tmp_path_factory.mktemp("first")
    result.save(out)
    return result, out


def test_per_head_sums_go_to_the_npz_exact_and_compare_json_names_them(first):
    result, out = first
    assert result.files == ("compare.csv", "compare.json", NPZ)
    assert _names(out) == sorted(result.files)
    rec = json.loads((out / "compare.json").read_text())
    moved = 0
    with np.load(out / NPZ, allow_pickle=False) as z:
        assert COMPARE_ITEMS_NPZ.check(z.files) == [], z.files
        for cap, row in rec["rows"].items():
            for side in ("base", "other"):
                held = per_item(result, cap, side)  # the in-memory record keeps every array
                for name, value in row["items"][side].items():
                    if held[name].ndim == 1:  # one value per item: in compare.json, as before
                        assert value == held[name].tolist(), (cap, side, name)
                        continue
                    key = f"{cap}/{side}/{name}"
                    assert value["in"] == NPZ and value["key"] == key and value["shape"] == list(held[name].shape)
                    assert z[key].dtype == np.float64 and np.array_equal(z[key], held[name]), key
                    moved += 1
        assert moved == len(z.files)
    # every census row's sums are per head ([items, layers, heads]) or once per item ([items, 1, 1]): all moved
    census = _census_rows(result)
    assert len(census) == 11 and moved == sum(len(result.record.rows[c]["items"][s]) for c in census
                                              for s in ("base", "other"))
    assert per_item(result, "roles:induction", "base")["induction_score"].shape == (8, 2, 2)
    assert rec["rows"]["induction"]["items"]["base"]["v"] == result.record.rows["induction"]["items"]["base"]["v"]


def test_compare_json_of_a_census_compare_holds_no_per_head_array(first):
    _, out = first

    def depth(v) -> int:
        return 1 + max(map(depth, v), default=0) if isinstance(v, list) else 0

    rec = json.loads((out / "compare.json").read_text())
    for cap, row in rec["rows"].items():
        for sums in row["items"].values():
            for v in sums.values():
                assert depth(v) <= 1, v  # a list of numbers, or a reference (depth 0)
                # a census row keeps no number per item in compare.json: its size does not grow with the items
                assert not cap.startswith("roles:") or isinstance(v, dict), (cap, v)


def test_without_census_rows_the_files_are_byte_for_byte_what_they_were(tmp_path):
    result = headscope.compare(planted_model(), planted_model(zero=(1, 0)), **PLAIN)
    result.save(tmp_path)
    assert result.files == ("compare.csv", "compare.json") and _names(tmp_path) == list(result.files)
    # compare.json as CompareResult.write wrote it before compare_items.npz existed
    before = json.dumps(to_jsonable(result.record.to_json()), indent=1, allow_nan=False) + "\n"
    assert (tmp_path / "compare.json").read_text(encoding="utf-8") == before


def test_base_from_reads_the_npz_back_exactly(first):
    """A second candidate against the same BASE: BASE runs no forward, its census sums are the first compare's to the
    bit, and every row equals a fresh comparison's."""
    earlier, out = first
    base, second = planted_model(), silenced(0, 0)
    fresh = headscope.compare(base, second, **CENSUS)
    calls, hooks = _forwards(base)
    try:
        reused = headscope.compare(base, second, base_from=str(out), **CENSUS)
    finally:
        for h in hooks:
            h.remove()
    assert not calls
    assert [c.row() for c in reused.changes] == [c.row() for c in fresh.changes]
    for cap in _census_rows(reused):
        assert reused.record.rows[cap]["base_reused_from"] == str(out)
        got, then = per_item(reused, cap, "base"), per_item(earlier, cap, "base")
        assert got.keys() == then.keys() and all(np.array_equal(got[k], then[k]) for k in got), cap
        assert reused.record.rows[cap]["heads"] == fresh.record.rows[cap]["heads"]
    assert reused.verdict("roles:previous_token") == "lost"


def test_a_stale_npz_does_not_survive_a_rerun_without_census_rows(first, tmp_path):
    census, out = first
    plain = headscope.compare(planted_model(), planted_model(zero=(1, 0)), **PLAIN)
    (tmp_path / NPZ).write_bytes((out / NPZ).read_bytes())  # an earlier run's npz, alone
    with pytest.raises(OutputConflict, match=NPZ):  # without force: refused, nothing written
        plain.save(tmp_path)
    assert _names(tmp_path) == [NPZ] and (tmp_path / NPZ).read_bytes() == (out / NPZ).read_bytes()
    census.save(tmp_path, force=True)
    plain.save(tmp_path, force=True)
    assert _names(tmp_path) == ["compare.csv", "compare.json"]
    # the compressing verbs' check (which measures no census row) removes it too
    census.save(tmp_path, force=True)
    assert finish_check(lambda: plain, tmp_path, force=True) == ["compare.csv", "compare.json"]
    assert _names(tmp_path) == ["compare.csv", "compare.json"]


def test_the_command_refuses_a_stale_npz_without_force_and_removes_it_with(first, tmp_path, monkeypatch, capsys):
    _, out = first
    models = {"base": planted_model(), "other": planted_model(zero=(1, 0))}
    monkeypatch.setattr("headscope.commands.compare.check_model_name", lambda *a: None)
    monkeypatch.setattr("headscope.commands.compare.load_model", lambda name, **k: models[name])
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / NPZ).write_bytes((out / NPZ).read_bytes())
    argv = ["compare", "base", "other", "--tasks", "lm,induction", "--items", "8", "--bootstrap", "200", "--data",
            str(texts), "--out", str(folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and NPZ in err[0] and "--force" in err[0], err
    assert _names(folder) == [NPZ]
    assert main([*argv, "--force"]) == 0
    assert _names(folder) == ["compare.csv", "compare.json"]


def test_all_files_appear_together_or_none(first, tmp_path, monkeypatch):
    census, _ = first
    census.save(tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in _names(tmp_path)}

    def full_disk(arrays):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("headscope.compare.verb.npz_bytes", full_disk)
    with pytest.raises(headscope.HeadscopeError, match="the disk is full"):
        census.save(tmp_path, force=True)
    assert {n: (tmp_path / n).read_bytes() for n in _names(tmp_path)} == before
    assert [p.name for p in tmp_path.parent.iterdir() if "staging" in p.name] == []


def test_a_missing_or_damaged_npz_is_refused_in_one_line_before_any_forward(first, tmp_path):
    _, out = first
    base, second = planted_model(), silenced(0, 0)
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in ("compare.csv", "compare.json"):
        (damaged / name).write_bytes((out / name).read_bytes())
    # another run's npz: the same keys and shapes, another BASE's sums (its previous-token head's output zeroed)
    other_run = headscope.compare(planted_model(zero=(0, 0)), second, **CENSUS)
    other_run.save(tmp_path / "other-run")
    cases = {"missing": (None, f"keeps roles:previous_token's BASE sum .* in {NPZ}, which '{damaged}' lacks"),
             "garbage": (b"not a zip file", "cannot be read"),
             "another run's": ((tmp_path / "other-run" / NPZ).read_bytes(), "holds another array under")}
    calls, hooks = _forwards(base, second)
    try:
        for case, (data, message) in cases.items():
            (damaged / NPZ).unlink(missing_ok=True)
            if data is not None:
                (damaged / NPZ).write_bytes(data)
            with pytest.raises(OptionError, match=message) as e:
                headscope.compare(base, second, base_from=str(damaged), **CENSUS)
            assert e.value.name == "base_from" and "\n" not in str(e.value), case
        assert not calls  # refused before any forward of either model
    finally:
        for h in hooks:
            h.remove()
    # only a row that is reused needs the npz: a row of 1-D sums reads compare.json alone, census rows on other
    # items (passages, sequences) are measured again
    (damaged / NPZ).unlink()
    pairs = headscope.compare(base, second, base_from=str(damaged), **{**CENSUS, "tasks": ("induction",)})
    assert pairs.record.rows["induction"]["base_reused_from"] == str(damaged)
    again = headscope.compare(base, second, base_from=str(damaged), **{**CENSUS, "items": 6, "data": TEXTS[:6]})
    assert not any(again.record.rows[c]["base_reused_from"] for c in _census_rows(again))


def test_a_malformed_reference_is_refused(first, tmp_path):
    _, out = first
    rec = json.loads((out / "compare.json").read_text())
    rec["rows"]["roles:sink"]["items"]["base"]["sink_score"] = {"in": NPZ, "key": 3}
    (tmp_path / "compare.json").write_text(json.dumps(rec))
    (tmp_path / NPZ).write_bytes((out / NPZ).read_bytes())
    with pytest.raises(OptionError, match="roles:sink's BASE sum sink_score with a malformed reference"):
        headscope.compare(planted_model(), silenced(0, 0), base_from=str(tmp_path), **CENSUS)


def test_the_cli_says_a_missing_npz_in_one_line(first, tmp_path, monkeypatch, capsys):
    _, out = first
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "compare.json").write_bytes((out / "compare.json").read_bytes())
    models = {"base": planted_model(), "other": silenced(0, 0)}
    monkeypatch.setattr("headscope.commands.compare.check_model_name", lambda *a: None)
    monkeypatch.setattr("headscope.commands.compare.load_model", lambda name, **k: models[name])
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    argv = ["compare", "base", "other", "--tasks", "induction,heads", "--items", "8", "--bootstrap", "200", "--data",
            str(texts), "--base-from", str(damaged), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].count("--base-from") >= 1 and NPZ in err[0], err
    assert not (tmp_path / "o").exists()
