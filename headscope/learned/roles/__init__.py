"""Role census: every role is a per-head score beside a baseline, with a documented decision rule.

Scores come from up to four streamed passes, each reduced per batch and per layer (no map of the
data set is ever held):

1. the text (`data`, `text.py`): analyze's statistics plus mass at offsets -3..+3, on the first
   token (sink), on delimiters and on the sentence's rarest word, each beside the mass a uniform
   head would put on the same keys of the same queries;
2. random token sequences repeated twice (`induction.py`: induction, duplicate-token), beside the
   uniform mass;
3. a CoNLL-U treebank (syntactic:<relation>, Clark et al. 2019), beside the best fixed offset;
4. a CorefUD file such as GUM (coreference), beside the nearest-mention and same-head-word baselines.

Every role, short and long range, is one registration in `catalogue.py` (the registry:
`registry.py`); `decide` applies their rules with the thresholds in `Thresholds`; `assign.py`
runs the passes. docs/roles.md states every rule.
"""

# registers every role: importing any part of the package loads them
from . import catalogue
from .assign import (
                     CorefSource,
                     RoleSettings,
                     TreebankSource,
                     census,
                     coref_scores,
                     decide,
                     read_coref,
                     read_treebank,
                     roles,
                     syntax_rows,
                     syntax_scores,
)
from .induction import induction_scores, repeated_sequences, special_frame
from .registry import ROLES, LongThresholds, RoleThresholds, Threshold, Thresholds, census_of, judge, role, role_columns
from .text import OFFSETS, RoleReducer, normalise_word, offset_score, ptb_frequencies, rare_word_targets, reduce_roles

__all__ = ["OFFSETS", "ROLES", "CorefSource", "LongThresholds", "RoleReducer", "RoleSettings", "RoleThresholds",
           "Threshold", "Thresholds", "TreebankSource", "catalogue", "census", "census_of", "coref_scores", "decide",
           "induction_scores", "judge", "normalise_word", "offset_score", "ptb_frequencies", "rare_word_targets",
           "read_coref", "read_treebank", "reduce_roles", "repeated_sequences", "role", "role_columns", "roles",
           "special_frame", "syntax_rows", "syntax_scores"]
