"""The Flower ClientApp: runs an algorithm's ``client_step`` on a SuperNode, on that node's data only.

Every request carries an engine header (task, client id, round, the run's dataset/partition/model/
algorithm tables and the federation facts). The node serves the partitions named in its node config
and finds their data in one of two ways:

- ``partition-id``: the node builds the federation from the run's config, exactly as the simulator
  does (same dataset, partitioner and seed), and keeps only its own shard. The data comes from the
  node's own ``data-dir`` (else ``$FEDSKEW_DATA``): the server names the dataset, never a path on the
  node (:func:`node_dataset`);
- ``data-path``: a folder of shard files ``client-<id>.pt`` (written by ``fedskew deploy shards``),
  for when each site holds only its own data; ``partition-id`` still says which shards it serves.

``partition-id`` is one id (``partition-id=3``) or several (``partition-id="0,4,8"``): one SuperNode
may serve several clients, one request at a time. The client's state (SCAFFOLD's control variate,
FedAF's condensed set) stays in the node's ``Context.state``; only messages go back to the server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedskew.algorithms.base import EVALUATE, FederationInfo, make_algorithm
from fedskew.algorithms.condensation.private import with_private_condensation
from fedskew.config.schema import component
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.device import Compute, resolve_device
from fedskew.core.errors import FedskewError
from fedskew.core.params import build_params
from fedskew.engine.federation import build_federation
from fedskew.engine.flower.app import shard_path
from fedskew.engine.flower.messages import (
    HEADER,
    HELLO,
    from_records,
    get_state,
    info_from_json,
    put_state,
    to_records,
)
from fedskew.engine.flower.mods import is_secure, make_client_app
from fedskew.engine.flower.secagg import secure_upload
from fedskew.engine.workers import client_step_on
from fedskew.plugins import load_plugins
from fedskew.privacy.params import PrivacyParams


def node_partitions(node_config: dict[str, Any]) -> list[int]:
    """The client ids a node serves, from its ``partition-id`` node config."""
    raw = node_config.get("partition-id")
    if raw is None:
        raise FedskewError("this SuperNode has no partition-id: start it with --node-config 'partition-id=K'")
    try:
        if isinstance(raw, str):
            return [int(p) for p in raw.replace(",", " ").split()]
        return [int(raw)]
    except ValueError:
        raise FedskewError(f"partition-id must be an integer or a list like \"0,4,8\", got {raw!r}") from None


def node_dataset(table: dict[str, Any]) -> dict[str, Any]:
    """The server's ``[dataset]`` table as this node uses it: the server names a dataset, never a path here.

    ``data_dir`` is dropped (the node's own ``data-dir``, else ``$FEDSKEW_DATA``, decides where its data
    is), and a ``path`` option must stay inside that folder: relative, without ``..``.
    """
    table = {k: v for k, v in table.items() if k != "data_dir"}
    path = table.get("path")
    if path is not None:
        text = str(path)
        inside = not (Path(text).is_absolute() or text.startswith("~") or ".." in re.split(r"[/\\]", text))
        if not inside:
            raise FedskewError(
                f"the server asked for dataset path {text!r}, outside this node's data folder: a SuperNode reads "
                "only from its own data-dir (node config), so the server may name a folder inside it, never a path"
            )
    return table


Shard = tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]
"""A client's training images and labels, and its own test split (None without one)."""


def load_shard(cid: int, run: dict[str, Any], info: FederationInfo, node_config: dict[str, Any]) -> Shard:
    """Client ``cid``'s data, from the node's shard files or rebuilt from the run's config."""
    if node_config.get("data-path"):
        path = shard_path(str(node_config["data-path"]), cid)
        if not path.exists():
            raise FedskewError(f"no shard for client {cid} at {path}")
        shard = torch.load(path, weights_only=True)
        x, y = shard["x"], shard["y"]
        if tuple(x.shape[1:]) != info.image_shape:
            raise FedskewError(f"{path} holds images of shape {tuple(x.shape[1:])}, the run expects {info.image_shape}")
        return x, y, (shard["x_test"], shard["y_test"]) if "x_test" in shard else None
    data_dir = str(node_config.get("data-dir", "")) or None
    dataset = component("dataset", node_dataset(run["dataset"]))
    partition, model = component("partition", run["partition"]), component("model", run["model"])
    fed = build_federation(dataset, partition, model, int(run["seed"]), data_dir)
    if fed.info != info:
        raise FedskewError(
            "this node's federation differs from the server's (other dataset files or fedskew version?): "
            f"{fed.info} != {info}"
        )
    x, y = fed.client_data(cid)
    xt, yt = fed.client_test(cid)
    # keep this shard only; the rest of the federation is freed
    return x.clone(), y.clone(), (xt.clone(), yt.clone()) if fed.has_client_test else None


def handle(message: Message, context: Context) -> Message:
    """Answer one engine request: the partition census, or one client task."""
    keep_freed_memory()
    load_plugins()  # installed plug-ins (entry points); the app's own come with its fedskew_app module
    head = message.content[HEADER]
    assert isinstance(head, ConfigRecord)
    partitions = node_partitions(context.node_config)
    if head["task"] == HELLO:
        return Message(RecordDict({HEADER: ConfigRecord({"partitions": partitions})}), reply_to=message)
    cid, task, rnd = head["cid"], head["task"], head["round"]
    if not (isinstance(cid, int) and isinstance(task, str) and isinstance(rnd, int)):
        raise FedskewError(f"malformed fedskew request header: {dict(head)}")
    if cid not in partitions:
        raise FedskewError(f"asked to run client {cid}, but this node serves partitions {partitions}")
    run = json.loads(str(head["run"]))
    info = info_from_json(str(head["info"]))
    method = component("algorithm", run["algorithm"])  # its parameters checked here, as on the server
    if "privacy" in run:  # private condensation: the [privacy] table rides on the method's params, as in simulation
        table = build_params(PrivacyParams, run["privacy"], prefix="privacy.")
        method = with_private_condensation(method, table)
    algorithm = make_algorithm(method.name, method.params, info)
    weighting = type(algorithm).sum_only()
    secure = is_secure(message)
    if secure and (task != "train" or weighting is None):
        raise FedskewError(f"asked for a SecAgg+ upload of task {task!r} of algorithm {method.name!r}, which secure "
                           "aggregation does not carry (docs/deploy.md)")
    x, y, test = load_shard(cid, run, info, context.node_config)
    # The node's own config says where it computes (``device``, default auto); the run says the precision
    # and the launch-cutting switches (less those the node's device cannot run).
    device = resolve_device(str(context.node_config.get("device", "auto")))
    compute = Compute(
        str(device), str(run.get("amp", "off")), bool(run.get("deterministic", False)),
        sgd_impl=str(run.get("sgd_impl", "default")), compile=str(run.get("compile", "off")),
        tf32=bool(run.get("tf32", False)),
    ).on_device(device)
    request = from_records(message.content)
    reply, state = client_step_on(
        algorithm, task, request, cid, rnd, x, y, info, get_state(context.state, cid), compute, test=test,
    )
    if task != EVALUATE:  # evaluating changes nothing the client keeps
        put_state(context.state, cid, state)
    if secure:  # the upload SecAgg+ masks (secaggplus_mod, around this handler, takes it from here)
        assert weighting is not None
        return Message(secure_upload(request, reply, weighting, context), reply_to=message)
    return Message(to_records(reply), reply_to=message)


app = make_client_app(handle)
"""fedskew's ClientApp: ``train`` tasks arrive as Flower train messages (with secure aggregation, through Flower's
``secaggplus_mod``, which answers the protocol's other steps itself), every other task as query messages."""
