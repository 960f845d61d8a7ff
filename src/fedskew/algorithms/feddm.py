"""FedDM (Xiong, Wang, Cheng, Yu & Hsieh, CVPR 2023, "FedDM: Iterative Distribution Matching for
Communication-Efficient Federated Learning"), in the form FedAF (Wang et al., CVPR 2024) compares
against, and the aggregation-free base class that FedAF shares.

Aggregation-free: no model averaging. Each round the selected clients condense their data by
distribution matching (FedAF Eq. 4) with networks drawn around the received global model, upload
the condensed sets as 8-bit images, and the server trains the global model on the union of the
clients' sets with cross-entropy.

FedDM specifics (SPEC section 4, FedAF Secs. 5.1-5.2 and App. A): the matching network is drawn
uniformly from the L2 ball of radius rho = 5 around the global model, the image gradient is clipped
to norm 2.0, image lr 1.0, SGD momentum 0.9, and the sets start, as FedAF's, from averages of random
real images (FedAF Sec. 5.1 uses one initialisation for both). Each round a client condenses afresh
from a new draw: FedDM's clients build a new synthetic set around every new global model, unlike
FedAF's clients, which keep refining one set across rounds. With few matching steps a set started
from single real images stays close to them (``init = "real"``, FedDM's own paper's start): the
uploads are then nearly the clients' raw images, a new sample every round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from fedskew.algorithms.base import Algorithm, ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.feddc import MODEL, SYN_IMAGES, SYN_LABELS, SYN_STATE, synthetic_arrays, synthetic_reply_spec
from fedskew.components.selection import uniform_sample
from fedskew.components.server_train import (
    decode_set,
    pool_from_state,
    pool_to_state,
    train_on_synthetic,
    update_pool,
    uploads_artifact,
)
from fedskew.components.trainer import LocalConfig, LossTerm
from fedskew.condense import DMConfig, SyntheticSet, distribution_matching, perturbed_model_sampler
from fedskew.core.message import Message, arrays_with_prefix, state_to_arrays
from fedskew.core.params import check
from fedskew.core.seeding import seeded_init

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


class AggregationFree(Algorithm):
    """Clients condense, the server trains the global model on the union of their latest sets.

    Not registered: the common part of :class:`FedDM` and FedAF. Subclasses say how a client
    condenses (:meth:`condense`) and may add arrays to the download (:meth:`download`) and loss
    terms to the server's training (:meth:`server_terms`).

    The union holds each client's latest set (a client's upload replaces its previous one). With
    FedAF's setup, all clients in every round, that is exactly this round's sets; with partial
    participation the absent clients' last sets stay in, since Eq. 14's S is the union over all
    clients.
    """

    @dataclass
    class Params(Algorithm.Params):
        # Condensation (FedAF Sec. 5.1 and App. A; FedDM is run with the same settings there).
        ipc: int = 50  # images per class held; FedAF's label-skew setting (Table 7)
        condense_iterations: int = 1000  # local condensation steps, one network draw each
        image_lr: float = 1.0  # CIFAR-10 and DomainNet; FedAF uses 0.2 on FMNIST, 0.1 on CIFAR-100
        image_momentum: float = 0.9  # App. A: SGD with momentum 0.9, also for condensation
        real_batch: int = 256  # real images per class per step (all of them if fewer)
        # The server's training of the global model on the union S (FedAF Sec. 5.1): the only model
        # training in these methods, so it uses the plain names lr / batch_size / momentum.
        epochs: int = 500
        batch_size: int = 256
        lr: float = 0.001
        momentum: float = 0.9
        weight_decay: float = 0.0  # not given: none
        # Whether each round's training starts from a fresh random model instead of the current
        # global model. Not given; false: the server continues from w, the model clients matched
        # against, so knowledge from earlier rounds' sets carries over.
        restart_model: bool = False

        def __post_init__(self) -> None:
            super().__post_init__()
            check(self.ipc >= 1, "ipc", self.ipc, "at least 1")
            check(self.condense_iterations >= 0, "condense_iterations", self.condense_iterations, ">= 0")
            check(self.image_lr > 0, "image_lr", self.image_lr, "> 0")
            check(0 <= self.image_momentum < 1, "image_momentum", self.image_momentum, "in [0, 1)")
            check(self.real_batch >= 1, "real_batch", self.real_batch, "at least 1")
            check(self.epochs >= 0, "epochs", self.epochs, ">= 0")
            check(self.batch_size >= 1, "batch_size", self.batch_size, "at least 1")
            check(self.lr > 0, "lr", self.lr, "> 0")
            check(0 <= self.momentum < 1, "momentum", self.momentum, "in [0, 1)")
            check(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")

    params: Params

    # ---- server ------------------------------------------------------------------------------
    def download(self, server: ServerContext) -> dict[str, torch.Tensor]:
        """Arrays sent to every selected client: the global model (FedAF adds the global logits)."""
        return state_to_arrays(server.model.state_dict(), MODEL)

    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        msg = Message(arrays=self.download(server))
        clients = uniform_sample(self.fed.num_clients, self.params.clients_per_round, server.rng("select"))
        return [(cid, msg) for cid in clients]

    def reply_spec(self, task: str, server: ServerContext) -> Spec | None:
        """A synthetic set of any size (no model: nothing is averaged)."""
        return synthetic_reply_spec(self.fed.image_shape) if task == "train" else None

    def server_terms(self, server: ServerContext) -> list[LossTerm]:
        """Loss terms added to cross-entropy in the server's training (FedDM: none)."""
        return []

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        """Put the uploads into the union of latest sets, then train the global model on it."""
        p = self.params
        previous = pool_from_state(server.state, SYN_STATE, ("images", "labels"))
        if not replies:  # nothing new this round: keep the model
            server.metrics["synthetic_images"] = 0 if previous is None else int(previous["labels"].shape[0])
            return
        pool = update_pool(
            previous,
            [(cid, {"images": m.arrays[SYN_IMAGES], "labels": m.arrays[SYN_LABELS]}) for cid, m in replies],
            keep_others=True,
        )
        pool_to_state(server.state, SYN_STATE, pool)
        server.metrics["synthetic_images"] = int(pool["labels"].shape[0])
        # Keep what the clients sent this round, for `fedskew audit` and the report's image grids.
        server.save_artifact("synthetic", uploads_artifact(pool, [cid for cid, _ in replies]))
        syn = decode_set(pool["images"], pool["labels"], self.fed.mean, self.fed.std)
        if syn is None or p.epochs == 0:
            return
        if p.restart_model:
            fresh = seeded_init(self.fed.model.build, self.fed.seed, "restart", server.round)
            server.model.load_state_dict(fresh.state_dict())
        res = train_on_synthetic(
            server.model, syn, LocalConfig(p.epochs, p.batch_size, p.lr, p.momentum, p.weight_decay),
            server.generator("train"), self.server_terms(server),
        )
        server.metrics["server_loss"] = res.mean_loss

    # ---- client ------------------------------------------------------------------------------
    def dm_config(self, init: str, clip_norm: float | None) -> DMConfig:
        p = self.params
        return DMConfig(
            iterations=p.condense_iterations, ipc=p.ipc, image_lr=p.image_lr, momentum=p.image_momentum,
            real_batch=p.real_batch, init=init, clip_norm=clip_norm,
        )

    def condense(self, msg: Message, client: ClientContext) -> tuple[SyntheticSet, dict[str, torch.Tensor]]:
        """The client's condensed set and any further reply arrays."""
        raise NotImplementedError

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        arrays: dict[str, Any] = {}
        syn = None
        if client.num_samples > 0:
            syn, arrays = self.condense(msg, client)
        arrays.update(synthetic_arrays(syn, client))
        metrics = {"num_samples": float(client.num_samples), "synthetic_images": float(arrays[SYN_LABELS].shape[0])}
        return Message(arrays=arrays, metrics=metrics)


@register_algorithm("feddm")
class FedDM(AggregationFree):
    """Distribution matching around the global model (rho-ball sampling), server trains on the union."""

    @dataclass
    class Params(AggregationFree.Params):
        rho: float = 5.0  # radius of FedDM's model-sampling ball (SPEC section 4)
        clip_norm: float = 2.0  # image-gradient clipping norm (SPEC section 4)
        # FedAF Sec. 5.1 (and SPEC: "the same" as FedAF): both start from averages of random real images,
        # a new draw every round here; "real" is FedDM's own paper's start (random real images).
        init: Literal["real", "noise", "mean"] = "mean"

        def __post_init__(self) -> None:
            super().__post_init__()
            check(self.rho >= 0, "rho", self.rho, ">= 0")
            check(self.clip_norm > 0, "clip_norm", self.clip_norm, "> 0")

    params: Params

    def condense(self, msg: Message, client: ClientContext) -> tuple[SyntheticSet, dict[str, torch.Tensor]]:
        """A fresh set, matched with networks drawn from the rho-ball around the received model."""
        p = self.params
        model = client.model(arrays_with_prefix(msg.arrays, MODEL))
        sampler = perturbed_model_sampler(model, client.fed.model.build, p.rho)
        syn = distribution_matching(
            client.x, client.y, sampler, self.dm_config(p.init, p.clip_norm), client.generator("condense")
        )
        return syn, {}
