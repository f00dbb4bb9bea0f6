"""The page's JSON is declared once (headscope/view/card_schema.py) and checked on both sides: what the server
sends for a real tiny model validates against the declaration, every field view.js reads is declared, and every
declared field is read by view.js or marked not shown. Renaming a field on either side fails here."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

import numpy as np
import pandas as pd
import pytest
from test_view import dirs, evidence  # noqa: F401  (the tiny BERT and its real analyze/roles/score outputs)
from view_support import get, serving

from headscope import load_model
from headscope.view import card_schema
from headscope.view.card_schema import ROOTS, HeadsTable, PageInfo, json_name, problems_of, shown
from headscope.view.heads import heads_table

SCRIPT = Path(card_schema.__file__).parent / "assets" / "view.js"
_HEADER = re.compile(r"^// schema: (\w+) (\w+)$", re.M)
# a JS string, template or comment (blanked before reading field accesses); left to right, so a quote inside a
# comment or "//" inside a string is skipped with what holds it
_NOT_CODE = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|`(?:\\.|[^`\\])*`|//[^\n]*|/\*.*?\*/', re.S)


def _record(tp: Any) -> type[Any] | None:
    """The record class a field's type holds directly (`X`, `X | None`), else None (a list, a dict, a scalar)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        found = [t for t in typing.get_args(tp) if t is not type(None)]
        tp = found[0] if len(found) == 1 else None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _records() -> list[type[Any]]:
    """Every record class the roots reach (through fields, lists, dicts and None), each once."""
    seen: list[type[Any]] = []

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if tp not in seen:
                seen.append(tp)
                for t in typing.get_type_hints(tp).values():
                    visit(t)
        for t in typing.get_args(tp):
            visit(t)

    for root in ROOTS:
        visit(root)
    return seen


def script_problems(js: str) -> list[str]:
    """Where view.js and the declared records disagree: a field read that is not declared, a declared field shown
    but never read, a field marked not shown but read, a header naming no record."""
    records = {cls.__name__: cls for cls in _records()}
    names = dict(_HEADER.findall(js))
    problems = [f"the header names {rec}, which is not a declared record" for rec in names.values()
                if rec not in records]
    code = _NOT_CODE.sub('""', js)
    read: set[tuple[type[Any], str]] = set()
    for name, rec in names.items():
        if rec not in records:
            continue
        for chain in re.findall(rf"(?<![\w$.]){re.escape(name)}((?:\s*\.\s*[A-Za-z_$][\w$]*)+)", code):
            cls: type[Any] | None = records[rec]
            for attr in re.findall(r"[A-Za-z_$][\w$]*", chain):
                if cls is None:
                    break  # past the records: a list's or string's own members (.length, .filter)
                fields = {json_name(f): f for f in dataclasses.fields(cls)}
                if attr not in fields:
                    problems.append(f"view.js reads {name}{chain}: {attr!r} is not a field of {cls.__name__}")
                    break
                read.add((cls, attr))
                cls = _record(typing.get_type_hints(cls)[fields[attr].name])
    for cls in records.values():
        for f in dataclasses.fields(cls):
            key = json_name(f)
            if shown(f) and (cls, key) not in read:
                problems.append(f"{cls.__name__}.{key} is declared shown but view.js never reads it")
            if not shown(f) and (cls, key) in read:
                problems.append(f"{cls.__name__}.{key} is marked not shown but view.js reads it")
    return problems


def _present(value: Any, tp: Any, found: set[tuple[str, str]]) -> None:
    """Add (record, key) for every key present in a JSON value of declared type `tp`, and (record, "") for
    every record met."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        if value is not None:
            _present(value, next(t for t in typing.get_args(tp) if t is not type(None)), found)
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        found.add((tp.__name__, ""))
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            if json_name(f) in value:
                found.add((tp.__name__, json_name(f)))
                _present(value[json_name(f)], hints[f.name], found)
    elif typing.get_origin(tp) is list:
        for v in value:
            _present(v, typing.get_args(tp)[0], found)
    elif typing.get_origin(tp) is dict:
        for v in value.values():
            _present(v, typing.get_args(tp)[1], found)


@pytest.fixture(scope="module")
def circuit(tmp_path_factory) -> Path:
    """A circuit's edges.csv (into a head's query and into a KV group's keys) and an attribution-only
    patching.csv for the tiny BERT (2 layers x 4 heads), in their declared formats."""
    out = tmp_path_factory.mktemp("circuit")
    rows = [("input", "L0H0.q", 0.5), ("L0H0", "L1H1.q", -2.0), ("L0H1", "L1G1.k", 3.0), ("L0H0", "logits", 1.0)]
    pd.DataFrame([{"sender": s, "receiver": r, "score": v, "score_lo": v - 0.1, "score_hi": v + 0.1}
                  for s, r, v in rows]).to_csv(out / "edges.csv", index=False)
    attribution = np.random.default_rng(1).normal(0, 0.2, 8)
    pd.DataFrame({"layer": np.repeat([0, 1], 4), "head": np.tile(range(4), 2),
                  "attribution": attribution}).to_csv(out / "patching.csv", index=False)
    return out


def test_what_the_server_sends_is_what_the_schema_declares(dirs, evidence, circuit, tmp_path):  # noqa: F811
    hm = load_model(str(dirs["bert"]))
    found: set[tuple[str, str]] = set()
    for folders in ([], [evidence, circuit], [circuit]):
        with serving(hm, heads_table(hm, folders)) as (base, _):
            status, table = get(base + "/api/heads")
            assert status == 200, table
            status, info = get(base + "/api/model")
            assert status == 200, info
        assert table["problems"] == [], (folders, table["problems"])
        assert problems_of(table, HeadsTable) == [], folders
        assert problems_of(info, PageInfo) == []
        _present(table, HeadsTable, found)
        _present(info, PageInfo, found)
    # every record and every key that may be absent was sent at least once: each branch of the builder ran
    for cls in _records():
        assert (cls.__name__, "") in found, f"no {cls.__name__} was sent"
        for f in dataclasses.fields(cls):
            assert (cls.__name__, json_name(f)) in found, f"{cls.__name__}.{json_name(f)} was never sent"
    # a renamed, a missing or a mistyped key is caught
    with serving(hm, heads_table(hm, [evidence, circuit])) as (base, _):
        table = get(base + "/api/heads")[1]
    kv = table["kvcache"][0]
    kv["title"] = kv.pop("label")
    assert problems_of(table, HeadsTable) == ["$.kvcache[0]: 'title' is not a field of KvChoice",
                                              "$.kvcache[0]: KvChoice.label is missing"]
    kv["label"], table["patching"]["measure"] = kv.pop("title"), 1
    assert problems_of(table, HeadsTable) == ["$.patching.measure: expected str, got 1"]


def test_every_field_view_js_reads_is_declared_and_every_declared_field_is_read():
    js = SCRIPT.read_text(encoding="utf-8")
    assert dict(_HEADER.findall(js)).keys() >= {"INFO", "H"}
    assert script_problems(js) == []
    # the heads table is read only under its declared name: `const H = state.heads || {}`
    allowed = re.findall(r"const H = state\.heads \|\| \{\}|state\.heads = await api\(\"/api/heads\"\)", js)
    assert len(allowed) == js.count("state.heads") > 1


@pytest.mark.parametrize("old, new, says", [
    ("kv.label", "kv.title", "'title' is not a field of KvChoice"),  # a field renamed in the script
    ("edges.in)", "edges.incoming)", "'incoming' is not a field of EdgeLists"),  # the Python name, not the JSON key
    ("H.patching.measure", "H.patching.kind", "'kind' is not a field of Patching"),  # nested through a chain
    ("INFO.max_chars", "INFO.max_characters", "'max_characters' is not a field of PageInfo"),
    ("rd.help", "rd.note", "RoleDetail.help is declared shown but view.js never reads it"),
    ("// schema: kv KvChoice", "// schema: kv KvChoices", "the header names KvChoices"),
])
def test_a_field_renamed_in_the_script_fails(old, new, says):
    js = SCRIPT.read_text(encoding="utf-8")
    assert old in js
    found = script_problems(js.replace(old, new))
    assert any(says in p for p in found), found


def test_a_field_renamed_in_the_schema_fails(monkeypatch):
    """The schema's side of a rename: KvChoice's `label` declared as `title` leaves view.js reading a field the
    schema does not have (and the schema's `title` unread)."""
    renamed = dataclasses.make_dataclass("KvChoice", [("title", str), ("full", list[bool]), ("window", int | None),
                                                      ("sink", int | None)])
    monkeypatch.setattr(card_schema, "KvChoice", renamed)
    found = script_problems(SCRIPT.read_text(encoding="utf-8"))
    assert any("'label' is not a field of KvChoice" in p for p in found), found
    assert "KvChoice.title is declared shown but view.js never reads it" in found
