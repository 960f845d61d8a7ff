"""Simulated client failures and fault injection (the ``[faults]`` config table).

A contacted client may never reply (dropout), reply too late (straggler) or send a damaged reply
(corrupt); each fate is drawn deterministically from (seed, round, client, task), so a run with faults
is as reproducible as one without. Damaged replies must be rejected by
:func:`~fedskew.engine.replies.check_reply`, which is what the injection tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fedskew.core.message import Message
from fedskew.core.params import check
from fedskew.core.seeding import numpy_rng


@dataclass
class Faults:
    """Simulated client failures (the ``[faults]`` config table).

    Attributes
    ----------
    dropout
        Probability that a contacted client never replies (it does no work).
    straggler
        Probability that a client's reply arrives after the round's deadline: it did the work, but
        the server has moved on and discards the reply.
    corrupt
        Probability that a client's reply is corrupted on the way (fault injection, to test that the
        server rejects it and carries on).
    attack
        How a corrupted reply is damaged: ``nan``, ``inf``, ``shape``, ``dtype``, ``missing`` (drop an
        array), ``extra`` (add one), ``oversized``, ``labels`` (out-of-range labels) or ``not_message``.
    max_reply_mb
        Replies larger than this are rejected as oversized.
    """

    dropout: float = 0.0
    straggler: float = 0.0
    corrupt: float = 0.0
    attack: Literal["nan", "inf", "shape", "dtype", "missing", "extra", "oversized", "labels", "not_message"] = "nan"
    max_reply_mb: float = 512.0

    def __post_init__(self) -> None:
        check(0 <= self.dropout < 1, "faults.dropout", self.dropout, "a probability in [0, 1)")
        check(0 <= self.straggler < 1, "faults.straggler", self.straggler, "a probability in [0, 1)")
        check(0 <= self.corrupt < 1, "faults.corrupt", self.corrupt, "a probability in [0, 1)")
        check(
            self.dropout + self.straggler + self.corrupt < 1, "faults.dropout + straggler + corrupt",
            self.dropout + self.straggler + self.corrupt, "< 1",
        )
        check(self.max_reply_mb > 0, "faults.max_reply_mb", self.max_reply_mb, "> 0")

    def fate(self, seed: int, round: int, cid: int, task: str) -> str | None:
        """``"dropout"``, ``"straggler"``, ``"corrupt"`` or None for this (round, client, task); deterministic."""
        if self.dropout == 0 and self.straggler == 0 and self.corrupt == 0:
            return None
        u = numpy_rng(seed, "fault", round, cid, task).random()
        if u < self.dropout:
            return "dropout"
        if u < self.dropout + self.straggler:
            return "straggler"
        if u < self.dropout + self.straggler + self.corrupt:
            return "corrupt"
        return None


def corrupt_reply(msg: Message, attack: str, num_classes: int, max_bytes: int) -> object:
    """A damaged copy of ``msg`` (fault injection; see :class:`Faults`)."""
    if attack == "not_message":
        return {"arrays": dict(msg.arrays)}
    arrays = {k: v.clone() for k, v in msg.arrays.items()}
    floats = [k for k, v in arrays.items() if v.is_floating_point() and v.numel() > 0]
    name = floats[0] if floats else next(iter(arrays), "x")
    if attack in ("nan", "inf") and floats:
        arrays[name].view(-1)[0] = float("nan") if attack == "nan" else float("inf")
    elif attack == "shape" and arrays:
        arrays[name] = torch.cat([arrays[name].reshape(-1), arrays[name].reshape(-1)[:1]])
    elif attack == "dtype" and arrays:
        arrays[name] = arrays[name].to(torch.float64 if arrays[name].dtype != torch.float64 else torch.float32)
    elif attack == "missing" and arrays:
        del arrays[name]
    elif attack == "extra":
        arrays["extra.payload"] = torch.zeros(4)
    elif attack == "oversized":
        arrays["extra.payload"] = torch.zeros(max_bytes // 4 + 1)
    elif attack == "labels":
        arrays["extra.labels"] = torch.tensor([num_classes + 5], dtype=torch.int64)
    return Message(arrays=arrays, config=dict(msg.config), metrics=dict(msg.metrics))
