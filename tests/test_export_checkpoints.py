"""No silent broken load: every kind of checkpoint a verb writes either loads in plain transformers
(`AutoModelForCausalLM.from_pretrained(path)`, no remote code) with headscope's own logits, or plain
transformers refuses it with an error that says how to load it, because its config.json names a model_type
of its own (never the base family's); then `trust_remote_code=True` loads it with headscope's logits.

The checkpoints are written by the verbs themselves (prune, prune --unit, gqa, mla, with recovery and
uptraining) on a tiny LLaMA, and by the API; one fresh process (no headscope imported) tries each both ways."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from headscope.cli import main
from headscope.models.checkpoint import load_checkpoint, save_model
from headscope.models.tiny import tiny_model
from headscope.redundancy.pruning import UnitMask, prune_heads, prune_units
from tests.test_artifacts import tiny_llama_dir

TOL = 1e-5
IDS = torch.randint(3, 20, (2, 9), generator=torch.Generator().manual_seed(3))
PLAIN = {"heads-uniform", "blocks", "gqa", "gqa-uptrained", "prune-uniform-recovered"}


def _checkpoints(base: Path) -> dict[str, Path]:
    """Every kind of checkpoint, written by the verbs (tiny LLaMA with a tokenizer) or the API."""
    src, text = tiny_llama_dir(base)
    data = ["--data", str(text), "--max-length", "12"]
    conv = [*data, "--heldout", str(text), "--limit", "4", "--heldout-limit", "4", "--batch-size", "2"]
    runs = {
        "heads-free-recovered": ["prune", str(src), "--fraction", "0.34", "--step", "0.34", "--recover-steps", "1",
                                 "--save-model", "--unit", "group", *data],
        "prune-uniform-recovered": ["prune", str(src), "--fraction", "0.34", "--uniform", "--recover-steps", "1",
                                    "--save-model", *data],
        "units-ffn": ["prune", str(src), "--unit", "ffn", "--fraction", "0.2", "--step", "0.2", "--save-model", *data],
        "units-mix": ["prune", str(src), "--unit", "mix", "--fraction", "0.5", "--step", "0.5", "--save-model",
                      *data],
        "gqa-uptrained": ["gqa", str(src), "--kv-heads", "1", "--steps", "1", *conv],
        "mla": ["mla", str(src), "--kv-rank", "6", "--rope-dims", "2", *conv],
        "mla-uptrained": ["mla", str(src), "--kv-rank", "6", "--rope-dims", "2", "--steps", "1", *conv],
    }
    paths = {}
    for kind, argv in runs.items():
        out = base / kind
        assert main([*argv, "--out", str(out)]) == 0, kind
        paths[kind] = out / "model"
    hm = tiny_model("llama", init_std=0.2)
    # Free pruning: layer 0 keeps 4 heads (2 per KV group), layer 1 keeps 3 (one whole KV group goes).
    paths["heads-free"] = save_model(prune_heads(hm, {0: [0, 3], 1: [3, 4, 5]}), base / "heads-free")
    # The same per-KV-group count in every layer: an ordinary LLaMA config.
    paths["heads-uniform"] = save_model(prune_heads(hm, {0: [0, 3], 1: [1, 5]}), base / "heads-uniform")
    paths["blocks"] = save_model(prune_units(hm, UnitMask(block=torch.tensor([1.0, 0.0]))), base / "blocks")
    from headscope.capacity.gqa import convert_to_gqa
    paths["gqa"] = save_model(convert_to_gqa(hm, 1, "mean"), base / "gqa")
    return paths


SCRIPT = textwrap.dedent("""
    import json, sys, torch, transformers
    paths, ids = json.loads(sys.argv[1]), torch.load(sys.argv[2])
    out = {}
    for kind, path in paths.items():
        config = json.load(open(path + "/config.json"))
        row = {"model_type": config["model_type"]}
        try:
            m = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
            with torch.no_grad():
                row["plain"] = m(ids).logits
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"
        m = transformers.AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True).eval()
        with torch.no_grad():
            row["remote"] = m(ids).logits
        out[kind] = row
    out["imported"] = sorted(k for k in sys.modules if k.startswith("headscope"))
    torch.save(out, sys.argv[3])
""")


@pytest.fixture(scope="module")
def loads(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("ckpt")
    paths = _checkpoints(base)
    torch.save(IDS, base / "ids.pt")
    env = {**os.environ, "HF_MODULES_CACHE": str(base / "modules"), "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps({k: str(p) for k, p in paths.items()}),
                          str(base / "ids.pt"), str(base / "out.pt")], env=env, capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    got = torch.load(base / "out.pt")
    assert got.pop("imported") == [], "the fresh process imported headscope"
    for kind, path in paths.items():
        with torch.no_grad():
            got[kind]["headscope"] = load_checkpoint(path).model(IDS).logits
        got[kind]["base"] = json.loads((path / "config.json").read_text()).get("headscope_base")
    return got


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("kind", ["heads-free", "heads-uniform", "heads-free-recovered", "prune-uniform-recovered",
                                  "units-ffn", "units-mix", "blocks", "gqa", "gqa-uptrained", "mla", "mla-uptrained"])
def test_loads_plain_with_headscope_logits_or_refuses_naming_its_own_type(loads, kind):
    row = loads[kind]
    if kind in PLAIN:
        assert "error" not in row, f"{kind}: plain transformers refused a plain checkpoint: {row['error'][:300]}"
        assert row["model_type"] == "llama" and row["base"] is None
        d = _diff(row["plain"], row["headscope"])
        assert d < TOL, f"{kind}: plain from_pretrained != headscope: max abs diff {d:.3g}"
    else:
        assert "plain" not in row, f"{kind}: plain transformers loaded a checkpoint it cannot build " \
                                   f"({row['model_type']})"
        assert "trust_remote_code=True" in row["error"], row["error"][:300]
        own = "mla" if kind.startswith("mla") else "pruned"
        assert row["model_type"] == f"headscope_{own}_llama" and row["base"]["model_type"] == "llama"
    d = _diff(row["remote"], row["headscope"])
    assert d < TOL, f"{kind}: trust_remote_code != headscope: max abs diff {d:.3g}"
