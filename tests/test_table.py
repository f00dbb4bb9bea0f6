"""HeadTable: round trips through CSV, JSON and pandas; the heads.csv contract; clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from headscope import HeadTable, head_name, parse_head
from headscope.errors import HeadscopeError


def make():
    rng = np.random.default_rng(0)
    a = rng.random((3, 4))
    a[1, 2] = np.nan
    roles = np.array([["sink", "", "previous_token;local", ""]] * 3, dtype=object)
    return HeadTable(3, 4, {"entropy": a, "mean_distance": rng.random((3, 4)), "roles": roles}, {"model": "x"})


def test_csv_contract_and_round_trip(tmp_path):
    t = make()
    t.to_csv(tmp_path / "heads.csv")
    lines = (tmp_path / "heads.csv").read_text().splitlines()
    assert lines[0] == "layer,head,entropy,mean_distance,roles"
    keys = [tuple(map(int, line.split(",")[:2])) for line in lines[1:]]
    assert keys == [(layer, head) for layer in range(3) for head in range(4)]
    back = HeadTable.from_csv(tmp_path / "heads.csv")
    d = np.nanmax(np.abs(back["entropy"] - t["entropy"]))
    assert d < 1e-5, f"max abs diff {d}"
    assert np.isnan(back["entropy"][1, 2])
    assert list(back["roles"][0]) == ["sink", "", "previous_token;local", ""]


def test_json_round_trip_keeps_meta_and_nan(tmp_path):
    t = make()
    t.to_json(tmp_path / "heads.json")
    data = json.loads((tmp_path / "heads.json").read_text())
    assert data["rows"][6]["entropy"] is None  # NaN is written as null
    back = HeadTable.from_json(tmp_path / "heads.json")
    assert back.meta == {"model": "x"}
    assert np.array_equal(np.isnan(back["entropy"]), np.isnan(t["entropy"]))
    assert np.nanmax(np.abs(back["mean_distance"] - t["mean_distance"])) == 0


def test_with_columns_returns_new_table():
    t = make()
    u = t.with_columns(score=np.ones((3, 4)))
    assert "score" in u and "score" not in t


def test_bad_shapes_and_names():
    with pytest.raises(HeadscopeError, match=r"\(3, 4\)"):
        HeadTable(3, 4, {"x": np.zeros((4, 3))})
    with pytest.raises(KeyError, match="did you mean 'entropy'"):
        make()["entropyy"]
    with pytest.raises(HeadscopeError, match="reserved"):
        HeadTable(3, 4, {"layer": np.zeros((3, 4))})


def test_top_and_head_names():
    t = make()
    best = t.top("mean_distance", 1)[0]
    assert t["mean_distance"][best[0], best[1]] == np.nanmax(t["mean_distance"])
    assert head_name(3, 7) == "L3H7" and parse_head("l3h7") == (3, 7)
    with pytest.raises(HeadscopeError, match="L<layer>H<head>"):
        parse_head("3.7")
