"""Where the samples of one stacked forward of K clients sit: slots of one width on the channel axis.

A batched matching step (:mod:`fedskew.components.batched_condensation`) runs each of its forwards over the K
clients' batches side by side on the channel axis. :func:`lay_out` lays the batches of a pass out in slots of
one width (:func:`slot_width`): a client's batch fills one or more slots, its last one padded with copies of
its first sample, which count nowhere (a :class:`Slots` says where each sample is, which are padding, and
which segment, e.g. a client's class, each belongs to).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Slots:
    """Where the samples of one stacked forward sit (:func:`lay_out`): each client's samples fill one or more
    slots of one width on the channel axis, the last one padded with copies of the client's first sample,
    which count nowhere (out of the class means and of the batch statistics).

    The flat place of a sample is ``slot * width + i``, its row in the pass's ``(K', W, D)`` embedding
    reshaped to ``(K'*W, D)``."""

    gather: torch.Tensor
    """``(W, K')``: the row of the pass's source at each place."""
    segment: torch.Tensor
    """``(K'*W,)``: the segment of each flat place (padding: the last segment, whose mean is never read)."""
    counts: torch.Tensor
    """``(S+1,)``: each segment's samples (the padding's: 1)."""
    slot_client: torch.Tensor
    """``(K',)``: the client of each slot."""
    mask: torch.Tensor | None
    """``(W, K')``: 1 for a client's own samples, 0 for padding (None: no padding, one slot a client)."""
    samples: torch.Tensor
    """``(K,)``: each client's number of samples."""
    batch: list[int]
    """Each client's number of samples."""
    slots: int
    """K', the number of slots."""
    width: int
    """W, the slots' width."""
    positions: list[list[int]]
    """Client -> the flat place of each of its samples, in the order given."""
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    """The slots' weights (views of the clients' stacked weights, or of ``weights``), set by the batched step."""
    weights: dict[str, torch.Tensor] | None = None
    """Each slot's copy of its client's weights where a client has several slots (filled at every step)."""
    _channels: dict[int, tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def channel_mask(self, channels: int) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """For a layer of ``channels`` a client: the mask ``(B, K'*C)`` (None: no padding, one slot a client),
        the client channel of each slot channel ``(K'*C,)`` (indices into ``K*C``) and each client channel's
        counted samples ``(K*C,)``."""
        if channels not in self._channels:
            index = (self.slot_client[:, None] * channels + torch.arange(channels, device=self.slot_client.device))
            mask = None if self.mask is None else self.mask.repeat_interleave(channels, dim=1).contiguous()
            self._channels[channels] = (mask, index.reshape(-1), self.samples.repeat_interleave(channels))
        return self._channels[channels]


def lay_out(
    rows: Sequence[Sequence[int]], segments: Sequence[Sequence[int]], counts: Sequence[int], max_slots: int,
    device: torch.device, dtype: torch.dtype,
) -> Slots:
    """The slots of one stacked forward: client c's samples are the rows ``rows[c]`` of the pass's source, in
    that order, the i-th in segment ``segments[c][i]`` (an index into ``counts``, each segment's samples);
    they fill slots of the width that pads least in at most ``max_slots`` slots (:func:`slot_width`)."""
    batch = [len(r) for r in rows]
    width = slot_width(batch, max_slots)
    dump = len(counts)  # padding: the last segment
    gather: list[list[int]] = []
    segment: list[list[int]] = []
    slot_client: list[int] = []
    positions: list[list[int]] = []
    for c, (own, segs) in enumerate(zip(rows, segments, strict=True)):
        positions.append([len(slot_client) * width + i for i in range(len(own))])
        for at in range(0, len(own), width):
            part, pad = list(own[at : at + width]), width - len(own[at : at + width])
            gather.append(part + [own[0]] * pad)
            segment.append(list(segs[at : at + width]) + [dump] * pad)
            slot_client.append(c)
    seg = np.asarray(segment, dtype=np.int64)
    counted = seg != dump
    one_each = len(slot_client) == len(rows) and bool(counted.all())
    return Slots(
        gather=torch.tensor(gather, device=device).t(),
        segment=torch.from_numpy(seg.reshape(-1)).to(device),
        counts=torch.tensor([*counts, 1], dtype=dtype, device=device),
        slot_client=torch.tensor(slot_client, device=device),
        mask=None if one_each else torch.from_numpy(counted.T.astype(np.float64)).to(device, dtype),
        samples=torch.tensor(batch, dtype=dtype, device=device),
        batch=batch,
        slots=len(slot_client),
        width=width,
        positions=positions,
    )


def slot_width(sizes: Sequence[int], max_slots: int) -> int:
    """The slot width that pads the batches of ``sizes`` least, in at most ``max_slots`` slots (the widest
    of equal cost)."""
    best: tuple[int, int] | None = None
    for width in sorted({-(-b // j) for b in sizes for j in range(1, max_slots + 1)}, reverse=True):
        slots = sum(-(-b // width) for b in sizes)
        if slots > max_slots:
            continue
        if best is None or slots * width < best[0]:
            best = (slots * width, width)
    assert best is not None  # the largest size is one slot a client
    return best[1]
