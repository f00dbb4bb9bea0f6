"""--dtype, --device and --device-map: bf16/fp16 statistics against float32, models dispatched over
CPU memory and disk (accelerate) against the same model in memory, and the bad inputs (issue 12)."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from test_artifacts import tiny_bert_dir
from test_bad_input import refused

from headscope import load_model
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.eval.lm import compare_lms
from headscope.hooks import capture_head_outputs, head_gates
from headscope.learned.analyze import analyze
from headscope.models.checkpoint import save_model
from headscope.models.dispatch import input_device, is_dispatched
from headscope.models.loading import resolve_dtype
from headscope.models.tiny import tiny_model
from headscope.provenance import model_fingerprint
from headscope.redundancy.pruning.heads import prune_heads
from headscope.train import Trainer

# Passages of token ids (lengths differ, so batches are padded), the same for every test.
_g = torch.Generator().manual_seed(0)
IDS = [torch.randint(3, 120, (n,), generator=_g).tolist() for n in (12, 9, 16, 5)]
T = max(map(len, IDS))
# bfloat16 keeps 8 significant bits: unit roundoff u = 2**-8. Each attention probability of the bf16
# model is the float32 one up to a few u (q, k, v and the residual stream are rounded to bf16 once per
# op); statistics are averages of them, so a mass or a max weight moves by at most ~2u absolute, an
# entropy by ~2u * log(T) nats, a mean distance by ~2u * T positions, an output norm by ~2u relative.
# Measured on these models: masses <= 1.1e-3, mean distance <= 5.2e-3, output norm <= 0.2% relative.
BF16_U = 2.0 ** -8
FP16_U = 2.0 ** -11  # float16 keeps 11 significant bits


def _tolerance(column: str, u: float) -> tuple[float, float]:
    """(atol, rtol) for a statistic of a model whose weights and activations are rounded to unit roundoff u."""
    if column == "entropy":
        return 2 * u * math.log(T), 0.0
    if column == "mean_distance":
        return 2 * u * T, 0.0
    if column == "output_norm":
        return 0.0, 2 * u
    return 2 * u, 0.0  # probability masses, normalised entropy, max weight


def _saved(tmp_path: Path, family: str, **kw) -> str:
    path = tmp_path / family
    save_model(tiny_model(family, **kw), path)
    return str(path)


def _columns(table) -> dict[str, np.ndarray]:
    """The statistics (not their interval bounds: a bootstrap quantile of a few passages moves in steps)."""
    return {c: np.asarray(table[c], float) for c in table.columns
            if not c.endswith(("_lo", "_hi")) and not np.isnan(np.asarray(table[c], float)).all()}


def test_dtype_names():
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype(torch.float16) is torch.float16
    with pytest.raises(HeadscopeError, match=r"dtype 'bfloat61' is not supported \(did you mean 'bfloat16'\?\)"):
        resolve_dtype("bfloat61")
    with pytest.raises(HeadscopeError, match="'float64' is not supported.*float32, bfloat16, float16"):
        resolve_dtype(torch.float64)


@pytest.mark.parametrize("family", ["llama", "bert", "gpt2"])
@pytest.mark.parametrize("dtype,u", [("bfloat16", BF16_U), ("float16", FP16_U)])
def test_low_precision_statistics_close_to_float32(tmp_path, caplog, family, dtype, u):
    # init_std 0.2: peaked attention (max weight up to ~0.66), so rounding shows; at GPT-2's 0.02 it hides.
    path = _saved(tmp_path, family, init_std=0.2)
    ref = load_model(path)
    with caplog.at_level(logging.WARNING, logger="headscope.models.loading"):
        low = load_model(path, dtype=dtype)
    assert low.dtype == getattr(torch, dtype) and low.model.get_input_embeddings().weight.dtype == low.dtype
    assert ("float16 on CPU" in caplog.text) == (dtype == "float16")  # allowed on CPU, with a clear warning
    a, b = _columns(analyze(ref, IDS, batch_size=2)), _columns(analyze(low, IDS, batch_size=2))
    assert a.keys() == b.keys()
    moved = 0.0
    for c in a:
        assert b[c].dtype == np.float64  # accumulated in float64 whatever the model computes in
        atol, rtol = _tolerance(c, u)
        diff = np.abs(a[c] - b[c])
        assert np.all(diff <= atol + rtol * np.abs(a[c])), (
            f"{c}: max abs diff {diff.max():.3g} (atol {atol:.3g}, rtol {rtol:.3g})"
        )
        moved = max(moved, float(diff.max()))
    assert moved > 0  # the low-precision model really ran in its dtype


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> str:
    return _saved(tmp_path_factory.mktemp("dispatch"), "llama", init_std=0.2)


# Layer 0 in memory, layer 1 and the LM head on disk, the embeddings offloaded too: every kind of placement.
DEVICE_MAP = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk",
              "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}


@pytest.fixture()
def pair(llama_dir, tmp_path):
    """The tiny LLaMA in memory, and the same checkpoint dispatched with part of it on disk."""
    ref = load_model(llama_dir)
    hm = load_model(llama_dir, device_map=DEVICE_MAP, offload_folder=tmp_path / "offload")
    assert is_dispatched(hm.model) and not is_dispatched(ref.model)
    assert any(p.is_meta for p in hm.model.parameters())  # offloaded weights wait on the meta device
    return ref, hm


def test_dispatched_device_and_fingerprint(pair):
    ref, hm = pair
    assert hm.device == torch.device("cpu") == input_device(hm.model)
    assert model_fingerprint(hm.model, hm.config) == model_fingerprint(ref.model, ref.config)


def test_dispatched_statistics_gates_capture_equal(pair):
    ref, hm = pair
    a, b = _columns(analyze(ref, IDS, batch_size=2)), _columns(analyze(hm, IDS, batch_size=2))
    for c in a:  # the same float32 arithmetic in the same order: equal to the last bit
        assert np.array_equal(a[c], b[c]), f"{c}: max abs diff {np.abs(a[c] - b[c]).max():.3g}"
    e = _columns(analyze(hm, IDS, batch_size=2, eager=True))  # eager attention's full maps, switched for the run
    for c in a:
        assert np.allclose(a[c], e[c], rtol=1e-5, atol=1e-6), f"{c}: max abs diff {np.abs(a[c] - e[c]).max():.3g}"
    ids = torch.tensor([IDS[2]])
    gates = torch.ones(ref.n_layers, ref.n_heads)
    gates[1, 2], gates[0, 5] = 0.0, 0.5
    got: dict = {}
    with torch.no_grad():
        with head_gates(ref, gates), capture_head_outputs(ref, got):
            want, want_z = ref.model(ids).logits, dict(got)
        with head_gates(hm, gates), capture_head_outputs(hm, got):
            out = hm.model(ids.to(hm.device)).logits
    assert torch.equal(want, out), f"gated logits: max abs diff {(want - out).abs().max():.3g}"
    for layer in want_z:
        assert torch.equal(want_z[layer], got[layer]), f"layer {layer} head outputs differ"


def test_dispatched_eval_and_weights(pair):
    ref, hm = pair
    batch = type(
        "B", (), {"input_ids": torch.tensor([IDS[0][:9], IDS[1]]), "attention_mask": torch.ones(2, 9, dtype=torch.long)}
    )
    assert compare_lms(ref.model, {"d": hm.model}, [batch])["d"]["kl"] == 0.0
    for layer in range(ref.n_layers):
        wa, wb = ref.qkv_weights(layer), hm.qkv_weights(layer)
        assert torch.equal(wa.q, wb.q) and torch.equal(wa.k, wb.k) and torch.equal(wa.v, wb.v)
        assert torch.equal(ref.out_weight(layer), hm.out_weight(layer))
    assert all(p.is_meta for p in hm.layers[1].self_attn.parameters())  # reading loaded nothing for good
    # Writing goes to memory (an offload store would hand back the old weights at the next forward).
    ref.permute_heads(1, [4, 3, 5, 1, 2, 0])
    hm.permute_heads(1, [4, 3, 5, 1, 2, 0])
    ids = torch.tensor([IDS[0]])
    with torch.no_grad():
        assert torch.equal(ref.model(ids).logits, hm.model(ids).logits)


def test_dispatched_pruning(pair, tmp_path):
    ref, hm = pair
    heads = {1: [0, 1, 2], 0: [3, 4, 5]}  # whole KV groups (group size 3)
    pa, pb = prune_heads(ref, heads), prune_heads(hm, heads)
    ids = torch.tensor([IDS[2]])
    with torch.no_grad():
        want = pa.model(ids).logits
        assert torch.equal(want, pb.model(ids).logits)
        assert torch.equal(ref.model(ids).logits, hm.model(ids).logits)  # the dispatched input is untouched
    save_model(pb, tmp_path / "pruned")
    with torch.no_grad():
        assert torch.equal(want, load_model(str(tmp_path / "pruned")).model(ids).logits)


def test_dispatched_gqa_conversion(pair):
    from headscope.capacity.gqa import convert_to_gqa

    ref, hm = pair
    a, b = convert_to_gqa(ref, 1), convert_to_gqa(hm, 1)  # 2 -> 1 KV heads: K/V projections change shape
    assert b.n_kv_heads == 1 and b.qkv_weights(1).k.shape == a.qkv_weights(1).k.shape == (ref.d_head, ref.d_model)
    ids = torch.tensor([IDS[2]])
    with torch.no_grad():
        want = a.model(ids).logits
        assert torch.equal(want, b.model(ids).logits), f"max abs diff {(want - b.model(ids).logits).abs().max():.3g}"
        assert not torch.equal(want, ref.model(ids).logits)  # the conversion changed something
        assert torch.equal(ref.model(ids).logits, hm.model(ids).logits)  # and left the dispatched input alone


def test_max_memory_forces_disk_offload(llama_dir, tmp_path):
    ref = load_model(llama_dir)
    hm = load_model(llama_dir, device_map="auto", max_memory={"cpu": 150_000}, offload_folder=tmp_path / "off")
    assert "disk" in set(hm.model.hf_device_map.values()) and "cpu" in set(hm.model.hf_device_map.values())
    a, b = _columns(analyze(ref, IDS, batch_size=2)), _columns(analyze(hm, IDS, batch_size=2))
    assert all(np.array_equal(a[c], b[c]) for c in a)


def test_training_offloaded_parameters_refused(pair):
    _, hm = pair
    with pytest.raises(HeadscopeError, match="cannot train parameters offloaded by a device map"):
        Trainer(hm.model, [p for p in hm.model.parameters()], lr=1e-3, steps=1)


def test_dispatch_refused_where_it_cannot_work(llama_dir, tmp_path):
    with pytest.raises(HeadscopeError, match="^give device or device_map, not both"):
        load_model(llama_dir, device="cpu", device_map="auto")
    with pytest.raises(HeadscopeError, match="'everywhere' is not a placement strategy"):
        load_model(llama_dir, device_map="everywhere")
    with pytest.raises(HeadscopeError, match="cannot be dispatched with device map .*Load it whole on one device"):
        load_model(llama_dir, device_map={"model.layers.0": "disk"})  # the other modules get no device
    pruned = tmp_path / "pruned"
    save_model(prune_heads(load_model(llama_dir), {0: [0, 1, 2]}), pruned)
    with pytest.raises(
        HeadscopeError, match="checkpoint headscope changed .headscope_pruning.json.*cannot be dispatched"
    ):
        load_model(str(pruned), device_map="auto")


def test_temporary_offload_folder_removed(llama_dir):
    hm = load_model(llama_dir, device_map=DEVICE_MAP)
    folder = Path(hm.model._headscope_offload_dir)
    assert folder.is_dir()
    del hm
    import gc

    gc.collect()
    assert not folder.exists()


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> str:
    return str(tiny_bert_dir(tmp_path_factory.mktemp("cli")))


def _run(tmp_path: Path, argv: list[str]) -> int:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return main(argv)
    finally:
        os.chdir(cwd)


def test_cli_dispatched_analyze_equals_in_memory(tmp_path, bert_dir):
    small = ["--limit", "3", "--max-length", "16"]
    placed = load_model(bert_dir, device_map="auto", max_memory={"cpu": 60000}).model.hf_device_map
    assert {"cpu", "disk"} <= set(placed.values()), placed  # what --max-memory cpu=60000 does below
    assert _run(tmp_path, ["analyze", bert_dir, *small, "--out", "mem"]) == 0
    assert _run(tmp_path, ["analyze", bert_dir, *small, "--out", "disp", "--device-map", "auto",
                           "--max-memory", "cpu=60000", "--offload-dir", "off"]) == 0
    assert (tmp_path / "mem" / "heads.csv").read_text() == (tmp_path / "disp" / "heads.csv").read_text()
    prov = {
        run: json.loads((tmp_path / run / "heads.json").read_text())["meta"]["provenance"] for run in ("mem", "disp")
    }
    assert prov["disp"]["model"]["fingerprint"] == prov["mem"]["model"]["fingerprint"]
    assert prov["disp"]["options"]["device_map"] == "auto"
    assert _run(tmp_path, ["analyze", bert_dir, *small, "--out", "bf", "--dtype", "bfloat16"]) == 0
    # Gradient importance: backward through modules whose weights are reloaded from disk at every forward.
    for run, opts in (("smem", []), ("sdisp", ["--device-map", "auto", "--max-memory", "cpu=60000"])):
        assert _run(tmp_path, ["score", bert_dir, *small, "--method", "gradient", "--out", run, *opts]) == 0
    assert (tmp_path / "smem" / "importance.csv").read_text() == (tmp_path / "sdisp" / "importance.csv").read_text()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["analyze", "--dtype", "float8"], "dtype 'float8' is not supported"),
        (["score", "--dtype", "fp16"], "use one of float32, bfloat16, float16"),
        (
            ["analyze", "--device-map", "auto", "--device", "cpu"],
            "give --device or --device-map, not both (got 'cpu' and 'auto')",
        ),
        (["gqa", "smollm2", "--kv-heads", "1", "--device-map", "auto", "--device", "cpu"], "not both"),
        (["similar", "--device-map", "everywhere"], "'everywhere' is not a placement strategy"),
        (
            ["prune", "--target-drop", "1%", "--max-memory", "cpu=1GiB"],
            "--max-memory places a model spread over devices",
        ),
        (["roles", "--offload-dir", "off"], "--offload-dir places a model spread over devices"),
        (["analyze", "--device-map", "auto", "--max-memory", "cpu:1GiB"], "is not DEVICE=SIZE"),
        (["analyze", "--device-map", "auto", "--max-memory", "gpu=1GiB"], "'gpu' is not a device"),
        (["analyze", "--device-map", "auto", "--max-memory", "cpu=lots"], "'lots' is not a size"),
        (["analyze", "--device-map", "missing.json"], "--device-map 'missing.json' cannot be read"),
        (["report", "--device-map", "auto", "--device", "cpu"], "not both"),
    ],
)
def test_cli_placement_refused_before_work(tmp_path, capsys, argv, message):
    refused(tmp_path, capsys, argv, message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_gpu_placement_without_gpu(tmp_path, capsys):
    refused(tmp_path, capsys, ["analyze", "--device", "cuda", "--dtype", "bfloat16"], "CUDA is not available")
    refused(tmp_path, capsys, ["analyze", "--device-map", "auto", "--max-memory", "0=20GiB,cpu=1GiB"],
            "GPU 0 does not exist")
    (tmp_path / "map.json").write_text(json.dumps({"model": 0}))
    refused(
        tmp_path,
        capsys,
        ["analyze", "--device-map", "map.json"],
        "module 'model': --device 'cuda:0': CUDA is not available",
    )
    (tmp_path / "map.json").unlink()


def test_cli_undispatchable_model(tmp_path, capsys, llama_dir):
    pruned = tmp_path / "pruned"
    save_model(prune_heads(load_model(llama_dir), {0: [0, 1, 2]}), pruned)
    refused(tmp_path, capsys, ["analyze", str(pruned), "--device-map", "auto"], "cannot be dispatched")
    (tmp_path / "map.json").write_text(json.dumps({"model.layers.0": "disk"}))
    refused(
        tmp_path, capsys, ["analyze", llama_dir, "--device-map", "map.json"], "cannot be dispatched with device map"
    )
