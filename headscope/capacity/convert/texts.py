"""The text a conversion reads: calibration / uptraining text and held-out text, with the defaults gqa and mla share."""

from __future__ import annotations

from typing import Any

from ...data import TextSource, read_texts

__all__ = ["CALIBRATION_DATA", "CALIBRATION_HELDOUT", "conversion_texts"]

#: Text a conversion reads when none is given: calibration / uptraining from PTB train, perplexity on PTB valid
#: (not the study's DEFAULT_DATA, which is the passages its analyses read).
CALIBRATION_DATA = "ptb-train"
CALIBRATION_HELDOUT = "ptb-valid"


def conversion_texts(data: Any, limit: int | None, default: str) -> Any:
    """In-memory data (a TextSource, as a verb passes what it read, or a list of texts / token-id lists) as given;
    else `read_texts` of `data` (or `default` when None) with `limit`."""
    if isinstance(data, (TextSource, list)):
        return data
    return read_texts(default if data is None else data, limit)
