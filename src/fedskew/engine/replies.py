"""Checks on what clients send back.

A reply from a client is untrusted input: a buggy or hostile client may send NaNs, tensors of the
wrong shape or dtype, missing or extra keys, an oversized payload, or labels outside the label set.
:func:`check_reply` finds such replies; the engine drops them with a logged reason and the round goes
on with the others, so the global model is never corrupted and the server never crashes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedskew.core.errors import FedskewError
from fedskew.core.message import Message

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]
"""Expected arrays of a reply: name -> (shape, dtype).

A negative dimension is a wildcard for a size the server cannot know in advance (the number of
synthetic images a client condensed): any size is accepted, but all dimensions of one reply that
carry the same negative number must be equal (``syn.images`` of shape ``(-1, C, H, W)`` and
``syn.labels`` of shape ``(-1,)`` must hold as many images as labels)."""

ALLOWED_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int64, torch.int32}


@dataclass(frozen=True)
class Undecodable:
    """A reply that could not cross a process boundary: it could not be encoded where the client ran, or
    its bytes could not be decoded here. :func:`check_reply` rejects it as that client's fault."""

    reason: str


def encode_reply(reply: object) -> bytes | str:
    """A client's reply as the bytes that cross a process boundary, or why it cannot be sent (a string).

    A worker calls this on what ``client_step`` returned: a buggy or hostile reply (not a Message, a
    metric JSON cannot hold) becomes that client's rejection in the parent, never the run's end.
    """
    if not isinstance(reply, Message):
        return f"not a Message but {type(reply).__name__}"
    try:
        return reply.to_bytes()
    except Exception as e:  # a metric or config value JSON cannot hold, a tensor safetensors refuses
        return f"unencodable reply: {' '.join(str(e).split()) or type(e).__name__}"


def decode_reply(data: bytes | str) -> Message | Undecodable:
    """Read back :func:`encode_reply`'s output; what cannot be read is an :class:`Undecodable` reply.

    Metrics that are not numbers are kept as sent, so :func:`check_reply` rejects them with the same
    reason as a reply that never left the process.
    """
    if isinstance(data, str):
        return Undecodable(data)
    try:
        return Message.from_bytes(data, numeric_metrics=False)
    except FedskewError as e:
        return Undecodable(str(e))


def _is_label_key(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("labels", "y")


def _shape_mismatch(
    name: str, shape: tuple[int, ...], expected: tuple[int, ...], wildcards: dict[int, tuple[str, int]]
) -> str | None:
    """Why ``shape`` does not match ``expected`` (see :data:`Spec` for negative wildcards), or None.

    ``wildcards`` maps each negative number seen so far in the reply to (array name, size) and is
    updated in place, so equal wildcards across arrays must take equal sizes.
    """
    if len(shape) != len(expected) or any(e >= 0 and s != e for s, e in zip(shape, expected, strict=True)):
        return f"array {name!r} has shape {shape}, expected {expected}"
    for s, e in zip(shape, expected, strict=True):
        if e < 0:
            first = wildcards.setdefault(e, (name, s))
            if first[1] != s:
                return f"array {name!r} has size {s} for wildcard {e}, where {first[0]!r} has {first[1]}"
    return None


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every value of the floating ``tensors`` is finite: one check (and one read of the device)
    for all the tensors on a device, not one a tensor."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        if t.numel():
            by_device.setdefault(t.device, []).append(t.reshape(-1))
    return all(bool(torch.isfinite(torch.cat(group)).all()) for group in by_device.values())


def check_reply(msg: object, spec: Spec | None, num_classes: int, max_bytes: int) -> str | None:
    """Why ``msg`` must be rejected, or None if it is acceptable.

    Parameters
    ----------
    msg
        What the client sent back.
    spec
        The arrays the algorithm expects for this task (exact names, shapes and dtypes; negative
        dimensions are wildcards, see :data:`Spec`), or None to skip the name/shape check.
    num_classes
        Integer arrays named ``labels`` or ``y`` (or ending in ``.labels``) must lie in [0, num_classes).
    max_bytes
        Largest accepted payload.
    """
    if isinstance(msg, Undecodable):
        return msg.reason
    if not isinstance(msg, Message):
        return f"not a Message but {type(msg).__name__}"
    for name, t in msg.arrays.items():
        if not isinstance(t, torch.Tensor):
            return f"array {name!r} is a {type(t).__name__}, not a tensor"
        if t.dtype not in ALLOWED_DTYPES:
            return f"array {name!r} has dtype {t.dtype}"
    if msg.nbytes() > max_bytes:
        return f"payload of {msg.nbytes()} bytes exceeds the limit of {max_bytes}"
    for name, value in msg.metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return f"metric {name!r} is not a finite number: {value!r}"
    if "num_samples" in msg.metrics and msg.metrics["num_samples"] < 0:
        return f"negative num_samples {msg.metrics['num_samples']}"
    if spec is not None:
        missing = sorted(set(spec) - set(msg.arrays))
        extra = sorted(set(msg.arrays) - set(spec))
        if missing:
            return f"missing arrays {missing[:3]}{' ...' if len(missing) > 3 else ''}"
        if extra:
            return f"unexpected arrays {extra[:3]}{' ...' if len(extra) > 3 else ''}"
        wildcards: dict[int, tuple[str, int]] = {}
        for name, (shape, dtype) in spec.items():
            t = msg.arrays[name]
            reason = _shape_mismatch(name, tuple(t.shape), tuple(shape), wildcards)
            if reason is not None:
                return reason
            if t.dtype != dtype:
                return f"array {name!r} has dtype {t.dtype}, expected {dtype}"
    if not all_finite([t for t in msg.arrays.values() if t.is_floating_point()]):
        for name, t in msg.arrays.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"array {name!r} holds NaN or inf"
    for name, t in msg.arrays.items():
        if _is_label_key(name) and not t.is_floating_point() and t.numel() > 0:
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= num_classes:
                return f"array {name!r} holds labels in [{lo}, {hi}], outside [0, {num_classes - 1}]"
    return None
