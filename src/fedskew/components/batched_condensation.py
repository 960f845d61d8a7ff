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
  layered forward). The axis holds slots of one width, laid out for each pass
  (:mod:`fedskew.components.batched_slots`): a client's batch fills one or more of them
  (:data:`MAX_SLOTS_PER_CLIENT`), its last slot padded with copies of its first sample, which count
  nowhere: they are left out of the class means, and out of the batch statistics of BatchNorm layers (a
  masked batch normalisation, :mod:`fedskew.components.batched_dm_networks`, whose statistics are each
  client's over all its slots of the pass, as each client's network normalises its own batch); instance and
  group norms, pooling and activations act per sample;
- the class means of all clients as one segment sum a pass, L_DM of every client, and FedAF's CDC term
  (:class:`~fedskew.condense.swd.ClassSWD`) of every client and class as one batched sliced Wasserstein
  distance (directions drawn from each client's own stream, as alone); with BatchNorm, the term's
  evaluation-mode logits come from a further batched forward of the synthetic images with the running
  statistics each network would hold after the step's forwards (one momentum update each), as they are
  alone;
- **one backward** and **one SGD update** (a ``torch.optim.SGD`` as alone) of all clients' images, which
  sit in one tensor; FedDM's gradient clipping scales each client's part by its own norm.

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
from typing import Any

import numpy as np
import torch
from torch import nn

from fedskew.components.batched_dm_networks import network_plan, stacked_sampler
from fedskew.components.batched_slots import Slots, lay_out
from fedskew.components.stacked_forward import NATURAL
from fedskew.condense.distribution_matching import (
    DMRequest,
    at_least_float32,
    prepared,
    segment_means_at,
)
from fedskew.condense.samplers import sampler_template
from fedskew.condense.swd import ClassSWD, sliced_wasserstein_stacked
from fedskew.condense.synthetic import SyntheticSet, sample_indices

CHANNELS_LAST_DEVICES = {"cpu"}
"""Device types whose batched forward takes channels-last batches (as :mod:`fedskew.components.batched`)."""

_DTYPES = (torch.float32, torch.float64)

USE_STACKED_SAMPLER = True
"""Make FedDM's and FedAF's networks of a step for all clients at once
(:class:`~fedskew.components.batched_dm_networks.StackedSampler`); tests turn it off to check the path through
each client's own sampler."""


MAX_SLOTS_PER_CLIENT = 2
"""A client's batch may be spread over several slots of the channel axis (each with a copy of its network's
weights), so that the slots have one width with little padding: at most this many slots a client on
average. Samples in the stacked batch over the clients' own, round 1 of seed 0, one pooled pass (benchmarks/
batched_condensation.py's configs): the quick FedAF config 1.71x with one slot a client, 1.14x with two
(19 slots of 42); the paper config 2.01x and 1.24x (18 slots of 437). Not measured on a GPU: more slots pad
less but run more, narrower groups."""


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
    if network_plan(template, extra is not None) is None:
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


class _StackedDM:
    """The batched matching of K clients of one group (see the module's docstring).

    A step's forwards follow :func:`~fedskew.condense.distribution_matching.dm_loss`: where the reading is
    ``"separate"`` or the network does not couple its batch, one pass of every client's real batch (class by
    class) without a graph, then one of its synthetic images (class by class) with one; with BatchNorm and
    ``"pooled"``, one pass of both, a client's real batch then its synthetic images. Each pass has its own
    slots (:func:`~fedskew.components.batched_slots.lay_out`); the slots' weights are the clients' stacked
    weights gathered by slot."""

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
        plan = network_plan(template, bool(self.swd))
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
        self.sampler = stacked_sampler(requests, template, self.device) if USE_STACKED_SAMPLER else None
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

    def _slots(self, rows: list[list[int]], segments: list[list[int]], counts: list[int], max_slots: int) -> Slots:
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
        takes min(real_batch, its real images) real images every step, and all its synthetic ones). The
        segments are the clients' classes, client by client and class by class, in the real pass and in the
        synthetic pass alike; the pooled pass numbers its synthetic segments after all the real ones."""
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
        self.passes: dict[str, Slots] = {}
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
        # the sequential optimiser on all clients' images at once: SGD acts on each value alone
        optimizer = torch.optim.SGD([images], lr=cfg.image_lr, momentum=cfg.momentum)
        for step in range(cfg.iterations):
            loss = self._loss(step, images)
            optimizer.zero_grad()
            loss.backward(inputs=[images])
            if cfg.clip_norm is not None and images.grad is not None:
                with torch.no_grad():
                    self._clip(images.grad, cfg.clip_norm)
            optimizer.step()
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

    def _embed(self, slots: Slots, source: torch.Tensor, training: bool = True) -> torch.Tensor:
        """The features of a pass's samples (rows of ``source``, laid out by ``slots``): ``(K'*W, D)``."""
        norms = self.plan.norms
        norms.slots, norms.training = slots, training
        h = self._stacked_input(source[slots.gather])
        for step in self.plan.features:
            h = step(slots.params, h, slots.slots)
        return at_least_float32(h).reshape(slots.slots * slots.width, h.shape[2])  # (K', W, D) flat

    def _means(self, slots: Slots, emb: torch.Tensor) -> torch.Tensor:
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
