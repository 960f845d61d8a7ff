"""KIP of many clients at once (HFLDD's distillation, issue 34): one batched step of every client's support set.

:func:`kip_batched` takes the :class:`~fedskew.condense.kip.KIPRequest` of each client (handed over by a batched
runner, ``clients_in_parallel``) and runs their steps together. At each step every client draws what it draws
alone (its target batch, from its own generator); then, for all K clients at once, the NTK kernels
(:func:`~fedskew.condense.kip.ntk_fc_relu_stacked`: batched products), the ridge solves (one batched
``torch.linalg.solve``), the loss, one backward and one Adam step of all clients' images, which sit in one
tensor (Adam acts on each value alone, so this is each client's Adam).

Only clients whose support sets and target batches have the same sizes step together (a group); groups run one
after another. (Padding every client to the largest, as this module did before 2026-11-28, made a step compute
2.6 to 3.1 times the FLOPs of one client after another, on HFLDD's KIP of Dirichlet clients holding one to five
classes, and throw the excess away.) Results equal :func:`~fedskew.condense.kip.kip` per
client up to float rounding (tests/components/test_batched_kip.py, float64; KIP's kernels and solves are
float64 anyway). What cannot batch says why (:func:`why_kip_sequential`): the random ConvNet kernel
(``rf_convnet``, networks drawn for every client and step), learned labels, mixed precision, and a support set
that starts with repeated images (``ipc`` above the images a class holds, with ``init = "real"``): its kernel
matrix is singular (condition numbers of 1e19 to 1e51 measured on HFLDD's test config), so that KIP's result
depends on the last bits of every product (even in float64, any other order of the same sums ends elsewhere),
and only the sequential order reproduces the sequential result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fedskew.condense.kip import KIPRequest, ntk_fc_relu_stacked
from fedskew.condense.synthetic import SyntheticSet


def why_kip_sequential(request: KIPRequest) -> str | None:
    """Why this KIP cannot run batched with other clients' (None: it can)."""
    cfg = request.cfg
    if cfg.kernel != "ntk":
        return f"KIP's {cfg.kernel} kernel draws networks for every client and step (no batched form)"
    if cfg.learn_labels:
        return "KIP with learned labels (no batched form yet)"
    if cfg.amp != "off":
        return f"mixed precision (amp = {cfg.amp})"
    flat = request.images.flatten(1)
    if torch.unique(flat, dim=0).shape[0] < flat.shape[0]:
        return ("its support set starts with repeated images (more per class than the client holds): K_ss is "
                "singular and KIP's result hangs on the last bits of every product, so a batched step would change "
                "it beyond rounding")
    return None


def kip_batched(requests: Sequence[KIPRequest]) -> list[SyntheticSet]:
    """Run every request's KIP, batched; the distilled sets in request order. Requests run together only when their
    settings, data shapes, support sets and target batches are the same size, so that no step computes anything to
    throw away (padding the clients to the largest did 2.6 to 3.1 times the FLOPs of one client after another on
    HFLDD's KIP of the quick FedAF config's clients); the groups run one after another. Each request must have a
    generator of its own."""
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        c = r.cfg
        key = (c.iterations, c.lr, c.reg, c.target_batch, c.depth, c.w_std, c.b_std, r.num_classes,
               tuple(r.x_real.shape[1:]), r.x_real.dtype, r.x_real.device, r.images.dtype, int(r.images.shape[0]),
               min(c.target_batch, int(r.x_real.shape[0])))
        groups[key].append(i)
    out: list[SyntheticSet | None] = [None] * len(requests)
    for members in groups.values():
        for i, res in zip(members, _StackedKIP([requests[i] for i in members]).run(), strict=True):
            out[i] = res
    return [r for r in out if r is not None]


class _StackedKIP:
    """The batched KIP of the K clients of one group: support sets of S images each, target batches of T."""

    def __init__(self, requests: list[KIPRequest]) -> None:
        self.requests = requests
        first = requests[0]
        self.cfg = first.cfg
        self.k, self.s = len(requests), int(first.images.shape[0])
        self.x = torch.cat([r.x_real.flatten(1) for r in requests])  # the real images and their targets, joined
        self.t = torch.cat([r.targets for r in requests])
        self.x_offsets = np.cumsum([0, *[int(r.x_real.shape[0]) for r in requests]]).tolist()
        self.support = torch.stack([r.support.double() for r in requests])  # (K, S, L)

    def _targets(self) -> torch.Tensor:
        """Every client's target batch of this step, drawn as :func:`~fedskew.condense.kip.kip` draws it: indices
        ``(K, T)`` into the joined data."""
        index = [torch.randperm(int(r.x_real.shape[0]), generator=r.generator)[: self.cfg.target_batch] + offset
                 for r, offset in zip(self.requests, self.x_offsets[:-1], strict=True)]
        return torch.stack(index).to(self.x.device, non_blocking=True)

    def _loss(self, images: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        idx = self._targets()
        x_t, y_t = self.x[idx].double(), self.t[idx].double()  # (K, T, d), (K, T, L)
        x_s = images.reshape(self.k, self.s, -1).double()  # (K, S, d)
        k_ss = ntk_fc_relu_stacked(x_s, x_s, cfg.depth, cfg.w_std, cfg.b_std)
        k_ts = ntk_fc_relu_stacked(x_t, x_s, cfg.depth, cfg.w_std, cfg.b_std)
        trace = torch.diagonal(k_ss, dim1=1, dim2=2).sum(1)
        eye = torch.eye(self.s, dtype=k_ss.dtype, device=k_ss.device)
        ridge = (cfg.reg * trace / self.s)[:, None, None] * eye
        prediction = k_ts @ torch.linalg.solve(k_ss + ridge, self.support)
        return 0.5 * ((y_t - prediction) ** 2).sum()

    def run(self) -> list[SyntheticSet]:
        images = torch.cat([r.images for r in self.requests]).detach().clone().requires_grad_(True)
        optimizer = torch.optim.Adam([images], lr=self.cfg.lr)
        for _ in range(self.cfg.iterations):
            loss = self._loss(images)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        done = images.detach()
        return [r.result(done[c * self.s : (c + 1) * self.s].clone()) for c, r in enumerate(self.requests)]
