"""Dataset condensation by distribution matching (DM; Zhao & Bilen, WACV 2023), as used by FedDM
(Xiong et al., CVPR 2023) and FedAF (Wang et al., CVPR 2024).

Each step samples a network w', embeds real and synthetic images with its feature extractor ``h_w'``
(all layers before the last linear layer) and minimises FedAF Eq. 4 / DM Eq. 3,

    L_DM = sum_c || mean_{x in real_c} h_w'(x) - mean_{s in S_c} h_w'(s) ||^2,

over the synthetic images, plus an optional extra term (FedAF's lambda_loc * SWD on logits, Eq. 10).
How w' is drawn is the caller's choice (a ``model_sampler``): a fresh random network every step (DM),
a random point in a ball around a given model (FedDM), or an interpolation between a given model and
a random one (FedAF Eq. 17).

The real embeddings are constants of the loss: the real images of all classes are embedded without an
autograd graph (``torch.no_grad``), and only the synthetic images go forward and backward with one. The
class means are segment sums (``index_add``) divided by counts. Networks run in training mode, as in DM, so
normalisation layers use batch statistics. Where a layer couples the images of a batch (BatchNorm in
training mode, :func:`couples_batch`) there are two readings, ``DMConfig.bn_statistics``:

- ``"pooled"`` (the default; what fedskew did before issue 45): real and synthetic images of all classes
  concatenated in ONE forward pass, so the synthetic features are normalised with the same, real-dominated
  statistics as the real ones; the statistics then depend on the synthetic images, so the real embeddings
  are not constants and the backward pass runs through every real image;
- ``"separate"`` (DM's reference code, ``main_DM.py``): the real images of all classes in one pass without
  a graph, the synthetic images of all classes in another, each normalised with its own batch statistics.

Neither FedDM nor FedAF says which; docs/algorithms.md gives the measurement behind the default (on the
FedDM/FedAF quick configs "separate" lost accuracy, FedAF badly). Without a
coupling layer (instance, group or layer norm, no norm) the two readings are the same computation and the
no-graph real pass is taken; its real images then go through in chunks of :data:`REAL_CHUNK` on a CPU
(per-sample layers give the same result in any chunk, and the chunks bound the pass's memory).

Devices and precision: the real images decide the device; networks built by a factory (on the CPU)
are moved there, random draws come from the CPU generator and are moved (:mod:`fedskew.core.device`),
so a seed gives the same draws on every device. ``DMConfig.amp`` runs the networks' forward passes
under autocast (``"bf16"``, or ``"fp16"`` with a gradient scaler on CUDA); the images, their optimiser
and the loss's class means stay float32. With ``amp = "off"`` a step is exactly the float32 step.

Speed: the samplers around a given model reuse one network (its weights overwritten at every step)
instead of building one per step, and a sampler draws from the generator exactly what building a new
network drew, so the results are those of a new network per step, bit for bit (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedskew.condense.augment import DSAConfig, apply_dsa, sample_dsa_params
from fedskew.condense.samplers import ModelSampler
from fedskew.condense.synthetic import (
    SynthesisOptions,
    SyntheticSet,
    backward_to,
    check_choice,
    check_data,
    check_init,
    class_indices,
    model_device,
    model_features,
    sample_indices,
    start_set,
)
from fedskew.core.device import Precision
from fedskew.core.errors import ConfigError, DataError
from fedskew.core.handoff import say_unbatched
from fedskew.core.params import minimums
from fedskew.models.layout import as_model_format, is_channels_last, use_channels_last
from fedskew.progress import progress_bar

ExtraLoss = Callable[[nn.Module, SyntheticSet], torch.Tensor]
"""``extra_loss(model, syn)``: a term added to L_DM; ``syn.images`` is the (un-augmented) leaf tensor
being optimised, so gradients reach it."""


BN_STATISTICS = ("separate", "pooled")
"""The readings of batch statistics in distribution matching (``DMConfig.bn_statistics``)."""


class DMConfig(SynthesisOptions):
    """Distribution-matching settings (defaults: DM, except ``iterations``: FedAF/FedDM's 1000 steps).

    Attributes
    ----------
    iterations
        Matching steps, one network sample each (FedAF/FedDM: 1000; DM: 20,000).
    ipc
        Synthetic images per class (DM: 1/10/50; FedAF: 50).
    image_lr
        SGD learning rate of the images (DM and FedAF CIFAR-10: 1.0).
    momentum
        SGD momentum (DM: 0.5; FedAF: 0.9).
    real_batch
        Real images per class per step, all of the class's if fewer (DM, FedAF: 256).
    init
        See :func:`init_synthetic` (DM: ``"real"``; FedAF: ``"mean"``).
    dsa
        Siamese augmentation, one draw per class shared by its real and synthetic batch (DM uses DSA;
        ``None``: off).
    clip_norm
        Clip the norm of the whole image gradient (all classes together) to this value before each step
        (FedDM: 2.0; ``None``: off, as in DM).
    bn_statistics
        Where the network normalises with batch statistics (BatchNorm): ``"separate"`` (real and synthetic
        images in passes of their own, DM's reference code) or ``"pooled"`` (one pass of both); see the
        module's docstring. No effect on networks without BatchNorm.
    amp
        See :class:`SynthesisOptions`.
    """

    at_least = minimums(iterations=0, ipc=1, real_batch=1)
    positive = ("clip_norm",)

    iterations: int = 1000
    ipc: int = 10
    image_lr: float = 1.0
    momentum: float = 0.5
    real_batch: int = 256
    init: str = "real"
    dsa: DSAConfig | None = None
    clip_norm: float | None = None
    bn_statistics: str = "pooled"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_init(self.init)
        check_choice("bn_statistics", self.bn_statistics, BN_STATISTICS)


def dm_loss(
    model_features: nn.Module,
    real_by_class: Sequence[torch.Tensor],
    syn_by_class: Sequence[torch.Tensor],
    bn_statistics: str = "pooled",
) -> torch.Tensor:
    """FedAF Eq. 4: ``sum_c || mean h(real_c) - mean h(syn_c) ||^2``.

    The real class means are embedded without a graph (:func:`real_class_means`) and only the synthetic
    images carry one, unless ``bn_statistics`` is ``"pooled"`` and the network couples its batch
    (:func:`couples_batch`): then real and synthetic go through one forward pass together.

    Parameters
    ----------
    model_features
        The embedding network h, mapping (B, C, H, W) to (B, D).
    real_by_class, syn_by_class
        Per class (same order, same length), its real and synthetic images; each must be non-empty.
    bn_statistics
        ``"separate"`` or ``"pooled"`` (:data:`BN_STATISTICS`; see the module's docstring).
    """
    if len(real_by_class) != len(syn_by_class) or not real_by_class:
        raise DataError(f"{len(real_by_class)} real vs {len(syn_by_class)} synthetic class batches")
    if any(t.shape[0] == 0 for t in (*real_by_class, *syn_by_class)):
        raise DataError("every class needs at least one real and one synthetic image")
    if bn_statistics not in BN_STATISTICS:
        raise ConfigError(f"bn_statistics must be one of {', '.join(BN_STATISTICS)}, got {bn_statistics!r}")
    num = len(real_by_class)
    coupled = couples_batch(model_features)
    if bn_statistics == "pooled" and coupled:
        groups = [*real_by_class, *syn_by_class]
        # Under autocast the embedding may be bf16/fp16; the class means are float32 sums (a no-op in
        # float32, and float64 stays float64).
        emb = at_least_float32(model_features(torch.cat([t.detach() for t in real_by_class] + list(syn_by_class))))
        means = segment_means(emb, [t.shape[0] for t in groups])
        return ((means[:num] - means[num:]) ** 2).sum()
    real = real_class_means(model_features, real_by_class, coupled)
    syn = segment_means(at_least_float32(model_features(torch.cat(list(syn_by_class)))),
                        [t.shape[0] for t in syn_by_class])
    return ((real - syn) ** 2).sum()


REAL_CHUNK = 128
"""Real images a forward pass of :func:`real_class_means` on a CPU, for networks that do not couple their batch
(a width-128 ConvNet's first activation of 128 Fashion-MNIST images is 67 MB). The issue-45 DM step, one thread,
freed memory kept (``python benchmarks/inner_loops.py --loops dm --steps 3 --real-chunk N``, 2026-11-27):
3.70 CPU-s a step and 756 MB peak resident memory with chunks of 128, 3.71 CPU-s and 886 MB with 256. Other
devices take a class batch set in one pass (fewer launches; their memory holds it)."""


def couples_batch(net: nn.Module) -> bool:
    """Whether ``net``'s output for one image depends on the other images of its batch: it has a BatchNorm
    layer that normalises with batch statistics (in training mode, or without running statistics). Instance,
    group and layer norms act per image. A custom layer that mixes images is not recognised."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and (m.training or m.running_mean is None)
               for m in net.modules())


def segment_means(emb: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    """The means of consecutive row segments of ``emb`` of sizes ``counts``: ``(len(counts), D)``."""
    # The segments are made on the CPU and moved without waiting (a repeat_interleave on the GPU would
    # read its counts back to size its output: a host sync every step).
    sizes = torch.tensor(list(counts))
    segment = torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(emb.device, non_blocking=True)
    sums = torch.zeros((len(sizes), emb.shape[1]), dtype=emb.dtype, device=emb.device)
    return sums.index_add(0, segment, emb) / sizes.to(emb.device, emb.dtype, non_blocking=True)[:, None]


def real_class_means(
    model_features: nn.Module, real_by_class: Sequence[torch.Tensor], coupled: bool
) -> torch.Tensor:
    """The class means ``mean h(real_c)`` as constants (no autograd graph), float32 or float64.

    A network that couples its batch (``coupled``: :func:`couples_batch`) embeds all classes in one pass (DM's
    reference code); otherwise, on a CPU, the images go through in chunks of :data:`REAL_CHUNK`."""
    counts = [t.shape[0] for t in real_by_class]
    with torch.no_grad():
        x = torch.cat(list(real_by_class))
        if coupled or x.device.type != "cpu" or x.shape[0] <= REAL_CHUNK:
            return segment_means(at_least_float32(model_features(x)), counts)
        emb = torch.cat([at_least_float32(model_features(x[i : i + REAL_CHUNK]))
                         for i in range(0, x.shape[0], REAL_CHUNK)])
        return segment_means(emb, counts)


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or as it is when it is float64."""
    return t if t.dtype == torch.float64 else t.float()


def image_dtype(x_real: torch.Tensor) -> torch.dtype:
    """The dtype the synthetic images are optimised in: float32, or float64 for float64 real images."""
    return torch.float64 if x_real.dtype == torch.float64 else torch.float32


def _clip_total(grad: torch.Tensor, max_norm: float) -> None:
    """Scale ``grad`` in place to norm ``max_norm`` if it is larger (FedDM's gradient clipping).

    On the device, without reading the norm back: the scale ``max_norm / norm`` is computed in float64 (as
    a Python float was) and is 1 where the norm is within bounds, so the result is the same, bit for bit.
    """
    norm = grad.norm().double()
    grad.mul_(torch.where(norm > max_norm, max_norm / norm, torch.ones_like(norm)))


def image_step(loss: torch.Tensor, images: torch.Tensor, optimizer: torch.optim.Optimizer, precision: Any,
               clip_norm: float | None) -> None:
    """One step of the synthetic ``images`` on ``loss``: gradients to them only, their total norm clipped to
    ``clip_norm`` (None: not clipped), the optimiser's step (through ``precision``'s scaler)."""
    optimizer.zero_grad()
    backward_to(loss, [images], precision)
    if clip_norm is not None and images.grad is not None:
        precision.unscale(optimizer)
        _clip_total(images.grad, clip_norm)
    precision.step(optimizer)


DM_UNBATCHED = ("distribution matching has no batched form: each client's matching runs in its job; on a GPU, "
                "worker processes (workers_per_device) run clients side by side (docs/performance.md, "
                "\"Batched condensation\")")
"""What a batched runner is told when distribution matching runs (:func:`fedskew.core.handoff.say_unbatched`)."""


def distribution_matching(
    x_real: torch.Tensor,
    y_real: torch.Tensor,
    model_sampler: ModelSampler,
    cfg: DMConfig,
    generator: torch.Generator,
    init_set: SyntheticSet | None = None,
    extra_loss: ExtraLoss | None = None,
    progress: bool = False,
) -> SyntheticSet:
    """Condense ``(x_real, y_real)`` by distribution matching.

    Parameters
    ----------
    x_real, y_real
        Real images (N, C, H, W), normalised, and labels; the condensation runs on their device.
    model_sampler
        ``model_sampler(step, generator)`` gives the network of each step (see
        :func:`random_model_sampler`, :func:`perturbed_model_sampler`,
        :func:`interpolated_model_sampler`); it must have a ``features`` sub-module. The network is
        moved to the data's device, put in training mode and its parameters frozen; a sampler may
        return the same network every step with new weights (each step is done with it before the
        next draw).
    cfg
        Settings.
    generator
        The only source of randomness.
    init_set
        Start from this set (FedAF keeps S_k across rounds) instead of :func:`init_synthetic`; each of
        its classes must have real images. Its soft labels, if any, are passed through.
    extra_loss
        Added to L_DM at every step, called as ``extra_loss(model, syn)`` with the step's network and
        the current set (its images require grad), e.g. FedAF's ``lambda_loc * sum_c SWD``.
    progress
        Show a progress bar on stderr (plain lines when it is not a terminal).

    Returns
    -------
    SyntheticSet
        On the data's device, float32 (float64 for float64 real images). With ``init_set``: its labels
        and order. Otherwise the classes of ``y_real`` in increasing order, ``cfg.ipc`` images each.

    Under a batched runner (``clients_in_parallel``) each client's matching runs here, one client at a time,
    and the runner says so once (:data:`DM_UNBATCHED`).
    """
    device = x_real.device
    precision = Precision(device, cfg.amp)  # refuses fp16 off CUDA in one line
    plan = dm_start(x_real, y_real, cfg, generator, init_set)
    say_unbatched(DM_UNBATCHED)
    real_indices, syn_indices, labels = plan.real_indices, plan.syn_indices, plan.labels
    images = plan.start.requires_grad_(True)
    optimizer = torch.optim.SGD([images], lr=cfg.image_lr, momentum=cfg.momentum)
    bar = progress_bar(range(cfg.iterations), desc="distribution matching", enabled=progress)
    for step in bar:
        model = prepared(model_sampler(step, generator), device)
        cl = is_channels_last(model)
        real, syn = [], []
        for r_idx, s_idx in zip(real_indices, syn_indices, strict=True):
            x_r, x_s = x_real[sample_indices(r_idx, cfg.real_batch, generator)], images[s_idx]
            if cfg.dsa is not None:
                draw = sample_dsa_params(cfg.dsa, None, generator)
                x_r, x_s = apply_dsa(x_r, draw), apply_dsa(x_s, draw)
            real.append(as_model_format(x_r, cl))
            syn.append(as_model_format(x_s, cl))
        with precision.autocast():
            loss = dm_loss(model_features(model), real, syn, cfg.bn_statistics)
            if extra_loss is not None:
                loss = loss + extra_loss(model, SyntheticSet(images, labels, plan.soft_labels))
        image_step(loss, images, optimizer, precision, cfg.clip_norm)
        if progress:  # reading the loss waits for the device
            bar.set_postfix(loss=float(loss.detach()), refresh=False)
    return plan.result(images)


def dm_start(
    x_real: torch.Tensor,
    y_real: torch.Tensor,
    cfg: DMConfig,
    generator: torch.Generator,
    init_set: SyntheticSet | None = None,
) -> DMStart:
    """What :func:`distribution_matching` (and the private matching) does before its steps: the start set drawn
    from ``generator`` unless given, the classes' rows found."""
    device = x_real.device
    if init_set is None:
        init_set = start_set(x_real, y_real, cfg.ipc, cfg.init, generator)
    else:
        check_data(x_real, y_real)
        if init_set.images.shape[1:] != x_real.shape[1:]:
            raise DataError(f"init_set images {tuple(init_set.images.shape[1:])} vs real {tuple(x_real.shape[1:])}")
    classes = list(init_set.by_class())
    real_indices = class_indices(y_real, classes)
    labels = init_set.labels.to(device).clone()
    syn_indices = [torch.nonzero(labels == c).flatten() for c in classes]
    start = init_set.images.detach().to(device).clone().to(image_dtype(x_real))
    return DMStart(real_indices, syn_indices, labels, start, init_set.soft_labels)


def prepared(model: nn.Module, device: torch.device) -> nn.Module:
    """A step's network as the matching runs it: on ``device``, channels-last, in training mode, frozen."""
    if model_device(model) != device:
        model.to(device)
    # Channels-last networks and batches: the step runs faster on CPU (benchmarks/kernels.py);
    # results equal the NCHW ones up to float rounding. A reused network is converted once.
    if not is_channels_last(model):
        use_channels_last(model)
    model.train()
    model.requires_grad_(False)
    return model


@dataclass
class DMStart:
    """One client's distribution matching before its steps (:func:`dm_start`).

    At every step the matching draws from its generator the step's network, then for each class in turn its real
    batch (:func:`~fedskew.condense.synthetic.sample_indices` of ``real_indices[j]``) and its DSA draw. ``start``
    holds the first images (float32, or float64 for float64 real data; not a leaf of any graph),
    ``syn_indices[j]`` the rows of the j-th class in it.
    """

    real_indices: list[torch.Tensor]
    syn_indices: list[torch.Tensor]
    labels: torch.Tensor
    start: torch.Tensor
    soft_labels: torch.Tensor | None

    def result(self, images: torch.Tensor) -> SyntheticSet:
        """The condensed set with ``images`` (the optimised start)."""
        return SyntheticSet(images.detach(), self.labels, self.soft_labels)
