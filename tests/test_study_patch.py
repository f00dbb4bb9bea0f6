"""The study's `patch` stage (issue 33): a tiny decoder's study patches IOI pairs and question 1's answer names
the heads whose effect's interval excludes 0 (read back from patching.csv) with the role labels roles.csv gave
them; a tiny masked-LM's study patches the masked pairs; a model without an LM head is left out with its
reason; the model still loads once; the plan takes attribution alone when the exact scan does not fit."""

from __future__ import annotations

import csv
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from headscope.cli import main
from headscope.models.tiny import tiny_config
from headscope.study import budget as B
from headscope.study import patching
from headscope.study.answers import ROLE_WORDS, answers
from headscope.study.probe import Probe
from headscope.study.records import Records
from headscope.study.stages import Family, stages_for
from tests.test_study import WORDS, _count_loads, parse_command, tiny_bert_dir


def _task_words(name: str) -> list[str]:
    """Every word of a shipped pair set (so the test tokenizer holds its names, answers and countries)."""
    text = resources.files("headscope").joinpath(f"resources/patching/{name}").read_text(encoding="utf-8")
    words: set[str] = set()
    for line in text.splitlines():
        for v in json.loads(line).values():
            words.update(re.findall(r"\w+|[^\w\s]", v.replace("{mask}", "")))
    return sorted(words)


def _tokenizer(vocab: dict[str, int], unk: str, **special):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, **special)


def _vocab(specials: list[str], task: str) -> dict[str, int]:
    words = dict.fromkeys([*specials, ".", ",", *WORDS, *_task_words(task)])
    return {w: i for i, w in enumerate(words)}


def tiny_llama_ioi(base: Path) -> Path:
    """A tiny LLaMA whose word-level tokenizer knows PTB's commonest words and every word of the IOI set."""
    from transformers import LlamaForCausalLM

    vocab = _vocab(["<unk>", "<pad>"], "ioi.jsonl")
    path = base / "llama-ioi"
    config = tiny_config("llama", vocab_size=len(vocab))
    config.initializer_range = 0.2  # attention patterns far from uniform: heads differ in effect
    import torch  # here: seeding the one model this fixture builds

    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    _tokenizer(vocab, "<unk>", pad_token="<pad>").save_pretrained(path)
    return path


def tiny_bert_mlm(base: Path) -> Path:
    """A tiny BERT with its masked-LM head, its tokenizer knowing the masked set's capitals and countries."""
    import torch  # here: seeding the one model this fixture builds
    from tokenizers import processors
    from transformers import BertForMaskedLM

    vocab = _vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "masked.jsonl")
    path = base / "bert-mlm"
    config = tiny_config("bert", vocab_size=len(vocab))
    config.initializer_range = 0.2
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(path)
    tok = _tokenizer(vocab, "[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.save_pretrained(path)
    return path


def _patching_rows(out: Path) -> list[dict[str, str]]:
    with open(out / "patching.csv", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _excluding_zero(rows: list[dict[str, str]], col: str) -> list[tuple[str, float, float, float]]:
    """Heads whose `col` interval excludes 0, largest |value| first: what the answer must name."""
    got = [(f"L{r['layer']}H{r['head']}", float(r[col]), float(r[f"{col}_lo"]), float(r[f"{col}_hi"]))
           for r in rows if r[col] not in ("", "nan")]
    return sorted([g for g in got if g[2] > 0 or g[3] < 0], key=lambda g: -abs(g[1]))


def _expected_first(out: Path) -> tuple[str, str, list[tuple[str, float, float, float]]]:
    """What the answer must say first, worked out here from patching.json and patching.csv, and the head it names:
    the largest head whose exact effect's interval excludes 0 when M(clean)'s and M(corrupt)'s intervals are
    disjoint; else the largest head, not called causal."""
    rec = json.loads((out / "patching.json").read_text())
    mc, mx = rec["M_clean"], rec["M_corrupt"]
    rows = _patching_rows(out)
    called = _excluding_zero(rows, "effect")
    top = max(((f"L{r['layer']}H{r['head']}", float(r["effect"]), float(r["effect_lo"]), float(r["effect_hi"]))
               for r in rows if r["effect"] not in ("", "nan")), key=lambda g: abs(g[1]))
    largest = f"largest: {top[0]} {top[1]:+.2f} [{top[2]:+.2f}, {top[3]:+.2f}]"
    if not (mc["hi"] < mx["lo"] or mx["hi"] < mc["lo"]):
        return (f"no head is called causal: the model does not tell the pairs apart (M(clean) [{mc['lo']:.2f}, "
                f"{mc['hi']:.2f}] and M(corrupt) [{mx['lo']:.2f}, {mx['hi']:.2f}] overlap), so shares of their "
                f"difference are unsettled ({largest}"), top[0], []
    if not called:
        return f"no head's interval excludes 0 ({largest}", top[0], []
    name, v, lo, hi = called[0]
    return (f"{name} restores {v:.2f} [{lo:.2f}, {hi:.2f}] of the clean logit difference" if v > 0 else
            f"{name} works against the clean logit difference: {v:+.2f} [{lo:+.2f}, {hi:+.2f}]"), name, called


def test_a_decoder_study_patches_ioi_and_names_the_causal_heads(tmp_path, capsys, monkeypatch):
    model = tiny_llama_ioi(tmp_path)
    out = tmp_path / "study"
    loads = _count_loads(monkeypatch)
    assert main(["study", str(model), "--budget", "3m", "--out", str(out)]) == 0
    # the study's one load (the patch stage runs on it too), then the compare stage's load of the GQA model (it builds
    # the pruned and MLA models from their configs and weights: no from_pretrained)
    assert len(loads) == 2, loads
    st = json.loads((out / "study.json").read_text())
    rec = st["stages"]["patch"]
    assert rec["status"] == "done", rec
    verb, options = parse_command(rec["command"])  # the logged command parses back into the stage's options
    assert (verb, options.task, options.methods) == ("patch", "ioi", tuple(rec["size"]["methods"].split(",")))
    assert rec["size"]["methods"] == patching.BOTH, rec  # a tiny model's exact scan fits 3 minutes
    meta = json.loads((out / "patching.json").read_text())
    assert meta["pairs"]["n"] == rec["size"]["n"] and meta["methods"] == ["exact", "attribution"]
    q1 = st["answers"]["q1"]
    assert f"causally, on {rec['size']['n']} IOI pairs (logit difference" in q1, q1
    first, name, called = _expected_first(out)  # random weights: the model need not tell IOI's pairs apart
    assert first in q1, (first, q1)
    # The comparison with roles: the named head's labels as roles.csv (same study) gives them.
    assert st["stages"]["roles"]["status"] == "done"
    with open(out / "roles.csv", encoding="utf-8") as f:
        labels = {f"L{r['layer']}H{r['head']}": [x for x in r["roles"].split(";") if x] for r in csv.DictReader(f)}
    words = [ROLE_WORDS.get(x, x.replace("_", " ")).removesuffix(" heads") for x in labels[name]]
    want = ", ".join(words) if words else "no role label"
    assert f"{first} ({want})" in q1, (want, q1)
    if called:
        labelled = sum(1 for n, *_ in called if labels[n])
        assert f"{len(called)} of {len(_patching_rows(out))} heads' intervals exclude 0, {labelled} of them " \
               f"carry a role label" in q1, q1
    assert q1 in capsys.readouterr().out
    assert answers(out, st) == st["answers"]  # the same words from the files as from the Results in memory


def test_an_encoder_study_patches_the_masked_pairs(tmp_path, capsys, monkeypatch):
    model = tiny_bert_mlm(tmp_path)
    out = tmp_path / "study"
    loads = _count_loads(monkeypatch)
    assert main(["study", str(model), "--budget", "3m", "--out", str(out)]) == 0
    # loaded once, with its masked-LM head (the compare stage builds the pruned model from its config and weights)
    assert loads == ["BertForMaskedLM"], loads
    st = json.loads((out / "study.json").read_text())
    rec = st["stages"]["patch"]
    assert rec["status"] == "done" and "--task masked" in rec["command"], rec
    meta = json.loads((out / "patching.json").read_text())
    assert meta["pairs"]["source"] == "task masked" and meta["pairs"]["n"] >= 1
    q1 = st["answers"]["q1"]
    assert f"on {meta['pairs']['n']} masked capital-country pairs" in q1, q1
    first, _, _ = _expected_first(out)
    assert first in q1, (first, q1)  # a head with its interval, as patching.csv has it
    capsys.readouterr()


def test_a_model_without_an_lm_head_is_left_out_with_its_reason(tmp_path, capsys):
    """The plain BertModel (no masked-LM head): no logits to patch; the answer says why in its place."""
    model = tiny_bert_dir(tmp_path)
    out = tmp_path / "study"
    assert main(["study", str(model), "--budget", "2m", "--out", str(out)]) == 0
    st = json.loads((out / "study.json").read_text())
    rec = st["stages"]["patch"]
    assert rec["status"] == "not supported", rec
    assert "has no LM head" in rec["reason"] and "BertModel" in rec["reason"], rec
    assert not (out / "patching.csv").exists()
    assert f"no causal patching ({rec['reason']})" in st["answers"]["q1"], st["answers"]["q1"]
    assert f"patch: not supported: {rec['reason']}" in capsys.readouterr().out


def _family(heads: int = 144) -> Family:
    return Family("m", "llama", True, 12, heads // 12, heads // 12, 64, 768, 2048, heads)


def test_the_plan_takes_attribution_alone_when_the_exact_scan_does_not_fit():
    probe_ = Probe(load_s=1.0, fwd_s=0.05, train_s=0.15, cpu_s=0.1, length=64, passages=8)
    fam = _family()
    stage = next(s for s in stages_for(fam) if s.name == "patch")
    costs = [stage.cost(probe_, fam, lv) for lv in stage.levels]
    first_exact = next(i for i, lv in enumerate(stage.levels) if "exact" in lv["methods"])
    # Each size of a kind costs more than the one before; exact on the fewest pairs costs more than attribution.
    assert all(a < b for a, b in zip(costs[:first_exact], costs[1:first_exact], strict=False))
    assert all(a < b for a, b in zip(costs[first_exact:], costs[first_exact + 1:], strict=False))
    assert costs[first_exact] > max(costs[:first_exact])

    def plan(available: float) -> B.Plan:
        return B.make_plan(["patch"], lambda n, lv: costs[lv], lambda n: len(costs), lambda n: False, ["patch"],
                           available)

    short = plan(costs[first_exact] - 1).get("patch")
    assert stage.levels[short.level]["methods"] == patching.ATTRIBUTION
    options = stage.call(_ctx(fam), short.level).options
    assert options.methods == ("attribution",) and options.task == "ioi"
    roomy = plan(costs[-1] + 1).get("patch")
    assert roomy.level == len(costs) - 1 and stage.levels[roomy.level]["methods"] == patching.BOTH
    assert plan(costs[0] - 1).get("patch").level is None  # nothing fits: left out, its reason given
    # The exact scan's cost grows with the heads (one patched copy each); attribution's hardly does.
    assert stage.cost(probe_, _family(288), stage.levels[first_exact]) > 1.5 * costs[first_exact]


def _ctx(fam: Family):
    from headscope.study.stages import Ctx

    return Ctx("m", "ptb-valid", "ptb-train", "ptb-valid", "/tmp/never", fam)


def test_the_answer_without_a_patch_stage_or_with_attribution_alone(tmp_path):
    """Hand-written patching files: the answer calls causal only a head whose interval excludes 0, says when the
    numbers are attribution's first-order estimates, and says when no roles ran to compare with."""
    (tmp_path / "patching.json").write_text(json.dumps({
        "metric": "logit_diff", "pairs": {"source": "task ioi", "n": 8},
        "M_clean": {"value": 2.0, "lo": 1.5, "hi": 2.5}, "M_corrupt": {"value": -1.0, "lo": -1.5, "hi": -0.5}}))
    rows = "layer,head,attribution,attribution_lo,attribution_hi\n0,0,0.5,-0.1,0.9\n0,1,-0.2,-0.3,-0.1\n"
    (tmp_path / "patching.csv").write_text(rows)
    s = patching.sentence(Records(tmp_path), "unused", ROLE_WORDS, roles_ran=False)
    assert "by attribution patching alone (a first-order estimate: the exact scan did not fit the budget)" in s
    # L0H0 is larger but its interval holds 0: only L0H1 is named as excluding it.
    assert "L0H1 works against the clean logit difference: -0.20 [-0.30, -0.10]" in s and "L0H0" not in s, s
    assert "1 of 2 heads' intervals exclude 0" in s, s
    (tmp_path / "patching.csv").write_text("layer,head,effect,effect_lo,effect_hi\n0,0,0.5,-0.1,0.9\n")
    s = patching.sentence(Records(tmp_path), "unused", ROLE_WORDS, roles_ran=False)
    assert "no head's interval excludes 0 (largest: L0H0 +0.50 [-0.10, +0.90]), so none is called causal" in s, s
    (tmp_path / "patching.csv").unlink()
    assert patching.sentence(Records(tmp_path), "left out: no room", {}, roles_ran=False) == \
        "; no causal patching (left out: no room)"


def test_the_answer_compares_the_causal_heads_with_the_roles_labels(tmp_path):
    """Hand-written files: the heads whose intervals exclude 0, largest |effect| first, each with the labels
    roles.csv gives it; a head larger than them whose interval holds 0 is not named; overlapping M(clean) and
    M(corrupt) call no head causal."""
    rec = {"metric": "logit_diff", "pairs": {"source": "task ioi", "n": 24},
           "M_clean": {"value": 4.1, "lo": 3.7, "hi": 4.6}, "M_corrupt": {"value": -5.1, "lo": -5.6, "hi": -4.5}}
    (tmp_path / "patching.json").write_text(json.dumps(rec))
    (tmp_path / "patching.csv").write_text("layer,head,effect,effect_lo,effect_hi,dla\n"
                                           "0,0,0.9,-0.2,2.0,0.1\n0,1,0.44,0.40,0.48,2.7\n"
                                           "1,0,-0.23,-0.30,-0.18,0\n1,1,0.05,0.01,0.09,0\n")
    (tmp_path / "roles.csv").write_text("layer,head,roles\n0,0,\n0,1,induction;previous_token\n1,0,\n1,1,sink\n")
    s = patching.sentence(Records(tmp_path), "unused", ROLE_WORDS, roles_ran=True)
    assert s.startswith("; causally, on 24 IOI pairs (logit difference 4.10 clean vs -5.10 corrupt), "), s
    assert "L0H1 restores 0.44 [0.40, 0.48] of the clean logit difference (induction, previous-token)" in s, s
    assert "L1H0 -0.23 [-0.30, -0.18] (no role label)" in s and "L1H1 +0.05 [+0.01, +0.09] (sink)" in s, s
    assert "L0H0" not in s and "3 of 4 heads' intervals exclude 0, 2 of them carry a role label" in s, s
    # Without this study's roles: no labels, and the answer says there was nothing to compare with.
    s = patching.sentence(Records(tmp_path), "unused", ROLE_WORDS, roles_ran=False)
    assert "(induction" not in s and "no role census in this study to compare with" in s, s
    rec["M_corrupt"] = {"value": 3.9, "lo": 3.2, "hi": 4.0}
    (tmp_path / "patching.json").write_text(json.dumps(rec))
    s = patching.sentence(Records(tmp_path), "unused", ROLE_WORDS, roles_ran=True)
    assert "no head is called causal: the model does not tell the pairs apart (M(clean) [3.70, 4.60] and " \
           "M(corrupt) [3.20, 4.00] overlap)" in s and "(largest: L0H0 +0.90 [-0.20, +2.00] (no role label))" in s, s
    rec["M_corrupt"] = {"value": 3.9}  # a file without the intervals: nothing is called causal, and it says why
    (tmp_path / "patching.json").write_text(json.dumps(rec))
    s = patching.sentence(Records(tmp_path), "unused", ROLE_WORDS, roles_ran=True)
    assert "no head is called causal: patching.json does not record M(clean)'s and M(corrupt)'s intervals" in s, s


@pytest.mark.parametrize("causal, task", [(True, "ioi"), (False, "masked")])
def test_the_task_follows_the_family(causal, task):
    assert patching.task_for(causal) == task


def test_a_builtin_pair_whose_answer_and_wrong_are_one_token_is_left_out():
    """A tokenizer that maps both names to one token (<unk>) cannot tell them apart: such a pair of a built-in set is
    left out and counted; a set of nothing else is refused with the reason the study records."""
    from headscope.errors import HeadscopeError
    from headscope.learned.causal.pairs import Pair, load_pairs, tokenize_pairs

    vocab = {w: i for i, w in enumerate(dict.fromkeys(["<unk>", "<pad>", ".", ",", *WORDS]))}
    tok = _tokenizer(vocab, "<unk>", pad_token="<pad>")
    good = Pair("the company said", "the market said", " the", " a")
    same = Pair("when kate met tom , tom gave it to", "when kate met tom , kate gave it to", " kate", " tom")
    kept = tokenize_pairs(tok, [good, same], True, "task x", strict=False)
    assert len(kept) == 1 and kept.skipped == 1 and kept.pairs == [good]
    with pytest.raises(HeadscopeError, match="task ioi: none of its 8 pairs fits .* answer and wrong the same token"):
        load_pairs(tok, True, len(vocab), task="ioi", limit=8)
