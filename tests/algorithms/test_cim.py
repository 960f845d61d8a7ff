"""The cim algorithm: the census, selection, delta schedule and switches, through the engine."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedskew.algorithms.base import ClientContext, FederationInfo, ModelSpec
from fedskew.algorithms.cim import CIM
from fedskew.components.cim_selection import next_delta, oversampled_counts, oversampled_fraction, select_clients
from fedskew.config import typed_config
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.seeding import numpy_rng
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.runs import assert_resumes_exactly

L = 4  # classes of the tiny config


def _run(tmp_path: Path, rounds: int = 3, **algo: Any) -> tuple[RoundLoop, list[dict[str, Any]]]:
    cfg = tiny_config(rounds=rounds)  # seed 0
    cfg["algorithm"] = {"name": "cim", **algo}
    sim = RoundLoop(typed_config(cfg), tmp_path, progress=False)
    sim.run()
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return sim, recs


def test_rounds_follow_algorithms_1_and_2_and_the_ledger_counts_the_census(tmp_path: Path) -> None:
    sim, recs = _run(tmp_path)
    counts = sim.fed.counts
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    delta, frac = 0.01, 0.0
    for r, rec in enumerate(recs, start=1):
        if r > 1:
            delta = next_delta(delta, frac, 0.1, 0.1)
        assert rec["delta"] == pytest.approx(delta)
        over = np.stack([oversampled_counts(c, delta, r) for c in counts])
        sel = select_clients(over, 10, 0.1, numpy_rng(0, "server", r, "select"))
        assert rec["clients"] == sel.clients and rec["num_selected"] == len(sel.clients)
        assert rec["samples"] == int(sum(a.sum() for a in sel.allocations))  # |D'_k| summed
        assert rec["kld"] == pytest.approx(sel.kld)
        frac = oversampled_fraction([over[c].sum() for c in sel.clients], [counts[c].sum() for c in sel.clients])
        assert rec["oversampled_fraction"] == pytest.approx(frac)
        n = len(sel.clients)
        assert rec["bytes_server_to_client"] == n * (model_bytes + L * 8)  # model + int64 allocation
        assert rec["bytes_client_to_server"] == 6 * L * 8 + n * model_bytes  # census of all 6 + models
    assert any(r["delta"] > 0.01 for r in recs)  # the tiny federation oversamples enough to raise delta


def test_switches_off_give_uniform_selection_without_census(tmp_path: Path) -> None:
    sim, recs = _run(tmp_path, rounds=2, select=False, oversample=False, clients_per_round=3)
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    for rec in recs:
        assert rec["num_selected"] == 3 and "delta" not in rec
        assert rec["bytes_client_to_server"] == 3 * model_bytes  # no census
        assert rec["samples"] == int(sum(sim.fed.counts[c].sum() for c in rec["clients"]))  # all their data


FED = FederationInfo(
    num_clients=1, num_classes=3, model=ModelSpec("logreg", 1, 3, 2), seed=0, mean=(0.0,), std=(1.0,),
    image_shape=(1, 2, 2),
)


def _client() -> ClientContext:
    y = torch.tensor([0] * 40 + [1] * 25 + [2] * 2)
    x = torch.randn((len(y), 1, 2, 2), generator=torch.Generator().manual_seed(0))
    return ClientContext(cid=0, round=1, x=x, y=y, fed=FED)


@pytest.mark.parametrize(("dynamic", "rule"), [(True, "arctan"), (True, "arctan_normalised"), (False, "arctan")])
def test_client_trains_on_its_allocation_with_dynamic_batch_and_lr(dynamic: bool, rule: str) -> None:
    algo = CIM(CIM.Params(dynamic=dynamic, lr_rule=rule, beta=3), FED)  # type: ignore[arg-type]
    client = _client()
    model = state_to_arrays(algo.init_model().state_dict())
    # Census: n = [40, 25, 2], mu = 67/3 = 22.33, t = 22.11 at delta 0.01, r = 1 -> class 2 raised to 23.
    census = algo.client_step("census", Message(config={"delta": 0.01}), client)
    target = math.ceil(67 / 3 * math.exp(-0.01))
    assert census.arrays["counts"].tolist() == [40, 25, target]
    allocation = torch.tensor([15, 10, 21])
    reply = algo.client_step("train", Message(arrays={**model, "allocation": allocation}, config={"delta": 0.01}),
                             client)
    assert reply.metrics["num_samples"] == 46 and reply.metrics["num_original"] == 67
    assert reply.metrics["num_oversampled"] == 40 + 25 + target
    if dynamic:  # b = floor(46 / 3) = 15
        factor = 2 / math.pi if rule == "arctan_normalised" else 1.0
        assert reply.metrics["batch_size"] == 15 and reply.metrics["lr"] == pytest.approx(0.1 * factor * math.atan(15))
    else:  # the baselines' fixed batch 64 and lr 0.1
        assert reply.metrics["batch_size"] == 64 and reply.metrics["lr"] == 0.1
    assert set(reply.arrays) == set(model)


def test_cim_resumes_exactly(tmp_path: Path) -> None:
    """delta and the last oversampled fraction live in the checkpointed server state."""
    def config(rounds: int) -> dict[str, Any]:
        cfg = tiny_config(rounds=rounds)
        cfg["algorithm"] = {"name": "cim"}
        return cfg

    assert_resumes_exactly(tmp_path, config, rounds=4)
