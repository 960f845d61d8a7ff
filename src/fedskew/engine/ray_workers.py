"""Client jobs and evaluation chunks as Ray tasks (``engine = "ray"``), on a local instance or a cluster.

:class:`RayWorkers` has the interface of :class:`~fedskew.engine.workers.Workers` and keeps its
guarantees: every task runs on one intra-op thread and results come back in submission order, so
``metrics.jsonl`` is byte-identical to the inline engine's (on CPU). Client state travels with the job
and back with the reply, into the round loop's per-client store, exactly as with ``Workers``: it is
checkpointed with the run and survives a resume, whichever node ran the client last.

The federation (all client shards and the test set) is put into Ray's object store once per run, as
numpy arrays, and each job carries only its reference. A Ray worker process reads it the first time it
gets a task of the run (zero-copy from the node's shared object store) and keeps it, with the
algorithm's client half and its reusable models, for the rest of the run.

Nothing here imports Ray at module level: only :class:`RayWorkers` does, when the engine is chosen.
The setting ``workers`` does not apply to this engine: Ray runs as many jobs at once as the cluster's
resources allow, each job asking for ``ray.num_cpus`` CPUs and ``ray.num_gpus`` GPUs.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import socket
import warnings
from collections import Counter
from typing import Any

import torch

from fedskew.config.schema import RayParams
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.device import Compute
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.engine.federation import Federation
from fedskew.engine.replies import Undecodable, decode_reply, encode_reply
from fedskew.engine.runner import ClientJob, EngineContext
from fedskew.engine.workers import _Runtime
from fedskew.models.evaluation import EvalCounts
from fedskew.plugins import load_plugins, loaded_plugins

log = logging.getLogger("fedskew")

MISSING_RAY = "engine 'ray' needs Ray: pip install ray (from a clone: pip install -e '.[ray]')"
_TENSORS = ("x", "y", "x_test", "y_test", "x_client_test", "y_client_test")  # the last two may be None


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FedskewError(MISSING_RAY) from None
    return ray


def check_reachable(address: str, timeout: float = 10.0) -> None:
    """Refuse at once a ``HOST:PORT`` (or ``ray://HOST:PORT``) where nothing listens: Ray would retry for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and other forms: Ray finds the cluster itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise FedskewError(
            f"ray.address {address!r}: nothing answers there ({e.strerror or e}); give the HOST:PORT of a "
            "running Ray head node, 'auto', or leave it empty to start a local instance"
        ) from None


def object_store_bytes(fed: Federation) -> int:
    """Object store of a local Ray instance: twice the federation, plus 256 MB for models and replies."""
    data = sum(t.nbytes for t in fed.tensors())
    return 2 * data + 256 * 2**20


# ---- the worker side: runs in Ray's worker processes ---------------------------------------------------------

_CACHED: tuple[str, _Runtime] | None = None  # (the run's federation reference, its runtime) in this process


def _runtime(fed_ref: list[Any]) -> _Runtime:
    """This process's runtime for the run whose federation is ``fed_ref[0]``, read from the store once.

    The reference arrives inside a list so that Ray does not fetch the federation for every task.
    """
    global _CACHED
    key = fed_ref[0].hex()
    if _CACHED is None or _CACHED[0] != key:
        import ray

        _CACHED = None  # drop a previous run's federation before reading this one
        torch.set_num_threads(1)
        keep_freed_memory()
        fields, plugins, algo_name, params, compute = ray.get(fed_ref[0])
        load_plugins(plugins)  # before the Params are unpickled: their class may be a plug-in's
        with warnings.catch_warnings():
            # The arrays are read-only views of the object store: client code reads its data, never writes it.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            tensors = {name: None if fields[name] is None else torch.from_numpy(fields[name]) for name in _TENSORS}
        fed = Federation(**{**fields, **tensors})
        _CACHED = (key, _Runtime(fed, algo_name, pickle.loads(params), compute))
    return _CACHED[1]


def _node() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _client_task(
    fed_ref: list[Any], task: str, cid: int, round: int, msg: Message, state: dict[str, Any]
) -> tuple[str, bytes | str, dict[str, Any]]:
    """Run one client job; the reply goes back as safetensors bytes (see Message.to_bytes), or as the
    reason it cannot (:func:`~fedskew.engine.replies.encode_reply`)."""
    reply, new_state = _runtime(fed_ref).run_client(ClientJob(task, cid, round, msg, state))
    return _node(), encode_reply(reply), new_state


def _eval_task(
    fed_ref: list[Any], model_state: dict[str, torch.Tensor], start: int, stop: int
) -> tuple[str, EvalCounts]:
    return _node(), _runtime(fed_ref).run_eval(model_state, start, stop)


# ---- the driver side -----------------------------------------------------------------------------------------


class RayWorkers:
    """Runs client jobs and evaluation chunks as Ray tasks; the interface of :class:`~fedskew.engine.workers.Workers`.

    Parameters
    ----------
    fed
        The run's federation; put into Ray's object store once, here.
    algo_name, params
        The algorithm whose client half the tasks run.
    settings
        The ``[ray]`` table: ``address`` joins a running cluster (empty: start a local Ray instance for
        this run, with an object store of :func:`object_store_bytes`, and stop it in :meth:`close`);
        ``num_cpus`` and ``num_gpus`` are the resources each task asks for; ``scheduling`` whether Ray
        spreads the tasks over the nodes (``"spread"``) or uses its default placement.

    Notes
    -----
    The run setting ``workers`` is ignored with this engine: how many tasks run at once is up to Ray,
    that is, the cluster's CPUs (GPUs) divided by ``num_cpus`` (``num_gpus``). If this process is
    already connected to Ray (a script that called ``ray.init`` itself), that connection is used and
    left open. Every node needs fedskew (and the dataset nowhere: the data travel through the object
    store), and the run's plug-ins (:func:`~fedskew.plugins.loaded_plugins`, imported by each worker
    process before its first task): installed, or as files at the same path.
    """

    def __init__(
        self, fed: Federation, algo_name: str, params: Any, settings: RayParams, compute: Compute | None = None
    ) -> None:
        ray = self._ray = _import_ray()
        self._owned = False  # whether close() ends the connection (and the local instance) we opened
        if not ray.is_initialized():
            self._connect(fed, settings.address)
        self._offsets = fed.offsets
        self.nodes: Counter[str] = Counter()  # tasks run per node id
        try:
            fields = {f.name: getattr(fed, f.name) for f in dataclasses.fields(fed)}
            fields.update({name: None if fields[name] is None else fields[name].numpy() for name in _TENSORS})
            # A task that asks for a GPU sees the one Ray assigned it as cuda:0 (CUDA_VISIBLE_DEVICES).
            compute = dataclasses.replace(compute or Compute(), device="cuda:0" if settings.num_gpus > 0 else "cpu")
            self._fed_ref = ray.put((fields, loaded_plugins(), algo_name, pickle.dumps(params), compute))
            resources = {"num_cpus": settings.num_cpus, "num_gpus": settings.num_gpus,
                         "scheduling_strategy": "SPREAD" if settings.scheduling == "spread" else "DEFAULT"}
            self._client_task = ray.remote(_client_task).options(**resources)
            self._eval_task = ray.remote(_eval_task).options(**resources)
        except BaseException:
            self.close()
            raise

    def _connect(self, fed: Federation, address: str) -> None:
        ray = self._ray
        try:
            if address:
                check_reachable(address)
                ray.init(address=address, logging_level=logging.WARNING)
            else:
                ray.init(object_store_memory=object_store_bytes(fed), include_dashboard=False,
                         logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as e:
            where = f"the Ray cluster at ray.address {address!r}" if address else "a local Ray instance"
            raise FedskewError(f"cannot start or reach {where}: {e}") from None
        self._owned = True

    def _gather(self, refs: list[Any]) -> list[Any]:
        errors = self._ray.exceptions
        try:
            results = self._ray.get(refs)
        except errors.RayTaskError as e:
            if isinstance(e.cause, FedskewError):
                raise e.cause from None  # a user's problem stays one line, as with the other engines
            raise
        except errors.RayError as e:  # a lost worker, node or object
            raise FedskewError(f"a Ray task was lost: {str(e).splitlines()[0]}") from None
        self.nodes.update(node for node, *_ in results)
        return results

    def run_clients(self, jobs: list[ClientJob]) -> list[tuple[Message | Undecodable, dict[str, Any]]]:
        # Each distinct request goes into the object store once (FedAvg sends one model to every client).
        puts: dict[int, Any] = {}
        for j in jobs:
            if id(j.msg) not in puts:
                puts[id(j.msg)] = self._ray.put(j.msg)
        # Largest client first, as with the process pool: the round does not end on one big straggler.
        sizes = [self._offsets[j.cid + 1] - self._offsets[j.cid] for j in jobs]
        order = sorted(range(len(jobs)), key=lambda i: -sizes[i])
        pending = {
            i: self._client_task.remote(
                [self._fed_ref], jobs[i].task, jobs[i].cid, jobs[i].round, puts[id(jobs[i].msg)], jobs[i].state
            )
            for i in order
        }
        results = self._gather([pending[i] for i in range(len(jobs))])
        return [(decode_reply(data), state) for _, data, state in results]

    def evaluate_chunks(self, model_state: dict[str, torch.Tensor], bounds: list[tuple[int, int]]) -> list[EvalCounts]:
        state_ref = self._ray.put(model_state)
        results = self._gather([self._eval_task.remote([self._fed_ref], state_ref, s, e) for s, e in bounds])
        return [counts for _, counts in results]

    def close(self) -> None:
        """Log where the tasks ran; disconnect (and stop the local instance) if this object connected."""
        if self.nodes:
            log.info("ray: %d tasks ran on %d nodes", sum(self.nodes.values()), len(self.nodes))
        self._fed_ref = None
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()
        self._owned = False



def ray_engine(ctx: EngineContext) -> RayWorkers:
    """``engine = "ray"``: :class:`RayWorkers` with the run's ``[ray]`` table (``workers`` is not used)."""
    return RayWorkers(ctx.fed, ctx.algorithm, ctx.params, ctx.config.ray, ctx.compute)
