"""Server optimisers: the averaged client change is a pseudo-gradient the server steps along.

FedAvg replaces the global model by the clients' weighted mean, which is one server SGD step of rate 1
along Delta = mean_i(w_i) - w. Reddi et al. (ICLR 2021, "Adaptive Federated Optimization", Alg. 2)
generalise this to any server optimiser; Hsu et al. (2019, "Measuring the Effects of Non-Identical Data
Distribution for Federated Visual Classification") add server momentum (FedAvgM). Here Delta points
from the global model towards the clients (the negative of a gradient), so every step *adds*.

Each step function updates ``weights`` (and its optimiser state) in place, so the state can live in
``server.state`` as plain tensor dicts, which the engine checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Tensors = dict[str, torch.Tensor]
ServerStep = Callable[[Tensors, Tensors], None]
"""``step(weights, delta)``: move ``weights`` in place given the pseudo-gradient ``delta``."""


def param_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the trainable parameters.

    Server optimisers and control variates act on parameters only; buffers such as BatchNorm's running
    statistics are not driven by gradients, so they are averaged as in FedAvg.
    """
    return [name for name, _ in model.named_parameters()]


def zeros_like(tensors: Tensors) -> Tensors:
    """A zero tensor of the same shape and dtype for each entry (initial optimiser state)."""
    return {k: torch.zeros_like(v) for k, v in tensors.items()}


def sgd_step(weights: Tensors, delta: Tensors, lr: float) -> None:
    """w <- w + lr * Delta (FedAvg for lr = 1; SCAFFOLD's global step with eta_g, Alg. 1 line 16)."""
    for k, d in delta.items():
        weights[k].add_(d, alpha=lr)


def momentum_step(weights: Tensors, delta: Tensors, buf: Tensors, beta: float, lr: float) -> None:
    """FedAvgM (Hsu et al. 2019, Sec. 3): v <- beta * v + Delta; w <- w + lr * v."""
    for k, d in delta.items():
        buf[k].mul_(beta).add_(d)
        weights[k].add_(buf[k], alpha=lr)


def adam_step(
    weights: Tensors, delta: Tensors, m: Tensors, v: Tensors, lr: float, beta1: float, beta2: float, tau: float
) -> None:
    """FedAdam (Reddi et al. 2021, Alg. 2), without bias correction as in the paper.

    m <- b1 m + (1 - b1) Delta;  v <- b2 v + (1 - b2) Delta^2;  w <- w + lr * m / (sqrt(v) + tau).
    ``tau`` bounds the step where v is tiny (the paper's "degree of adaptivity").
    """
    for k, d in delta.items():
        m[k].mul_(beta1).add_(d, alpha=1 - beta1)
        v[k].mul_(beta2).addcmul_(d, d, value=1 - beta2)
        weights[k].addcdiv_(m[k], v[k].sqrt().add_(tau), value=lr)


def apply_server_step(model: nn.Module, average: Tensors, step: ServerStep) -> None:
    """Load ``average`` into ``model``, except that parameters take ``step`` along Delta = average - w.

    Buffers (and any key that is not a parameter) take the average, as in FedAvg.
    """
    current = model.state_dict()
    new = dict(average)
    keys = param_keys(model)
    weights = {k: current[k].detach().clone() for k in keys}
    step(weights, {k: average[k] - weights[k] for k in keys})
    new.update(weights)
    model.load_state_dict(new)
