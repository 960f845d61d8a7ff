"""What condensation methods put on the wire: array names, and the formats of an uploaded synthetic set.

A set's images travel in one of three formats (the methods' ``wire_dtype``): ``"uint8"``, 8-bit pixels
(FedAF App. C counts one byte per pixel and channel; pixels outside [0, 255] are clamped), or the
normalised images themselves as ``"float16"`` (cast) or ``"float32"`` (exact; the FedDC paper sends
floats). The ledger counts what travels: 1, 2 or 4 bytes per value. Each reply also says what fraction of
its pixel values the 8-bit encoding clamped (:data:`WIRE_CLAMPED`, 0.0 for float formats); the server
records the round's pixel-weighted mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from fedskew.algorithms.base import ClientContext, Replies
from fedskew.condense import SyntheticSet, UInt8Set

MODEL = "model."
"""Prefix of the model weights in a message (the rest of the name is the state-dict key)."""
SYN_IMAGES = "syn.images"
"""Reply array: the client's condensed images (N, C, H, W), in the method's wire dtype."""
SYN_LABELS = "syn.labels"
"""Reply array: their labels, int64 (N,)."""
SYN_STATE = "syn_"
"""Server-state prefix of the synthetic pool (``syn_images``, ``syn_labels``, ``syn_owner``)."""
WIRE_CLAMPED = "wire_clamped"
"""Reply scalar and round metric: the fraction of the uploaded pixel values the 8-bit encoding clamped."""

WireDtype = Literal["uint8", "float16", "float32"]
"""How a synthetic set's images travel (the condensation methods' ``wire_dtype`` option)."""
WIRE_DTYPES: dict[str, torch.dtype] = {"uint8": torch.uint8, "float16": torch.float16, "float32": torch.float32}
"""Each :data:`WireDtype` word and the dtype of ``syn.images`` it gives."""

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def synthetic_reply_spec(image_shape: tuple[int, int, int], wire_dtype: str = "uint8") -> Spec:
    """Reply spec of an uploaded synthetic set: any number N of images in ``wire_dtype``, as many labels
    (wildcard -1)."""
    return {SYN_IMAGES: ((-1, *image_shape), WIRE_DTYPES[wire_dtype]), SYN_LABELS: ((-1,), torch.int64)}


def synthetic_scalars() -> dict[str, tuple[float, float | None]]:
    """Reply scalars of an upload: :data:`WIRE_CLAMPED`, a fraction in [0, 1]."""
    return {WIRE_CLAMPED: (0.0, 1.0)}


def synthetic_upload(
    syn: SyntheticSet | None, client: ClientContext, wire_dtype: str = "uint8"
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """A condensed set as reply arrays in ``wire_dtype``, and its reply scalars (:data:`WIRE_CLAMPED`).

    ``None`` (a client without data) gives an empty set of the right shapes, nothing clamped. The arrays
    are on the CPU: what goes on the wire.
    """
    dtype = WIRE_DTYPES[wire_dtype]
    if syn is None:
        empty = {
            SYN_IMAGES: torch.zeros((0, *client.fed.image_shape), dtype=dtype),
            SYN_LABELS: torch.zeros((0,), dtype=torch.int64),
        }
        return empty, {WIRE_CLAMPED: 0.0}
    labels = syn.labels.detach().cpu().contiguous()
    if dtype != torch.uint8:
        return {SYN_IMAGES: syn.images.detach().cpu().to(dtype).contiguous(), SYN_LABELS: labels}, {WIRE_CLAMPED: 0.0}
    u = syn.to_uint8(client.fed.mean, client.fed.std)
    clamped = syn.clamped_fraction(client.fed.mean, client.fed.std)
    return {SYN_IMAGES: u.images.contiguous(), SYN_LABELS: u.labels.contiguous()}, {WIRE_CLAMPED: clamped}


def decode_images(
    images: torch.Tensor, labels: torch.Tensor, mean: Sequence[float], std: Sequence[float]
) -> SyntheticSet | None:
    """Received images (any wire dtype) and labels as a float32 :class:`SyntheticSet` in the model's
    normalised space: 8-bit pixels are de-quantised, float16 widened, float32 taken bit for bit (a copy).

    None for an empty set (nothing to train on).
    """
    if images.shape[0] == 0:
        return None
    if images.dtype == torch.uint8:
        return SyntheticSet.from_uint8(UInt8Set(images, labels), mean, std)
    return SyntheticSet(images.to(torch.float32, copy=True), labels.to(torch.int64, copy=True))


def as_uint8(images: torch.Tensor, labels: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Received images as 8-bit pixels (for artifacts that hold images as pixels): float images quantised
    as :meth:`SyntheticSet.to_uint8` does (clamped), 8-bit images as they are."""
    if not images.is_floating_point():
        return images
    if images.shape[0] == 0:
        return images.to(torch.uint8)
    return SyntheticSet(images.to(torch.float32), labels).to_uint8(mean, std).images.to(images.device)


def round_clamped(replies: Replies) -> float:
    """The round's :data:`WIRE_CLAMPED`: the replies' clamp fractions weighted by the pixel values each
    uploaded (0.0 when none uploaded any). Summed in reply order, so it is the same for any worker count."""
    total, clamped = 0, 0.0
    for _, m in replies:
        n = m.arrays[SYN_IMAGES].numel()
        total += n
        clamped += float(m.metrics[WIRE_CLAMPED]) * n
    return clamped / total if total else 0.0
