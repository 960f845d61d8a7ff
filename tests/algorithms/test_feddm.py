"""FedDM and the aggregation-free server: the pool of latest sets, uploads without a model, fresh
condensation every round, and restarting the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import fedskew.algorithms.feddm as feddm_module
from fedskew.algorithms.condensation.pool import OWNER, update_pool, uploads_artifact
from fedskew.algorithms.feddm import FedDM
from fedskew.condense import SyntheticSet
from fedskew.config import typed_config
from fedskew.core.seeding import seeded_init
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.spies import record_amps

FAST: dict[str, Any] = {"condense_iterations": 3, "ipc": 2, "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}}


def feddm_config(rounds: int = 2, **algo: Any) -> dict[str, Any]:
    return tiny_config(rounds=rounds, checkpoint_every=0, algorithm={"name": "feddm", **FAST, **algo})


def test_update_pool_replaces_a_clients_rows_and_orders_by_owner() -> None:
    first = update_pool(None, [(3, {"x": torch.tensor([30, 31])}), (1, {"x": torch.tensor([10])})], keep_others=True)
    assert first["x"].tolist() == [10, 30, 31] and first[OWNER].tolist() == [1, 3, 3]
    second = update_pool(first, [(3, {"x": torch.tensor([32])}), (0, {"x": torch.zeros(0, dtype=torch.int64)})],
                         keep_others=True)
    assert second["x"].tolist() == [10, 32] and second[OWNER].tolist() == [1, 3]
    dropped = update_pool(first, [(3, {"x": torch.tensor([32])})], keep_others=False)
    assert dropped["x"].tolist() == [32]


def test_uploads_artifact_keeps_only_the_rows_this_rounds_clients_sent() -> None:
    old = update_pool(None, [(1, {"images": torch.tensor([10]), "labels": torch.tensor([0])})], keep_others=True)
    pool = update_pool(old, [(3, {"images": torch.tensor([30, 31]), "labels": torch.tensor([2, 5])})], keep_others=True)
    art = uploads_artifact(pool, [3])
    assert art["images"].tolist() == [30, 31] and art["labels"].tolist() == [2, 5] and art["clients"].tolist() == [3, 3]
    assert uploads_artifact(pool, [])["images"].numel() == 0


def test_defaults() -> None:
    p = FedDM.Params()
    assert (p.rho, p.clip_norm, p.image_lr, p.image_momentum, p.init) == (5.0, 2.0, 1.0, 0.9, "mean")
    assert (p.ipc, p.condense_iterations, p.real_batch) == (50, 1000, 256)
    s = p.server
    assert (s.epochs, s.batch_size, s.lr, s.momentum, p.restart_model) == (500, 256, 0.001, 0.9, False)


def test_uploads_only_uint8_sets_and_trains_on_every_clients_latest_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inits: list[Any] = []
    real_dm = feddm_module.distribution_matching

    def spy(*args: Any, **kwargs: Any) -> SyntheticSet:
        inits.append(kwargs.get("init_set"))
        return real_dm(*args, **kwargs)

    monkeypatch.setattr(feddm_module, "distribution_matching", spy)
    sim = RoundLoop(typed_config(feddm_config(rounds=3)), tmp_path / "r", progress=False)
    res = sim.run()
    c, h, w = sim.fed.info.image_shape
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    seen: set[int] = set()
    for rec in res.records:
        seen.update(rec["clients"])
        assert rec["bytes_server_to_client"] == 3 * model_bytes
        assert rec["bytes_client_to_server"] % (c * h * w + 8) == 0  # images and labels only, no model
    owners = sim.server.state["syn_owner"]
    assert set(owners.tolist()) == seen  # absent clients' latest sets stay in the union
    assert res.records[-1]["synthetic_images"] == owners.numel()
    # A fresh set from real images every round; nothing is kept on the clients.
    assert inits and all(i is None for i in inits)
    assert all(state == {} for state in sim.client_states.values())
    # Each round's uploads are kept for `fedskew audit` and the report, tagged with their senders.
    from safetensors.torch import load_file

    last = load_file(str(tmp_path / "r" / "artifacts" / "synthetic" / "round_0003.safetensors"))
    assert last["images"].dtype == torch.uint8 and set(last["clients"].tolist()) == set(res.records[-1]["clients"])
    assert len(last["images"]) == len(last["labels"]) == len(last["clients"])


def test_restart_model_trains_from_a_fresh_initialisation(tmp_path: Path) -> None:
    cfg = feddm_config(rounds=1, restart_model=True, server={"epochs": 1, "lr": 1e-12, "momentum": 0.0})
    sim = RoundLoop(typed_config(cfg), tmp_path / "r", progress=False)
    sim.run()
    fresh = seeded_init(sim.fed.info.model.build, sim.fed.info.seed, "restart", 1).state_dict()
    for k, v in sim.server.model.state_dict().items():
        assert torch.allclose(v, fresh[k], atol=1e-8), k


def test_bf16_condenses_in_bf16_and_keeps_the_wire_and_the_model_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    amps = record_amps(monkeypatch, feddm_module, "distribution_matching")
    bf16 = typed_config({**feddm_config(rounds=2), "amp": "bf16"})
    mixed = RoundLoop(bf16, tmp_path / "bf16", progress=False).run().records
    assert amps and set(amps) == {"bf16"}  # the run's amp reaches the clients' condensation
    plain = RoundLoop(typed_config(feddm_config(rounds=2)), tmp_path / "fp32", progress=False).run().records
    assert [r["bytes_client_to_server"] for r in mixed] == [r["bytes_client_to_server"] for r in plain]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in mixed)
    model = torch.load(tmp_path / "bf16" / "model.pt", weights_only=True)
    assert all(t.dtype == torch.float32 for t in model.values() if t.is_floating_point())
