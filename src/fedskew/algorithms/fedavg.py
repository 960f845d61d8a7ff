"""FedAvg (McMahan et al., AISTATS 2017, "Communication-Efficient Learning of Deep Networks from
Decentralized Data"): sampled clients run local SGD from the global model; the server averages the
returned models weighted by the clients' sample counts |D_k| (FedDC paper, Eq. 2)."""

from __future__ import annotations

from dataclasses import field
from typing import Any, ClassVar

import torch

from fedskew.algorithms.base import Algorithm, ClientContext, Replies, ServerContext, SumOnly, register_algorithm
from fedskew.components.aggregate import Aggregation, robust_average
from fedskew.components.selection import uniform_sample
from fedskew.components.trainer import (
    GradHook,
    LocalConfig,
    LocalResult,
    LogitAdjust,
    LossTerm,
    SGDParams,
    train_local,
)
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.privacy.uploads import WEIGHTS, Upload, Withheld


@register_algorithm("fedavg")
class FedAvg(Algorithm):
    """Federated averaging; the base that most methods extend."""

    paper = (
        'McMahan, Moore, Ramage, Hampson & Agüera y Arcas, AISTATS 2017, "Communication-Efficient Learning of '
        'Deep Networks from Decentralized Data"'
    )

    class Params(SGDParams, Algorithm.Params):
        # batch_size, lr, momentum, weight_decay: the clients' local SGD (SGDParams)
        local_epochs: int = 1  # E, local epochs per round
        # How the clients' models are combined: FedAvg's weighted mean (default), a robust rule, norm
        # clipping, and the bound on outlying updates ([algorithm.aggregation]).
        aggregation: Aggregation = field(default_factory=Aggregation)

        averages_models: ClassVar[bool] = True
        """False for methods that combine something else (control variates, normalised steps):
        ``[algorithm.aggregation]`` does not apply to them and is refused."""

        at_least = minimums(local_epochs=1)

        def __post_init__(self) -> None:
            super().__post_init__()
            if not self.averages_models and self.aggregation != Aggregation():
                raise ConfigError("aggregation does not apply to this method (it does not average client models); "
                                  "remove the [algorithm.aggregation] settings")

    params: Params
    upload: ClassVar[Upload | Withheld] = WEIGHTS  # the clients' models: [privacy] clips and noises each one's change

    sum_only_uploads: ClassVar[SumOnly] = "num_samples"  # the train replies' num_samples-weighted mean is all it reads

    @classmethod
    def secagg_refusal(cls, params: Any) -> str | None:
        """Also refused: an ``[algorithm.aggregation]`` that needs each client's update (a robust rule, clipping,
        the outlier bound)."""
        refusal = super().secagg_refusal(params)
        return params.aggregation.sum_only_refusal() if refusal is None and params.averages_models else refusal

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
        state, _ = self.average(server, replies, [m.arrays for _, m in replies])
        server.model.load_state_dict(state)

    def average(
        self, server: ServerContext, replies: Replies, states: list[dict[str, torch.Tensor]]
    ) -> tuple[dict[str, torch.Tensor], Replies]:
        """Combine the clients' model ``states`` (one per reply) by ``[algorithm.aggregation]``.

        Returns the combined state (the keys of ``states``) and the replies kept; a reply whose update
        is an outlier is rejected through ``server.reject`` (it shows in the round's ``rejected``).
        """
        reference = server.model.state_dict()
        reference = {k: reference[k] for k in states[0]}
        weights = [m.metrics["num_samples"] for _, m in replies]
        state, rejected = robust_average(states, weights, reference, self.params.aggregation)
        dropped = {i for i, _ in rejected}
        for i, reason in rejected:
            server.reject(replies[i][0], reason)
        return state, [r for i, r in enumerate(replies) if i not in dropped]

    # ---- client ------------------------------------------------------------------------------
    def local_config(self) -> LocalConfig:
        p = self.params
        return p.sgd(p.local_epochs)

    def logit_adjust(self, client: ClientContext) -> LogitAdjust | None:
        """How this client's logits change before the cross-entropy (None: they do not; FedAvg's loss)."""
        return None

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
            terms or [], grad_hooks or [], self.logit_adjust(client), **client.dpsgd(),
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
