"""The K networks of a batched matching step: their weights made at once, and their forward pass with
each client's own batch statistics.

- :func:`network_plan`: the layered forward of :mod:`fedskew.components.stacked_forward` over a template's
  features (and classifier), plus BatchNorm of K clients side by side (:func:`_batch_norm`): in training
  mode each client's channels are normalised by the statistics of its own samples of the pass, over all its
  slots (:class:`MaskedBatchNorm`, a hand-written backward), in evaluation mode by the running statistics
  its network would hold after the step's training-mode passes;
- :class:`StackedSampler`: the networks of all K clients of a step at once, from FedDM's and FedAF's
  sampler forms, with each client's own draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.components.batched_slots import Slots
from fedskew.components.stacked_forward import MERGED, Layout, Step, _plain_forward, _plan
from fedskew.condense.distribution_matching import DMRequest
from fedskew.condense.samplers import SamplerForm, ball_offset, sampler_form
from fedskew.condense.synthetic import draw_seed, fresh_model
from fedskew.models.registry import FedModel


@dataclass
class Norms:
    """What the masked batch normalisations of a step's stacked forwards share: the slots of the pass
    (:class:`~fedskew.components.batched_slots.Slots`), whether it is a training-mode one, and each layer's
    statistics of each client from the step's training-mode passes, in order (the evaluation-mode pass
    normalises with the running statistics the passes leave, one momentum update each, as a network's
    BatchNorm in training mode)."""

    slots: Slots | None = None
    training: bool = True
    stats: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    """Layer -> for each training-mode pass of the step, each client's mean, variance and counted values a
    channel, ``(K*C,)`` each."""


@dataclass
class NetworkPlan:
    """The stacked forward of a template network (:func:`network_plan`): the layered steps of its features
    and (for FedAF's term) its classifier, the layouts its stacked weights need, the state its BatchNorm
    steps share, and whether it has BatchNorm."""

    features: list[Step]
    classifier: list[Step] | None
    layouts: dict[str, Layout]
    norms: Norms
    batch_norm: bool


def _plan_module(
    module: nn.Module, prefix: str, grouped: bool, layouts: dict[str, Layout], norms: Norms
) -> tuple[list[Step], bool] | None:
    """The layered steps of ``module`` (stacked_forward's, and masked batch normalisation), or None."""
    if _plain_forward(module, nn.Sequential):
        steps: list[Step] = []
        for name, child in module.named_children():
            sub = _plan_module(child, f"{prefix}{name}.", grouped, layouts, norms)
            if sub is None:
                return None
            steps += sub[0]
            grouped = sub[1]
        return steps, grouped
    if type(module) is nn.BatchNorm2d:
        bn: nn.BatchNorm2d = module
        if not grouped or not bn.affine or not bn.track_running_stats or bn.momentum is None:
            return None
        layouts.update({prefix + n: MERGED for n in ("weight", "bias", "running_mean", "running_var")})
        return [_batch_norm(bn, prefix, norms)], True
    # The layers stacked_forward knows (convolution, linear, group norm, flatten, point-wise, pooling).
    return _plan(module, prefix, grouped, layouts)


def _per_client(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Sums of slot-channel ``values`` ``(K'*C,)`` over each client's slots: ``(K*C,)``."""
    return torch.zeros(size, dtype=values.dtype, device=values.device).index_add(0, index, values)


TWO_PASS_DEVICES = {"cpu"}
"""Device types on which each sample's statistics are taken in two passes (see :func:`_sample_var_mean`)."""


def _sample_var_mean(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's and channel's (biased) variance and mean over the map of ``(B, C, H, W)``: one kernel on a
    GPU; on a CPU in two passes (mean, then the centred squares), which is 1.4-2x faster there than
    ``var_mean``'s single pass."""
    if h.device.type not in TWO_PASS_DEVICES:
        return torch.var_mean(h, dim=(2, 3), correction=0)
    mean = h.mean(dim=(2, 3), keepdim=True)
    return (h - mean).square_().mean(dim=(2, 3)), mean[:, :, 0, 0]


class MaskedBatchNorm(torch.autograd.Function):
    """Training-mode batch normalisation of ``(B, K'*C, H, W)`` in which each client's statistics count its own
    samples only, over all its slots: those where ``mask`` (``(B, K'*C)``, 0 or 1) is 1, ``samples``
    (``(K*C,)``) of them a client channel; ``index`` (``(K'*C,)``) gives each slot channel's client channel.

    Two passes over the input forward (each sample's mean and variance, combined into each client's by the
    law of total variance, then the fused normalisation ``F.batch_norm`` with those statistics), three
    backward. The gradient reaches the input only (the stacked weights are frozen) and is 0 for masked
    samples, whose outputs the loss never reads. Returns the output and each client's mean and variance."""

    @staticmethod
    def forward(
        ctx: Any, h: torch.Tensor, mask: torch.Tensor, index: torch.Tensor, samples: torch.Tensor,
        weight: torch.Tensor, bias: torch.Tensor, eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        size = samples.shape[0]
        var_s, mean_s = _sample_var_mean(h)  # (B, K'C) each sample's
        mean = _per_client((mean_s * mask).sum(0), index, size) / samples
        mean_slot = mean[index]
        var = _per_client(((var_s + (mean_s - mean_slot) ** 2) * mask).sum(0), index, size) / samples
        var_slot = var[index]
        out = F.batch_norm(h, mean_slot, var_slot, weight, bias, False, 0.0, eps)
        ctx.save_for_backward(h, mask, index, samples, mean_slot, torch.rsqrt(var_slot + eps), weight)
        ctx.mark_non_differentiable(mean, var)
        return out, mean, var

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        dy = grads[0]
        h, mask, index, samples, mean, invstd, weight = ctx.saved_tensors
        size = samples.shape[0]
        n = samples[index] * (h.shape[2] * h.shape[3])
        # dy is 0 for masked samples, so these sums run over the counted ones, then over each client's slots
        s1 = _per_client(dy.sum(dim=(0, 2, 3)), index, size)[index]
        s2 = invstd * (_per_client((dy * h).sum(dim=(0, 2, 3)), index, size)[index] - mean * s1)  # sum dy * xhat
        scale = weight * invstd / n
        # dx = mask * scale * (n dy - s1 - xhat s2) = mask * (a dy + b h + c)
        a = (weight * invstd) * mask
        b = (-scale * invstd * s2) * mask
        c = (-scale * s1 + scale * invstd * s2 * mean) * mask
        dx = torch.addcmul(c[:, :, None, None], b[:, :, None, None], h)
        dx.addcmul_(a[:, :, None, None], dy)
        return dx, None, None, None, None, None, None


def _batch_norm(module: nn.BatchNorm2d, prefix: str, norms: Norms) -> Step:
    """BatchNorm2d of K clients side by side: in training mode each client's channels are normalised
    by the mean and (biased) variance over its own samples only (:class:`MaskedBatchNorm`, or the plain
    kernel where each client has one slot and no padding); in evaluation mode (one slot a client) by the
    running statistics its network holds after the step's training-mode passes (a momentum update with the
    unbiased variance each, in order), as a network's BatchNorm in training mode leaves them."""
    channels, eps, momentum = module.num_features, module.eps, module.momentum
    assert momentum is not None

    def step(params: dict[str, torch.Tensor] | Any, h: torch.Tensor, k: int) -> torch.Tensor:
        w, b = params[prefix + "weight"], params[prefix + "bias"]  # (K'*C,)
        if norms.training:
            assert norms.slots is not None
            mask, index, samples = norms.slots.channel_mask(channels)
            if mask is None:
                out = F.batch_norm(h, None, None, w, b, True, 0.0, eps)
                with torch.no_grad():
                    var, mean = torch.var_mean(h, dim=(0, 2, 3), correction=0)
            else:
                out, mean, var = MaskedBatchNorm.apply(h, mask, index, samples, w, b, eps)
            count = samples * (h.shape[2] * h.shape[3])
            norms.stats.setdefault(prefix, []).append((mean.detach(), var.detach(), count))
            return out
        run_mean, run_var = params[prefix + "running_mean"], params[prefix + "running_var"]
        for mean, var, count in norms.stats[prefix]:
            run_mean = (1.0 - momentum) * run_mean + momentum * mean
            run_var = (1.0 - momentum) * run_var + momentum * (var * count / (count - 1))
        return F.batch_norm(h, run_mean, run_var, w, b, False, 0.0, eps)

    return step


def network_plan(template: nn.Module, classifier: bool) -> NetworkPlan | None:
    """The stacked forward of ``template``'s features (and, for FedAF's term, of its classifier), or None."""
    features = getattr(template, "features", None)
    if not isinstance(features, nn.Module):
        return None
    layouts: dict[str, Layout] = {}
    norms = Norms()
    feats = _plan_module(features, "features.", True, layouts, norms)
    if feats is None or feats[1]:  # the features must come out flat, one row a sample
        return None
    head = None
    if classifier:
        if not isinstance(template, FedModel) or not _plain_forward(template, FedModel):
            return None
        planned = _plan(template.classifier, "classifier.", False, layouts)
        if planned is None:
            return None
        head = planned[0]
    batch_norm = any(isinstance(m, nn.BatchNorm2d) for m in features.modules())
    return NetworkPlan(feats[0], head, layouts, norms, batch_norm)


class StackedSampler:
    """The networks of all K clients of a step at once, from their samplers' forms
    (:class:`~fedskew.condense.samplers.SamplerForm`, FedDM's ball and FedAF's interpolation):
    each client draws from its generator what its sampler draws (a seed, then FedDM's offset or FedAF's fresh
    network, on the CPU), and the K weight vectors are made together on the device, ``(K, N)``: one copy to
    the device and one or two operations, where the samplers copy, offset and write every tensor of every
    client's network."""

    def __init__(self, forms: list[SamplerForm], template: nn.Module, device: torch.device) -> None:
        self.forms, self.kind = forms, forms[0].kind
        self.params = list(template.parameters())
        dtype = self.params[0].dtype
        with torch.no_grad():
            self.base = torch.stack([torch.cat([p.detach().reshape(-1) for p in f.model.parameters()])
                                     for f in forms]).to(device, dtype)
        if self.kind == "ball":
            self.radius = [f.rho for f in forms]
        else:
            self.gamma = torch.tensor([f.gamma for f in forms], dtype=dtype)[:, None].to(device)
            self.rest = torch.tensor([1.0 - f.gamma for f in forms], dtype=dtype)[:, None].to(device)
        self.device, self.dtype = device, dtype

    def draw(self, step: int, generators: Sequence[torch.Generator]) -> torch.Tensor:
        """The K networks' weights of this step, parameter by parameter as ``template.parameters()``."""
        rows: list[torch.Tensor] = []
        if self.kind == "ball":  # perturbed_model_sampler: a seed (its container's), then the offset
            scales = []
            for g, rho in zip(generators, self.radius, strict=True):
                draw_seed(g)
                directions, scale = ball_offset(self.params, rho, g)
                rows.append(torch.cat([d.reshape(-1) for d in directions]))
                scales.append(scale)
            offsets = torch.stack(rows).to(self.device, non_blocking=True)
            column = torch.tensor(scales, dtype=self.dtype)[:, None].to(self.device, non_blocking=True)
            return torch.addcmul(self.base, column, offsets)
        for g, f in zip(generators, self.forms, strict=True):  # interpolated_model_sampler: a fresh network
            fresh = fresh_model(f.factory, g)
            rows.append(torch.cat([p.detach().reshape(-1) for p in fresh.parameters()]))
        random = torch.stack(rows).to(self.device, self.dtype, non_blocking=True)
        return self.gamma * self.base + self.rest * random


def stacked_sampler(requests: list[DMRequest], template: nn.Module, device: torch.device) -> StackedSampler | None:
    """The requests' samplers as one, where all have a form of one kind and every parameter is a float."""
    forms = [sampler_form(r.sampler) for r in requests]
    kinds = {f.kind if f is not None else None for f in forms}
    if len(kinds) != 1 or None in kinds or not all(p.is_floating_point() for p in template.parameters()):
        return None
    return StackedSampler([f for f in forms if f is not None], template, device)
