"""The server's store of received synthetic sets (the *pool*).

The server keeps what clients sent as a dict of row-aligned tensors (``images``, ``labels``, ...) plus
``owner``, the id of the client each row came from. A client's new upload replaces its old rows, so
the pool holds each client's latest set; sorting rows by owner makes the pool independent of the order
in which replies arrived. Sets arrive in the method's wire dtype (8-bit pixels by default, or float16 /
float32 normalised images: :mod:`.wire`), are pooled as they arrived (what the ledger counts), and are
decoded into the normalised space the model is trained in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedskew.algorithms.base import Replies, ServerContext
from fedskew.algorithms.condensation.wire import (
    SYN_IMAGES,
    SYN_LABELS,
    SYN_STATE,
    WIRE_CLAMPED,
    as_uint8,
    decode_images,
    round_clamped,
)
from fedskew.condense import SyntheticSet

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
        owners = pool[OWNER]
        keep = torch.tensor([int(o) not in uploaded for o in owners.tolist()], dtype=torch.bool, device=owners.device)
        parts.append({k: v[keep] for k, v in pool.items()})
    for cid, cols in fresh:
        first = next(iter(cols.values()))
        parts.append({**cols, OWNER: torch.full((first.shape[0],), cid, dtype=torch.int64, device=first.device)})
    if not parts:
        raise ValueError("update_pool needs a previous pool or at least one upload")
    merged = {k: torch.cat([p[k] for p in parts]) for k in parts[-1]}
    order = torch.sort(merged[OWNER], stable=True).indices
    return {k: v[order].clone() for k, v in merged.items()}


def uploads_artifact(pool: dict[str, torch.Tensor], clients: Sequence[int]) -> dict[str, torch.Tensor]:
    """The rows of ``pool`` sent by ``clients`` (this round's uploads): ``images`` (as they are pooled),
    ``labels`` and ``clients``."""
    mask = torch.isin(pool[OWNER], torch.tensor(list(clients), dtype=torch.int64, device=pool[OWNER].device))
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


def receive_sets(
    server: ServerContext, replies: Replies, keep_others: bool
) -> SyntheticSet | None:
    """Put this round's uploaded sets into the pool and return the pool as a trainable set.

    The pool is kept in ``server.state`` (``syn_images`` in the wire dtype, ``syn_labels``,
    ``syn_owner``), so it is checkpointed; the round's uploads are saved as the ``synthetic`` artifact
    (for ``fedskew audit`` and the report's image grids); ``synthetic_images`` in the round's metrics is
    the pool's size and ``wire_clamped`` the share of this round's uploaded pixel values that the 8-bit
    encoding clamped (:func:`~.wire.round_clamped`).
    ``keep_others`` as in :func:`update_pool` (FedDC: False, FedDM and FedAF: True). None when there
    is nothing to train on.
    """
    previous = pool_from_state(server.state, SYN_STATE, ("images", "labels")) if keep_others else None
    pool = update_pool(
        previous,
        [(cid, {"images": m.arrays[SYN_IMAGES], "labels": m.arrays[SYN_LABELS]}) for cid, m in replies],
        keep_others=keep_others,
    )
    pool_to_state(server.state, SYN_STATE, pool)
    server.metrics["synthetic_images"] = int(pool["labels"].shape[0])
    server.metrics[WIRE_CLAMPED] = round_clamped(replies)
    mean, std = server.fed.mean, server.fed.std
    # Saved for `fedskew audit` and the report's image grids, which read 8-bit pixels: float uploads
    # are quantised for them (the audit then sees them at 8 bits).
    uploads = uploads_artifact(pool, [cid for cid, _ in replies])
    server.save_artifact("synthetic", {**uploads, "images": as_uint8(uploads["images"], uploads["labels"], mean, std)})
    return decode_images(pool["images"], pool["labels"], mean, std)
