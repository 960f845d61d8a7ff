"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach"), Alg. 1.

The global model is trained for how well it does after one step of local adaptation: the objective is
F(w) = mean_i f_i(w - alpha grad f_i(w)) (Eq. 3). A selected client runs tau = ``local_steps`` meta-steps
from the received w^t, each on three independent batches D, D', D'' of ``batch_size`` samples
(:func:`meta_step`):

- w~ = w - alpha grad f_i(w; D)  (the adaptation step);
- w <- w - beta (I - alpha H) grad f_i(w~; D') with H the Hessian of f_i at w on D'' (Eq. 8), where
  ``variant`` "fo" (Per-FedAvg (FO)) drops the Hessian term, and "hf" (Per-FedAvg (HF)) replaces
  H g by the finite difference [grad f_i(w + delta g; D'') - grad f_i(w - delta g; D'')] / (2 delta) (Eq. 9).

It sends w (the wire is FedAvg's); the server averages the clients' models (weighted by sample counts as
fedskew's FedAvg, where the paper writes the plain mean; ``[algorithm.aggregation]`` applies).

Defaults (docs/algorithms.md, "Per-FedAvg"): ``alpha = 0.001``, ``beta = 0.001``, ``delta = 0.001`` (HF),
``local_steps = 10`` (tau) were written from memory of the paper's Sec. 5; no stored source confirms them
(the pFedMe authors' re-implementation runs alpha 0.005, beta 0.001, 20 steps, batch 20 on MNIST).
``variant = "fo"``, the cheaper of the paper's two variants; ``batch_size = 64`` is fedskew's shared
default, not the paper's. Steps run in float32 whatever ``amp``.

Own model (:meth:`PerFedAvg.personal_state`): the global model after one step of SGD with step alpha on
one batch of the client's training data (from its ``"adapt"`` stream of the round), the paper's evaluation
("one step of local stochastic gradient descent is performed during test time", Sec. 5, as quoted in
CharlieDinh/pFedMe#14).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import field, replace
from functools import partial
from typing import ClassVar, Literal

import torch
from torch import nn

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.model_server import ModelAveragingServer
from fedskew.components.aggregate import Aggregation
from fedskew.components.personal import batch_loss, batch_stream, gradients
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.privacy.uploads import WEIGHTS

Loss = Callable[[nn.Module], torch.Tensor]


def _grad(model: nn.Module, loss: Loss) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss(model), list(model.parameters())))


def _set(params: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, v in zip(params, values, strict=True):
            p.copy_(v)


def meta_step(
    model: nn.Module, losses: tuple[Loss, Loss, Loss], alpha: float, beta: float, variant: str, delta: float
) -> float:
    """One Per-FedAvg meta-step on the model's parameters, in place (Alg. 1 lines 6-8).

    ``losses`` are the losses on the batches D, D' and D''. Returns the loss on D at the starting point.
    """
    on_d, on_d1, on_d2 = losses
    params = list(model.parameters())
    w = [p.detach().clone() for p in params]
    first = on_d(model)
    g = torch.autograd.grad(first, params)
    _set(params, [wi - alpha * gi for wi, gi in zip(w, g, strict=True)])  # w~
    outer = _grad(model, on_d1)  # grad f(w~; D')
    if variant == "hf":  # H(w; D'') outer by central differences
        _set(params, [wi + delta * oi for wi, oi in zip(w, outer, strict=True)])
        plus = _grad(model, on_d2)
        _set(params, [wi - delta * oi for wi, oi in zip(w, outer, strict=True)])
        minus = _grad(model, on_d2)
        outer = [o - alpha * (a - b) / (2 * delta) for o, a, b in zip(outer, plus, minus, strict=True)]
    _set(params, [wi - beta * oi for wi, oi in zip(w, outer, strict=True)])
    return float(first.detach())


@register_algorithm("perfedavg")
class PerFedAvg(ModelAveragingServer):
    """MAML-style FedAvg: the global model is trained to be good after one local step."""

    paper = (
        'Fallah, Mokhtari & Ozdaglar, NeurIPS 2020, "Personalized Federated Learning with Theoretical '
        'Guarantees: A Model-Agnostic Meta-Learning Approach"'
    )

    own_model = "the global model after one step on the client's data"

    class Params(ModelAveragingServer.Params):
        batch_size: int = 64  # |D| = |D'| = |D''| (fedskew's shared default)
        alpha: float = 0.001  # the adaptation step (unverified: no stored source gives the paper's value)
        beta: float = 0.001  # the meta-step (pFedMe's re-implementation also uses 0.001)
        local_steps: int = 10  # tau, meta-steps per round (unverified)
        variant: Literal["fo", "hf"] = "fo"  # first-order, or Hessian-free (the paper reports both)
        delta: float = 0.001  # the HF finite-difference step (unverified)
        # How the clients' models are averaged ([algorithm.aggregation]).
        aggregation: Aggregation = field(default_factory=Aggregation)

        averages_models: ClassVar[bool] = True

        positive = ("alpha", "beta", "delta")
        at_least = minimums(batch_size=1, local_steps=1)

    params: Params
    upload = replace(WEIGHTS, dpsgd="its clients train with a loop of their own, not train_local, which DP-SGD runs in")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    # ---- server ------------------------------------------------------------------------------
    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        got = self.averaged(server, replies)
        if got is not None:
            server.model.load_state_dict(got[0])

    # ---- client ------------------------------------------------------------------------------
    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The global model after one step of SGD (step alpha) on one batch of the client's training data."""
        model = client.model(msg.arrays)
        for idx in batch_stream(client.num_samples, self.params.batch_size, client.generator("adapt")):
            idx = idx.to(client.x.device)
            grads = gradients(model, client.x[idx], client.y[idx])
            with torch.no_grad():
                for p, g in zip(model.parameters(), grads, strict=True):
                    p.sub_(self.params.alpha * g)
            break
        return state_to_arrays(model.state_dict())

    @staticmethod
    def loss_on(client: ClientContext, idx: torch.Tensor) -> Loss:
        """The loss on the client's samples ``idx``, as a function of the model."""
        idx = idx.to(client.x.device)
        return partial(batch_loss, x=client.x[idx], y=client.y[idx])

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        p = self.params
        model = client.model(msg.arrays)
        batches = batch_stream(client.num_samples, p.batch_size, client.generator("train"))
        loss_sum, steps = 0.0, 0
        for _ in range(p.local_steps if client.num_samples else 0):
            d, d1, d2 = (self.loss_on(client, next(batches)) for _ in range(3))
            loss_sum += meta_step(model, (d, d1, d2), p.alpha, p.beta, p.variant, p.delta)
            steps += 1
        return Message(arrays=state_to_arrays(model.state_dict()),
                       metrics={"num_samples": float(client.num_samples), "steps": float(steps),
                                "train_loss": loss_sum / max(steps, 1)})
