"""FedDC and FedDC+ (Kim & Choi 2022, "Stable Federated Learning with Dataset Condensation",
Algorithm 1). Not the drift-decoupling FedDC of Gao et al. (CVPR 2022).

Problem: with label-skewed clients and partial participation, each round's pooled class histogram is
skewed ("temporary imbalance"), so the averaged model swings from round to round. Each selected client
therefore also condenses its data into one synthetic image per class it holds (gradient matching,
Eq. 6, clipped by Eq. 8) and uploads it with its model; the server averages the models (Eq. 2) and
fine-tunes the average on the union of *this round's* condensed sets (Eq. 7), which is roughly class
balanced whatever the clients' histograms. FedDC+ only changes the condensation optimiser (momentum
0.9, weight decay 4e-5), giving noisier, less recognisable images (Sec. IV-D).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from fedskew.algorithms.base import ClientContext, Replies, ServerContext, register_algorithm
from fedskew.algorithms.condensation.base import CondensationParams
from fedskew.algorithms.condensation.pool import receive_sets
from fedskew.algorithms.condensation.server import ServerTraining, train_global_on_synthetic
from fedskew.algorithms.condensation.wire import (
    MODEL,
    SYN_LABELS,
    WIRE_CLAMPED,
    synthetic_reply_spec,
    synthetic_scalars,
    synthetic_upload,
)
from fedskew.algorithms.fedavg import FedAvg
from fedskew.condense import GMConfig, gradient_matching
from fedskew.core.device import current_compute
from fedskew.core.message import Message, arrays_with_prefix
from fedskew.core.params import check


@register_algorithm("feddc")
class FedDC(FedAvg):
    """FedAvg + per-client gradient-matching condensation + server fine-tuning on this round's sets."""

    @dataclass
    class Params(CondensationParams, FedAvg.Params):
        # Local training, Sec. V-A: SGD, lr 0.01 (FedAvg's default), weight decay 1e-3.
        weight_decay: float = 1e-3
        # CondensedDataTraining (Algorithm 1, lines 13-23), Sec. V-A: K = 500 iterations, one fresh
        # random network each (no inner training of the network, Sec. IV-C), ipc 1 per held class.
        condense_iterations: int = 500
        ipc: int = 1
        image_lr: float = 3.0  # eta of Algorithm 1 line 20 (Sec. IV-C: raised from 0.1 to 3.0)
        image_momentum: float = 0.0  # FedDC: plain SGD; FedDC+: 0.9 (Sec. V-A)
        image_weight_decay: float = 0.0  # FedDC: none; FedDC+: 4e-5 (Sec. V-A)
        clip_norm: float = 10.0  # v of Eq. 8 (not given in the paper; SPEC default 10)
        real_batch: int = 256  # real images per class per step (not given; DC's 256, all if fewer)
        distance: Literal["cosine", "dc"] = "cosine"  # Eq. 6: sum over layers of 1 - cos
        init: Literal["noise", "real", "mean"] = "noise"  # not given; Fig. 7's images look like noise
        # Server fine-tuning, Eq. 7 and Sec. V-A: 10 epochs, lr 0.01 (the clients' lr); batch not
        # given: 256 is usually the whole round's set (10 clients x <= 10 images).
        server: ServerTraining = field(default_factory=lambda: ServerTraining(epochs=10, batch_size=256, lr=0.01))

        renamed: ClassVar[dict[str, str]] = {
            "server_epochs": "server.epochs", "server_lr": "server.lr", "server_batch_size": "server.batch_size"
        }

        def __post_init__(self) -> None:
            super().__post_init__()
            check(self.image_weight_decay >= 0, "image_weight_decay", self.image_weight_decay, ">= 0")
            check(self.clip_norm > 0, "clip_norm", self.clip_norm, "> 0")

    params: Params

    # ---- server ------------------------------------------------------------------------------
    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """The local model's weights (exact shapes) and a synthetic set of any size in the wire dtype."""
        if task != "train":
            return None
        spec = {MODEL + k: (tuple(v.shape), v.dtype) for k, v in server.model.state_dict().items()}
        return {**spec, **synthetic_reply_spec(self.fed.image_shape, self.params.wire_dtype)}

    def reply_scalars(self, task: str, server: ServerContext) -> dict[str, tuple[float, float | None]]:
        """A ``train`` reply also says what share of its pixel values the 8-bit encoding clamped."""
        scalars = super().reply_scalars(task, server)
        return {**scalars, **synthetic_scalars()} if task == "train" else scalars

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        """Eq. 2 (average weighted by |D_i|), then Eq. 7 (fine-tune on this round's union of S_i).

        The round's union is kept in ``server.state`` (``syn_images`` in the wire dtype, ``syn_labels``,
        ``syn_owner``), so it is checkpointed and a report can show the images the model was tuned on.
        """
        server.metrics["synthetic_images"] = 0
        server.metrics[WIRE_CLAMPED] = 0.0
        if not replies:  # every client failed: keep the model, nothing to fine-tune on
            return
        p = self.params
        states = [arrays_with_prefix(m.arrays, MODEL) for _, m in replies]
        state, replies = self.average(server, replies, states)  # [algorithm.aggregation]; outliers dropped
        server.model.load_state_dict(state)
        # This round's sets only (Sec. IV-C); the uploads are kept for `fedskew audit` (FedDC vs FedDC+).
        syn = receive_sets(server, replies, keep_others=False)
        if syn is None or p.server.epochs == 0:
            return
        res = train_global_on_synthetic(server.model, syn, p.server, server.generator("finetune"))
        server.metrics["server_loss"] = res.mean_loss

    # ---- client ------------------------------------------------------------------------------
    def gm_config(self) -> GMConfig:
        """CondensedDataTraining's settings (FedDC: no inner network training, one step per draw), in
        the run's mixed precision (``amp``)."""
        p = self.params
        return GMConfig(
            iterations=p.condense_iterations, ipc=p.ipc, image_lr=p.image_lr, momentum=p.image_momentum,
            weight_decay=p.image_weight_decay, clip_norm=p.clip_norm, real_batch=p.real_batch,
            distance=p.distance, outer_loop=1, inner_loop=0, init=p.init, amp=current_compute().amp,
        )

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        """Algorithm 1 lines 6-8: local SGD (Eq. 3), condense (lines 13-23), send both."""
        if task != "train":
            return super().client_step(task, msg, client)
        _, trained = self.local_train(msg, client)
        syn = None
        if client.num_samples > 0:
            syn = gradient_matching(
                client.x, client.y, client.fed.model.build, self.gm_config(), client.generator("condense")
            )
        arrays = {MODEL + k: v for k, v in trained.arrays.items()}
        upload, scalars = synthetic_upload(syn, client, self.params.wire_dtype)
        arrays.update(upload)
        metrics = {**trained.metrics, "synthetic_images": float(arrays[SYN_LABELS].shape[0]), **scalars}
        return Message(arrays=arrays, metrics=metrics)


@register_algorithm("feddc_plus")
class FedDCPlus(FedDC):
    """FedDC+ (Sec. IV-D): FedDC whose condensation optimiser has momentum and weight decay."""

    @dataclass
    class Params(FedDC.Params):
        image_momentum: float = 0.9  # Sec. V-A
        image_weight_decay: float = 4e-5  # Sec. V-A

    params: Params
