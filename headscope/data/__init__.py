"""Data: where passages come from (`sources`: the one resolver) and how they become model inputs (`prepare`)."""

from .prepare import (
    DEFAULT_MAX_LENGTH,
    Batch,
    TokenClasses,
    Tokens,
    batches,
    pad_id,
    prepare_tokens,
    resolve_max_length,
    token_classes,
    tokenize,
)
from .sources import (
    BUILTIN_NAMES,
    DEFAULT_LIMIT,
    LABELLED,
    PTB,
    PTB_MIN_WORDS,
    SAMPLE,
    TREEBANKS,
    Sentence,
    TextSource,
    labelled_builtin,
    ptb_sentences,
    read_conllu,
    read_jsonl,
    read_texts,
    treebank_path,
)

__all__ = [
    "BUILTIN_NAMES", "DEFAULT_LIMIT", "DEFAULT_MAX_LENGTH", "LABELLED", "PTB", "PTB_MIN_WORDS", "SAMPLE", "TREEBANKS",
    "Batch", "Sentence", "TextSource", "TokenClasses", "Tokens", "batches", "labelled_builtin", "pad_id",
    "prepare_tokens",
    "ptb_sentences", "read_conllu", "read_jsonl", "read_texts", "resolve_max_length", "token_classes",
    "tokenize", "treebank_path",
]
