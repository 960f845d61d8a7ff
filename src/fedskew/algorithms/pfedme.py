"""pFedMe (Dinh, Tran & Nguyen, NeurIPS 2020, "Personalized Federated Learning with Moreau Envelopes"), Alg. 1.

Each client's personalised model theta_i solves the Moreau envelope of its loss around its copy of the
global model, theta_i(w) = argmin_theta f_i(theta) + (lambda/2)||theta - w||^2 (Eq. 3-4). A selected client
receives w^t, sets w_{i,0} = w^t and theta = w^t, and for r = 0 .. R-1 (``local_rounds``) draws a batch D
of ``batch_size`` samples and:

- approximates theta_i(w_{i,r}) by K = ``inner_steps`` steps of gradient descent on
  f_i(theta; D) + (lambda/2)||theta - w_{i,r}||^2 with step ``personal_lr`` (Eq. 7; :func:`moreau_steps`),
  theta warm-starting from the previous round's solution as in the authors' code;
- moves its local model towards it, w_{i,r+1} = w_{i,r} - eta lambda (w_{i,r} - theta) (Eq. 8, eta = ``lr``;
  :func:`moreau_pull`).

It sends w_{i,R}; the server takes w^{t+1} = (1 - beta) w^t + beta sum_i p_i w_{i,R} (Alg. 1 line 10),
the clients' models weighted by sample counts p_i as in the authors' code (the paper writes the plain
mean); ``[algorithm.aggregation]`` applies to that mean. Normalisation buffers are theta's (only theta
sees data; the code sends them so) and take the plain mean.

Defaults (sources in docs/algorithms.md, "pFedMe"): the authors' command for MNIST with the
multinomial logistic model (CharlieDinh/pFedMe ``README.md`` line 42): ``lr = 0.005`` (eta),
``personal_lr = 0.1``, ``lam = 15``, ``beta = 1``, ``local_rounds = 20`` (R, ``--local_epochs``),
``batch_size = 20`` (|D|), and ``inner_steps = 5`` (K; ``main.py`` line 77 and README line 62). The
paper's own text was not available here. The authors' inner step also shrinks theta by 0.001 theta
(``pFedMeOptimizer``'s ``mu``, ``FLAlgorithms/optimizers/fedoptimizer.py`` lines 50 and 64), a weight
decay Eq. 7 does not have; fedskew leaves it out.

Differences: Alg. 1 has every client compute its local update each round and the sampled ones send it;
here only the sampled clients compute (the global model is the same; the unsampled clients' theta_i
are not refreshed). Steps run in float32 whatever ``amp``.

Own model (:meth:`PFedMe.personal_state`): theta_i from the client's last round, the personalised model
the paper evaluates ("pFedMe (PM)"); the global model before the client first trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field, replace
from functools import partial
from typing import ClassVar

import torch
from torch import nn

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.model_server import ModelAveragingServer
from fedskew.components.aggregate import Aggregation
from fedskew.components.personal import batch_loss, batch_stream
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.privacy.uploads import WEIGHTS


def moreau_steps(
    model: nn.Module, loss: Callable[[nn.Module], torch.Tensor], anchor: list[torch.Tensor], lam: float, lr: float,
    steps: int,
) -> float:
    """``steps`` steps of gradient descent on loss(theta) + (lam/2)||theta - anchor||^2 over the model's
    parameters theta, in place: theta <- theta - lr (grad loss(theta) + lam (theta - anchor)) (pFedMe, Eq. 7).

    Returns the first step's loss (the batch loss at the starting point).
    """
    params = list(model.parameters())
    first = 0.0
    for k in range(steps):
        value = loss(model)
        if k == 0:
            first = float(value.detach())
        grads = torch.autograd.grad(value, params)
        with torch.no_grad():
            for p, g, a in zip(params, grads, anchor, strict=True):
                p.sub_(lr * (g + lam * (p - a)))
    return first


def moreau_pull(local: list[torch.Tensor], theta: list[torch.Tensor], lam: float, lr: float) -> None:
    """The local model's step towards the personalised one, w <- w - lr lam (w - theta), in place (pFedMe, Eq. 8)."""
    with torch.no_grad():
        for w, t in zip(local, theta, strict=True):
            w.sub_(lr * lam * (w - t))


@register_algorithm("pfedme")
class PFedMe(ModelAveragingServer):
    """Bi-level personalisation: each client's theta_i solves a Moreau envelope around its local w."""

    paper = 'Dinh, Tran & Nguyen, NeurIPS 2020, "Personalized Federated Learning with Moreau Envelopes"'

    own_model = "theta_i from the client's last round"

    class Params(ModelAveragingServer.Params):
        batch_size: int = 20  # |D|, one batch per local round (authors' MNIST command, README line 42)
        lr: float = 0.005  # eta, the local model's step (Eq. 8)
        personal_lr: float = 0.1  # the inner solver's step (Eq. 7)
        lam: float = 15.0  # lambda, the Moreau envelope's regularisation
        beta: float = 1.0  # the server's step (Alg. 1 line 10); 1: the clients' mean
        inner_steps: int = 5  # K, gradient steps per inner problem (authors' main.py, line 77)
        local_rounds: int = 20  # R, local rounds (one batch each) per round
        # How the clients' models are averaged before the beta step ([algorithm.aggregation]).
        aggregation: Aggregation = field(default_factory=Aggregation)

        averages_models: ClassVar[bool] = True

        positive = ("lr", "personal_lr", "lam", "beta")
        at_least = minimums(batch_size=1, inner_steps=1, local_rounds=1)

    params: Params
    upload = replace(WEIGHTS, dpsgd="its clients train with a loop of their own, not train_local, which DP-SGD runs in")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    # ---- server ------------------------------------------------------------------------------
    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        got = self.averaged(server, replies)
        if got is None:
            return
        mean, old = got
        b = self.params.beta
        server.model.load_state_dict(
            {k: (1 - b) * old[k] + b * v if v.is_floating_point() else v for k, v in mean.items()}
        )

    # ---- client ------------------------------------------------------------------------------
    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """theta_i from the client's last round (the global model before it first trains)."""
        return dict(client.state.get("personal") or msg.arrays)

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        p = self.params
        model = client.model(msg.arrays)  # theta, from w^t
        theta = list(model.parameters())
        local = [t.detach().clone() for t in theta]  # w_{i,0} = w^t
        batches = batch_stream(client.num_samples, p.batch_size, client.generator("train"))
        loss_sum, rounds = 0.0, 0
        for _, idx in zip(range(p.local_rounds), batches, strict=False):
            idx = idx.to(client.x.device)
            loss = partial(batch_loss, x=client.x[idx], y=client.y[idx])
            loss_sum += moreau_steps(model, loss, local, p.lam, p.personal_lr, p.inner_steps)
            moreau_pull(local, [t.detach() for t in theta], p.lam, p.lr)
            rounds += 1
        state = state_to_arrays(model.state_dict())
        client.state["personal"] = state
        names = [name for name, _ in model.named_parameters()]
        sent = {**state, **{n: w.contiguous() for n, w in zip(names, local, strict=True)}}
        return Message(arrays=sent, metrics={"num_samples": float(client.num_samples), "steps": float(rounds),
                                             "train_loss": loss_sum / max(rounds, 1)})
