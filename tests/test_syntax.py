"""Word-level attention, Clark et al. dependency accuracy, Entity= coreference parsing and scoring,
tokenisation mismatches and bad CoNLL-U input."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from headscope.data import Sentence, read_conllu
from headscope.errors import HeadscopeError
from headscope.hooks import eager_attention
from headscope.learned.coref import (
    CorefCounts,
    Document,
    Mention,
    coref_items,
    coreference_accuracy,
    parse_entity_field,
    read_documents,
)
from headscope.learned.syntax import DependencyCounts, align_words, dependency_accuracy, relation_of, word_attention


def test_word_attention_sums_attended_pieces_and_averages_attending_pieces():
    # tokens: [CLS] a1 a2 b [SEP] -> words a (pieces 1, 2) and b (piece 3)
    g = torch.Generator().manual_seed(0)
    p = torch.rand(1, 2, 5, 5, generator=g, dtype=torch.float64)
    p = p / p.sum(-1, keepdim=True)
    word_of = torch.tensor([[-1, 0, 0, 1, -1]])
    w = word_attention(p, word_of, 2)
    want = torch.empty(1, 2, 2, 2, dtype=torch.float64)
    for h in range(2):
        want[0, h, 0, 0] = ((p[0, h, 1, 1] + p[0, h, 1, 2]) + (p[0, h, 2, 1] + p[0, h, 2, 2])) / 2
        want[0, h, 0, 1] = (p[0, h, 1, 3] + p[0, h, 2, 3]) / 2
        want[0, h, 1, 0] = p[0, h, 3, 1] + p[0, h, 3, 2]
        want[0, h, 1, 1] = p[0, h, 3, 3]
    diff = (w - want).abs().max().item()
    assert diff < 1e-12, f"max abs diff {diff:.2e}"
    # padding to more words than a row has gives NaN rows for the missing words
    assert torch.isnan(word_attention(p, word_of, 3)[0, 0, 2]).all()


SENT = Sentence(words=["The", "old", "dog", "chased", "a", "cat"], heads=[3, 3, 4, 0, 6, 4],
                deprels=["det", "amod", "nsubj", "root", "det", "obj"], misc=["_"] * 6)


def _to_heads_attention(n_heads: int = 2) -> np.ndarray:
    """Head 0: every word attends to its syntactic head (the root to itself); head 1: to the previous word."""
    w = np.zeros((n_heads, 6, 6))
    for d, g in enumerate(SENT.heads):
        w[0, d, g - 1 if g else d] = 1.0
    for d in range(6):
        w[1, d, max(d - 1, 0)] = 1.0
    w[1, 0, 1] = 1.0  # the first word has no previous word
    return w


def test_dependency_accuracy_of_an_oracle_head_is_one():
    c = DependencyCounts(1, 2)
    c.add_sentence(0, _to_heads_attention(), SENT.heads, SENT.deprels, np.ones(6, bool))
    assert c.total == {"det": 2, "amod": 1, "nsubj": 1, "obj": 1}
    for rel in ("det", "amod", "nsubj", "obj"):
        assert c.accuracy(rel, "dep_to_head")[0, 0] == 1.0, rel
    # previous-word head: det "a"->"cat" is +1 (wrong), amod "old"->"dog" +1 (wrong); head->dep: "cat" looks at "a"
    assert c.accuracy("obj", "dep_to_head")[0, 1] == 0.0
    assert c.accuracy("det", "head_to_dep")[0, 1] == 0.5  # dog->old (no), cat->a (yes)
    assert c.accuracy("amod", "head_to_dep")[0, 1] == 1.0  # dog->old
    # fixed-offset baselines: det offsets +2 and +1 -> best 0.5; nsubj dog->chased +1 -> 1.0
    assert c.baseline("nsubj") == (1.0, 1)
    assert c.baseline("det")[0] == 0.5
    d = c.to_dict()
    assert d["det"]["best_head"] == "L0H0" and d["det"]["best_accuracy"] == 1.0


def test_argmax_excludes_the_word_itself_and_unaligned_words():
    w = np.zeros((1, 6, 6))
    w[0, :, :] = np.eye(6) * 0.9  # all weight on itself, a little on its head
    for d, g in enumerate(SENT.heads):
        if g:
            w[0, d, g - 1] = 0.1
    c = DependencyCounts(1, 1)
    c.add_sentence(0, w, SENT.heads, SENT.deprels, np.ones(6, bool))
    assert c.accuracy("det", "dep_to_head")[0, 0] == 1.0
    aligned = np.ones(6, bool)
    aligned[4] = False  # "a" got no token: its arc is not scored
    c = DependencyCounts(1, 1)
    c.add_sentence(0, w, SENT.heads, SENT.deprels, aligned)
    assert c.total["det"] == 1


def test_relation_subtypes():
    assert relation_of("nsubj:pass") == "nsubj"
    assert relation_of("nmod:poss") == "poss"
    assert relation_of("compound:prt") == "compound"
    assert relation_of("obj") == "obj"


def test_parse_entity_brackets():
    assert parse_entity_field("(1-abstract-new-s____-cf1-2-sgl") == [("open", "1")]
    assert parse_entity_field("4)1)") == [("close", "4"), ("close", "1")]
    assert parse_entity_field("(7-person-new-ssnns-cf2-1-coref)6)5)") == [("single", "7"), ("close", "6"),
                                                                         ("close", "5")]
    assert parse_entity_field("(e3[1/2]-place)") == [("single", "e3")]
    with pytest.raises(HeadscopeError):
        parse_entity_field("(1-x)junk(")


GUM_SNIPPET = """# newdoc id = doc_a
# global.Entity = GRP-etype-infstat-salience-centering-minspan-link-identity
# sent_id = doc_a-1
1\tMary\tMary\tPROPN\tNNP\t_\t2\tnsubj\t_\tEntity=(1-person-new-s-cf1-1-coref)
2\tsaw\tsee\tVERB\tVBD\t_\t0\troot\t_\t_
3\tthe\tthe\tDET\tDT\t_\t4\tdet\t_\tEntity=(2-object-new-s-cf2-2-coref
4\tbig\tbig\tADJ\tJJ\t_\t5\tamod\t_\t_
5\tdog\tdog\tNOUN\tNN\t_\t2\tobj\t_\tEntity=2)|SpaceAfter=No
6\t.\t.\tPUNCT\t.\t_\t2\tpunct\t_\t_

# sent_id = doc_a-2
1\tShe\tshe\tPRON\tPRP\t_\t2\tnsubj\t_\tEntity=(1-person-giv-s-cf1-1-coref)
2\tfed\tfeed\tVERB\tVBD\t_\t0\troot\t_\t_
3-4\tit's\t_\t_\t_\t_\t_\t_\t_\t_
3\tit\tit\tPRON\tPRP\t_\t2\tobj\t_\tEntity=(2-object-giv-s-cf2-1-coref)
4\t's\t's\tPART\tPOS\t_\t5\tcase\t_\tEntity=(3-abstract-new-s-cf1-1-sgl
5\tfood\tfood\tNOUN\tNN\t_\t2\tobj\t_\tEntity=3)
5.1\tate\teat\tVERB\tVBD\t_\t_\t_\t2:conj\tCopyOf=2

# newdoc id = doc_b
# sent_id = doc_b-1
1\tA\ta\tDET\tDT\t_\t2\tdet\t_\tEntity=(9-object-new-s-cf1-2-coref
2\tcat\tcat\tNOUN\tNN\t_\t0\troot\t_\t_

# sent_id = doc_b-2
1\tcame\tcome\tVERB\tVBD\t_\t0\troot\t_\tEntity=9)
"""


def test_read_documents_mentions_heads_and_crossing(tmp_path):
    f = tmp_path / "gum.conllu"
    f.write_text(GUM_SNIPPET, encoding="utf-8")
    docs, counts = read_documents(f)
    assert [d.doc_id for d in docs] == ["doc_a", "doc_b"]
    assert [len(d.sentences) for d in docs] == [2, 2]
    m = docs[0].mentions
    assert [(x.entity, x.start, x.end, x.head) for x in m[0]] == [
        ("1", 0, 0, 0),
        ("2", 2, 4, 4),
    ]  # head of "the big dog" = dog
    assert [(x.entity, x.head) for x in m[1]] == [
        ("1", 0),
        ("2", 2),
        ("3", 4),
    ]  # multiword range and empty node skipped
    assert docs[0].sentences[1].words == ["She", "fed", "it", "'s", "food"]
    assert (
        counts["crossing_mentions"] == 2
    )  # entity 9 opens in one sentence and closes in the next (counted at both ends)
    assert docs[1].mentions == [[], []]


def test_coref_accuracy_and_baselines_on_hand_attention(tmp_path, minilm):
    f = tmp_path / "gum.conllu"
    f.write_text(GUM_SNIPPET, encoding="utf-8")
    docs, _ = read_documents(f)
    items, info = coref_items(docs, minilm.tokenizer, max_length=64)
    # window = both sentences of doc_a; words: Mary saw the big dog . She fed it 's food
    assert len(items) == 1 and info["anaphors"] == 2
    it = items[0]
    assert it.anaphors == [6, 8]  # "She", "it"
    assert it.candidates == [[0, 4], [0, 4, 6]]  # heads of earlier mentions: Mary, dog (, She)
    assert it.correct == [[True, False], [False, True, False]]
    assert it.nearest == [1, 2] and it.same_head == [1, 2]  # no same head word: falls back to nearest
    n = 11
    w = np.full((2, n, n), 0.01)
    w[0, 6, 0] = w[0, 8, 4] = 0.9  # head 0 resolves both
    w[1, 6, 4] = w[1, 8, 0] = 0.9  # head 1 resolves neither
    c = CorefCounts(1, 2)
    c.add_item(0, w, it)
    d = c.to_dict()
    assert d["accuracy"] == [[1.0, 0.0]] and d["best_head"] == "L0H0"
    assert d["nearest_mention_baseline"] == 0.0 and d["same_head_word_baseline"] == 0.0
    assert abs(d["chance"] - (1 / 2 + 1 / 3) / 2) < 1e-12


def test_same_head_word_baseline():
    s1 = Sentence(["the", "dog", "ran", "and", "the", "cat", "sat", "the", "dog"], [2, 3, 0, 7, 6, 7, 3, 9, 3],
                  ["det", "nsubj", "root", "cc", "det", "nsubj", "conj", "det", "obj"], ["_"] * 9)
    doc = Document("d", [s1], [[Mention("1", 0, 1, 1), Mention("2", 4, 5, 5), Mention("1", 7, 8, 8)]])

    class Tok:  # whitespace tokenizer with offsets, enough for alignment
        is_fast, all_special_ids = True, []

        def __call__(self, text, **kw):
            import re
            spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
            return {"input_ids": list(range(len(spans))), "offset_mapping": spans}

    items, _ = coref_items([doc], Tok(), max_length=64)
    it = items[0]
    assert it.candidates == [[1, 5]] and it.nearest == [1] and it.same_head == [0]  # "dog" matches "dog"


def test_alignment_merges_and_unaligned_words(minilm):
    tok = minilm.tokenizer
    # SpaceAfter=No: "do" + "n't" is the text "don't", which BERT splits as don ' t: "don" spans both words
    a = align_words(tok, ["I", "do", "n't", "know"], [True, False, True, True])
    assert a.merged == 1 and a.unaligned == 0
    assert tok.convert_ids_to_tokens(a.ids) == ["[CLS]", "i", "don", "'", "t", "know", "[SEP]"]
    assert a.word_of == [-1, 0, 1, 2, 2, 3, -1]
    b = align_words(tok, ["a", "\u200b", "b"])  # a zero-width space gets no token
    assert b.unaligned == 1 and 1 not in b.word_of


def test_alignment_byte_level_tokenizer_without_bos(smollm2):
    words = ["Hello", "world", ",", "unbelievably", "so"]
    a = align_words(smollm2.tokenizer, words, [True, False, True, True, True])
    assert a.unaligned == 0 and a.merged == 0
    assert -1 not in a.word_of  # no special tokens added (no BOS)
    assert a.word_of == sorted(a.word_of) and set(a.word_of) == set(range(5))


def test_streamed_dependency_accuracy_matches_unbatched_reference(minilm):
    """Batched + padded streaming through hooks == one sentence at a time with output_attentions."""
    sents = read_conllu("ewt-test")[:6]
    got = dependency_accuracy(minilm, sents, max_length=128, batch_size=4)
    ref = DependencyCounts(minilm.n_layers, minilm.n_heads)
    for s in sents:
        a = align_words(minilm.tokenizer, s.words, s.space_after)
        with torch.no_grad(), eager_attention(minilm):  # models load with sdpa, which returns no weights
            out = minilm.model(input_ids=torch.tensor([a.ids]), output_attentions=True)
        has = np.isin(np.arange(a.n_words), a.word_of)
        for layer, p in enumerate(out.attentions):
            w = word_attention(p.float(), torch.tensor([a.word_of]), a.n_words)[0].numpy()
            ref.add_sentence(layer, w, s.heads, s.deprels, has)
    assert got.total == ref.total
    for rel in ref.total:
        diff = np.abs(got.dep_to_head[rel] - ref.dep_to_head[rel]).max()
        diff2 = np.abs(got.head_to_dep[rel] - ref.head_to_dep[rel]).max()
        assert diff == 0 and diff2 == 0, f"{rel}: max abs diff of hit counts {max(diff, diff2)}"


def test_bad_conllu_and_long_sentences(tmp_path, minilm, caplog):
    f = tmp_path / "bad.conllu"
    good = "1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n2\tbark\tbark\tVERB\tVBP\t_\t0\troot\t_\t_\n"
    broken = "1\tCats\tcat\tNOUN\tNNS\t_\t2\tnsubj\t_\n2\tmeow\tmeow\tVERB\tVBP\t_\t0\troot\t_\t_\n"
    long = "".join(f"{i}\tword{i}\tw\tNOUN\tNN\t_\t{i + 1 if i < 60 else 0}\tcompound\t_\t_\n" for i in range(1, 61))
    f.write_text(f"# sent_id = 1\n{good}\n# sent_id = 2\n{broken}\n# sent_id = 3\n{long}\n# sent_id = 4\n{good}\n",
                 encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        sents = read_conllu(f)
    assert [s.sent_id for s in sents] == ["1", "3", "4"]
    assert f"{f}:6" in caplog.text  # file:line of the malformed line
    with caplog.at_level(logging.WARNING):
        c = dependency_accuracy(minilm, sents, max_length=32)
    assert c.skipped_long == 1 and c.sentences == 2 and c.total["nsubj"] == 2
    assert "longer than 32 tokens were skipped" in caplog.text
    with pytest.raises(HeadscopeError, match="no treebank sentence fits"):
        dependency_accuracy(minilm, sents[1:2], max_length=32)


def test_read_documents_without_entities(tmp_path):
    f = tmp_path / "plain.conllu"
    f.write_text("1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n\n", encoding="utf-8")
    with pytest.raises(HeadscopeError, match="no Entity= mentions"):
        read_documents(f)


def test_minilm_coreference_on_gum(minilm):
    """Measured on the first 100 GUM test sentences: 162 anaphors, best head L1H1 0.54, nearest
    mention 0.22, same head word 0.62, chance 0.15 (docs/roles.md has the full split)."""
    from headscope.learned.roles.assign import _limit_docs

    docs, _ = read_documents("gum-test")
    c, info = coreference_accuracy(minilm, _limit_docs(docs, 100), max_length=128)
    d = c.to_dict()
    assert d["anaphors"] == info["anaphors"] > 100
    assert d["best_accuracy"] >= d["nearest_mention_baseline"] + 0.2, d
    assert d["best_accuracy"] >= 2.5 * d["chance"], d
    assert d["best_head"] == "L1H1"
