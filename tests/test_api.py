"""The public API: every exported name resolves, even after its submodule has been imported."""

from __future__ import annotations

import importlib

import headscope


def test_every_public_name_resolves():
    for name in ("learned.analyze", "learned.roles", "learned.similarity", "redundancy.importance",
                 "redundancy.pruning.heads", "redundancy.curves", "capacity.gqa", "capacity.kv_bytes", "capacity.mha",
                 "capacity.sweep"):
        importlib.import_module(f"headscope.{name}")  # importing submodules must not shadow exports
    for name in headscope.__all__:
        obj = getattr(headscope, name)
        assert callable(obj) or isinstance(obj, dict), name
    assert headscope.role_census is importlib.import_module("headscope.learned.roles").roles
    assert headscope.head_similarity.__module__ == "headscope.learned.similarity"


def test_the_verbs_are_the_library_functions_that_return_results():
    """`headscope.<verb>(hm, data, **options)` is the verb's library function (tests/test_verbs_common.py runs
    each against the CLI); the report's is `headscope.report.report` (`headscope.report` is its package)."""
    import headscope.report

    for name, module in (("analyze", "learned"), ("roles", "learned"), ("similar", "learned"),
                         ("score", "redundancy"), ("tasks", "redundancy"), ("prune", "redundancy")):
        fn = getattr(headscope, name)
        assert fn.__module__ == f"headscope.{module}.verbs" and fn.__name__ == name, name
    assert headscope.report.report.__module__ == "headscope.report.verbs"
