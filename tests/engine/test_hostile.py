"""Hostile and broken clients: the server survives, and no single client decides the model.

Every case runs through the real round loop, and the reply cases also through Flower's message path
(the in-process SuperLink of tests/helpers/flower.py: contents serialised both ways, the real
ClientApp on the node).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.base import ClientContext
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.aggregate import Aggregation, robust_average, update_norms
from fedskew.config import dump, typed_config
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.engine.faults import model_replacement
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.flower import FakeGrid, deploy_on, register_for_flower

HOSTILE = 0  # the client that misbehaves
TWO = (0, 1)  # the clients of the two-reply overflow case


class Hostile(FedAvg):
    """FedAvg whose client ``HOSTILE`` (or every client, ``everyone``) sends one kind of bad reply."""

    @dataclass
    class Params(FedAvg.Params):
        attack: str = "none"
        everyone: bool = False

    params: Params

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        reply = super().client_step(task, msg, client)
        a = self.params.attack
        if task == "train" and a == "huge" and client.cid in TWO:  # two claims whose sum overflows a float
            reply.metrics["num_samples"] = 1.5e308
            return reply
        if task != "train" or (client.cid != HOSTILE and not self.params.everyone):
            return reply
        if a == "no_num_samples":
            reply.metrics.pop("num_samples")
        elif a == "claim":  # 1e12 samples and weights of 1e4: would replace the model under FedAvg's mean
            reply.metrics["num_samples"] = 1e12
            reply.arrays = {k: torch.full_like(v, 1e4) if v.is_floating_point() else v
                            for k, v in reply.arrays.items()}
        elif a in ("big", "large"):  # finite weights of 3e38 that wreck a mean, or of 1e4 (an honest claim)
            value = 3e38 if a == "big" else 1e4
            reply.arrays = {k: torch.full_like(v, value) if v.is_floating_point() else v
                            for k, v in reply.arrays.items()}
        elif a == "fractional":
            reply.metrics["num_samples"] = 2.5
        return reply


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch) -> str:
    return register_for_flower(monkeypatch, "hostile", Hostile)


def _config(attack: str, rounds: int = 2, **algo: Any) -> dict[str, Any]:
    return tiny_config(rounds=rounds, algorithm={"name": "hostile", "clients_per_round": 6, "attack": attack, **algo})


def _simulate(cfg: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _over_flower(cfg: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    grid = FakeGrid([{"partition-id": "0,2,4"}, {"partition-id": "1,3,5"}])
    run_dir = deploy_on(grid, path, cfg)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


REASONS = {
    "no_num_samples": "metric 'num_samples' is missing",
    "claim": f"claims 1000000000000 samples, but client {HOSTILE} holds at most",
    "huge": "claims 1500000000000000",
    "big": "exceeds 10 x the round's median",
    "large": "exceeds 10 x the round's median",
    "fractional": "num_samples = 2.5 is not a whole number",
}


@pytest.mark.parametrize("path", ["simulation", "flower"])
@pytest.mark.parametrize("attack", list(REASONS))
def test_a_bad_reply_is_rejected_with_its_reason_and_the_model_stays_sane(
    hostile: str, tmp_path: Path, attack: str, path: str
) -> None:
    run = _simulate if path == "simulation" else _over_flower
    records = run(_config(attack), tmp_path / "bad")
    honest = _simulate(_config("none"), tmp_path / "honest")
    bad = TWO if attack == "huge" else (HOSTILE,)
    for rec in records:
        for who in bad:
            reasons = [reason for cid, reason in rec["rejected"] if cid == who]
            assert len(reasons) == 1 and REASONS[attack] in reasons[0], rec["rejected"]
            assert who not in rec["clients"]
        assert rec["samples"] <= 400  # the tiny federation's 400 images: no claim counted
    # Without the hostile client's say, the model learns as the honest run does (within a few points).
    assert records[-1]["accuracy"] > 0.5 and abs(records[-1]["accuracy"] - honest[-1]["accuracy"]) < 0.2
    model = torch.load((tmp_path / "bad").rglob("model.pt").__next__(), weights_only=True)
    assert all(bool(torch.isfinite(t).all()) and float(t.abs().max()) < 1e3 for t in model.values()
               if t.is_floating_point())


@pytest.mark.parametrize("path", ["simulation", "flower"])
def test_a_round_whose_every_reply_is_rejected_stops_the_run_resumably(
    hostile: str, tmp_path: Path, path: str
) -> None:
    cfg = _config("no_num_samples", rounds=3, everyone=True)
    run = _simulate if path == "simulation" else _over_flower
    with pytest.raises(FedskewError, match=r"^round 1: every reply to 'train' was rejected \(client \d+: metric "
                       r"'num_samples' is missing; .*\); the run stops here") as err:
        run(cfg, tmp_path / "r")
    assert "\n" not in str(err.value)
    [metrics] = (tmp_path / "r").rglob("metrics.jsonl")
    assert metrics.read_text() == ""  # nothing half-written


def test_robust_rules_by_hand() -> None:
    ref = {"w": torch.zeros(3), "n": torch.tensor(1)}
    items = [{"w": torch.tensor([1.0, 2.0, 3.0]), "n": torch.tensor(1)},
             {"w": torch.tensor([2.0, 4.0, 6.0]), "n": torch.tensor(2)},
             {"w": torch.tensor([3.0, 6.0, 9.0]), "n": torch.tensor(1)},
             {"w": torch.tensor([100.0, -100.0, 100.0]), "n": torch.tensor(1)}]
    off = Aggregation(max_norm_ratio=0)
    median, _ = robust_average(items, [1, 1, 1, 1], ref, Aggregation("median", max_norm_ratio=0))
    assert median["w"].tolist() == [2.5, 3.0, 7.5] and int(median["n"]) == 2
    trimmed, _ = robust_average(items, [1, 1, 1, 1], ref, Aggregation("trimmed_mean", trim=0.25, max_norm_ratio=0))
    assert trimmed["w"].tolist() == [2.5, 3.0, 7.5]
    mean, _ = robust_average(items[:3], [1, 2, 1], ref, off)
    assert mean["w"].tolist() == [2.0, 4.0, 6.0]
    clipped, _ = robust_average(items[:1], [1], ref, Aggregation(clip_norm=1.0, max_norm_ratio=0))
    assert abs(float(clipped["w"].norm()) - 1.0) < 1e-6
    _, rejected = robust_average(items, [1, 1, 1, 1], ref, Aggregation())
    assert [i for i, _ in rejected] == [3] and update_norms(items[:1], ref)[0] == pytest.approx(14**0.5)


def test_model_replacement_flips_and_boosts_the_update() -> None:
    request = Message(arrays={"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(3)})
    honest = Message(arrays={"w": torch.tensor([2.0, 0.0]), "n": torch.tensor(4)}, metrics={"num_samples": 5.0})
    bad = model_replacement(request, honest, 10.0)
    assert bad.arrays["w"].tolist() == [-9.0, 11.0] and int(bad.arrays["n"]) == 4
    assert bad.metrics == honest.metrics


def test_attackers_are_a_fixed_fraction_drawn_from_the_seed(tmp_path: Path) -> None:
    from fedskew.config import Faults

    f = Faults(malicious=0.1)
    assert len(f.attackers(0, 100)) == 10 and f.attackers(0, 100) == f.attackers(0, 100)
    assert f.attackers(0, 100) != f.attackers(1, 100) and Faults().attackers(0, 100) == frozenset()


def test_clipping_and_trimmed_mean_resist_model_replacement(tmp_path: Path) -> None:
    """One of six clients replaces the model: FedAvg's mean is wrecked, the robust rules are not."""
    results = {}
    for label, agg in [("mean", {"max_norm_ratio": 0.0}),
                       ("trimmed", {"rule": "trimmed_mean", "trim": 0.2, "max_norm_ratio": 0.0}),
                       ("clipped", {"clip_norm": 1.0, "max_norm_ratio": 0.0})]:
        cfg = tiny_config(rounds=4, algorithm={"name": "fedavg", "clients_per_round": 6, "aggregation": agg},
                          faults={"malicious": 0.17, "malicious_scale": 10.0})
        results[label] = _simulate(cfg, tmp_path / label)[-1]["accuracy"]
    assert results["mean"] <= 0.3  # 4 classes: chance
    assert results["trimmed"] > results["mean"] + 0.25 and results["clipped"] > results["mean"] + 0.25
