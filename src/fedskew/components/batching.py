"""The hand-off between a client's work (:func:`~fedskew.components.trainer.train_local`, KIP) and a batched
runner.

A batched runner (``clients_in_parallel``, :mod:`fedskew.engine.batched_runner`) installs this module's
hand-off into :mod:`fedskew.core.handoff` when it is made (:func:`install_hand_off`; no import installs
anything) and runs each client job of a round in its own thread with a :class:`Rendezvous` set
(:func:`batching`). When such a job calls ``train_local`` and its training can be batched, the hand-off draws
the client's batch order from its generator exactly as ``train_local`` would, then gives the runner a
:class:`BatchRequest` and waits: the runner trains every waiting client together
(:mod:`fedskew.components.batched`) and hands each its :class:`~fedskew.components.trainer.LocalResult`, with
the trained weights in the client's model. A training that cannot be batched (see :func:`why_sequential`)
runs in place, as without a runner, so any method batches whatever of its local training can be, with no
change to its code.

Loss terms batch when they carry a :class:`~fedskew.components.trainer.FunctionalTerm` (``term.functional``):
the same term written on the stacked parameters of many clients at once.

KIP (HFLDD's condensation) is handed over the same way: the rendezvous carries a :class:`BatchRequest` or a
:class:`~fedskew.condense.kip.KIPRequest`, and the runner distils the waiting clients together
(:mod:`fedskew.components.batched_kip`). Condensations without a batched form (distribution matching, gradient
matching) run in their jobs and say so once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from fedskew.components.batched_kip import why_kip_sequential
from fedskew.components.trainer import (
    FunctionalTerm,
    GradHook,
    LocalConfig,
    LocalResult,
    LocalTraining,
    LogitAdjust,
    LossTerm,
    functional_of,
)
from fedskew.condense.kip import KIPRequest
from fedskew.condense.synthetic import SyntheticSet
from fedskew.core import handoff
from fedskew.core.device import current_compute
from fedskew.models.layout import shuffled_batches

BATCHED_DTYPES = (torch.float32, torch.float64)
"""Parameter dtypes the batched trainer takes (mixed precision runs one client at a time)."""


@dataclass
class BatchRequest:
    """One client's local training, handed to the batched trainer.

    ``batches`` are the index batches of every step, drawn as ``train_local`` draws them; ``terms`` the
    batched forms of the loss terms and ``closures`` their ordinary forms (for a one-sample probe of which
    parameters the loss reaches).
    """

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    cfg: LocalConfig
    batches: list[torch.Tensor]
    terms: list[FunctionalTerm]
    closures: list[LossTerm]


Request = BatchRequest | KIPRequest
"""What a job hands to the runner: a local training or a KIP."""


class Rendezvous(Protocol):
    """What a job thread talks to: the runner's coordinator."""

    def submit(self, request: Request) -> LocalResult | SyntheticSet:
        """Wait until the request has been run together with the others (trained: its ``LocalResult``;
        condensed: its ``SyntheticSet``)."""
        ...

    def sequential(self, reason: str, kind: str = "training") -> None:
        """Note that a ``kind`` of work (``"training"``, ``"condensation"``) ran one client at a time, and why."""
        ...


class _Slot(threading.local):
    rendezvous: Rendezvous | None = None


_SLOT = _Slot()


@contextmanager
def batching(rendezvous: Rendezvous) -> Iterator[None]:
    """Within the block (in this thread), ``train_local`` hands batchable trainings to ``rendezvous``."""
    _SLOT.rendezvous = rendezvous
    try:
        yield
    finally:
        _SLOT.rendezvous = None


def draw_batches(n: int, cfg: LocalConfig, generator: torch.Generator) -> list[torch.Tensor]:
    """The index batches of every step of ``train_local``, drawn from ``generator`` as it draws them
    (one shuffle per epoch, the epoch's remaining batches unused once ``max_steps`` is reached)."""
    out: list[torch.Tensor] = []
    for _ in range(cfg.epochs):
        for idx in shuffled_batches(n, cfg.batch_size, generator):
            if cfg.max_steps is not None and len(out) >= cfg.max_steps:
                break
            out.append(idx)
    return out


_RUNNING_STATS = (nn.modules.batchnorm._NormBase,)


def why_sequential(
    model: nn.Module,
    x: torch.Tensor,
    terms: Sequence[LossTerm],
    grad_hooks: Sequence[GradHook],
    logit_adjust: LogitAdjust | None = None,
) -> str | None:
    """Why this training cannot be batched (None: it can)."""
    if logit_adjust is not None:
        return "it changes the logits before the cross-entropy (a logit adjustment, e.g. FedLC's or FedRS's)"
    if grad_hooks:
        return "it edits gradients (a gradient hook, e.g. SCAFFOLD's correction)"
    if any(functional_of(t) is None for t in terms):
        return "a loss term has no batched form (e.g. MOON's contrastive term)"
    compute = current_compute()
    if compute.amp != "off":
        return f"mixed precision (amp = {compute.amp})"
    if compute.compile != "off":
        return f"the run compiles the model's forward pass (compile = {compute.compile})"
    params = list(model.parameters())
    if not params or not any(p.requires_grad for p in params):
        return "the model has no trainable parameters"
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1 or dtypes.pop() not in BATCHED_DTYPES or x.dtype not in BATCHED_DTYPES:
        return "parameters or data are not all float32 or float64"
    if x.shape[0] == 0:
        return "the client holds no data"
    for m in model.modules():
        if isinstance(m, _RUNNING_STATS) and m.track_running_stats:
            return f"the model keeps running statistics ({type(m).__name__})"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"the model draws random numbers ({type(m).__name__})"
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
            return "the model has hooks on its forward or backward pass"
    return None


def _train(rendezvous: Rendezvous, t: LocalTraining) -> LocalResult | None:
    """Train ``t.model`` batched with the round's other clients if the training can be batched; None otherwise
    (``train_local`` then trains it as usual)."""
    reason = (why_sequential(t.model, t.x, t.terms, t.grad_hooks, t.logit_adjust) if t.private is None
              else "DP-SGD (privacy.mode = \"sample\": per-sample gradients, clipped and noised)")
    if reason is not None:
        rendezvous.sequential(reason)
        return None
    t.model.train()
    batches = draw_batches(int(t.y.shape[0]), t.cfg, t.generator)
    functional = [f for f in (functional_of(term) for term in t.terms) if f is not None]
    result = rendezvous.submit(BatchRequest(t.model, t.x, t.y, t.cfg, batches, functional, list(t.terms)))
    assert isinstance(result, LocalResult)
    return result


def _condense(rendezvous: Rendezvous, request: KIPRequest) -> SyntheticSet | None:
    """Distil ``request`` batched with the round's other clients if it can be batched; None otherwise."""
    reason = why_kip_sequential(request)
    if reason is not None:
        rendezvous.sequential(reason, "condensation")
        return None
    result = rendezvous.submit(request)
    assert isinstance(result, SyntheticSet)
    return result


class _RunnerHandOff:
    """Hands a batching thread's local trainings and condensations to its runner (:mod:`fedskew.core.handoff`);
    declines everything outside a :func:`batching` block."""

    def offer(self, request: object) -> LocalResult | SyntheticSet | None:
        rendezvous = _SLOT.rendezvous
        if rendezvous is None:
            return None
        if isinstance(request, LocalTraining):
            return _train(rendezvous, request)
        if isinstance(request, KIPRequest):
            return _condense(rendezvous, request)
        return None

    def unbatched(self, reason: str) -> None:
        rendezvous = _SLOT.rendezvous
        if rendezvous is not None:
            rendezvous.sequential(reason, "condensation")


_HAND_OFF = _RunnerHandOff()


def install_hand_off() -> None:
    """Let ``train_local`` and KIP offer their work to a batched runner (once per process,
    idempotent). The batched runner calls it when it is made, so that no import installs anything; outside a
    :func:`batching` block the hand-off declines."""
    handoff.install_hand_off(_HAND_OFF)
