"""The round loop of a run: the algorithm's server half, its exchanges with the clients, evaluation and
the round's record. Everything around a round (files, checkpoints, logs, progress) is a round callback
(:mod:`fedskew.engine.callbacks`); what happens to requests and replies is the reply pipeline
(:mod:`fedskew.engine.pipeline`); where the clients run is the runner (:mod:`fedskew.engine.runner`).

The same loop drives a simulation (its engine's runner on this machine or a Ray cluster) and a Flower
deployment (``clients``: the SuperNodes in front of the local runner). The run folder's files are
listed in :mod:`fedskew.runs`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedskew.algorithms.base import ALGORITHMS, Replies, ServerContext
from fedskew.algorithms.condensation.private import condensation_summary
from fedskew.config.schema import RunConfig
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.device import (
    set_deterministic_env,
    to_cpu,
    to_device,
    use_compute,
)
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.threads import num_threads
from fedskew.engine.callbacks import Record, RoundCallback, RoundTime, standard_callbacks
from fedskew.engine.callbacks.checkpoints import restore_state, save_state
from fedskew.engine.client_eval import ClientEvaluation
from fedskew.engine.federation import Federation, federation_for
from fedskew.engine.pipeline import ReplyPipeline, RoundBook, Task
from fedskew.engine.runner import ClientJob, ClientSide, EngineCache, EngineContext, Runner, make_runner
from fedskew.engine.summary import Recorder, run_summary
from fedskew.metrics import Ledger
from fedskew.models.evaluation import EVAL_CHUNK, EvalCounts, chunk_bounds
from fedskew.privacy.run import RunPrivacy

log = logging.getLogger("fedskew")


@dataclass
class RunResult:
    """What a finished (or stopped) run leaves behind."""

    run_dir: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)


class RoundLoop:
    """Runs one configured algorithm on one federation, round by round (simulated or deployed clients).

    ``config`` is the run's typed config (:func:`~fedskew.config.schema.typed_config`, which imports the
    config's plug-ins). ``callbacks`` run after the standard ones. ``engine_cache``: where the engine keeps what
    the experiment's next run may use (its worker pool); None: the run's own.
    """

    def __init__(
        self, config: RunConfig, run_dir: Path, *, data_dir: str | None = None, progress: bool = True,
        federation: Federation | None = None, on_round: Callable[[Record], None] | None = None,
        clients: ClientSide | None = None, callbacks: Sequence[RoundCallback] = (),
        engine_cache: EngineCache | None = None,
    ) -> None:
        if not isinstance(config, RunConfig):
            raise TypeError(f"RoundLoop takes the typed config (fedskew.config.typed_config), not {type(config)}")
        self.run_dir, self.clients = Path(run_dir), clients  # clients None: the engine's runner
        self.engine_cache = engine_cache
        self.config = config
        self.fed = federation or federation_for(config, data_dir)
        self.algorithm = ALGORITHMS.get(config.algorithm.name)(config.algorithm.params, self.fed.info)
        self.privacy = RunPrivacy.of(config, self.algorithm, self.fed.info.num_clients)  # None: [privacy] is off
        self.label = config.label
        self.client_eval = ClientEvaluation(self.fed, self.algorithm, config.eval, self.max_bytes)
        self.ledger = Ledger()
        self.pipeline = ReplyPipeline(config.faults, self.fed.info.seed, self.fed.info.num_clients, self.ledger)
        self.client_states: dict[int, dict[str, Any]] = {}
        self.round = 0
        self.runner: Runner | None = None
        self._wire: tuple[Message, Message] | None = None  # the last request and its CPU copy
        self.callbacks = [*standard_callbacks(progress, on_round), *callbacks]
        self.recorder = Recorder(self.fed, self.client_eval)
        self.compute = config.compute
        if self.compute.deterministic:
            set_deterministic_env()
        self.device = self.compute.torch_device
        self.server = ServerContext(
            fed=self.fed.info, model=self.algorithm.init_model().to(self.device), exchange=self.exchange,
            artifacts=self._save_artifact, device=self.device, rejections=self._reject,
            shard_sizes=tuple(int(b - a) for a, b in zip(self.fed.offsets[:-1], self.fed.offsets[1:], strict=True)),
        )

    @property
    def max_bytes(self) -> int:
        return int(self.config.faults.max_reply_mb * 1e6)

    @property
    def book(self) -> RoundBook:
        return self.pipeline.book

    # ---- the exchange the algorithm calls ---------------------------------------------------------
    def exchange(self, task: str, messages: list[tuple[int, Message]], down: str | None = "server_to_client",
                 up: str | None = "client_to_server") -> Replies:
        """Deliver each message to its client, run ``client_step`` there, return the usable replies in order
        (:mod:`fedskew.engine.pipeline` books the others as the round's ``failed`` or ``rejected``)."""
        assert self.runner is not None
        if self.privacy is not None:  # local DP and DP-SGD: the upload requests say the clients' mechanism
            messages = self.privacy.requests(task, messages)
        jobs, fates = [], {}
        for cid, msg in messages:
            if not 0 <= cid < self.fed.info.num_clients:
                raise FedskewError(f"{self.algorithm.name} addressed client {cid}, which does not exist")
            fates[cid] = self.pipeline.send(task, cid, msg, down)
            if fates[cid] != "dropout":
                jobs.append(ClientJob(task, cid, self.round, self._on_wire(msg), self.client_states.get(cid, {})))
        shard = self.fed.offsets
        scalars = self.algorithm.reply_scalars(task, self.server)
        if self.privacy is not None:
            scalars = {**scalars, **self.privacy.reply_scalars(task)}
        spec = Task(
            task, self.algorithm.reply_spec(task, self.server), scalars, self.fed.info.num_classes, self.max_bytes,
            lambda c: self.algorithm.sample_limit(c, shard[c + 1] - shard[c], self.server),
        )
        outcomes = self.runner.run_clients(jobs)
        rejected = len(self.book.rejected)
        replies = self.pipeline.receive(jobs, outcomes, fates, spec, self.client_states, up)
        if len(self.book.rejected) > rejected and task in getattr(self.clients, "summed_tasks", ()):
            cid, reason = self.book.rejected[rejected]
            raise FedskewError(  # secure aggregation (engine/flower/secagg.py): the upload is inside the mean
                f"round {self.round}: the {task!r} reply of client {cid} was rejected ({reason}), but secure "
                "aggregation had already added its upload to the sum, which cannot be taken out; the run stops here"
            )
        if self.device.type != "cpu":
            replies = [(cid, Message(to_device(m.arrays, self.device), m.config, m.metrics)) for cid, m in replies]
        if self.privacy is not None:  # every engine's replies pass here: central DP's noised mean, the accounting
            replies = self.privacy.received(task, self.round, [j.cid for j in jobs], dict(messages), replies)
        return replies

    def _reject(self, cid: int, reason: str) -> None:
        """The server half dropped an accepted reply (an outlying update, a robust rule's cut)."""
        log.warning("round %d: the algorithm rejected the reply of client %d: %s", self.round, cid, reason)
        self.book.reject(cid, reason)

    def _on_wire(self, msg: Message) -> Message:
        """A request as it travels: its arrays on the CPU (the server's may be on a GPU); one message sent to
        every selected client is moved once."""
        if self.device.type == "cpu":
            return msg
        if self._wire is None or self._wire[0] is not msg:
            self._wire = (msg, Message(to_cpu(msg.arrays), msg.config, msg.metrics))
        return self._wire[1]

    def _save_artifact(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """The method's artifact: every callback gets it (the run folder's file is one, :mod:`.callbacks.run_files`)."""
        if not name.replace("_", "").isalnum():
            raise FedskewError(f"artifact name {name!r} must be letters, digits and underscores")
        for callback in self.callbacks:
            callback.artifact(name, self.round, tensors)

    # ---- evaluation --------------------------------------------------------------------------------
    def _global_state(self) -> dict[str, torch.Tensor]:
        state = state_to_arrays(self.server.model.state_dict())
        return state if self.device.type == "cpu" else to_cpu(state)  # device-free on the wire

    def evaluate_global(self) -> EvalCounts:
        assert self.runner is not None
        bounds = chunk_bounds(int(self.fed.y_test.shape[0]), EVAL_CHUNK)
        parts = self.runner.evaluate_chunks(self._global_state(), bounds)
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total

    def evaluate_clients(self) -> dict[str, Any]:
        """Every client's accuracy on its own test split (:class:`~fedskew.engine.client_eval.ClientEvaluation`)."""
        assert self.runner is not None
        arrays = self._global_state() if self.algorithm.has_global_model else {}
        keys, failed, rejected = self.client_eval.run(self.runner, arrays, self.round, self.client_states)
        for cid, reason in rejected:
            log.warning("round %d: rejected the evaluation of client %d: %s", self.round, cid, reason)
        self.book.failed.extend(failed)
        self.book.rejected.extend(rejected)
        return keys

    # ---- the loop ----------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> RunResult:
        """Run all rounds (continuing from the last checkpoint when ``resume``)."""
        keep_freed_memory()  # page faults cost a third of a small ConvNet's step (core/allocator.py)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        records: list[Record] = []
        ctx = EngineContext(
            self.fed, self.config.algorithm.name, self.algorithm.params, self.config, self.compute, self.engine_cache
        )
        try:
            for callback in self.callbacks:  # a log that cannot be written is one line before any client runs
                callback.start(self, resume)
            self.runner = make_runner(ctx, self.clients)
            records = self._restore() if resume else self._setup()
            for callback in self.callbacks:
                callback.begin(self, records)
            while self.round < self.config.run.rounds:
                if self._budget_spent(records):
                    break
                self.round += 1
                started = time.perf_counter()
                rec, t_eval = self._one_round()
                records.append(rec)
                for callback in self.callbacks:
                    callback.round_end(self, rec, records, RoundTime(started, t_eval))
            if self.runner is not None:
                self.runner.close()  # the workers go before the last files are written
                self.runner = None
            summary = run_summary(self.config, self.fed, records)
            if self.privacy is not None:
                summary.update(self.privacy.summary())
            elif self.config.privacy.mode == "condensation":  # the method's clients account (their epsilons)
                summary.update(condensation_summary(self.config.privacy, records))
            for callback in self.callbacks:
                callback.finish(self, summary)  # model.pt, then summary.json: the run is finished
        finally:
            if self.runner is not None:
                self.runner.close()
                self.runner = None
            for callback in self.callbacks:
                callback.close()
        return RunResult(self.run_dir, summary, records)

    def _budget_spent(self, records: list[Record]) -> bool:
        """Whether ``privacy.target_epsilon`` ends the run before the next round: it then says so in one line and
        keeps a checkpoint of this round, from which ``--resume`` with a larger budget goes on."""
        line = self.privacy.stops_before(self.round + 1) if self.privacy is not None else None
        if line is None:
            return False
        log.warning("%s", line)
        save_state(self, records)
        return True

    @contextlib.contextmanager
    def _server_work(self) -> Iterator[None]:
        """The server half's own work (FedDM's and FedGen's training ...): on the run's device and precision, on
        ``server_threads`` CPU threads (0: the process's own)."""
        with use_compute(self.compute), num_threads(self.config.run.server_threads):
            yield

    def _setup(self) -> list[Record]:
        self.server.round = 0
        if self.privacy is not None:
            self.privacy.begin()  # a calibrated noise multiplier is derived once, before round 1
        with self._server_work():
            self.algorithm.setup(self.server)
        return []

    def _restore(self) -> list[Record]:
        records = restore_state(self)
        self.recorder.resumed(records)
        with self._server_work():
            self.algorithm.restore(self.server)
        return records

    def _one_round(self) -> tuple[Record, float]:
        self.pipeline.book = RoundBook(self.round)
        self.server.round, self.server.metrics = self.round, {}
        self.server.rounds = self.config.run.rounds
        with self._server_work():
            self.algorithm.round(self.server)
        if self.privacy is not None:
            self.server.metrics.update(self.privacy.record())
        run = self.config.run
        evaluate = self.round % run.eval_every == 0 or self.round == run.rounds
        t0 = time.perf_counter()
        ev = self.evaluate_global() if evaluate and self.algorithm.has_global_model else None
        clients = None
        if self.fed.has_client_test:
            clients = self.evaluate_clients() if evaluate else self.client_eval.skipped()
        t_eval = time.perf_counter() - t0
        rec = self.recorder.record(self.round, ev, clients, evaluate, self.book, self.ledger, self.server.metrics)
        return rec, t_eval
