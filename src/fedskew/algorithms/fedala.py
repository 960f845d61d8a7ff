"""FedALA (Zhang, Hua, Wang, Song, Xue, Ma & Guan, AAAI 2023, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning"), Alg. 1.

FedAvg in which a client does not overwrite its local model theta_i with the received global model theta:
it starts its local training from the adaptive local aggregation (ALA, Eq. 5)

    theta_hat_i = theta_i + (theta - theta_i) * W_i,

with element-wise weights W_i in [0, 1] on the parameters of the top p = ``layers`` layers, and the
global model's values everywhere below (W = 1 there). W_i is learnt on a random ``rand_percent`` % of
the client's training data (Eq. 6): after each batch, W_i <- clip(W_i - eta grad_theta_hat L * (theta -
theta_i), 0, 1), with theta_hat_i recomputed from the new W_i. W_i starts at 1 and is kept in
``client.state``; the client's first ALA trains it until the standard deviation of the losses of the last
``num_pre_loss`` passes over the sample (each pass's last batch loss, as the authors' ``ALA.py`` records
them) falls below ``threshold`` (capped at ``max_init_epochs`` passes), later ones for one pass (the start
phase). A client without a local model yet (its first round) starts from theta, as the authors' code skips
ALA while theta_i equals theta. Then it runs FedAvg's local training, keeps the result as theta_i and sends
it; the server averages (FedAvg's, ``[algorithm.aggregation]`` applies). With ``layers = 0`` ALA is off and
the method is FedAvg, the local model overwritten (tested).

"Layers" are the modules that hold parameters of their own (a convolution, a normalisation layer, a
linear layer), counted from the output (:func:`~fedskew.components.personal.parameter_layers`); ALA acts
on parameters, and buffers are the global model's (the authors' code leaves the local buffers instead).

Defaults (sources in docs/algorithms.md, "FedALA"): ``eta = 1.0`` (the authors' ``system/main.py`` and
``run_me.sh``); ``rand_percent = 80`` and ``layers = 1`` (s = 80 and p = 1, the settings the authors'
poster ``FedALAPoster.pdf`` states for applying ALA; the authors' ``layer_idx = 2`` counts parameter
tensors, the last layer's weight and bias, which is p = 1 layer here); ``threshold = 0.01`` (the authors'
README: "we set it to 0.01 in our paper by default"; their ``ALA.py`` defaults to 0.1);
``num_pre_loss = 10`` (the authors' ``ALA.py``; the paper's value was not available here);
``max_init_epochs = 100`` is fedskew's bound on that loop (the code has none). The local SGD settings
are FedAvg's.

Own model (:meth:`FedALA.personal_state`): theta_i, the client's model after its last local training (the
personalised models Alg. 1 outputs); the global model before the client first trains.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.personal import batch_loss, parameter_layers, trainable
from fedskew.core.message import Message
from fedskew.core.params import maximums, minimums
from fedskew.privacy.uploads import WEIGHTS


@register_algorithm("fedala")
class FedALA(FedAvg):
    """FedAvg whose clients start from an adaptive, element-wise mix of their local and the global model."""

    paper = (
        'Zhang, Hua, Wang, Song, Xue, Ma & Guan, AAAI 2023, "FedALA: Adaptive Local Aggregation for '
        'Personalized Federated Learning"'
    )

    own_model = "the client's model after its last local training"

    class Params(FedAvg.Params):
        eta: float = 1.0  # the weights' learning rate (authors' system/main.py, line 97)
        rand_percent: int = 80  # s, the share of local data W_i is learnt on, in percent (authors' poster)
        layers: int = 1  # p, the top layers ALA acts on; 0: FedAvg (authors' poster: p = 1)
        threshold: float = 0.01  # start phase: stop when the loss std is below this (authors' README, line 103)
        num_pre_loss: int = 10  # ... over the losses of this many last passes (authors' ALA.py, line 20)
        max_init_epochs: int = 100  # fedskew's bound on the start phase (the code has none)

        at_least = minimums(layers=0, threshold=0, num_pre_loss=1, max_init_epochs=1, rand_percent=1)
        at_most = maximums(rand_percent=100)
        positive = ("eta",)

    params: Params
    upload = replace(WEIGHTS, dpsgd="its adaptive local aggregation learns from the client's data outside DP-SGD")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def top_keys(self, model: torch.nn.Module) -> list[str]:
        """The parameter names of the model's top ``layers`` layers (ALA's domain)."""
        layers = parameter_layers(model)
        return [k for layer in layers[len(layers) - min(self.params.layers, len(layers)):] for k in layer]

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """theta_i, the client's model after its last local training (the global model before it first trains)."""
        return dict(client.state.get("model") or msg.arrays)

    def ala(
        self, client: ClientContext, local: dict[str, torch.Tensor], glob: dict[str, torch.Tensor],
        weights: dict[str, torch.Tensor], start_phase: bool,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Adaptive local aggregation (Eqs. 5-6): the model to train from, and the learnt weights W_i."""
        p = self.params
        diff = {k: glob[k] - local[k] for k in weights}
        weights = {k: w.clone() for k, w in weights.items()}
        model = client.model({**glob, **{k: local[k] + diff[k] * weights[k] for k in weights}})
        named = dict(model.named_parameters())
        top = list(weights)
        n = client.num_samples
        sample = torch.randperm(n, generator=client.generator("ala"))[: int(p.rand_percent * n / 100)]
        losses: list[float] = []
        last = 0.0
        with trainable(model, set(top)):
            for _ in range(p.max_init_epochs if start_phase else 1):
                for idx in sample.split(p.batch_size):
                    idx = idx.to(client.x.device)
                    loss = batch_loss(model, client.x[idx], client.y[idx])
                    grads = torch.autograd.grad(loss, [named[k] for k in top])
                    with torch.no_grad():
                        for k, g in zip(top, grads, strict=True):
                            weights[k] = torch.clamp(weights[k] - p.eta * g * diff[k], 0, 1)
                            named[k].copy_(local[k] + diff[k] * weights[k])
                    last = float(loss.detach())
                # One loss per pass over the sample, its last batch's (the authors' ALA.py, line 142): the
                # start phase's test is on the last num_pre_loss passes, not batches.
                losses.append(last)
                recent = losses[-p.num_pre_loss:]
                if len(losses) > p.num_pre_loss and statistics.pstdev(recent) < p.threshold:
                    break
        start = {**glob, **{k: named[k].detach().clone() for k in top}}  # buffers stay the global model's
        return start, weights

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        start = msg.arrays
        local = client.state.get("model")
        if local is not None and self.params.layers > 0 and client.num_samples > 0:
            saved = client.state.get("weights")
            top = self.top_keys(client.model())
            weights = saved if saved is not None else {k: torch.ones_like(local[k]) for k in top}
            start, client.state["weights"] = self.ala(client, local, msg.arrays, weights, saved is None)
        _, reply = self.local_train(Message(arrays=start), client)
        client.state["model"] = reply.arrays  # a copy owned by the reply (state_to_arrays)
        return reply
