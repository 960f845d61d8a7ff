"""The server half shared by methods that send the whole global model and average the models that come back
without FedAvg's epoch-based local training (pFedMe, Per-FedAvg): their clients train in steps of their own.

:class:`ModelAveragingServer` samples ``clients_per_round`` clients, sends each the global model, expects the
same state dict back, and averages the replies by sample count through ``[algorithm.aggregation]`` (the
robust rules reject outlying updates, each named in the round's ``rejected``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from fedskew.algorithms.base import Algorithm, Replies, ServerContext
from fedskew.components.aggregate import robust_average
from fedskew.components.selection import uniform_sample
from fedskew.core.message import Message, state_to_arrays
from fedskew.privacy.uploads import WEIGHTS, Upload, Withheld


class ModelAveragingServer(Algorithm):
    """``configure``, ``reply_spec`` and the averaged model for a method whose ``Params`` have
    ``clients_per_round`` and ``aggregation``; a subclass's ``aggregate`` decides what to do with the mean."""

    upload: ClassVar[Upload | Withheld] = WEIGHTS

    @classmethod
    def secagg_refusal(cls, params: Any) -> str | None:
        """Also refused: an ``[algorithm.aggregation]`` that needs each client's update."""
        refusal = super().secagg_refusal(params)
        return params.aggregation.sum_only_refusal() if refusal is None else refusal

    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        msg = Message(arrays=state_to_arrays(server.model.state_dict()))
        clients = uniform_sample(self.fed.num_clients, self.params.clients_per_round, server.rng("select"))
        return [(cid, msg) for cid in clients]

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A ``train`` reply is a full model state dict of the global model's shapes and dtypes."""
        if task != "train":
            return None
        return {k: (tuple(v.shape), v.dtype) for k, v in server.model.state_dict().items()}

    def averaged(self, server: ServerContext, replies: Replies) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(the replies' sample-weighted mean, the global model before it), or None without replies."""
        if not replies:
            return None
        states = [m.arrays for _, m in replies]
        old = server.model.state_dict()
        mean, rejected = robust_average(states, [m.metrics["num_samples"] for _, m in replies],
                                        {k: old[k] for k in states[0]}, self.params.aggregation)
        for i, reason in rejected:
            server.reject(replies[i][0], reason)
        return mean, old
