"""One data resolver: `score` and `prune` read identical passages for the same --data and --limit.

Both verbs are run through their own parsers and `run` functions, with the model loader and the stage
replaced by stubs that record the data each verb hands to its stage, so the check covers everything
between the command line and the stage (parsing, defaults, the resolver) and nothing slow.
"""

from __future__ import annotations

import argparse

import pytest

from headscope.commands import prune as prune_cmd
from headscope.commands import score as score_cmd
from headscope.data import DEFAULT_LIMIT, PTB_MIN_WORDS, TextSource
from headscope.models.tiny import tiny_model


class Stop(Exception):
    """Raised by the stage stubs once the data is recorded."""


def _received(monkeypatch, tmp_path, verb: str, *argv: str) -> dict[str, TextSource]:
    """Run `headscope <verb> ...argv` and return the data its stage was given (data, and heldout for prune)."""
    got: dict[str, TextSource] = {}

    def stage(hm, data, *args, **kwargs):
        got["data"] = data
        if kwargs.get("heldout") is not None:
            got["heldout"] = kwargs["heldout"]
        raise Stop

    module = {"score": score_cmd, "prune": prune_cmd}[verb]
    from headscope.commands import _common  # verbs load through _common.load_from_args or Options.load
    from headscope.options import groups
    from headscope.redundancy import verbs

    monkeypatch.setattr(_common, "load_model", lambda *a, **k: tiny_model("gpt2"))
    monkeypatch.setattr(groups, "load_model", lambda *a, **k: tiny_model("gpt2"))  # Options.load
    target = {"score": (verbs, "score_table"), "prune": (verbs, "prune_curve")}[verb]
    monkeypatch.setattr(*target, stage)
    parser = argparse.ArgumentParser()
    module.register(parser.add_subparsers())
    args = parser.parse_args([verb, "tiny", "--out", str(tmp_path / verb), *argv])
    with pytest.raises(Stop):
        args.func(args)
    return got


@pytest.mark.parametrize("limit", [7, None])
def test_score_and_prune_read_identical_ptb_passages(monkeypatch, tmp_path, limit):
    extra = ["--limit", str(limit)] if limit is not None else []
    scored = _received(monkeypatch, tmp_path, "score", "--data", "ptb-valid", *extra)["data"]
    pruned = _received(monkeypatch, tmp_path, "prune", "--data", "ptb-valid", "--fraction", "0.1", *extra)["data"]
    want = limit if limit is not None else DEFAULT_LIMIT
    assert isinstance(scored, TextSource) and isinstance(pruned, TextSource)
    assert scored.source == pruned.source == "treebank:valid"
    assert len(scored.texts) == len(pruned.texts) == want, (len(scored.texts), len(pruned.texts), want)
    assert scored.texts == pruned.texts, next((a, b) for a, b in zip(scored.texts, pruned.texts, strict=True) if a != b)
    assert all(len(t.split()) >= PTB_MIN_WORDS for t in scored.texts)  # the one PTB rule


def test_prune_heldout_reads_what_score_reads(monkeypatch, tmp_path):
    """--heldout ptb-valid --heldout-limit N gives prune's measurements the passages score reads for N."""
    scored = _received(monkeypatch, tmp_path, "score", "--data", "ptb-valid", "--limit", "5")["data"]
    got = _received(monkeypatch, tmp_path, "prune", "--data", "ptb-train", "--limit", "3", "--heldout",
                    "ptb-valid", "--heldout-limit", "5", "--fraction", "0.1")
    assert got["heldout"].texts == scored.texts and len(got["data"].texts) == 3
