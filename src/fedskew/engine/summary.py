"""A run's records: each round's line of ``metrics.jsonl`` (:class:`Recorder`) and the run's
``summary.json`` (:func:`run_summary`)."""

from __future__ import annotations

from typing import Any

from fedskew.config.schema import RunConfig
from fedskew.engine.client_eval import ClientEvaluation, client_summary
from fedskew.engine.federation import Federation
from fedskew.engine.pipeline import RoundBook
from fedskew.metrics import Ledger, class_variance, summarize_run
from fedskew.models.evaluation import EvalCounts

Record = dict[str, Any]


class Recorder:
    """Builds a round's record, in the key order ``metrics.jsonl`` has always had; counts the clients that
    trained so far, so that clients evaluated on a model they never trained are counted, not hidden."""

    def __init__(self, fed: Federation, client_eval: ClientEvaluation) -> None:
        self.fed = fed
        self.tested = {cid for cid, n in enumerate(client_eval.sizes) if n > 0}  # clients with a test split
        self.trained: set[int] = set()

    def resumed(self, records: list[Record]) -> None:
        """The run continues after ``records``: the clients that trained in them."""
        self.trained = {int(c) for r in records for c in r.get("clients", [])}

    def record(
        self, rnd: int, ev: EvalCounts | None, clients: dict[str, Any] | None, evaluated: bool, book: RoundBook,
        ledger: Ledger, metrics: dict[str, Any],
    ) -> Record:
        """Round ``rnd``'s record: the global evaluation ``ev`` (None: not evaluated, or no global model), the
        per-client keys ``clients`` (None: no client has a test split), the ledger's bytes, who took part,
        failed or was rejected (``book``; the algorithm's ``metrics`` may name the clients and samples
        itself), then the algorithm's own ``metrics``."""
        rec: Record = {"round": rnd}
        if ev is not None:
            per_class = ev.per_class()
            rec.update(accuracy=ev.accuracy, loss=ev.loss, per_class_accuracy=per_class,
                       class_variance=class_variance(per_class))
        else:
            rec.update(accuracy=None, loss=None, per_class_accuracy=None, class_variance=None)
        if clients is not None:
            rec.update(clients)
        rec.update(ledger.round_totals(rnd))
        if rnd == 1:  # setup traffic (round 0) is charged to the first round
            for k, v in ledger.round_totals(0).items():
                rec[k] += v
        # An algorithm may say who took part (CIM asks every client for a census, but trains a few).
        rec["clients"] = list(metrics.pop("clients", book.clients))
        rec["failed"] = list(book.failed)
        rec["rejected"] = list(book.rejected)
        rec["samples"] = int(metrics.pop("samples", book.samples))
        self.trained.update(rec["clients"])
        if clients is not None:
            rec["untrained_clients"] = len(self.tested - self.trained) if evaluated else None
        rec.update(metrics)
        return rec


def run_summary(config: RunConfig, fed: Federation, records: list[Record]) -> dict[str, Any]:
    """``summary.json``'s figures: best and final accuracy, stability, bytes, rounds to target, per-client
    figures where clients have test splits, and what the run was."""
    run = config.run
    summary = summarize_run(records, target=run.target_accuracy, at_rounds=list(run.at_rounds))
    if fed.has_client_test:
        summary.update(client_summary(records))
    traffic = ("bytes_server_to_client", "bytes_client_to_server", "bytes_client_to_client")
    summary.update(
        algorithm=config.algorithm.name, label=config.label, seed=run.seed, rounds=len(records),
        dataset=config.dataset.name, model=config.model.name, partition=config.partition.name,
        num_clients=fed.info.num_clients, class_names=list(fed.class_names),
        bytes_per_round_mb=sum(summary[k] for k in traffic) / max(len(records), 1) / 1e6,
    )
    return summary
