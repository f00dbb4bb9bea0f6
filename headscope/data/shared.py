"""Reading and tokenising each corpus once for a run of many verbs on one model (a study).

Outside `shared_data()` nothing is kept: every call reads and tokenises afresh, as a single verb wants.
Inside it, `read_texts` keeps each (corpus, limit) it read and `prepare_tokens` each (tokenizer, passages,
max length) it tokenised, so five stages on PTB valid read and tokenise it once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")
_MEMO: ContextVar[dict[Hashable, Any] | None] = ContextVar("headscope_shared_data", default=None)


@contextmanager
def shared_data() -> Iterator[None]:
    """While active, what is read or tokenised is kept and handed out again (a study holds one)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def remembered(key: Hashable, make: Callable[[], T]) -> T:
    """`make()`, or what it gave for `key` before while `shared_data()` is active."""
    memo = _MEMO.get()
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]
