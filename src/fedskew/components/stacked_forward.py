"""The forward pass of K clients' models at once, on their stacked parameters.

Two ways, one interface (:class:`StackedForward`): ``gather_bk`` picks the K clients' batches out of their
concatenated data, ``forward`` maps the stacked parameters (name -> ``(K, ...)``) and that batch to the
logits ``(K, B, classes)``.

- :class:`LayeredForward`, for models built of the usual layers (convolution, linear, pooling, group
  norm, flatten, point-wise activations, in ``nn.Sequential`` and
  :class:`~fedskew.models.registry.FedModel`): the K clients' feature maps side by side on the channel
  axis, ``(B, K*C, H, W)``, so that each convolution is one grouped convolution (``groups=K``) and each
  linear layer one batched matrix product. It launches about as many kernels as one client's step.
- :class:`VmapForward`, for any other model without running statistics: ``torch.func.vmap`` over
  ``functional_call`` of the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from fedskew.models.registry import FedModel

Params = Mapping[str, torch.Tensor]

POINTWISE = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Softplus, nn.Hardtanh,
    nn.Identity, nn.Dropout,  # dropout only with p = 0 (batching refuses any other)
)
"""Layers that act on each value alone: the same on the clients' stacked activations."""

POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)
"""Layers that act on each channel alone: the same on the grouped layout."""


class Layout:
    """How a forward pass wants the K clients' copies of one parameter, as a view of their natural stack
    ``(K, *shape)`` (contiguous): ``view(k, shape)`` gives the view's size and strides for the first k
    clients, ``natural(leaf, k, shape)`` turns such a view back into ``(k, *shape)`` (for loss terms)."""

    def view(self, k: int, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        size = (k, *shape)
        return size, _contiguous_strides(size)

    def natural(self, leaf: torch.Tensor, k: int, shape: tuple[int, ...]) -> torch.Tensor:
        return leaf


class _Merged(Layout):
    """``(K*shape[0], *shape[1:])``: a grouped convolution's weight, a grouped layer's bias."""

    def view(self, k: int, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        size = (k * shape[0], *shape[1:])
        return size, _contiguous_strides(size)

    def natural(self, leaf: torch.Tensor, k: int, shape: tuple[int, ...]) -> torch.Tensor:
        return leaf.view(k, *shape)


class _Transposed(Layout):
    """``(K, in, out)``: a linear layer's weight as the batched product takes it."""

    def view(self, k: int, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        out, inp = shape
        return (k, inp, out), (out * inp, 1, inp)

    def natural(self, leaf: torch.Tensor, k: int, shape: tuple[int, ...]) -> torch.Tensor:
        return leaf.transpose(1, 2)


class _Row(Layout):
    """``(K, 1, out)``: a linear layer's bias, broadcast over the batch."""

    def view(self, k: int, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (k, 1, shape[0]), (shape[0], shape[0], 1)

    def natural(self, leaf: torch.Tensor, k: int, shape: tuple[int, ...]) -> torch.Tensor:
        return leaf.view(k, *shape)


NATURAL, MERGED, TRANSPOSED, ROW = Layout(), _Merged(), _Transposed(), _Row()


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class StackedForward(Protocol):
    layouts: dict[str, Layout]
    """Parameters (and buffers) the forward wants in a layout other than their natural stack."""

    def gather_bk(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The batch of K clients, ``x[index.t()]`` for the ``(B, K)`` (batch-major) ``index``, in this forward's
        layout."""
        ...

    def forward(self, params: Params, batch: torch.Tensor, k: int) -> torch.Tensor:
        """Logits ``(k, B, classes)`` of the first k clients, their parameters in :attr:`layouts`."""
        ...


Step = Callable[[Params, torch.Tensor, int], torch.Tensor]


class LayeredForward:
    """Layer by layer, K clients side by side (see the module's docstring); build with :func:`layered`."""

    def __init__(self, steps: list[Step], layouts: dict[str, Layout], grouped_input: bool, channels_last: bool) -> None:
        self.steps, self.layouts = steps, layouts
        self.grouped_input, self.channels_last = grouped_input, channels_last

    def gather_bk(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        if not self.grouped_input:
            return x[index.t()]  # (K, B, F)
        b, k = index.shape
        h = x[index]  # (B, K, C, H, W)
        h = h.view(b, k * h.shape[2], *h.shape[3:])
        return h.contiguous(memory_format=torch.channels_last) if self.channels_last and h.dim() == 4 else h

    def forward(self, params: Params, batch: torch.Tensor, k: int) -> torch.Tensor:
        h = batch
        for step in self.steps:
            h = step(params, h, k)
        return h


def layered(model: nn.Module, sample_dims: int, channels_last: bool) -> LayeredForward | None:
    """The layered forward of ``model`` for inputs of ``sample_dims`` dimensions a sample, or None where a
    layer is not one it knows (the caller then uses :class:`VmapForward`)."""
    grouped = sample_dims >= 2
    layouts: dict[str, Layout] = {}
    plan = _plan(model, "", grouped, layouts)
    if plan is None or plan[1]:  # logits must come out flat, one row a sample
        return None
    return LayeredForward(plan[0], layouts, grouped, channels_last)


def _plain_forward(module: nn.Module, cls: type) -> bool:
    return isinstance(module, cls) and type(module).forward is cls.forward  # type: ignore[attr-defined]


def _plan(module: nn.Module, prefix: str, grouped: bool, layouts: dict[str, Layout]) -> tuple[list[Step], bool] | None:
    """The steps of ``module`` and whether its output is in the grouped layout, or None if unknown; the
    layouts its parameters need go into ``layouts``."""
    if _plain_forward(module, nn.Sequential) or _plain_forward(module, FedModel):
        if isinstance(module, FedModel):
            children: list[tuple[str, nn.Module]] = [("features", module.features), ("classifier", module.classifier)]
        else:
            children = list(module.named_children())
        steps: list[Step] = []
        for name, child in children:
            sub = _plan(child, f"{prefix}{name}.", grouped, layouts)
            if sub is None:
                return None
            steps += sub[0]
            grouped = sub[1]
        return steps, grouped
    if isinstance(module, nn.Conv2d) and type(module) is nn.Conv2d:
        if not grouped or module.groups != 1 or module.padding_mode != "zeros":
            return None
        layouts.update({prefix + "weight": MERGED, prefix + "bias": MERGED})
        return [_conv(module, prefix)], True
    if isinstance(module, nn.Linear) and type(module) is nn.Linear and not grouped:
        layouts.update({prefix + "weight": TRANSPOSED, prefix + "bias": ROW})
        return [_linear(prefix, module.bias is not None)], False
    if isinstance(module, nn.GroupNorm) and type(module) is nn.GroupNorm and grouped:
        layouts.update({prefix + "weight": MERGED, prefix + "bias": MERGED})
        return [_group_norm(module, prefix)], True
    if isinstance(module, nn.Flatten) and type(module) is nn.Flatten and (module.start_dim, module.end_dim) == (1, -1):
        return ([_flatten] if grouped else []), False
    kind = type(module)
    if kind in POINTWISE or (kind in POOLS and grouped):
        return [lambda params, h, k: module(h)], grouped
    return None


def _conv(module: nn.Conv2d, prefix: str) -> Step:
    has_bias = module.bias is not None

    def step(params: Params, h: torch.Tensor, k: int) -> torch.Tensor:
        b = params[prefix + "bias"] if has_bias else None
        return F.conv2d(h, params[prefix + "weight"], b, module.stride, module.padding, module.dilation, k)

    return step


def _linear(prefix: str, has_bias: bool) -> Step:
    def step(params: Params, h: torch.Tensor, k: int) -> torch.Tensor:
        if has_bias:
            return torch.baddbmm(params[prefix + "bias"], h, params[prefix + "weight"])
        return torch.bmm(h, params[prefix + "weight"])

    return step


def _group_norm(module: nn.GroupNorm, prefix: str) -> Step:
    def step(params: Params, h: torch.Tensor, k: int) -> torch.Tensor:
        w = params[prefix + "weight"] if module.affine else None
        b = params[prefix + "bias"] if module.affine else None
        return F.group_norm(h, k * module.num_groups, w, b, module.eps)

    return step


def _flatten(params: Params, h: torch.Tensor, k: int) -> torch.Tensor:
    """Grouped ``(B, K*C, H, W)`` to stacked ``(K, B, C*H*W)``."""
    return h.reshape(h.shape[0], k, -1).transpose(0, 1)


class VmapForward:
    """``torch.func.vmap`` over ``functional_call`` of ``model`` (any model without running statistics)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layouts: dict[str, Layout] = {}

        def one(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return functional_call(self.model, params, (x,), strict=False)

        self._batched: Callable[..., Any] = vmap(one)

    def gather_bk(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return x[index.t()]

    def forward(self, params: Params, batch: torch.Tensor, k: int) -> torch.Tensor:
        out = self._batched(dict(params), batch)
        assert isinstance(out, torch.Tensor)
        return out


def stacked_forward(
    model: nn.Module, sample_dims: int, channels_last: bool, allow_layered: bool = True
) -> StackedForward:
    """The forward of K copies of ``model``: layered where it knows every layer, else vmap."""
    found = layered(model, sample_dims, channels_last) if allow_layered else None
    return found if found is not None else VmapForward(model)
