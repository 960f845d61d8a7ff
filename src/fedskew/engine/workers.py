"""Where client work and evaluation chunks run: inline, or in a pool of worker processes.

Every task runs on one intra-op thread (see :mod:`fedskew.core.threads`), and tasks are returned in
submission order, so results are bit-identical for any number of workers. Worker processes receive the
federation's tensors once, through shared memory, at start-up.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import pickle
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.multiprocessing as tmp

from fedskew.algorithms.base import ALGORITHMS, EVALUATE, Algorithm, ClientContext, FederationInfo, ModelSpec
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.device import (
    Compute,
    set_deterministic_env,
    to_cpu,
    to_device,
    use_compute,
)
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.core.threads import num_threads
from fedskew.engine.federation import Federation
from fedskew.engine.replies import Undecodable, decode_reply, encode_reply
from fedskew.engine.runner import ClientJob, EngineContext
from fedskew.models.evaluation import EvalCounts, evaluate_chunk
from fedskew.models.layout import use_channels_last
from fedskew.plugins import load_plugins, loaded_plugins

FEDERATION_ON_DEVICE_BYTES = 4 * 2**30
"""A federation up to this size is copied to a GPU whole, once (Fashion-MNIST, CIFAR-10); a larger one
stays in pinned CPU memory and each job's shard is moved when the job starts."""


class _Runtime:
    """Per-process state: the federation, the algorithm's client half, reusable models, the device."""

    def __init__(self, fed: Federation, algo_name: str, params: Any, compute: Compute | None = None) -> None:
        self.compute = compute or Compute()
        self.device = self.compute.torch_device
        self.fed = _place(fed, self.device)
        self.algo: Algorithm = ALGORITHMS.get(algo_name)(params, fed.info)
        self.models: dict[ModelSpec, torch.nn.Module] = {}
        self.eval_model: torch.nn.Module | None = None

    def run_client(self, job: ClientJob) -> tuple[Message, dict[str, Any]]:
        x, y = self.fed.client_data(job.cid)
        return client_step_on(
            self.algo, job.task, job.msg, job.cid, job.round, x, y, self.fed.info, job.state, self.compute,
            self.models, self.fed.client_test(job.cid) if job.task == EVALUATE else None,
        )

    def run_eval(self, model_state: dict[str, torch.Tensor], start: int, stop: int) -> EvalCounts:
        if self.eval_model is None:
            self.eval_model = use_channels_last(self.fed.info.model.build().to(self.device))
        self.eval_model.load_state_dict(model_state)
        with num_threads(1), use_compute(self.compute):
            x, y = self.fed.x_test[start:stop].to(self.device), self.fed.y_test[start:stop].to(self.device)
            return evaluate_chunk(self.eval_model, x, y, self.fed.info.num_classes)


def client_step_on(
    algo: Algorithm, task: str, msg: Message, cid: int, rnd: int, x: torch.Tensor, y: torch.Tensor,
    info: FederationInfo, state: dict[str, Any], compute: Compute,
    model_cache: dict[ModelSpec, torch.nn.Module] | None = None,
    test: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[Message, dict[str, Any]]:
    """Run one client job on ``compute``'s device: the simulator's workers and Flower's ClientApp alike.

    The message's arrays, the client's data and its state go to the device; the reply and the state
    come back device-free (the reply goes on the wire, the state is checkpointed). The job runs on one
    intra-op thread, so CPU results are bit-identical whichever process runs it. The engine's
    ``evaluate`` task (:data:`~fedskew.algorithms.base.EVALUATE`) runs :meth:`Algorithm.evaluate_client`
    on the client's own test split ``test``.
    """
    device = compute.torch_device
    on_cpu = device.type == "cpu"
    if not on_cpu:
        msg = Message(to_device(msg.arrays, device), msg.config, msg.metrics)
        state = to_device(state, device)
    ctx = ClientContext(
        cid=cid, round=rnd, x=x.to(device, non_blocking=True), y=y.to(device), fed=info, state=state,
        model_cache=model_cache if model_cache is not None else {}, device=device,
    )
    with num_threads(1), use_compute(compute):
        if task == EVALUATE:
            if test is None:
                raise FedskewError(f"client {cid} holds no test split of its own (partition.client_test_fraction)")
            ctx.x_test, ctx.y_test = test[0].to(device), test[1].to(device)
            reply = algo.evaluate_client(msg, ctx)
        else:
            reply = algo.client_step(task, msg, ctx)
    if on_cpu:
        return reply, ctx.state
    return Message(to_cpu(reply.arrays), reply.config, reply.metrics), to_device(ctx.state, torch.device("cpu"))


def _place(fed: Federation, device: torch.device) -> Federation:
    """The federation as this process uses it: on the device when it fits, else pinned on the CPU."""
    if device.type == "cpu":
        return fed
    names = ("x", "y", "x_test", "y_test", "x_client_test", "y_client_test")
    tensors = {name: getattr(fed, name) for name in names if getattr(fed, name) is not None}
    if sum(t.numel() * t.element_size() for t in tensors.values()) <= FEDERATION_ON_DEVICE_BYTES:
        placed = {name: t.to(device) for name, t in tensors.items()}
    else:
        placed = {name: t.pin_memory() if device.type == "cuda" else t for name, t in tensors.items()}
    return dataclasses.replace(fed, **placed)


_RUNTIME: _Runtime | None = None


def _die_with_parent() -> None:
    """End this worker process as soon as the process that started it is gone (killed, crashed, ended).

    multiprocessing gives a spawned child a sentinel: the read end of a pipe whose write end only the
    parent holds, so it becomes readable (end of file) when the parent dies, however it dies. A daemon
    thread waits on it and exits the process; without it, workers of a killed run (and the resource
    tracker they keep open) would live on, holding their memory.
    """
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # waits on the sentinel
        os._exit(1)  # no one is left to take this worker's results

    threading.Thread(target=watch, name="fedskew-parent-watch", daemon=True).start()


def _init_worker(
    plugins: list[str], fed: Federation, algo_name: str, params: bytes, compute: Compute, devices: Any
) -> None:
    """Start a pool worker; ``devices`` hands each worker its device in turn (one GPU each, round robin).

    The parent's plug-ins are imported first, then ``params`` unpickled: its class may be a plug-in's.
    """
    global _RUNTIME
    _die_with_parent()
    load_plugins(plugins)
    torch.set_num_threads(1)
    keep_freed_memory()
    if compute.deterministic:
        set_deterministic_env()
    device = devices.get() if devices is not None else compute.device
    if str(device).startswith("cuda"):
        # This worker's GPU becomes its current device, so that kernels, caches and any tensor made
        # without a device index go there rather than to GPU 0.
        torch.cuda.set_device(torch.device(device))
    _RUNTIME = _Runtime(fed, algo_name, pickle.loads(params), dataclasses.replace(compute, device=device))


def _client_task(job: ClientJob) -> tuple[bytes | str, dict[str, Any]]:
    """Run a job in a worker; the reply goes back as safetensors bytes (see Message.to_bytes), or as the
    reason it cannot (:func:`~fedskew.engine.replies.encode_reply`)."""
    assert _RUNTIME is not None
    reply, state = _RUNTIME.run_client(job)
    return encode_reply(reply), state


def _eval_task(args: tuple[dict[str, torch.Tensor], int, int]) -> EvalCounts:
    assert _RUNTIME is not None
    return _RUNTIME.run_eval(*args)


T = TypeVar("T")

BROKEN = (
    "a worker process died{detail}. If you start fedskew from your own script, put the call under "
    "`if __name__ == \"__main__\":` (worker processes are spawned and re-import the main module), "
    "or set workers=1"
)


def _gather(futures: list[Future[T]]) -> list[T]:
    try:
        return [f.result() for f in futures]
    except BrokenProcessPool as e:
        raise FedskewError(BROKEN.format(detail=f" ({e})" if str(e) else "")) from None


class Workers:
    """Runs client jobs and evaluation chunks, inline (``workers=1``) or in a process pool.

    ``devices`` lists the device of each pool worker (worker k gets ``devices[k % len(devices)]``:
    one process per GPU when the run uses several); inline, the first is used.
    """

    def __init__(
        self, fed: Federation, algo_name: str, params: Any, workers: int,
        compute: Compute | None = None, devices: list[str] | None = None,
    ) -> None:
        compute = compute or Compute()
        devices = devices or [compute.device]
        self.workers = workers
        self._offsets = fed.offsets
        self._pool: Any = None
        self._inline: _Runtime | None = None
        if workers <= 1:
            self._inline = _Runtime(fed, algo_name, params, dataclasses.replace(compute, device=devices[0]))
        else:
            if mp.parent_process() is not None and mp.current_process().name != "MainProcess":
                # We are being imported by a spawned worker: starting a pool here would recurse.
                raise FedskewError(BROKEN.format(detail=" while starting"))
            fed.share_memory()
            ctx = tmp.get_context("spawn")
            queue = None
            if len(set(devices)) > 1:
                queue = ctx.Queue()
                for k in range(workers):
                    queue.put(devices[k % len(devices)])
            else:
                compute = dataclasses.replace(compute, device=devices[0])
            # A ProcessPoolExecutor, not multiprocessing.Pool: if a worker dies (out of memory, or
            # a script without a main guard), the executor breaks and we report it; a Pool would
            # silently respawn workers forever.
            # The plug-ins this process imported go first; the Params travel pickled, so that a worker
            # unpickles them only once it has imported the plug-in that defines their class.
            self._pool = ProcessPoolExecutor(
                workers, mp_context=ctx, initializer=_init_worker,
                initargs=(loaded_plugins(), fed, algo_name, pickle.dumps(params), compute, queue),
            )

    def run_clients(self, jobs: list[ClientJob]) -> list[tuple[Message | Undecodable, dict[str, Any]]]:
        if self._inline is not None:
            return [self._inline.run_client(j) for j in jobs]
        # Largest client first: the pool hands the next job to whichever worker frees up, so the
        # round does not end with one worker still training a big client while the other idles.
        sizes = [self._size(j.cid) for j in jobs]
        order = sorted(range(len(jobs)), key=lambda i: -sizes[i])
        for job in jobs:
            _share(job.msg.arrays, job.state)
        pending = {i: self._pool.submit(_client_task, jobs[i]) for i in order}
        return [(decode_reply(data), state) for data, state in _gather([pending[i] for i in range(len(jobs))])]

    def _size(self, cid: int) -> int:
        return self._offsets[cid + 1] - self._offsets[cid]

    def evaluate_chunks(self, model_state: dict[str, torch.Tensor], bounds: list[tuple[int, int]]) -> list[EvalCounts]:
        if self._inline is not None:
            return [self._inline.run_eval(model_state, s, e) for s, e in bounds]
        _share(model_state)
        return _gather([self._pool.submit(_eval_task, (model_state, s, e)) for s, e in bounds])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _share(*tables: dict[str, Any]) -> None:
    """Move the CPU tensors of ``tables`` into shared memory here, in the calling thread.

    Otherwise the pool's feeder thread does it while pickling a job, and the copy it runs there starts
    a second OpenMP thread team in this process; the main thread's own training (a condensation
    method's server step) then ran about 1.45x slower until the pool closed. Moving storage into
    shared memory keeps every value, so results are unchanged.
    """
    for table in tables:
        for value in table.values():
            if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.is_shared():
                value.share_memory_()


def usable_cores() -> int:
    """CPU cores this process may use: its CPU affinity, capped by a cgroup (container) CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    return max(1, min(cores, quota) if quota is not None else cores)


def _cgroup_cpu_quota() -> int | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us`` limit, or None if unlimited."""
    try:
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if text and text[0] != "max":
            return max(1, math.ceil(int(text[0]) / int(text[1])))
        return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return max(1, math.ceil(quota / period)) if quota > 0 else None
    except (OSError, ValueError):
        return None


def default_workers(devices: Sequence[str] = ("cpu",)) -> int:
    """Worker processes when the config says 0 (auto), for the workers' ``devices`` (:attr:`Compute.workers`):
    one per GPU on GPUs, else one per usable core."""
    if devices[0].startswith("cuda"):
        return len(devices)
    if devices[0] == "mps":
        return 1
    return usable_cores()


def local_engine(ctx: EngineContext) -> Workers:
    """``engine = "local"``: :class:`Workers` on this machine, ``workers`` of them (0: :func:`default_workers`)."""
    devices = list(ctx.compute.workers or (ctx.compute.device,))
    workers = ctx.config.run.workers or default_workers(devices)
    return Workers(ctx.fed, ctx.algorithm, ctx.params, workers, ctx.compute, devices)
