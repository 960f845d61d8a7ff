"""Local training only: every client trains a model of its own on its own data and never communicates.

The personalisation baseline of FL-bench, PFLlib and the personalised-FL papers (Ditto, FedRep, pFedMe
report it as "Local"): what a client gets without federation. Each round the clients of FedAvg's
selection (``clients_per_round`` drawn uniformly, so a client trains as often as it would in FedAvg)
run ``local_epochs`` of SGD on the model they keep, which starts from the seeded initial model. Nothing
goes on the wire (the ledger stays at zero) and there is no global model: the method is measured by
the per-client evaluation only, so a run needs ``partition.client_test_fraction > 0`` (its
``personal_accuracy`` is each client's own model on its own test split).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from fedskew.algorithms.base import ClientContext, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.core.message import Message
from fedskew.privacy.uploads import Withheld


@register_algorithm("local")
class Local(FedAvg):
    """Each client trains alone; no communication, no global model."""

    paper = (
        'none: each client trains a model of its own and never communicates, the lower bound of '
        'personalisation'
    )

    own_model = "the client's model"

    has_global_model: ClassVar[bool] = False

    class Params(FedAvg.Params):
        averages_models: ClassVar[bool] = False  # nothing is averaged: [algorithm.aggregation] does not apply

    params: Params
    upload = Withheld("nothing (its clients train alone)", use='privacy.mode = "off"')

    not_sum_only = (
        "trains no global model: its clients upload nothing to aggregate"
    )

    # ---- server ------------------------------------------------------------------------------
    def round(self, server: ServerContext) -> None:
        """The round's clients train their own models; nothing is sent or received but the sample counts."""
        server.exchange("train", [(cid, Message()) for cid in self.select(server)], down=None, up=None)

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply carries no arrays."""
        return {} if task == "train" else None

    # ---- client ------------------------------------------------------------------------------
    def personal_state(self, msg: Message, client: ClientContext) -> dict[str, torch.Tensor]:
        """The client's own model (the initial model before it first trains)."""
        return dict(client.state.get("model") or self.initial_state())

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        _, reply = self.local_train(Message(arrays=self.personal_state(msg, client)), client)
        client.state["model"] = reply.arrays  # a copy owned by the reply (state_to_arrays)
        return Message(metrics=reply.metrics)
