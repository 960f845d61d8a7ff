"""APFL (Deng, Kamani & Mahdavi 2020, arXiv:2003.13461, "Adaptive Personalized Federated Learning"), Alg. 1.

Each client keeps a local model v_i and a mixing weight alpha_i in ``client.state``; its personalised
model is the mixture v_bar_i = alpha_i v_i + (1 - alpha_i) w (Eq. 3). A selected client runs
``local_epochs`` of mini-batch steps from the received global model w^t; at each step, on one batch
(Alg. 1 lines 5-8, all gradients taken at the previous iterates):

- w <- w - eta grad f_i(w): FedAvg's local SGD (the configured ``lr``, ``momentum``, ``weight_decay``);
- v_i <- v_i - eta grad_v f_i(v_bar_i) = v_i - eta alpha_i grad f_i(v_bar_i);
- with ``adaptive``: alpha_i <- clip(alpha_i - eta_alpha <v_i - w, grad f_i(v_bar_i)>, 0, 1) (Eq. 10,
  the gradient of f_i(v_bar_i) in alpha_i), ``eta_alpha = alpha_lr`` (default: ``lr``, Alg. 1's single
  step size).

The client sends w (the wire is FedAvg's); the server averages (sample-weighted, ``[algorithm.aggregation]``
applies). The w steps are FedAvg's exactly, so the global model is FedAvg's whatever alpha is (tested
bit for bit with alpha = 0, where the personalised model is the global one). v_i starts as the seeded
initial model w^0 (Alg. 1's input). Normalisation buffers are mixed like parameters; v_i keeps those the
mixture's forward passes update.

Defaults (sources in docs/algorithms.md, "APFL"): ``alpha = 0.5`` (alpha_i's start), the default of the
authors' code (MLOPTPSU/FedTorch, ``fedtorch/parameters.py`` line 68) and its README's APFL command
(``-pa 0.5``); ``adaptive = true``, alpha_i learnt at every step as above (the authors' code learns it
only when asked, ``--fed_adaptive_alpha``, and then once a round, on the round's first batch, with an
extra 0.02 alpha_i in the gradient: ``apfl.py`` lines 119-120, ``flow_utils.py`` lines 240-250);
``alpha_lr`` = ``lr`` (that code steps alpha_i with the model's learning rate). The paper's own values
were not available here. The local SGD settings are FedAvg's. The authors' code mixes the two models'
outputs, alpha v_i(x) + (1 - alpha) w(x) (``fedtorch/comms/utils/eval.py`` lines 31-39); fedskew mixes the
parameters, as Eq. 3 defines v_bar_i (the same for a linear model).

Own model (:meth:`APFL.personal_state`): alpha_i v_i + (1 - alpha_i) w^t with the client's last v_i and
alpha_i and the current global model (v_i = w^0 and alpha_i = ``alpha`` before it first trains), the
personalised model the paper evaluates (not v_i alone, nor w; PFLlib#51).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.personal import gradients
from fedskew.core.device import current_compute
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.seeding import seeded_init
from fedskew.models.layout import as_model_format, is_channels_last, shuffled_batches, use_channels_last
from fedskew.privacy.uploads import WEIGHTS


def mixture(v: dict[str, torch.Tensor], w: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """alpha v + (1 - alpha) w for every floating-point entry (Eq. 3); integer buffers (batch counters) are w's."""
    return {k: alpha * v[k] + (1 - alpha) * w[k] if w[k].is_floating_point() else w[k].clone() for k in w}


@register_algorithm("apfl")
class APFL(FedAvg):
    """FedAvg for the global model; each client learns a local model and how much of it to mix in."""

    paper = 'Deng, Kamani & Mahdavi, arXiv:2003.13461 (2020), "Adaptive Personalized Federated Learning"'

    own_model = "the mixture of the client's local and the global model"

    class Params(FedAvg.Params):
        # alpha_i's initial value: the authors' default (MLOPTPSU/FedTorch fedtorch/parameters.py, line 68).
        alpha: float = 0.5
        # Learn alpha_i by its gradient (Eq. 10), the paper's adaptive APFL; false keeps it fixed.
        adaptive: bool = True
        # Step size of alpha_i; None: the model's lr, as the authors' code steps alpha_i (apfl.py, line 120).
        alpha_lr: float | None = None

        # unset: lr
        positive = ("alpha_lr",)
        unit = ("alpha",)

    params: Params
    upload = replace(WEIGHTS, dpsgd="its clients train with a loop of their own, not train_local, which DP-SGD runs in")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    _mix_models: dict[str, nn.Module] | None = None

    def own(self, client: ClientContext) -> tuple[dict[str, torch.Tensor], float]:
        """The client's v_i and alpha_i (w^0 and the configured ``alpha`` before it first trains)."""
        v = client.state.get("local") or {k: t.to(client.device) for k, t in self.initial_state().items()}
        alpha = client.state.get("alpha")
        return v, self.params.alpha if alpha is None else float(alpha)

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The personalised model alpha_i v_i + (1 - alpha_i) w^t."""
        v, alpha = self.own(client)
        return mixture(v, msg.arrays, alpha)

    def mix_model(self, client: ClientContext) -> nn.Module:
        """A second model instance for the mixture's forward passes (one per process and device)."""
        if self._mix_models is None:
            self._mix_models = {}
        key = str(client.device)
        if key not in self._mix_models:
            build = self.fed.model.build
            self._mix_models[key] = use_channels_last(seeded_init(build, self.fed.seed, "apfl-mix").to(client.device))
        model = self._mix_models[key]
        model.train()
        return model

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        p = self.params
        eta_alpha = p.lr if p.alpha_lr is None else p.alpha_lr
        v_start, alpha = self.own(client)
        v = {k: t.clone() for k, t in v_start.items()}
        w_model = client.model(msg.arrays)
        mix = self.mix_model(client)
        names = [name for name, _ in w_model.named_parameters()]
        opt = torch.optim.SGD(w_model.parameters(), lr=p.lr, momentum=p.momentum, weight_decay=p.weight_decay)
        precision = current_compute().precision()
        cl = is_channels_last(w_model)
        gen = client.generator("train")  # w's batches are FedAvg's, so w's trajectory is FedAvg's
        steps, loss_sum = 0, 0.0
        for _ in range(p.local_epochs):
            for idx in shuffled_batches(client.num_samples, p.batch_size, gen):
                idx = idx.to(client.x.device)
                xb, yb = as_model_format(client.x[idx], cl), client.y[idx]
                # v_i and alpha_i: gradients at the mixture of the current v_i and w (before w's step).
                w_now = {k: t.detach() for k, t in w_model.state_dict().items()}
                mix.load_state_dict(mixture(v, w_now, alpha))
                grads = gradients(mix, xb, yb)
                with torch.no_grad():
                    mixed = mix.state_dict()
                    for k in v:  # buffers the mixture's forward pass updated (running statistics)
                        if k not in names and v[k].is_floating_point():
                            v[k] = mixed[k].clone()
                    grad_alpha = sum(float(((v[n] - w_now[n]) * g).sum()) for n, g in zip(names, grads, strict=True))
                    for n, g in zip(names, grads, strict=True):
                        v[n] = v[n] - p.lr * alpha * g
                    if p.adaptive:
                        alpha = min(1.0, max(0.0, alpha - eta_alpha * grad_alpha))
                # w: FedAvg's step on the same batch.
                with precision.autocast():
                    loss = torch.nn.functional.cross_entropy(w_model(xb), yb)
                opt.zero_grad(set_to_none=True)
                precision.backward(loss)
                precision.step(opt)
                steps += 1
                loss_sum += float(loss.detach())
        client.state["local"] = v
        client.state["alpha"] = alpha
        return Message(
            arrays=state_to_arrays(w_model.state_dict()),
            metrics={"num_samples": float(client.num_samples), "steps": float(steps),
                     "train_loss": loss_sum / max(steps, 1), "alpha": alpha},
        )
