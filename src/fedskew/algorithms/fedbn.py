"""FedBN (Li, Jiang, Zhang, Kamp & Dou, ICLR 2021, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization"), Algorithm 1.

FedAvg in which normalisation layers never leave the clients: the server neither sends nor receives their
parameters and buffers, and each client keeps its own in ``client.state`` and puts them on top of every
model it receives. Local normalisation absorbs each client's feature shift. Normalisation layers are
found by module type (:data:`fedskew.models.norm_layer_types`), not by name.

A client that has not trained before starts from the initial model's normalisation layers: the shared,
seeded initialisation (constant for BatchNorm/GroupNorm/LayerNorm), so nothing needs to be sent.

The engine's global accuracy is that of the server's model, whose normalisation layers stay at their
initial values (running mean 0, variance 1) because the server never receives any, so it understates
the method. FedBN is a personalised method: its paper evaluates each client's model, the shared layers
with the client's own normalisation layers, on the client's own test data. That is the run's
``personal_accuracy`` with ``partition.client_test_fraction > 0`` (:meth:`FedBN.personal_state`).
"""

from __future__ import annotations

from torch import nn

from fedskew.algorithms.base import register_algorithm
from fedskew.algorithms.local_layers import LocalLayers
from fedskew.models.registry import norm_layer_types


def norm_keys(model: nn.Module) -> set[str]:
    """State-dict keys (parameters and buffers) of every normalisation module of ``model``."""
    keys: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, norm_layer_types):
            prefix = f"{name}." if name else ""
            keys.update(prefix + k for k in module.state_dict())
    return keys


@register_algorithm("fedbn")
class FedBN(LocalLayers):
    """FedAvg with client-local normalisation layers (kept in ``client.state["norm"]``)."""

    paper = (
        'Li, Jiang, Zhang, Kamp & Dou, ICLR 2021, "FedBN: Federated Learning on Non-IID Features via Local '
        'Batch Normalization"'
    )

    own_model = "the shared layers with the client's normalisation layers"

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    slot = "norm"

    def local_keys(self, model: nn.Module) -> set[str]:
        return norm_keys(model)
