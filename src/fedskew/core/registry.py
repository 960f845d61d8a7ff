"""Name -> factory registries for algorithms, models, datasets and partitioners.

Modules register their objects with a decorator; lookups of unknown names raise a
:class:`~fedskew.core.errors.ConfigError` that lists the allowed names.

An entry may carry a *Params* class: a dataclass of the options a config table for that entry may
hold, with defaults and declared bounds (an :class:`~fedskew.core.params.Options` subclass; see
:mod:`fedskew.core.params`).
:meth:`Registry.build_params` turns a whole config table into that dataclass, so every kind of table
(``[dataset]``, ``[partition]``, ``[model]``, ``[algorithm]``) is validated the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from fedskew.core.errors import ConfigError
from fedskew.core.params import build_params

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of objects of one kind (``"model"``, ``"algorithm"`` ...).

    Parameters
    ----------
    kind
        What the entries are, for error messages.
    base
        Optional Params dataclass that every entry must be registered with (or with a subclass of
        it): the keys every table of this kind may hold, e.g. ``data_dir`` for datasets.
    """

    def __init__(self, kind: str, base: type | None = None) -> None:
        self.kind = kind
        self.base = base
        self._items: dict[str, T] = {}
        self._params: dict[str, type] = {}

    def register(self, name: str, params: type | None = None) -> Callable[[T], T]:
        """Decorator: register ``obj`` under ``name`` (names are unique), with its Params class ``params``."""
        if params is not None and not dataclasses.is_dataclass(params):
            raise TypeError(f"{self.kind} {name!r}: params must be a dataclass, got {params!r}")
        if self.base is not None and (params is None or not issubclass(params, self.base)):
            raise TypeError(f"{self.kind} {name!r} must be registered with a subclass of {self.base.__name__}")

        def deco(obj: T) -> T:
            if name in self._items and _where(self._items[name]) != _where(obj):
                # The same definition again (a notebook cell run twice, a plug-in imported again after it
                # failed) replaces the entry; another definition under a taken name is refused.
                raise ValueError(
                    f"{self.kind} {name!r} is registered twice (by {_where(self._items[name])} and by "
                    f"{_where(obj)}); choose another name"
                )
            self._items[name] = obj
            if params is not None:
                self._params[name] = params
            return obj

        return deco

    def get(self, name: str) -> T:
        """Return the object registered as ``name``; a clear error names the allowed ones."""
        try:
            return self._items[name]
        except KeyError:
            allowed = ", ".join(sorted(self._items))
            raise ConfigError(f"unknown {self.kind} {name!r}; allowed: {allowed}") from None

    def params_of(self, name: str) -> type | None:
        """The Params class of ``name``: the one it was registered with, else its ``Params`` attribute
        (algorithm classes carry theirs), else ``None``."""
        obj = self.get(name)
        return self._params.get(name) or getattr(obj, "Params", None)

    def default(self, name: str, key: str) -> Any:
        """The default of option ``key`` of entry ``name``; :data:`dataclasses.MISSING` when it has no such
        option or the option is required."""
        for f in dataclasses.fields(self._params_class(name)):
            if f.name == key:
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
                return f.default
        return dataclasses.MISSING

    def keys(self, name: str) -> list[str]:
        """Keys a config table for ``name`` may hold besides ``name``: its own, then those of :attr:`base`."""
        fields = [f.name for f in dataclasses.fields(self._params_class(name))]
        shared = {f.name for f in dataclasses.fields(self.base)} if self.base is not None else set()
        return [k for k in fields if k not in shared] + [k for k in fields if k in shared]

    def build_params(self, name: str, table: Mapping[str, Any], prefix: str = "") -> Any:
        """Validate the config table of entry ``name`` and return its Params instance.

        Parameters
        ----------
        name
            A registered name.
        table
            The table as read from a config file; a ``name`` key in it is skipped. A Params class
            whose ``EXTRA_KEYS`` class attribute names a dict field receives every other key there
            (a partitioner that forwards options to another one does).
        prefix
            Printed before each key in error messages (``"dataset."``).

        Raises
        ------
        ConfigError
            For an unknown name, an unknown key (naming the allowed ones), a missing required key, or a
            value of the wrong type or out of range (naming the key and what is allowed).
        """
        cls = self._params_class(name)
        values = {k: v for k, v in table.items() if k != "name"}
        allowed = self.keys(name)
        extra = getattr(cls, "EXTRA_KEYS", None)
        if extra is not None:
            rest = {k: values.pop(k) for k in list(values) if k not in allowed}
            given = values.get(extra, {})
            if rest and isinstance(given, Mapping):
                values[extra] = {**given, **rest}
        renamed = getattr(cls, "renamed", {})  # moved keys: build_params names the new one
        for key in values:
            if key not in allowed and key not in renamed:
                raise ConfigError(
                    f"unknown key {prefix + key!r} for {self.kind} {name!r}; allowed: {', '.join(allowed)}"
                )
        for f in dataclasses.fields(cls):
            missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if missing and f.init and f.name not in values:
                raise ConfigError(f"{prefix}{f.name} is required by {self.kind} {name!r}")
        return build_params(cls, values, prefix)

    def _params_class(self, name: str) -> type:
        cls = self.params_of(name)
        if cls is None:
            raise TypeError(f"{self.kind} {name!r} has no Params class")
        return cls

    def names(self) -> list[str]:
        """All registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


def _where(obj: object) -> str:
    """``module.qualname`` of a registered function or class (what tells two definitions apart)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
