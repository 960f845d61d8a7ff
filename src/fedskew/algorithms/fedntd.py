"""FedNTD (Lee, Jeong, Shin, Bae & Yun, NeurIPS 2022, "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning").

Each client minimises CE(q_l, y) + beta * L_NTD (the local objective of Sec. 4), where L_NTD distils the
received global model's predictions into the local model on the *not-true* classes only: for a sample
of label y, the not-true softmax at temperature tau is

    q~^c(tau) = exp(z_c / tau) / sum_{c' != y} exp(z_c' / tau)   for c != y

(the true class's logit removed before the softmax), and

    L_NTD = sum_{c != y} q~_g^c log(q~_g^c / q~_l^c) = KL(q~_g || q~_l),

the global model's distribution q~_g being the target (computed without gradient). As in the authors'
code (Lee-Gihun/FedNTD, ``algorithms/fedntd/criterion.py`` lines 17 and 30-42) the divergence is averaged
over the batch and multiplied by tau^2, the usual distillation scaling that keeps the gradient's size
independent of tau; at the default tau = 1 it changes nothing.

The global model is the message's weights at the start of local training, kept on the client as a
frozen copy (eval mode, no gradients), so nothing extra travels: the wire is FedAvg's.
"""

from __future__ import annotations

import copy
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.trainer import LossTerm
from fedskew.core.message import Message
from fedskew.core.params import minimums
from fedskew.models.registry import FedModel
from fedskew.privacy.dpsgd import per_sample


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``logits`` (N, C) without each row's true-class entry ``y[i]``: (N, C - 1), class order kept.

    A gather of columns 0..C-2, each shifted past ``y[i]`` from it on: no in-place write and no
    data-dependent shape, so ``torch.func.vmap`` runs it (DP-SGD's per-sample gradients)."""
    cols = torch.arange(logits.shape[1] - 1, device=logits.device).expand(logits.shape[0], -1)
    return logits.gather(1, cols + (cols >= y[:, None]).long())


def not_true_distillation(
    logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, tau: float
) -> torch.Tensor:
    """tau^2 * mean over the batch of KL(q~_g || q~_l), the not-true softmaxes at temperature ``tau``.

    ``global_logits`` is the target (no gradient flows to it); the true class of each sample plays no
    part, so changing either model's true-class logit leaves the value unchanged.
    """
    log_local = F.log_softmax(not_true_logits(logits, y) / tau, dim=1)
    log_global = F.log_softmax(not_true_logits(global_logits.detach(), y) / tau, dim=1)
    kl = (log_global.exp() * (log_global - log_local)).sum(dim=1)
    return tau**2 * kl.mean()


def ntd_term(global_model: nn.Module, beta: float, tau: float) -> LossTerm:
    """FedNTD's beta * L_NTD on the batch, the frozen ``global_model`` giving the targets."""

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            global_logits = global_model(x)
        return beta * not_true_distillation(logits, global_logits, y, tau)

    return per_sample(term)  # a batch mean of one KL per sample (DP-SGD clips it in)


@register_algorithm("fedntd")
class FedNTD(FedAvg):
    """FedAvg plus not-true distillation from the received global model; ``beta = 0`` is FedAvg exactly."""

    paper = ('Lee, Jeong, Shin, Bae & Yun, NeurIPS 2022, "Preservation of the Global Knowledge by '
             'Not-True Distillation in Federated Learning"')

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    class Params(FedAvg.Params):
        # beta = 1, tau = 1: the authors' FedNTD config (Lee-Gihun/FedNTD, config/fedntd.json line 15), the
        # values of the paper's experiments; NTD_Loss's own constructor defaults are tau = 3, beta = 1
        # (algorithms/fedntd/criterion.py line 13), overridden by that config.
        beta: float = 1.0
        tau: float = 1.0

        at_least = minimums(beta=0)
        positive = ("tau",)

    params: Params

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train" or self.params.beta == 0:
            # Without the term the objective is FedAvg's; adding a zero term would only cost time.
            return super().client_step(task, msg, client)
        model = cast(FedModel, client.model(msg.arrays))
        global_model = copy.deepcopy(model).eval()
        global_model.requires_grad_(False)
        term = ntd_term(global_model, self.params.beta, self.params.tau)
        return self.local_train(msg, client, terms=[term])[1]
