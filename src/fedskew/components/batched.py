"""Local SGD of many clients at once: one step of every client still training, as one batched step.

:func:`train_batched` takes the :class:`~fedskew.components.batching.BatchRequest` of each client and
trains each as :func:`~fedskew.components.trainer.train_local` would, up to float rounding:

- each client's batches in its own order (drawn from its own generator when it was handed off);
- its own SGD state: ``train_local``'s ``torch.optim.SGD`` (with the run's ``sgd_impl``) over the stacked
  parameters, which acts on each value alone; a parameter the loss does not reach is left alone, as the
  optimiser leaves a parameter without a gradient;
- its own number of steps: clients are ordered by steps, most first, so the clients still training
  are always the first K' of the stack, and a client that is done drops out of the step;
- a step where some clients have a smaller (last) batch weights each sample, so every client's loss is
  the mean over its own batch;
- its mean loss over its steps, as ``train_local`` reports it.

The trainable parameters of the K clients sit in one ``(K, N)`` tensor (a row a client), so the
optimiser's update is a handful of operations on the rows still training, whatever the model.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedskew.components.batching import BatchRequest
from fedskew.components.stacked_forward import NATURAL, StackedForward, stacked_forward
from fedskew.components.trainer import LocalResult
from fedskew.core.device import current_compute
from fedskew.models.layout import as_model_format, is_channels_last

# The gradients of the stacked parameters are written into views of one (K, N) buffer, laid out like the
# parameters themselves; autograd's note that such strided views "may impair performance" does not apply.
warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")

USE_LAYERED = True
"""Use the layered forward where the model allows it (tests turn it off to check the vmap forward)."""

CHANNELS_LAST_DEVICES = {"cpu"}
"""Device types on which the layered forward feeds a channels-last model channels-last batches: on this
CPU class a batched step of W's CNN runs about 1.5x faster so (docs/performance.md, "Batched clients");
elsewhere it keeps the default layout, which spares the layout copies (two kernels a step fewer or more
on a GPU, where the benefit of channels-last for grouped float32 convolutions is not measured)."""


def train_batched(requests: Sequence[BatchRequest]) -> list[LocalResult]:
    """Train every request's model in place, batched; the results in request order.

    Requests that cannot share a step (other model, optimiser settings, loss terms) form separate
    groups, trained one after another.
    """
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        groups[_group_key(r)].append(i)
    results: list[LocalResult | None] = [None] * len(requests)
    for members in groups.values():
        for i, res in zip(members, _train_group([requests[i] for i in members]), strict=True):
            results[i] = res
    return [r for r in results if r is not None]


def _group_key(r: BatchRequest) -> tuple[Any, ...]:
    m = r.model
    params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters())
    buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in m.named_buffers())
    cfg = (r.cfg.lr, r.cfg.momentum, r.cfg.weight_decay)
    data = (tuple(r.x.shape[1:]), r.x.dtype, r.x.device, r.y.device)
    return (type(m), repr(m), params, buffers, is_channels_last(m), cfg, data, tuple(t.key() for t in r.terms))


_REACHED: dict[tuple[Any, ...], list[str]] = {}
"""Which parameters the loss reaches, by group key (the probe runs once per model and loss)."""


def _reached(r: BatchRequest, names: list[str]) -> list[str]:
    """The trainable parameters the loss reaches (a one-sample probe): the optimiser moves only these."""
    key = (_group_key(r), tuple(names))
    if key in _REACHED:
        return _REACHED[key]
    model = r.model
    params = dict(model.named_parameters())
    with torch.enable_grad():
        xb, yb = as_model_format(r.x[:1], is_channels_last(model)), r.y[:1]
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        for term in r.closures:
            loss = loss + term(model, xb, yb, logits)
        grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    if len(_REACHED) > 64:
        _REACHED.clear()
    _REACHED[key] = reached = [n for n, g in zip(names, grads, strict=True) if g is not None]
    return reached


class _Schedule:
    """The steps of K clients (ordered by steps, most first) as index tensors into their joined data."""

    def __init__(
        self, requests: Sequence[BatchRequest], offsets: list[int], y: torch.Tensor, dtype: torch.dtype
    ) -> None:
        device = y.device
        steps = [len(r.batches) for r in requests]
        self.steps, self.total = steps, max(steps)
        width = max(len(b) for r in requests for b in r.batches)
        k = len(requests)
        index = np.zeros((self.total, k, width), dtype=np.int64)
        sizes = np.full((self.total, k), width, dtype=np.int64)
        every = torch.cat([b for r in requests for b in r.batches]).numpy()  # one host copy for all
        pos = 0
        for c, (r, off) in enumerate(zip(requests, offsets[:-1], strict=True)):
            for t, b in enumerate(r.batches):
                ids = every[pos : pos + len(b)] + off
                pos += len(b)
                index[t, c, : len(ids)] = ids
                index[t, c, len(ids):] = ids[0]  # padding: a real sample of the client, weighted 0
                sizes[t, c] = len(ids)
        self.active = [sum(s > t for s in steps) for t in range(self.total)]
        self.full = [bool((sizes[t, : self.active[t]] == width).all()) for t in range(self.total)]
        # Batch-major (step, B, K): a step's index as the layered forward takes it, without a transpose.
        self.index_bk = torch.from_numpy(np.ascontiguousarray(index.transpose(0, 2, 1))).to(device)
        # The gradient of each client's summed loss is 1 / its batch size: the gradient of its mean loss.
        self.scale = torch.from_numpy(1.0 / sizes).to(device, dtype)
        # Every step's labels, (step, K, B): the clients' labels are small, and a step then reads a slice.
        self.labels = y[torch.from_numpy(index).to(device)]
        self.weights: torch.Tensor | None = None
        if not all(self.full):
            w = (np.arange(width)[None, None, :] < sizes[:, :, None]).astype(np.float64)
            self.weights = torch.from_numpy(w).to(device, dtype)


def _train_group(requests: list[BatchRequest]) -> list[LocalResult]:
    """Train requests that share a model and settings; results in their order."""
    results: list[LocalResult | None] = [None] * len(requests)
    order = sorted(range(len(requests)), key=lambda i: -len(requests[i].batches))
    for i in order:
        if not requests[i].batches:  # max_steps = 0: no step, as train_local
            results[i] = LocalResult(num_samples=int(requests[i].y.shape[0]), steps=0, mean_loss=0.0)
    order = [i for i in order if results[i] is None]
    if order:
        trained = _StackedTraining([requests[i] for i in order]).run()
        for i, res in zip(order, trained, strict=True):
            results[i] = res
    return [r for r in results if r is not None]


def _trainable(r: BatchRequest) -> list[str]:
    return [n for n, p in r.model.named_parameters() if p.requires_grad]


class _StackedTraining:
    """The batched SGD of K clients ordered by steps (most first).

    The trainable parameters live in one flat tensor, parameter by parameter, each parameter's K copies
    side by side (``(K, *shape)``, contiguous), so the clients still training, the first k, are a
    contiguous prefix of every parameter; the gradients and momentum buffers are laid out the same. The
    optimiser updates the whole flat tensor at once: the rows of clients already done change after they
    are done, which no longer matters, as their parameters were copied into their models when they
    finished.
    """

    def __init__(self, requests: list[BatchRequest]) -> None:
        self.requests = requests
        first = requests[0].model
        device = next(first.parameters()).device
        named = dict(first.named_parameters())
        self.param_names = list(named)
        self.natural_shapes = {n: tuple(p.shape) for n, p in named.items()}
        self.names = _reached(requests[0], _trainable(requests[0]))
        self.shapes = [tuple(named[n].shape) for n in self.names]
        k = len(requests)
        self.starts = np.cumsum([0, *[k * named[n].numel() for n in self.names]]).tolist()
        models = [dict(r.model.named_parameters()) for r in requests]
        with torch.no_grad():
            # (N*K,): parameter by parameter, the K clients' copies of each side by side
            self.flat = torch.cat([torch.stack([m[n] for m in models]).reshape(-1) for n in self.names])
            fixed = [n for n in named if n not in self.names] + [n for n, _ in first.named_buffers()]
            # contiguous: the forward takes views of their natural layout (a conv weight may be channels-last)
            self.fixed = {n: torch.stack([_tensor(r.model, n) for r in requests]).contiguous() for n in fixed}
            offsets = np.cumsum([0, *[int(r.y.shape[0]) for r in requests]]).tolist()
            self.x = torch.cat([r.x for r in requests]) if k > 1 else requests[0].x
            self.y = torch.cat([r.y for r in requests]) if k > 1 else requests[0].y
            self.term_data = [
                {key: torch.stack([r.terms[j].data[key] for r in requests]) for key in requests[0].terms[j].data}
                for j in range(len(requests[0].terms))
            ]
        self.schedule = _Schedule(requests, offsets, self.y, self.flat.dtype)
        self.grad = torch.zeros_like(self.flat)
        self.flat.grad = self.grad
        cfg = requests[0].cfg
        # train_local's optimiser over all clients' parameters at once (SGD acts on each value alone)
        self.optimizer = torch.optim.SGD([self.flat], lr=cfg.lr, momentum=cfg.momentum,
                                         weight_decay=cfg.weight_decay, **current_compute().sgd_options())
        self.loss_sum = torch.zeros(k, dtype=torch.float64, device=device)
        channels_last = is_channels_last(first) and self.x.device.type in CHANNELS_LAST_DEVICES
        self.forward: StackedForward = stacked_forward(
            first, self.x.dim() - 1, channels_last, allow_layered=USE_LAYERED
        )
        self.width = k
        self.params: dict[str, torch.Tensor] = {}
        self.data: list[dict[str, torch.Tensor]] = []

    def _row(self, j: int, c: int) -> torch.Tensor:
        """Client ``c``'s parameter ``j`` in :attr:`flat`, as a view of its shape."""
        shape = self.shapes[j]
        size = int(np.prod(shape))
        return self.flat.as_strided(shape, _contiguous(shape), self.starts[j] + c * size)

    def _activate(self, k: int) -> None:
        """The first ``k`` clients' parameters as autograd leaves (views of ``flat`` in the forward's layouts,
        gradients into the same views of ``grad``); clients ``k ..`` are done: their parameters go into
        their models."""
        self._write_back(k, self.width)
        layouts = self.forward.layouts
        params: dict[str, torch.Tensor] = {}
        for j, (name, shape) in enumerate(zip(self.names, self.shapes, strict=True)):
            size, strides = layouts.get(name, NATURAL).view(k, shape)
            leaf = self.flat.as_strided(size, strides, self.starts[j]).requires_grad_()
            leaf.grad = self.grad.as_strided(size, strides, self.starts[j])
            params[name] = leaf
        for name, value in self.fixed.items():
            size, strides = layouts.get(name, NATURAL).view(k, tuple(value.shape[1:]))
            params[name] = value.as_strided(size, strides, 0)
        self.params = params
        self.data = [{n: v[:k] for n, v in d.items()} for d in self.term_data]
        self.width = k

    def _term_params(self, k: int) -> dict[str, torch.Tensor]:
        """Every parameter as ``(k, *shape)``, for the loss terms."""
        layouts = self.forward.layouts
        return {n: layouts.get(n, NATURAL).natural(self.params[n], k, self.natural_shapes[n]) for n in self.param_names}

    def run(self) -> list[LocalResult]:
        s = self.schedule
        self._activate(self.width)
        for t in range(s.total):
            if s.active[t] != self.width:
                self._activate(s.active[t])
            self._step(t, self.width)
        self._write_back(0, self.width)
        losses = (self.loss_sum / torch.tensor(s.steps, dtype=torch.float64, device=self.loss_sum.device)).tolist()
        return [
            LocalResult(num_samples=int(r.y.shape[0]), steps=n, mean_loss=loss)
            for r, n, loss in zip(self.requests, s.steps, losses, strict=True)
        ]

    def _step(self, t: int, k: int) -> None:
        s = self.schedule
        scale = s.scale[t, :k]
        with torch.enable_grad():
            logits = self.forward.forward(self.params, self.forward.gather_bk(self.x, s.index_bk[t, :, :k]), k)
            width = logits.shape[1]
            ce = F.cross_entropy(logits.reshape(k * width, -1), s.labels[t, :k].view(-1), reduction="none")
            ce = ce.view(k, width)
            if not s.full[t]:
                assert s.weights is not None
                ce = ce * s.weights[t, :k]  # padding weighs 0
            summed = ce.sum(1)
            term_params = self._term_params(k) if self.data else {}
            terms = [term.fn(term_params, data, *term.consts)
                     for term, data in zip(self.requests[0].terms, self.data, strict=True)]
            # d/dw of sum_k (mean loss_k + terms_k), the mean taken as the sum times 1 / batch size
            torch.autograd.backward([summed, *terms], [scale, *[torch.ones_like(x) for x in terms]])
        with torch.no_grad():
            # float64 sums of the float32 losses, without a cast of its own (the product is widened as it goes)
            self.loss_sum[:k].addcmul_(summed, scale)
            for term in terms:
                self.loss_sum[:k] += term
        self.optimizer.step()
        self.grad.zero_()  # in place: the leaves' gradients are views of it

    def _write_back(self, first: int, stop: int) -> None:
        """The trained parameters of clients ``first .. stop`` into their models."""
        if first >= stop:
            return
        with torch.no_grad():
            targets: list[torch.Tensor] = []
            sources: list[torch.Tensor] = []
            for c in range(first, stop):
                params = dict(self.requests[c].model.named_parameters())
                for j, name in enumerate(self.names):
                    targets.append(params[name])
                    sources.append(self._row(j, c))
            torch._foreach_copy_(targets, sources)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``."""
    return tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))


def _tensor(model: nn.Module, name: str) -> torch.Tensor:
    found = dict(model.named_parameters()).get(name)
    return (found if found is not None else dict(model.named_buffers())[name]).detach()
