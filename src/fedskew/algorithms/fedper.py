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

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.personal import head_keys, only, without
from fedskew.core.message import Message, state_to_arrays


@register_algorithm("fedper")
class FedPer(FedAvg):
    """FedAvg on the body; each client keeps its own head. No parameters beyond FedAvg's."""

    own_model = "the global body with the client's head"

    _init_head: dict[str, torch.Tensor] | None = None

    # ---- server ------------------------------------------------------------------------------
    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        body = without(server.model.state_dict(), head_keys(server.model))
        msg = Message(arrays=state_to_arrays(body))
        return [(cid, msg) for cid in self.select(server)]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply is the body: the model without its head."""
        spec = super().reply_spec(task, server)
        return None if spec is None else without(spec, head_keys(server.model))

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:
            return
        mean, _ = self.average(server, replies, [m.arrays for _, m in replies])
        server.model.load_state_dict(mean, strict=False)  # the server's head is left as it is

    # ---- client ------------------------------------------------------------------------------
    def initial_head(self) -> dict[str, torch.Tensor]:
        """The head of the seeded initial model (built once per process), every client's first head."""
        if self._init_head is None:
            model = self.init_model()
            self._init_head = state_to_arrays(only(model.state_dict(), head_keys(model)))
        return self._init_head

    def own_head(self, client: ClientContext) -> dict[str, torch.Tensor]:
        """The client's head: its own once it has trained, else the initial one."""
        head: dict[str, torch.Tensor] | None = client.state.get("head")
        return head if head is not None else self.initial_head()

    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The global body with this client's own head (the initial head before it first trains)."""
        return {**msg.arrays, **self.own_head(client)}

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        head = self.own_head(client)
        _, reply = self.local_train(Message(arrays={**msg.arrays, **head}), client)
        keys = set(head)
        client.state["head"] = only(reply.arrays, keys)
        reply.arrays = without(reply.arrays, keys)
        return reply
