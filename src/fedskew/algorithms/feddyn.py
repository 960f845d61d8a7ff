"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough & Saligrama, ICLR 2021, "Federated Learning Based on
Dynamic Regularization"), Algorithm 1.

Client k receives theta^{t-1} and minimises
    L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + (alpha/2) ||theta - theta^{t-1}||^2,
then updates its stored gradient grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1})
(kept in ``client.state``, zero at first). The server keeps h (zero at first, in ``server.state``):
    h^t = h^{t-1} - alpha (1/m) sum_{k in P_t} (theta_k^t - theta^{t-1})     (m = all clients)
    theta^t = (1/|P_t|) sum_{k in P_t} theta_k^t - h^t / alpha.
The dynamic terms act on parameters; buffers (BatchNorm statistics) take the plain mean of the active
clients. theta^t is both sent to clients and evaluated (the authors' code also reports the plain mean of
the active models). Wire cost: FedAvg's.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.aggregate import weighted_mean
from fedskew.components.server_opt import param_keys, zeros_like
from fedskew.components.terms import linear_term, parameter_copy, proximal_term
from fedskew.core.message import Message


@register_algorithm("feddyn")
class FedDyn(FedAvg):
    """Dynamic regularisation: local and global stationary points agree."""

    paper = (
        'Acar, Zhao, Matas, Mattina, Whatmough & Saligrama, ICLR 2021, "Federated Learning Based on Dynamic '
        'Regularization"'
    )

    class Params(FedAvg.Params):
        averages_models: ClassVar[bool] = False  # [algorithm.aggregation] does not apply
        alpha: float = 0.01  # Acar et al. search alpha in {0.1, 0.01, 0.001}; 0.01 is their usual pick

        positive = ("alpha",)

    params: Params

    sum_only_uploads = "equal"  # secure aggregation: only the train replies' unweighted mean (and their count) is read

    # ---- server ------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        params = dict(server.model.named_parameters())
        server.state["h"] = zeros_like({k: params[k].detach() for k in param_keys(server.model)})

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        alpha = self.params.alpha
        prev = server.model.state_dict()
        mean = weighted_mean([m.arrays for _, m in replies], [1.0] * len(replies))
        h: dict[str, torch.Tensor] = server.state["h"]
        # sum_k (theta_k - theta^{t-1}) = |P_t| (mean - theta^{t-1})
        active = len(replies) / self.fed.num_clients
        for k in h:
            h[k].sub_(mean[k] - prev[k], alpha=alpha * active)
            mean[k] = mean[k] - h[k] / alpha
        server.model.load_state_dict(mean)

    # ---- client ------------------------------------------------------------------------------
    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        alpha = self.params.alpha
        model = client.model(msg.arrays)
        anchor = parameter_copy(model)
        grad_prev: dict[str, torch.Tensor] = client.state.get("grad_prev") or zeros_like(anchor)
        _, reply = self.local_train(msg, client, terms=[linear_term(grad_prev), proximal_term(anchor, alpha)])
        client.state["grad_prev"] = {
            k: g - alpha * (reply.arrays[k] - anchor[k]) for k, g in grad_prev.items()
        }
        return reply
