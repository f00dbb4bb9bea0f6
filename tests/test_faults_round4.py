"""Issue 40 (faults and hostile input, round four): incomplete checkpoints, pairs files, repeated receivers, a
single-method report, output names that collide with a verb's own files, a truncated tokenizer.json, the CLI's
own parse errors and the Python API's argument types. Each case: one line, exit 2 (or the project's error from
Python), before any heavy work."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_artifacts import tiny_bert_dir, tiny_llama_dir
from test_bad_input import refused

from headscope.cli import main

SMALL = ["--limit", "3", "--max-length", "16"]


def _run(tmp_path: Path, argv: list[str]) -> int:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return main(argv)
    finally:
        os.chdir(cwd)


# --- 1. a checkpoint whose weights do not fill its config ---------------------------------------------------------
@pytest.fixture(scope="module")
def six_layers(tmp_path_factory) -> dict[str, Path]:
    """A tiny LLaMA and a tiny BERT of 6 layers each, saved whole, with a word-level tokenizer and a text."""
    base = tmp_path_factory.mktemp("six")
    llama, text = tiny_llama_dir(base, num_hidden_layers=6)
    bert_base = base / "b"
    bert_base.mkdir()
    from headscope.models.tiny import tiny_model

    bert = tiny_bert_dir(bert_base)
    tiny_model("bert", init_std=0.2, num_hidden_layers=6).model.save_pretrained(bert)  # same tokenizer, 6 layers
    return {"llama": llama, "bert": bert, "text": text}


def _layer_of(key: str) -> int | None:
    """The layer a weight name belongs to (its first number), None for embeddings and heads."""
    return next((int(p) for p in key.split(".") if p.isdigit()), None)


def _edit_weights(src: Path, dst: Path, drop_layers=(), add: dict[str, torch.Tensor] | None = None) -> Path:
    """A copy of checkpoint `src` whose safetensors lose layers `drop_layers` and gain the tensors `add`."""
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    state = {k: v for k, v in state.items() if _layer_of(k) not in drop_layers}
    state.update(add or {})
    save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("family,names", [("llama", "model.layers.2."), ("bert", "encoder.layer.2.")])
def test_a_checkpoint_missing_layers_is_refused(tmp_path, capsys, six_layers, family, names):
    cut = _edit_weights(six_layers[family], tmp_path / "cut", drop_layers=(2, 3, 4, 5))
    n_missing = 9 * 4 if family == "llama" else 16 * 4  # the tensors of layers 2-5, counted in transformers' module
    line = refused(tmp_path, capsys, ["analyze", str(cut), "--data", str(six_layers["text"]), *SMALL, "--out", "o"],
                   f"its weights lack {n_missing} tensors the config needs ({names}")
    assert "layers 2-5" in line and "--allow-random-weights" in line, line
    # asked for on purpose: the gaps are random, and the run goes on
    assert _run(tmp_path, ["analyze", str(cut), "--data", str(six_layers["text"]), *SMALL, "--out", "o",
                           "--allow-random-weights"]) == 0
    assert (tmp_path / "o" / "heads.csv").exists()


@pytest.mark.parametrize("family,extra", [("llama", "model.layers.6.self_attn.q_proj.weight"),
                                          ("bert", "encoder.layer.6.attention.self.query.weight"),
                                          ("llama", "model.extra.weight")])
def test_a_checkpoint_with_tensors_its_config_has_no_place_for_is_refused(tmp_path, capsys, six_layers, family,
                                                                          extra):
    more = _edit_weights(six_layers[family], tmp_path / "more", add={extra: torch.zeros(4, 4)})
    refused(tmp_path, capsys, ["analyze", str(more), "--data", str(six_layers["text"]), *SMALL, "--out", "o"],
            f"it holds 1 tensor the config has no place for ({extra}")


def test_whole_checkpoints_and_ignored_buffers_load(tmp_path, six_layers):
    """A whole checkpoint loads; so does one carrying what transformers ignores by design (a rotary inv_freq buffer,
    another task's head), and the Python API says the same as the CLI."""
    from headscope.models.files import IncompleteCheckpoint
    from headscope.models.loading import load_model

    assert load_model(str(six_layers["llama"])).n_layers == 6
    extras = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}
    assert load_model(str(_edit_weights(six_layers["llama"], tmp_path / "rot", add=extras))).n_layers == 6
    head = {"cls.seq_relationship.weight": torch.zeros(2, 32)}  # BERT's next-sentence head: not the encoder's
    assert load_model(str(_edit_weights(six_layers["bert"], tmp_path / "nsp", add=head))).n_layers == 6
    cut = _edit_weights(six_layers["bert"], tmp_path / "cut", drop_layers=(5,))
    with pytest.raises(IncompleteCheckpoint, match=r"lack 16 tensors .*encoder\.layer\.5\..*allow_random_weights"):
        load_model(str(cut))
    assert load_model(str(cut), allow_random_weights=True).n_layers == 6
