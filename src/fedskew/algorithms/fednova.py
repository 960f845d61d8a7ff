"""FedNova (Wang, Liu, Liang, Joshi & Poor, NeurIPS 2020, "Tackling the Objective Inconsistency Problem
in Heterogeneous Federated Optimization"): normalised averaging.

Clients with more data run more local steps tau_i (epochs x batches), so FedAvg's average is biased
towards their objectives. FedNova divides each client's change by the l1 norm a_i of its local
aggregation vector, d_i = (x - y_i)/a_i, and rescales the weighted mean by tau_eff = sum_i p_i a_i
(Eq. 6; p_i = n_i / sum_j n_j over the round's clients): x <- x - tau_eff sum_i p_i d_i.
For plain SGD a_i = tau_i; with local momentum rho (Sec. 4.2 and the authors' code),
a_i = sum_{t=1..tau_i} (1 - rho^t)/(1 - rho) = [tau_i - rho (1 - rho^tau_i)/(1 - rho)]/(1 - rho).
Clients send their model (as FedAvg) and the scalar a_i (a metric, not a tensor: the ledger shows
FedAvg's cost).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.aggregate import weighted_mean
from fedskew.components.server_opt import param_keys
from fedskew.core.message import Message
from fedskew.privacy.uploads import WEIGHTS


def normalizing_coefficient(tau: int, rho: float) -> float:
    """a_i, the l1 norm of the local aggregation vector after ``tau`` SGD steps with momentum ``rho``.

    Step t's gradient keeps acting through the momentum buffer with total weight
    1 + rho + ... + rho^(tau - t); summing over steps gives the closed form above (tau for rho = 0).
    """
    if rho == 0:
        return float(tau)
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


@register_algorithm("fednova")
class FedNova(FedAvg):
    """FedAvg with normalised averaging of the parameters (buffers are averaged as in FedAvg)."""

    paper = (
        'Wang, Liu, Liang, Joshi & Poor, NeurIPS 2020, "Tackling the Objective Inconsistency Problem in '
        'Heterogeneous Federated Optimization"'
    )

    class Params(FedAvg.Params):
        averages_models: ClassVar[bool] = False  # normalised steps: [algorithm.aggregation] does not apply

    params: Params
    upload = replace(WEIGHTS, central="its aggregate scales each client's update by that client's own step count "
                     "(a_i), which a noised mean cannot carry")

    not_sum_only = (
        "weights each client's update by its own count of local steps (normalised averaging), which the server "
        "applies client by client; SecAgg+ reveals only the sum of the uploads"
    )

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        n = [m.metrics["num_samples"] for _, m in replies]
        a = [m.metrics["a"] for _, m in replies]
        p = [ni / sum(n) for ni in n]
        tau_eff = sum(pi * ai for pi, ai in zip(p, a, strict=True))
        msgs = [m for _, m in replies]
        x = server.model.state_dict()
        new = weighted_mean([m.arrays for m in msgs], n)  # buffers: FedAvg's mean
        for k in param_keys(server.model):
            xk = x[k].to(torch.float64)
            d = sum(pi / ai * (xk - m.arrays[k].to(torch.float64)) for pi, ai, m in zip(p, a, msgs, strict=True))
            new[k] = (xk - tau_eff * d).to(x[k].dtype)
        server.model.load_state_dict(new)
        server.metrics["tau_eff"] = tau_eff

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        res, reply = self.local_train(msg, client)
        reply.metrics["a"] = normalizing_coefficient(res.steps, self.params.momentum)
        return reply
