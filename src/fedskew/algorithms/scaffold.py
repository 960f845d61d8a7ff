"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, ICML 2020, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning"), Algorithm 1 with option II.

The server keeps a control variate c and each client i its own c_i (in ``client.state``; the server never
sees it). Locally the gradient is corrected to g + c - c_i (line 10). After K steps of rate eta from x to
y_i, the client sets c_i+ = c_i - c + (x - y_i)/(K eta) (option II, line 12) and sends
(Delta y_i, Delta c_i) = (y_i - x, c_i+ - c_i). The server steps x <- x + eta_g mean(Delta y) and
c <- c + (|S|/N) mean(Delta c) (lines 16-17), means unweighted as in the paper.

Two options reproduce NIID-Bench's SCAFFOLD (Li, Diao, Chen & He, ICDE 2022, "Federated Learning on
Non-IID Data Silos: An Experimental Study"; ``experiments.py`` of Xtra-Computing/NIID-Bench), which runs
with momentum 0.9: ``correction = "weights"`` applies w <- w - eta (c - c_i) after each (momentum) SGD
step instead of adding c - c_i to the gradient (lines 347-350 there), and ``weighting = "samples"``
averages Delta y with weights n_i / sum n (NIID-Bench's new global model is the sample-weighted mean of
the local models, lines 1025-1036). The variates' update stays option II with the step count K and
the local rate eta (line 364), and c's update the unweighted sum over the N clients (lines 679-690).

Wire cost: down x and c, up Delta y and Delta c, i.e. twice FedAvg each way for models without buffers
(the variates cover parameters only; BatchNorm's running statistics travel once, inside x and Delta y).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.aggregate import weighted_mean
from fedskew.components.server_opt import param_keys, sgd_step, zeros_like
from fedskew.components.terms import correction_hook, weight_correction_hook
from fedskew.core.message import Message, arrays_with_prefix, state_to_arrays
from fedskew.core.params import check
from fedskew.privacy.uploads import Upload


@register_algorithm("scaffold")
class Scaffold(FedAvg):
    """Control variates against client drift."""

    paper = (
        'Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, ICML 2020, "SCAFFOLD: Stochastic Controlled '
        'Averaging for Federated Learning"'
    )

    class Params(FedAvg.Params):
        averages_models: ClassVar[bool] = False  # [algorithm.aggregation] does not apply
        server_lr: float = 1.0  # eta_g; the paper's experiments use eta_g = 1 (Sec. 7)
        # Where c - c_i acts: "gradient" adds it to the gradient (Alg. 1 line 10); "weights" moves the
        # weights by -eta (c - c_i) after each optimiser step, outside momentum (NIID-Bench's code).
        correction: Literal["gradient", "weights"] = "gradient"
        # The mean of Delta y: "uniform" (Alg. 1 line 16) or weighted by the clients' sample counts
        # (NIID-Bench's code, whose global model is FedAvg's weighted mean of the local models).
        weighting: Literal["uniform", "samples"] = "uniform"

        renamed: ClassVar[dict[str, str]] = {"global_lr": "server_lr"}  # FedAvgM's and FedAdam's name

        positive = ("server_lr",)

        def __post_init__(self) -> None:
            super().__post_init__()
            # Option II reads (x - y_i)/(K eta) as the mean corrected gradient, which holds for plain SGD
            # steps (weight decay is fine: it is part of the local objective) but not with momentum, where
            # a correction added to the gradient is amplified by the momentum buffer. With the correction
            # on the weights (NIID-Bench), (x - y_i)/(K eta) is the mean step over eta, momentum included,
            # and the correction moves the weights by that much per step: momentum is allowed there.
            check(
                self.momentum == 0 or self.correction == "weights",
                "momentum",
                self.momentum,
                '0 for SCAFFOLD (option II assumes plain SGD), unless correction = "weights" (NIID-Bench)',
            )

    params: Params
    upload = Upload(measured_from=(("dy.", None), ("dc.", None)))  # updates of x and c, clipped together

    sum_only_uploads = "equal"  # secure aggregation: only the train replies' unweighted mean (and their count) is read

    # ---- server ------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        """c = 0 (Alg. 1, "server input")."""
        params = dict(server.model.named_parameters())
        server.state["c"] = zeros_like({k: params[k].detach() for k in param_keys(server.model)})

    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        arrays = state_to_arrays(server.model.state_dict(), "x.")
        arrays.update(state_to_arrays(server.state["c"], "c."))
        msg = Message(arrays=arrays)
        return [(cid, msg) for cid in self.select(server)]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply holds Delta y (the model's keys) and Delta c (the parameters' keys)."""
        if task != "train":
            return None
        spec = {f"dy.{k}": (tuple(v.shape), v.dtype) for k, v in server.model.state_dict().items()}
        spec.update({f"dc.{k}": (tuple(v.shape), v.dtype) for k, v in server.state["c"].items()})
        return spec

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        equal = [1.0] * len(replies)
        by_size = [m.metrics["num_samples"] for _, m in replies]
        dy = weighted_mean(
            [arrays_with_prefix(m.arrays, "dy.") for _, m in replies],
            by_size if self.params.weighting == "samples" else equal,
        )
        dc = weighted_mean([arrays_with_prefix(m.arrays, "dc.") for _, m in replies], equal)
        x = {k: v.detach().clone() for k, v in server.model.state_dict().items()}
        floats = {k: d for k, d in dy.items() if d.is_floating_point()}
        sgd_step(x, floats, self.params.server_lr)
        for k, d in dy.items():  # integer buffers (BatchNorm's batch counter): the largest client value
            if k not in floats:
                x[k] += d
        server.model.load_state_dict(x)
        sgd_step(server.state["c"], dc, len(replies) / self.fed.num_clients)

    # ---- client ------------------------------------------------------------------------------
    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        x = arrays_with_prefix(msg.arrays, "x.")
        c = arrays_with_prefix(msg.arrays, "c.")
        c_i: dict[str, torch.Tensor] = client.state.get("c_i") or zeros_like(c)
        diff = {k: c[k] - c_i[k] for k in c}
        p = self.params
        hook = (
            correction_hook(diff) if p.correction == "gradient" else weight_correction_hook(diff, p.lr, p.weight_decay)
        )
        res, reply = self.local_train(Message(arrays=x), client, grad_hooks=[hook])
        y = reply.arrays
        scale = 1.0 / (max(res.steps, 1) * self.params.lr)  # 1/(K eta)
        c_new = {k: c_i[k] - c[k] + (x[k] - y[k]) * scale for k in c}
        client.state["c_i"] = c_new
        arrays = {f"dy.{k}": y[k] - x[k] for k in x}
        arrays.update({f"dc.{k}": c_new[k] - c_i[k] for k in c})
        return Message(arrays=arrays, metrics=reply.metrics)
