"""The gqa package's homes: the grouping registry, evaluation through eval.lm, uptraining through Trainer,
and its module structure (no cycle, no unexplained function-local import, no module over ~500 lines)."""

from __future__ import annotations

import argparse
import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from headscope.capacity import gqa
from headscope.data import batches, pad_id
from headscope.errors import HeadscopeError
from headscope.eval.lm import compare_lms
from headscope.models.tiny import tiny_model

CALIB = [list(range(5, 40)), list(range(60, 90)), list(range(30, 70)), list(range(90, 119))]
PACKAGE = Path(gqa.__file__).parent


def test_every_registered_grouping_gives_a_valid_split_and_converts():
    hm = tiny_model("llama", init_std=0.2, num_key_value_heads=6)
    assert gqa.GROUPINGS.names() == ("mean", "similarity", "search", "random")
    for name in gqa.GROUPINGS:
        assert gqa.GROUPINGS.get(name).help, name
        for g in (3, 2):
            plan = gqa.plan_groups(hm, g, name, CALIB, search_candidates=2)
            assert plan["grouping"] == name and plan["grouping_used"], plan
            for layer, groups in enumerate(plan["groups"]):
                assert gqa.check_groups(groups, 6, g, layer) == groups, (name, g, groups)
            out = gqa.convert_to_gqa(hm, g, groups=plan["groups"])
            assert out.n_kv_heads == g and out.qkv_weights(0).k.shape[0] == g * hm.d_head


def test_random_grouping_is_seeded_and_matches_random_balanced_groups():
    hm = tiny_model("llama", num_key_value_heads=6)
    a = gqa.plan_groups(hm, 2, "random", seed=4)
    assert a == gqa.plan_groups(hm, 2, "random", seed=4)
    rng = np.random.default_rng(4)
    assert a["groups"] == [gqa.random_balanced_groups(6, 2, rng) for _ in range(hm.n_layers)]
    assert a["grouping_used"] == "random"
    assert gqa.plan_groups(hm, 2, "random", seed=5)["groups"] != a["groups"]
    one = gqa.plan_groups(hm, 1, "random")
    assert one["grouping_used"].startswith("random (only one grouping possible")
    assert one["groups"] == [[list(range(6))]] * hm.n_layers


def test_unknown_grouping_suggests_the_nearest_name():
    hm = tiny_model("llama")
    for call in (lambda: gqa.plan_groups(hm, 1, "similarty"), lambda: gqa.convert_to_gqa(hm, 1, "similarty")):
        with pytest.raises(HeadscopeError, match=r"unknown grouping 'similarty' \(did you mean 'similarity'\?\)"):
            call()


def test_a_new_grouping_is_one_registered_function(monkeypatch):
    """Registering a grouping makes plan_groups, convert_to_gqa and the CLI accept it, with no dispatch edits."""
    from headscope.commands import gqa as command  # the verb reads the registry when its parser is built

    monkeypatch.setattr(gqa.GROUPINGS, "_entries", dict(gqa.GROUPINGS._entries))  # undone after the test

    @gqa.GROUPINGS.register("reversed", help="adjacent groups, numbered backwards (a test grouping)")
    def reversed_grouping(hm, kv_heads, opts):
        m = hm.n_kv_heads // kv_heads
        return {
            "grouping_used": "reversed",
            "groups": [[list(range(hm.n_kv_heads))[::-1][j * m : (j + 1) * m] for j in range(kv_heads)]] * hm.n_layers,
        }

    hm = tiny_model("llama", num_key_value_heads=6)
    assert gqa.plan_groups(hm, 3, "reversed")["groups"][0] == [[5, 4], [3, 2], [1, 0]]
    assert gqa.convert_to_gqa(hm, 3, "reversed").n_kv_heads == 3
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    command.register(sub)
    args = parser.parse_args(["gqa", "m", "--kv-heads", "1", "--grouping", "reversed"])
    assert args.grouping == "reversed"
    helptext = " ".join(sub.choices["gqa"].format_help().split())
    assert "reversed: adjacent groups, numbered backwards (a test grouping)" in helptext, helptext


def test_compare_counts_padded_batches_like_single_passages():
    """compare_lms over right-padded batches equals the same figures passage by passage (no padding)."""
    hm = tiny_model("llama", init_std=0.2)
    conv = gqa.convert_to_gqa(hm, 1)
    padded = list(batches(CALIB, 3, pad_id(hm)))
    assert any((b.attention_mask == 0).any() for b in padded)
    single = list(batches(CALIB, 1, pad_id(hm)))
    a = compare_lms(hm.model, {"c": conv.model}, padded)
    b = compare_lms(hm.model, {"c": conv.model}, single)
    assert a["reference"]["tokens"] == b["reference"]["tokens"] == sum(len(t) - 1 for t in CALIB)
    for key in (("reference", "ppl"), ("c", "ppl"), ("c", "kl")):
        got, want = a[key[0]][key[1]], b[key[0]][key[1]]
        assert abs(got - want) <= 1e-5 * want, f"{key}: padded {got} vs single {want}, diff {abs(got - want):.3g}"
    # gqa.compare is the same computation on prepared data
    assert gqa.compare(hm, {"c": conv}, CALIB, batch_size=3) == a
    # by hand: exp of the mean NLL over every predicted token
    nll = 0.0
    with torch.no_grad():
        for t in CALIB:
            ids = torch.tensor([t])
            logp = torch.log_softmax(hm.model(ids).logits[0, :-1], -1)
            nll -= float(logp.gather(-1, ids[0, 1:, None]).sum())
    want = math.exp(nll / a["reference"]["tokens"])
    assert abs(a["reference"]["ppl"] - want) <= 1e-5 * want, (a["reference"]["ppl"], want)


def test_uptraining_is_repeatable_for_a_seed_and_visits_every_batch():
    hm = tiny_model("llama", init_std=0.2)
    student = gqa.convert_to_gqa(hm, 1)
    runs = [gqa.uptrain(student, CALIB, 6, teacher=hm, lr=1e-3, batch_size=1, seed=s)[1].losses for s in (3, 3, 4)]
    assert runs[0] == runs[1], runs
    assert runs[0] != runs[2], runs
    # one pass over the data visits each of its 4 batches once: the first 4 losses are those 4 batches'
    # losses at the (slightly moving) weights, so a seed only reorders them
    _, log = gqa.uptrain(student, CALIB, 4, teacher=hm, lr=1e-12, batch_size=1, seed=3)
    first = sorted(log.losses)
    each = sorted(gqa.kl_divergence(hm, student, [t]) for t in CALIB)
    assert np.allclose(first, each, rtol=1e-5, atol=0), (first, each)
    assert log.settings["grad_clip"] == 1.0 and log.settings["optimizer"] == "AdamW"


def _imports(path: Path) -> tuple[set[str], list[tuple[int, str]]]:
    """gqa submodules `path` imports at module level, and function-local imports (line, source line)."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    local: list[tuple[int, str]] = []
    lines = path.read_text().splitlines()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                top.add(node.module.split(".")[0])
            else:
                top.update(a.name for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    local.append((inner.lineno, lines[inner.lineno - 1]))
    return top, local


def test_package_has_no_cycle_no_unexplained_local_import_and_small_modules():
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    graph = {}
    for name, path in modules.items():
        top, local = _imports(path)
        graph[name] = top & modules.keys()
        for lineno, line in local:
            assert "#" in line, f"{path.name}:{lineno}: function-local import without a reason comment: {line.strip()}"
        n = len(path.read_text().splitlines())
        assert n <= 500, f"{path.name} has {n} lines"
    # depth-first search for a cycle among the submodules
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for dep in graph[m]:
            assert state.get(dep) != 1, f"import cycle: {' -> '.join(trail + [m, dep])}"
            if dep not in state:
                visit(dep, trail + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])
