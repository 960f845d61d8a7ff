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

from typing import TypeVar

import torch
from torch import nn

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.core.message import Message, state_to_arrays
from fedskew.models.registry import norm_layer_types

V = TypeVar("V")


def norm_keys(model: nn.Module) -> set[str]:
    """State-dict keys (parameters and buffers) of every normalisation module of ``model``."""
    keys: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, norm_layer_types):
            prefix = f"{name}." if name else ""
            keys.update(prefix + k for k in module.state_dict())
    return keys


def without(state: dict[str, V], keys: set[str]) -> dict[str, V]:
    """``state`` without ``keys``."""
    return {k: v for k, v in state.items() if k not in keys}


@register_algorithm("fedbn")
class FedBN(FedAvg):
    """FedAvg with client-local normalisation layers."""

    own_model = "the shared layers with the client's normalisation layers"

    _init_norm: dict[str, torch.Tensor] | None = None

    # ---- server ------------------------------------------------------------------------------
    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        state = without(server.model.state_dict(), norm_keys(server.model))
        msg = Message(arrays=state_to_arrays(state))
        return [(cid, msg) for cid in self.select(server)]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply is the model without its normalisation layers."""
        spec = super().reply_spec(task, server)
        return None if spec is None else without(spec, norm_keys(server.model))

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        mean, _ = self.average(server, replies, [m.arrays for _, m in replies])
        server.model.load_state_dict(mean, strict=False)  # the server's norm layers are left untouched

    # ---- client ------------------------------------------------------------------------------
    def initial_norm(self) -> dict[str, torch.Tensor]:
        """The normalisation layers of the seeded initial model (built once per process)."""
        if self._init_norm is None:
            model = self.init_model()
            keys = norm_keys(model)
            self._init_norm = {k: v for k, v in model.state_dict().items() if k in keys}
        return self._init_norm

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The global model's shared layers with this client's own normalisation layers (the paper's evaluation)."""
        return {**msg.arrays, **(client.state.get("norm") or self.initial_norm())}

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        own = client.state.get("norm") or self.initial_norm()
        _, reply = self.local_train(Message(arrays={**msg.arrays, **own}), client)
        keys = set(own)
        client.state["norm"] = {k: reply.arrays[k] for k in keys}
        reply.arrays = without(reply.arrays, keys)
        return reply
