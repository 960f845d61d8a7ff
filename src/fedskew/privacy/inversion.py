"""Gradient inversion: what a server (or anyone who sees a client's update) can rebuild of the client's images.

Two attacks, written after the papers' algorithms:

- DLG (Zhu, Liu & Han, "Deep Leakage from Gradients", NeurIPS 2019): dummy images and dummy soft labels,
  drawn at random, are optimised (L-BFGS) so that the gradient they produce on the attacked model matches
  the shared one: ``min || grad(dummy) - grad(real) ||^2``.
- iDLG (Zhao, Mopuri & Bilen, "iDLG: Improved Deep Leakage from Gradients", 2020): with cross-entropy, the
  gradient of the last linear layer's weight row ``i`` is ``(p_i - y_i) h`` with ``h >= 0`` after a ReLU or
  Sigmoid, so for one sample only the true label's row sums to a negative number. The label is read off that
  sign and only the image is optimised.

What is attacked (:class:`Sharing`): the gradient of one batch on the model (FedSGD's upload, DLG's setting),
or the update after ``local_steps`` full-batch SGD steps on that batch (a FedAvg client's ``w_S - w_0``);
either privatised as the ``[privacy]`` table would: ``central``/``local`` clip the whole gradient or update to
``clip`` (global L2 norm) and add N(0, (noise_multiplier * clip)^2) to each coordinate; ``sample`` clips each
sample's gradient to ``clip`` and adds that noise to their sum before averaging (DP-SGD), at every local step.
The attacker knows the mechanism and mirrors its deterministic part (the clipping) on the dummy data; the
noise it cannot know. Randomness comes from ``torch.Generator`` objects the caller seeds.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedskew.core.params import MAX_STEPS, Options, check, maximums, minimums, option
from fedskew.privacy.mechanisms import add_gaussian_noise, clip_by_global_norm

Method = Literal["dlg", "idlg"]
Target = Literal["gradient", "update"]
Optimiser = Literal["lbfgs", "adam"]
DPMode = Literal["off", "central", "local", "sample"]

LBFGS_INNER = 20
"""L-BFGS iterations per step: torch's default, which both papers' code uses (300 steps of up to 20 each)."""
STOP_LOSS = 1e-10
"""The (relative) matching loss at which an attack stops: the gradients agree to float64's working precision."""
STALL_STEPS = 10
"""L-BFGS steps without a lower loss after which an attack stops: its line searches find no descent (a local
minimum, or the noise floor of a privatised target), and each further step would cost a line search for
nothing."""
_TINY = 1e-12


class InversionSettings(Options):
    """How the attacker optimises (the papers' values by default)."""

    method: Method = option("dlg", help="dlg (image and label optimised) or idlg (label inferred, image optimised)")
    iterations: int = option(300, help="optimiser steps (an L-BFGS step runs up to 20 iterations, as in the papers)")
    optimizer: Optimiser = option("lbfgs", help="lbfgs (the papers') or adam")
    lr: float | None = option(None, help="step size [lbfgs 1.0, adam 0.1]")

    at_least = minimums(iterations=1)
    at_most = maximums(iterations=MAX_STEPS)
    positive = ("lr",)

    @property
    def step_size(self) -> float:
        return self.lr if self.lr is not None else (1.0 if self.optimizer == "lbfgs" else 0.1)


@dataclass(frozen=True)
class Sharing:
    """What the client shares and how it is privatised (see the module docstring)."""

    target: Target = "gradient"
    local_steps: int = 1
    local_lr: float = 0.01
    dp_mode: DPMode = "off"
    clip: float = 1.0
    noise_multiplier: float = 0.0

    def __post_init__(self) -> None:
        check(self.target in ("gradient", "update"), "target", self.target, "gradient or update")
        check(self.dp_mode in ("off", "central", "local", "sample"), "dp_mode", self.dp_mode,
              "off, central, local or sample")
        check(self.local_steps >= 1, "local_steps", self.local_steps, "an integer >= 1")
        check(math.isfinite(self.local_lr) and self.local_lr > 0, "local_lr", self.local_lr, "> 0")
        check(math.isfinite(self.clip) and self.clip > 0, "clip", self.clip, "> 0")
        check(math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0, "noise_multiplier",
              self.noise_multiplier, ">= 0")

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.clip if self.dp_mode != "off" else 0.0

    def describe(self, batch_size: int | None = None) -> str:
        """A few words for a table: ``gradient, B=1`` / ``update (5 steps)``, then the privacy."""
        what = "gradient" if self.target == "gradient" else f"update ({self.local_steps} steps)"
        if batch_size is not None:
            what += f", B={batch_size}"
        if self.dp_mode == "off":
            return what
        return f"{what}, DP {self.dp_mode} z={self.noise_multiplier:g} C={self.clip:g}"


@dataclass
class Inversion:
    """An attack's outcome: the images (in the model's input space) and labels it settled on, the final
    matching loss, the optimiser steps run and the gradient-matching evaluations they took."""

    images: torch.Tensor
    labels: torch.Tensor
    loss: float
    steps: int
    evaluations: int


def with_sigmoids(model: nn.Module) -> int:
    """Replace every ``nn.ReLU`` of ``model`` (in place) by ``nn.Sigmoid``, as DLG does to its LeNet: a smooth
    activation whose second derivative the matching needs. The weights are untouched. Returns how many."""
    count = 0
    for name, child in model.named_children():
        if isinstance(child, nn.ReLU):
            setattr(model, name, nn.Sigmoid())
            count += 1
        else:
            count += with_sigmoids(child)
    return count


def soft_cross_entropy(logits: torch.Tensor, soft: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy against soft labels (one-hot labels give ``F.cross_entropy``)."""
    return -(soft * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().requires_grad_(True) for n, p in model.named_parameters()}


def _grads(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, soft: torch.Tensor,
           graph: bool) -> list[torch.Tensor]:
    """The gradient of the batch's mean loss at ``params`` (kept differentiable when ``graph``)."""
    loss = soft_cross_entropy(functional_call(model, params, (x,)), soft)
    return list(torch.autograd.grad(loss, list(params.values()), create_graph=graph))


def _clip(tensors: list[torch.Tensor], clip: float, graph: bool) -> list[torch.Tensor]:
    """Clip to ``clip`` in global L2 norm; differentiably (the attacker's mirror) when ``graph``."""
    if not graph:
        return clip_by_global_norm(tensors, clip)[0]
    norm = torch.sqrt(torch.stack([(t * t).sum() for t in tensors]).sum() + _TINY)
    factor = torch.clamp(clip / norm, max=1.0)
    return [t * factor for t in tensors]


def _step_gradient(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, soft: torch.Tensor,
                   sharing: Sharing, graph: bool, generator: torch.Generator | None) -> list[torch.Tensor]:
    """One local step's gradient: DP-SGD's (per-sample clipped, summed, noised, averaged) under ``sample``."""
    if sharing.dp_mode != "sample":
        return _grads(model, params, x, soft, graph)
    per_sample = [_clip(_grads(model, params, x[i:i + 1], soft[i:i + 1], graph), sharing.clip, graph)
                  for i in range(len(x))]
    total = [torch.stack(parts).sum(0) for parts in zip(*per_sample, strict=True)]
    if generator is not None:
        total = add_gaussian_noise(total, sharing.noise_std, generator)
    return [t / len(x) for t in total]


def shared_update(model: nn.Module, x: torch.Tensor, soft: torch.Tensor, sharing: Sharing,
                  generator: torch.Generator | None = None) -> list[torch.Tensor]:
    """What the client shares for the batch ``(x, soft labels)`` at ``model``'s weights: the gradient, or the
    update after ``local_steps`` SGD steps, privatised by ``sharing``. ``generator`` None: no noise is drawn,
    and the result stays differentiable in ``x`` and ``soft`` (the attacker's mirror of the client)."""
    graph = generator is None
    params = _params(model)
    start = params
    steps = 1 if sharing.target == "gradient" else sharing.local_steps
    out: list[torch.Tensor] = []
    for _ in range(steps):
        out = _step_gradient(model, params, x, soft, sharing, graph, generator)
        if sharing.target == "update":
            params = {n: p - sharing.local_lr * g for (n, p), g in zip(params.items(), out, strict=True)}
    if sharing.target == "update":
        out = [params[n] - start[n] for n in start]
    if sharing.dp_mode in ("central", "local"):
        out = _clip(out, sharing.clip, graph)
        if generator is not None:
            out = add_gaussian_noise(out, sharing.noise_std, generator)
    return out if graph else [t.detach() for t in out]


def last_layer_index(model: nn.Module) -> int:
    """The position, among ``model.parameters()``, of the last linear layer's weight (a FedModel's
    ``classifier.weight``; otherwise the last two-dimensional parameter)."""
    names = [n for n, _ in model.named_parameters()]
    if "classifier.weight" in names:
        return names.index("classifier.weight")
    shaped = [i for i, (_, p) in enumerate(model.named_parameters()) if p.dim() == 2]
    if not shaped:
        raise ValueError("iDLG needs a model whose last layer is linear (a two-dimensional weight)")
    return shaped[-1]


def infer_labels(shared: Sequence[torch.Tensor], model: nn.Module, batch_size: int, sharing: Sharing) -> torch.Tensor:
    """iDLG's labels: the class whose row of the last layer's weight gradient sums to the most negative value
    (for one sample, the only negative one). An update ``w_S - w_0`` points down the gradient, so its sign is
    turned first. Beyond one sample (not in the paper): the ``batch_size`` most negative rows, cycled when
    fewer rows are negative; exact when the batch's labels are distinct."""
    rows = shared[last_layer_index(model)].detach().double().sum(-1)
    if sharing.target == "update":
        rows = -rows
    order = torch.argsort(rows)
    negative = max(1, int((rows < 0).sum()))
    picked = order[: min(negative, batch_size)]
    return picked.repeat(math.ceil(batch_size / len(picked)))[:batch_size].sort().values


def _distance(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], scale: float) -> torch.Tensor:
    """DLG's objective, the squared L2 distance, divided by ``scale`` (the target's squared norm)."""
    return sum(((x - y) ** 2).sum() for x, y in zip(a, b, strict=True)) / scale  # type: ignore[return-value]


def invert(model: nn.Module, shared: Sequence[torch.Tensor], shape: Sequence[int], num_classes: int,
           sharing: Sharing, settings: InversionSettings, generator: torch.Generator,
           on_step: Callable[[int, float], None] | None = None) -> Inversion:
    """Rebuild a batch of ``shape`` (B, C, H, W) from ``shared`` (what :func:`shared_update` released).

    Dummy images start as N(0, 1) in the model's input space (normalised pixels), DLG's dummy labels as
    N(0, 1) logits; both from ``generator``. iDLG fixes the labels (:func:`infer_labels`) and optimises the
    images only. The objective is DLG's squared L2 distance between the dummy batch's shared quantity (the
    same local steps and clipping, no noise) and ``shared``, divided by ``||shared||^2`` (the same minimum at
    any scale of the gradients). The attack computes in float64 on a copy of ``model``: a small model's
    round-1 gradients leave float32 L-BFGS no room to move. L-BFGS takes strong-Wolfe line searches
    (:data:`LBFGS_INNER` iterations a step); the papers' code takes fixed steps of size ``lr``, which stall
    where the gradients are small. The images returned are those of the lowest loss seen (L-BFGS can blow
    up to NaN late in a run); the run stops early at a loss of :data:`STOP_LOSS`, or when L-BFGS stalls
    (:data:`STALL_STEPS`). ``on_step(step, best loss)`` is
    called after each optimiser step.
    """
    model = copy.deepcopy(model).double().train()
    target = [t.detach().double() for t in shared]
    scale = max(sum(float((t**2).sum()) for t in target), _TINY)
    dummy = torch.randn(tuple(shape), generator=generator, dtype=torch.float64).requires_grad_(True)
    if settings.method == "idlg":
        labels = infer_labels(target, model, shape[0], sharing)
        soft = F.one_hot(labels, num_classes).double()
        logits = soft
        variables = [dummy]
    else:
        logits = torch.randn((shape[0], num_classes), generator=generator, dtype=torch.float64).requires_grad_(True)
        variables = [dummy, logits]
    if settings.optimizer == "lbfgs":
        opt: torch.optim.Optimizer = torch.optim.LBFGS(
            variables, lr=settings.step_size, max_iter=LBFGS_INNER, tolerance_grad=0.0, tolerance_change=0.0,
            line_search_fn="strong_wolfe")
    else:
        opt = torch.optim.Adam(variables, lr=settings.step_size)
    evaluations = 0
    best = (math.inf, dummy.detach().clone(), logits.detach().clone())

    def closure() -> torch.Tensor:
        nonlocal evaluations, best
        evaluations += 1
        opt.zero_grad()
        soft = F.softmax(logits, dim=-1) if settings.method == "dlg" else logits
        loss = _distance(shared_update(model, dummy, soft, sharing), target, scale)
        value = float(loss.detach())
        if math.isfinite(value):
            loss.backward()
            if value < best[0]:
                best = (value, dummy.detach().clone(), logits.detach().clone())
        else:  # nothing to follow: a zero gradient ends the step
            for v in variables:
                v.grad = torch.zeros_like(v)
        return loss.detach()

    step, last_gain, record = 0, 0, best[0]
    for step in range(1, settings.iterations + 1):
        loss = float(opt.step(closure))  # type: ignore[arg-type]  # torch's stub wants a float; L-BFGS takes a tensor
        if on_step is not None:
            on_step(step, best[0])
        if best[0] < record:
            last_gain, record = step, best[0]
        stalled = settings.optimizer == "lbfgs" and step - last_gain >= STALL_STEPS
        if not math.isfinite(loss) or best[0] < STOP_LOSS or stalled:
            break
    return Inversion(images=best[1].float(), labels=best[2].argmax(-1), loss=best[0], steps=step,
                     evaluations=evaluations)
