"""MOON (Li, He & Song, CVPR 2021, "Model-Contrastive Federated Learning").

Each client minimises CE + mu * l_con (Eq. 4), where l_con (Eq. 3) pulls the local embedding z of a batch
towards the received global model's embedding z_glob and away from the client's previous local model's
z_prev, with cosine similarity and temperature T. The previous local model is kept in ``client.state``
(a state dict); the server half is FedAvg's and the wire cost is FedAvg's.

Differences from the paper, by design:

- MOON adds a 2-layer projection head after the encoder and contrasts its outputs; fedskew contrasts the
  model's own embedding ``features(x)`` (the classifier's input), so every registered model works
  unchanged and the model sent on the wire is the one evaluated.
- A client that has not trained before has no previous model; as in the authors' code (where clients
  not yet selected still hold the initial weights), it contrasts against the initial model, the seeded
  initialisation both sides know. In round 1 that equals the global model, so the term is the constant
  log 2 with no gradient.
"""

from __future__ import annotations

import copy
from typing import cast

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.terms import FeatureTap, contrastive_term
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.models.registry import FedModel


def _frozen(model: FedModel) -> FedModel:
    """A copy of ``model`` in eval mode with gradients off (a fixed reference for the contrast)."""
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return ref


@register_algorithm("moon")
class Moon(FedAvg):
    """FedAvg plus the model-contrastive term."""

    paper = 'Li, He & Song, CVPR 2021, "Model-Contrastive Federated Learning"'

    class Params(FedAvg.Params):
        # mu: the paper uses 5 on CIFAR-10 and 1 on CIFAR-100 / Tiny-ImageNet (Sec. 4.1); the authors'
        # code defaults to 1, which is kept here as the dataset-agnostic default.
        mu: float = 1.0
        temperature: float = 0.5  # tau = 0.5 in all the paper's experiments (Sec. 4.1)

        at_least = minimums(mu=0)
        positive = ("temperature",)

    params: Params

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        model = cast(FedModel, client.model(msg.arrays))
        if self.params.mu == 0:
            _, reply = self.local_train(msg, client)
        else:
            global_model = _frozen(model)
            prev_model = _frozen(model)
            prev_model.load_state_dict(client.state.get("prev_model") or self.initial_state())
            with FeatureTap(model) as tap:
                term = contrastive_term(tap, global_model, prev_model, self.params.mu, self.params.temperature)
                _, reply = self.local_train(msg, client, terms=[term])
        client.state["prev_model"] = state_to_arrays(model.state_dict())
        return reply
