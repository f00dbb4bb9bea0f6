"""Registries: the extension points (importance criteria, task metrics, GQA groupings) as one small class.

An entry is registered by a decorator beside its function, with its metadata, so a new criterion is
one new function (and its test) and no dispatch code changes:

    CRITERIA = Registry("importance criterion")

    @CRITERIA.register("taylor", help="|gate gradient x activation| (Molchanov et al.)")
    def taylor(...): ...

    CRITERIA.get("taylr")  # HeadscopeError: unknown importance criterion 'taylr' (did you mean 'taylor'?) ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, TypeVar

from .errors import HeadscopeError, did_you_mean

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Entry(Generic[F]):
    """One registered function, its name, one line of help, and any other metadata."""

    name: str
    fn: F
    help: str
    meta: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, key: str) -> Any:
        # Metadata reads like attributes (entry.higher_is_better), without one dataclass per registry.
        meta = self.__dict__.get("meta", {})
        if key in meta:
            return meta[key]
        raise AttributeError(key)


class Registry(Generic[F]):
    """Named functions of one kind, in registration order, with "did you mean" errors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[F]] = {}

    def register(self, name: str, *, help: str, **meta: Any) -> Callable[[F], F]:
        """Decorator: add the function under `name` with one line of `help` and metadata."""

        def add(fn: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = Entry(name, fn, help, dict(meta))
            return fn

        return add

    def get(self, name: str) -> Entry[F]:
        """The entry called `name`, or a clear error listing the known names."""
        try:
            return self._entries[name]
        except KeyError:
            raise HeadscopeError(f"unknown {self.kind} {name!r}{did_you_mean(name, self._entries)}; "
                                 f"choose one of {', '.join(self._entries)}") from None

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._entries)

    def help_lines(self) -> list[str]:
        """`name: help` for every entry (for --help texts and docs)."""
        return [f"{e.name}: {e.help}" for e in self._entries.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


class ScopedRegistry(Generic[F]):
    """Named functions of one kind, each for one or more *scopes* (e.g. the importance criteria of heads,
    attention sub-layers, blocks and FFN neurons): the same name may mean a different function in another
    scope ("ablation" of a head and of a block). Without a scope, the default scope is meant."""

    def __init__(self, kind: str, default_scope: str, scopes: tuple[str, ...] = ()) -> None:
        self.kind, self.default_scope = kind, default_scope
        # scope -> name -> entry; `scopes` fixes their order (else: the order of first registration)
        self._entries: dict[str, dict[str, Entry[F]]] = {s: {} for s in (default_scope, *scopes)}

    def register(self, name: str, *, help: str, scope: str | tuple[str, ...] | None = None,
                 **meta: Any) -> Callable[[F], F]:
        """Decorator: add the function under `name` in each of `scope` (default: the default scope)."""
        scopes = (scope,) if isinstance(scope, str) else tuple(scope or (self.default_scope,))

        def add(fn: F) -> F:
            for s in scopes:
                entries = self._entries.setdefault(s, {})
                if name in entries:
                    raise ValueError(f"{self.kind} {name!r} is registered twice for {s}")
                entries[name] = Entry(name, fn, help, {**meta, "scope": s})
            return fn

        return add

    def get(self, name: str, scope: str | None = None) -> Entry[F]:
        """The entry called `name` in `scope`, or a clear error listing that scope's names."""
        s = scope or self.default_scope
        entries = self._entries.get(s, {})
        if name in entries:
            return entries[name]
        where = "" if s == self.default_scope else f" for {s}"
        raise HeadscopeError(f"unknown {self.kind} {name!r}{where}{did_you_mean(name, entries)}; "
                             f"choose one of {', '.join(entries) or '(none)'}")

    def names(self, scope: str | None = None) -> tuple[str, ...]:
        """Names registered in `scope` (default scope when None), in registration order."""
        return tuple(self._entries.get(scope or self.default_scope, {}))

    def scopes(self) -> tuple[str, ...]:
        """Every scope with at least one entry (in the order given, then of first registration)."""
        return tuple(s for s, entries in self._entries.items() if entries)

    def help_lines(self, scope: str | None = None) -> list[str]:
        """`name: help` for every entry of `scope` (for --help texts and docs)."""
        return [f"{e.name}: {e.help}" for e in self._entries.get(scope or self.default_scope, {}).values()]

    def __contains__(self, name: object) -> bool:
        return name in self._entries.get(self.default_scope, {})

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
