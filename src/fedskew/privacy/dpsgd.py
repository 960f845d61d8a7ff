"""Sample-level DP-SGD on a client (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016,
Algorithm 1): each step's gradient is the sum of the batch's per-sample gradients, each clipped to L2 norm
``clip`` (jointly over all parameters), plus N(0, (noise_multiplier * clip)^2) noise on every coordinate,
divided by the expected batch size; the optimiser then steps as usual.

:func:`~fedskew.components.trainer.train_local` runs it when given ``private=SampleDP(...)``. The per-sample
gradients come from ``torch.func`` (``vmap`` over the batch of ``grad`` of a ``functional_call``), of the
loss ``train_local`` trains with: the cross-entropy and the method's loss terms, each term as its marker says
(:func:`per_sample`, :func:`data_free`, :func:`couples_samples`):

- a per-sample term (a mean over the batch of values each of one sample: MOON's contrastive loss, FedNTD's
  distillation) is evaluated on each sample alone, inside that sample's clipped gradient;
- a parameter-only term (FedProx's and FedDyn's, every ``stacked_term``; FedGen's head term on generated
  embeddings) reads none of the client's samples: its gradient is added once per step, unclipped, outside
  the noised sum. The step stays private: that gradient is a function of the current parameters (themselves
  the result of earlier noised steps) and of data that is not the client's samples (the received global
  model, a state built from the client's own earlier private updates), so adding it is post-processing of
  what the mechanism released, like weight decay and momentum;
- a term that couples the samples of a batch (FedDecorr's embedding correlation) has no per-sample gradient
  and is refused, as is an unmarked term and a logit adjustment not marked per-sample (FedLC's, FedRS's and
  FedETF's read the client's label counts, a statistic of all its samples that no per-sample clip bounds).

BatchNorm mixes the samples of a batch and is refused (as Opacus does); group or instance normalisation is
per sample. The noise comes from ``SampleDP.generator`` (:mod:`fedskew.privacy.mechanisms`), so a run is
reproducible. Batches are the trainer's shuffled fixed-size batches (each sample once per epoch, the last
batch smaller) unless ``poisson`` asks for Poisson sampling; the accountant's sampled Gaussian mechanism
assumes Poisson sampling, so with shuffled batches its epsilon is an approximation (docs/privacy.md, "sample").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from fedskew.core.device import Compute, autocast
from fedskew.core.errors import ConfigError
from fedskew.models.layout import shuffled_batches
from fedskew.privacy.mechanisms import gaussian_noise_like

_TINY = 1e-12  # as mechanisms.clip_rows: a zero gradient stays zero
_MARK = "dp_sgd"
Kind = Literal["sample", "params"]
Fn = TypeVar("Fn", bound=Callable[..., Any])


@dataclass
class SampleDP:
    """What DP-SGD needs from the caller, and what it reports back.

    ``clip``: each sample's gradient's L2 bound; ``noise_multiplier``: noise std / ``clip``; ``generator``: the
    noise's stream. Filled by training: ``steps``, the noisy steps taken (added to, so one object per
    ``train_local`` call is the plain use), and ``sample_rate``, each step's sampling rate for the accountant
    (expected batch size / n, at most 1). ``poisson`` (not part of the glue's contract; default False): draw
    each step's batch by Poisson sampling at that rate instead of the trainer's shuffled fixed-size batches.
    """

    clip: float
    noise_multiplier: float
    generator: torch.Generator
    steps: int = 0
    sample_rate: float = 0.0
    poisson: bool = False


def per_sample(fn: Fn) -> Fn:
    """Mark a loss term (or a logit adjustment) as per-sample: a mean over the batch of values each of which
    depends on one sample (and on the parameters, frozen models, the client's earlier private results), so that
    on a batch of one it is that sample's value. DP-SGD evaluates it on each sample alone and clips it in."""
    setattr(fn, _MARK, "sample")
    return fn


def data_free(fn: Fn) -> Fn:
    """Mark a loss term as parameter-only: it reads none of the client's samples (it is called with an empty
    batch under DP-SGD), so its gradient is added once per step, unclipped (module docstring)."""
    setattr(fn, _MARK, "params")
    return fn


def couples_samples(fn: Fn, what: str) -> Fn:
    """Mark a loss term as coupling the samples of a batch (``what`` names it in DP-SGD's refusal)."""
    setattr(fn, _MARK, ("batch", what))
    return fn


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def term_kind(term: Callable[..., Any]) -> Kind:
    """How DP-SGD treats a loss term; refused in one line when it can have no per-sample gradient."""
    mark = getattr(term, _MARK, None)
    if mark is None and getattr(term, "functional", None) is not None:
        return "params"  # a stacked_term: its FunctionalTerm uses only the parameters (trainer.FunctionalTerm)
    if mark in ("sample", "params"):
        return mark
    if isinstance(mark, tuple):
        raise ConfigError(f"DP-SGD (privacy.mode = \"sample\") cannot clip {mark[1]}: it couples the samples of a "
                          "batch and has no per-sample gradient; turn the term off or use another method")
    raise ConfigError(f"DP-SGD (privacy.mode = \"sample\") needs each loss term marked per-sample or parameter-only "
                      f"(fedskew.privacy.dpsgd.per_sample / data_free); {_name(term)} is not")


def check_private(model: nn.Module, terms: Sequence[Callable[..., Any]], logit_adjust: Callable[..., Any] | None,
                  amp: str) -> list[Kind]:
    """Refuse in one line what DP-SGD cannot privatise; the kinds of ``terms`` otherwise."""
    bn = next((name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)), None)
    if bn is not None:
        raise ConfigError(
            f"DP-SGD (privacy.mode = \"sample\") cannot train BatchNorm ({bn!r} mixes the samples of a batch); use a "
            "per-sample normalisation: [model] net_norm = \"instancenorm\" or \"groupnorm\" (convnet), norm = "
            "\"groupnorm\" (vgg, resnet)")
    if amp == "fp16":
        raise ConfigError("DP-SGD (privacy.mode = \"sample\") does not run with amp = \"fp16\" (its gradient "
                          "scaler does not reach torch.func's per-sample gradients); use amp = \"bf16\" or \"off\"")
    if logit_adjust is not None and getattr(logit_adjust, _MARK, None) != "sample":
        raise ConfigError(
            f"DP-SGD (privacy.mode = \"sample\") refuses the logit adjustment {_name(logit_adjust)}: FedLC, FedRS and "
            "FedETF calibrate with the client's label counts, a statistic of all its samples that no per-sample "
            "clip bounds (an adjustment that reads only its sample may be marked dpsgd.per_sample)")
    return [term_kind(t) for t in terms]


class _SampleLoss(nn.Module):
    """The model and its per-sample loss as one module, so that ``functional_call`` puts the differentiated
    parameters in place for the per-sample terms too (a term may call ``model.classifier``)."""

    def __init__(self, model: nn.Module, terms: Sequence[Callable[..., Any]],
                 adjust: Callable[..., Any] | None) -> None:
        super().__init__()
        self.model = model
        self.terms = list(terms)
        self.adjust = adjust

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.model(x)
        loss = F.cross_entropy(logits if self.adjust is None else self.adjust(logits, y), y)
        for term in self.terms:
            loss = loss + term(self.model, x, y, logits)
        return loss


class PrivateGradients:
    """One client's DP-SGD: its batches and, for each, the privatised gradient put in each ``p.grad``.

    Refuses in one line (:func:`check_private`) what it cannot privatise. :meth:`batches` sets
    ``private.sample_rate``; each :meth:`step` adds one to ``private.steps``.
    """

    def __init__(self, model: nn.Module, terms: Sequence[Callable[..., Any]], logit_adjust: Callable[..., Any] | None,
                 private: SampleDP, compute: Compute | None = None) -> None:
        if not private.clip > 0:
            raise ValueError(f"DP-SGD needs clip > 0, got {private.clip}")
        if not private.noise_multiplier >= 0:
            raise ValueError(f"DP-SGD needs noise_multiplier >= 0, got {private.noise_multiplier}")
        compute = compute or Compute()
        kinds = check_private(model, terms, logit_adjust, compute.amp)
        self.model, self.private, self.compute = model, private, compute
        self.expected = 1  # each step's expected batch size, which its noised sum is divided by (batches sets it)
        self.params_terms = [t for t, k in zip(terms, kinds, strict=True) if k == "params"]
        sample_terms = [t for t, k in zip(terms, kinds, strict=True) if k == "sample"]
        self.objective = _SampleLoss(model, sample_terms, logit_adjust)
        self.names = [name for name, p in self.objective.named_parameters() if p.requires_grad]

        def sample_loss(params: dict[str, torch.Tensor], xi: torch.Tensor,
                        yi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            loss = functional_call(self.objective, params, (xi.unsqueeze(0), yi.unsqueeze(0)))
            return loss, loss.detach()

        self._per_sample = vmap(grad(sample_loss, has_aux=True), in_dims=(None, 0, 0), randomness="different")

    def batches(self, n: int, batch_size: int, generator: torch.Generator,
                device: torch.device | None = None) -> list[torch.Tensor]:
        """One epoch's index batches, as :func:`~fedskew.models.layout.shuffled_batches` takes its arguments: those
        shuffled fixed-size batches or, with ``poisson``, ceil(n / B) batches each holding every sample
        independently with probability B / n (drawn from ``generator`` on the CPU). Sets the expected batch size
        min(B, n) and ``private.sample_rate``, min(B, n) / n."""
        self.expected = max(min(batch_size, n), 1)
        if n > 0:
            self.private.sample_rate = min(batch_size, n) / n
        if not self.private.poisson:
            return shuffled_batches(n, batch_size, generator, device)
        out = []
        for _ in range(math.ceil(n / batch_size)):
            idx = (torch.rand(n, generator=generator, dtype=torch.float64) < self.private.sample_rate).nonzero()
            out.append(idx.squeeze(1) if device is None else idx.squeeze(1).to(device, non_blocking=True))
        return out

    def per_sample_grads(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Each sample's gradient of the per-sample loss (name -> tensor with a batch axis in front) and losses."""
        params = {name: p.detach() for name, p in self.objective.named_parameters() if p.requires_grad}
        with autocast(self.compute.torch_device, self.compute.amp):
            grads, losses = self._per_sample(params, xb, yb)
        return grads, losses

    def clipped_sum(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The sum over the batch of the per-sample gradients, each clipped to joint L2 norm ``clip``.

        Each tensor's per-sample norms are taken in its own dtype (as Opacus does; float64 costs ~7x on the CPU),
        and combined into the joint norm in float64."""
        b = next(iter(grads.values())).shape[0]
        norms = torch.stack([torch.linalg.vector_norm(g.reshape(b, -1), dim=1).double() for g in grads.values()])
        factors = torch.clamp(self.private.clip / torch.clamp(norms.norm(dim=0), min=_TINY), max=1.0)
        return {name: torch.tensordot(factors.to(g.dtype), g, dims=1) for name, g in grads.items()}

    def step(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Put this batch's privatised gradient in each trainable ``p.grad`` (the optimiser's zeroed them) and
        return the batch's loss (detached): ``(sum_i clip(g_i) + N(0, (z C)^2)) / E[B]``, plus the parameter-only
        terms' gradient."""
        params = dict(self.objective.named_parameters())
        if xb.shape[0] > 0:
            grads, losses = self.per_sample_grads(xb, yb)
            summed = self.clipped_sum(grads)
            loss = losses.mean()
        else:  # an empty Poisson batch: the release is the noise alone
            summed = {name: torch.zeros_like(params[name]) for name in self.names}
            loss = torch.zeros((), device=xb.device)
        std = self.private.noise_multiplier * self.private.clip
        values = [summed[name] for name in self.names]
        noised = [v + z for v, z in zip(values, gaussian_noise_like(values, std, self.private.generator),
                                        strict=True)] if std > 0 else values
        for name, g in zip(self.names, noised, strict=True):
            params[name].grad = g / self.expected
        if self.params_terms:
            loss = loss + self._add_parameter_terms(xb, yb)
        self.private.steps += 1
        return loss

    def _add_parameter_terms(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """The parameter-only terms' gradient added to ``p.grad``, unclipped; their value. They see an empty
        batch, so a term marked parameter-only cannot read the samples."""
        with autocast(self.compute.torch_device, self.compute.amp):
            value = sum(t(self.model, xb[:0], yb[:0], torch.empty(0, device=xb.device)) for t in self.params_terms)
        assert isinstance(value, torch.Tensor)
        params = [p for name, p in self.objective.named_parameters() if p.requires_grad]
        if value.requires_grad:
            for p, g in zip(params, torch.autograd.grad(value, params, allow_unused=True), strict=True):
                if g is not None:
                    p.grad = p.grad + g if p.grad is not None else g
        return value.detach()
