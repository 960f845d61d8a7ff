"""FedLC (Zhang, Li, Li, Xu, Wu, Ding & Wu, ICML 2022, "Federated Learning with Label Distribution Skew via
Logits Calibration"): FedAvg whose clients take the softmax cross-entropy of calibrated logits,
z_c - tau * n_c^(-1/4) for class c (the method's calibrated loss L_cal), n_c being the client's own number of
samples of class c. Rare local classes get their logit lowered most, i.e. a larger margin; a class the client
lacks (n_c = 0, n_c^(-1/4) infinite) leaves the softmax. The counts stay on the client: the wire is FedAvg's."""

from __future__ import annotations

from dataclasses import replace

import torch

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.trainer import LogitAdjust
from fedskew.core.params import minimums
from fedskew.privacy.uploads import WEIGHTS


def with_absent(counts: torch.Tensor, absent_count: float, dtype: torch.dtype) -> torch.Tensor:
    """The class ``counts`` as ``dtype``, each absent class (``n_c = 0``) counted as ``absent_count``."""
    n = counts.to(dtype)
    return torch.where(counts > 0, n, torch.full_like(n, absent_count))


def calibrated_logits(
    logits: torch.Tensor, counts: torch.Tensor, tau: float, absent_count: float = 0.0
) -> torch.Tensor:
    """FedLC's calibration of a batch of ``logits`` (``(B, C)``) by the client's class ``counts`` (``(C,)``):
    ``z_c - tau * n_c^(-1/4)``, and ``-inf`` for a class with ``n_c = 0`` (the formula's limit: that class
    gets probability 0 in the softmax and no gradient); with ``absent_count > 0`` such a class counts as
    ``absent_count`` samples instead (a finite offset)."""
    if absent_count > 0:
        return logits - tau * with_absent(counts, absent_count, logits.dtype).pow(-0.25)
    present = counts > 0
    offset = tau * counts.clamp(min=1).to(logits.dtype).pow(-0.25)
    return (logits - offset).masked_fill(~present, float("-inf"))


@register_algorithm("fedlc")
class FedLC(FedAvg):
    """FedAvg with logit calibration (FedLC, Zhang et al., ICML 2022); ``tau = 0`` is FedAvg exactly."""

    paper = (
        'Zhang, Li, Li, Xu, Wu, Ding & Wu, ICML 2022, "Federated Learning with Label Distribution Skew via '
        'Logits Calibration"'
    )

    class Params(FedAvg.Params):
        # The calibration's strength tau. The paper's text, as far as could be read here, gives no value;
        # 1.0 is FL-bench's default (src/server/fedlc.py, line 20, commit 0399ff94).
        tau: float = 1.0
        # The count a class the client lacks is given: 0 takes the formula's limit (its calibrated logit is
        # -inf, it leaves the softmax); a positive value is a finite floor (FL-bench and fluke: 1e-8, an
        # offset of 100 tau; 1: as if the client held one sample). docs/algorithms.md, "FedLC".
        absent_count: float = 0.0

        at_least = minimums(tau=0, absent_count=0)

    params: Params
    upload = replace(WEIGHTS, dpsgd="its loss uses the client's class counts, which DP-SGD does not privatise")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def logit_adjust(self, client: ClientContext) -> LogitAdjust | None:
        tau, absent = self.params.tau, self.params.absent_count
        if tau == 0:
            return None  # no calibration: FedAvg's cross-entropy, bit for bit
        counts = client.class_counts()  # from the client's own labels; never sent

        def adjust(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return calibrated_logits(logits, counts, tau, absent)

        return adjust
