"""A plug-in as a user writes one, outside the repository: an algorithm, a model and a partitioner.

:func:`write_plugin` writes it into a test's ``tmp_path``; :func:`plugin_config` is the tiny federation
run with them; :func:`fresh_registries` undoes, after a test, what importing the plug-in into the test
process registered. :data:`BAD_REPLY` is a plug-in algorithm whose client 0 sends a broken reply.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers.configs import tiny_config

ALGORITHM = "plugin_fedavg"
MODEL = "plugin_mlp"
PARTITIONER = "plugin_blocks"

SOURCE = f'''"""A user's plug-in: FedAvg that damps the averaged update, a one-hidden-layer MLP, label-sorted blocks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from fedskew import (
    MODELS, PARTITIONERS, FedAvg, FedModel, ModelParams, Partition, PartitionParams, register_algorithm,
)
from fedskew.core.params import check


@register_algorithm("{ALGORITHM}")
class DampedFedAvg(FedAvg):
    """FedAvg whose new global model is ``w + damping * (average - w)``."""

    @dataclass
    class Params(FedAvg.Params):
        damping: float = 1.0

        def __post_init__(self) -> None:
            super().__post_init__()
            check(0 < self.damping <= 1, "damping", self.damping, "in (0, 1]")

    def aggregate(self, server, replies):
        if not replies:
            return
        old = {{k: v.clone() for k, v in server.model.state_dict().items()}}
        super().aggregate(server, replies)
        d = self.params.damping
        new = server.model.state_dict()
        server.model.load_state_dict(
            {{k: old[k] + d * (new[k] - old[k]) if new[k].is_floating_point() else new[k] for k in new}}
        )


@dataclass(kw_only=True)
class MlpParams(ModelParams):
    hidden: int = 16


@MODELS.register("{MODEL}", params=MlpParams)
def plugin_mlp(p, *, in_channels, num_classes, image_size):
    features = nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size**2, p.hidden), nn.ReLU())
    return FedModel(features, nn.Linear(p.hidden, num_classes))


@PARTITIONERS.register("{PARTITIONER}", params=PartitionParams)
def blocks(labels, rng, p, domains):
    """Sort by label and cut into equal contiguous blocks: each client sees one or two classes."""
    order = np.argsort(labels, kind="stable")
    return Partition([np.sort(chunk) for chunk in np.array_split(order, p.num_clients)])
'''


def write_plugin(folder: Path, name: str = "my_plugin.py") -> Path:
    """The plug-in file ``folder/name``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(SOURCE)
    return path


def plugin_config(**over: Any) -> dict[str, Any]:
    """The tiny federation with the plug-in's algorithm and model (it need not be imported yet)."""
    cfg = tiny_config(**over)
    cfg["model"] = {"name": MODEL, "hidden": 12}
    cfg["algorithm"] = {**cfg["algorithm"], "name": ALGORITHM, "damping": 0.5}
    return cfg


@contextmanager
def fresh_registries() -> Iterator[None]:
    """Whatever plug-ins a test imports into this process is forgotten afterwards (entries, modules)."""
    from fedskew import plugins
    from fedskew.algorithms.base import ALGORITHMS
    from fedskew.data import DATASETS
    from fedskew.data.partition import PARTITIONERS
    from fedskew.models import MODELS

    registries = (ALGORITHMS, MODELS, DATASETS, PARTITIONERS)
    saved = [(dict(r._items), dict(r._params)) for r in registries]
    loaded = dict(plugins._LOADED)
    modules = set(sys.modules)
    try:
        yield
    finally:
        for r, (items, params) in zip(registries, saved, strict=True):
            r._items, r._params = items, params
        plugins._LOADED.clear()
        plugins._LOADED.update(loaded)
        for name in set(sys.modules) - modules:
            if name.startswith("fedskew_plugin_"):
                del sys.modules[name]


BAD_REPLY = '''
from dataclasses import dataclass

from fedskew import FedAvg, register_algorithm


@register_algorithm("bad_reply")
class BadReply(FedAvg):
    """FedAvg whose client 0 sends a broken reply of one kind."""

    @dataclass
    class Params(FedAvg.Params):
        kind: str = "string"

    def client_step(self, task, msg, client):
        reply = super().client_step(task, msg, client)
        if task != "train" or client.cid != 0:
            return reply
        kind = self.params.kind
        if kind == "string":
            reply.metrics["num_samples"] = "12"
        elif kind == "bool":
            reply.metrics["num_samples"] = True
        elif kind == "unencodable":
            reply.metrics["loss"] = object()
        elif kind == "not_message":
            return {"arrays": reply.arrays}
        return reply
'''
"""A plug-in: algorithm ``bad_reply``, FedAvg whose client 0 sends a broken reply of the kind its ``kind`` names."""
