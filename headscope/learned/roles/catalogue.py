"""Every role, short and long range: one registration each, beside its rule (docs/roles.md,
docs/long_context.md state the same rules).

Adding a role is one registration here (and its test): the census, `decide`, `decide_long`,
roles.csv / roles.json and the report read the registry. Its score must come from a pass (a
statistic, the text pass, the induction, treebank or coreference pass, or the long-range passes);
a new roles.csv column is declared in `headscope.artifacts.ROLES_CSV` as well.

Registration order is the order a head's roles are listed in (roles.csv's `roles`); `order` places
each role in the census.
"""

from __future__ import annotations

import numpy as np

from ..syntax import RELATIONS
from .registry import RoleThresholds, Threshold, role
from .text import KERNEL_OFFSETS, offset_score


def beats_uniform(score: np.ndarray, baseline: np.ndarray, threshold: float, min_ratio: float) -> np.ndarray:
    """The usual rule: score >= `threshold` and >= `min_ratio` x its (uniform-head) baseline."""
    return (score >= threshold) & (score >= min_ratio * baseline)


MIN_RATIO = Threshold("min_ratio", 3.0, "score / uniform-head baseline on the same queries and keys")

# --- short range: the census of `roles()` ---------------------------------------------------------
OFFSET_MASS = Threshold("offset_mass", 0.5, "mass at one fixed offset (previous/next/self/positional)")


def offset_rule(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """A fixed-offset head: most of its weight at one offset, well above the uniform head's."""
    return beats_uniform(score, baseline, th.offset_mass, th.min_ratio)


OFFSET_ROLES = ((-1, "previous_token", 0, "the previous token"), (1, "next_token", 1, "the next token"),
                (0, "self", 2, "the query's own position"), (-3, "positional:-3", 3, "three back"),
                (-2, "positional:-2", 3, "two back"), (2, "positional:+2", 3, "two ahead"),
                (3, "positional:+3", 3, "three ahead"))  # (offset, role, census order, what it attends to)
for _offset, _name, _order, _what in OFFSET_ROLES:
    # offsets -1, 0, +1 are heads.csv's prev_token_mass, self_mass, next_token_mass: no column of their own
    role(_name, help=f"attends to {_what}", scope="short", order=_order, score=offset_score(_offset),
         baseline=offset_score(_offset) + "_uniform", thresholds=(OFFSET_MASS, MIN_RATIO),
         column=None if _offset in KERNEL_OFFSETS else offset_score(_offset))(offset_rule)
del _offset, _name, _order, _what


@role("sink", help="rests on position 0 ([CLS]/BOS, or the first token)", scope="short", order=4, score="sink_mass",
      baseline="sink_mass_uniform", column="sink_mass",
      thresholds=(Threshold("sink_mass", 0.5, "mass on the first token, queries after it"), MIN_RATIO))
def sink(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Most of the weight on the first token."""
    return beats_uniform(score, baseline, th.sink_mass, th.min_ratio)


@role("delimiter", help="attends to [SEP]/EOS/punctuation", scope="short", order=5, score="delimiter_mass",
      baseline="delimiter_mass_uniform", column="delimiter_mass",
      thresholds=(Threshold("delimiter_mass", 0.5, "mass on [SEP]/EOS/punctuation (first token excluded)"), MIN_RATIO))
def delimiter(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Most of the weight on delimiters."""
    return beats_uniform(score, baseline, th.delimiter_mass, th.min_ratio)


@role("broad", help="spreads its weight nearly evenly", scope="short", order=6, score="entropy_norm", baseline=None,
      thresholds=(Threshold("broad_entropy", 0.85, "normalised entropy (1 = uniform)"),))
def broad(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Normalised entropy near a uniform head's 1."""
    return score >= th.broad_entropy


@role("local", help="attends much closer than a uniform head", scope="short", order=7, score="mean_distance",
      baseline="uniform_distance", higher_is_better=False, column="uniform_distance",  # mean_distance is heads.csv's
      thresholds=(Threshold("local_ratio", 0.3, "mean distance / uniform head's mean distance"),))
def local(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Mean attention distance a fraction of the uniform head's."""
    return score <= th.local_ratio * baseline


@role("induction", help="from a repeated token to the token after its first occurrence", scope="short", order=8,
      score="induction_score", baseline="induction_score_uniform", column="induction_score",
      thresholds=(Threshold("induction_score", 0.3, "mass from a 2nd occurrence to the token after the 1st occurrence"),
                  MIN_RATIO))
def induction(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Induction on repeated random tokens."""
    return beats_uniform(score, baseline, th.induction_score, th.min_ratio)


@role("duplicate_token", help="from a repeated token to its first occurrence", scope="short", order=9,
      score="duplicate_score", baseline="duplicate_score_uniform", column="duplicate_score",
      thresholds=(Threshold("duplicate_score", 0.3, "mass from a 2nd occurrence to the 1st occurrence"), MIN_RATIO))
def duplicate_token(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Duplicate-token attention on repeated random tokens."""
    return beats_uniform(score, baseline, th.duplicate_score, th.min_ratio)


@role("rare_word", help="attends to the passage's rarest word", scope="short", order=10, score="rare_word_mass",
      baseline="rare_word_mass_uniform", column="rare_word_mass",
      thresholds=(Threshold("rare_word_mass", 0.3, "mass on the sentence's rarest word"), MIN_RATIO))
def rare_word(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Most of the weight on the rarest word's tokens."""
    return beats_uniform(score, baseline, th.rare_word_mass, th.min_ratio)


@role("syntactic", help="finds a dependency relation's other word (Clark et al. 2019)", scope="short", order=11,
      score="syntax_{member}", baseline="syntax_{member}_baseline", count="syntax_{member}_count",
      min_count="syntax_min_count", column="syntax_{member}", column_members=RELATIONS,
      thresholds=(Threshold("syntax_margin", 0.1, "accuracy above the relation's best fixed-offset baseline"),
                  Threshold("syntax_min_count", 20, "arcs of a relation needed before any head gets it as a role")))
def syntactic(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Accuracy (the better direction) above the best fixed offset by a margin."""
    return score >= baseline + th.syntax_margin


@role("coreference", help="attends from an anaphor to its antecedent", scope="short", order=12,
      score="coref_accuracy", baseline="coref_accuracy_baseline", count="coref_anaphors", column="coref_accuracy",
      thresholds=(Threshold("coref_margin", 0.0, "accuracy above the better of the nearest-mention and "
                                                 "same-head baselines"),))
def coreference(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Antecedent accuracy above the better simple rule."""
    return score > baseline + th.coref_margin


# --- long range: `long_roles()` at --long N tokens (docs/long_context.md) -------------------------------
@role("retrieval", help="copies the needle's tokens (Wu et al. 2024)", scope="long", order=20, score="retrieval_score",
      baseline="retrieval_score_uniform", column="retrieval_score", label="retrieval (needle copy, Wu et al. 2024)",
      card="retrieval",
      thresholds=(Threshold("retrieval_score", 0.1, "Wu et al. 2024 call heads above 0.1 retrieval heads"), MIN_RATIO))
def retrieval(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Needle copies well above a random top-1 key's."""
    return beats_uniform(score, baseline, th.retrieval_score, th.min_ratio)


@role("streaming", help="keeps its weight on sink + recent window (DuoAttention)", scope="long", order=21,
      score="streaming_share", baseline="streaming_share_uniform", column="streaming_share",
      label="streaming (sink + recent window)", card="streaming",
      thresholds=(Threshold("streaming_share", 0.9, "nearly all weight within sink + recent window"),
                  # A uniform head already puts (sink + recent) / keys-seen there (0.34 at 2,048 tokens), so
                  # 3x its share cannot be asked; streaming asks for this much more than the uniform head.
                  Threshold("streaming_margin", 0.5, "share above the uniform head's")))
def streaming(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Nearly all weight within sink + recent window, well above the uniform head's share."""
    return (score >= th.streaming_share) & (score - baseline >= th.streaming_margin)


@role("echo_far", help="attends to earlier copies of its token far back", scope="long", order=22, score="echo_far",
      baseline="echo_far_uniform", column="echo_far", label="echo at long range", card="echo",
      thresholds=(Threshold("echo_far", 0.3, "mass on copies of the query's token at least `far` back"), MIN_RATIO))
def echo_far(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Echo at long range (RazorAttention)."""
    return beats_uniform(score, baseline, th.echo_far, th.min_ratio)


@role("induction_far", help="attends to the tokens after far copies of its token", scope="long", order=23,
      score="induction_far", baseline="induction_far_uniform", column="induction_far",
      label="induction at long range", card="induction",
      thresholds=(Threshold("induction_far", 0.3, "mass on the tokens after such copies"), MIN_RATIO))
def induction_far(score: np.ndarray, baseline: np.ndarray, th: RoleThresholds) -> np.ndarray:
    """Induction at long range (RazorAttention)."""
    return beats_uniform(score, baseline, th.induction_far, th.min_ratio)
