"""FedRS (Li & Zhan, KDD 2021, "FedRS: Federated Learning with Restricted Softmax for Label Distribution
Non-IID Data"): FedAvg whose clients train with a restricted softmax, p_c proportional to
exp(alpha_c * z_c), where alpha_c = 1 for a class the client has samples of and alpha_c = alpha (< 1) for a
missing class (the method's restricted softmax), so that local training pushes the missing classes' weights
less. ``scaling = "proportional"`` is the authors' code's softer scale, alpha + (1 - alpha) n_c / max_c' n_c'
for every class (1 for the client's most frequent class, alpha for a missing one). The client's classes come
from its own labels and stay on the client: the wire is FedAvg's."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch

from fedskew.algorithms.base import ClientContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.components.trainer import LogitAdjust
from fedskew.privacy.uploads import WEIGHTS

Scaling = Literal["absent", "proportional"]


def restriction(counts: torch.Tensor, alpha: float, scaling: Scaling = "absent") -> torch.Tensor:
    """FedRS's per-class scale (``(C,)``, float32) for a client's class ``counts``. ``"absent"`` (the paper):
    1 where the client has samples of the class, ``alpha`` where it has none. ``"proportional"`` (the
    authors' code): alpha + (1 - alpha) n_c / max_c' n_c'."""
    if scaling == "proportional":
        share = counts.to(torch.float32) / counts.max().clamp(min=1).to(torch.float32)
        return alpha + (1.0 - alpha) * share
    scale = torch.full(counts.shape, alpha, dtype=torch.float32, device=counts.device)
    return scale.masked_fill(counts > 0, 1.0)


def restricted_logits(logits: torch.Tensor, counts: torch.Tensor, alpha: float,
                      scaling: Scaling = "absent") -> torch.Tensor:
    """A batch of ``logits`` (``(B, C)``) scaled per class by :func:`restriction`: by default the logits of the
    client's missing classes by ``alpha`` and the others untouched."""
    return logits * restriction(counts, alpha, scaling).to(logits.dtype)


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
        # "absent": the paper's restricted softmax (alpha for a missing class, 1 for the others);
        # "proportional": the authors' code (algorithms/fedrs.py lines 185-189), alpha + (1 - alpha) n_c / max n.
        scaling: Scaling = "absent"

        unit = ("alpha",)

    params: Params
    upload = replace(WEIGHTS, dpsgd="its loss uses the client's class counts, which DP-SGD does not privatise")

    sum_only_uploads = "num_samples"  # secure aggregation: only the train replies' num_samples-weighted mean is read

    def logit_adjust(self, client: ClientContext) -> LogitAdjust | None:
        alpha = self.params.alpha
        if alpha == 1:
            return None  # no restriction: FedAvg's cross-entropy, bit for bit
        scale = restriction(client.class_counts(), alpha, self.params.scaling)  # the client's own labels; never sent

        def adjust(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return logits * scale.to(logits.dtype)

        return adjust
