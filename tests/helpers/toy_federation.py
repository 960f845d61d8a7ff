"""Toy federations built by hand, small enough to check an algorithm's rule by hand: the federation's
description, the algorithm, its server (which never exchanges) and its clients, and replies."""

from __future__ import annotations

from typing import Any

import torch

from fedskew.algorithms.base import ALGORITHMS, Algorithm, ClientContext, FederationInfo, ModelSpec, ServerContext
from fedskew.core.message import Message
from fedskew.core.params import build_params
from fedskew.models.layout import shuffled_batches


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


def sgd_by_hand(
    fed: FederationInfo, start: dict[str, torch.Tensor], client: ClientContext, lr: float, batch_size: int,
    extra: Any,
) -> tuple[dict[str, torch.Tensor], int]:
    """One epoch of plain SGD from ``start`` over the client's shuffled batches, written out: each step moves
    a parameter by ``-lr * (grad + extra(name, p))``. Returns the final weights and the number of steps."""
    model = fed.model.build()
    model.load_state_dict(start)
    idx = shuffled_batches(int(client.y.shape[0]), batch_size, client.generator("train"))
    for b in idx:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(client.x[b]), client.y[b]).backward()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p -= lr * (p.grad + extra(name, p))
    return model.state_dict(), len(idx)


def scaffold_client(algo: Algorithm) -> tuple[ServerContext, dict, dict, ClientContext, Message]:
    """SCAFFOLD's server with c = 0.3 everywhere, a client with c_i = -0.2, and the client's reply to round 1."""
    server = server_of(algo)
    c = {k: torch.full_like(v, 0.3) for k, v in server.state["c"].items()}
    c_i = {k: torch.full_like(v, -0.2) for k, v in c.items()}
    server.state["c"] = c
    (_, msg), *_ = algo.configure(server)
    client = client_of(algo.fed, n=8, state={"c_i": c_i})
    return server, c, c_i, client, algo.client_step("train", msg, client)
