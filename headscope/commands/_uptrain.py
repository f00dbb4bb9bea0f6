"""The texts of the verbs that uptrain a model by distillation (gqa, mla); their option checks are in
`capacity.options.ConversionOptions.check`."""

from __future__ import annotations

from ..capacity.options import ConversionOptions
from ..data import TextSource, read_texts


def read_uptrain_texts(options: ConversionOptions) -> tuple[TextSource, TextSource]:
    """The options' data and held-out text, each read once (with their limits): the command passes them on to the
    library function, which reads nothing itself."""
    return read_texts(options.data, options.limit), read_texts(options.heldout, options.heldout_limit)
