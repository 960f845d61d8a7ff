"""fedskew's ServerApp and ClientApp in the test's process, against a stand-in SuperLink (:class:`FakeGrid`).

Fast, and able to silence or drop nodes at will; every message goes through Flower's own serialisation both
ways. It needs Flower: a test module that imports it is skipped where Flower is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is optional: pip install -e '.[flower]'")

from flwr.app import ConfigRecord, Context, Error, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.common.constant import ErrorCode
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.task_identity import TaskIdentity

from fedskew.algorithms.base import ALGORITHMS, ClientContext, ServerContext
from fedskew.algorithms.fedavg import FedAvg
from fedskew.config import dump
from fedskew.core.message import Message
from fedskew.engine.flower.app import write_app
from fedskew.engine.flower.client_app import app as client_app
from fedskew.engine.flower.client_app import node_partitions
from fedskew.engine.flower.server_app import DeploySettings, deploy


def over_the_wire(records: RecordDict) -> RecordDict:
    """``records`` after Flower's own serialisation (deflate every object, inflate from the bytes)."""
    contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(records).items()}
    out = inflate_object_from_contents(records.object_id, contents)
    assert isinstance(out, RecordDict)
    return out


class Probe(FedAvg):
    """FedAvg plus what richer methods need over Flower: a census before round 1 and client state."""

    def setup(self, server: ServerContext) -> None:
        replies = server.exchange("census", [(cid, Message()) for cid in range(self.fed.num_clients)])
        server.state["counts"] = torch.stack([m.arrays["counts"] for _, m in replies])

    def client_step(self, task: str, msg: Message, client: ClientContext) -> Message:
        if task == "census":
            client.state["rounds"] = 0
            return Message(arrays={"counts": client.class_counts()})
        client.state["rounds"] += 1  # a KeyError here if the node lost the state the census left
        return super().client_step(task, msg, client)


class FakeGrid:
    """A SuperLink in this process: a push runs the ClientApp on the destination node at once.

    Contents go through Flower's serialisation both ways. ``dead`` nodes never answer; ``unavailable``
    nodes get Flower's NODE_UNAVAILABLE error; ``garbled`` nodes answer train requests with records that
    are not a fedskew message.
    """

    def __init__(self, node_configs: list[dict[str, Any]]) -> None:
        self.contexts = {
            100 + i: Context(run_id=1, node_id=100 + i, node_config=c, state=RecordDict(), run_config={})
            for i, c in enumerate(node_configs)
        }
        self.dead: set[int] = set()
        self.unavailable: set[int] = set()
        self.garbled: set[int] = set()
        self._replies: dict[str, FlowerMessage] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: list[FlowerMessage]) -> list[str]:
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = mid = m.object_id
            node = m.metadata.dst_node_id
            if node in self.unavailable:
                self._replies[mid] = FlowerMessage(Error(ErrorCode.NODE_UNAVAILABLE, "gone"), reply_to=m)
            elif node in self.garbled and m.metadata.message_type == "train":
                self._replies[mid] = FlowerMessage(RecordDict({"arrays": ConfigRecord({"w": [1, 2]})}), reply_to=m)
            elif node not in self.dead:
                m.content = over_the_wire(m.content)
                reply = client_app(m, self.contexts[node])
                if reply.has_content():
                    reply.content = over_the_wire(reply.content)
                self._replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, ids: list[str]) -> list[FlowerMessage]:
        return [self._replies.pop(i) for i in ids if i in self._replies]

    def node_of(self, cid: int) -> int:
        return next(n for n, c in self.contexts.items() if cid in node_partitions(c.node_config))


def register_for_flower(monkeypatch: pytest.MonkeyPatch, name: str, cls: type) -> str:
    """Register ``cls`` as algorithm ``name`` for one test, and set the task identity Flower messages
    are stamped with (the in-process SuperLink has no real task)."""
    for attr in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)
    monkeypatch.setitem(ALGORITHMS._items, name, cls)
    return name


def app_folder(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    """A Flower App folder running ``cfg``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "exp.toml").write_text(dump(cfg))
    return write_app(tmp_path / "app", str(tmp_path / "exp.toml"), [], force=True)


def deploy_on(grid: FakeGrid, tmp_path: Path, cfg: dict[str, Any], **settings: Any) -> Path:
    app = app_folder(tmp_path, cfg)
    settings = {"out": str(tmp_path / "out"), "node_wait": 5.0, **settings}
    deploy(grid, DeploySettings(**settings), app)
    return tmp_path / "out" / f"{cfg['label']}-seed{cfg['seed']}"
