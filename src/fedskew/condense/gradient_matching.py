"""Dataset condensation by gradient matching (DC; Zhao, Mopuri & Bilen, ICLR 2021), as used by FedDC.

"FedDC" here is Kim & Choi 2022, "Stable Federated Learning with Dataset Condensation" (not the drift
decoupling method of Gao et al., CVPR 2022). Its CondensedDataTraining (Algorithm 1, lines 13-23):
for K iterations, draw a fresh network theta ~ P_theta; for every class c, compute the cross-entropy
gradients of a real minibatch of c and of the synthetic images S_c, and take an SGD step on S_c that
lowers the layer-wise distance D of Eq. 6; the image gradient is clipped to norm v (Eq. 8). FedDC drops
DC's inner training of theta (``inner_loop=0``); FedDC+ adds momentum 0.9 and weight decay 4e-5 to the
image optimiser (only a configuration).

DC's schedule is also available: with ``inner_loop > 0`` each network draw serves ``outer_loop``
matching steps, and after each of them (but the last) the network is trained for ``inner_loop`` SGD
steps on the current synthetic set. With ``batches="mixed"`` (the FedDC authors' code, issue 38) a
matching step is instead a shuffled pass over the whole real set in batches of ``real_batch`` images of
any classes, each batch's gradient matched against that of the whole synthetic set, one image step per
batch (:func:`_mixed_pass`).

Per-class gradients need one backward pass per class: the real gradients are computed class after
class, each with its own forward pass, as in DC and FedDC's Algorithm 1. The synthetic side (a
second-order term: the gradient of a distance between gradients) costs most with the small batches of
condensation; for networks built from the layers in ``_BATCHABLE`` (no BatchNorm, no LayerNorm) it is
computed for all classes at once, with ``torch.func.vmap`` over classes of ``torch.func.grad`` and one
backward pass to the images (:func:`_batched_syn_distances`). That is the loop's arithmetic (each class
its own batch), so the result agrees with the loop up to float rounding (tested in float64); a FedDC
client with several classes condenses about 1.2-1.3x faster (docs/performance.md). One-class
clients and other networks keep the loop, which also keeps batch statistics per class; note that a
BatchNorm1d layer cannot run on a single-image class (``ipc=1``): DC's ConvNet uses instance
normalisation for this reason. Real batches go to the network in the channels-last memory format, as
in local training.

Devices and precision: the condensation runs on the real images' device; networks are built on the CPU
and moved, draws are made on the CPU and moved (:mod:`fedskew.core.device`). ``GMConfig.amp`` runs the
forward passes under autocast; gradients, distances and images stay float32 (``"off"``: exactly the
float32 computation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedskew.condense.augment import DSAConfig, apply_dsa, dsa, sample_dsa_params
from fedskew.condense.synthetic import (
    ModelFactory,
    SynthesisOptions,
    SyntheticSet,
    backward_to,
    check_choice,
    check_init,
    class_indices,
    fresh_model,
    sample_indices,
    start_set,
)
from fedskew.core.device import Precision
from fedskew.core.errors import ConfigError
from fedskew.core.handoff import say_unbatched
from fedskew.core.params import minimums
from fedskew.models.layout import as_model_format, is_channels_last, use_channels_last
from fedskew.progress import progress_bar

DISTANCES = ("dc", "cosine")
BATCHES = ("per_class", "mixed")
_EPS = 1e-12


class GMConfig(SynthesisOptions):
    """Gradient-matching settings (defaults: FedDC, Kim & Choi 2022, Sec. V).

    Attributes
    ----------
    iterations
        K, the number of network draws (FedDC: 500).
    ipc
        Synthetic images per class (FedDC: 1).
    image_lr
        SGD learning rate of the images (FedDC: 3.0).
    momentum, weight_decay
        Image optimiser (FedDC: 0, 0; FedDC+: 0.9, 4e-5).
    clip_norm
        v of Eq. 8: a class's image gradient g becomes ``g v / ||g||`` when ``||g|| > v``; ``None``
        disables clipping. FedDC does not give v; 10 is our default.
    real_batch
        Real images per class per step (all of the class's images if it has fewer). FedDC does not give
        it; 256 is DC's ``batch_real``. With ``batches="mixed"``: the size of each mixed batch.
    batches
        ``"per_class"`` (DC, FedDC's Algorithm 1): each class's real batch against its own synthetic
        images, one image step per matching step. ``"mixed"`` (the FedDC authors' code): a matching step
        is a shuffled pass over the whole real set in batches of ``real_batch`` images of any classes,
        each matched against the whole synthetic set and followed by an image step.
    distance
        ``"cosine"``: FedDC Eq. 6, per parameter tensor ``1 - cos`` of the flattened gradients, summed.
        ``"dc"``: DC's distance, per output unit (row of the weight gradient reshaped to
        ``(out, -1)``) ``1 - cos``, summed over units and layers, 1-D tensors (biases, norm affine
        parameters) ignored. See :func:`match_distance`.
    outer_loop
        Matching steps per network draw (DC: 1 for ipc=1, 10 for ipc=10; FedDC: 1).
    inner_loop
        SGD steps that train the network on the synthetic set after each matching step except the
        last of a draw (DC: 1 for ipc=1, 50 for ipc=10; FedDC: 0, no network training).
    net_lr, net_momentum
        SGD learning rate and momentum of those network steps (DC: 0.01 and 0; the FedDC authors' code:
        0.01 and 0.5). One optimiser per network draw, so momentum carries over between its steps.
    init
        Initialisation of the images, see :func:`init_synthetic` (FedDC: ``"noise"``).
    dsa
        Differentiable Siamese augmentation of each class's real and synthetic batch with one shared
        draw (``None``: off, as in FedDC).
    amp
        See :class:`SynthesisOptions`.
    """

    at_least = minimums(iterations=0, inner_loop=0, ipc=1, real_batch=1, outer_loop=1, net_momentum=0)
    positive = ("clip_norm",)

    iterations: int = 500
    ipc: int = 1
    image_lr: float = 3.0
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float | None = 10.0
    real_batch: int = 256
    distance: str = "cosine"
    outer_loop: int = 1
    inner_loop: int = 0
    net_lr: float = 0.01
    net_momentum: float = 0.0
    batches: str = "per_class"
    init: str = "noise"
    dsa: DSAConfig | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("distance", self.distance, DISTANCES)
        check_init(self.init)
        check_choice("batches", self.batches, BATCHES)


def _one_minus_cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``1 - cos`` along the last dimension; the norm product is floored to avoid 0/0."""
    dot = (a * b).sum(dim=-1)
    return 1.0 - dot / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(_EPS)


def match_distance(g_syn: Sequence[torch.Tensor], g_real: Sequence[torch.Tensor], kind: str) -> torch.Tensor:
    """Layer-wise distance between two lists of parameter gradients (same order and shapes).

    ``kind="cosine"`` (FedDC Eq. 6): ``sum_l 1 - cos(vec g_S^l, vec g_D^l)`` with every parameter tensor
    (weights and biases alike) one term l. ``kind="dc"`` (DC, Sec. 3.2 / its code): each gradient of
    two or more dimensions is reshaped to ``(out, -1)`` (a conv kernel ``(out, in, h, w)`` to
    ``(out, in h w)``) and contributes ``sum_i 1 - cos(row_i^S, row_i^D)``; 1-D tensors contribute
    nothing. Both are 0 for identical (non-zero) gradients. Unlike DC's ``+1e-6`` in the
    denominator, the norm product is floored at 1e-12, so identical gradients give 0 exactly (up to
    rounding).
    """
    if kind not in DISTANCES:
        raise ConfigError(f"distance must be one of {DISTANCES}, got {kind!r}")
    if len(g_syn) != len(g_real):
        raise ValueError(f"{len(g_syn)} synthetic vs {len(g_real)} real gradient tensors")
    total = torch.zeros((), device=g_syn[0].device if g_syn else None)
    for gs, gr in zip(g_syn, g_real, strict=True):
        if kind == "cosine":
            total = total + _one_minus_cos(gs.flatten(), gr.flatten())
        elif gs.dim() > 1:
            total = total + _one_minus_cos(gs.reshape(gs.shape[0], -1), gr.reshape(gr.shape[0], -1)).sum()
    return total


# Leaf layers whose second derivative under ``vmap`` matches the class-by-class loop (checked in float64
# against the loop, which agrees with finite differences). Not LayerNorm: its second derivative under
# torch.func.grad is off by ~1e-3 relative in torch 2.13 (its kernel's saved statistics carry no autograd
# history; pytorch/pytorch#176234); not BatchNorm: its statistics need the whole batch.
_BATCHABLE = (
    nn.Conv2d, nn.Linear, nn.ReLU, nn.LeakyReLU, nn.Sigmoid, nn.SiLU,
    nn.MaxPool2d, nn.AvgPool2d, nn.Flatten, nn.GroupNorm, nn.Identity,
)


def batchable(net: nn.Module) -> bool:
    """Whether every leaf layer of ``net`` is one the batched synthetic-side pass supports."""
    return all(type(m) in _BATCHABLE for m in net.modules() if not list(m.children()))


def _batched_syn_distances(
    net: nn.Module,
    x_syn: torch.Tensor,
    y_syn: torch.Tensor,
    real_grads: Sequence[Sequence[torch.Tensor]],
    kind: str,
) -> torch.Tensor:
    """Each class's distance D(g_S, g_D) (Eq. 6), computed for all classes in one pass.

    ``x_syn`` is (classes, ipc, C, H, W), ``y_syn`` (classes, ipc) and ``real_grads[k]`` the real
    gradients of class k, in the order of ``net``'s trainable parameters. The synthetic gradients come
    from ``vmap`` over classes of ``torch.func.grad`` of the class's mean cross-entropy (each class a
    batch of its own, as in the loop) and stay differentiable with respect to ``x_syn``. Returns the
    (classes,) distances; their sum's gradient reaches the images.
    """
    named = {n: p.detach() for n, p in net.named_parameters() if p.requires_grad}
    names = list(named)

    def class_loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(net, p, (x,)), y)

    g_syn = vmap(grad(class_loss), in_dims=(None, 0, 0))(named, x_syn, y_syn)
    n = x_syn.shape[0]
    total = torch.zeros(n, device=x_syn.device)
    for i, name in enumerate(names):
        gs = g_syn[name]
        gr = torch.stack([g[i] for g in real_grads])
        if kind == "cosine":
            total = total + _one_minus_cos(gs.reshape(n, -1), gr.reshape(n, -1))
        elif gs.dim() > 2:
            rows = gs.shape[1]
            total = total + _one_minus_cos(gs.reshape(n, rows, -1), gr.reshape(n, rows, -1)).sum(dim=1)
    return total


def _clip_per_class(grad: torch.Tensor, num_classes: int, max_norm: float) -> None:
    """FedDC Eq. 8 on each class's image gradient in place: ``g <- g v / ||g||`` if ``||g|| > v``.

    Algorithm 1 updates each S_c separately, so the norm is that of the class's own gradient.
    """
    per_class = grad.view(num_classes, -1)
    norms = per_class.norm(dim=1, keepdim=True)
    per_class.mul_(torch.where(norms > max_norm, max_norm / norms.clamp_min(_EPS), torch.ones_like(norms)))


GM_UNBATCHED = ("gradient matching has no batched form yet: each client's matching and network training "
                "run in its job (docs/performance.md, \"Batched condensation\")")
"""What a batched runner is told when gradient matching runs (:func:`fedskew.core.handoff.say_unbatched`)."""


def gradient_matching(
    x_real: torch.Tensor,
    y_real: torch.Tensor,
    model_factory: ModelFactory,
    cfg: GMConfig,
    generator: torch.Generator,
    progress: bool = False,
    batched_ok: bool = True,
) -> SyntheticSet:
    """Condense ``(x_real, y_real)`` into ``cfg.ipc`` images per present class by gradient matching.

    Parameters
    ----------
    x_real, y_real
        Real images (N, C, H, W) in the normalised space and their labels; every label must be a valid
        output index of the networks. The condensation runs on their device.
    model_factory
        ``model_factory()`` returns a new randomly initialised network (weights from the global RNG);
        it is called inside :func:`fresh_model`, seeded from ``generator``, once per iteration, and
        the network is moved to the data's device.
    cfg
        Settings.
    generator
        The only source of randomness: same seed, same result.
    progress
        Show a progress bar on stderr (plain lines when it is not a terminal).
    batched_ok
        Compute the synthetic side for all classes at once when there are two or more classes and
        every layer of the network allows it (:func:`batchable`; the default; same result up to float
        rounding). ``False`` forces the class-by-class loop (the reference the tests compare against).

    Returns
    -------
    SyntheticSet
        Images of the classes present in ``y_real``, in increasing label order, ``ipc`` each; float32,
        on the data's device.
    """
    say_unbatched(GM_UNBATCHED)
    device = x_real.device
    precision = Precision(device, cfg.amp)  # refuses fp16 off CUDA in one line
    syn = start_set(x_real, y_real, cfg.ipc, cfg.init, generator)
    classes = list(syn.by_class())
    indices = class_indices(y_real, classes)
    images = syn.images.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([images], lr=cfg.image_lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    targets = [torch.full((cfg.ipc,), c, dtype=torch.int64, device=device) for c in classes]
    net_precision = Precision(device, cfg.amp)  # the inner loop's own scaler (another optimiser)
    bar = progress_bar(range(cfg.iterations), desc="gradient matching", enabled=progress)
    for _ in bar:
        net = use_channels_last(fresh_model(model_factory, generator, device))
        net.train()
        params = [p for p in net.parameters() if p.requires_grad]
        # One optimiser a draw: with momentum 0 (DC) the same steps as a new one per inner loop.
        net_optimizer = torch.optim.SGD(params, lr=cfg.net_lr, momentum=cfg.net_momentum)
        batched = batched_ok and len(classes) > 1 and batchable(net)
        for step in range(cfg.outer_loop):
            if cfg.batches == "mixed":
                total = _mixed_pass(
                    net, params, x_real, y_real, images, syn.labels, cfg, generator, optimizer, precision, progress
                )
            else:
                total = _per_class_step(
                    net, params, x_real, images, classes, indices, targets,
                    cfg, generator, optimizer, precision, batched, progress,
                )  # fmt: skip
            bar.set_postfix(distance=total / len(classes), refresh=False)
            if cfg.inner_loop > 0 and step < cfg.outer_loop - 1:
                _train_network(net, net_optimizer, images.detach(), syn.labels, cfg, generator, net_precision)
    return SyntheticSet(images.detach(), syn.labels)


def _per_class_step(
    net: nn.Module,
    params: list[nn.Parameter],
    x_real: torch.Tensor,
    images: torch.Tensor,
    classes: list[int],
    indices: list[torch.Tensor],
    targets: list[torch.Tensor],
    cfg: GMConfig,
    generator: torch.Generator,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    batched: bool,
    read: bool,
) -> float:
    """One matching step of DC and FedDC's Algorithm 1: each class's real batch against its own synthetic
    images, then one (clipped) image step. Returns the summed distance when ``read`` (reading it waits for
    the device), else 0."""
    device = x_real.device
    cl = is_channels_last(net)
    optimizer.zero_grad()
    total = 0.0
    syn_batches: list[torch.Tensor] = []
    real_grads: list[tuple[torch.Tensor, ...]] = []
    for k, (c, idx) in enumerate(zip(classes, indices, strict=True)):
        x_r = x_real[sample_indices(idx, cfg.real_batch, generator)]
        x_s = images[k * cfg.ipc : (k + 1) * cfg.ipc]
        if cfg.dsa is not None:
            draw = sample_dsa_params(cfg.dsa, None, generator)
            x_r, x_s = apply_dsa(x_r, draw), apply_dsa(x_s, draw)
        y_r = torch.full((x_r.shape[0],), c, dtype=torch.int64, device=device)
        with precision.autocast():
            real_loss = F.cross_entropy(net(as_model_format(x_r, cl)), y_r)
        g_real = torch.autograd.grad(real_loss, params)
        if batched:
            syn_batches.append(x_s)
            real_grads.append(tuple(g.detach() for g in g_real))
            continue
        with precision.autocast():
            syn_loss = F.cross_entropy(net(x_s), targets[k])
        g_syn = torch.autograd.grad(syn_loss, params, create_graph=True)
        distance = match_distance(g_syn, [g.detach() for g in g_real], cfg.distance)
        backward_to(distance, [images], precision)
        if read:
            total += float(distance.detach())
    if batched:
        with precision.autocast():
            per_class = _batched_syn_distances(
                net, torch.stack(syn_batches), torch.stack(targets), real_grads, cfg.distance
            )
        backward_to(per_class.sum(), [images], precision)
        if read:
            total = float(per_class.detach().sum())
    _clipped_step(images, len(classes), cfg, optimizer, precision)
    return total


def _mixed_pass(
    net: nn.Module,
    params: list[nn.Parameter],
    x_real: torch.Tensor,
    y_real: torch.Tensor,
    images: torch.Tensor,
    labels: torch.Tensor,
    cfg: GMConfig,
    generator: torch.Generator,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    read: bool,
) -> float:
    """One matching step of the FedDC authors' code (``batches="mixed"``): a shuffled pass over the whole
    real set in batches of ``cfg.real_batch`` images of any classes (the last one smaller); each batch's
    gradient is matched against the gradient of the whole synthetic set, and the images take a step.
    Returns the summed distance when ``read``, else 0."""
    cl = is_channels_last(net)
    num_classes = labels.numel() // cfg.ipc
    order = torch.randperm(x_real.shape[0], generator=generator).to(x_real.device, non_blocking=True)
    total = 0.0
    for start in range(0, order.numel(), cfg.real_batch):
        idx = order[start : start + cfg.real_batch]
        x_r, x_s = x_real[idx], images
        if cfg.dsa is not None:
            draw = sample_dsa_params(cfg.dsa, None, generator)
            x_r, x_s = apply_dsa(x_r, draw), apply_dsa(x_s, draw)
        optimizer.zero_grad()
        with precision.autocast():
            real_loss = F.cross_entropy(net(as_model_format(x_r, cl)), y_real[idx])
        g_real = torch.autograd.grad(real_loss, params)
        with precision.autocast():
            syn_loss = F.cross_entropy(net(x_s), labels)
        g_syn = torch.autograd.grad(syn_loss, params, create_graph=True)
        distance = match_distance(g_syn, [g.detach() for g in g_real], cfg.distance)
        backward_to(distance, [images], precision)
        if read:
            total += float(distance.detach())
        _clipped_step(images, num_classes, cfg, optimizer, precision)
    return total


def _clipped_step(
    images: torch.Tensor, num_classes: int, cfg: GMConfig, optimizer: torch.optim.Optimizer, precision: Precision
) -> None:
    """Clip each class's image gradient to ``cfg.clip_norm`` (Eq. 8; None: no clipping), then step."""
    if cfg.clip_norm is not None and images.grad is not None:
        precision.unscale(optimizer)
        _clip_per_class(images.grad, num_classes, cfg.clip_norm)
    precision.step(optimizer)


def _train_network(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: GMConfig,
    generator: torch.Generator,
    precision: Precision,
) -> None:
    """DC's inner loop: ``cfg.inner_loop`` full-batch SGD steps of the network on the synthetic set.

    With DSA on, each step augments with independent per-sample draws, as DC+DSA does when training on
    the synthetic set, with the draw's ``optimizer`` (SGD, ``net_lr`` and ``net_momentum``). The forward
    passes run under ``precision`` (with ``amp = "off"``: plain float32 steps).
    """
    for _ in range(cfg.inner_loop):
        batch = x if cfg.dsa is None else dsa(x, cfg.dsa, generator)
        optimizer.zero_grad()
        with precision.autocast():
            loss = F.cross_entropy(net(batch), y)
        precision.backward(loss)
        precision.step(optimizer)
