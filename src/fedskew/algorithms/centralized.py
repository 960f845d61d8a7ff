"""Centralised training: the upper bound the papers compare against.

Every client uploads its raw data once (counted in the ledger: this is what centralisation costs in
bytes and in privacy); each round the server then trains the global model on the pooled data for
``epochs_per_round`` epochs.
"""

from __future__ import annotations

import torch

from fedskew.algorithms.base import Algorithm, ClientContext, ServerContext, register_algorithm
from fedskew.components.trainer import SGDParams, train_local
from fedskew.core.message import Message
from fedskew.core.params import minimums
from fedskew.privacy.uploads import Withheld


@register_algorithm("centralized")
class Centralized(Algorithm):
    """Pooled-data training, one "round" = ``epochs_per_round`` epochs."""

    paper = "none: every client's data pooled and trained centrally, the upper bound the papers compare against"

    class Params(SGDParams, Algorithm.Params):
        epochs_per_round: int = 1  # and SGD's batch_size, lr, momentum, weight_decay (SGDParams)

        at_least = minimums(epochs_per_round=1)

    params: Params
    upload = Withheld("its raw training data", use="a federated method (algorithm.name=fedavg on the command line "
                      "runs one; in a file, set privacy.mode in the private variants only)")

    not_sum_only = (
        "pools the clients' training data on the server: there is no upload to aggregate"
    )

    def setup(self, server: ServerContext) -> None:
        self._pool(server, counted=True)

    def restore(self, server: ServerContext) -> None:
        # The pooled data is not checkpointed (it can be large); fetch it again, off the ledger,
        # since the run already paid for it once.
        self._pool(server, counted=False)

    def _pool(self, server: ServerContext, counted: bool) -> None:
        msgs = [(cid, Message()) for cid in range(self.fed.num_clients)]
        if counted:
            replies = server.exchange("upload_data", msgs)
        else:
            replies = server.exchange("upload_data", msgs, down=None, up=None)
        server.state["_x"] = torch.cat([m.arrays["x"] for _, m in replies])
        server.state["_y"] = torch.cat([m.arrays["y"] for _, m in replies])

    def round(self, server: ServerContext) -> None:
        p = self.params
        res = train_local(
            server.model, server.state["_x"], server.state["_y"],
            p.sgd(p.epochs_per_round),
            server.generator("train"),
        )
        server.metrics.update(samples=res.num_samples, train_loss=res.mean_loss)

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "upload_data":
            return super().client_step(task, msg, client)
        return Message(arrays={"x": client.x.clone(), "y": client.y.clone()})
