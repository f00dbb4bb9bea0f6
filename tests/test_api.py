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
