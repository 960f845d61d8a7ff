"""KIP of many clients at once (HFLDD's distillation, issue 34): one batched step of every client's support set.

:func:`kip_batched` takes the :class:`~fedskew.condense.kip.KIPRequest` of each client (handed over by a batched
runner, ``clients_in_parallel``) and runs their steps together. At each step every client draws what it draws
alone (its target batch, from its own generator); then, for all K clients at once, the NTK kernels
(:func:`~fedskew.condense.kip.ntk_fc_relu_stacked`: batched products), the ridge solves (one batched
``torch.linalg.solve``), the loss, one backward and one Adam step of all clients' images, which sit in one
tensor (Adam acts on each value alone, so this is each client's Adam).

Clients hold support sets and target batches of different sizes: each is padded to the largest with zero
rows, which count nowhere: the padded part of a kernel matrix is replaced by the identity (so the solve gives
0 there), the padded targets are weighted 0 in the loss. Results equal :func:`~fedskew.condense.kip.kip` per
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
    """Run every request's KIP, batched; the distilled sets in request order. Requests of other settings or
    data shapes form separate groups, run one after another. Each request must have a generator of its own."""
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        c = r.cfg
        key = (c.iterations, c.lr, c.reg, c.target_batch, c.depth, c.w_std, c.b_std, r.num_classes,
               tuple(r.x_real.shape[1:]), r.x_real.dtype, r.x_real.device, r.images.dtype)
        groups[key].append(i)
    out: list[SyntheticSet | None] = [None] * len(requests)
    for members in groups.values():
        for i, res in zip(members, _StackedKIP([requests[i] for i in members]).run(), strict=True):
            out[i] = res
    return [r for r in out if r is not None]


class _StackedKIP:
    """The batched KIP of the K clients of one group."""

    def __init__(self, requests: list[KIPRequest]) -> None:
        self.requests = requests
        k = self.k = len(requests)
        first = requests[0]
        self.cfg, self.device = first.cfg, first.x_real.device
        dim = int(np.prod(first.x_real.shape[1:]))
        # the real images and their targets, joined, with a zero row at the end for the padding
        self.x = torch.cat([*[r.x_real.flatten(1) for r in requests], first.x_real.new_zeros((1, dim))])
        self.t = torch.cat([*[r.targets for r in requests], first.targets.new_zeros((1, first.targets.shape[1]))])
        self.x_offsets = np.cumsum([0, *[int(r.x_real.shape[0]) for r in requests]]).tolist()
        self.pad_x = int(self.x.shape[0]) - 1
        self.n_t = [min(self.cfg.target_batch, int(r.x_real.shape[0])) for r in requests]
        self.t_width = max(self.n_t)
        sizes = [int(r.images.shape[0]) for r in requests]
        self.img_offsets = np.cumsum([0, *sizes]).tolist()
        width = self.s_width = max(sizes)
        index = np.full((k, width), self.img_offsets[-1], dtype=np.int64)  # the zero row after the images
        for c, n in enumerate(sizes):
            index[c, :n] = np.arange(self.img_offsets[c], self.img_offsets[c] + n)
        self.s_index = torch.from_numpy(index).to(self.device)
        dtype = torch.float64
        mask_s = torch.zeros((k, width), dtype=dtype)
        for c, n in enumerate(sizes):
            mask_s[c, :n] = 1.0
        self.mask_s = mask_s.to(self.device)
        self.pair_s = self.mask_s[:, :, None] * self.mask_s[:, None, :]
        self.eye_pad = torch.diag_embed(1.0 - self.mask_s)  # the identity on the padding
        self.count_s = torch.tensor(sizes, dtype=dtype, device=self.device)
        mask_t = torch.zeros((k, self.t_width), dtype=dtype)
        for c, n in enumerate(self.n_t):
            mask_t[c, :n] = 1.0
        self.mask_t = mask_t.to(self.device)
        support = torch.zeros((k, width, first.support.shape[1]), dtype=dtype, device=self.device)
        for c, r in enumerate(requests):
            support[c, : sizes[c]] = r.support.double()
        self.support = support

    def _targets(self) -> torch.Tensor:
        """Every client's target batch of this step, drawn as :func:`~fedskew.condense.kip.kip` draws it:
        indices ``(K, T)`` into the joined data, the padding on its zero row."""
        index = np.full((self.k, self.t_width), self.pad_x, dtype=np.int64)
        for c, r in enumerate(self.requests):
            idx = torch.randperm(int(r.x_real.shape[0]), generator=r.generator)[: self.cfg.target_batch]
            index[c, : len(idx)] = idx.numpy() + self.x_offsets[c]
        return torch.from_numpy(index).to(self.device, non_blocking=True)

    def _loss(self, images: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        idx = self._targets()
        x_t, y_t = self.x[idx].double(), self.t[idx].double()  # (K, T, d), (K, T, L)
        flat = torch.cat([images.flatten(1), images.new_zeros((1, images[0].numel()))])
        x_s = flat[self.s_index].double()  # (K, S, d)
        k_ss = ntk_fc_relu_stacked(x_s, x_s, cfg.depth, cfg.w_std, cfg.b_std) * self.pair_s
        k_ts = ntk_fc_relu_stacked(x_t, x_s, cfg.depth, cfg.w_std, cfg.b_std) * self.mask_s[:, None, :]
        trace = torch.diagonal(k_ss, dim1=1, dim2=2).sum(1)  # the padding's entries are 0
        ridge = torch.diag_embed((cfg.reg * trace / self.count_s)[:, None] * self.mask_s) + self.eye_pad
        prediction = k_ts @ torch.linalg.solve(k_ss + ridge, self.support)
        return 0.5 * (((y_t - prediction) ** 2) * self.mask_t[:, :, None]).sum()

    def run(self) -> list[SyntheticSet]:
        images = torch.cat([r.images for r in self.requests]).detach().clone().requires_grad_(True)
        optimizer = torch.optim.Adam([images], lr=self.cfg.lr)
        for _ in range(self.cfg.iterations):
            loss = self._loss(images)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        done = images.detach()
        return [r.result(done[self.img_offsets[c] : self.img_offsets[c + 1]].clone())
                for c, r in enumerate(self.requests)]
