"""What the condensation-based methods share: their condensation parameters and the
aggregation-free server of FedDM and FedAF.

FedDC (Kim & Choi 2022) averages models and fine-tunes on this round's condensed sets; FedDM
(Xiong et al., CVPR 2023) and FedAF (Wang et al., CVPR 2024) are aggregation-free: no model
averaging, the server trains the global model on the union of the clients' latest condensed sets.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, ClassVar, Literal

import torch

from fedskew.algorithms.base import Algorithm, ClientContext, Replies, ServerContext
from fedskew.algorithms.condensation.pool import pool_from_state, receive_sets
from fedskew.algorithms.condensation.private import (
    EPSILON,
    WITHHELD,
    ClientBudget,
    check_private_model,
    client_noise,
    dm_sample_rate,
    private_condensation,
    record_epsilons,
    uploads,
)
from fedskew.algorithms.condensation.server import ServerTraining, train_global_on_synthetic
from fedskew.algorithms.condensation.wire import (
    MODEL,
    SYN_LABELS,
    SYN_STATE,
    WIRE_CLAMPED,
    Spec,
    WireDtype,
    synthetic_reply_spec,
    synthetic_scalars,
    synthetic_upload,
)
from fedskew.components.selection import uniform_sample
from fedskew.components.trainer import LossTerm
from fedskew.condense import DMConfig, ExtraLoss, ModelSampler, SyntheticSet
from fedskew.condense.private_dm import REAL_START, private_distribution_matching
from fedskew.core.device import current_compute
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import Options, maximums, minimums
from fedskew.core.seeding import seeded_init
from fedskew.privacy.params import PrivacyParams
from fedskew.privacy.uploads import Withheld

SERVER_KEYS = ("epochs", "batch_size", "lr", "momentum", "weight_decay")
"""The server-training settings that used to be top-level keys of these methods."""


class CondensationParams(Options):
    """Parameters every condensation-based method has (each gives its own defaults).

    ``server`` is the nested ``[algorithm.server]`` table (:class:`ServerTraining`). ``wire_dtype`` is
    how the condensed images travel (:mod:`.wire`): ``"uint8"`` 8-bit pixels (clamped to [0, 255]),
    ``"float16"`` or ``"float32"`` the normalised images (2 or 4 bytes per value instead of 1).
    """

    ipc: int = 1  # synthetic images per class held
    condense_iterations: int = 500  # local condensation steps, one network draw each
    image_lr: float = 1.0  # learning rate of the synthetic images
    image_momentum: float = 0.0  # SGD momentum of the synthetic images
    real_batch: int = 256  # real images per class per step (all of them if fewer)
    wire_dtype: WireDtype = "uint8"  # how the condensed images are uploaded: uint8, float16 or float32
    server: ServerTraining = field(default_factory=ServerTraining)

    at_least = minimums(ipc=1, condense_iterations=0, real_batch=1)
    positive: ClassVar[tuple[str, ...]] = ("image_lr",)
    fractions: ClassVar[tuple[str, ...]] = ("image_momentum",)


class AggregationFree(Algorithm):
    """Clients condense, the server trains the global model on the union of their latest sets.

    Not registered: the common part of FedDM and FedAF. Subclasses say how a client condenses
    (:meth:`condense`) and may add arrays to the download (:meth:`download`) and loss terms to the
    server's training (:meth:`server_terms`).

    The union holds each client's latest set (a client's upload replaces its previous one). With
    FedAF's setup, all clients in every round, that is exactly this round's sets; with partial
    participation the absent clients' last sets stay in, since Eq. 14's S is the union over all
    clients.
    """

    unbatched_client_work = "distribution matching"

    class Params(CondensationParams, Algorithm.Params):
        # Condensation (FedAF Sec. 5.1 and App. A; FedDM is run with the same settings there).
        ipc: int = 50  # FedAF's label-skew setting (Table 7)
        condense_iterations: int = 1000
        image_lr: float = 1.0  # CIFAR-10 and DomainNet; FedAF uses 0.2 on FMNIST, 0.1 on CIFAR-100
        image_momentum: float = 0.9  # App. A: SGD with momentum 0.9, also for condensation
        # The server's training of the global model on the union S (FedAF Sec. 5.1): 500 epochs,
        # batch 256, lr 0.001, momentum 0.9; weight decay not given: none.
        server: ServerTraining = field(
            default_factory=lambda: ServerTraining(epochs=500, batch_size=256, lr=0.001, momentum=0.9)
        )
        # Whether each round's training starts from a fresh random model instead of the current
        # global model. Not given; false: the server continues from w, the model clients matched
        # against, so knowledge from earlier rounds' sets carries over.
        restart_model: bool = False
        # Batch statistics of a BatchNorm network while matching (neither FedDM nor FedAF says): "pooled",
        # one pass of real and synthetic images, or "separate", a pass each (DM's reference code); pooled
        # measured better on the quick configs (docs/algorithms.md, "Distribution matching: ...").
        bn_statistics: Literal["separate", "pooled"] = "pooled"
        # privacy.mode = "condensation": one Poisson rate for every class's real images (None: real_batch / n_c
        # per class, a class of at most real_batch images taken whole every step; docs/private_condensation.md).
        private_sample_rate: float | None = None

        at_most = maximums(private_sample_rate=1.0)
        positive: ClassVar[tuple[str, ...]] = ("private_sample_rate",)

        renamed: ClassVar[dict[str, str]] = {k: f"server.{k}" for k in SERVER_KEYS}

    params: Params
    upload = Withheld("condensed images", use='privacy.mode = "condensation"')

    not_sum_only = (
        "uploads condensed images, which the server must see one by one; SecAgg+ reveals only the sum of the uploads"
    )

    private_condensation: ClassVar[bool] = False
    """Whether the method condenses privately under ``privacy.mode = "condensation"`` (FedDM, FedAF:
    :mod:`.private`)."""

    @classmethod
    def check_private(cls, params: Any, privacy: PrivacyParams) -> None:
        """Refuse (one line) the method's settings that a private condensation cannot honour: a start from
        real images."""
        if getattr(params, "init", "noise") != "noise":
            raise ConfigError(f"{REAL_START}, got algorithm.init = {params.init!r}")

    @property
    def privacy(self) -> PrivacyParams | None:
        """The ``[privacy]`` table when the run condenses privately (``mode = "condensation"``), else None."""
        return private_condensation(self.params)

    # ---- server ------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        """A private run refuses, before its first round, a model that couples its batch."""
        if self.privacy is not None:
            check_private_model(self.fed.model, self.fed.seed)

    def download(self, server: ServerContext) -> dict[str, torch.Tensor]:
        """Arrays sent to every selected client: the global model (FedAF adds the global logits)."""
        return state_to_arrays(server.model.state_dict(), MODEL)

    def configure(self, server: ServerContext) -> list[tuple[int, Message]]:
        msg = Message(arrays=self.download(server))
        clients = uniform_sample(self.fed.num_clients, self.params.clients_per_round, server.rng("select"))
        return [(cid, msg) for cid in clients]

    def reply_spec(self, task: str, server: ServerContext) -> Spec | None:
        """A synthetic set of any size in the wire dtype (no model: nothing is averaged)."""
        return synthetic_reply_spec(self.fed.image_shape, self.params.wire_dtype) if task == "train" else None

    def reply_scalars(self, task: str, server: ServerContext) -> dict[str, tuple[float, float | None]]:
        """A ``train`` reply also says what share of its pixel values the 8-bit encoding clamped."""
        scalars = super().reply_scalars(task, server)
        if task != "train":
            return scalars
        private = {EPSILON: (0.0, None)} if self.privacy is not None else {}
        return {**scalars, **synthetic_scalars(), **private}

    def server_terms(self, server: ServerContext) -> list[LossTerm]:
        """Loss terms added to cross-entropy in the server's training (FedDM: none)."""
        return []

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        """Put the uploads into the union of latest sets, then train the global model on it."""
        p = self.params
        if self.privacy is not None:
            record_epsilons(server, replies, self.fed.num_clients)
            replies = uploads(replies)  # a client out of budget keeps its last set in the union
        if not replies:  # nothing new this round: keep the model
            previous = pool_from_state(server.state, SYN_STATE, ("images", "labels"))
            server.metrics["synthetic_images"] = 0 if previous is None else int(previous["labels"].shape[0])
            server.metrics[WIRE_CLAMPED] = 0.0
            return
        syn = receive_sets(server, replies, keep_others=True)
        if syn is None or p.server.epochs == 0:
            return
        if p.restart_model:
            fresh = seeded_init(self.fed.model.build, self.fed.seed, "restart", server.round)
            server.model.load_state_dict(fresh.state_dict())
        res = train_global_on_synthetic(
            server.model, syn, p.server, server.generator("train"), self.server_terms(server)
        )
        server.metrics["server_loss"] = res.mean_loss

    # ---- client ------------------------------------------------------------------------------
    def dm_config(self, init: str, clip_norm: float | None) -> DMConfig:
        """The clients' distribution-matching settings, in the run's mixed precision (``amp``)."""
        p = self.params
        return DMConfig(
            iterations=p.condense_iterations, ipc=p.ipc, image_lr=p.image_lr, momentum=p.image_momentum,
            real_batch=p.real_batch, init=init, clip_norm=clip_norm, amp=current_compute().amp,
            bn_statistics=p.bn_statistics,
        )

    def private_matching(
        self, client: ClientContext, sampler: ModelSampler, cfg: DMConfig, generator: torch.Generator,
        init_set: SyntheticSet | None = None, extra_loss: ExtraLoss | None = None,
    ) -> SyntheticSet:
        """Distribution matching against the privately released class means (:mod:`fedskew.condense.private_dm`),
        its noise from the client's ``dp_noise`` stream."""
        privacy = self.privacy
        assert privacy is not None
        return private_distribution_matching(
            client.x, client.y, sampler, cfg, generator, privacy.clip, privacy.noise_multiplier,
            client_noise(privacy, client, "dp_noise"), init_set=init_set, extra_loss=extra_loss,
            sample_rate=self.params.private_sample_rate,
        )

    def condense(
        self, msg: Message, client: ClientContext
    ) -> tuple[SyntheticSet, dict[str, torch.Tensor], dict[str, float]]:
        """The client's condensed set, any further reply arrays, and any further reply metrics."""
        raise NotImplementedError

    def releases(self, task: str, client: ClientContext) -> list[tuple[float, int]]:
        """What a private client releases for ``task`` this round, as (sampling rate, steps) of the Gaussian
        mechanism: the matching's steps (FedAF adds its class logits)."""
        if task != "train":
            return []
        p = self.params
        return [(dm_sample_rate(client.y, p.real_batch, p.private_sample_rate), p.condense_iterations)]

    def withheld(self, client: ClientContext) -> dict[str, torch.Tensor]:
        """The reply arrays, besides an empty set, of a client that releases nothing (FedAF: empty logits)."""
        return {}

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != "train":
            return super().client_step(task, msg, client)
        arrays: dict[str, Any] = {}
        extra: dict[str, float] = {}
        syn = None
        privacy = self.privacy
        if privacy is None:
            if client.num_samples > 0:
                syn, arrays, extra = self.condense(msg, client)
        else:
            budget = ClientBudget(privacy, client.state)
            releases = self.releases(task, client) if client.num_samples > 0 else []
            if client.num_samples > 0 and budget.affordable(releases):
                syn, arrays, extra = self.condense(msg, client)
                budget.spend(releases)
            elif client.num_samples > 0:
                arrays, extra = self.withheld(client), {WITHHELD: 1.0}
            extra[EPSILON] = budget.epsilon
        upload, scalars = synthetic_upload(syn, client, self.params.wire_dtype)
        arrays.update(upload)
        metrics = {"num_samples": float(client.num_samples), "synthetic_images": float(arrays[SYN_LABELS].shape[0])}
        return Message(arrays=arrays, metrics={**metrics, **scalars, **extra})
