"""Every checkpoint that prune, gqa and mla write loads the way headscope says it does, for every family.

For each family in `headscope models` (tests/families.py: one tiny model per family, carrying its real
configuration's peculiarities), the library calls behind the verbs write their checkpoints: a uniform prune (the
same heads per KV group in every layer), a free one (layers differ), a GQA conversion and an MLA conversion
(each where the family allows it; a refusal must be a HeadscopeError naming the reason). Then ONE fresh process
(no headscope imported) loads every checkpoint the way its config says: a plain config with plain
`Auto*.from_pretrained(path)`, one of headscope's own model types with `trust_remote_code=True`, after plain
transformers refused it naming trust_remote_code. Each load must give the written model's outputs, and
`checkpoint_load_with` (what `prune` prints) must say the same as the config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.models import HeadModel
from headscope.models.checkpoint import auto_class, how_it_loads, is_plain_checkpoint, load_checkpoint, save_model
from headscope.models.own_type import read_config
from tests.families import DECODERS, FAMILIES, KV_FAMILIES, PRUNABLE, head_layers, model

IDS = torch.randint(5, 120, (2, 11), generator=torch.Generator().manual_seed(5))
TOL = 2e-5  # float32, eager attention on both sides: only summation order differs

SCRIPT = textwrap.dedent("""
    import json, sys, torch, transformers
    jobs, ids = json.loads(sys.argv[1]), torch.load(sys.argv[2])
    out = {}
    for name, (path, auto) in jobs.items():
        cls = getattr(transformers, auto)
        row = {}
        try:
            m = cls.from_pretrained(path, attn_implementation="eager").eval()
            with torch.no_grad():
                row["plain"] = m(ids)[0]
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        if "error" in row:
            try:
                m = cls.from_pretrained(path, trust_remote_code=True, attn_implementation="eager").eval()
                with torch.no_grad():
                    row["remote"] = m(ids)[0]
            except Exception as e:
                row["remote_error"] = f"{type(e).__name__}: {e}"
        out[name] = row
    out["imported"] = sorted(k for k in sys.modules if k.startswith("headscope"))
    torch.save(out, sys.argv[3])
""")


def _uniform(hm: HeadModel) -> dict[int, list[int]]:
    """The last query head of every KV group (MHA: the last head) in every layer with heads."""
    g = hm.group_size
    last = [k * g + g - 1 for k in range(hm.n_kv_heads)] if g > 1 else [hm.n_heads - 1]
    return {layer: last for layer in head_layers(hm)}


def _free(hm: HeadModel) -> dict[int, list[int]]:
    """One head of every KV group in the first layer with heads only: the layers' head counts differ."""
    return dict(list(_uniform(hm).items())[:1])


def _written(family: str, base: Path) -> tuple[dict[str, Path], dict[str, torch.Tensor], dict[str, str]]:
    """The family's checkpoints, the outputs of the models written, and the refusals met (kind -> message)."""
    from headscope.capacity.gqa import convert_to_gqa  # the stages, as the verbs call them
    from headscope.capacity.mla import convert_to_mla
    from headscope.capacity.mla.checkpoint import save_mla
    from headscope.redundancy.pruning import prune_heads

    hm = model(family)
    made: dict[str, HeadModel] = {}
    refused: dict[str, str] = {}
    if family in PRUNABLE:
        made["prune-uniform"] = prune_heads(hm, _uniform(hm))
        made["prune-free"] = prune_heads(hm, _free(hm))
    if family in KV_FAMILIES and hm.n_kv_heads > 1:
        made["gqa"] = convert_to_gqa(hm, 1, "mean")
    if family in DECODERS:
        try:
            made["mla"] = convert_to_mla(hm, 4, selection="high")
        except HeadscopeError as e:
            refused["mla"] = str(e)
    paths, outputs = {}, {}
    for kind, small in made.items():
        path = base / family / kind
        (save_mla if kind == "mla" else save_model)(small, path)
        paths[f"{family}/{kind}"] = path
        with torch.no_grad():
            outputs[f"{family}/{kind}"] = small.model(IDS)[0]
    return paths, outputs, refused


@pytest.fixture(scope="module")
def loads(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("families")
    paths, outputs, refused = {}, {}, {}
    for family in FAMILIES:
        p, o, r = _written(family, base)
        paths.update(p)
        outputs.update(o)
        refused.update({f"{family}/{k}": v for k, v in r.items()})
    torch.save(IDS, base / "ids.pt")
    jobs = {name: (str(p), auto_class(read_config(p)).__name__)
            for name, p in paths.items()}
    env = {**os.environ, "HF_MODULES_CACHE": str(base / "modules"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(jobs), str(base / "ids.pt"), str(base / "out.pt")],
                         env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    got = torch.load(base / "out.pt")
    assert got.pop("imported") == [], "the fresh process imported headscope"
    return {"paths": paths, "outputs": outputs, "refused": refused, "got": got}


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_checkpoint_loads_the_way_headscope_says(loads, family):
    names = [n for n in loads["paths"] if n.split("/")[0] == family]
    assert names or family not in PRUNABLE, family
    for name in names:
        path, row, want = loads["paths"][name], loads["got"][name], loads["outputs"][name]
        cfg = json.loads((path / "config.json").read_text())
        plain = is_plain_checkpoint(path)
        assert plain == ("headscope_base" not in cfg), name
        # what prune, gqa and mla print about loading it
        assert ("plain config" in how_it_loads(path)) == plain and ("trust_remote_code" in how_it_loads(path)) != plain
        if plain:
            assert "error" not in row, f"{name}: plain transformers refused a plain config: {row['error'][:400]}"
            assert _diff(row["plain"], want) < TOL, f"{name}: plain from_pretrained != the written model"
        else:
            assert "plain" not in row, f"{name}: plain transformers loaded {cfg['model_type']}, which it cannot build"
            assert "trust_remote_code" in row["error"], f"{name}: {row['error'][:400]}"
            assert cfg["model_type"].startswith("headscope_"), name
            assert "remote_error" not in row, f"{name}: trust_remote_code failed: {row.get('remote_error', '')[:400]}"
            assert _diff(row["remote"], want) < TOL, f"{name}: trust_remote_code != the written model"
        with torch.no_grad():  # and headscope's own loader, in this process
            assert _diff(load_checkpoint(path).model(IDS)[0], want) < TOL, f"{name}: load_checkpoint"
        if "prune" in name:  # the record says the same as the config
            record = json.loads((path / "headscope_pruning.json").read_text())
            assert bool(record.get("plain")) == plain, name


@pytest.mark.parametrize("family", [f for f in FAMILIES if f in DECODERS])
def test_mla_is_written_or_refused_with_a_reason(loads, family):
    name = f"{family}/mla"
    assert (name in loads["paths"]) != (name in loads["refused"]), name
    if name in loads["refused"]:
        assert family in loads["refused"][name] or "famil" in loads["refused"][name], loads["refused"][name]


def test_gemma3_uniform_prune_that_transformers_refuses_gets_its_own_type(loads):
    """Issue 35: 3 heads of a 32-wide Gemma-3 pass the meta build but not transformers' config validation."""
    name = "gemma3_text/prune-uniform"
    path = loads["paths"][name]
    assert not is_plain_checkpoint(path)
    assert json.loads((path / "config.json").read_text())["model_type"] == "headscope_pruned_gemma3_text"
    assert "trust_remote_code" in loads["got"][name]["error"]


def test_a_plain_config_transformers_refuses_is_one_line_on_the_command_line(tmp_path, capsys):
    """A checkpoint an older headscope wrote as plain (Gemma-3 with 3 heads in 32 wide, issue 35): analyze says
    in one line that transformers refuses its config and how to get one that loads (exit 2, not 1)."""
    from headscope.cli import main  # the command line: only this test runs it
    from headscope.redundancy.pruning import prune_heads

    hm = model("gemma3_text")
    path = save_model(prune_heads(hm, {0: [3], 1: [3]}), tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    plain = {k: v for k, v in cfg.items() if k not in ("headscope_base", "auto_map", "headscope_pruning")}
    plain.update(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], num_attention_heads=3)
    (path / "config.json").write_text(json.dumps(plain))
    (path / "headscope_pruning.json").unlink()
    capsys.readouterr()
    assert main(["analyze", str(path), "--limit", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refuses the config" in err[0] and "not a multiple of the number of attention heads" \
        in err[0] and "prune again" in err[0], err


@pytest.mark.parametrize("verb, extra, plain", [("gqa", ["--kv-heads", "1"], True),
                                                ("mla", ["--kv-rank", "6", "--rope-dims", "2"], False)])
def test_gqa_and_mla_last_line_says_how_the_model_loads(tmp_path, capsys, verb, extra, plain):
    """The last line of gqa and mla names how the checkpoint they wrote loads, read from the folder."""
    from headscope.cli import main  # the command line: only these tests run it
    from tests.test_artifacts import tiny_llama_dir

    src, text = tiny_llama_dir(tmp_path)
    argv = [verb, str(src), *extra, "--data", str(text), "--heldout", str(text), "--max-length", "12",
            "--data-limit", "4", "--heldout-limit", "4", "--batch-size", "2", "--out", str(tmp_path / "o")]
    capsys.readouterr()
    assert main(argv) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert is_plain_checkpoint(tmp_path / "o" / "model") == plain
    assert last.endswith(how_it_loads(tmp_path / "o" / "model")), last
    assert ("AutoModel*.from_pretrained(path) loads it" in last) == plain, last
