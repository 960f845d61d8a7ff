"""FedPer (Arivazhagan, Aggarwal, Singh & Choudhary 2019, arXiv:1912.00818, "Federated Learning with
Personalization Layers"), Sec. 3 and Alg. 1-2.

The model is split into base layers, learnt by FedAvg, and personalisation layers that never leave the
clients. Here the personalisation layers are the model's head as the model declares it
(``FedModel.head_modules``, default the last linear layer; :func:`~fedskew.components.personal.head_keys`)
and the base is the rest, so every model, plug-ins included, works. Each selected client loads the
received base under its own head, runs ``local_epochs`` of SGD on all its layers together (Alg. 2: base
and personalisation layers are trained jointly), keeps the head in ``client.state`` and sends the base
back; the server averages the bases (FedAvg's weighted mean, ``[algorithm.aggregation]`` applies). The
head is neither sent nor received (tested). A client that has not trained yet holds the seeded initial
head, which both sides can build, so nothing needs sending.

Own model (:meth:`FedPer.personal_state`, the run's ``personal_accuracy``): the current global base with
the client's own head, as the paper evaluates each client. The global accuracy is the server's base with
the initial head, which the server never trains; it means little for this method.
"""

from __future__ import annotations

import torch
from torch import nn

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.local_layers import LocalLayers
from fedskew.components.personal import head_keys


@register_algorithm("fedper")
class FedPer(LocalLayers):
    """FedAvg on the body; each client keeps its own head (``client.state["head"]``). No parameters beyond
    FedAvg's."""

    paper = (
        'Arivazhagan, Aggarwal, Singh & Choudhary, arXiv:1912.00818 (2019), "Federated Learning with '
        'Personalization Layers"'
    )

    own_model = "the global body with the client's head"

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read
    slot = "head"

    def local_keys(self, model: nn.Module) -> set[str]:
        return head_keys(model)

    def initial_head(self) -> dict[str, torch.Tensor]:
        """The head of the seeded initial model (built once per process), every client's first head."""
        return self.initial_local()

    def own_head(self, client: ClientContext) -> dict[str, torch.Tensor]:
        """The client's head: its own once it has trained, else the initial one."""
        return self.own_local(client)
