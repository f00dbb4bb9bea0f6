"""`headscope export --to gguf` against a real llama.cpp (llama-cpp-python, which `make install` installs: an
import failure fails these tests, it does not skip them).

Tiny LLaMAs with a byte-level BPE tokenizer, unpruned and pruned every way headscope prunes (uniform heads:
llama.cpp's `llama` architecture; per-layer heads, a whole KV group, an attention sub-layer, FFN neurons:
`deci`; dropped blocks), give llama.cpp the same next-token log-probabilities as transformers on the same token
ids (f32 within 1e-3) and the same greedy continuations. SmolLM2 (f16) gives the same greedy tokens on several
prompts, tokenized by llama.cpp from text, and log-probabilities within F16_TOL. Bad input is one line, exit 2,
nothing written; an interrupted export leaves no file."""

from __future__ import annotations

from pathlib import Path

import llama_cpp  # a failed import must fail the tests (make install installs llama-cpp-python)
import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from headscope.cli import main
from headscope.export import gguf as G
from headscope.models.checkpoint import save_model
from headscope.models.tiny import tiny_model
from headscope.redundancy.pruning import UnitMask, prune_heads, prune_units

F32_TOL = 1e-3  # max |log p| difference, f32 GGUF vs transformers float32 (tiny models)
# f16 weights (and llama.cpp's f16 KV cache) against transformers' float32, SmolLM2 on this file's prompts.
F16_TOL = 0.1
PROMPTS_IDS = [[5, 17, 99, 23, 4], [200, 12, 7], [42, 42, 42, 8, 250, 31, 60]]


def _bpe_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(["the cat saw a dog and the small bird sang"] * 20, vocab_size=300, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>")


def _variants() -> dict[str, object]:
    hm = tiny_model("llama", init_std=0.2, vocab_size=300, num_hidden_layers=3)
    hm.tokenizer = _bpe_tokenizer()
    ffn = {l: torch.ones(hm.ffn_size(l)) for l in range(3)}
    ffn[1][::3] = 0.0
    return {
        "unpruned": hm,
        "heads-uniform": prune_heads(hm, {l: [0, 3] for l in range(3)}),
        "heads-per-layer": prune_heads(hm, {0: [0, 3], 1: [3, 4, 5]}),
        "attention-ffn": prune_units(hm, UnitMask(attention=torch.tensor([1.0, 0.0, 1.0]), ffn=ffn)),
        "blocks": prune_units(hm, UnitMask(block=torch.tensor([1.0, 0.0, 1.0]))),
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[object, Path, dict]]:
    base = tmp_path_factory.mktemp("gguf")
    out = {}
    for name, hm in _variants().items():
        src = save_model(hm, base / name)
        info = G.export_gguf(src, base / f"{name}.gguf", dtype="f32")
        out[name] = (hm, base / f"{name}.gguf", info)
    return out


def _llama(path: Path, kv_f32: bool = True) -> llama_cpp.Llama:
    """llama.cpp with logits for every position; the KV cache in f32 (llama.cpp's default is f16) for the f32
    comparisons."""
    kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if kv_f32 else {}
    return llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1, seed=0, **kv)


def _hf_logprobs(hm, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = hm.model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


def _cpp_logprobs(llm: llama_cpp.Llama, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[:len(ids)], dtype=np.float64)
    return logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)


def _greedy_cpp(llm: llama_cpp.Llama, ids: list[int], n: int) -> list[int]:
    llm.reset()
    out = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(int(tok))
        if len(out) == n:
            break
    return out


def _greedy_hf(hm, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        seq = hm.model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                pad_token_id=0, eos_token_id=None)
    return [int(t) for t in seq[0, len(ids):]]


EXPECTED_ARCH = {"unpruned": "llama", "heads-uniform": "llama", "heads-per-layer": "deci", "attention-ffn": "deci",
                 "blocks": "llama"}


@pytest.mark.parametrize("name", list(EXPECTED_ARCH))
def test_llama_cpp_log_probs_and_greedy_tokens_equal_transformers(exported, name):
    hm, path, info = exported[name]
    assert info["arch"] == EXPECTED_ARCH[name], info
    llm = _llama(path)
    for ids in PROMPTS_IDS:
        d = np.abs(_cpp_logprobs(llm, ids) - _hf_logprobs(hm, ids)).max()
        assert d < F32_TOL, f"{name}: llama.cpp log-probs differ from transformers by {d:.3g} (f32)"
        assert _greedy_cpp(llm, ids, 6) == _greedy_hf(hm, ids, 6), name


def test_layer_shapes_are_written_per_layer(exported):
    _, _, info = exported["heads-per-layer"]
    assert info["n_heads"] == [4, 3, 6] and info["n_kv_heads"] == [2, 1, 2]
    _, _, info = exported["attention-ffn"]
    assert info["n_heads"] == [6, 0, 6] and info["n_ff"] == [96, 64, 96]
    _, _, info = exported["blocks"]
    assert info["n_layers"] == 2


def test_q8_0_and_f16_load_and_stay_close(exported, tmp_path):
    hm, _, _ = exported["heads-per-layer"]
    src = save_model(hm, tmp_path / "m")
    for dtype, tol in (("f16", 0.05), ("q8_0", 0.3)):
        info = G.export_gguf(src, tmp_path / f"{dtype}.gguf", dtype=dtype)
        d = np.abs(_cpp_logprobs(_llama(tmp_path / f"{dtype}.gguf"), PROMPTS_IDS[2])
                   - _hf_logprobs(hm, PROMPTS_IDS[2])).max()
        assert d < tol, f"{dtype}: max log-prob difference {d:.3g}"
        assert info["dtype"] == dtype


@pytest.mark.real
def test_smollm2_unpruned_and_pruned_in_llama_cpp(smollm2, tmp_path):
    """SmolLM2 f16: greedy tokens from text prompts (llama.cpp tokenizes them) equal transformers', log-probs
    within F16_TOL; pruned per layer (deci) too."""
    hm = smollm2
    pruned = prune_heads(hm, {l: [3, 4, 5] for l in range(0, 30, 3)})  # one KV group from every third layer
    prompts = ["The capital of France is", "Water boils at a temperature of", "My favourite animal is the"]
    for name, model in (("unpruned", hm), ("pruned", pruned)):
        src = save_model(model, tmp_path / name)
        info = G.export_gguf(src, tmp_path / f"{name}.gguf", dtype="f16")
        assert info["arch"] == ("llama" if name == "unpruned" else "deci")
        llm = llama_cpp.Llama(str(tmp_path / f"{name}.gguf"), n_ctx=128, logits_all=True, verbose=False)
        for text in prompts:
            ids = model.tokenizer(text)["input_ids"]
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == ids, text
            d = np.abs(_cpp_logprobs(llm, ids)[-1] - _hf_logprobs(model, ids)[-1]).max()
            assert d < F16_TOL, f"{name} {text!r}: next-token log-probs differ by {d:.3g}"
            assert _greedy_cpp(llm, ids, 8) == _greedy_hf(model, ids, 8), (name, text)


# --- bad input: one line, exit 2, nothing written -------------------------------------------------------------
def _bad(argv: list[str], capsys, message: str, out: Path) -> None:
    assert main(["export", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists() or out.read_text() == "keep"


def test_bad_input(exported, tmp_path, capsys):
    src = save_model(exported["unpruned"][0], tmp_path / "src")
    gpt2 = save_model(tiny_model("gpt2"), tmp_path / "gpt2")
    out = tmp_path / "x.gguf"
    capsys.readouterr()
    _bad([str(src), "--to", "onnx", "--file", str(out)], capsys, "is not a format", out)
    _bad([str(src), "--to", "gguf", "--file-type", "q4", "--file", str(out)], capsys, "--file-type 'q4'", out)
    _bad([str(tmp_path / "nothing"), "--to", "gguf", "--file", str(out)], capsys, "not a checkpoint folder", out)
    _bad([str(gpt2), "--to", "gguf", "--file", str(out)], capsys, "covers the llama family", out)
    out.write_text("keep")
    _bad([str(src), "--to", "gguf", "--file", str(out)], capsys, "already holds a file", out)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_mla_checkpoint_refused_with_the_reason(tmp_path, capsys):
    from headscope.capacity.mla import convert_to_mla
    from headscope.capacity.mla.checkpoint import save_mla

    hm = tiny_model("llama", init_std=0.2)
    src = save_mla(convert_to_mla(hm, 6, 2, data=[list(range(5, 40))]), tmp_path / "mla")
    capsys.readouterr()
    _bad([str(src), "--to", "gguf", "--file", str(tmp_path / "m.gguf")], capsys, "MLA", tmp_path / "m.gguf")


def test_interrupted_export_leaves_no_file(exported, tmp_path, monkeypatch):
    import gguf

    hm, _, _ = exported["unpruned"]
    src = save_model(hm, tmp_path / "m")

    def boom(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", boom)
    with pytest.raises(KeyboardInterrupt):
        G.export_gguf(src, tmp_path / "m.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_cli_and_library_write_the_same_file(tmp_path, capsys):
    """`headscope export` and `headscope.export_model(...).save(path)` write byte-identical GGUF files; the library call
    writes nothing before save, and the CLI prints what the result's lines say (q8_0: the f16 fallback line)."""
    import headscope

    hm = _variants()["heads-per-layer"]
    src = save_model(hm, tmp_path / "ckpt")
    cli, lib = tmp_path / "cli.gguf", tmp_path / "lib.gguf"
    assert main(["export", str(src), "--to", "gguf", "--file", str(cli), "--file-type", "q8_0"]) == 0
    printed = capsys.readouterr().out
    before = sorted(p.name for p in tmp_path.iterdir())
    result = headscope.export_model(src, file_type="q8_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert "\n".join(result.lines()) in printed and "written f16" in printed
    assert list(result.to_pandas()["n_heads"]) == [hm.heads_in_layer(l) for l in range(hm.n_layers)]
    assert result.save(lib) == [lib]
    assert lib.read_bytes() == cli.read_bytes()
