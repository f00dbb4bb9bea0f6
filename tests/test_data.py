"""Reading data: CoNLL-U sentences rebuilt exactly as the treebanks wrote them; documents; PTB."""

from __future__ import annotations

from pathlib import Path

import pytest

from headscope.data import PTB_MIN_WORDS, ptb_sentences, read_conllu, read_texts, treebank_path
from headscope.errors import HeadscopeError


def text_lines(path: Path) -> list[str]:
    return [line.split("=", 1)[1].strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("# text =")]


@pytest.mark.parametrize("name", ["ewt-test", "gum-test"])
def test_rebuilt_sentences_equal_the_treebank_text(name):
    """Words joined by SpaceAfter (multiword tokens included) give back each `# text` line."""
    sentences = read_conllu(name)
    want = text_lines(treebank_path(name))
    assert len(sentences) == len(want)
    # Normalise no-break spaces: one EWT sentence writes one inside `# text` only.
    mismatches = [(a, b.text) for a, b in zip(want, sentences, strict=True) if a.replace("\xa0", " ") != b.text]
    assert not mismatches, mismatches[:3]


def test_documents_recorded():
    gum = read_conllu("gum-test")
    docs = {s.doc_id for s in gum}
    assert len(docs) > 1 and "" not in docs and gum[0].doc_id.startswith("GUM_")


def test_malformed_lines_skip_their_sentence(tmp_path, caplog):
    f = tmp_path / "bad.conllu"
    f.write_text("1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n\n1\tB\t_\t_\t_\t_\t0\troot\n\n"
                 "1\tC\t_\t_\t_\t_\t0\troot\t_\t_\n3\tD\t_\t_\t_\t_\t1\tdep\t_\t_\n\n")
    sentences = read_conllu(f)
    assert [s.words for s in sentences] == [["A"]]
    assert "bad.conllu:3" in caplog.text and "bad.conllu:6" in caplog.text
    with pytest.raises(HeadscopeError, match=r"bad.conllu:3: malformed"):
        read_conllu(f, strict=True)


def test_ptb_sentences():
    valid = read_texts("ptb-valid", limit=5)
    assert valid.source == "treebank:valid" and len(valid) == 5
    assert all(len(s.split()) >= PTB_MIN_WORDS == 6 for s in ptb_sentences("test", 20))  # the one PTB rule
    with pytest.raises(HeadscopeError, match="did you mean 'valid'"):
        ptb_sentences("vaild")


def test_builtin_treebanks_ship_in_the_package_with_their_licenses():
    """The UD test splits resolve inside the installed package, never beside the checkout."""
    import headscope

    root = Path(headscope.__file__).resolve().parent
    for name, n_sentences in (("ewt-test", 2077), ("gum-test", None)):
        path = treebank_path(name)
        assert root in path.resolve().parents and path.exists()
        assert (path.parent / "LICENSE-EWT.txt").exists() and (path.parent / "LICENSE-GUM.txt").exists()
        if n_sentences is not None:
            assert len(text_lines(path)) == n_sentences
    as_data = read_texts("ewt-test", limit=3)
    assert as_data.source == "ud:ewt-test" and len(as_data) == 3 and as_data.sentences is not None
    assert as_data.texts == [s.text for s in read_conllu("ewt-test")[:3]]


def test_unknown_treebank_name_suggests_the_builtin_ones():
    with pytest.raises(HeadscopeError, match=r"did you mean 'ewt-test'.*gum-test"):
        read_conllu("ewt-tset")


def test_builtin_corpus_default_limit_and_sample_read_whole():
    from headscope.data import DEFAULT_LIMIT

    assert len(read_texts("ptb-valid")) == DEFAULT_LIMIT
    assert len(read_texts("ewt-test")) == DEFAULT_LIMIT
    assert len(read_texts("sample")) == len(read_texts(None)) == 57
    with pytest.raises(HeadscopeError, match="did you mean 'ptb-valid'"):
        read_texts("ptb-vaild")


def test_shared_data_reads_and_tokenises_each_corpus_once(monkeypatch, tmp_path):
    """Within shared_data() (a study), a corpus is read once and tokenised once per length; outside, afresh."""
    from test_artifacts import tiny_bert_dir

    from headscope.data import prepare, sources
    from headscope.data.shared import shared_data
    from headscope.models import load_model

    hm = load_model(str(tiny_bert_dir(tmp_path)))
    calls = {"read": 0, "tokenize": 0}
    real_read, real_tok = sources._read_texts, prepare.tokenize

    def read(*a, **k):
        calls["read"] += 1
        return real_read(*a, **k)

    def tok(*a, **k):
        calls["tokenize"] += 1
        return real_tok(*a, **k)

    monkeypatch.setattr(sources, "_read_texts", read)
    monkeypatch.setattr(prepare, "tokenize", tok)
    with shared_data():
        a = prepare.prepare_tokens(hm, "sample", 16, 4)
        b = prepare.prepare_tokens(hm, "sample", 16, 4)
        prepare.prepare_tokens(hm, "sample", 8, 4)  # another length: tokenised again
    assert calls == {"read": 1, "tokenize": 2}
    assert a.ids == b.ids and a.ids is not b.ids and a.ids[0] is not b.ids[0]  # equal, never the same lists
    prepare.prepare_tokens(hm, "sample", 16, 4)
    assert calls == {"read": 2, "tokenize": 3}  # nothing kept outside
