"""FedRS (Li & Zhan, KDD 2021, "FedRS: Federated Learning with Restricted Softmax for Label Distribution
Non-IID Data"): FedAvg whose clients train with a restricted softmax, p_c proportional to
exp(alpha_c * z_c), where alpha_c = 1 for a class the client has samples of and alpha_c = alpha (< 1) for a
missing class (the method's restricted softmax), so that local training pushes the missing classes' weights
less. The client's classes come from its own labels and stay on the client: the wire is FedAvg's."""

from __future__ import annotations

from dataclasses import replace

import torch

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.trainer import LogitAdjust
from fedskew.privacy.uploads import WEIGHTS


def restriction(counts: torch.Tensor, alpha: float) -> torch.Tensor:
    """FedRS's per-class scale (``(C,)``, float32) for a client's class ``counts``: 1 where the client has
    samples of the class, ``alpha`` where it has none."""
    scale = torch.full(counts.shape, alpha, dtype=torch.float32, device=counts.device)
    return scale.masked_fill(counts > 0, 1.0)


def restricted_logits(logits: torch.Tensor, counts: torch.Tensor, alpha: float) -> torch.Tensor:
    """A batch of ``logits`` (``(B, C)``) with the logits of the client's missing classes scaled by ``alpha``
    and the others untouched."""
    return logits * restriction(counts, alpha).to(logits.dtype)


@register_algorithm("fedrs")
class FedRS(FedAvg):
    """FedAvg with the restricted softmax (FedRS, Li & Zhan, KDD 2021); ``alpha = 1`` is FedAvg exactly."""

    paper = (
        'Li & Zhan, KDD 2021, "FedRS: Federated Learning with Restricted Softmax for Label Distribution '
        'Non-IID Data"'
    )

    class Params(FedAvg.Params):
        # The missing classes' scale alpha in [0, 1]. The authors' code (lxcnju/FedRepo) runs
        # alpha in {0.9, 0.5, 0.1} (train_lab.py, line 166, commit 617ee015); 0.5 is its middle value.
        alpha: float = 0.5

        unit = ("alpha",)

    params: Params
    upload = replace(WEIGHTS, dpsgd="its loss uses the client's class counts, which DP-SGD does not privatise")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def logit_adjust(self, client: ClientContext) -> LogitAdjust | None:
        alpha = self.params.alpha
        if alpha == 1:
            return None  # no restriction: FedAvg's cross-entropy, bit for bit
        scale = restriction(client.class_counts(), alpha)  # from the client's own labels; never sent

        def adjust(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return logits * scale.to(logits.dtype)

        return adjust
