"""Spies: a function of fedskew replaced for one test (``monkeypatch``) by one that records its calls, then runs."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


def spy_pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every worker pool started from now on (an experiment's and a lone run's), in order."""
    from fedskew.engine import local, workers

    started: list[int] = []

    class Spied(workers.WorkerPool):
        def __init__(self, fed: Any, size: int, *args: Any) -> None:
            started.append(size)
            super().__init__(fed, size, *args)

    monkeypatch.setattr(local, "WorkerPool", Spied)
    monkeypatch.setattr(workers, "WorkerPool", Spied)
    return started


def spy_calls(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, record: Callable[[Any], Any] = len
) -> list[Any]:
    """Replace ``module.name``, a batched runner's entry point (called with a list of requests), by one that
    records ``record(requests)`` of every call (by default how many requests), then runs it."""
    calls: list[Any] = []
    run = getattr(module, name)

    def spying(requests: Any) -> Any:
        calls.append(record(requests))
        return run(requests)

    monkeypatch.setattr(module, name, spying)
    return calls


def record_amps(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str) -> list[str]:
    """Wrap ``module.name`` (a condensation called as ``f(x, y, sampler_or_factory, cfg, ...)``) so each
    call's ``cfg.amp`` is recorded in the returned list: which precision a method condensed in."""
    amps: list[str] = []
    real = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        amps.append(args[3].amp)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return amps
