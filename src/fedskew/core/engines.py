"""The names of the engines a run may choose (``engine = ...``) and where each one's runner is built.

Kept at the bottom of the house so the config can check a name without importing the engine layer: a
built-in engine is a ``"module:function"`` path, imported when a run uses it; a plug-in registers its own
function (:func:`fedskew.engine.runner.register_engine`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from fedskew.core.errors import ConfigError

ENGINES: dict[str, str | Callable[..., Any]] = {
    "local": "fedskew.engine.local:local_engine",
    "ray": "fedskew.engine.ray_workers:ray_engine",
}
"""Engine name -> its runner builder, or the ``module:function`` path of one."""


def add_engine(name: str, build: Callable[..., Any]) -> None:
    """Register ``build`` as ``engine = name``; a second function of another name for it is refused."""
    known = ENGINES.get(name)
    if callable(known) and known.__qualname__ != build.__qualname__:  # the same file imported twice is fine
        raise ConfigError(f"engine {name!r} is registered twice ({known.__qualname__}, {build.__qualname__})")
    ENGINES[name] = build


def check_engine(name: str) -> None:
    """Refuse an engine nobody registered, naming the ones there are."""
    if name not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(sorted(ENGINES))}, got {name!r}")


def engine_builder(name: str) -> Callable[..., Any]:
    """The runner builder of engine ``name`` (a built-in one's module is imported now)."""
    check_engine(name)
    build = ENGINES[name]
    if isinstance(build, str):
        module, function = build.split(":")
        build = getattr(importlib.import_module(module), function)
    return build
