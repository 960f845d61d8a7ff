"""Distribution matching of many clients at once: one batched step of every client's images.

:func:`condense_batched` takes the :class:`~fedskew.condense.distribution_matching.DMRequest` of each
client (FedDM's and FedAF's condensations, handed over by a batched runner, ``clients_in_parallel``) and
runs their matching steps together. At each step, every client draws exactly what it draws alone, in the
same order, from its own generator: its network (its own sampler), then each class's real batch. Then:

- **the forwards of** :func:`~fedskew.condense.distribution_matching.dm_loss`, each one pass of all K
  clients' batches through their K networks: the real batches without an autograd graph (the class means are
  constants), then the synthetic images with one; with BatchNorm and ``bn_statistics = "pooled"``, one pass
  of both with a graph through both. The networks' weights are copied into stacked tensors (one
  ``_foreach_copy_``), and the batches sit side by side on the channel axis, so that each convolution is
  one grouped convolution and the classifier one batched product (:mod:`fedskew.components.stacked_forward`'s
  layered forward). The axis holds slots of one width, laid out for each pass (:func:`lay_out`): a
  client's batch fills one or more of them (:data:`MAX_SLOTS_PER_CLIENT`, :func:`slot_width`), its last
  slot padded with copies of its first sample, which count nowhere: they are left out of the class means,
  and out of the batch statistics of BatchNorm layers (a masked batch normalisation,
  :class:`_MaskedBatchNorm`, whose statistics are each client's over all its slots of the pass, as each
  client's network normalises its own batch); instance and group norms, pooling and activations act per
  sample;
- the class means of all clients as one segment sum a pass, L_DM of every client, and FedAF's CDC term
  (:class:`~fedskew.condense.swd.ClassSWD`) of every client and class as one batched sliced Wasserstein
  distance (directions drawn from each client's own stream, as alone); with BatchNorm, the term's
  evaluation-mode logits come from a further batched forward of the synthetic images with the running
  statistics each network would hold after the step's forwards (one momentum update each), as they are
  alone;
- **one backward** and **one SGD update** (``torch.optim.SGD``'s rule) of all clients' images, which sit
  in one tensor; FedDM's gradient clipping scales each client's part by its own norm.

Results equal :func:`~fedskew.condense.distribution_matching.distribution_matching` per client up to
float rounding (tests/components/test_batched_condensation.py, float64). What cannot batch says why
(:func:`why_dm_sequential`) and runs one client at a time: mixed precision, DSA (one transform per class
and client), an extra loss other than FedAF's, a sampler that does not say its network (DM's random
networks), and networks with layers the layered forward does not know (BatchNorm without running
statistics, dropout, custom modules).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedskew.components.stacked_forward import MERGED, NATURAL, Layout, Step, _plan
from fedskew.condense.distribution_matching import (
    DMRequest,
    SamplerForm,
    at_least_float32,
    ball_offset,
    prepared,
    sampler_form,
    sampler_template,
    segment_means_at,
)
from fedskew.condense.swd import ClassSWD, sliced_wasserstein_stacked
from fedskew.condense.synthetic import SyntheticSet, draw_seed, fresh_model, sample_indices
from fedskew.models.registry import FedModel

CHANNELS_LAST_DEVICES = {"cpu"}
"""Device types whose batched forward takes channels-last batches (as :mod:`fedskew.components.batched`)."""

_DTYPES = (torch.float32, torch.float64)

USE_STACKED_SAMPLER = True
"""Make FedDM's and FedAF's networks of a step for all clients at once (:class:`_StackedSampler`); tests turn it
off to check the path through each client's own sampler."""


@dataclass
class _Slots:
    """Where the samples of one stacked forward sit (:func:`lay_out`): each client's samples fill one or more
    slots of one width on the channel axis, the last one padded with copies of the client's first sample,
    which count nowhere (out of the class means and of the batch statistics).

    The flat place of a sample is ``slot * width + i``, its row in the pass's ``(K', W, D)`` embedding
    reshaped to ``(K'*W, D)``."""

    gather: torch.Tensor
    """``(W, K')``: the row of the pass's source at each place."""
    segment: torch.Tensor
    """``(K'*W,)``: the segment of each flat place (padding: the last segment, whose mean is never read)."""
    counts: torch.Tensor
    """``(S+1,)``: each segment's samples (the padding's: 1)."""
    slot_client: torch.Tensor
    """``(K',)``: the client of each slot."""
    mask: torch.Tensor | None
    """``(W, K')``: 1 for a client's own samples, 0 for padding (None: no padding, one slot a client)."""
    samples: torch.Tensor
    """``(K,)``: each client's number of samples."""
    batch: list[int]
    positions: list[list[int]]
    """Client -> the flat place of each of its samples, in the order given."""
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    """The slots' weights (views of the clients' stacked weights, or of ``weights``), set by the user."""
    weights: dict[str, torch.Tensor] | None = None
    """Each slot's copy of its client's weights where a client has several slots (filled at every step)."""
    _channels: dict[int, tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def slots(self) -> int:
        return int(self.gather.shape[1])

    @property
    def width(self) -> int:
        return int(self.gather.shape[0])

    def channel_mask(self, channels: int) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """For a layer of ``channels`` a client: the mask ``(B, K'*C)`` (None: no padding, one slot a client),
        the client channel of each slot channel ``(K'*C,)`` (indices into ``K*C``) and each client channel's
        counted samples ``(K*C,)``."""
        if channels not in self._channels:
            index = (self.slot_client[:, None] * channels + torch.arange(channels, device=self.slot_client.device))
            mask = None if self.mask is None else self.mask.repeat_interleave(channels, dim=1).contiguous()
            self._channels[channels] = (mask, index.reshape(-1), self.samples.repeat_interleave(channels))
        return self._channels[channels]


def lay_out(
    rows: Sequence[Sequence[int]], segments: Sequence[Sequence[int]], counts: Sequence[int], max_slots: int,
    device: torch.device, dtype: torch.dtype,
) -> _Slots:
    """The slots of one stacked forward: client c's samples are the rows ``rows[c]`` of the pass's source, in
    that order, the i-th in segment ``segments[c][i]`` (an index into ``counts``, each segment's samples);
    they fill slots of the width that pads least in at most ``max_slots`` slots (:func:`slot_width`)."""
    batch = [len(r) for r in rows]
    width = slot_width(batch, max_slots)
    dump = len(counts)  # padding: the last segment
    gather: list[list[int]] = []
    segment: list[list[int]] = []
    slot_client: list[int] = []
    positions: list[list[int]] = []
    for c, (own, segs) in enumerate(zip(rows, segments, strict=True)):
        positions.append([len(slot_client) * width + i for i in range(len(own))])
        for at in range(0, len(own), width):
            part, pad = list(own[at : at + width]), width - len(own[at : at + width])
            gather.append(part + [own[0]] * pad)
            segment.append(list(segs[at : at + width]) + [dump] * pad)
            slot_client.append(c)
    seg = np.asarray(segment, dtype=np.int64)
    counted = seg != dump
    one_each = len(slot_client) == len(rows) and bool(counted.all())
    return _Slots(
        gather=torch.tensor(gather, device=device).t(),
        segment=torch.from_numpy(seg.reshape(-1)).to(device),
        counts=torch.tensor([*counts, 1], dtype=dtype, device=device),
        slot_client=torch.tensor(slot_client, device=device),
        mask=None if one_each else torch.from_numpy(counted.T.astype(np.float64)).to(device, dtype),
        samples=torch.tensor(batch, dtype=dtype, device=device),
        batch=batch,
        positions=positions,
    )


@dataclass
class _Norms:
    """What the masked batch normalisations of a step's stacked forwards share: the slots of the pass
    (:class:`_Slots`), whether it is a training-mode one, and each layer's statistics of each client from
    the step's training-mode passes, in order (the evaluation-mode pass normalises with the running
    statistics the passes leave, one momentum update each, as a network's BatchNorm in training mode)."""

    slots: _Slots | None = None
    training: bool = True
    stats: dict[str, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    """Layer -> for each training-mode pass of the step, each client's mean, variance and counted values a
    channel, ``(K*C,)`` each."""


@dataclass
class _Plan:
    features: list[Step]
    classifier: list[Step] | None
    layouts: dict[str, Layout]
    norms: _Norms
    batch_norm: bool


def _plain(module: nn.Module, cls: type) -> bool:
    return isinstance(module, cls) and type(module).forward is cls.forward  # type: ignore[attr-defined]


def _plan_module(
    module: nn.Module, prefix: str, grouped: bool, layouts: dict[str, Layout], norms: _Norms
) -> tuple[list[Step], bool] | None:
    """The layered steps of ``module`` (stacked_forward's, and masked batch normalisation), or None."""
    if _plain(module, nn.Sequential):
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


class _MaskedBatchNorm(torch.autograd.Function):
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


def _batch_norm(module: nn.BatchNorm2d, prefix: str, norms: _Norms) -> Step:
    """BatchNorm2d of K clients side by side: in training mode each client's channels are normalised
    by the mean and (biased) variance over its own samples only (:class:`_MaskedBatchNorm`, or the plain
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
                out, mean, var = _MaskedBatchNorm.apply(h, mask, index, samples, w, b, eps)
            count = samples * (h.shape[2] * h.shape[3])
            norms.stats.setdefault(prefix, []).append((mean.detach(), var.detach(), count))
            return out
        run_mean, run_var = params[prefix + "running_mean"], params[prefix + "running_var"]
        for mean, var, count in norms.stats[prefix]:
            run_mean = (1.0 - momentum) * run_mean + momentum * mean
            run_var = (1.0 - momentum) * run_var + momentum * (var * count / (count - 1))
        return F.batch_norm(h, run_mean, run_var, w, b, False, 0.0, eps)

    return step


def _network_plan(template: nn.Module, classifier: bool) -> _Plan | None:
    """The stacked forward of ``template``'s features (and, for FedAF's term, of its classifier), or None."""
    features = getattr(template, "features", None)
    if not isinstance(features, nn.Module):
        return None
    layouts: dict[str, Layout] = {}
    norms = _Norms()
    feats = _plan_module(features, "features.", True, layouts, norms)
    if feats is None or feats[1]:  # the features must come out flat, one row a sample
        return None
    head = None
    if classifier:
        if not isinstance(template, FedModel) or not _plain(template, FedModel):
            return None
        planned = _plan(template.classifier, "classifier.", False, layouts)
        if planned is None:
            return None
        head = planned[0]
    batch_norm = any(isinstance(m, nn.BatchNorm2d) for m in features.modules())
    return _Plan(feats[0], head, layouts, norms, batch_norm)


def why_dm_sequential(request: DMRequest) -> str | None:
    """Why this distribution matching cannot run batched with other clients' (None: it can)."""
    cfg = request.cfg
    if cfg.amp != "off":
        return f"mixed precision (amp = {cfg.amp})"
    if cfg.dsa is not None:
        return "DSA draws a transform for every class of every client (no batched form)"
    extra = request.extra_loss
    if extra is not None and not isinstance(extra, ClassSWD):
        return "an extra loss term without a batched form"
    template = sampler_template(request.sampler)
    if template is None:
        return "its sampler does not say its network (e.g. DM's fresh random networks)"
    params = list(template.parameters())
    dtypes = {p.dtype for p in params}
    if not params or len(dtypes) != 1 or dtypes.pop() not in _DTYPES or request.x_real.dtype not in _DTYPES:
        return "the network's parameters or the data are not all float32 or float64"
    for m in template.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"the network draws random numbers ({type(m).__name__})"
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
            return "the network has hooks on its forward or backward pass"
    if _network_plan(template, extra is not None) is None:
        return (f"the stacked forward does not know a layer of {type(template).__name__} "
                "(e.g. BatchNorm without running statistics, a custom module)")
    return None


def condense_batched(requests: Sequence[DMRequest]) -> list[SyntheticSet]:
    """Run every request's distribution matching, batched; the condensed sets in request order.

    Requests that cannot share a step (other networks, settings, data shapes, extra terms) form separate
    groups, run one after another. Each request must have a generator and a sampler of its own.
    """
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        groups[_group_key(r)].append(i)
    out: list[SyntheticSet | None] = [None] * len(requests)
    for members in groups.values():
        for i, res in zip(members, _StackedDM([requests[i] for i in members]).run(), strict=True):
            out[i] = res
    return [r for r in out if r is not None]


def _group_key(r: DMRequest) -> tuple[Any, ...]:
    net = sampler_template(r.sampler)
    assert net is not None
    params = tuple((n, tuple(p.shape), p.dtype) for n, p in net.named_parameters())
    buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in net.named_buffers())
    cfg = r.cfg
    settings = (cfg.iterations, cfg.image_lr, cfg.momentum, cfg.clip_norm, cfg.real_batch, cfg.bn_statistics)
    data = (tuple(r.x_real.shape[1:]), r.x_real.dtype, r.x_real.device, r.start.dtype)
    extra = r.extra_loss
    term = None if not isinstance(extra, ClassSWD) else ("swd", extra.projections, extra.local, extra.p)
    return (type(net), repr(net), params, buffers, settings, data, term)


class _StackedSampler:
    """The networks of all K clients of a step at once, from their samplers' forms (:class:`SamplerForm`,
    FedDM's ball and FedAF's interpolation): each client draws from its generator what its sampler draws
    (a seed, then FedDM's offset or FedAF's fresh network, on the CPU), and the K weight vectors are made
    together on the device, ``(K, N)``: one copy to the device and one or two operations, where the samplers
    copy, offset and write every tensor of every client's network."""

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


def _stacked_sampler(requests: list[DMRequest], template: nn.Module, device: torch.device) -> _StackedSampler | None:
    """The requests' samplers as one, where all have a form of one kind and every parameter is a float."""
    forms = [sampler_form(r.sampler) for r in requests]
    kinds = {f.kind if f is not None else None for f in forms}
    if len(kinds) != 1 or None in kinds or not all(p.is_floating_point() for p in template.parameters()):
        return None
    return _StackedSampler([f for f in forms if f is not None], template, device)


MAX_SLOTS_PER_CLIENT = 2
"""A client's batch may be spread over several slots of the channel axis (each with a copy of its network's
weights), so that the slots have one width with little padding: at most this many slots a client on
average. Samples in the stacked batch over the clients' own, round 1 of seed 0 (benchmarks/
batched_condensation.py's configs): the quick FedAF config 1.71x with one slot a client, 1.14x with two
(19 slots of 42); the paper config 2.01x and 1.24x (18 slots of 437). Not measured on a GPU: more slots pad
less but run more, narrower groups."""


def slot_width(sizes: Sequence[int], max_slots: int) -> int:
    """The slot width that pads the batches of ``sizes`` least, in at most ``max_slots`` slots (the widest
    of equal cost)."""
    best: tuple[int, int] | None = None
    for width in sorted({-(-b // j) for b in sizes for j in range(1, max_slots + 1)}, reverse=True):
        slots = sum(-(-b // width) for b in sizes)
        if slots > max_slots:
            continue
        if best is None or slots * width < best[0]:
            best = (slots * width, width)
    assert best is not None  # the largest size is one slot a client
    return best[1]


class _StackedDM:
    """The batched matching of K clients of one group (see the module's docstring).

    A step's forwards follow :func:`~fedskew.condense.distribution_matching.dm_loss`: where the reading is
    ``"separate"`` or the network does not couple its batch, one pass of every client's real batch (class by
    class) without a graph, then one of its synthetic images (class by class) with one; with BatchNorm and
    ``"pooled"``, one pass of both, a client's real batch then its synthetic images. Each pass has its own
    slots (:func:`lay_out`); the slots' weights are the clients' stacked weights gathered by slot."""

    def __init__(self, requests: list[DMRequest]) -> None:
        self.requests = requests
        first = requests[0]
        template = sampler_template(first.sampler)
        assert template is not None
        self.cfg = first.cfg
        self.device = first.x_real.device
        self.swd = [r.extra_loss for r in requests if isinstance(r.extra_loss, ClassSWD)]
        if self.swd and len(self.swd) != len(requests):
            raise ValueError("every request of a group has FedAF's term or none has")
        plan = _network_plan(template, bool(self.swd))
        assert plan is not None
        self.plan = plan
        self.pooled = plan.batch_norm and self.cfg.bn_statistics == "pooled"
        self.k = len(requests)
        self.channels_last = self.device.type in CHANNELS_LAST_DEVICES
        # the stacked weights: name -> (K, *shape), filled from the K networks at every step
        self.param_names = [n for n, _ in template.named_parameters()]
        buffer_names = [n for n, b in template.named_buffers() if b.is_floating_point()]
        self.names = self.param_names + buffer_names
        shapes = dict(template.named_parameters()) | dict(template.named_buffers())
        self.dtype = next(template.parameters()).dtype
        self.stacked = {n: torch.zeros((self.k, *shapes[n].shape), dtype=self.dtype, device=self.device)
                        for n in self.names}
        self.client_params = self._views(self.stacked, self.k)
        self.sampler = _stacked_sampler(requests, template, self.device) if USE_STACKED_SAMPLER else None
        if self.sampler is not None:  # the buffers are the given models', at every step
            with torch.no_grad():
                for n in buffer_names:
                    self.stacked[n].copy_(torch.stack([dict(f.model.named_buffers())[n] for f in self.sampler.forms]))
        self._layout(requests)
        self._swd_plan: Any = None

    def _views(self, stacked: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
        out = {}
        for n, t in stacked.items():
            size, strides = self.plan.layouts.get(n, NATURAL).view(k, tuple(t.shape[1:]))
            out[n] = t.as_strided(size, strides)
        return out

    def _slots(self, rows: list[list[int]], segments: list[list[int]], counts: list[int], max_slots: int) -> _Slots:
        """:func:`lay_out` with the slots' weights: the clients' own where each has one slot, else copies."""
        slots = lay_out(rows, segments, counts, max_slots, self.device, self.dtype)
        slots.params = self.client_params
        if slots.slots != self.k:
            slots.weights = {n: torch.zeros((slots.slots, *t.shape[1:]), dtype=self.dtype, device=self.device)
                             for n, t in self.stacked.items()}
            slots.params = self._views(slots.weights, slots.slots)
        return slots

    def _layout(self, requests: list[DMRequest]) -> None:
        """Where each client's samples sit in each stacked forward (fixed for the whole condensation: a class
        takes min(real_batch, its real images) real images every step, and all its synthetic ones). Class j
        of client c is segment ``s`` of its real images and of its synthetic ones; the pooled pass has both
        sets of segments, the synthetic ones after all real ones."""
        k, cfg = self.k, self.cfg
        self.x = torch.cat([r.x_real for r in requests]) if k > 1 else requests[0].x_real
        self.x_offsets = np.cumsum([0, *[int(r.x_real.shape[0]) for r in requests]]).tolist()
        self.real_cpu = [[idx.cpu() for idx in r.real_indices] for r in requests]
        sizes = [int(r.start.shape[0]) for r in requests]
        self.img_offsets = np.cumsum([0, *sizes]).tolist()
        real_counts: list[int] = []  # each segment's (client by client, class by class)
        syn_counts: list[int] = []
        real_segs: list[list[int]] = []
        syn_segs: list[list[int]] = []
        for r in requests:
            real_segs.append([])
            syn_segs.append([])
            for idx, syn in zip(r.real_indices, r.syn_indices, strict=True):
                real_segs[-1] += [len(real_counts)] * min(cfg.real_batch, int(idx.numel()))
                syn_segs[-1] += [len(syn_counts)] * int(syn.numel())
                real_counts.append(min(cfg.real_batch, int(idx.numel())))
                syn_counts.append(int(syn.numel()))
        self.segments = len(real_counts)
        # a step's real images: the drawn ones, all clients' one after another; its synthetic ones: the images
        real_offsets = np.cumsum([0, *[len(s) for s in real_segs]]).tolist()
        real_rows = [list(range(real_offsets[c], real_offsets[c + 1])) for c in range(k)]
        syn_orders = [torch.cat(r.syn_indices).cpu().tolist() for r in requests]
        syn_rows = [[self.img_offsets[c] + row for row in order] for c, order in enumerate(syn_orders)]
        max_slots = MAX_SLOTS_PER_CLIENT * k
        self.passes: dict[str, _Slots] = {}
        if self.pooled:  # source: the real images, then the synthetic ones
            shifted = [[real_offsets[-1] + row for row in rows] for rows in syn_rows]
            self.passes["pooled"] = self._slots(
                [r + s for r, s in zip(real_rows, shifted, strict=True)],
                [r + [self.segments + j for j in s] for r, s in zip(real_segs, syn_segs, strict=True)],
                real_counts + syn_counts, max_slots)
            syn_pass, skip = self.passes["pooled"], [len(r) for r in real_rows]
        else:
            self.passes["real"] = self._slots(real_rows, real_segs, real_counts, max_slots)
            self.passes["syn"] = self._slots(syn_rows, syn_segs, syn_counts, max_slots)
            syn_pass, skip = self.passes["syn"], [0] * k
        # FedAF's term on the logits: with BatchNorm an evaluation-mode pass of its own, one slot a client
        if self.swd and self.plan.batch_norm:
            syn_pass, skip = self._slots(syn_rows, syn_segs, syn_counts, k), [0] * k
            self.passes["eval"] = syn_pass
        self.syn_position = [dict(zip(order, syn_pass.positions[c][skip[c]:], strict=True))
                             for c, order in enumerate(syn_orders)]
        # which images are whose, for the per-client gradient clipping
        self.owner = torch.repeat_interleave(torch.arange(k), torch.tensor(sizes)).to(self.device)

    def run(self) -> list[SyntheticSet]:
        cfg, requests = self.cfg, self.requests
        images = torch.cat([r.start for r in requests]).detach().clone().requires_grad_(True)
        buf: torch.Tensor | None = None
        for step in range(cfg.iterations):
            loss = self._loss(step, images)
            images.grad = None
            loss.backward(inputs=[images])
            grad = images.grad
            assert grad is not None
            with torch.no_grad():
                if cfg.clip_norm is not None:
                    self._clip(grad, cfg.clip_norm)
                # torch.optim.SGD's rule (no weight decay, no dampening): the first step's buffer is the gradient
                if cfg.momentum:
                    buf = grad.clone() if buf is None else buf.mul_(cfg.momentum).add_(grad)
                    images.add_(buf, alpha=-cfg.image_lr)
                else:
                    images.add_(grad, alpha=-cfg.image_lr)
        done = images.detach()
        return [r.result(done[self.img_offsets[c] : self.img_offsets[c + 1]].clone())
                for c, r in enumerate(requests)]

    def _draw(self, step: int) -> torch.Tensor:
        """Every client's draws of this step, in its own order: its network (its weights into the stacked
        tensors), then each class's real batch. The drawn real images' indices into the joined data, all
        clients' one after another."""
        drawn_all: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        targets: list[torch.Tensor] = []
        if self.sampler is not None:  # every client's network at once, then its real batches
            weights = self.sampler.draw(step, [r.generator for r in self.requests])
            at = 0
            for n in self.param_names:
                t = self.stacked[n]
                size = t[0].numel()
                sources.append(weights[:, at : at + size].view(t.shape))
                targets.append(t)
                at += size
        for c, r in enumerate(self.requests):
            if self.sampler is None:  # the client's own sampler, its network's weights into the stacked tensors
                net = prepared(r.sampler(step, r.generator), self.device)
                state = dict(net.named_parameters()) | dict(net.named_buffers())
                for n in self.names:
                    sources.append(state[n])
                    targets.append(self.stacked[n][c])
            drawn = [sample_indices(idx, r.cfg.real_batch, r.generator) for idx in self.real_cpu[c]]
            drawn_all.append(torch.cat(drawn) + self.x_offsets[c])
        with torch.no_grad():
            torch._foreach_copy_(targets, sources)
            for slots in self.passes.values():
                if slots.weights is not None:
                    for n, t in self.stacked.items():
                        torch.index_select(t, 0, slots.slot_client, out=slots.weights[n])
        return torch.cat(drawn_all).to(self.device, non_blocking=True)

    def _stacked_input(self, h: torch.Tensor) -> torch.Tensor:
        """``(B, K, C, H, W)`` as ``(B, K*C, H, W)``."""
        h = h.reshape(h.shape[0], h.shape[1] * h.shape[2], *h.shape[3:])
        return h.contiguous(memory_format=torch.channels_last) if self.channels_last else h

    def _embed(self, slots: _Slots, source: torch.Tensor, training: bool = True) -> torch.Tensor:
        """The features of a pass's samples (rows of ``source``, laid out by ``slots``): ``(K'*W, D)``."""
        norms = self.plan.norms
        norms.slots, norms.training = slots, training
        h = self._stacked_input(source[slots.gather])
        for step in self.plan.features:
            h = step(slots.params, h, slots.slots)
        return at_least_float32(h).reshape(slots.slots * slots.width, h.shape[2])  # (K', W, D) flat

    def _means(self, slots: _Slots, emb: torch.Tensor) -> torch.Tensor:
        """The segments' means of a pass's features (its padding's last, never read)."""
        return segment_means_at(emb, slots.segment, slots.counts)

    def _loss(self, step: int, images: torch.Tensor) -> torch.Tensor:
        real = self.x[self._draw(step)]
        self.plan.norms.stats.clear()
        if self.pooled:  # one pass of real and synthetic images, with a graph through both
            emb = self._embed(self.passes["pooled"], torch.cat([real, images]))
            means = self._means(self.passes["pooled"], emb)
            diff = means[: self.segments] - means[self.segments : 2 * self.segments]
        else:  # the real class means as constants, then the synthetic images with a graph
            with torch.no_grad():
                real_means = self._means(self.passes["real"], self._embed(self.passes["real"], real))
            emb = self._embed(self.passes["syn"], images)
            diff = real_means[: self.segments] - self._means(self.passes["syn"], emb)[: self.segments]
        loss = (diff * diff).sum()
        if self.swd:
            assert self.plan.classifier is not None
            # with BatchNorm, evaluation mode: the running statistics, a pass of its own; otherwise the same
            # embedding as the training-mode pass (every layer acts per sample)
            slots = self.passes["eval" if "eval" in self.passes else "syn"]
            logits = self._embed(slots, images, False) if "eval" in self.passes else emb
            logits = logits.view(slots.slots, slots.width, -1)
            for head in self.plan.classifier:
                logits = head(slots.params, logits, slots.slots)
            loss = loss + self._swd(logits.reshape(-1, logits.shape[2]), self.syn_position)
        return loss

    def _swd(self, flat: torch.Tensor, positions: list[dict[int, int]]) -> torch.Tensor:
        """Every client's CDC term, ``weight * sum_c SWD``, summed over the clients (one stacked distance per
        group of equal point counts). ``flat`` holds the logits, ``positions[c][row]`` the place of client
        c's synthetic image ``row`` in it. The groups are laid out once (their indices on the device); a step
        only draws the directions, client by client and, within a client, class by class in increasing
        order, from the client's stream, as alone, so that it never waits for the device."""
        if self._swd_plan is None:
            self._swd_plan = self._plan_swd(flat, positions)
        groups, order, weights = self._swd_plan
        dims = flat.shape[1]
        thetas: list[list[torch.Tensor]] = [[] for _ in groups]
        for c, g, dtype in order:
            thetas[g].append(self.swd[c].draw(dims, dtype))
        totals = torch.zeros(self.k, dtype=flat.dtype, device=flat.device)
        for (places, clients, targets), drawn in zip(groups, thetas, strict=True):
            u = flat[places]  # (G, n, L)
            if self.swd[0].local == "mean":
                u = u.mean(dim=1, keepdim=True)
            theta = torch.stack(drawn).to(flat.device, non_blocking=True)
            dist = sliced_wasserstein_stacked(u, targets, theta, self.swd[0].p)
            totals = totals.index_add(0, clients, dist.to(totals.dtype))
        return (weights * totals).sum()

    def _plan_swd(
        self, flat: torch.Tensor, positions: list[dict[int, int]]
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], list[tuple[int, int, torch.dtype]], torch.Tensor]:
        """The CDC term's groups of (client, class) pairs with equal point counts: their places in ``flat``,
        their clients and their targets, on the device; the order of the draws (client, group, dtype)."""
        keys: dict[tuple[int, int], int] = {}
        members: list[list[tuple[int, list[int], torch.Tensor]]] = []
        order: list[tuple[int, int, torch.dtype]] = []
        for c, (r, term) in enumerate(zip(self.requests, self.swd, strict=True)):
            for cls, rows in term.rows(r.labels).items():
                places = [positions[c][int(i)] for i in rows.tolist()]
                target = term.targets[cls]
                key = (len(places), int(target.shape[0]))
                if key not in keys:
                    keys[key] = len(members)
                    members.append([])
                members[keys[key]].append((c, places, target))
                order.append((c, keys[key], torch.promote_types(torch.promote_types(flat.dtype, target.dtype),
                                                                torch.float32)))
        dev = flat.device
        groups = [(torch.tensor([m[1] for m in group], device=dev), torch.tensor([m[0] for m in group], device=dev),
                   torch.stack([m[2] for m in group]).to(dev)) for group in members]
        weights = torch.tensor([t.weight for t in self.swd], dtype=flat.dtype, device=dev)
        return groups, order, weights

    def _clip(self, grad: torch.Tensor, max_norm: float) -> None:
        """Scale each client's part of ``grad`` to norm ``max_norm`` where it is larger (FedDM's clipping of
        the whole image gradient of a client)."""
        squares = grad.reshape(grad.shape[0], -1).pow(2).sum(1)
        norms = torch.zeros(self.k, dtype=squares.dtype, device=squares.device).index_add(0, self.owner, squares)
        norms = norms.double().sqrt()
        scale = torch.where(norms > max_norm, max_norm / norms, torch.ones_like(norms))
        grad.mul_(scale[self.owner].to(grad.dtype).view(-1, *([1] * (grad.dim() - 1))))
