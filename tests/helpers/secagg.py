"""Secure aggregation's tests: the simulator's round 1 of FedAvg with the clients' updates it averaged, and the bound
SecAgg+'s quantisation puts on the difference between its mean and that one."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from fedskew.algorithms.base import Algorithm, Replies, ServerContext
from fedskew.algorithms.fedavg import FedAvg
from fedskew.config import typed_config
from fedskew.engine.round_loop import RoundLoop

Updates = list[tuple[float, dict[str, torch.Tensor]]]
"""Each client's ``num_samples`` and the floating arrays it uploads under SecAgg+."""


def simulated_round(
    cfg: dict[str, Any], path: Path, method: type[Algorithm] = FedAvg
) -> tuple[dict[str, torch.Tensor], Updates]:
    """The simulator's global model after ``cfg``'s rounds (one, for a bound), and the uploads of the last round as
    ``method.aggregate`` got them: a reply array named like a model key as its difference from the global model the
    client started from (the model it was sent, for the methods tested here), any other as it is."""
    seen: Updates = []
    original = method.aggregate

    def spy(self: Algorithm, server: ServerContext, replies: Replies) -> None:
        start = {k: v.detach().clone() for k, v in server.model.state_dict().items()}
        seen[:] = [(float(m.metrics["num_samples"]),
                    {k: v.double() - start[k].double() if k in start else v.double()
                     for k, v in m.arrays.items() if v.is_floating_point()})
                   for _, m in replies]
        original(self, server, replies)

    with mock.patch.object(method, "aggregate", spy):
        RoundLoop(typed_config(cfg), path, progress=False).run()
    return torch.load(path / "model.pt", weights_only=True), seen


def quantisation_bound(updates: Updates, clipping: float, steps: int, weighted: bool = True,
                       max_weight: float | None = None) -> float:
    """How far a coordinate of SecAgg+'s mean of ``updates`` (weights, update) can lie from their exact weighted mean
    when no value was clipped, derived from Flower's SecAgg+ (docs/deploy.md, "Secure aggregation"):

    each client uploads its update u_k times its weight quantised as q_k = round(Q n_k / W) / Q (W: ``max_weight``,
    the largest shard of the round's clients; by default the largest weight), clipped to [-C, C] and stochastically
    rounded onto a grid of Q steps over [-C, C]: an error below one step, 2C / Q. The server divides the sum by
    B = sum_k q_k. So the mean is off by less than K 2C / (Q B) from the q-weighted mean, which is off from the
    n-weighted one by at most max|u_k| sum_k |q_k/B - a_k/A| <= max|u_k| K / (Q B) (a_k = n_k / W, A = sum_k a_k,
    |q_k - a_k| <= 1 / 2Q). Together: K (2C + max|u_k|) / (Q B).
    """
    weights = [n if weighted else 1.0 for n, _ in updates]
    top = max_weight or max(weights)
    total = sum(round(steps * w / top) / steps for w in weights)
    largest = max(float(u.abs().max()) for _, arrays in updates for u in arrays.values())
    return len(updates) * (2 * clipping + largest) / (steps * total)


def assert_within(secure: dict[str, torch.Tensor], plain: dict[str, torch.Tensor], bound: float) -> float:
    """Every floating value of ``secure`` within ``bound`` of ``plain``'s, plus one float32 rounding of each (both are
    computed in float64 and stored in the model's dtype); integer tensors equal. Returns the largest difference."""
    worst = 0.0
    for k, p in plain.items():
        s = secure[k]
        if not p.is_floating_point():
            assert torch.equal(s, p), k
            continue
        diff = (s.double() - p.double()).abs()
        ulp = p.double().abs() * 2.0 ** -23 + torch.finfo(p.dtype).tiny
        assert bool((diff <= bound * 1.0001 + ulp).all()), (k, float(diff.max()), bound)
        worst = max(worst, float(diff.max()))
    assert math.isfinite(worst)
    return worst
