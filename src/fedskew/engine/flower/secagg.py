"""Secure aggregation: a ``train`` exchange through Flower's SecAgg+ protocol (``secagg = true``, docs/deploy.md).

The server (:class:`SecureTrain`) runs Flower's own :class:`~flwr.server.workflow.SecAggPlusWorkflow` for the
exchange, and each ClientApp answers through Flower's own ``secaggplus_mod`` (:func:`.mods.secure_aggregation`,
its ``train`` mod). The workflow's four stages are ``train`` messages to every node of the exchange: setup (keys),
share keys, collect masked vectors (the fedskew request travels with this one, and the node trains) and unmask.

What a client uploads (:func:`secure_upload`): each floating array of its ``train`` reply, as the difference from
the request's array of the same name and shape (the global model the client started from), else as it is; SecAgg+
weights it by the method's weight (``num_samples``, or 1 for a method that averages without weights: the class's
``sum_only_uploads``), clips it to ``secagg_clipping_range``, quantises it and masks it. The server learns only the
weighted sum of the uploads and of the weights, which Flower divides: the weighted mean. In the clear it sees each
client's ``num_samples``, how many of its values were clipped, and its integer arrays (BatchNorm's batch counters).

The algorithm then gets, for each client that took part, a reply whose floating arrays are that mean (the request's
arrays added back) and whose integer arrays and ``num_samples`` are the client's own: a method whose server needs
nothing but the mean (``sum_only_uploads``) computes from them exactly the mean SecAgg+ revealed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common import FitIns, FitRes, Parameters, bytes_to_ndarray, ndarray_to_bytes, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState

from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.engine.flower.settings import SECAGG_MODULUS, DeploySettings
from fedskew.privacy.client import DP_SAMPLE_RATE, DP_STEPS

if TYPE_CHECKING:
    from flwr.serverapp import Grid

log = logging.getLogger("fedskew")

ACCOUNTED = (DP_STEPS, DP_SAMPLE_RATE)
"""A reply's metrics the server's privacy accountant reads (``privacy.mode = "sample"``), kept beside the sum."""
UPLOAD, WEIGHT, CLEAR, STATUS = "fitres.parameters", "fitres.num_examples", "fitres.metrics", "fitres.status"
"""The records of a reply the ``secaggplus_mod`` reads (Flower's legacy ``FitRes``): the arrays it masks, the weight,
and what travels in the clear."""


# ---- the client -------------------------------------------------------------------------------------------
def _delta(request: Message, name: str, t: torch.Tensor) -> bool:
    """Whether reply array ``name`` is uploaded as its difference from the request's array of that name."""
    base = request.arrays.get(name)
    return base is not None and base.is_floating_point() and tuple(base.shape) == tuple(t.shape)


def secure_upload(request: Message, reply: Message, weighting: str, context: Context) -> RecordDict:
    """A client's ``train`` reply as SecAgg+ takes it (the module's docstring says what goes where).

    ``weighting`` is the method's ``sum_only_uploads``. An upload that holds NaN or inf is refused here: the client
    then drops out of the round, which SecAgg+ tolerates, rather than spoil the sum.
    """
    floats: list[np.ndarray] = []
    layout: list[list[str]] = []
    clear: dict[str, Any] = {"num_samples": float(reply.metrics.get("num_samples", 0.0))}
    # DP-SGD's accounting ([privacy] mode = "sample"): the noisy steps and their sampling rate, in the clear
    clear.update({k: float(reply.metrics[k]) for k in ACCOUNTED if k in reply.metrics})
    for name, t in reply.arrays.items():
        t = t.detach().cpu()
        if not t.is_floating_point():  # a counter: it travels in the clear
            layout.append([name, str(t.dtype).removeprefix("torch."), "clear"])
            clear[f"int.{name}"] = ndarray_to_bytes(t.numpy())
            continue
        delta = _delta(request, name, t)
        u = t.double() - request.arrays[name].detach().cpu().double() if delta else t.double()
        if not bool(torch.isfinite(u).all()):
            raise FedskewError(f"array {name!r} of this client's update holds NaN or inf: it stays out of the sum")
        floats.append(u.numpy())
        layout.append([name, str(t.dtype).removeprefix("torch."), "delta" if delta else "value"])
    weight = int(clear["num_samples"]) if weighting == "num_samples" else 1
    sa = SecAggPlusState(**context.state.config_records[RECORD_KEY_STATE])  # what the setup stage told this node
    scale = round(weight / sa.max_weight * sa.target_range) / sa.target_range
    clear["clipped"] = int(sum(int((np.abs(u * scale) > sa.clipping_range).sum()) for u in floats))
    clear["layout"] = json.dumps(layout)
    return RecordDict({
        UPLOAD: ArrayRecord.from_numpy_ndarrays(floats), WEIGHT: MetricRecord({"num_examples": weight}),
        CLEAR: ConfigRecord(clear), STATUS: ConfigRecord({"code": 0, "message": "OK"}),
    })


# ---- the server -------------------------------------------------------------------------------------------
class SendsAndReceives(Protocol):
    """The one method of Flower's ``Grid`` that SecAgg+'s workflow calls."""

    def send_and_receive(
        self, messages: Iterable[FlowerMessage], *, timeout: float | None = None
    ) -> Iterable[FlowerMessage]: ...


class _Collect(Strategy):
    """The legacy strategy the workflow asks: it names the exchange's nodes and keeps what the workflow reveals."""

    def __init__(self, grid: Grid, nodes: Sequence[int]) -> None:
        self.grid, self.nodes = grid, nodes
        self.mean: list[np.ndarray] | None = None
        self.clear: dict[int, dict[str, Any]] = {}

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return [(GridClientProxy(n, self.grid, 0), FitIns(parameters, {})) for n in self.nodes]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: Any
    ) -> tuple[Parameters | None, dict[str, Any]]:
        """The workflow's result: every result's parameters are the unmasked weighted mean."""
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)
            self.clear = {proxy.node_id: dict(res.metrics) for proxy, res in results}
        return (results[0][1].parameters if results else None), {}

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list[Any]:
        return []

    def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> tuple[float | None, dict[str, Any]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> None:
        return None


class _Workflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow, whose masked-vector stage carries fedskew's own requests (the engine header and
    the message's records) in place of the legacy ``FitIns`` the strategy names."""

    def __init__(self, requests: Mapping[int, RecordDict], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests = requests

    def setup_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        ok = super().setup_stage(grid, context, state)
        state.nid_to_fitins = {node: self.requests[node] for node in state.nid_to_fitins}
        return ok


class SecureTrain:
    """Runs ``train`` exchanges through SecAgg+ with ``settings``' parameters.

    ``weighting`` is the method's ``sum_only_uploads``; ``shard_sizes`` the clients' numbers of training samples:
    the largest of an exchange's clients is SecAgg+'s ``max_weight`` (a client's weight is quantised as a fraction
    of it), 1 for unweighted methods.
    """

    def __init__(self, settings: DeploySettings, weighting: str, shard_sizes: Sequence[int]) -> None:
        self.settings, self.weighting, self.shard_sizes = settings, weighting, list(shard_sizes)

    def workflow(self, requests: Mapping[int, RecordDict], max_weight: float) -> SecAggPlusWorkflow:
        s = self.settings
        return _Workflow(
            requests, num_shares=s.secagg_num_shares or 1.0, reconstruction_threshold=s.secagg_reconstruction_threshold,
            max_weight=max_weight, clipping_range=s.secagg_clipping_range,
            quantization_range=s.secagg_quantization_range, modulus_range=SECAGG_MODULUS, timeout=None,
        )

    def run(
        self, grid: SendsAndReceives, requests: Mapping[int, RecordDict], cids: Mapping[int, int], rnd: int,
        base: Message,
    ) -> dict[int, Message | str]:
        """Each node's reply (the mean, with its own clear part) or why it has none; ``requests`` and ``cids`` map
        the exchange's nodes to their requests and clients, ``base`` is the request every client got.

        ``grid`` must have Flower's ``send_and_receive`` (the deployment's :class:`~.server_app.FlowerClients`).
        """
        nodes = list(requests)
        weight = 1.0 if self.weighting == "equal" else float(max(max(self.shard_sizes[c] for c in cids.values()), 1))
        strategy = _Collect(cast("Grid", grid), nodes)
        state = RecordDict({MAIN_CONFIGS_RECORD: ConfigRecord({Key.CURRENT_ROUND: rnd}),
                            MAIN_PARAMS_RECORD: ArrayRecord()})
        context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}),
                                strategy=strategy)
        try:
            self.workflow(requests, weight)(cast("Grid", grid), context)  # send_and_receive is all it uses
        except Exception as e:  # a malformed upload (wrong shapes) breaks Flower's sums
            return dict.fromkeys(nodes, f"SecAgg+ failed: {type(e).__name__}: {e}")
        if strategy.mean is None:
            return dict.fromkeys(nodes, "SecAgg+ halted: fewer clients than secagg_reconstruction_threshold needs "
                                        "stayed to the end of the protocol")
        try:
            out: dict[int, Message | str] = dict(_replies(strategy.mean, strategy.clear, base))
        except (ValueError, TypeError, KeyError) as e:
            return dict.fromkeys(nodes, f"unreadable SecAgg+ upload: {e}")
        clipped = sum(int(c.get("clipped", 0)) for c in strategy.clear.values())
        if clipped:
            log.warning("round %d: SecAgg+ clipped %d values of the clients' weighted updates to "
                        "secagg_clipping_range = %g: raise it", rnd, clipped, self.settings.secagg_clipping_range)
        for node in nodes:
            out.setdefault(node, "dropped out of SecAgg+")
        return out


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _replies(mean: list[np.ndarray], clear: Mapping[int, Mapping[str, Any]], base: Message) -> dict[int, Message]:
    """Each contributor's reply: the revealed mean (``base``'s arrays added back to deltas) and its own clear part."""
    layouts = {str(c.get("layout")) for c in clear.values()}
    if len(layouts) != 1:
        raise ValueError("the clients' uploads differ in layout")
    layout = json.loads(layouts.pop())
    summed = [(name, dtype, kind) for name, dtype, kind in layout if kind != "clear"]
    if len(summed) != len(mean):
        raise ValueError(f"{len(mean)} arrays summed, but the layout names {len(summed)}")
    shared: dict[str, torch.Tensor] = {}
    for (name, dtype, kind), m in zip(summed, mean, strict=True):
        t = torch.from_numpy(np.asarray(m, dtype=np.float64))
        if kind == "delta":
            t = t + base.arrays[name].detach().cpu().double()
        shared[name] = t.to(_dtype(dtype))
    out = {}
    for node, c in clear.items():
        arrays = {}
        for name, dtype, kind in layout:
            if kind == "clear":
                value = c[f"int.{name}"]
                if not isinstance(value, bytes):
                    raise TypeError(f"array {name!r} is not bytes")
                arrays[name] = torch.from_numpy(bytes_to_ndarray(value).copy()).to(_dtype(dtype))
            else:
                arrays[name] = shared[name]
        metrics = {"num_samples": float(c["num_samples"]), **{k: float(c[k]) for k in ACCOUNTED if k in c}}
        out[node] = Message(arrays=arrays, metrics=metrics)
    return out


def same_request(a: Message, b: Message) -> bool:
    """Whether two requests carry the same arrays (SecAgg+ adds one base back to the mean of the deltas)."""
    return a is b or (a.arrays.keys() == b.arrays.keys() and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        for x, y in ((a.arrays[k], b.arrays[k]) for k in a.arrays)))
