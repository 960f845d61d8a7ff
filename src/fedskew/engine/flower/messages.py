"""fedskew messages as Flower records, and back, without loss.

A fedskew :class:`~fedskew.core.message.Message` becomes a Flower ``RecordDict`` of three records:
``arrays`` (an ``ArrayRecord``, one ``Array`` per tensor), ``config`` (a ``ConfigRecord``) and
``metrics`` (a ``MetricRecord``). Tensors use Flower's standard NumPy serialisation, so any Flower tool
can read them; the round trip keeps every dtype, shape, bit and name order (uint8 images, int64
labels, float32 weights). ``bfloat16``, which NumPy cannot hold, travels as its 16-bit patterns.

Next to the payload, an engine header (the ``fedskew`` record) tells the ClientApp what to run. Client
state never travels: it is written into the SuperNode's ``Context.state`` (:func:`put_state`).
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.constant import SType

from fedskew.algorithms.base import FederationInfo, ModelSpec
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.engine.federation import freeze

ARRAYS, CONFIG, METRICS, HEADER = "arrays", "config", "metrics", "fedskew"
HELLO = "fedskew.hello"
"""Engine task asking a node which partitions it serves (answered without touching data)."""
BF16_STYPE = "torch.bfloat16.bits"
"""Serialisation type of a bfloat16 tensor: its bit patterns as little-endian int16 NumPy data."""


def tensor_to_array(t: torch.Tensor) -> Array:
    """A Flower ``Array`` holding ``t`` exactly."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        bits = Array(t.contiguous().view(torch.int16).numpy())
        return Array(dtype="bfloat16", shape=tuple(t.shape), stype=BF16_STYPE, data=bits.data)
    try:
        return Array(t.numpy())
    except TypeError as e:  # a dtype NumPy has no equivalent for (complex32, quantised ...)
        raise FedskewError(f"a tensor of dtype {t.dtype} cannot be sent over Flower: {e}") from None


def array_to_tensor(a: Array) -> torch.Tensor:
    """The tensor an ``Array`` made by :func:`tensor_to_array` holds (also any NumPy-serialised Array)."""
    if a.stype == BF16_STYPE:
        bits = Array(dtype="int16", shape=a.shape, stype=SType.NUMPY, data=a.data).numpy()
        return torch.from_numpy(bits).view(torch.bfloat16)
    if a.stype != SType.NUMPY:
        raise FedskewError(f"cannot read a Flower Array serialised as {a.stype!r}")
    return torch.from_numpy(a.numpy())


def to_records(msg: Message) -> RecordDict:
    """The Flower records of a fedskew message."""
    arrays = ArrayRecord({name: tensor_to_array(t) for name, t in msg.arrays.items()})
    config, metrics = ConfigRecord(dict(msg.config)), MetricRecord(dict(msg.metrics))
    return RecordDict({ARRAYS: arrays, CONFIG: config, METRICS: metrics})


def from_records(records: RecordDict) -> Message:
    """The fedskew message that :func:`to_records` made ``records`` from.

    Replies are untrusted input: anything that is not such a message is a :class:`FedskewError`, which
    the server turns into a failed client rather than a crash.
    """
    arrays, config, metrics = records.get(ARRAYS), records.get(CONFIG), records.get(METRICS)
    if not (isinstance(arrays, ArrayRecord) and isinstance(config, ConfigRecord) and isinstance(metrics, MetricRecord)):
        raise FedskewError("not a fedskew message: it needs records 'arrays', 'config' and 'metrics'")
    scalars = {k: v for k, v in config.items() if isinstance(v, int | float | str | bool)}
    numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    if len(scalars) != len(config) or len(numbers) != len(metrics):
        raise FedskewError("not a fedskew message: config and metrics must hold single values, not lists or bytes")
    try:
        tensors = {name: array_to_tensor(a) for name, a in arrays.items()}
    except (ValueError, TypeError) as e:
        raise FedskewError(f"not a fedskew message: unreadable array: {e}") from None
    return Message(arrays=tensors, config=scalars, metrics=numbers)


# ---- what both halves know of the federation ------------------------------------------------------
def info_to_json(info: FederationInfo) -> str:
    return json.dumps(dataclasses.asdict(info))


def info_from_json(text: str) -> FederationInfo:
    """The :class:`FederationInfo` of :func:`info_to_json` (lists back to the tuples a spec hashes)."""
    d = json.loads(text)
    m = d.pop("model")
    spec = ModelSpec(
        name=m["name"], in_channels=m["in_channels"], num_classes=m["num_classes"], image_size=m["image_size"],
        options=tuple((k, freeze(v)) for k, v in m["options"]),
    )
    return FederationInfo(
        model=spec, num_clients=d["num_clients"], num_classes=d["num_classes"], seed=d["seed"],
        mean=tuple(d["mean"]), std=tuple(d["std"]), image_shape=tuple(d["image_shape"]),
    )


# ---- client state in the SuperNode's context ------------------------------------------------------
def _state_key(cid: int) -> str:
    return f"fedskew.client.{cid}"


def put_state(state: RecordDict, cid: int, client_state: dict[str, Any]) -> None:
    """Keep a client's state in the node's ``Context.state`` (it never leaves the node).

    The state is whatever the algorithm put there (tensors, numbers, nested lists and dicts); it is
    stored with ``torch.save`` and read back with ``weights_only=True``, like a checkpoint.
    """
    buf = io.BytesIO()
    torch.save(client_state, buf)
    state[_state_key(cid)] = ConfigRecord({"state": buf.getvalue()})


def get_state(state: RecordDict, cid: int) -> dict[str, Any]:
    """The state :func:`put_state` kept for client ``cid`` (empty before its first task)."""
    record = state.get(_state_key(cid))
    if record is None:
        return {}
    assert isinstance(record, ConfigRecord)
    data = record["state"]
    assert isinstance(data, bytes)
    loaded: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
    return loaded
