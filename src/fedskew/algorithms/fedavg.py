"""FedAvg (McMahan et al., AISTATS 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data"): sampled clients run local SGD from the global model; the server averages the
returned models weighted by the clients' sample counts |D_k| (FedDC paper, Eq. 2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedskew.algorithms.base import Algorithm, ClientContext, Replies, ServerContext, register_algorithm
from fedskew.components.aggregate import weighted_mean
from fedskew.components.selection import uniform_sample
from fedskew.components.trainer import GradHook, LocalConfig, LocalResult, LossTerm, SGDParams, train_local
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import check


@register_algorithm("fedavg")
class FedAvg(Algorithm):
    """Federated averaging; the base that most methods extend."""

    @dataclass
    class Params(SGDParams, Algorithm.Params):
        # batch_size, lr, momentum, weight_decay: the clients' local SGD (SGDParams)
        local_epochs: int = 1  # E, local epochs per round

        def __post_init__(self) -> None:
            super().__post_init__()
            check(self.local_epochs >= 1, "local_epochs", self.local_epochs, "at least 1")

    params: Params

    # ---- server ------------------------------------------------------------------------------
    def select(self, server: ServerContext) -> list[int]:
        """Clients for this round: ``clients_per_round`` drawn uniformly."""
        return uniform_sample(self.fed.num_clients, self.params.clients_per_round, server.rng("select"))

    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        msg = Message(arrays=state_to_arrays(server.model.state_dict()))
        return [(cid, msg) for cid in self.select(server)]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply is a full model state dict of the global model's shapes and dtypes."""
        if task != "train":
            return None
        return {k: (tuple(v.shape), v.dtype) for k, v in server.model.state_dict().items()}

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:  # every client failed or was rejected: keep the global model
            return
        states = [m.arrays for _, m in replies]
        weights = [m.metrics["num_samples"] for _, m in replies]
        server.model.load_state_dict(weighted_mean(states, weights))

    # ---- client ------------------------------------------------------------------------------
    def local_config(self) -> LocalConfig:
        p = self.params
        return p.sgd(p.local_epochs)

    def local_train(
        self,
        msg: Message,
        client: ClientContext,
        terms: list[LossTerm] | None = None,
        grad_hooks: list[GradHook] | None = None,
    ) -> tuple[LocalResult, Message]:
        """Load the global model, train locally, and build the standard reply (weights + counts)."""
        model = client.model(msg.arrays)
        res = train_local(
            model, client.x, client.y, self.local_config(), client.generator("train"),
            terms or [], grad_hooks or [],
        )
        reply = Message(
            arrays=state_to_arrays(model.state_dict()),
            metrics={"num_samples": float(res.num_samples), "steps": float(res.steps), "train_loss": res.mean_loss},
        )
        return res, reply

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        return self.local_train(msg, client)[1]
