"""The server half shared by condensation-based methods: the store of received synthetic sets,
training the global model on them, and FedAF's local-global knowledge matching.

FedDC (Kim & Choi 2022, Eq. 7) fine-tunes the averaged model on this round's condensed sets; FedDM
(Xiong et al., CVPR 2023) and FedAF (Wang et al., CVPR 2024, Eq. 14) train the global model on the
union of the clients' sets. Sets arrive as 8-bit images (what the ledger counts) and are decoded into
the normalised space the model is trained in.

The server keeps what clients sent in a *pool*: a dict of row-aligned tensors (``images``,
``labels``, ...) plus ``owner``, the id of the client each row came from. A client's new upload
replaces its old rows, so the pool holds each client's latest set; sorting rows by owner makes the
pool independent of the order in which replies arrived.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedskew.components.trainer import LocalConfig, LocalResult, LossTerm, train_local
from fedskew.condense import SyntheticSet, UInt8Set
from fedskew.models.layout import use_channels_last

OWNER = "owner"
"""Pool column holding the client id of each row."""


def update_pool(
    pool: dict[str, torch.Tensor] | None,
    fresh: Sequence[tuple[int, dict[str, torch.Tensor]]],
    keep_others: bool,
) -> dict[str, torch.Tensor]:
    """The pool after clients' new uploads, with rows ordered by owner.

    Parameters
    ----------
    pool
        The previous pool (``None``: empty).
    fresh
        ``(client id, {column: rows})`` for each client that uploaded this round; all its columns
        have the same number of rows (zero is allowed).
    keep_others
        Keep the rows of clients that did not upload this round. FedDC drops them ("the condensed
        datasets generated in the previous rounds are no longer used", Sec. IV-C); FedDM and FedAF
        train on every client's latest set (Eq. 14's S is the union over all K clients).
    """
    uploaded = {cid for cid, _ in fresh}
    parts: list[dict[str, torch.Tensor]] = []
    if pool is not None and keep_others:
        keep = torch.tensor([int(o) not in uploaded for o in pool[OWNER].tolist()], dtype=torch.bool)
        parts.append({k: v[keep] for k, v in pool.items()})
    for cid, cols in fresh:
        rows = next(iter(cols.values())).shape[0]
        parts.append({**cols, OWNER: torch.full((rows,), cid, dtype=torch.int64)})
    if not parts:
        raise ValueError("update_pool needs a previous pool or at least one upload")
    merged = {k: torch.cat([p[k] for p in parts]) for k in parts[-1]}
    order = torch.sort(merged[OWNER], stable=True).indices
    return {k: v[order].clone() for k, v in merged.items()}


def uploads_artifact(pool: dict[str, torch.Tensor], clients: Sequence[int]) -> dict[str, torch.Tensor]:
    """The rows of ``pool`` sent by ``clients`` (this round's uploads), as a run saves them for
    ``fedskew audit`` and the report's image grids: ``images`` (uint8), ``labels`` and ``clients``."""
    mask = torch.isin(pool[OWNER], torch.tensor(list(clients), dtype=torch.int64))
    return {"images": pool["images"][mask], "labels": pool["labels"][mask], "clients": pool[OWNER][mask]}


def pool_to_state(state: dict[str, object], prefix: str, pool: dict[str, torch.Tensor]) -> None:
    """Store ``pool`` in a (checkpointed) server state as ``prefix + column`` entries."""
    for k, v in pool.items():
        state[prefix + k] = v


def pool_from_state(state: dict[str, object], prefix: str, columns: Sequence[str]) -> dict[str, torch.Tensor] | None:
    """The pool stored by :func:`pool_to_state`, or None if the state holds none yet."""
    if prefix + OWNER not in state:
        return None
    out = {}
    for k in (*columns, OWNER):
        value = state[prefix + k]
        assert isinstance(value, torch.Tensor)
        out[k] = value
    return out


def decode_set(
    images: torch.Tensor, labels: torch.Tensor, mean: Sequence[float], std: Sequence[float]
) -> SyntheticSet | None:
    """8-bit images and labels as a float :class:`SyntheticSet` in the model's normalised space.

    None for an empty set (nothing to train on).
    """
    if images.shape[0] == 0:
        return None
    return SyntheticSet.from_uint8(UInt8Set(images, labels), mean, std)


def train_on_synthetic(
    model: nn.Module,
    syn: SyntheticSet,
    cfg: LocalConfig,
    generator: torch.Generator,
    terms: Sequence[LossTerm] = (),
) -> LocalResult:
    """Mini-batch SGD of ``model`` on a synthetic set with cross-entropy (+ ``terms``).

    FedDC Eq. 7 (``l_s = 1/|S| sum_s l_ce``, here in mini-batches), FedDM's server update and
    FedAF Eq. 14's ``L_CE`` are all this; FedAF adds its LGKM term (:func:`knowledge_matching_term`).
    A convolutional ``model`` is put in channels-last format first (in place): an epoch on a few
    hundred images in one batch runs about twice as fast (benchmarks/kernels.py).
    """
    return train_local(use_channels_last(model), syn.images, syn.labels, cfg, generator, terms)


def symmetric_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``(KL(P||Q) + KL(Q||P)) / 2`` between row distributions, averaged over rows (FedAF Eq. 15).

    Parameters
    ----------
    log_p, log_q
        (n, L) log-probabilities; row i of each is a distribution over L classes.

    Notes
    -----
    Summing the two directions gives ``KL(P||Q) + KL(Q||P) = sum_j (p_j - q_j)(log p_j - log q_j)``,
    one non-negative term per class, so the result is symmetric, zero for equal inputs and never
    negative. FedAF writes ``D_KL(R||T)`` between the C x C matrices R and T without saying how rows
    are combined; we average over rows (PyTorch's ``batchmean`` convention), so the weight
    ``lambda_glob`` does not depend on how many classes a batch holds. Zero rows give 0.
    """
    if log_p.shape != log_q.shape or log_p.dim() != 2:
        shapes = f"{tuple(log_p.shape)} and {tuple(log_q.shape)}"
        raise ValueError(f"expected two (n, L) tensors of equal shape, got {shapes}")
    if log_p.shape[0] == 0:
        return torch.zeros((), dtype=log_p.dtype)
    per_row = ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum(dim=1)
    return 0.5 * per_row.mean()


def class_mean_logits(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of ``logits`` over the rows labelled with that class, and the row counts.

    Returns ``(means, counts)`` of shapes (num_classes, L) and (num_classes,); classes without rows
    have a zero mean and count 0. This is FedAF Eq. 5 (real data, on the client), Eq. 6 (condensed
    data) and the argument of the softmax in Eq. 13 (on the server).
    """
    counts = torch.bincount(y, minlength=num_classes)
    sums = torch.zeros((num_classes, logits.shape[1]), dtype=logits.dtype).index_add(0, y, logits)
    return sums / counts.clamp_min(1).to(logits.dtype)[:, None], counts


def knowledge_matching_term(
    soft_labels: torch.Tensor, known: torch.Tensor, tau: float, weight: float
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

    Notes
    -----
    Eq. 13 defines t_c from the mean logits of *all* condensed images of class c under the current
    model. Recomputing that over the whole set at every SGD step would cost a full pass per step; we
    use the images of class c in the current mini-batch, an estimate of the same mean (a batch of
    256 holds ~25 images per class on ten-class data). Classes absent from the batch, or without
    r_c, contribute nothing in that step.
    """
    log_r = soft_labels.clamp_min(torch.finfo(soft_labels.dtype).tiny).log()

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        means, counts = class_mean_logits(logits, y, soft_labels.shape[0])
        rows = (counts > 0) & known
        log_t = F.log_softmax(means[rows] / tau, dim=1)
        return weight * symmetric_kl(log_r[rows].to(log_t.dtype), log_t)

    return term
