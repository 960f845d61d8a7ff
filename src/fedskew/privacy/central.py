"""Central client-level DP: DP-FedAvg's Gaussian mechanism on a round's uploads, at the server (McMahan, Ramage,
Talwar & Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018, with the fixed
denominator; adaptive clipping of Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021).

For the replies of one round (:func:`noised_mean`):

    Delta_k  = the client's update (reply minus request, by the method's :class:`~fedskew.privacy.uploads.Upload`)
    Delta~   = ( sum_k Delta_k * min(1, C / ||Delta_k||)  +  N(0, (z * C)^2 I) ) / m

with ``C`` the clip, ``z`` the update's noise multiplier and ``m`` the clients a round samples (a fixed denominator,
whatever number of them answers, so that one client changes Delta~ by at most C / m). Every reply's upload is
then replaced by ``request + Delta~``: all replies equal, so the method's own aggregate, which depends on the
replies only through their mean (weighted or not), applies Delta~ as it would apply the clients' mean update
(FedAvg loads it, FedAvgM and FedAdam step along it, SCAFFOLD moves x and c by it, FedDyn updates h with it).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.privacy.uploads import Upload, clipped, flat_update, float_keys, gaussian, references, with_update

Replies = list[tuple[int, Message]]


def noised_mean(
    upload: Upload, requests: Mapping[int, Message], replies: Replies, clip: float, std: float, denominator: int,
    generator: torch.Generator,
) -> tuple[Replies, list[float]]:
    """The round's replies with every upload replaced by the noised mean of the clipped updates (module doc), and
    each update's norm before clipping (for adaptive clipping's count). No replies: none, and no draw."""
    if not replies:
        return replies, []
    keys = float_keys(replies[0][1].arrays)
    names = set(replies[0][1].arrays)
    total: torch.Tensor | None = None
    norms: list[float] = []
    refs = []
    for cid, msg in replies:
        if set(msg.arrays) != names:
            raise FedskewError(f"client {cid}'s upload holds other arrays than client {replies[0][0]}'s")
        ref = references(upload, requests[cid].arrays, msg.arrays)
        refs.append(ref)
        bounded, norm = clipped(flat_update(msg.arrays, ref, keys), clip)
        norms.append(norm)
        total = bounded.clone() if total is None else total.add_(bounded)
    assert total is not None
    mean = (total + gaussian(total.numel(), std, generator, total.device)) / denominator
    out = [(cid, Message(with_update(msg.arrays, ref, keys, mean), msg.config, msg.metrics))
           for (cid, msg), ref in zip(replies, refs, strict=True)]
    return out, norms

