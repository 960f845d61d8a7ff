"""Name -> factory registries for algorithms, models, datasets and partitioners.

Modules register their objects with a decorator; lookups of unknown names raise a
:class:`~fedskew.core.errors.ConfigError` that lists the allowed names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from fedskew.core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of objects of one kind (``"model"``, ``"algorithm"`` ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register ``obj`` under ``name`` (names are unique)."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """Return the object registered as ``name``; a clear error names the allowed ones."""
        try:
            return self._items[name]
        except KeyError:
            allowed = ", ".join(sorted(self._items))
            raise ConfigError(f"unknown {self.kind} {name!r}; allowed: {allowed}") from None

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
