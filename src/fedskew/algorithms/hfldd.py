"""HFLDD (Shi et al., "Dataset Distillation-based Hybrid Federated Learning on Non-IID Data",
``papers/hfldd-dataset-distillation-hybrid-fl.txt``; symbols restored in ``SPEC.md`` section 2).

Against quantity-based label skew (each client holds C of the L classes), HFLDD regroups clients so that
each group together holds every class, and lets one client per group train on the group's data:

1. Label knowledge (Sec. IV-B1), in :meth:`HFLDD.setup`: every client pre-trains the initial model on
   its data (SGD, lr 0.01, batch 64, ``pretrain_epochs`` epochs: not given, 5) and uploads the soft labels
   P_k (|D_p| x L, float32) it predicts on a public set D_p of 1,000 samples from another distribution.
   The initial model is rebuilt by each client from the run's seed ("the initialization of the server
   model can be sent as a random seed", Sec. IV-C), so it costs no bytes.
2. Clustering (Sec. IV-B2, Algorithm 1): A_ij = divergence(P_i, P_j) (Eq. 4), K-means (K = 10) on the
   rows of A gives homogeneous clusters; heterogeneous clusters take one random client from each
   homogeneous cluster in turn; each gets a random header (:mod:`fedskew.components.clustering`).
3. IID data generation (Sec. IV-B3): every non-header member distils its data with KIP (Sec. III-A,
   Eq. 1; :func:`fedskew.condense.kip`) and sends it to its header as 8-bit images and labels. The
   engine relays it through the server: the members' uploads are counted once, as client-to-client
   bytes, and the forwarding to headers is not counted again. Headers keep the data in their client
   state for the whole run. The relayed images are saved as they travelled (8-bit) in the ``synthetic``
   artifact (``artifacts/synthetic/round_0000.safetensors``: the relay is part of the setup, round 0),
   so ``fedskew audit`` measures what they reveal of the members' images.
4. Training (Sec. IV-B4, Eq. 5): FedAvg between the server and all H headers every round, each header
   training on its own data plus the distilled data it received (batch 32, lr 0.01, SGD), weighted by
   that combined size.

The ledger therefore shows N |D_p| L * 4 bytes of soft labels and the distilled images (+ int64 labels)
in round 1, then 2 H |w| * 4 bytes per round: the paper's Eq. 6, which
:func:`fedskew.components.clustering.hfldd_cost_bits` computes in closed form.

Public set D_p (the paper uses Fashion-MNIST for MNIST and Tiny-ImageNet for CIFAR-10; neither MNIST nor
Tiny-ImageNet is available offline here): ``public_dataset = "auto"`` takes scikit-learn's digits
(upsampled) for grey-scale federations such as Fashion-MNIST and Fashion-MNIST (grey copied to three
channels, resized to 32x32) for colour federations such as CIFAR-10. Any registered dataset can be named
instead; its images are converted to the federation's channels and size and normalised with the
federation's mean and std, and ``public_size`` of them are drawn with ``public_seed`` from its pooled
train and test splits. Every client builds the same set locally from these parameters.

Not given by the paper: E_pre (5), the local epochs of the training phase (1, FedAvg's default), the
images each member distils (``kip_images`` 100, split evenly over the classes it holds, or ``kip_ipc``
per class; see below) and KIP's iterations and learning rate (``kip_iterations``
100, ``kip_lr`` 0.01 = KIP's default); KIP regresses hard labels (no label learning) with the FC NTK.
``clients_per_round`` is unused: every header trains every round.

Where KIP starts (``kip_init``): ``"real"`` (KIP's and our default) starts from distinct random real
images of the member's classes; 100 Adam steps at lr 0.01 move them little, so the relayed images are
nearly the member's own. ``"noise"`` starts from standard normal pixels in the normalised space, and
``"class_mean"`` from the mean of all the member's real images of the class plus Gaussian noise of
standard deviation ``kip_init_noise`` (0.1, normalised units, so that the images of one class differ).
Round 1 records ``kip_init_cosine``: how close the relayed images stayed to real ones. Each member
computes, for each image it sent (decoded from the 8 bits that travelled, in the normalised space the
model trains in), the cosine similarity to the real image it started from (``"real"``) or, for the
other inits, the largest cosine to its real images of the same class (the nearest one); it sends the
median over its images, and the server records the median over the members.

Why 100 images per member: the paper's count ("we set each client to distill [N] images", Sec. V-A4) was
lost in extraction, but it is a count per client, and Table III (CIFAR-10, C = 10) bounds it. FedAvg's
27,630 MB for 35 rounds of 100 clients gives |w| ~ 0.99 M parameters (Eq. 3); HFLDD's 5,844 MB for 32
rounds is 4 MB of soft labels + 2 * 32 * H * |w| * 4 bytes for H headers + the images. H = 22 would leave
92,000 images (more than CIFAR-10's 50,000 training images), H = 24 a negative budget; H = 23 leaves
30 MB, about 9,800 images of 3,072 bytes over 77 members: ~130 each. We take 100. A per-class count of
10 would also starve the headers: with one class per client, a header
held 500-600 images of its own class and 10 of each other, and the classes no header owns were
nearly absent from training (zero per-class accuracy in our runs).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.clustering import (
    Divergence,
    heterogeneous_clusters,
    homogeneous_clusters,
    pick_headers,
    soft_label_divergence,
)
from fedskew.components.trainer import LocalConfig, train_local
from fedskew.condense.kip import KIPConfig, kip
from fedskew.condense.synthetic import SyntheticSet, UInt8Set, init_synthetic, start_set
from fedskew.core.device import current_compute, randn
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.models.layout import as_model_format, is_channels_last
from fedskew.privacy.uploads import Withheld
from fedskew.runs import SYNTHETIC_ARTIFACT

PREDICT_CHUNK = 500


PUBLIC = "public"
"""Request array of the pretrain task: D_p, the public images the clients predict soft labels on."""

KipInit = Literal["real", "noise", "class_mean"]
"""Where a member's KIP starts (the ``kip_init`` option, see the module docstring)."""
INIT_COSINE = "kip_init_cosine"
"""Reply scalar of the distill task and round-1 metric: how close the relayed images stayed to real ones."""


def auto_public_dataset(image_shape: tuple[int, int, int]) -> str:
    """The public dataset ``"auto"`` stands for: digits for grey-scale images, Fashion-MNIST for colour.

    Both differ in distribution from the federation's data they are meant for (Fashion-MNIST and
    CIFAR-10 respectively), as HFLDD requires of D_p, and both are available offline.
    """
    return "fashion_mnist" if image_shape[0] == 3 else "digits"


@functools.lru_cache(maxsize=4)
def public_set(
    name: str,
    size: int,
    seed: int,
    data_dir: str,
    image_shape: tuple[int, int, int],
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> torch.Tensor:
    """D_p: ``size`` images of dataset ``name`` in the federation's shape and normalisation.

    Deterministic in its arguments; built by the server half and sent to every client with the
    pretrain request (the client half loads no dataset). Cached per process.

    Parameters
    ----------
    name
        A registered dataset (``fedskew.data.DATASETS``).
    size
        |D_p|, drawn without replacement from the pooled train and test images.
    seed
        Seed of that draw.
    data_dir
        Where the dataset's files are (empty: ``$FEDSKEW_DATA`` or the default data dir).
    image_shape
        (C, H, W) of the federation: grey images are copied to 3 channels or colour images averaged to 1,
        then resized bilinearly (with anti-aliasing) to H x W.
    mean, std
        The federation's per-channel normalisation.
    """
    from fedskew.data import load_dataset

    ds = load_dataset(name, data_dir or None)
    pool = np.concatenate([ds.x_train, ds.x_test])
    if size > len(pool):
        raise ConfigError(f"public_size={size} exceeds the {len(pool)} images of public dataset {name!r}")
    pick = np.sort(np.random.default_rng(seed).choice(len(pool), size=size, replace=False))
    x = torch.from_numpy(pool[pick].astype(np.float32) / 255.0)
    channels, height, width = image_shape
    if x.shape[1] != channels:
        x = x.expand(-1, channels, -1, -1) if x.shape[1] == 1 else x.mean(dim=1, keepdim=True)
    if tuple(x.shape[2:]) != (height, width):
        x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False, antialias=True)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return ((x - m) / s).contiguous()


@register_algorithm("hfldd")
class HFLDD(FedAvg):
    """Heterogeneous clusters from soft-label clustering; headers train on own + distilled data."""

    paper = 'Shi et al., "Dataset Distillation-based Hybrid Federated Learning on Non-IID Data"'

    class Params(FedAvg.Params):
        batch_size: int = 32  # training phase batch (Sec. V-A4)
        lr: float = 0.01  # training phase SGD lr (Sec. V-A4)
        pretrain_epochs: int = 5  # E_pre (not given, SPEC 2: 5)
        pretrain_batch_size: int = 64  # Sec. V-A4
        pretrain_lr: float = 0.01  # Sec. V-A4
        public_dataset: str = "auto"  # D_p's dataset; "auto": see auto_public_dataset
        public_size: int = 1000  # |D_p| (Sec. V-A1)
        public_seed: int = 0  # seed of the draw of D_p
        public_data_dir: str = ""  # where D_p's files are ("" = $FEDSKEW_DATA)
        divergence: Divergence = "kl"  # A_ij of Eq. 4: "kl" (paper), "symmetric_kl", "js"
        num_homogeneous: int = 10  # K of K-means (Sec. V-A4)
        kmeans_n_init: int = 10  # K-means restarts (scikit-learn), best inertia kept
        kip_images: int = 100  # distilled images per member, split over the classes it holds (not given)
        kip_ipc: int = 0  # distilled images per class held; 0: kip_images // classes held (at least 1)
        kip_iterations: int = 100  # KIP Adam steps (not given; small for speed)
        kip_lr: float = 0.01  # KIP image lr (not given; KIP's default)
        kip_reg: float = 1e-6  # KIP ridge, relative to tr(K_ss)/n (KIP's default)
        kip_target_batch: int = 256  # real samples per KIP step
        kip_kernel: Literal["ntk", "rf_convnet"] = "ntk"  # KIP kernel (see condense.kip)
        kip_init: KipInit = "real"  # KIP's start: "real" images (KIP), "noise", "class_mean" (module docstring)
        kip_init_noise: float = 0.1  # std of the noise on "class_mean" starts (normalised units)

        # kip_ipc 0: from kip_images

        at_least = minimums(

            kip_ipc=0, kip_iterations=0, public_seed=0, kip_reg=0, kip_init_noise=0, pretrain_epochs=1,

            pretrain_batch_size=1, public_size=1, num_homogeneous=1, kmeans_n_init=1, kip_images=1,

            kip_target_batch=1,

        )
        positive = ("pretrain_lr", "kip_lr")

    params: Params
    upload = Withheld("condensed images", use='privacy.mode = "condensation"')

    not_sum_only = (
        "relays each client's distilled data to its cluster header through the server, which sees it one by one; "
        "SecAgg+ reveals only the sum of the uploads"
    )

    # ---- server ------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        """Steps 1-4 of Fig. 1: soft labels, clustering, distillation and its relay to the headers."""
        p = self.params
        # D_p is public: the server loads it and hands it over with the request. It is not charged to
        # the ledger (down=None), since the paper assumes every client holds D_p already.
        request = Message(arrays={PUBLIC: self._public()})
        replies = server.exchange("pretrain", [(cid, request) for cid in range(self.fed.num_clients)], down=None)
        if not replies:
            raise FedskewError("hfldd: no client returned soft labels")
        cids = [cid for cid, _ in replies]
        soft = np.stack([m.arrays["soft_labels"].cpu().numpy() for _, m in replies])
        similarity = soft_label_divergence(soft, p.divergence)
        seed = int(server.rng("kmeans").integers(2**31))
        groups = homogeneous_clusters(similarity, p.num_homogeneous, seed, p.kmeans_n_init)
        homogeneous = [[cids[i] for i in g] for g in groups]
        clusters = heterogeneous_clusters(homogeneous, server.rng("heterogeneous"))
        # Clients that sent no soft labels cannot be placed: they train alone (the paper's isolated nodes).
        answered = set(cids)
        clusters += [[c] for c in range(self.fed.num_clients) if c not in answered]
        headers = pick_headers(clusters, server.rng("headers"))
        server.state.update(homogeneous=homogeneous, heterogeneous=clusters, headers=headers)
        server.state["distilled"] = self._distill_and_relay(server, clusters, headers)

    def sample_limit(self, cid: int, shard_size: int, server: ServerContext) -> float:
        """A header trains on its shard and the distilled images relayed to it."""
        headers, distilled = server.state.get("headers", []), server.state.get("distilled", [])
        extra = distilled[headers.index(cid)] if cid in headers else 0
        return float(shard_size + extra)

    def _distill_and_relay(self, server: ServerContext, clusters: list[list[int]], headers: list[int]) -> list[int]:
        """Members distil and send to their header (counted once, client-to-client); returns images per header.

        Also saves the relayed sets (:meth:`_save_relayed`) and keeps the members' median
        ``kip_init_cosine`` in ``server.state`` (None when no member relayed anything).
        """
        members = [(c, h) for cluster, h in zip(clusters, headers, strict=True) for c in cluster if c != h]
        replies = dict(server.exchange("distill", [(c, Message()) for c, _ in members], up="client_to_client"))
        received: dict[int, list[Message]] = {h: [] for h in headers}
        relayed: Replies = []
        for c, h in members:
            if c in replies and self._valid_distilled(replies[c]):
                received[h].append(replies[c])
                relayed.append((c, replies[c]))
        self._save_relayed(server, sorted(relayed, key=lambda r: r[0]))
        cosines = [float(m.metrics[INIT_COSINE]) for _, m in relayed]
        server.state[INIT_COSINE] = float(np.median(cosines)) if cosines else None
        relay = [
            (h, Message(arrays={
                "images": torch.cat([m.arrays["images"] for m in msgs]),
                "labels": torch.cat([m.arrays["labels"] for m in msgs]),
            }))
            for h, msgs in received.items() if msgs
        ]
        server.exchange("receive", relay, down=None, up=None)  # the relay hop: already counted above
        return [sum(int(m.arrays["labels"].numel()) for m in received[h]) for h in headers]

    @staticmethod
    def _save_relayed(server: ServerContext, relayed: Replies) -> None:
        """The ``synthetic`` artifact of the condensation methods (``images`` uint8 as they travelled,
        ``labels``, ``clients``: the sending member of each row), rows ordered by member, for ``fedskew audit``
        and the report's image grids. Nothing is saved when no member relayed anything."""
        if not relayed:
            return
        labels = [m.arrays["labels"] for _, m in relayed]
        server.save_artifact(SYNTHETIC_ARTIFACT, {
            "images": torch.cat([m.arrays["images"] for _, m in relayed]),
            "labels": torch.cat(labels),
            "clients": torch.cat([
                torch.full((int(lab.numel()),), c, dtype=torch.int64, device=lab.device)
                for (c, _), lab in zip(relayed, labels, strict=True)
            ]),
        })

    def _valid_distilled(self, msg: Message) -> bool:
        """A member's reply is usable: uint8 images of the federation's shape with as many int64 labels."""
        images, labels = msg.arrays.get("images"), msg.arrays.get("labels")
        return (
            images is not None and labels is not None and images.dtype == torch.uint8
            and labels.dtype == torch.int64 and tuple(images.shape[1:]) == self.fed.image_shape
            and labels.shape == (images.shape[0],)
        )

    def select(self, server: ServerContext) -> list[int]:
        """Every cluster header, every round (Sec. IV-B4)."""
        return sorted(server.state["headers"])

    def round(self, server: ServerContext) -> None:
        super().round(server)
        server.metrics.update(
            num_headers=len(server.state["headers"]), num_homogeneous=len(server.state["homogeneous"]),
        )
        if server.round == 1:
            server.metrics.update(
                homogeneous_clusters=server.state["homogeneous"], clusters=server.state["heterogeneous"],
                cluster_headers=server.state["headers"], distilled_per_header=server.state["distilled"],
                kip_init_cosine=server.state.get(INIT_COSINE),
            )

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """Soft labels are |D_p| x L float32; a header's receipt is empty; distilled sets vary in size."""
        if task == "pretrain":
            return {"soft_labels": ((self.params.public_size, self.fed.num_classes), torch.float32)}
        if task == "receive":
            return {}
        return super().reply_spec(task, server)

    def reply_scalars(self, task: str, server: ServerContext) -> dict[str, tuple[float, float | None]]:
        """A member's distilled set comes with its ``kip_init_cosine``, a cosine in [-1, 1]."""
        if task == "distill":
            return {INIT_COSINE: (-1.0, 1.0)}
        return super().reply_scalars(task, server)

    # ---- client ------------------------------------------------------------------------------
    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task == "pretrain":
            return self._pretrain(msg.arrays[PUBLIC], client)
        if task == "distill":
            return self._distill(client)
        if task == "receive":
            client.state["distilled_images"] = msg.arrays["images"].clone()
            client.state["distilled_labels"] = msg.arrays["labels"].clone()
            return Message()
        if task == "train":
            return self.local_train(msg, self._with_distilled(client))[1]
        return super().client_step(task, msg, client)

    def _public(self) -> torch.Tensor:
        """D_p, built on the server's side (see :func:`public_set`)."""
        p, fed = self.params, self.fed
        name = auto_public_dataset(fed.image_shape) if p.public_dataset == "auto" else p.public_dataset
        return public_set(name, p.public_size, p.public_seed, p.public_data_dir, fed.image_shape, fed.mean, fed.std)

    def _pretrain(self, public: torch.Tensor, client: ClientContext) -> Message:
        """Pre-train the seed-rebuilt initial model locally and predict soft labels on D_p (Sec. IV-B1)."""
        p = self.params
        model = client.model(state_to_arrays(self.init_model().state_dict()))
        res = train_local(
            model, client.x, client.y,
            LocalConfig(epochs=p.pretrain_epochs, batch_size=p.pretrain_batch_size, lr=p.pretrain_lr),
            client.generator("pretrain"),
        )
        model.eval()
        cl = is_channels_last(model)
        with torch.inference_mode():
            probs = torch.cat([
                torch.softmax(model(as_model_format(chunk, cl)), dim=1) for chunk in public.split(PREDICT_CHUNK)
            ])
        model.train()
        return Message(arrays={"soft_labels": probs.float().contiguous()}, metrics={"pretrain_loss": res.mean_loss})

    def _distill(self, client: ClientContext) -> Message:
        """KIP-distil the member's data (Sec. III-A, IV-B3) and send it as 8-bit images."""
        p = self.params
        held = int(torch.unique(client.y).numel())
        ipc = p.kip_ipc or max(1, p.kip_images // max(held, 1))
        cfg = KIPConfig(
            iterations=p.kip_iterations, ipc=ipc, lr=p.kip_lr, reg=p.kip_reg,
            target_batch=p.kip_target_batch, kernel=p.kip_kernel, amp=current_compute().amp,
        )
        generator = client.generator("kip")
        start = self._kip_start(client, ipc, generator)
        syn = kip(client.x, client.y, self.fed.num_classes, cfg, generator, start=start)
        u = syn.to_uint8(self.fed.mean, self.fed.std)
        metrics = {"distilled": float(len(syn)), INIT_COSINE: self._init_cosine(u, start, client)}
        return Message(arrays={"images": u.images, "labels": u.labels}, metrics=metrics)

    def _kip_start(self, client: ClientContext, ipc: int, generator: torch.Generator) -> SyntheticSet:
        """Where the member's KIP starts (``kip_init``): ``ipc`` images of each class it holds, in increasing
        label order, drawn from the KIP stream (``"real"`` draws exactly what :func:`~fedskew.condense.kip`
        draws by itself)."""
        p = self.params
        if p.kip_init != "class_mean":
            return start_set(client.x, client.y, ipc, p.kip_init, generator)
        # init_synthetic's "mean" over all of a class's images (at most the shard) is the class mean.
        classes = sorted(set(client.y.tolist()))
        means = init_synthetic(client.x, client.y, classes, ipc, "mean", generator, mean_samples=client.num_samples)
        noise = randn(tuple(means.images.shape), generator, means.images.device)
        return SyntheticSet(means.images + p.kip_init_noise * noise, means.labels)

    def _init_cosine(self, sent: UInt8Set, start: SyntheticSet, client: ClientContext) -> float:
        """The member's ``kip_init_cosine``: the median over the images it sent (decoded from 8 bits, in the
        normalised space) of the cosine to the real image each started from (``kip_init = "real"``), or
        else to the nearest (largest cosine) of the member's real images of the same class."""
        device = client.x.device
        sent_images = SyntheticSet.from_uint8(sent, self.fed.mean, self.fed.std).images.to(device)
        flat = F.normalize(sent_images.flatten(1).double(), dim=1)
        labels = sent.labels.to(device)
        if self.params.kip_init == "real":
            cos = (flat * F.normalize(start.images.flatten(1).double(), dim=1)).sum(dim=1)
        else:
            cos = torch.empty(flat.shape[0], dtype=torch.float64, device=device)
            for c in labels.unique().tolist():
                real = F.normalize(client.x[client.y == c].flatten(1).double(), dim=1)
                cos[labels == c] = (flat[labels == c] @ real.T).max(dim=1).values
        return float(np.median(cos.clamp(-1.0, 1.0).cpu().numpy()))

    def _with_distilled(self, client: ClientContext) -> ClientContext:
        """The header's own data plus the distilled data it keeps (D_h of Sec. IV-B3)."""
        if "distilled_images" not in client.state:
            return client
        u = UInt8Set(client.state["distilled_images"], client.state["distilled_labels"])
        syn = SyntheticSet.from_uint8(u, self.fed.mean, self.fed.std)
        return dataclasses.replace(
            client, x=torch.cat([client.x, syn.images]), y=torch.cat([client.y, syn.labels]),
        )
