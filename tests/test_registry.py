"""Registries: a decorator beside the function, metadata on the entry, "did you mean" errors."""

from __future__ import annotations

import pytest

from headscope.errors import HeadscopeError
from headscope.registry import Registry


def test_register_get_and_metadata():
    reg: Registry = Registry("widget")

    @reg.register("alpha", help="first", cost=2)
    def alpha() -> int:
        return 1

    @reg.register("beta", help="second")
    def beta() -> int:
        return 2

    assert reg.names() == ("alpha", "beta") and "alpha" in reg and len(reg) == 2
    assert reg.get("alpha").fn() == 1 and reg.get("alpha").cost == 2
    assert reg.help_lines() == ["alpha: first", "beta: second"]
    with pytest.raises(AttributeError):
        _ = reg.get("beta").cost
    with pytest.raises(
        HeadscopeError, match=r"unknown widget 'alhpa' \(did you mean 'alpha'\?\); choose one of alpha, beta"
    ):
        reg.get("alhpa")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("alpha", help="again")(alpha)
