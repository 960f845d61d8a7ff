"""The per-client evaluation of a run: every client's accuracy on its own test split.

With ``partition.client_test_fraction > 0`` each client holds a test split of its own (see
:func:`~fedskew.data.partition.hold_out`). Every ``eval_every`` rounds the engine sends each such client
the ``evaluate`` task (:data:`~fedskew.algorithms.base.EVALUATE`), which runs
:meth:`~fedskew.algorithms.base.Algorithm.evaluate_client` where the client's data is (the simulator's
workers or a Flower node): the global model and the client's own model (after ``eval.personalized_epochs``
of fine-tuning) are scored on the split. Nothing goes on the byte ledger and no client state changes.
The counts that come back are checked like any reply; one that cannot be true is dropped.
"""

from __future__ import annotations

from typing import Any

from fedskew.algorithms.base import EVALUATE, Algorithm
from fedskew.components.trainer import SGDParams
from fedskew.config.schema import EvalParams
from fedskew.core.message import Message
from fedskew.engine.federation import Federation
from fedskew.engine.replies import check_reply
from fedskew.engine.runner import ClientJob, ClientSide
from fedskew.metrics import client_distribution

VECTORS = (("client_accuracy", "global", "client"), ("personal_accuracy", "personal", "personal"))
"""(record key, reply metric prefix, summary prefix) of the two per-client accuracies."""


class ClientEvaluation:
    """The ``evaluate`` task of one run: its message, its checks, and the record keys it makes."""

    def __init__(self, fed: Federation, algorithm: Algorithm, params: EvalParams, max_bytes: int) -> None:
        self.fed = fed
        self.algorithm = algorithm
        self.params = params
        self.max_bytes = max_bytes
        self.sizes = fed.client_test_sizes()

    def run(
        self, runner: ClientSide, arrays: dict[str, Any], rnd: int, states: dict[int, dict[str, Any]]
    ) -> tuple[dict[str, Any], list[list[Any]], list[list[Any]]]:
        """Evaluate every client with a test split on the global model ``arrays`` (empty for a method without one).

        Returns the record's keys (:func:`client_keys`), the clients that did not answer and those whose
        answer was rejected (``[cid, reason]`` each, for the round's ``failed`` and ``rejected``); their
        accuracies are None.
        """
        n = self.fed.info.num_clients
        msg = Message(arrays=arrays, config=self.config())
        jobs = [ClientJob(EVALUATE, cid, rnd, msg, states.get(cid, {})) for cid in range(n) if self.sizes[cid] > 0]
        found: dict[str, list[float | None]] = {"global": [None] * n, "personal": [None] * n}
        correct: dict[str, list[int | None]] = {"global": [None] * n, "personal": [None] * n}
        failed: list[list[Any]] = []
        rejected: list[list[Any]] = []
        for job, outcome in zip(jobs, runner.run_clients(jobs), strict=True):
            if not isinstance(outcome, tuple):  # NoReply: the client's node did not answer
                failed.append([job.cid, f"evaluate: {getattr(outcome, 'reason', outcome)}"])
                continue
            reply = outcome[0]
            reason = check_reply(reply, {}, self.fed.info.num_classes, self.max_bytes)
            if reason is None and isinstance(reply, Message):  # check_reply refuses an Undecodable reply
                reason = self.check(reply, self.sizes[job.cid])
            if reason is not None or not isinstance(reply, Message):
                rejected.append([job.cid, f"evaluate: {reason}"])
                continue
            for kind in found:
                if f"{kind}_correct" in reply.metrics:
                    correct[kind][job.cid] = int(reply.metrics[f"{kind}_correct"])
                    found[kind][job.cid] = float(reply.metrics[f"{kind}_correct"]) / self.sizes[job.cid]
        return self.keys(found, correct), failed, rejected

    def keys(self, found: dict[str, list[float | None]],
             correct: dict[str, list[int | None]] | None = None) -> dict[str, Any]:
        """The record's per-client keys from the accuracies ``found`` of each kind (``global``, ``personal``) and
        their counts of correct answers (``correct``, for the pooled accuracy); a method without a global model
        has only the personal ones."""
        keys: dict[str, Any] = {}
        for key, kind, _ in VECTORS:
            if kind == "personal" or self.algorithm.has_global_model:
                counts: list[int | None] = correct[kind] if correct is not None else [None] * len(found[kind])
                keys.update(client_keys(key, found[kind], pooled_accuracy(counts, self.sizes)))
        return keys

    def skipped(self) -> dict[str, Any]:
        """The record's per-client keys in a round that is not evaluated (all None)."""
        none: list[float | None] = [None] * self.fed.info.num_clients
        return dict.fromkeys(self.keys({"global": none, "personal": none}))

    def config(self) -> dict[str, Any]:
        """The fine-tuning settings the task carries: ``[eval]``, else the method's local SGD."""
        ev, p = self.params, self.algorithm.params
        sgd = p if isinstance(p, SGDParams) else SGDParams()
        return {
            "personalized_epochs": ev.personalized_epochs,
            "lr": ev.personalized_lr if ev.personalized_lr is not None else sgd.lr,
            "batch_size": ev.personalized_batch_size if ev.personalized_batch_size is not None else sgd.batch_size,
            "momentum": sgd.momentum,
        }

    def check(self, reply: Message, n_test: int) -> str | None:
        """Why an ``evaluate`` reply's counts are impossible for a client with ``n_test`` test samples, or None."""
        if reply.metrics.get("num_test") != n_test:
            return f"num_test = {reply.metrics.get('num_test')!r}, but the client holds {n_test} test samples"
        wanted = ["personal_correct", *(["global_correct"] if self.algorithm.has_global_model else [])]
        for name in wanted:
            value = reply.metrics.get(name)
            if value is None or not float(value).is_integer() or not 0 <= value <= n_test:
                return f"{name} = {value!r} is not a count in [0, {n_test}]"
        return None


def client_keys(prefix: str, accuracies: list[float | None], pooled: float | None = None) -> dict[str, Any]:
    """A round's per-client record keys: ``<prefix>`` (one value per client, None without a test split),
    ``<prefix>_mean``, ``_std``, ``_worst10``, ``_best`` (:func:`~fedskew.metrics.client_distribution`) and
    ``<prefix>_pooled`` (:func:`pooled_accuracy`)."""
    stats = {f"{prefix}_{k}": v for k, v in client_distribution(accuracies).items()}
    return {prefix: accuracies, **stats, f"{prefix}_pooled": pooled}


def pooled_accuracy(correct: list[int | None], sizes: list[int]) -> float | None:
    """The accuracy over every answering client's held-out samples pooled together: the sum of their correct
    answers over the sum of their test-split sizes (PFLlib's measure; the mean over clients weighs each client
    alike instead). None when no client answered."""
    answered = [(c, n) for c, n in zip(correct, sizes, strict=True) if c is not None]
    total = sum(n for _, n in answered)
    return sum(c for c, _ in answered) / total if total else None


def client_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``'s per-client figures: the final and the best of the mean and of the worst 10%."""
    out: dict[str, Any] = {}
    for key, _, short in VECTORS:
        for stat in ("mean", "worst10", "pooled"):
            if not any(f"{key}_{stat}" in r for r in records):
                continue
            values = [r[f"{key}_{stat}"] for r in records if r.get(f"{key}_{stat}") is not None]
            out[f"{short}_{stat}_final"] = values[-1] if values else None
            out[f"{short}_{stat}_best"] = max(values) if values else None
    return out
