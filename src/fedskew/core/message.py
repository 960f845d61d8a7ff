"""The only thing that crosses between a server and its clients.

A :class:`Message` holds named tensors (model weights, control variates, logits, uint8 synthetic
images), scalar configuration and scalar metrics. No Python objects are shared between the two sides:
that is what lets one algorithm file run in the in-process simulator and over Flower, and what lets the
engine count every byte that a method puts on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

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


def state_to_arrays(state: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Copy a state dict into message arrays (detached, contiguous, owned by the message)."""
    return {prefix + k: v.detach().clone().contiguous() for k, v in state.items()}


def arrays_with_prefix(arrays: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The arrays whose name starts with ``prefix``, with the prefix removed."""
    n = len(prefix)
    return {k[n:]: v for k, v in arrays.items() if k.startswith(prefix)}
