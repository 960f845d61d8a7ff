"""FedSeq: sequential training inside client clusters (Zaccone et al., ICPR 2022, "Speeding up
Heterogeneous Federated Learning with Sequentially Trained Superclients"; the hybrid-FL variant of
Chen et al. 2023 is HFLDD's baseline [32]).

Clients are grouped into clusters ("superclients"); in every round each cluster trains the global model
sequentially along a ring: the first client trains E local epochs from the global model and hands its
model to the second, which continues from it, and so on; the last client's model is the cluster's. The
server averages the cluster models weighted by the data the clusters trained on (FedAvg over
superclients). A cluster thus sees the union of its members' classes, which softens label skew.

As HFLDD runs it (Sec. V-A4): 10 clusters of 10 clients, formed at random once in :meth:`FedSeq.setup`
(Zaccone et al. also group by estimated label distributions; random grouping is the default both papers
compare against), every cluster trains every round, with the same local epochs as the other methods.
The ring order is the (random) order of a cluster's members, fixed for the run.

Traffic, as the engine counts it: one exchange per ring position. The first position receives the
global model from the server (server-to-client); later positions receive the previous client's model
(client-to-client: a direct handoff in FedSeq's topology, relayed by the engine); only the last client's
model goes to the server (client-to-server); intermediate replies are the handoff just counted. Per
round: M |w| down, M (n - 1) |w| client-to-client, M |w| up, as
:func:`fedskew.components.clustering.fedseq_cost_bits` computes. ``clients_per_round`` is unused.
"""

from __future__ import annotations

from typing import ClassVar

from fedskew.algorithms.base import Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.aggregate import weighted_mean
from fedskew.components.clustering import random_clusters
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.privacy.uploads import Withheld


@register_algorithm("fedseq")
class FedSeq(FedAvg):
    """Ring-sequential training in random clusters, FedAvg across clusters."""

    paper = (
        'Zaccone et al., ICPR 2022, "Speeding up Heterogeneous Federated Learning with Sequentially Trained '
        'Superclients"'
    )

    class Params(FedAvg.Params):
        averages_models: ClassVar[bool] = False  # [algorithm.aggregation] does not apply
        num_clusters: int = 10  # M (HFLDD Sec. V-A4: 10 clusters of 10 clients)

        at_least = minimums(num_clusters=1)

    params: Params
    upload = Withheld("models that pass from client to client (each trains on its predecessor's, which no server-side "
                      "mean protects)")

    not_sum_only = (
        "hands each client's model on to the next client through the server (sequential training), so the server "
        "holds every model; SecAgg+ reveals only the sum of the uploads"
    )

    def setup(self, server: ServerContext) -> None:
        """Random clusters of near-equal size, kept for the run (checkpointed in the server state)."""
        server.state["clusters"] = random_clusters(self.fed.num_clients, self.params.num_clusters,
                                                   server.rng("clusters"))

    def round(self, server: ServerContext) -> None:
        """Walk every ring in parallel, one exchange per position, then average the cluster models."""
        clusters: list[list[int]] = server.state["clusters"]
        start = state_to_arrays(server.model.state_dict())
        models = [start] * len(clusters)
        trained = [0.0] * len(clusters)
        for pos in range(max(len(c) for c in clusters)):
            down = "server_to_client" if pos == 0 else "client_to_client"
            handoff: list[tuple[int, Message]] = []
            final: list[tuple[int, Message]] = []
            where: dict[int, int] = {}
            for k, members in enumerate(clusters):
                if pos < len(members):
                    cid = members[pos]
                    where[cid] = k
                    (final if pos == len(members) - 1 else handoff).append((cid, Message(arrays=models[k])))
            replies: Replies = []
            if handoff:
                replies += server.exchange("train", handoff, down=down, up=None)
            if final:
                replies += server.exchange("train", final, down=down, up="client_to_server")
            for cid, reply in replies:
                models[where[cid]] = reply.arrays
                trained[where[cid]] += reply.metrics["num_samples"]
        done = [(m, w) for m, w in zip(models, trained, strict=True) if w > 0]
        if done:  # otherwise every client failed: keep the global model
            server.model.load_state_dict(weighted_mean([m for m, _ in done], [w for _, w in done]))
        server.metrics.update(num_clusters=len(clusters), clusters_trained=len(done))
