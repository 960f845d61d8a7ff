"""What condensation methods put on the wire: array names and the 8-bit synthetic-set format."""

from __future__ import annotations

import torch

from fedskew.algorithms.base import ClientContext
from fedskew.condense import SyntheticSet

MODEL = "model."
"""Prefix of the model weights in a message (the rest of the name is the state-dict key)."""
SYN_IMAGES = "syn.images"
"""Reply array: the client's condensed images, uint8 (N, C, H, W)."""
SYN_LABELS = "syn.labels"
"""Reply array: their labels, int64 (N,)."""
SYN_STATE = "syn_"
"""Server-state prefix of the synthetic pool (``syn_images``, ``syn_labels``, ``syn_owner``)."""

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def synthetic_reply_spec(image_shape: tuple[int, int, int]) -> Spec:
    """Reply spec of an uploaded synthetic set: any number N of images, as many labels (wildcard -1)."""
    return {SYN_IMAGES: ((-1, *image_shape), torch.uint8), SYN_LABELS: ((-1,), torch.int64)}


def synthetic_arrays(syn: SyntheticSet | None, client: ClientContext) -> dict[str, torch.Tensor]:
    """A condensed set as reply arrays: 8-bit images (FedAF App. C: one byte per pixel and channel).

    ``None`` (a client without data) gives an empty set of the right shapes.
    """
    if syn is None:
        return {
            SYN_IMAGES: torch.zeros((0, *client.fed.image_shape), dtype=torch.uint8),
            SYN_LABELS: torch.zeros((0,), dtype=torch.int64),
        }
    u = syn.to_uint8(client.fed.mean, client.fed.std)
    return {SYN_IMAGES: u.images.contiguous(), SYN_LABELS: u.labels.contiguous()}
