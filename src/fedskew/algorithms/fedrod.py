"""FedRoD (Chen & Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for Image
Classification"), Sec. 4, the linear variant (the hypernetwork variant is not implemented).

The model has two predictors on one feature extractor f: the generic head g (the model's ``classifier``),
which with f is the federation's global model, and a personal head p of the same shape (a linear layer
on f's output) that each client keeps. In every mini-batch a client takes two gradient steps that do not
touch each other's parameters:

* the generic model (f, g) on the balanced softmax loss of its logits z = g(f(x)), i.e. the cross-entropy
  of z_c + log(n_c / n) with n_c the client's training samples of class c (:func:`balanced_logits`); a class
  the client lacks (n_c = 0) gets -inf, the formula's limit, so it leaves the softmax and gets no gradient;
* the personal head on the plain cross-entropy of z.detach() + p(f(x).detach()): the personal model's
  logits are the sum of the two heads', and the personal loss reaches neither f nor g.

The client sends (f, g) back, the server averages them (FedAvg's weighted mean; ``[algorithm.aggregation]``
applies) and p stays in ``client.state["personal_head"]``: the wire is FedAvg's (tested). A client's first p
is the seeded initial model's classifier (both sides can build it, nothing is sent). Both heads use the
method's SGD settings and ``local_epochs`` (sources in docs/algorithms.md, "FedRoD").

Own model (:meth:`FedRoD.personal_state`): as both heads are linear on the same features,
g(f(x)) + p(f(x)) is one linear head with weight W_g + W_p and bias b_g + b_p on f, so the client's model is
the global model with that classifier, and the per-client evaluation scores it as any other model.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.algorithms.fedlc import with_absent
from fedskew.components.trainer import host_sum
from fedskew.core.device import current_compute
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.models.layout import as_model_format, is_channels_last, shuffled_batches
from fedskew.privacy.uploads import WEIGHTS

HEAD = ("classifier.weight", "classifier.bias")
"""The generic head's state-dict keys (``FedModel.classifier``); the personal head has the same shapes."""


def balanced_logits(logits: torch.Tensor, counts: torch.Tensor, absent_count: float = 0.0) -> torch.Tensor:
    """The balanced softmax's logits: ``z_c + log(n_c / n)`` for a batch of ``logits`` (``(B, C)``) and the
    client's class ``counts`` (``(C,)``); ``-inf`` for a class with ``n_c = 0`` (its term n_c exp(z_c) in the
    softmax's denominator is 0); with ``absent_count > 0`` such a class counts as ``absent_count`` samples
    instead (``n`` then includes them; a constant of the row, which the softmax ignores)."""
    if absent_count > 0:
        n = with_absent(counts, absent_count, logits.dtype)
        return logits + (n / n.sum()).log()
    present = counts > 0
    prior = counts.to(logits.dtype) / counts.sum().clamp(min=1).to(logits.dtype)
    return (logits + prior.clamp(min=torch.finfo(logits.dtype).tiny).log()).masked_fill(~present, float("-inf"))


def balanced_softmax_loss(
    logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, absent_count: float = 0.0
) -> torch.Tensor:
    """Mean balanced softmax loss of ``logits`` for labels ``y`` under the class ``counts``."""
    return F.cross_entropy(balanced_logits(logits, counts, absent_count), y)


class BalancedParams(FedAvg.Params):
    """FedAvg's parameters and the count the balanced softmax gives a class the client lacks."""

    # 0 takes the formula's limit (log 0 = -inf: the class leaves the softmax, as the PFLlib code FedRoD's
    # rule follows); a positive value is a finite floor (1: the clamp_min(1) of other balanced-softmax
    # code, as if the client held one sample). docs/algorithms.md, "FedRoD".
    absent_count: float = 0.0

    at_least = minimums(absent_count=0)


@register_algorithm("fedrod")
class FedRoD(FedAvg):
    """FedAvg of a feature extractor and a generic head trained with the balanced softmax; each client also
    trains a personal head on top of them (``client.state["personal_head"]``). Beyond FedAvg's parameters, only
    ``absent_count`` (:class:`BalancedParams`)."""

    paper = (
        'Chen & Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning for Image '
        'Classification"'
    )

    own_model = "the global model with the client's personal head added to its generic head"
    upload = replace(WEIGHTS, dpsgd="its clients train with a loop of their own, not train_local, which DP-SGD runs in")

    Params = BalancedParams
    params: BalancedParams

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    # ---- client ------------------------------------------------------------------------------
    def initial_personal_head(self) -> dict[str, torch.Tensor]:
        """Every client's first personal head: the seeded initial model's classifier."""
        init = self.initial_state()
        return {k: init[k] for k in HEAD}

    def own_head(self, client: ClientContext) -> dict[str, torch.Tensor]:
        head: dict[str, torch.Tensor] | None = client.state.get("personal_head")
        return head if head is not None else self.initial_personal_head()

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The global model whose classifier is the sum of the generic head and the client's personal head."""
        head = self.own_head(client)
        out = dict(msg.arrays)
        for k in HEAD:
            out[k] = msg.arrays[k] + head[k].to(msg.arrays[k].device)
        return out

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        model = client.model(msg.arrays)
        features, classifier = getattr(model, "features", None), getattr(model, "classifier", None)
        if not isinstance(features, nn.Module) or not isinstance(classifier, nn.Linear):
            raise ConfigError(f"fedrod: model {type(model).__name__} has no features -> linear classifier split")
        own = self.own_head(client)
        weight = own[HEAD[0]].detach().clone().to(client.device).requires_grad_(True)
        bias = own[HEAD[1]].detach().clone().to(client.device).requires_grad_(True)
        counts = client.class_counts()
        cfg = self.local_config()
        compute = current_compute()
        opt = torch.optim.SGD(
            [*model.parameters(), weight, bias], lr=cfg.lr, momentum=cfg.momentum,
            weight_decay=cfg.weight_decay, **compute.sgd_options(),
        )
        precision = compute.precision()
        cl = is_channels_last(model)
        generator = client.generator("train")
        n = client.num_samples
        generic_losses: list[torch.Tensor] = []
        personal_losses: list[torch.Tensor] = []
        model.train()
        for _ in range(cfg.epochs):
            for idx in shuffled_batches(n, cfg.batch_size, generator, client.x.device):
                xb, yb = as_model_format(client.x[idx], cl), client.y[idx]
                with precision.autocast():
                    z = features(xb)
                    g = classifier(z)
                    generic = balanced_softmax_loss(g, yb, counts, self.params.absent_count)
                    personal = F.cross_entropy(g.detach() + F.linear(z.detach(), weight, bias), yb)
                    loss = generic + personal  # disjoint gradients: one SGD step for each part
                opt.zero_grad(set_to_none=True)
                precision.backward(loss)
                precision.step(opt)
                generic_losses.append(generic.detach())
                personal_losses.append(personal.detach())
        steps = len(generic_losses)
        client.state["personal_head"] = {HEAD[0]: weight.detach().clone(), HEAD[1]: bias.detach().clone()}
        return Message(
            arrays=state_to_arrays(model.state_dict()),
            metrics={"num_samples": float(n), "steps": float(steps),
                     "train_loss": host_sum(generic_losses) / max(steps, 1),
                     "personal_loss": host_sum(personal_losses) / max(steps, 1)},
        )
