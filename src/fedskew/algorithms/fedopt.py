"""Server optimisers on FedAvg's pseudo-gradient: FedAvgM and FedAdam.

Clients train exactly as in FedAvg. The server forms Delta = sum_i (n_i/n) w_i - w (the weighted mean of
the returned models minus the global model; Reddi et al. write the opposite sign and subtract) and steps
along it with a stateful optimiser instead of jumping to the mean (:mod:`fedskew.components.server_opt`):

- ``fedavgm``: Hsu, Qi & Brown (2019, "Measuring the Effects of Non-Identical Data Distribution for
  Federated Visual Classification"), server momentum v <- beta v + Delta; w <- w + server_lr v.
- ``fedadam``: Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar & McMahan (ICLR 2021, "Adaptive
  Federated Optimization", Alg. 2), Adam without bias correction.

The optimiser state (tensor dicts per parameter) lives in ``server.state`` and is checkpointed; buffers
(BatchNorm statistics) take the weighted mean. Wire cost: FedAvg's.
"""

from __future__ import annotations

import torch

from fedskew.algorithms.base import Replies, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.server_opt import Tensors, adam_step, apply_server_step, momentum_step, param_keys, zeros_like


class _ServerOptAvg(FedAvg):
    """FedAvg whose server steps along the pseudo-gradient with :meth:`server_step`."""

    slots: tuple[str, ...] = ()  # names of the optimiser-state tensor dicts in ``server.state``

    def setup(self, server: ServerContext) -> None:
        params = dict(server.model.named_parameters())
        for slot in self.slots:
            server.state[slot] = zeros_like({k: params[k].detach() for k in param_keys(server.model)})

    def aggregate(self, server: ServerContext, replies: Replies) -> None:
        if not replies:  # no pseudo-gradient this round: the model and optimiser state stay as they are
            return
        mean, _ = self.average(server, replies, [m.arrays for _, m in replies])

        def step(weights: Tensors, delta: Tensors) -> None:
            self.server_step(weights, delta, server.state)

        apply_server_step(server.model, mean, step)

    def server_step(self, weights: Tensors, delta: Tensors, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Move ``weights`` along ``delta`` in place, updating the optimiser ``state``."""
        raise NotImplementedError


@register_algorithm("fedavgm")
class FedAvgM(_ServerOptAvg):
    """FedAvg with server momentum."""

    paper = (
        'Hsu, Qi & Brown, arXiv:1909.06335 (2019), "Measuring the Effects of Non-Identical Data Distribution '
        'for Federated Visual Classification"'
    )

    slots = ("momentum_buffer",)

    class Params(FedAvg.Params):
        # Hsu et al. sweep the server momentum beta from 0 to 0.997 (Sec. 4); beta = 0.9 with server lr 1
        # is the common setting of later benchmarks, kept as the default.
        server_lr: float = 1.0
        server_momentum: float = 0.9

        positive = ("server_lr",)
        fractions = ("server_momentum",)

    params: Params

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def server_step(self, weights: Tensors, delta: Tensors, state: dict[str, dict[str, torch.Tensor]]) -> None:
        p = self.params
        momentum_step(weights, delta, state["momentum_buffer"], p.server_momentum, p.server_lr)


@register_algorithm("fedadam")
class FedAdam(_ServerOptAvg):
    """FedAvg with a server Adam step."""

    paper = (
        'Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan, ICLR 2021, "Adaptive Federated '
        'Optimization"'
    )

    slots = ("adam_m", "adam_v")

    class Params(FedAvg.Params):
        # Reddi et al. fix beta1 = 0.9 and beta2 = 0.99 and tune the server lr eta and tau per task on
        # log-spaced grids (Sec. 5, App. D); eta = 0.01 and tau = 1e-3 lie inside those grids and are
        # starting points to tune, not universal optima.
        server_lr: float = 0.01
        beta1: float = 0.9
        beta2: float = 0.99
        tau: float = 1e-3

        positive = ("server_lr", "tau")
        fractions = ("beta1", "beta2")

    params: Params

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def server_step(self, weights: Tensors, delta: Tensors, state: dict[str, dict[str, torch.Tensor]]) -> None:
        p = self.params
        adam_step(weights, delta, state["adam_m"], state["adam_v"], p.server_lr, p.beta1, p.beta2, p.tau)
