"""Local training on preloaded tensors.

Methods differ from FedAvg's client mostly by a term added to the loss (FedProx, MOON, FedDyn) or a
correction applied to the gradients (SCAFFOLD). :func:`train_local` runs plain mini-batch SGD and takes
such pieces as arguments, so a method says only what it adds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.core.device import current_compute, host_floats
from fedskew.core.handoff import hand_off
from fedskew.core.params import Options, minimums
from fedskew.models.layout import as_model_format, is_channels_last, shuffled_batches
from fedskew.privacy.dpsgd import PrivateGradients, SampleDP

LossTerm = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``term(model, x, y, logits) -> scalar`` added to the cross-entropy loss."""

GradHook = Callable[[nn.Module], None]
"""Called after ``backward`` and before the optimiser step; may edit ``p.grad`` in place."""

LogitAdjust = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``adjust(logits, y) -> logits'``: the logits the cross-entropy is taken of, in place of the model's
(FedLC's calibration, FedRS's restricted softmax); the loss terms still see the model's own logits."""


@dataclass(frozen=True)
class FunctionalTerm:
    """The batched form of a :data:`LossTerm` (a batched runner's, :mod:`fedskew.components.batching`): the
    term on the stacked parameters of K clients; ``fn(params, data, *consts)`` returns the K clients' terms,
    a tensor of shape ``(K,)``.

    ``params`` maps every parameter name to its K clients' values stacked on a first axis (what
    ``model.named_parameters()`` gives one client, in its order, with a client axis in front); ``data`` holds this
    client's own tensors (a FedProx anchor), which the batched trainer stacks the same way; ``consts``
    are plain numbers shared by the clients that batch together. ``fn`` must compute, for each client,
    what the term's ordinary form computes on that client's model (up to float rounding), and use only
    the parameters (not the batch).
    """

    fn: Callable[..., torch.Tensor]
    data: Mapping[str, torch.Tensor]
    consts: tuple[float, ...] = ()

    def key(self) -> tuple[Any, ...]:
        """Terms of equal keys batch together (same function, constants and data shapes)."""
        shapes = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(self.data.items()))
        return (self.fn, self.consts, shapes)


def with_functional(term: LossTerm, functional: FunctionalTerm) -> LossTerm:
    """``term`` marked with its batched form (``term.functional``)."""
    term.functional = functional  # type: ignore[attr-defined]
    return term


def stacked_term(fn: Callable[..., torch.Tensor], data: Mapping[str, torch.Tensor], *consts: float) -> LossTerm:
    """A loss term written once, on stacked parameters (a :class:`FunctionalTerm`'s ``fn``): for one client it
    is the case K = 1, ``fn`` of the model's parameters and ``data`` each with a client axis of one; a batched
    runner calls ``fn`` on K clients' stacked parameters."""
    one = {name: t[None] for name, t in data.items()}

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return fn({name: p[None] for name, p in model.named_parameters()}, one, *consts)[0]

    return with_functional(term, FunctionalTerm(fn, data, consts))


def functional_of(term: LossTerm) -> FunctionalTerm | None:
    """The batched form of a loss term, if it has one."""
    found = getattr(term, "functional", None)
    return found if isinstance(found, FunctionalTerm) else None


class SGDParams(Options):
    """Mini-batch SGD settings as a parameter table has them (FedAvg's clients, centralised
    training, a condensation server's ``[algorithm.server]``); each user gives its own defaults.

    Attributes
    ----------
    batch_size
        Mini-batch size (FedDC: not given, SPEC default 64).
    lr
        SGD learning rate (FedDC Eq. 3: 0.01).
    momentum, weight_decay
        SGD momentum and weight decay (FedDC uses weight decay 1e-3).
    """

    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0

    at_least = minimums(batch_size=1, weight_decay=0)
    positive: ClassVar[tuple[str, ...]] = ("lr",)  # a method's Params adds its own
    fractions: ClassVar[tuple[str, ...]] = ("momentum",)

    def sgd(self, epochs: int) -> LocalConfig:
        """These settings for ``epochs`` epochs of :func:`train_local`."""
        return LocalConfig(
            batch_size=self.batch_size, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay,
            epochs=epochs,
        )


class LocalConfig(SGDParams):
    """What one :func:`train_local` call runs: the SGD settings, for ``epochs`` epochs, stopping early
    after ``max_steps`` steps when given."""

    epochs: int = 1
    max_steps: int | None = None


@dataclass
class LocalResult:
    """What a client reports about its training."""

    num_samples: int
    steps: int
    mean_loss: float


@dataclass
class LocalTraining:
    """A call of :func:`train_local`, as it offers itself to a batched runner (:mod:`fedskew.core.handoff`)."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    cfg: LocalConfig
    generator: torch.Generator
    terms: Sequence[LossTerm]
    grad_hooks: Sequence[GradHook]
    logit_adjust: LogitAdjust | None = None
    private: SampleDP | None = None  # DP-SGD: never batched (components/batching.py says why)


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: LocalConfig,
    generator: torch.Generator,
    terms: Sequence[LossTerm] = (),
    grad_hooks: Sequence[GradHook] = (),
    logit_adjust: LogitAdjust | None = None,
    private: SampleDP | None = None,
) -> LocalResult:
    """Train ``model`` in place with SGD on ``(x, y)``.

    Parameters
    ----------
    model
        Trained in place.
    x, y
        The client's data (already normalised).
    cfg
        Epochs, batch size and optimiser settings.
    generator
        Drives the shuffling, so the run is reproducible whatever process executes it.
    terms, grad_hooks
        Method-specific additions, see :data:`LossTerm` and :data:`GradHook`.
    logit_adjust
        Changes the logits before the cross-entropy, see :data:`LogitAdjust`; None (the default) takes the
        cross-entropy of the model's logits.
    private
        Sample-level DP-SGD (:mod:`fedskew.privacy.dpsgd`): each step's gradient is the sum of per-sample
        gradients clipped to ``private.clip``, plus Gaussian noise, over the batch size; ``private.steps`` and
        ``private.sample_rate`` are filled. None (the default): plain SGD. A batched runner trains it one
        client at a time.

    Under a batched runner (``clients_in_parallel``) the training is handed to it when it can be batched
    (:mod:`fedskew.core.handoff`, :mod:`fedskew.components.batching`): same batches and update rule, other
    clients alongside.
    """
    compute = current_compute()
    # DP-SGD refuses in one line, before anything trains, what it cannot privatise.
    dp = None if private is None else PrivateGradients(model, terms, logit_adjust, private, compute)
    batched = hand_off(LocalTraining(model, x, y, cfg, generator, terms, grad_hooks, logit_adjust, private))
    if batched is not None:
        if dp is not None:
            raise RuntimeError("a batched runner trained a DP-SGD client without its privacy")
        assert isinstance(batched, LocalResult)
        return batched
    model.train()
    opt = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
        **compute.sgd_options(),
    )
    precision = compute.precision()  # float32 and plain steps unless the run asks for AMP
    forward = compute.forward(model)  # the model itself unless the run asks for torch.compile
    cl = is_channels_last(model)
    n = int(y.shape[0])
    steps = 0
    # Each step's loss stays on the device (no host sync inside a step); they are read once at the end.
    losses: list[torch.Tensor] = []
    for _ in range(cfg.epochs):
        # The epoch's order is drawn on the CPU and moved to the data's device once, not per step.
        for idx in (shuffled_batches if dp is None else dp.batches)(n, cfg.batch_size, generator, x.device):
            if cfg.max_steps is not None and steps >= cfg.max_steps:
                break
            xb, yb = as_model_format(x[idx], cl), y[idx]
            if dp is not None:  # DP-SGD: the clipped per-sample gradients' noised sum, in each p.grad
                opt.zero_grad(set_to_none=True)
                loss = dp.step(xb, yb)
            else:
                with precision.autocast():
                    logits = forward(xb)
                    if logit_adjust is None:
                        loss = F.cross_entropy(logits, yb)
                    else:
                        loss = F.cross_entropy(logit_adjust(logits, yb), yb)
                    for term in terms:
                        loss = loss + term(model, xb, yb, logits)
                opt.zero_grad(set_to_none=True)
                precision.backward(loss)
            if grad_hooks:
                precision.unscale(opt)
            for hook in grad_hooks:
                hook(model)
            precision.step(opt)
            steps += 1
            losses.append(loss.detach())
    return LocalResult(num_samples=n, steps=steps, mean_loss=host_sum(losses) / max(steps, 1))


def host_sum(values: Sequence[torch.Tensor]) -> float:
    """The sum of scalar tensors as ``0.0 + float(v0) + float(v1) + ...`` in Python floats, in order, with
    one copy to the host for all of them (instead of one sync each): the same number, bit for bit, as
    summing ``float(v)`` step by step."""
    total = 0.0
    for v in host_floats(values):
        total += v
    return total
