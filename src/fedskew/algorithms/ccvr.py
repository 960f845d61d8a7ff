"""CCVR: classifier calibration with virtual representations (Luo, Chen, Hu, Zhang, Liang & Feng,
NeurIPS 2021, "No Fear of Heterogeneity: Classifier Calibration for Federated Learning with Non-IID Data").

Training is FedAvg's. Then, in a calibration round, the server sends the global model to every client;
client k passes its training data through the feature extractor ``features`` (eval mode) and replies, for
each class c, with the count N_{c,k}, the mean mu_{c,k} and the unbiased covariance Sigma_{c,k} of its
features (zeros for a class it holds fewer than one, resp. two, samples of). The server pools them per
class (N_c = sum_k N_{c,k}):

    mu_c    = sum_k (N_{c,k} / N_c) mu_{c,k}
    Sigma_c = sum_k (N_{c,k} - 1)/(N_c - 1) Sigma_{c,k} + sum_k N_{c,k}/(N_c - 1) mu_{c,k} mu_{c,k}^T
              - N_c/(N_c - 1) mu_c mu_c^T

which are exactly the mean and unbiased covariance of the pooled features (Sigma_c = 0 when N_c = 1),
draws ``virtual_per_class`` (M_c) virtual features per class held anywhere from N(mu_c, Sigma_c + ridge I)
with the server's (round, "ccvr") stream, and retrains only ``classifier`` on them with cross-entropy and
plain SGD (``calibration_lr``, ``calibration_batch_size``, ``calibration_epochs``).

Calibration is post hoc, as in the paper (and as FL-bench's ``test``, which calibrates a copy, evaluates
it and restores the uncalibrated weights): the next round trains from FedAvg's uncalibrated classifier,
which the server keeps in ``state`` while the global model holds the calibrated one. So the training
trajectory is FedAvg's under both ``calibrate`` settings; ``"final"`` (default, the paper) calibrates after
the run's last round only, ``"every_round"`` after every round's aggregation (each round's evaluated
model is the calibrated one, as in FL-bench).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.algorithms.base import ClientContext, ServerContext, register_algorithm
from fedskew.algorithms.fedavg import FedAvg
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.params import minimums
from fedskew.privacy.uploads import Withheld

Calibrate = Literal["final", "every_round"]
FEATURE_STATS = "feature_stats"
"""The client task of a calibration round: per-class feature counts, means and covariances."""
_KEPT = "uncalibrated."
"""Prefix of the ``server.state`` keys that hold FedAvg's uncalibrated classifier while the global model
holds the calibrated one."""


def class_feature_stats(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-class count (C,), mean (C, D) and unbiased covariance (C, D, D) of ``features`` (N, D).

    A class with no sample has mean and covariance zero; one with a single sample has covariance zero.
    Computed in float64, returned in ``features``' dtype (counts int64).
    """
    z = features.to(torch.float64)
    d = z.shape[1]
    counts = torch.bincount(labels, minlength=num_classes).to(torch.int64)
    means = torch.zeros(num_classes, d, dtype=torch.float64, device=z.device)
    covs = torch.zeros(num_classes, d, d, dtype=torch.float64, device=z.device)
    for c in range(num_classes):
        n = int(counts[c])
        if n == 0:
            continue
        zc = z[labels == c]
        means[c] = zc.mean(dim=0)
        if n > 1:
            centred = zc - means[c]
            covs[c] = centred.T @ centred / (n - 1)
    return counts, means.to(features.dtype), covs.to(features.dtype)


def pooled_feature_stats(
    counts: torch.Tensor, means: torch.Tensor, covs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The global per-class count (C,), mean (C, D) and covariance (C, D, D), float64, from the clients'
    counts (K, C), means (K, C, D) and unbiased covariances (K, C, D, D): the paper's combination, which
    equals the mean and unbiased covariance of all clients' features pooled. Classes nobody holds get zeros.
    """
    n = counts.to(torch.float64)  # (K, C)
    mu = means.to(torch.float64)
    total = n.sum(dim=0)  # (C,)
    weights = n / total.clamp(min=1)  # (K, C)
    mean = (weights[..., None] * mu).sum(dim=0)
    denom = (total - 1).clamp(min=1)  # N_c <= 1: the sum below is zero anyway
    within = ((n - 1).clamp(min=0) / denom)[..., None, None] * covs.to(torch.float64)
    between = (n / denom)[..., None, None] * (mu[..., :, None] * mu[..., None, :])
    outer = mean[:, :, None] * mean[:, None, :]
    cov = within.sum(dim=0) + between.sum(dim=0) - (total / denom)[:, None, None] * outer
    cov[total <= 1] = 0.0
    cov = (cov + cov.transpose(1, 2)) / 2  # symmetric up to rounding
    return total.to(torch.int64), mean, cov


def sample_virtual_features(
    counts: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor, per_class: int, ridge: float,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` draws from N(mean_c, cov_c + ridge I) for every class with ``counts[c] > 0``, in class
    order: features (M, D) float64 and labels (M,) int64, on the CPU.

    Sampled as mean + eps (V diag(sqrt(max(lambda, 0))))^T from the eigendecomposition V diag(lambda) V^T, so
    a singular (positive semi-definite) covariance needs no ridge; eps ~ N(0, I) comes from ``generator``.
    """
    d = mean.shape[1]
    xs, ys = [], []
    eye = torch.eye(d, dtype=torch.float64)
    for c in range(mean.shape[0]):
        if int(counts[c]) == 0:
            continue
        lam, vec = torch.linalg.eigh(cov[c].cpu().to(torch.float64) + ridge * eye)
        root = vec * lam.clamp(min=0).sqrt()  # root @ root.T = cov + ridge I
        eps = torch.randn(per_class, d, dtype=torch.float64, generator=generator)
        xs.append(mean[c].cpu().to(torch.float64) + eps @ root.T)
        ys.append(torch.full((per_class,), c, dtype=torch.int64))
    if not xs:
        return torch.zeros(0, d, dtype=torch.float64), torch.zeros(0, dtype=torch.int64)
    return torch.cat(xs), torch.cat(ys)


def calibrate_classifier(
    classifier: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float, batch_size: int, epochs: int,
    generator: torch.Generator,
) -> None:
    """Retrain ``classifier`` in place on (x, y) with cross-entropy and plain SGD, shuffling each epoch with
    ``generator`` (CPU); the batches go to the classifier's device and dtype."""
    p0 = next(classifier.parameters())
    opt = torch.optim.SGD(classifier.parameters(), lr=lr)
    classifier.train()
    n = int(y.shape[0])
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            xb, yb = x[idx].to(p0.device, p0.dtype), y[idx].to(p0.device)
            loss = F.cross_entropy(classifier(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


def _classifier(model: nn.Module) -> nn.Linear:
    """The model's head (every fedskew model is a :class:`~fedskew.models.FedModel`)."""
    head = model.classifier
    if not isinstance(head, nn.Linear):
        raise ConfigError("ccvr calibrates a model's linear `classifier`; this model has none")
    return head


@register_algorithm("ccvr")
class CCVR(FedAvg):
    """FedAvg, then the classifier retrained on virtual features drawn from the clients' feature statistics."""

    paper = (
        'Luo, Chen, Hu, Zhang, Liang & Feng, NeurIPS 2021, "No Fear of Heterogeneity: Classifier Calibration '
        'for Federated Learning with Non-IID Data"'
    )

    class Params(FedAvg.Params):
        calibrate: Calibrate = "final"  # the paper calibrates the trained model; "every_round": FL-bench's test()
        virtual_per_class: int = 200  # M_c; FL-bench src/server/ccvr.py line 20 (--sample_per_class)
        calibration_lr: float = 0.01  # FL-bench: SGD at the clients' lr (fedskew's FedAvg lr, 0.01)
        calibration_batch_size: int = 64  # FL-bench: the clients' batch size (fedskew's FedAvg batch, 64)
        calibration_epochs: int = 1  # FL-bench: one pass over the virtual features
        ridge: float = 0.0  # added to each Sigma_c; neither the paper nor FL-bench adds one

        at_least = minimums(virtual_per_class=1, calibration_batch_size=1, calibration_epochs=1, ridge=0)
        positive = ("calibration_lr",)

        def __post_init__(self) -> None:
            super().__post_init__()
            if not math.isfinite(self.ridge):
                raise ConfigError(f"ridge must be a finite number, got {self.ridge}")

    params: Params
    upload = Withheld("class-wise feature statistics (means, covariances) for its calibration, beside its model")

    not_sum_only = (
        "calibrates on each client's per-class feature means and covariances, which the server must see one by one; "
        "SecAgg+ reveals only the sum of the uploads"
    )

    # ---- server ------------------------------------------------------------------------------
    def calibrates(self, server: ServerContext) -> bool:
        """Whether this round ends with a calibration."""
        return self.params.calibrate == "every_round" or server.round == server.rounds

    def round(self, server: ServerContext) -> None:
        """Back to FedAvg's classifier, FedAvg's round, then (when due) the census of feature statistics and
        the calibration."""
        classifier = _classifier(server.model)
        kept = {k[len(_KEPT):]: v for k, v in server.state.items() if k.startswith(_KEPT)}
        if kept:
            classifier.load_state_dict(kept)
            for k in list(server.state):
                if k.startswith(_KEPT):
                    del server.state[k]
        replies = server.exchange("train", self.configure(server))
        self.aggregate(server, replies)
        if not self.calibrates(server):
            return
        server.metrics.update(clients=[cid for cid, _ in replies],
                              samples=sum(m.metrics["num_samples"] for _, m in replies))
        msg = Message(arrays=state_to_arrays(server.model.state_dict()))
        stats = server.exchange(FEATURE_STATS, [(cid, msg) for cid in range(self.fed.num_clients)])
        if not stats:
            return
        counts, mean, cov = pooled_feature_stats(
            torch.stack([m.arrays["counts"].cpu() for _, m in stats]),
            torch.stack([m.arrays["means"].cpu() for _, m in stats]),
            torch.stack([m.arrays["covs"].cpu() for _, m in stats]),
        )
        p = self.params
        gen = server.generator("ccvr")
        x, y = sample_virtual_features(counts, mean, cov, p.virtual_per_class, p.ridge, gen)
        if y.numel() == 0:
            return
        server.state.update({_KEPT + k: v.detach().clone() for k, v in classifier.state_dict().items()})
        calibrate_classifier(classifier, x, y, p.calibration_lr, p.calibration_batch_size, p.calibration_epochs,
                             gen)
        server.metrics.update(calibrated=True, statistics_from=[cid for cid, _ in stats])

    def reply_spec(self, task: str, server: ServerContext) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """A feature-statistics reply: int64 counts (C,), float32 means (C, D) and covariances (C, D, D)."""
        if task == FEATURE_STATS:
            c, d = self.fed.num_classes, _classifier(server.model).in_features
            return {"counts": ((c,), torch.int64), "means": ((c, d), torch.float32),
                    "covs": ((c, d, d), torch.float32)}
        return super().reply_spec(task, server)

    # ---- client ------------------------------------------------------------------------------
    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task != FEATURE_STATS:
            return super().client_step(task, msg, client)
        model = client.model(msg.arrays)
        model.eval()
        parts = []
        with torch.no_grad():
            for start in range(0, client.num_samples, 256):
                parts.append(model.get_submodule("features")(client.x[start:start + 256]).float())
        d = _classifier(model).in_features
        feats = torch.cat(parts) if parts else torch.zeros(0, d, device=client.device)
        counts, means, covs = class_feature_stats(feats, client.y, self.fed.num_classes)
        return Message(arrays={"counts": counts, "means": means.float().contiguous(),
                               "covs": covs.float().contiguous()})
