"""Simulated client failures and fault injection (the ``[faults]`` config table).

A contacted client may never reply (dropout), reply too late (straggler) or send a damaged reply
(corrupt); each fate is drawn deterministically from (seed, round, client, task), so a run with faults
is as reproducible as one without. Damaged replies must be rejected by
:func:`~fedskew.engine.replies.check_reply`, which is what the injection tests.
"""

from __future__ import annotations

import torch

from fedskew.core.message import Message


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


def model_replacement(request: Message, reply: Message, scale: float) -> Message:
    """A malicious client's reply: ``w - scale * (w_k - w)`` for every float array the request also holds
    (the global model w it received; w_k its honest result). Other arrays and metrics stay as they are."""
    arrays = dict(reply.arrays)
    for k, w_k in reply.arrays.items():
        w = request.arrays.get(k)
        if w is not None and w_k.is_floating_point() and w.shape == w_k.shape:
            arrays[k] = (w - scale * (w_k - w)).to(w_k.dtype)
    return Message(arrays=arrays, config=dict(reply.config), metrics=dict(reply.metrics))
