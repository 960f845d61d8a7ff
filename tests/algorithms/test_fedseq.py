"""FedSeq: the ring handoff, cluster-size weights, and the ledger of a real run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from fedskew.algorithms.base import FederationInfo, ModelSpec, ServerContext
from fedskew.algorithms.fedseq import FedSeq
from fedskew.config import typed_config
from fedskew.core.message import Message
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.runs import assert_resumes_exactly

FED = FederationInfo(
    num_clients=5, num_classes=2, model=ModelSpec("logreg", 1, 2, 2), seed=0, mean=(0.0,), std=(1.0,),
    image_shape=(1, 2, 2),
)
SAMPLES = {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0, 4: 50.0}


def test_each_client_continues_from_the_previous_one_and_clusters_weigh_by_data() -> None:
    """A fake exchange adds 1 to every weight: a ring of n ends n above the global model."""
    calls: list[tuple[list[int], str | None, str | None]] = []
    received: dict[int, dict[str, torch.Tensor]] = {}

    def exchange(task: str, messages: list[tuple[int, Message]], down: str | None = "server_to_client",
                 up: str | None = "client_to_server") -> list[tuple[int, Message]]:
        calls.append(([cid for cid, _ in messages], down, up))
        out = []
        for cid, msg in messages:
            received[cid] = msg.arrays
            arrays = {k: v + 1 for k, v in msg.arrays.items()}
            out.append((cid, Message(arrays=arrays, metrics={"num_samples": SAMPLES[cid]})))
        return out

    algo = FedSeq(FedSeq.Params(num_clusters=2), FED)
    server = ServerContext(fed=FED, model=algo.init_model(), exchange=exchange)
    algo.setup(server)
    clusters: list[list[int]] = server.state["clusters"]
    assert sorted(len(c) for c in clusters) == [2, 3]
    start = {k: v.clone() for k, v in server.model.state_dict().items()}
    algo.round(server)
    # Ring position p of every cluster gets the model p steps above the start.
    for members in clusters:
        for pos, cid in enumerate(members):
            for k in start:
                assert torch.allclose(received[cid][k], start[k] + pos)
    # Directions: position 0 from the server, later ones handed over by the previous client; only a
    # ring's last client uploads to the server.
    last = {c[-1] for c in clusters}
    for cids, down, up in calls:
        assert down == ("server_to_client" if cids[0] in {c[0] for c in clusters} else "client_to_client")
        assert up == ("client_to_server" if set(cids) <= last else None)
    # Cluster models (start + 3 and start + 2) averaged with weights = the clusters' data.
    long, short = sorted(clusters, key=len, reverse=True)
    w_long, w_short = sum(SAMPLES[c] for c in long), sum(SAMPLES[c] for c in short)
    shift = (3 * w_long + 2 * w_short) / (w_long + w_short)
    for k, v in server.model.state_dict().items():
        assert torch.allclose(v, start[k] + shift, atol=1e-5)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_fedseq_runs_and_counts_handoffs_client_to_client(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=2, algorithm={"name": "fedseq", "num_clusters": 2, "clients_per_round": 3})
    sim = RoundLoop(typed_config(cfg), tmp_path, progress=False)
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    sim.run()
    recs = _records(tmp_path)
    assert [r["round"] for r in recs] == [1, 2]
    for r in recs:  # 6 clients in two rings of 3: 2 downloads, 2 x 2 handoffs, 2 uploads
        assert r["bytes_server_to_client"] == 2 * model_bytes
        assert r["bytes_client_to_client"] == 4 * model_bytes
        assert r["bytes_client_to_server"] == 2 * model_bytes
        assert r["samples"] == 400 and sorted(r["clients"]) == list(range(6))
        assert r["num_clusters"] == 2 and r["accuracy"] is not None


def test_fedseq_resumes_exactly(tmp_path: Path) -> None:
    assert_resumes_exactly(
        tmp_path, lambda rounds: tiny_config(rounds=rounds, algorithm={"name": "fedseq", "num_clusters": 2})
    )
