"""Kernel Inducing Points (KIP; Nguyen, Chen & Lee, ICLR 2021), the distillation method of HFLDD.

KIP learns a support set (X_s, y_s) such that kernel ridge regression fitted on it predicts the labels
of real target data well; it minimises (KIP Eq. 2, HFLDD Sec. III-A)

    L(X_s, y_s) = 1/2 || y_t - K_ts (K_ss + lambda I)^-1 y_s ||^2

on random target batches (X_t, y_t) with Adam. As in KIP's code, the ridge is scaled by the mean
eigenvalue of K_ss: ``lambda I`` is ``reg * trace(K_ss) / n_s * I``, which makes ``reg`` invariant to
the kernel's scale. Kernels:

- ``"ntk"``: the closed-form neural tangent kernel of an infinitely wide fully connected ReLU network
  (:func:`ntk_fc_relu`), KIP's FC kernels.
- ``"rf_convnet"``: ``<phi(x1), phi(x2)>`` with phi the flattened output of randomly initialised
  ConvNets (:func:`random_feature_kernel`); the networks are redrawn at every step so the loss is an
  unbiased estimate of the loss under the expected (NNGP-like) kernel, as random-feature KIP variants
  do, instead of fitting one finite draw.

Labels: KIP regresses mean-centred one-hot labels, ``one_hot(y) - 1/L`` (0.9 / -0.1 for L = 10), so
that "no information" is the zero prediction of an uninformed kernel regressor. With
``learn_labels=True`` the support labels are optimised too and returned as ``soft_labels``.

Kernels and solves run in float64 (KIP's JAX code enables x64): with ``reg = 1e-6`` the regularised
K_ss is too ill-conditioned for float32. Hence no MPS (it has no float64). On a GPU the computation
runs on the real images' device, with draws made on the CPU and moved (:mod:`fedskew.core.device`).
``KIPConfig.amp`` runs the random ConvNet feature maps (``"rf_convnet"``, float32 convolutions) under
autocast; the NTK, the kernel products and the solve are float64 and autocast leaves them alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.condense.distribution_matching import image_dtype
from fedskew.condense.synthetic import SynthesisOptions, SyntheticSet, check_choice, check_data, check_init, start_set
from fedskew.core.device import Precision
from fedskew.core.errors import ConfigError, DataError
from fedskew.core.handoff import hand_off
from fedskew.core.params import minimums
from fedskew.progress import progress_bar

Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``kernel(x1, x2)`` returns the (n1, n2) kernel matrix of two image batches."""

KERNELS = ("ntk", "rf_convnet")
_COS_MARGIN_F64 = 1e-9
_COS_MARGIN_F32 = 1e-6


def ntk_fc_relu(
    x1: torch.Tensor,
    x2: torch.Tensor,
    depth: int = 3,
    w_std: float = math.sqrt(2.0),
    b_std: float = 0.1,
) -> torch.Tensor:
    """NTK of an infinitely wide fully connected ReLU network (NTK parameterisation).

    The network has ``depth`` hidden ReLU layers and a linear readout, each layer computing
    ``w_std / sqrt(fan_in) * W h + b_std * b`` with standard normal W, b. Inputs are flattened. With
    ``Sigma^1 = w_std^2 <x, x'> / d + b_std^2`` and ``Theta^1 = Sigma^1``, each ReLU layer applies the
    arc-cosine recursion (Cho & Saul 2009; Jacot et al. 2018; Arora et al. 2019): with
    ``theta = arccos(Sigma(x, x') / sqrt(Sigma(x, x) Sigma(x', x')))``,

        Sigma'     = w_std^2 sqrt(Sigma(x, x) Sigma(x', x')) (sin theta + (pi - theta) cos theta) / (2 pi)
                     + b_std^2
        SigmaDot   = (pi - theta) / (2 pi)
        Theta'     = Sigma' + w_std^2 SigmaDot Theta.

    Defaults ``w_std = sqrt(2)``, ``b_std = 0.1`` are those of KIP's FC networks. The cosine is clipped
    to ``1 - 1e-9`` (float64; ``1 - 1e-6`` otherwise) to keep the arccos gradient finite.

    Returns
    -------
    torch.Tensor
        (n1, n2) kernel in the inputs' (promoted) floating dtype.
    """
    dtype = torch.promote_types(x1.dtype, x2.dtype)
    a, b = x1.flatten(1).to(dtype), x2.flatten(1).to(dtype)
    if a.shape[1] != b.shape[1]:
        raise DataError(f"inputs of {a.shape[1]} and {b.shape[1]} features")
    return _ntk_recursion(a, b, depth, w_std, b_std)


def _ntk_recursion(a: torch.Tensor, b: torch.Tensor, depth: int, w_std: float, b_std: float) -> torch.Tensor:
    """:func:`ntk_fc_relu`'s kernel of flat batches ``a`` (..., n1, d) and ``b`` (..., n2, d) of one dtype: the
    same operations for one pair (2-D) and for a stack of pairs (3-D)."""
    if depth < 0:
        raise ConfigError(f"depth must be >= 0, got {depth}")
    w2, b2 = w_std**2, b_std**2
    dim = a.shape[-1]
    sigma = w2 * (a @ b.mT) / dim + b2
    var1 = w2 * (a * a).sum(dim=-1) / dim + b2
    var2 = w2 * (b * b).sum(dim=-1) / dim + b2
    theta = sigma
    margin = _COS_MARGIN_F64 if a.dtype == torch.float64 else _COS_MARGIN_F32
    for _ in range(depth):
        scale = torch.sqrt(var1[..., :, None] * var2[..., None, :])
        cos = (sigma / scale).clamp(-1.0 + margin, 1.0 - margin)
        angle = torch.arccos(cos)
        sigma = w2 * scale * (torch.sin(angle) + (math.pi - angle) * cos) / (2 * math.pi) + b2
        theta = sigma + w2 * (math.pi - angle) / (2 * math.pi) * theta
        var1 = w2 * var1 / 2 + b2
        var2 = w2 * var2 / 2 + b2
    return theta


class RandomConvFeatures(nn.Module):
    """A randomly initialised ConvNet feature map phi, drawn from an explicit generator.

    ``depth`` blocks of conv3x3 (padding 1, ``width`` channels, He-normal weights ``N(0, 2 / fan_in)``,
    zero bias) - ReLU - 2x2 average pooling (skipped once the map is 1 pixel wide), the DC ConvNet
    without normalisation. ``phi(x)`` is the flattened final map divided by ``sqrt(its size)``, so
    ``<phi(x), phi(x')>`` does not grow with width or resolution. The weights are buffers, not
    parameters: the network is a fixed random feature map.
    """

    def __init__(self, in_channels: int, width: int, depth: int, generator: torch.Generator) -> None:
        super().__init__()
        self.depth = depth
        channels = in_channels
        for i in range(depth):
            std = math.sqrt(2.0 / (channels * 9))
            self.register_buffer(f"w{i}", torch.randn((width, channels, 3, 3), generator=generator) * std)
            channels = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return phi(x), shape (B, D)."""
        for i in range(self.depth):
            weight = self.get_buffer(f"w{i}")
            x = F.relu(F.conv2d(x.to(weight.dtype), weight, padding=1))
            if min(x.shape[2:]) >= 2:
                x = F.avg_pool2d(x, 2)
        flat = x.flatten(1)
        return flat / math.sqrt(flat.shape[1])


def ntk_fc_relu_stacked(
    x1: torch.Tensor,
    x2: torch.Tensor,
    depth: int = 3,
    w_std: float = math.sqrt(2.0),
    b_std: float = 0.1,
) -> torch.Tensor:
    """:func:`ntk_fc_relu` of K pairs of flat batches at once: ``x1`` (K, n1, d) and ``x2`` (K, n2, d) give the
    K kernels (K, n1, n2), each equal to :func:`ntk_fc_relu` of its pair up to float rounding."""
    dtype = torch.promote_types(x1.dtype, x2.dtype)
    return _ntk_recursion(x1.to(dtype), x2.to(dtype), depth, w_std, b_std)


def random_feature_kernel(x1: torch.Tensor, x2: torch.Tensor, networks: Sequence[nn.Module]) -> torch.Tensor:
    """``K(x1, x2) = mean_n <phi_n(x1), phi_n(x2)>`` over random feature maps ``networks`` (float64).

    Averaging over independent draws (e.g. :class:`RandomConvFeatures`) estimates the expected kernel
    of the random network family.
    """
    if not networks:
        raise ConfigError("random_feature_kernel needs at least one network")
    f1 = [net(x1).double() for net in networks]
    return _feature_gram(f1, f1 if x2 is x1 else [net(x2).double() for net in networks])


def _feature_gram(f1: Sequence[torch.Tensor], f2: Sequence[torch.Tensor]) -> torch.Tensor:
    """``mean_n f1[n] @ f2[n].T``: the random-feature kernel of two batches' features, one per network."""
    total = torch.zeros((f1[0].shape[0], f2[0].shape[0]), dtype=torch.float64, device=f1[0].device)
    for a, b in zip(f1, f2, strict=True):
        total = total + a @ b.T
    return total / len(f1)


def kip_loss(
    x_t: torch.Tensor,
    y_t: torch.Tensor,
    x_s: torch.Tensor,
    y_s: torch.Tensor,
    kernel: Kernel,
    reg: float,
) -> torch.Tensor:
    """KIP's loss ``1/2 || y_t - K_ts (K_ss + reg tr(K_ss)/n_s I)^-1 y_s ||^2`` (float64).

    Parameters
    ----------
    x_t, y_t
        Target (real) images and their label vectors (n_t, L).
    x_s, y_s
        Support (synthetic) images and label vectors (n_s, L).
    kernel
        ``kernel(x1, x2)``, e.g. :func:`ntk_fc_relu`; it receives float64 images.
    reg
        Ridge coefficient, relative to the mean eigenvalue ``tr(K_ss) / n_s`` as in KIP.
    """
    x_t, x_s = x_t.double(), x_s.double()
    k_ss = kernel(x_s, x_s)
    k_ts = kernel(x_t, x_s)
    n_s = k_ss.shape[0]
    ridge = reg * torch.trace(k_ss) / n_s * torch.eye(n_s, dtype=k_ss.dtype, device=k_ss.device)
    prediction = k_ts @ torch.linalg.solve(k_ss + ridge, y_s.double())
    return 0.5 * ((y_t.double() - prediction) ** 2).sum()


def centered_one_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """KIP's regression targets ``one_hot(labels) - 1 / num_classes`` (float64)."""
    return F.one_hot(labels.long(), num_classes).double() - 1.0 / num_classes


class KIPConfig(SynthesisOptions):
    """KIP settings (defaults: KIP's, where it gives them; HFLDD gives none).

    Attributes
    ----------
    iterations
        Adam steps.
    ipc
        Support images per class.
    lr
        Adam learning rate (KIP: 0.01), for images and, if learned, labels.
    reg
        Ridge coefficient relative to ``tr(K_ss)/n_s`` (KIP: 1e-6).
    target_batch
        Real target samples per step, drawn uniformly from all the data (all of it if fewer).
    learn_labels
        Also optimise the support labels (returned as ``soft_labels``).
    kernel
        ``"ntk"`` or ``"rf_convnet"`` (see the module docstring).
    depth
        Hidden layers of the FC NTK, or conv blocks of the random ConvNet.
    w_std, b_std
        Weight and bias standard deviations of the FC NTK (KIP: sqrt(2), 0.1).
    rf_width, rf_draws
        Channels of the random ConvNet (DC's width, 128) and networks averaged per step.
    init
        See :func:`init_synthetic` (KIP: ``"real"``).
    amp
        Mixed precision of the random ConvNet features (``"off"``, ``"bf16"``, ``"fp16"`` on CUDA with
        a gradient scaler); the float64 NTK and solve are not affected.
    """

    at_least = minimums(iterations=0, depth=0, reg=0, ipc=1, target_batch=1, rf_width=1, rf_draws=1)

    iterations: int = 1000
    ipc: int = 10
    lr: float = 0.01
    reg: float = 1e-6
    target_batch: int = 256
    learn_labels: bool = False
    kernel: str = "ntk"
    depth: int = 3
    w_std: float = math.sqrt(2.0)
    b_std: float = 0.1
    rf_width: int = 128
    rf_draws: int = 1
    init: str = "real"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("kernel", self.kernel, KERNELS)
        check_init(self.init)


def _step_kernel(
    cfg: KIPConfig, in_channels: int, generator: torch.Generator, device: torch.device | None = None
) -> Kernel:
    """The kernel of one step: the fixed NTK, or freshly drawn random ConvNet features (drawn on the CPU,
    moved to ``device``, default the CPU)."""
    if cfg.kernel == "ntk":

        def ntk(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return ntk_fc_relu(a, b, depth=cfg.depth, w_std=cfg.w_std, b_std=cfg.b_std)

        return ntk
    nets = [RandomConvFeatures(in_channels, cfg.rf_width, cfg.depth, generator) for _ in range(cfg.rf_draws)]
    if device is not None:
        nets = [net.to(device, non_blocking=True) for net in nets]

    # A step asks for K(x_s, x_s) and K(x_t, x_s): each batch's features are computed once a step (the support
    # images' forward and backward were made twice before issue 45). Kept with their batch, so ids stay unique.
    seen: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}

    def features(x: torch.Tensor) -> list[torch.Tensor]:
        if id(x) not in seen:
            seen[id(x)] = (x, [net(x).double() for net in nets])
        return seen[id(x)][1]

    def rf(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not nets:
            raise ConfigError("random_feature_kernel needs at least one network")
        return _feature_gram(features(a), features(b))

    return rf


def _checked_start(start: SyntheticSet, x_real: torch.Tensor, num_classes: int) -> SyntheticSet:
    """The start set, checked against the real data (a caller may give it) and on its device, float32 (float64
    for float64 real data)."""
    labels = start.labels
    if start.images.shape[1:] != x_real.shape[1:] or int(labels.min()) < 0 or int(labels.max()) >= num_classes:
        raise DataError(
            f"the start set must hold images of shape {tuple(x_real.shape[1:])} with labels in [0, {num_classes}), "
            f"got {tuple(start.images.shape[1:])} with labels {sorted(set(labels.tolist()))}"
        )
    return SyntheticSet(start.images.to(device=x_real.device, dtype=image_dtype(x_real)), labels.to(x_real.device))


@dataclass
class KIPRequest:
    """One client's KIP, prepared (its start checked, its targets made) and offered to a hand-off
    (:mod:`fedskew.core.handoff`) before its steps.

    Whoever runs it must draw from ``generator``, at every step, what :func:`kip` draws: the target batch
    (``torch.randperm`` of the real data, the first ``cfg.target_batch``), then the step's kernel's draws
    (none for the NTK). ``images`` holds the first support images (not a leaf of any graph), ``support``
    their centred one-hot labels, ``targets`` those of the real data.
    """

    x_real: torch.Tensor
    targets: torch.Tensor
    num_classes: int
    cfg: KIPConfig
    generator: torch.Generator
    images: torch.Tensor
    labels: torch.Tensor
    support: torch.Tensor

    def result(self, images: torch.Tensor) -> SyntheticSet:
        """The distilled set with ``images`` (the optimised start)."""
        return SyntheticSet(images.detach(), self.labels, None)


def kip(
    x_real: torch.Tensor,
    y_real: torch.Tensor,
    num_classes: int,
    cfg: KIPConfig,
    generator: torch.Generator,
    progress: bool = False,
    start: SyntheticSet | None = None,
) -> SyntheticSet:
    """Distil ``(x_real, y_real)`` with KIP.

    Parameters
    ----------
    x_real, y_real
        Real images (N, C, H, W), normalised, and labels in ``[0, num_classes)``; the distillation
        runs on their device (not MPS: KIP needs float64).
    num_classes
        L, the width of the label vectors.
    cfg
        Settings.
    generator
        The only source of randomness.
    progress
        Show a progress bar on stderr (plain lines when it is not a terminal).
    start
        The support set to start from, normalised images of the real images' shape with labels in
        ``[0, num_classes)``; ``None`` (default): ``cfg.ipc`` images of every class present, initialised
        as ``cfg.init`` says (:func:`~fedskew.condense.synthetic.start_set`, drawn from ``generator``).
        A caller that builds the start with :func:`~fedskew.condense.synthetic.start_set` from the same
        generator gets exactly the draws of ``start=None``.

    Returns
    -------
    SyntheticSet
        The optimised ``start`` (its labels), or ``cfg.ipc`` images per class present, in increasing
        label order; float32 on the data's device;
        ``soft_labels`` holds the learned (centred) label vectors when ``cfg.learn_labels``, else
        ``None``.
    """
    check_data(x_real, y_real)
    device = x_real.device
    if device.type == "mps":
        raise ConfigError("KIP computes its kernels in float64, which MPS lacks; run it on device cpu or cuda")
    precision = Precision(device, cfg.amp)  # refuses fp16 off CUDA in one line
    request = prepare_kip(x_real, y_real, num_classes, cfg, generator, start)
    handed = hand_off(request)
    if handed is not None:
        assert isinstance(handed, SyntheticSet)
        return handed
    syn, targets = SyntheticSet(request.images, request.labels), request.targets
    x_s = request.images.requires_grad_(True)
    y_s = request.support.requires_grad_(cfg.learn_labels)
    optimizer = torch.optim.Adam([x_s, y_s] if cfg.learn_labels else [x_s], lr=cfg.lr)
    bar = progress_bar(range(cfg.iterations), desc="KIP", enabled=progress)
    for _ in bar:
        idx = torch.randperm(x_real.shape[0], generator=generator)[: cfg.target_batch].to(device, non_blocking=True)
        kernel = _step_kernel(cfg, x_real.shape[1], generator, device)
        with precision.autocast():
            loss = kip_loss(x_real[idx], targets[idx], x_s, y_s, kernel, cfg.reg)
        optimizer.zero_grad()
        precision.backward(loss)
        precision.step(optimizer)
        if progress:  # reading the loss waits for the device
            bar.set_postfix(loss=float(loss.detach()), refresh=False)
    soft = y_s.detach().float() if cfg.learn_labels else None
    return SyntheticSet(x_s.detach(), syn.labels, soft)


def prepare_kip(
    x_real: torch.Tensor,
    y_real: torch.Tensor,
    num_classes: int,
    cfg: KIPConfig,
    generator: torch.Generator,
    start: SyntheticSet | None = None,
) -> KIPRequest:
    """What :func:`kip` does before its steps (the labels checked, the start drawn from ``generator`` unless
    given, the targets made), as a request that it runs, or a batched runner runs."""
    if num_classes < 1 or int(y_real.min()) < 0 or int(y_real.max()) >= num_classes:
        raise DataError(f"labels must lie in [0, {num_classes})")
    if start is None:
        start = start_set(x_real, y_real, cfg.ipc, cfg.init, generator)
    syn = _checked_start(start, x_real, num_classes)
    return KIPRequest(x_real, centered_one_hot(y_real, num_classes), num_classes, cfg, generator, syn.images.clone(),
                      syn.labels, centered_one_hot(syn.labels, num_classes))
