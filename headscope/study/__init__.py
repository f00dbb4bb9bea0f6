"""`headscope study`: one command that answers the three questions for a model, within a time budget.

It runs the existing verbs (analyze, roles, similar, score, patch, circuit, prune, kv, gqa, mla, compare, kvcache,
report) that the model's family supports, in-process, into one folder; sizes each from a timed probe so the whole
ends within the budget; reuses stages whose model, data and options match (an interrupted study continues);
and prints one paragraph per question, which also heads the report. See docs/study.md.
"""

from .budget import parse_duration
from .options import StudyOptions
from .runner import study

__all__ = ["StudyOptions", "parse_duration", "study"]
