"""The only thing that crosses between a server and its clients.

A :class:`Message` holds named tensors (model weights, control variates, logits, uint8 synthetic
images), scalar configuration and scalar metrics. No Python objects are shared between the two sides:
that is what lets one algorithm file run in the in-process simulator and over Flower, and what lets the
engine count every byte that a method puts on the wire.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import torch

from fedskew.core.errors import FedskewError

Scalar = int | float | str | bool


@dataclass
class Message:
    """A typed payload: tensors, configuration scalars and metrics.

    Attributes
    ----------
    arrays
        Named tensors. Their bytes are what the communication ledger counts.
    config
        Scalars that configure the receiving side (learning rate, round number ...).
    metrics
        Scalars that report on work done (samples trained, local loss ...).
    """

    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict[str, Scalar] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Bytes of the tensor payload, as it would be sent uncompressed."""
        return sum(t.numel() * t.element_size() for t in self.arrays.values())

    def to_bytes(self) -> bytes:
        """Serialise as safetensors, with config and metrics as JSON in its metadata.

        This is how a reply crosses a process boundary: a safetensors buffer holds only tensors and a
        JSON header, so decoding an untrusted reply never runs code (no pickle).
        """
        from safetensors.torch import save

        meta = {"fedskew": json.dumps({"config": self.config, "metrics": self.metrics}, allow_nan=True)}
        return bytes(save({k: v.contiguous() for k, v in self.arrays.items()}, metadata=meta))

    @staticmethod
    def from_bytes(data: bytes, *, numeric_metrics: bool = True) -> Message:
        """Decode :meth:`to_bytes` output; anything malformed is a :class:`FedskewError`.

        ``numeric_metrics=False`` keeps a metric that is not a number as it was sent (a string, a bool),
        for a caller that checks the reply itself (:func:`fedskew.engine.replies.decode_reply`), so that a
        reply is judged the same whether it crossed a process boundary or not.
        """
        from safetensors.torch import load

        try:
            (n,) = struct.unpack("<Q", data[:8])
            header = json.loads(data[8 : 8 + n])
            extra = json.loads(header.get("__metadata__", {}).get("fedskew", "{}"))
            arrays = load(data)
        except Exception as e:
            raise FedskewError(f"undecodable message: {e}") from None
        config = extra.get("config", {})
        metrics = extra.get("metrics", {})
        if not isinstance(config, dict) or not isinstance(metrics, dict):
            raise FedskewError("undecodable message: config and metrics must be JSON objects")
        for k, v in metrics.items():
            if not isinstance(v, int | float) or isinstance(v, bool):
                if numeric_metrics:
                    raise FedskewError(f"undecodable message: metric {k!r} is not a number")
                continue
            metrics[k] = float(v)
        return Message(arrays=dict(arrays), config=config, metrics=metrics)


def state_to_arrays(state: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Copy a state dict into message arrays (detached, contiguous, owned by the message)."""
    return {prefix + k: v.detach().clone().contiguous() for k, v in state.items()}


def arrays_with_prefix(arrays: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The arrays whose name starts with ``prefix``, with the prefix removed."""
    n = len(prefix)
    return {k[n:]: v for k, v in arrays.items() if k.startswith(prefix)}
