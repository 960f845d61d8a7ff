"""Toy federations built by hand, small enough to check an algorithm's rule by hand: the federation's
description, the algorithm, its server (which never exchanges) and its clients, and replies."""

from __future__ import annotations

from typing import Any

import torch

from fedskew.algorithms.base import ALGORITHMS, Algorithm, ClientContext, FederationInfo, ModelSpec, ServerContext
from fedskew.core.message import Message
from fedskew.core.params import build_params


def fed_info(model: str = "logreg", num_clients: int = 4, num_classes: int = 2, image_size: int = 1,
             **options: Any) -> FederationInfo:
    return FederationInfo(
        num_clients=num_clients, num_classes=num_classes,
        model=ModelSpec(model, 1, num_classes, image_size, tuple(options.items())),
        seed=0, mean=(0.0,), std=(1.0,), image_shape=(1, image_size, image_size),
    )


def make(name: str, fed: FederationInfo, **params: Any) -> Algorithm:
    cls = ALGORITHMS.get(name)
    return cls(build_params(cls.Params, params), fed)


def no_exchange(*args: Any, **kwargs: Any) -> list[tuple[int, Message]]:
    raise AssertionError("the toy server does not exchange")


def server_of(algo: Algorithm, fill: float | None = None) -> ServerContext:
    server = ServerContext(fed=algo.fed, model=algo.init_model(), exchange=no_exchange, round=1)
    if fill is not None:
        with torch.no_grad():
            for p in server.model.parameters():
                p.fill_(fill)
    algo.setup(server)
    return server


def client_of(fed: FederationInfo, n: int = 8, cid: int = 0, rnd: int = 1, state: dict | None = None) -> ClientContext:
    g = torch.Generator().manual_seed(cid)
    side = fed.image_shape[1]
    x = torch.randn(n, 1, side, side, generator=g)
    y = torch.arange(n) % fed.num_classes
    return ClientContext(cid=cid, round=rnd, x=x, y=y, fed=fed, state=state if state is not None else {})


def filled(server: ServerContext, value: float) -> dict[str, torch.Tensor]:
    """A client model whose every parameter equals ``value``."""
    return {k: torch.full_like(v, value) for k, v in server.model.state_dict().items()}


def reply(arrays: dict[str, torch.Tensor], n: float, **metrics: float) -> Message:
    return Message(arrays=arrays, metrics={"num_samples": n, **metrics})
