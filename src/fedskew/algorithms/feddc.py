"""FedDC and FedDC+ (Kim & Choi 2022, "Stable Federated Learning with Dataset Condensation",
Algorithm 1). Not the drift-decoupling FedDC of Gao et al. (CVPR 2022).

Problem: with label-skewed clients and partial participation, each round's pooled class histogram is
skewed ("temporary imbalance"), so the averaged model swings from round to round. Each selected client
therefore also condenses its data into one synthetic image per class it holds (gradient matching,
Eq. 6, clipped by Eq. 8) and uploads it with its model; the server averages the models (Eq. 2) and
fine-tunes the average on the union of *this round's* condensed sets (Eq. 7), which is roughly class
balanced whatever the clients' histograms. FedDC+ only changes the condensation optimiser (momentum
0.9, weight decay 4e-5), giving noisier, less recognisable images (Sec. IV-D).

Two readings (issue 38, docs/algorithms.md): ``reading = "paper"`` (the default) fills what the paper
leaves out from DC's defaults; ``reading = "authors_code"`` sets every condensation and server setting
as the authors' public code (bigdata-inha/FedDC, ``update_dc.py`` and ``test_dd.py``) has them: real
initialisation, mixed-class batches of 50, DC's distance, outer loop 3 / inner loop 1, image SGD 0.5 /
0.5, no clipping, a matching network interpolated between the local and the global model, server SGD
batch 64 with weight decay 1e-3, float32 uploads. As committed, that code runs no matching iteration at
all (``Iteration = -1``): ``reading = "authors_code"`` with ``condense_iterations = 0``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, ClassVar, Literal

import torch
from torch import nn

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
from fedskew.core.params import minimums
from fedskew.privacy.uploads import Withheld

# The FedDC authors' code (bigdata-inha/FedDC at c90c48f), file:line of each setting; docs/algorithms.md.
AUTHORS_CODE: dict[str, Any] = {
    "init": "real",  # update_dc.py:397-399, one random real image of each held class
    "ipc": 1,  # update_dc.py:155
    "distance": "dc",  # update_dc.py:798-851 (DC's layer-wise distance, 1-D tensors ignored)
    "match_batches": "mixed",  # update_dc.py:453-458, batches of the whole local set, all classes
    "real_batch": 50,  # update_dc.py:390-391
    "outer_loop": 3,  # update_dc.py:389
    "inner_loop": 1,  # update_dc.py:389, 494-495 (one epoch on the synthetic set: one step here)
    "image_lr": 0.5,  # update_dc.py:382
    "image_momentum": 0.5,  # update_dc.py:382
    "image_weight_decay": 0.0,  # update_dc.py:382
    "clip_norm": 0.0,  # no clipping anywhere in update_dc.py
    "match_network": "interpolated",  # update_dc.py:401-431, 922-931
    "net_lr": 0.01,  # update_dc.py:440
    "net_momentum": 0.5,  # update_dc.py:440
    "wire_dtype": "float32",  # update_dc.py:516-521 (float tensors handed to the server)
    "weight_decay": 1e-3,  # update_dc.py:115 (local SGD)
    "server": {"epochs": 10, "lr": 0.01, "momentum": 0.0, "weight_decay": 1e-3, "batch_size": 64},
    # test_dd.py:538-627 (server_fine_tuning; epochs: args.server_epoch = 10 in the FedDC notebooks)
}


def interpolate(
    local: Mapping[str, torch.Tensor], global_: Mapping[str, torch.Tensor], ratio: float
) -> dict[str, torch.Tensor]:
    """``ratio * global + (1 - ratio) * local`` for every floating tensor (the authors'
    ``interpolation_model``, update_dc.py:922-931); other tensors (counters) are the local model's."""
    return {
        k: torch.lerp(v, global_[k].to(v.device, v.dtype), ratio) if v.is_floating_point() else v.clone()
        for k, v in local.items()
    }


def interpolated_networks(
    build: Callable[[], nn.Module],
    local: Mapping[str, torch.Tensor],
    global_: Mapping[str, torch.Tensor],
    generator: torch.Generator,
) -> Callable[[], nn.Module]:
    """A network factory for the matching loop: the i-th call returns ``interpolate(local, global_, r_i)``,
    with ``r`` a shuffled ``0, 0.01, ..., 0.99`` drawn once from ``generator`` and taken in turn
    (update_dc.py:401-402, 428-431)."""
    ratios = itertools.cycle((torch.randperm(100, generator=generator) / 100).tolist())

    def factory() -> nn.Module:
        net = build()
        net.load_state_dict(interpolate(local, global_, next(ratios)))
        return net

    return factory


@register_algorithm("feddc")
class FedDC(FedAvg):
    """FedAvg + per-client gradient-matching condensation + server fine-tuning on this round's sets."""

    paper = (
        'Kim & Choi 2022, "Stable Federated Learning with Dataset Condensation" (dataset condensation; not the '
        'drift-correcting FedDC of Gao et al., CVPR 2022)'
    )
    unbatched_client_work = "gradient matching"

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
        # How a matching step draws its real images (per_class: Algorithm 1 line 17; mixed: the authors'
        # code, real_batch then sizes each mixed batch), which network it matches on (fresh: Algorithm 1
        # line 14; interpolated: the authors' code), and DC's network training between steps.
        match_batches: Literal["per_class", "mixed"] = "per_class"
        match_network: Literal["fresh", "interpolated"] = "fresh"
        outer_loop: int = 1
        inner_loop: int = 0
        net_lr: float = 0.01
        net_momentum: float = 0.0
        # "paper": the settings above; "authors_code": AUTHORS_CODE under the keys a config gives itself.
        reading: Literal["paper", "authors_code"] = "paper"
        # Server fine-tuning, Eq. 7 and Sec. V-A: 10 epochs, lr 0.01 (the clients' lr); batch not
        # given: 256 is usually the whole round's set (10 clients x <= 10 images).
        server: ServerTraining = field(default_factory=lambda: ServerTraining(epochs=10, batch_size=256, lr=0.01))

        renamed: ClassVar[dict[str, str]] = {
            "server_epochs": "server.epochs", "server_lr": "server.lr", "server_batch_size": "server.batch_size"
        }
        presets: ClassVar[dict[str, dict[str, dict[str, Any]]]] = {"reading": {"authors_code": AUTHORS_CODE}}

        # clip_norm 0: off
        at_least = minimums(image_weight_decay=0, clip_norm=0, inner_loop=0, net_momentum=0, outer_loop=1)

    params: Params
    upload = Withheld("condensed images", use='privacy.mode = "condensation"')

    not_sum_only = (
        "uploads condensed images, which the server must see one by one to train on them; SecAgg+ reveals only the "
        "sum of the uploads"
    )

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
            weight_decay=p.image_weight_decay, clip_norm=p.clip_norm or None, real_batch=p.real_batch,
            distance=p.distance, outer_loop=p.outer_loop, inner_loop=p.inner_loop, net_lr=p.net_lr,
            net_momentum=p.net_momentum, batches=p.match_batches, init=p.init, amp=current_compute().amp,
        )

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        """Algorithm 1 lines 6-8: local SGD (Eq. 3), condense (lines 13-23), send both."""
        if task != "train":
            return super().client_step(task, msg, client)
        _, trained = self.local_train(msg, client)
        syn = None
        if client.num_samples > 0:
            generator = client.generator("condense")
            networks = client.fed.model.build
            if self.params.match_network == "interpolated":
                networks = interpolated_networks(networks, trained.arrays, msg.arrays, generator)
            syn = gradient_matching(client.x, client.y, networks, self.gm_config(), generator)
        arrays = {MODEL + k: v for k, v in trained.arrays.items()}
        upload, scalars = synthetic_upload(syn, client, self.params.wire_dtype)
        arrays.update(upload)
        metrics = {**trained.metrics, "synthetic_images": float(arrays[SYN_LABELS].shape[0]), **scalars}
        return Message(arrays=arrays, metrics=metrics)


@register_algorithm("feddc_plus")
class FedDCPlus(FedDC):
    """FedDC+ (Sec. IV-D): FedDC whose condensation optimiser has momentum and weight decay."""

    paper = (
        'Kim & Choi 2022, "Stable Federated Learning with Dataset Condensation", FedDC+ (dataset condensation; '
        'not the drift-correcting FedDC of Gao et al., CVPR 2022: `feddc_drift`)'
    )

    class Params(FedDC.Params):
        image_momentum: float = 0.9  # Sec. V-A
        image_weight_decay: float = 4e-5  # Sec. V-A

    params: Params
