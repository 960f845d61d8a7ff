"""What a method's clients upload, declared on its class (``Algorithm.upload``), and the arithmetic of client-level
DP on it: a client's update as one vector, clipped, and written back into a reply.

A method whose clients upload their model (or an update of it) declares an :class:`Upload`: which arrays of a
``train`` reply are measured from which arrays of the request (FedAvg: every reply array from the request's array
of the same name; SCAFFOLD: ``dy.*`` and ``dc.*`` are updates already). Client-level DP (``privacy.mode =
"central"`` or ``"local"``) clips and noises exactly that update, the joint L2 norm over every floating array the
reply uploads. A method whose clients upload something else (condensed images, class counts, raw data) declares a
:class:`Withheld` saying what, and a private run of it is refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from fedskew.core.errors import FedskewError
from fedskew.privacy.mechanisms import clip_factor


@dataclass(frozen=True)
class Upload:
    """A method whose clients upload model weights or updates: the mechanisms of ``[privacy]`` apply to it.

    Attributes
    ----------
    measured_from
        ``(reply prefix, request prefix)`` pairs: a reply array named ``<reply prefix>X`` is the client's new value
        of the request's ``<request prefix>X``, and its update is the difference; a request prefix of None: the
        reply array is an update already (measured from zero). Default ``(("", ""),)``: the reply holds the client's
        copy of the arrays the request sent, under the same names (FedAvg and every method that averages models).
    task
        The client task whose reply is the upload.
    central
        Why ``privacy.mode = "central"`` cannot privatise the method ("" where it can: its aggregate depends on the
        replies only through the mean of their uploads, which the noised mean replaces).
    dpsgd
        Why ``privacy.mode = "sample"`` (DP-SGD) does not cover the upload ("" where it does: the upload is trained
        by ``train_local`` with the client's :class:`~fedskew.privacy.dpsgd.SampleDP` and nothing else of the
        client's data shapes it).
    """

    measured_from: tuple[tuple[str, str | None], ...] = (("", ""),)
    task: str = "train"
    central: str = ""
    dpsgd: str = ""


@dataclass(frozen=True)
class Withheld:
    """A method whose clients upload something other than model weights (``what``, for the refusal), with the
    privacy mode or methods to use instead (``use``)."""

    what: str
    use: str = "a method whose clients upload only their model (fedavg, fedprox, scaffold, moon ...)"


WEIGHTS = Upload()
"""The clients upload their copy of the arrays the server sent (FedAvg's upload)."""


def references(
    upload: Upload, request: Mapping[str, torch.Tensor], reply: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor | None]:
    """For each array of ``reply``, the request array its update is measured from (None: it is an update already).

    A reply array the declaration does not cover, or whose request array is missing, is a :class:`FedskewError`:
    the method's ``upload`` does not describe its replies."""
    out: dict[str, torch.Tensor | None] = {}
    for key in reply:
        for reply_prefix, request_prefix in upload.measured_from:
            if key.startswith(reply_prefix):
                if request_prefix is None:
                    out[key] = None
                else:
                    source = request_prefix + key[len(reply_prefix):]
                    if source not in request:
                        raise FedskewError(f"the upload {key!r} has no request array {source!r} to be measured from")
                    out[key] = request[source]
                break
        else:
            raise FedskewError(f"the reply array {key!r} is not part of the method's declared upload")
    return out


def float_keys(reply: Mapping[str, torch.Tensor]) -> list[str]:
    """The reply's floating arrays, the update that is clipped and noised, sorted by name: the noise's coordinates
    are then the same whatever order a transport gives a reply's arrays (a reply decoded from safetensors bytes,
    on a worker pool, Ray or Flower, is not in the model's order)."""
    return sorted(k for k, v in reply.items() if v.is_floating_point())


def wide(device: torch.device) -> torch.dtype:
    """float64 for the update's arithmetic, except on MPS, which has no float64 (as the aggregators do)."""
    return torch.float32 if device.type == "mps" else torch.float64


def flat_update(
    reply: Mapping[str, torch.Tensor], refs: Mapping[str, torch.Tensor | None], keys: Sequence[str]
) -> torch.Tensor:
    """The update of ``keys`` (reply minus reference) as one float64 vector, in ``keys``' order."""
    if not keys:
        return torch.zeros(0, dtype=torch.float64)
    dtype = wide(reply[keys[0]].device)
    parts = []
    for k in keys:
        v, ref = reply[k].to(dtype), refs[k]
        parts.append((v if ref is None else v - ref.to(v.device, dtype)).reshape(-1))
    return torch.cat(parts)


def clipped(update: torch.Tensor, clip: float) -> tuple[torch.Tensor, float]:
    """``update`` scaled to L2 norm at most ``clip``; and its norm before."""
    norm = float(update.norm()) if update.numel() else 0.0
    factor = clip_factor(norm, clip)
    return (update * factor if factor != 1.0 else update), norm


def gaussian(size: int, std: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``size`` draws of N(0, std^2), from ``generator`` on the CPU in float64 (the same draw on any device), in
    :func:`wide`'s dtype on ``device``."""
    z = torch.randn(size, generator=generator, dtype=torch.float64)
    return (z * std).to(wide(device)).to(device)


def with_update(
    reply: Mapping[str, torch.Tensor], refs: Mapping[str, torch.Tensor | None], keys: Sequence[str],
    update: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The reply's arrays with the update of ``keys`` replaced by ``update`` (reference + update, in each array's
    dtype). The other (integer) arrays take their reference's value, or zero for an update: a counter such as
    BatchNorm's ``num_batches_tracked`` is not released."""
    out: dict[str, torch.Tensor] = {}
    parts = dict(zip(keys, update.split([reply[k].numel() for k in keys]), strict=True)) if keys else {}
    for k, v in reply.items():
        ref = refs[k]
        if k in parts:
            part = parts[k].view(v.shape)
            value = part if ref is None else ref.to(part.device, part.dtype) + part
            out[k] = value.to(v.dtype)
        else:
            out[k] = torch.zeros_like(v) if ref is None else ref.to(v.device).clone()
    return out
