"""The one runner protocol: where a run's client jobs and its evaluation chunks run.

The round loop hands a :class:`Runner` a round's :class:`ClientJob` list and gets back, in job order, one
:data:`Outcome` per job: the client's reply (or :class:`~fedskew.engine.replies.Undecodable` when it could
not be read) with the client's new state, or :class:`NoReply` for a client that did not answer. The
global model's evaluation goes through the same runner (:meth:`Runner.evaluate_chunks`).

Engines (``engine = ...`` in a config) build runners. ``local`` (:mod:`~fedskew.engine.workers`: inline
or a process pool) and ``ray`` (:mod:`~fedskew.engine.ray_workers`) come with fedskew; a Flower deployment
puts its SuperNodes in front of the local runner (:class:`RemoteClients`). A new engine is one file
holding a function decorated with :func:`register_engine` (docs/architecture.md, "Add an engine").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from fedskew.core.engines import add_engine, engine_builder
from fedskew.core.message import Message
from fedskew.engine.replies import Undecodable
from fedskew.models.evaluation import EvalCounts

if TYPE_CHECKING:
    from fedskew.config.schema import RunConfig
    from fedskew.core.device import Compute
    from fedskew.engine.federation import Federation


@dataclass
class ClientJob:
    """One task for one client: ``task`` (``"train"``, ``"evaluate"`` ...) with the server's message and
    the client's state as the server holds it (empty where the client's node keeps it)."""

    task: str
    cid: int
    round: int
    msg: Message
    state: dict[str, Any]


@dataclass
class NoReply:
    """A client that did not answer: its node was lost, timed out, or its app failed (real deployments)."""

    reason: str


Outcome = tuple[Message | Undecodable, dict[str, Any]] | NoReply
"""What a runner returns for one job."""


class ClientSide(Protocol):
    """Where client jobs run when not in this machine's runner (Flower: the SuperNodes)."""

    def run_clients(self, jobs: list[ClientJob]) -> Sequence[Outcome]: ...


class Runner(ClientSide, Protocol):
    """Runs client jobs and chunks of the global evaluation; :meth:`close` frees what it holds."""

    def evaluate_chunks(
        self, model_state: dict[str, torch.Tensor], bounds: list[tuple[int, int]]
    ) -> list[EvalCounts]: ...

    def close(self) -> None: ...


@dataclass
class RemoteClients:
    """A runner whose client jobs go to ``clients`` (a deployment's nodes) while ``local`` evaluates the
    global model here."""

    clients: ClientSide
    local: Runner

    def run_clients(self, jobs: list[ClientJob]) -> Sequence[Outcome]:
        return self.clients.run_clients(jobs)

    def evaluate_chunks(self, model_state: dict[str, torch.Tensor], bounds: list[tuple[int, int]]) -> list[EvalCounts]:
        return self.local.evaluate_chunks(model_state, bounds)

    def close(self) -> None:
        self.local.close()


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


class EngineCache:
    """What engines keep from one run of an experiment to the next (the local engine's worker pool), so that
    it starts once: one held object per ``slot``, kept while the runs ask for it with an equal ``key``.

    :func:`~fedskew.engine.experiment.run_experiment` holds one and closes it when the experiment ends; a
    run started alone has none, and its runner starts and ends what it needs.
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[Hashable, Closable]] = {}

    def get(self, slot: str, key: Hashable, make: Callable[[], C]) -> C:
        """The object held in ``slot`` if it was made for ``key`` and is not broken (a ``broken`` attribute that
        is true), else a new one from ``make()`` (the one held before is closed first)."""
        held = self._held.get(slot)
        if held is not None and held[0] == key and not getattr(held[1], "broken", False):
            return held[1]  # type: ignore[return-value]  # made by the same slot's make()
        self.release(slot)
        made = make()
        self._held[slot] = (key, made)
        return made

    def release(self, slot: str | None = None) -> None:
        """Close what ``slot`` holds (None: every slot)."""
        for name in [slot] if slot is not None else list(self._held):
            held = self._held.pop(name, None)
            if held is not None:
                held[1].close()

    def close(self) -> None:
        self.release()


@dataclass(frozen=True)
class EngineContext:
    """What an engine gets to build a run's runner: the federation, the algorithm's name and typed
    parameters (its client half runs in the runner), the run's typed config and its resolved compute;
    ``cache`` where the run is one of an experiment's (what the engine may keep for the next run)."""

    fed: Federation
    algorithm: str
    params: Any
    config: RunConfig
    compute: Compute
    cache: EngineCache | None = None


def register_engine(name: str) -> Callable[[Callable[[EngineContext], Runner]], Callable[[EngineContext], Runner]]:
    """Register a runner builder as ``engine = name`` (a plug-in file may hold one)."""

    def add(build: Callable[[EngineContext], Runner]) -> Callable[[EngineContext], Runner]:
        add_engine(name, build)
        return build

    return add


def make_runner(ctx: EngineContext, clients: ClientSide | None = None) -> Runner:
    """The run's runner: its engine's, with ``clients`` (a deployment's nodes) in front when given."""
    local: Runner = engine_builder(ctx.config.run.engine)(ctx)
    return local if clients is None else RemoteClients(clients, local)


def width_of(setting: int | str, algorithm: str, compute: Compute, workers: int) -> int:
    """The config's ``clients_in_parallel``; ``"auto"``: all of a round's (0) on one CUDA device (``compute``'s
    devices, one worker process each) in one process (``workers`` 0 or 1), else 1 (the sequential runner).
    A method whose clients' work has no batched form (:attr:`~fedskew.algorithms.base.Algorithm.unbatched_client_work`:
    FedDM's, FedAF's and FedDC's condensations) keeps the sequential runner under ``"auto"``, whose worker
    processes run its clients side by side. The batched runner and the memory estimate (:mod:`fedskew.engine.memory`)
    both resolve it here."""
    from fedskew.algorithms.base import ALGORITHMS  # the registry, filled by the time a run is configured

    if setting != "auto":
        return int(setting)
    if ALGORITHMS.get(algorithm).unbatched_client_work:
        return 1
    devices = compute.workers or (compute.device,)
    one_gpu = len(devices) == 1 and devices[0].startswith("cuda")
    return 0 if one_gpu and workers <= 1 else 1
