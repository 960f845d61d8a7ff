"""The Flower ServerApp: the simulator's round loop, with the clients on SuperNodes.

The ServerApp runs a :class:`~fedskew.engine.round_loop.RoundLoop` whose client jobs go to Flower
(:class:`FlowerClients`) instead of local workers. Everything else is the simulator's own code: the
algorithm's server hooks, evaluation on the server's test set, the byte ledger, checkpoints and the
run folder (``metrics.jsonl``, ``summary.json``, ``model.pt``, the report), which is written on the
SuperLink's machine. With the same config and seed, the metrics equal a simulation's.

Each exchange sends one Flower message per client to the SuperNode serving that client's partition
(found by a census of node configs when the run starts) and waits for the replies. A client whose node
fails (Flower reports it unavailable, its app raises, or no reply comes within ``reply_timeout``) is
recorded in the round's ``failed`` list and the round goes on with the others; a node that timed out
or was reported unavailable is not asked again in this run. If fewer than ``min_reply_fraction`` of
an exchange's clients answer, the run stops with a message saying which checkpoint to resume from.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.common.config import get_project_dir
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid, ServerApp

from fedskew.algorithms.base import ALGORITHMS, FederationInfo
from fedskew.config.files import read_toml
from fedskew.config.resume import same_run
from fedskew.config.schema import RunConfig, full_config, typed_config
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.core.message import Message as FedskewMessage
from fedskew.core.params import build_params
from fedskew.engine.checkpoint import load_checkpoint
from fedskew.engine.federation import federation_for
from fedskew.engine.flower.app import resolve_experiment
from fedskew.engine.flower.messages import HEADER, HELLO, from_records, info_to_json, to_records
from fedskew.engine.flower.secagg import SecureTrain, same_request
from fedskew.engine.flower.settings import DeploySettings, check_secure_aggregation
from fedskew.engine.round_loop import RunResult
from fedskew.engine.runner import ClientJob, NoReply
from fedskew.engine.session import start_run
from fedskew.runs import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    locked_run_folder,
    run_folder_name,
)

log = logging.getLogger("fedskew")

class FlowerClients:
    """Runs the simulator's client jobs on the SuperNodes that serve them.

    Parameters
    ----------
    grid
        The ServerApp's connection to the SuperLink.
    cfg
        The run's resolved config; its dataset, partition, model and algorithm tables and seed go to
        the nodes with every request, so a ClientApp needs nothing but its node config.
    info
        The federation facts; nodes check theirs against them.
    reply_timeout
        Seconds an exchange waits for replies (0: until Flower reports a node unavailable).
    min_reply_fraction
        An exchange answered by fewer of its clients stops the run.
    poll
        Seconds between checks for replies.
    secure
        Secure aggregation: ``train`` exchanges go through SecAgg+ (:mod:`.secagg`); None: every exchange is plain.
    """

    def __init__(
        self,
        grid: Grid,
        cfg: Mapping[str, Any],
        info: FederationInfo,
        *,
        reply_timeout: float = 0.0,
        min_reply_fraction: float = 0.5,
        poll: float = 0.2,
        secure: SecureTrain | None = None,
    ) -> None:
        self.grid = grid
        self.num_clients = info.num_clients
        run = {k: cfg[k] for k in ("dataset", "partition", "model", "algorithm", "seed")}
        # The nodes' own config says where their data is: no path of this machine goes to them.
        run["dataset"] = {k: v for k, v in cfg["dataset"].items() if k != "data_dir"}
        privacy = cfg.get("privacy") or {}
        if privacy.get("mode") == "condensation":  # the clients release privately: they need the table
            run["privacy"] = dict(privacy)
        self._run, self._info = json.dumps(run), info_to_json(info)
        self.reply_timeout = reply_timeout
        self.min_reply_fraction = min_reply_fraction
        self.poll = poll
        self.nodes: dict[int, int] = {}  # client id -> SuperNode id
        self.lost: dict[int, str] = {}  # SuperNode id -> why it is no longer asked
        self.secure = secure
        self.errors: dict[int, str] = {}  # SuperNode id -> why it failed the last secure exchange
        self.summed_tasks = frozenset({"train"} if secure else ())
        """Tasks whose replies are summed before the server sees them: a reply the engine rejects stops the run."""

    # ---- Flower plumbing ---------------------------------------------------------------------------
    def _message(self, node: int, task: str, cid: int, rnd: int, content: RecordDict) -> Message:
        content[HEADER] = ConfigRecord({"task": task, "cid": cid, "round": rnd, "run": self._run, "info": self._info})
        return Message(content, node, "train" if task == "train" else "query", group_id=str(rnd))

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        """Flower's ``Grid.send_and_receive``, which SecAgg+'s workflow calls for each stage, polling every ``poll``
        seconds (Flower's own sleeps 3 s) until ``reply_timeout``; a node that fails is noted in ``errors``."""
        sent = list(messages)
        pending: dict[str, int] = {}
        for mid, m in zip(self._push(sent), sent, strict=True):
            if mid is None:
                self.errors.setdefault(m.metadata.dst_node_id, "the SuperLink did not accept the request")
            else:
                pending[mid] = m.metadata.dst_node_id
        deadline = time.monotonic() + self.reply_timeout if self.reply_timeout > 0 else math.inf
        replies = []
        while pending:
            for reply in self._pull(pending):
                node = pending.pop(reply.metadata.reply_to_message_id)
                if reply.has_error():
                    self.errors.setdefault(node, self._error(node, reply.error))
                replies.append(reply)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        for node in pending.values():
            self.lost[node] = reason = f"no reply within {self.reply_timeout:g} s"
            self.errors.setdefault(node, reason)
        return replies

    def _push(self, messages: list[Message]) -> list[str | None]:
        """Message ids in order; None for a message the SuperLink refused (all, if it refused the batch)."""
        if not messages:
            return []
        ids: list[str | None] = list(self.grid.push_messages(messages))
        return ids if len(ids) == len(messages) else [None] * len(messages)  # Flower: [] if too large

    def _pull(self, pending: Iterable[str]) -> list[Message]:
        ids = list(pending)
        return list(self.grid.pull_messages(ids)) if ids else []

    # ---- which node serves which client ------------------------------------------------------------
    def connect(self, wait: float) -> None:
        """Ask every SuperNode which partitions it serves, until all ``num_clients`` are served.

        Nodes that connect later are asked as they appear; after ``wait`` seconds a partition still
        without a node is an error naming it.
        """
        deadline = time.monotonic() + wait
        asked: set[int] = set()
        pending: dict[str, int] = {}  # message id -> node
        while True:
            fresh = [n for n in self.grid.get_node_ids() if n not in asked]
            asked.update(fresh)
            ids = self._push([self._message(n, HELLO, -1, 0, RecordDict()) for n in fresh])
            pending.update((i, n) for i, n in zip(ids, fresh, strict=True) if i is not None)
            for reply in self._pull(pending):
                node = pending.pop(reply.metadata.reply_to_message_id)
                if reply.has_error():
                    log.warning("SuperNode %d did not say which partitions it serves: %s", node, reply.error.reason)
                    if reply.error.code == ErrorCode.NODE_UNAVAILABLE:
                        asked.discard(node)  # ask again if it comes back
                    continue
                head = reply.content[HEADER]
                partitions = head.get("partitions") if isinstance(head, ConfigRecord) else None
                if not (isinstance(partitions, list) and all(isinstance(c, int) for c in partitions)):
                    log.warning("SuperNode %d sent a malformed partition census: %s", node, head)
                    continue
                self._assign(node, partitions)  # type: ignore[arg-type]  # checked: a list of ints
            missing = [c for c in range(self.num_clients) if c not in self.nodes]
            if not missing:
                log.info("%d clients on %d SuperNodes", self.num_clients, len(set(self.nodes.values())))
                self._one_partition_each()
                return
            if time.monotonic() > deadline:
                raise FedskewError(
                    f"after {wait:g} s, no SuperNode serves partitions {missing} of {self.num_clients}: start "
                    "one with --node-config 'partition-id=K' for each (or raise node_wait)"
                )
            time.sleep(max(self.poll, 0.5))

    def _assign(self, node: int, partitions: Sequence[int]) -> None:
        for cid in partitions:
            if not 0 <= cid < self.num_clients:
                log.warning("SuperNode %d serves partition %d, which this run (%d clients) lacks", node, cid,
                            self.num_clients)
            elif self.nodes.get(cid, node) != node:
                raise FedskewError(f"partition {cid} is served by two SuperNodes ({self.nodes[cid]} and {node})")
            else:
                self.nodes[cid] = node

    def _one_partition_each(self) -> None:
        """Secure aggregation masks one upload per SuperNode: refuse a node that serves several partitions."""
        served: dict[int, list[int]] = {}
        for cid, node in self.nodes.items():
            served.setdefault(node, []).append(cid)
        several = [(node, cids) for node, cids in served.items() if len(cids) > 1]
        if self.secure is not None and several:
            raise FedskewError(f"secure aggregation masks one upload per SuperNode, but SuperNode {several[0][0]} "
                               f"serves partitions {sorted(several[0][1])}: start one SuperNode per partition")

    # ---- the exchange ------------------------------------------------------------------------------
    def run_clients(self, jobs: list[ClientJob]) -> list[tuple[FedskewMessage, dict[str, Any]] | NoReply]:
        """Send each job to its client's node and return the replies (or why there is none) in order.

        The job's client state is not sent: it lives on the node. Replies therefore carry an empty
        state back to the simulator. With secure aggregation, ``train`` jobs go through SecAgg+ (:meth:`_secure`).
        """
        if self.secure is not None and jobs and jobs[0].task == "train":
            return self._secure(jobs)
        outcomes: list[tuple[FedskewMessage, dict[str, Any]] | NoReply | None] = [None] * len(jobs)
        messages, index = [], []
        for i, job in enumerate(jobs):
            node = self.nodes[job.cid]
            if node in self.lost:
                outcomes[i] = NoReply(f"node lost earlier: {self.lost[node]}")
                continue
            messages.append(self._message(node, job.task, job.cid, job.round, to_records(job.msg)))
            index.append(i)
        pending: dict[str, int] = {}
        for mid, i in zip(self._push(messages), index, strict=True):
            if mid is None:
                outcomes[i] = NoReply("the SuperLink did not accept the request")
            else:
                pending[mid] = i
        deadline = time.monotonic() + self.reply_timeout if self.reply_timeout > 0 else math.inf
        while pending:
            for reply in self._pull(pending):
                i = pending.pop(reply.metadata.reply_to_message_id)
                outcomes[i] = self._failure(jobs[i], reply.error) if reply.has_error() else self._decode(reply)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        for i in pending.values():
            reason = f"no reply within {self.reply_timeout:g} s"
            self.lost[self.nodes[jobs[i].cid]] = reason
            outcomes[i] = NoReply(reason)
        done = [o for o in outcomes if o is not None]
        self._check(jobs, done)
        return done

    @staticmethod
    def _decode(reply: Message) -> tuple[FedskewMessage, dict[str, Any]] | NoReply:
        try:
            return from_records(reply.content), {}
        except FedskewError as e:
            return NoReply(f"unreadable reply: {e}")

    def _failure(self, job: ClientJob, error: Error) -> NoReply:
        return NoReply(self._error(self.nodes[job.cid], error))

    def _error(self, node: int, error: Error) -> str:
        """Why ``node`` answered with ``error``; a node Flower reports unavailable is not asked again."""
        if error.code == ErrorCode.NODE_UNAVAILABLE:
            self.lost[node] = "Flower reported it unavailable"
            return f"node unavailable: {error.reason}"
        return f"Flower error {error.code}: {error.reason}"

    def _secure(self, jobs: list[ClientJob]) -> list[tuple[FedskewMessage, dict[str, Any]] | NoReply]:
        """A ``train`` exchange through SecAgg+: every client that took part gets the revealed mean as its reply."""
        assert self.secure is not None
        outcomes: list[tuple[FedskewMessage, dict[str, Any]] | NoReply | None] = [None] * len(jobs)
        requests: dict[int, RecordDict] = {}
        index: dict[int, int] = {}  # node -> job
        for i, job in enumerate(jobs):
            node = self.nodes[job.cid]
            if node in self.lost:
                outcomes[i] = NoReply(f"node lost earlier: {self.lost[node]}")
            elif not same_request(job.msg, jobs[0].msg):
                raise FedskewError(f"secure aggregation: round {job.round} sent client {job.cid} another train "
                                   f"request than client {jobs[0].cid}; a method declaring sum_only_uploads sends one")
            else:
                requests[node], index[node] = self._message(node, job.task, job.cid, job.round,
                                                            to_records(job.msg)).content, i
        self.errors = {}
        if len(requests) > 1:
            got = self.secure.run(self, requests, {n: jobs[i].cid for n, i in index.items()}, jobs[0].round,
                                  jobs[0].msg)
        else:
            got = dict.fromkeys(requests, "SecAgg+ needs at least 2 clients, and only this one was reachable")
        for node, i in index.items():
            reply = got[node]
            outcomes[i] = (reply, {}) if isinstance(reply, FedskewMessage) else NoReply(self.errors.get(node, reply))
        done = [o for o in outcomes if o is not None]
        self._check(jobs, done)
        return done

    def _check(self, jobs: list[ClientJob], outcomes: list[tuple[FedskewMessage, dict[str, Any]] | NoReply]) -> None:
        failed = [(job.cid, o.reason) for job, o in zip(jobs, outcomes, strict=True) if isinstance(o, NoReply)]
        for cid, reason in failed:
            log.warning("round %d: client %d did not answer %r: %s", jobs[0].round, cid, jobs[0].task, reason)
        answered = len(jobs) - len(failed)
        if failed and answered < self.min_reply_fraction * len(jobs):
            raise FedskewError(
                f"round {jobs[0].round}: only {answered} of {len(jobs)} clients answered the {jobs[0].task!r} "
                f"request (min_reply_fraction = {self.min_reply_fraction:g}); "
                + "; ".join(f"client {cid}: {reason}" for cid, reason in failed)
            )


# ---- the ServerApp ---------------------------------------------------------------------------------
def _stored_run(run_dir: Path, config: RunConfig, resume: bool) -> dict[str, Any] | None:
    """The config ``run_dir`` holds when resuming (refused unless it is the same run, :func:`same_run`); None for a
    new run (a finished run is never overwritten)."""
    path = run_dir / CONFIG_FILE
    if not resume:
        if (run_dir / METRICS_FILE).exists():
            raise ConfigError(f"{run_dir} already holds a run: set resume=true to continue it, or choose another out")
        run_dir.mkdir(parents=True, exist_ok=True)
        return None
    if not path.exists():
        raise FedskewError(f"resume=true, but {run_dir} holds no run")
    stored = read_toml(path, "run config")
    changed = same_run(stored, config)
    if changed:
        raise ConfigError(f"resume=true, but the config differs from {path} in {', '.join(changed)}")
    return stored


def _resume_hint(run_dir: Path) -> str:
    try:
        rnd = int(load_checkpoint(run_dir / CHECKPOINTS_DIR)["round"])
    except FedskewError:
        return "no checkpoint was written yet: start the run again"
    return (
        f"{run_dir} holds the checkpoint of round {rnd}: when the SuperNodes are back, continue with "
        "`flwr run APP --run-config 'resume=true'`"
    )


def deploy(grid: Grid, settings: DeploySettings, app_dir: Path, plugins: Sequence[str] | None = None) -> RunResult:
    """Run the app's experiment with its clients on the SuperNodes; the run folder is written here.

    ``plugins`` (the app's, as :func:`server_app` got them) replace the experiment's own ``plugins``.
    """
    config = typed_config(resolve_experiment(app_dir / settings.experiment, settings.overrides, settings.label,
                                             plugins))
    check_secure_aggregation(config, settings)  # before the run folder is touched or a node asked
    run_dir = Path(settings.out).expanduser() / run_folder_name(config.label, config.run.seed)
    with locked_run_folder(run_dir):  # one deployment (or fedskew run) per run folder at a time
        stored = _stored_run(run_dir, config, settings.resume)
        data_dir = settings.data_dir or os.environ.get("FEDSKEW_DATA") or None
        fed = federation_for(config, data_dir)
        secure = None
        if settings.secagg:  # the method's weighting, and the shard sizes its weights are fractions of
            weighting = ALGORITHMS.get(config.algorithm.name).sum_only()
            assert weighting is not None  # check_secure_aggregation refused the others
            sizes = [int(fed.offsets[c + 1] - fed.offsets[c]) for c in range(fed.info.num_clients)]
            secure = SecureTrain(settings, weighting, sizes)
        clients = FlowerClients(  # the tables the nodes need, on the wire in the form config.toml holds
            grid, full_config(config), fed.info, reply_timeout=settings.reply_timeout,
            min_reply_fraction=settings.min_reply_fraction, secure=secure,
        )

        def progress(rec: dict[str, Any]) -> None:
            acc = "-" if rec["accuracy"] is None else f"{100 * rec['accuracy']:.2f}%"
            log.info("round %d: accuracy %s, clients %s, failed %s", rec["round"], acc, rec["clients"], rec["failed"])

        connected: list[bool] = []  # a run that stops after its nodes connected can be resumed: say how

        def connect(_: object) -> None:
            clients.connect(settings.node_wait)
            log.info("fedskew run %s -> %s", config.label, run_dir)
            connected.append(True)

        try:
            result = start_run(
                config, run_dir, resume=settings.resume, progress=False, federation=fed, clients=clients,
                on_round=progress, stored=stored, before=connect,
            )
        except FedskewError as e:
            if not connected:
                raise
            raise FedskewError(f"{e}. The run stopped; {_resume_hint(run_dir)}") from None
    from fedskew.report import write_report

    try:
        write_report([run_dir.parent])  # as `fedskew run`: the report of every run in ``out``
    except FedskewError as e:  # the run is done and kept; only the report of its folder failed
        log.warning("the run finished, but no report was written: %s", e)
    return result


def main(grid: Grid, context: Context, plugins: Sequence[str] | None = None) -> None:
    """Flower's entry point: read the run settings and the app folder, then :func:`deploy`."""
    if not log.handlers:  # Flower forwards the ServerApp's stderr to `flwr log`
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s fedskew %(levelname)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    keep_freed_memory()
    settings = build_params(DeploySettings, dict(context.run_config), prefix="run config ")
    run = grid.run
    deploy(grid, settings, get_project_dir(run.fab_id, run.fab_version, run.fab_hash), plugins)


def server_app(plugins: Sequence[str] | None = None) -> ServerApp:
    """A ServerApp that runs :func:`main`; ``plugins``, imported already, replace the experiment's own (the app's
    ``fedskew_app.py`` makes one with the plug-ins packed in the app: :func:`.components.server`)."""
    app = ServerApp()

    @app.main()
    def run(grid: Grid, context: Context) -> None:
        main(grid, context, plugins)

    return app


app = server_app()
"""fedskew's ServerApp, with the plug-ins the experiment names."""
