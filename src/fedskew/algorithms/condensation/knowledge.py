"""FedAF's local-global knowledge matching (LGKM, Wang et al., CVPR 2024, Eqs. 12-16) on the server.

The server's training on the union of condensed sets (:mod:`.server`) takes LGKM as an extra loss
term: the class-wise soft labels the clients computed on their real data (R) are matched against the
model's soft labels on the condensed images (T) by a symmetric KL divergence.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.components.trainer import LossTerm

KL_REDUCTIONS = ("batchmean", "mean")
"""How :func:`symmetric_kl` combines its per-row terms (FedAF does not say): PyTorch's two readings."""


def symmetric_kl(log_p: torch.Tensor, log_q: torch.Tensor, reduction: str = "batchmean") -> torch.Tensor:
    """``(KL(P||Q) + KL(Q||P)) / 2`` between row distributions, averaged over rows (FedAF Eq. 15).

    Parameters
    ----------
    log_p, log_q
        (n, L) log-probabilities; row i of each is a distribution over L classes.
    reduction
        ``"batchmean"``: the sum over classes averaged over rows (the default); ``"mean"``: averaged
        over all n x L entries, PyTorch's ``kl_div(reduction="mean")``, which is ``batchmean / L``.

    Notes
    -----
    Summing the two directions gives ``KL(P||Q) + KL(Q||P) = sum_j (p_j - q_j)(log p_j - log q_j)``,
    one non-negative term per class, so the result is symmetric, zero for equal inputs and never
    negative. FedAF writes ``D_KL(R||T)`` between the C x C matrices R and T without saying how rows
    are combined; by default we average over rows (PyTorch's ``batchmean`` convention), so the weight
    ``lambda_glob`` does not depend on how many classes a batch holds. Zero rows give 0.
    """
    _check_reduction(reduction)
    if log_p.shape != log_q.shape or log_p.dim() != 2:
        shapes = f"{tuple(log_p.shape)} and {tuple(log_q.shape)}"
        raise ValueError(f"expected two (n, L) tensors of equal shape, got {shapes}")
    if log_p.shape[0] == 0:
        return torch.zeros((), dtype=log_p.dtype, device=log_p.device)
    per_row = _kl_rows(log_p, log_q)
    return 0.5 * (per_row.mean() if reduction == "batchmean" else per_row.mean() / log_p.shape[1])


def _check_reduction(reduction: str) -> None:
    if reduction not in KL_REDUCTIONS:
        raise ValueError(f"reduction must be one of {KL_REDUCTIONS}, got {reduction!r}")


def _kl_rows(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``KL(P||Q) + KL(Q||P)`` of each row: ``sum_j (p_j - q_j)(log p_j - log q_j)``."""
    return ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(dim=1)


def class_mean_logits(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of ``logits`` over the rows labelled with that class, and the row counts.

    Returns ``(means, counts)`` of shapes (num_classes, L) and (num_classes,); classes without rows
    have a zero mean and count 0. This is FedAF Eq. 5 (real data, on the client), Eq. 6 (condensed
    data) and the argument of the softmax in Eq. 13 (on the server).
    """
    counts = torch.bincount(y, minlength=num_classes)
    sums = torch.zeros((num_classes, logits.shape[1]), dtype=logits.dtype, device=logits.device).index_add(0, y, logits)
    return sums / counts.clamp_min(1).to(logits.dtype)[:, None], counts


def knowledge_matching_term(
    soft_labels: torch.Tensor, known: torch.Tensor, tau: float, weight: float, reduction: str = "batchmean"
) -> LossTerm:
    """FedAF's local-global knowledge matching, ``lambda_glob * L_LGKM`` (Eqs. 13, 15, 16), as a loss term.

    Parameters
    ----------
    soft_labels
        (L, L): row c is r_c, the clients' class-c soft labels averaged by the server (Eq. 12).
    known
        (L,) bool: classes for which some client sent soft labels (r_c exists).
    tau
        Softmax temperature of Eq. 13 (the same tau the clients used for r_{k,c}).
    weight
        lambda_glob.
    reduction
        How the C x C divergence is reduced, see :func:`symmetric_kl`.

    Notes
    -----
    Eq. 13 defines t_c from the mean logits of *all* condensed images of class c under the current
    model. Recomputing that over the whole set at every SGD step would cost a full pass per step; we
    use the images of class c in the current mini-batch, an estimate of the same mean (a batch of
    256 holds ~25 images per class on ten-class data). Classes absent from the batch, or without
    r_c, contribute nothing in that step.

    On the CPU the batch's rows are picked out by index (the computation every CPU result was recorded with);
    on an accelerator every class's row is computed and weighted by whether it counts (:func:`masked_lgkm`), the
    same value up to float rounding without the host syncs that picking rows by a mask, ``bincount`` and a
    per-step copy of R make at every SGD step (FedAF's server epochs took 1.85x FedDM's on an H200 at equal
    FLOPs, docs/performance.md).
    """
    log_r = soft_labels.clamp_min(torch.finfo(soft_labels.dtype).tiny).log()
    placed: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if logits.device.type != "cpu":
            key = (logits.device, logits.dtype)
            if key not in placed:  # R and the known classes moved once, not at every step
                placed[key] = (log_r.to(device=logits.device, dtype=logits.dtype), known.to(logits.device))
            return weight * masked_lgkm(*placed[key], logits, y, tau, reduction)
        means, counts = class_mean_logits(logits, y, soft_labels.shape[0])
        rows = (counts > 0) & known
        log_t = F.log_softmax(means[rows] / tau, dim=1)
        return weight * symmetric_kl(log_r[rows].to(device=log_t.device, dtype=log_t.dtype), log_t, reduction)

    return term


def masked_lgkm(
    log_r: torch.Tensor, known: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, tau: float,
    reduction: str = "batchmean",
) -> torch.Tensor:
    """``L_LGKM`` of one batch (unweighted) with no data-dependent shape: the symmetric KL of every class's row,
    weighted 1 where the class is in the batch and has r_c, else 0, averaged over the rows that count (0 when
    none does). Equal to :func:`symmetric_kl` on the picked rows up to float rounding; nothing in it reads the
    device from the host."""
    _check_reduction(reduction)
    num_classes = log_r.shape[0]
    counts = torch.zeros(num_classes, dtype=logits.dtype, device=logits.device).index_add(
        0, y, torch.ones_like(y, dtype=logits.dtype))
    sums = torch.zeros((num_classes, logits.shape[1]), dtype=logits.dtype, device=logits.device).index_add(0, y, logits)
    log_t = F.log_softmax(sums / counts.clamp_min(1)[:, None] / tau, dim=1)
    counted = ((counts > 0) & known).to(logits.dtype)
    mean = (_kl_rows(log_r, log_t) * counted).sum() / counted.sum().clamp_min(1)
    return 0.5 * (mean if reduction == "batchmean" else mean / log_r.shape[1])
