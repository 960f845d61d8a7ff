"""The round loop of a run: the algorithm's server half, evaluation, logging, checkpoints and the ledger.

The same loop drives a simulation (clients run in this machine's worker processes) and a Flower
deployment (a ``ClientRunner`` sends each client job to the SuperNode that holds the client).

A run writes one folder::

    config.toml       the resolved configuration of this run
    metrics.jsonl     one JSON object per round (deterministic: no wall-clock times)
    timing.jsonl      seconds per round (kept apart, so metrics.jsonl is byte-identical across runs)
    summary.json      per-run figures (best/final accuracy, stability, bytes, rounds to target)
    checkpoints/      the last checkpoint, for ``fedskew run --resume``
    plots/            learning curves of this run
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from fedskew.algorithms.base import ALGORITHMS, Algorithm, Replies, ServerContext
from fedskew.config.schema import EvalParams, Faults, LoggingParams, RayParams, check_evaluable
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.device import (
    Compute,
    check_amp,
    resolve_device,
    set_deterministic_env,
    to_cpu,
    to_device,
    use_compute,
)
from fedskew.core.errors import FedskewError
from fedskew.core.files import torch_bytes, write_atomic
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import build_params
from fedskew.engine.checkpoint import load_checkpoint, save_checkpoint
from fedskew.engine.client_eval import ClientEvaluation, client_summary
from fedskew.engine.environment import record_environment
from fedskew.engine.faults import corrupt_reply, model_replacement
from fedskew.engine.federation import Federation, build_federation
from fedskew.engine.ray_workers import RayWorkers
from fedskew.engine.replies import Undecodable, check_reply
from fedskew.engine.tensorboard import TensorBoardLog
from fedskew.engine.trackers import Tracker, open_trackers
from fedskew.engine.workers import ClientJob, Workers, default_workers, worker_devices
from fedskew.metrics import Ledger, class_variance, summarize_run
from fedskew.models.evaluation import EVAL_CHUNK, EvalCounts, chunk_bounds
from fedskew.plugins import load_plugins
from fedskew.progress import progress_bar
from fedskew.runs import ARTIFACTS_DIR, CHECKPOINTS_DIR, METRICS_FILE, MODEL_FILE, SUMMARY_FILE, TIMING_FILE

log = logging.getLogger("fedskew")


@dataclass
class RunResult:
    """What a finished (or stopped) run leaves behind."""

    run_dir: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class NoReply:
    """A client that did not answer: its node was lost, timed out, or its app failed (real deployments)."""

    reason: str


class ClientRunner(Protocol):
    """Where client jobs run when not in this process's workers (Flower: the SuperNodes).

    Replies come back in job order; a runner that keeps client state itself (on the client's node)
    returns an empty state, and one whose client did not answer returns :class:`NoReply`.
    """

    def run_clients(
        self, jobs: list[ClientJob]
    ) -> Sequence[tuple[Message | Undecodable, dict[str, Any]] | NoReply]: ...


def make_algorithm(algorithm_cfg: dict[str, Any], fed_info: Any) -> Algorithm:
    """Instantiate the configured algorithm with validated, typed parameters."""
    table = dict(algorithm_cfg)
    name = table.pop("name")
    cls = ALGORITHMS.get(name)
    params = build_params(cls.Params, table, prefix="algorithm.")
    return cls(params, fed_info)


class RoundLoop:
    """Runs one configured algorithm on one federation, round by round (simulated or deployed clients)."""

    def __init__(
        self,
        cfg: dict[str, Any],
        run_dir: Path,
        *,
        data_dir: str | None = None,
        progress: bool = True,
        federation: Federation | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        clients: ClientRunner | None = None,
    ) -> None:
        self.cfg = cfg
        self.clients = clients  # None: clients run in this machine's workers
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.on_round = on_round
        load_plugins(cfg.get("plugins", ()))  # the names below may be a plug-in's
        self.fed = federation or build_federation(
            cfg["dataset"], cfg["partition"], cfg["model"], int(cfg["seed"]), data_dir
        )
        self.algorithm = make_algorithm(cfg["algorithm"], self.fed.info)
        check_evaluable(self.algorithm.name, float(cfg["partition"].get("client_test_fraction", 0.0)))
        self.faults = build_params(Faults, cfg.get("faults", {}), prefix="faults.")
        self.client_eval = ClientEvaluation(
            self.fed, self.algorithm, build_params(EvalParams, cfg.get("eval", {}), prefix="eval."),
            int(self.faults.max_reply_mb * 1e6),
        )
        self._attackers = self.faults.attackers(self.fed.info.seed, self.fed.info.num_clients)
        self.ledger = Ledger()
        self.client_states: dict[int, dict[str, Any]] = {}
        self.round = 0
        self._round_clients: list[int] = []
        self._round_samples = 0.0
        self._round_failed: list[list[Any]] = []
        self._round_rejected: list[list[Any]] = []
        self._workers: Workers | RayWorkers | None = None
        self._wire_cache: dict[int, tuple[Message, Message]] = {}
        self._sample_claims: dict[int, float] = {}
        self._trained: set[int] = set()  # clients that took part in a round so far (for ``untrained_clients``)
        self._tested = {cid for cid, n in enumerate(self.client_eval.sizes) if n > 0}  # clients with a test split
        self._tensorboard = TensorBoardLog(None)  # off until run() opens the run's
        self._trackers: list[Tracker] = []  # W&B, MLflow: opened by run()
        self.compute = Compute(
            str(resolve_device(str(cfg.get("device", "auto")))), str(cfg.get("amp", "off")),
            bool(cfg.get("deterministic", False)),
        )
        check_amp(self.compute.amp, self.compute.torch_device)
        if self.compute.deterministic:
            set_deterministic_env()
        self.device = self.compute.torch_device
        self.server = ServerContext(
            fed=self.fed.info, model=self.algorithm.init_model().to(self.device), exchange=self.exchange,
            artifacts=self._save_artifact, device=self.device, rejections=self._reject,
        )

    # ---- the exchange the algorithm calls ---------------------------------------------------------
    def exchange(self, task: str, messages: list[tuple[int, Message]], down: str | None = "server_to_client",
                 up: str | None = "client_to_server") -> Replies:
        """Deliver each message to its client, run ``client_step`` there, return replies in order.

        Clients that drop out (simulated faults) are not asked; replies that arrive late (stragglers)
        or fail :func:`~fedskew.engine.replies.check_reply` are discarded. Each is recorded in the round's
        ``failed`` or ``rejected`` list, and the algorithm gets the replies that remain.
        """
        assert self._workers is not None
        jobs, fates = [], {}
        for cid, msg in messages:
            if not 0 <= cid < self.fed.info.num_clients:
                raise FedskewError(f"{self.algorithm.name} addressed client {cid}, which does not exist")
            if down is not None:
                self.ledger.add(down, msg.nbytes(), self.round)
            fates[cid] = self.faults.fate(self.fed.info.seed, self.round, cid, task)
            if fates[cid] == "dropout":
                self._round_failed.append([cid, "dropout"])
                continue
            jobs.append(ClientJob(task, cid, self.round, self._on_wire(msg), self.client_states.get(cid, {})))
        results = (self.clients or self._workers).run_clients(jobs)
        spec = self.algorithm.reply_spec(task, self.server)
        scalars = self.algorithm.reply_scalars(task, self.server)
        arrived, rejected_here = 0, []
        max_bytes = int(self.faults.max_reply_mb * 1e6)
        replies: Replies = []
        for job, outcome in zip(jobs, results, strict=True):
            cid = job.cid
            if isinstance(outcome, NoReply):
                self._round_failed.append([cid, outcome.reason])
                continue
            result, state = outcome
            self.client_states[cid] = state
            reply: Any = result
            if task == "train" and cid in self._attackers and isinstance(result, Message):
                reply = model_replacement(job.msg, result, self.faults.malicious_scale)
            if fates[cid] == "corrupt" and isinstance(result, Message):
                reply = corrupt_reply(result, self.faults.attack, self.fed.info.num_classes, max_bytes)
            if up is not None and isinstance(reply, Message):
                self.ledger.add(up, reply.nbytes(), self.round)
            if fates[cid] == "straggler":
                self._round_failed.append([cid, "straggler"])
                continue
            arrived += 1
            reason = check_reply(reply, spec, self.fed.info.num_classes, max_bytes) or self._check_scalars(
                cid, reply, scalars
            )
            if reason is not None:
                log.warning("round %d: rejected the %r reply of client %d: %s", self.round, task, cid, reason)
                self._round_rejected.append([cid, reason])
                rejected_here.append(f"client {cid}: {reason}")
                continue
            replies.append((cid, reply if self.device.type == "cpu" else self._on_server(reply)))
            if cid not in self._round_clients:
                self._round_clients.append(cid)
            samples = float(reply.metrics.get("num_samples", 0.0))
            self._round_samples += samples
            self._sample_claims[cid] = self._sample_claims.get(cid, 0.0) + samples
        if arrived and len(rejected_here) == arrived:
            shown = "; ".join(rejected_here[:3]) + (f"; and {arrived - 3} more" if arrived > 3 else "")
            raise FedskewError(
                f"round {self.round}: every reply to {task!r} was rejected ({shown}); the run stops here, "
                "its metrics and last checkpoint are kept"
            )
        return replies

    def _check_scalars(self, cid: int, reply: Message, scalars: dict[str, tuple[float, float | None]]) -> str | None:
        """Why a reply's scalar metrics break the method's schema, or None (values are finite: check_reply)."""
        for name, (low, high) in scalars.items():
            if name not in reply.metrics:
                return f"metric {name!r} is missing"
            value = float(reply.metrics[name])
            if value < low or (high is not None and value > high):
                return f"metric {name!r} = {value!r} is outside [{low}, {'inf' if high is None else high}]"
        if "num_samples" in reply.metrics:
            n = float(reply.metrics["num_samples"])
            shard = self.fed.offsets[cid + 1] - self.fed.offsets[cid]
            limit = self.algorithm.sample_limit(cid, shard, self.server)
            if not n.is_integer():
                return f"num_samples = {n!r} is not a whole number"
            if n > limit:
                return f"claims {n:.0f} samples, but client {cid} holds at most {limit:.0f}"
        return None

    def _reject(self, cid: int, reason: str) -> None:
        """The server half dropped an accepted reply (an outlying update, a robust rule's cut)."""
        log.warning("round %d: the algorithm rejected the reply of client %d: %s", self.round, cid, reason)
        self._round_rejected.append([cid, reason])
        if cid in self._round_clients:
            self._round_clients.remove(cid)
        self._round_samples -= self._sample_claims.pop(cid, 0.0)

    def _on_wire(self, msg: Message) -> Message:
        """A request as it travels: its arrays on the CPU (the server's may be on a GPU)."""
        if self.device.type == "cpu":
            return msg
        key = id(msg)  # one message is usually sent to every selected client: move it once
        if self._wire_cache.get(key, (None,))[0] is not msg:
            self._wire_cache = {key: (msg, Message(to_cpu(msg.arrays), msg.config, msg.metrics))}
        return self._wire_cache[key][1]

    def _on_server(self, msg: Message) -> Message:
        """A checked reply as the algorithm's server half gets it: its arrays on the server's device."""
        return Message(to_device(msg.arrays, self.device), msg.config, msg.metrics)

    def _save_artifact(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save

        if not name.replace("_", "").isalnum():
            raise FedskewError(f"artifact name {name!r} must be letters, digits and underscores")
        folder = self.run_dir / ARTIFACTS_DIR / name
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"round_{self.round:04d}.safetensors"
        write_atomic(final, save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}), sync=False)
        self._tensorboard.artifact(name, self.round, tensors)

    # ---- evaluation --------------------------------------------------------------------------------
    def evaluate_global(self) -> EvalCounts:
        assert self._workers is not None
        state = state_to_arrays(self.server.model.state_dict())
        if self.device.type != "cpu":
            state = to_cpu(state)  # device-free on the wire to evaluation workers, as every message
        parts = self._workers.evaluate_chunks(state, chunk_bounds(int(self.fed.y_test.shape[0]), EVAL_CHUNK))
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        return total

    def evaluate_clients(self) -> dict[str, Any]:
        """Every client's accuracy on its own test split (:class:`~fedskew.engine.client_eval.ClientEvaluation`)."""
        assert self._workers is not None
        arrays = state_to_arrays(self.server.model.state_dict()) if self.algorithm.has_global_model else {}
        if self.device.type != "cpu":
            arrays = to_cpu(arrays)
        keys, failed, rejected = self.client_eval.run(
            self.clients or self._workers, arrays, self.round, self.client_states
        )
        for cid, reason in rejected:
            log.warning("round %d: rejected the evaluation of client %d: %s", self.round, cid, reason)
        self._round_failed.extend(failed)
        self._round_rejected.extend(rejected)
        return keys

    # ---- checkpoints -------------------------------------------------------------------------------
    def _checkpoint(self, records: list[dict[str, Any]]) -> None:
        save_checkpoint(
            self.run_dir / CHECKPOINTS_DIR,
            {
                "round": self.round,
                "model": to_cpu(self.server.model.state_dict()),
                "server_state": to_device(
                    {k: v for k, v in self.server.state.items() if not k.startswith("_")}, torch.device("cpu")
                ),
                "client_states": {str(k): v for k, v in self.client_states.items()},
                "ledger": self.ledger.state_dict(),
                "records": json.dumps(records),
            },
        )

    def _restore(self) -> list[dict[str, Any]]:
        ck = load_checkpoint(self.run_dir / CHECKPOINTS_DIR)
        self.round = int(ck["round"])
        self.server.model.load_state_dict(ck["model"])
        self.server.state.update(to_device(ck["server_state"], self.device))
        self.client_states = {int(k): v for k, v in ck["client_states"].items()}
        self.ledger.load_state_dict(ck["ledger"])
        records: list[dict[str, Any]] = json.loads(ck["records"])
        return records

    # ---- the loop ----------------------------------------------------------------------------------
    def run(self, resume: bool = False) -> RunResult:
        """Run all rounds (continuing from the last checkpoint when ``resume``)."""
        keep_freed_memory()  # page faults cost a third of a small ConvNet's step (core/allocator.py)
        cfg = self.cfg
        rounds = int(cfg["rounds"])
        spec = str(cfg.get("device", "auto"))
        workers = int(cfg.get("workers", 1)) or default_workers(spec)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        records: list[dict[str, Any]] = []
        logging_params = build_params(LoggingParams, cfg.get("logging", {}), prefix="logging.")
        self._tensorboard = TensorBoardLog.for_run(cfg, self.run_dir, self.fed.class_names, resume, logging_params)
        record_environment(self.run_dir, self.device, resume)
        if cfg.get("engine", "local") == "ray":  # Ray runs as many jobs at once as its resources allow
            ray = build_params(RayParams, cfg.get("ray", {}), prefix="ray.")
            self._workers = RayWorkers(
                self.fed, cfg["algorithm"]["name"], self.algorithm.params, ray, self.compute
            )
        else:
            self._workers = Workers(
                self.fed, cfg["algorithm"]["name"], self.algorithm.params, workers, self.compute,
                worker_devices(spec),
            )
        try:
            self._trackers = open_trackers(cfg, logging_params, self.run_dir)
            if resume:
                records = self._restore()
                self._trained = {int(c) for r in records for c in r.get("clients", [])}
                with use_compute(self.compute):
                    self.algorithm.restore(self.server)
            else:
                self._round_clients, self._round_samples = [], 0.0
                self.server.round = 0
                with use_compute(self.compute):
                    self.algorithm.setup(self.server)
            self._rewrite_metrics(records)
            bar = progress_bar(  # a bar in a terminal; in a log file a plain line every 10 s, no escape codes
                total=rounds, initial=self.round, desc=f"{cfg.get('label', cfg['algorithm']['name'])}",
                unit="round", enabled=self.progress, leave=False,
            )
            with bar, open(self.run_dir / TIMING_FILE, "a") as timing:
                while self.round < rounds:
                    self.round += 1
                    t0 = time.perf_counter()
                    rec, t_eval = self._one_round(rounds)
                    records.append(rec)
                    with open(self.run_dir / METRICS_FILE, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                    total = time.perf_counter() - t0
                    timing.write(json.dumps({"round": self.round, "seconds": total, "eval_seconds": t_eval}) + "\n")
                    timing.flush()
                    self._tensorboard.record(rec)
                    for tracker in self._trackers:
                        tracker.record(rec)
                    every = int(cfg.get("checkpoint_every", 10))
                    if every > 0 and (self.round % every == 0 or self.round == rounds):
                        self._checkpoint(records)
                    if rec.get("accuracy") is not None:
                        bar.set_postfix(acc=f"{100 * rec['accuracy']:.1f}%")
                    bar.update(1)
                    if self.on_round is not None:
                        self.on_round(rec)
        finally:
            self._workers.close()
            self._workers = None
            self._tensorboard.close()
            for tracker in self._trackers:
                tracker.close()
            self._trackers = []
        summary = self._summary(records)
        # The summary last: it marks the run finished (fedskew run --resume keeps a run that has one).
        write_atomic(self.run_dir / MODEL_FILE, torch_bytes(to_cpu(self.server.model.state_dict())), sync=False)
        write_atomic(self.run_dir / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n", sync=False)
        return RunResult(self.run_dir, summary, records)

    def _one_round(self, rounds: int) -> tuple[dict[str, Any], float]:
        self._round_clients, self._round_samples = [], 0.0
        self._round_failed, self._round_rejected = [], []
        self._sample_claims = {}
        server = self.server
        server.round = self.round
        server.metrics = {}
        with use_compute(self.compute):  # the server half's own training (FedDM, FedGen ...) on the run's device
            self.algorithm.round(server)
        rec: dict[str, Any] = {"round": self.round}
        every = max(int(self.cfg.get("eval_every", 1)), 1)
        t_eval = 0.0
        evaluate = self.round % every == 0 or self.round == rounds
        t0 = time.perf_counter()
        if evaluate and self.algorithm.has_global_model:
            ev = self.evaluate_global()
            per_class = ev.per_class()
            rec.update(
                accuracy=ev.accuracy, loss=ev.loss, per_class_accuracy=per_class,
                class_variance=class_variance(per_class),
            )
        else:
            rec.update(accuracy=None, loss=None, per_class_accuracy=None, class_variance=None)
        if self.fed.has_client_test:
            rec.update(self.evaluate_clients() if evaluate else self.client_eval.skipped())
        t_eval = time.perf_counter() - t0
        rec.update(self.ledger.round_totals(self.round))
        if self.round == 1:  # setup traffic (round 0) is charged to the first round
            for k, v in self.ledger.round_totals(0).items():
                rec[k] += v
        # An algorithm may say who took part (CIM asks every client for a census, but trains a few).
        rec["clients"] = list(server.metrics.pop("clients", self._round_clients))
        rec["failed"] = list(self._round_failed)
        rec["rejected"] = list(self._round_rejected)
        rec["samples"] = int(server.metrics.pop("samples", self._round_samples))
        self._trained.update(rec["clients"])
        if self.fed.has_client_test:  # clients evaluated on a model they never trained: counted, not hidden
            rec["untrained_clients"] = len(self._tested - self._trained) if evaluate else None
        for k, v in server.metrics.items():
            rec[k] = v
        return rec, t_eval

    def _rewrite_metrics(self, records: list[dict[str, Any]]) -> None:
        """metrics.jsonl holds exactly the records so far (a resumed run drops rounds after the checkpoint)."""
        with open(self.run_dir / METRICS_FILE, "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    def _summary(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        cfg = self.cfg
        summary = summarize_run(records, target=cfg.get("target_accuracy"), at_rounds=cfg.get("at_rounds", []))
        if self.fed.has_client_test:
            summary.update(client_summary(records))
        summary.update(
            algorithm=cfg["algorithm"]["name"], label=cfg.get("label", cfg["algorithm"]["name"]),
            seed=int(cfg["seed"]), rounds=len(records), dataset=cfg["dataset"]["name"],
            model=cfg["model"]["name"], partition=cfg["partition"]["name"],
            num_clients=self.fed.info.num_clients, class_names=list(self.fed.class_names),
            bytes_per_round_mb=(
                sum(summary[k] for k in ("bytes_server_to_client", "bytes_client_to_server", "bytes_client_to_client"))
                / max(len(records), 1) / 1e6
            ),
        )
        return summary

