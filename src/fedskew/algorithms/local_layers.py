"""The server half and the bookkeeping that FedBN and FedPer share: FedAvg in which some layers never
leave the clients.

Which layers stay is the subclass's one decision (:meth:`LocalLayers.local_keys`: the normalisation
layers for FedBN, the model's head for FedPer and the methods built on it). The server sends the model
without them, checks and averages replies without them, and leaves its own copy of them untouched. A
client puts its own copy (``client.state[slot]``; before it first trains, the seeded initial model's,
which both sides can build, so nothing is sent) on top of every model it receives, trains, keeps the new
copy and sends the rest back.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from fedskew.algorithms.base import ClientContext, Replies, ServerContext
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.personal import only, without
from fedskew.core.message import Message, state_to_arrays


class LocalLayers(FedAvg):
    """FedAvg on every layer but :meth:`local_keys`, which each client keeps in ``client.state[slot]``."""

    slot: ClassVar[str]
    """The key of ``client.state`` that holds a client's own layers (kept in checkpoints under it)."""

    _initial: dict[str, torch.Tensor] | None = None

    def local_keys(self, model: nn.Module) -> set[str]:
        """State-dict keys of ``model`` that stay on the clients."""
        raise NotImplementedError

    # ---- server ------------------------------------------------------------------------------
    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        shared = without(server.model.state_dict(), self.local_keys(server.model))
        msg = Message(arrays=state_to_arrays(shared))
        return [(cid, msg) for cid in self.select(server)]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply is the model without the layers the clients keep."""
        spec = super().reply_spec(task, server)
        return None if spec is None else without(spec, self.local_keys(server.model))

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        mean, _ = self.average(server, replies, [m.arrays for _, m in replies])
        server.model.load_state_dict(mean, strict=False)  # the server's copy of the kept layers is left as it is

    # ---- client ------------------------------------------------------------------------------
    def initial_local(self) -> dict[str, torch.Tensor]:
        """The kept layers of the seeded initial model (built once per process), every client's first copy."""
        if self._initial is None:
            model = self.init_model()
            self._initial = state_to_arrays(only(model.state_dict(), self.local_keys(model)))
        return self._initial

    def own_local(self, client: ClientContext) -> dict[str, torch.Tensor]:
        """The client's kept layers: its own once it has trained, else the initial ones."""
        own: dict[str, torch.Tensor] | None = client.state.get(self.slot)
        return own if own is not None else self.initial_local()

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The global model's shared layers with this client's own kept layers (as the papers evaluate)."""
        return {**msg.arrays, **self.own_local(client)}

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        own = self.own_local(client)
        _, reply = self.local_train(Message(arrays={**msg.arrays, **own}), client)
        keys = set(own)
        client.state[self.slot] = only(reply.arrays, keys)
        reply.arrays = without(reply.arrays, keys)
        return reply
