"""Where client work and evaluation chunks run: inline, or in a pool of worker processes.

Every task runs on one intra-op thread (see :mod:`fedskew.core.threads`), and tasks are returned in
submission order, so results are bit-identical for any number of workers. Worker processes receive the
federation's tensors once, through shared memory, when the pool starts; the pool starts all of them before
the first round, once per experiment for the runs on the same data (:class:`WorkerPool`). How many there
are: :mod:`fedskew.engine.pool_size`.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import threading
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.multiprocessing as tmp

from fedskew.algorithms.base import ALGORITHMS, EVALUATE, Algorithm, ClientContext, FederationInfo, ModelSpec
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.device import Compute, set_deterministic_env, to_cpu, to_device, use_compute
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.core.threads import num_threads
from fedskew.engine.federation import Federation
from fedskew.engine.replies import Undecodable, decode_reply, encode_reply
from fedskew.engine.runner import ClientJob
from fedskew.models.evaluation import EvalCounts, evaluate_chunk
from fedskew.models.layout import use_channels_last
from fedskew.plugins import load_plugins, loaded_plugins
from fedskew.privacy.client import ClientPrivacy

__all__ = ["BROKEN", "RunSetup", "WorkerPool", "Workers", "client_step_on"]


FEDERATION_ON_DEVICE_BYTES = 4 * 2**30
"""A federation up to this size is copied to a GPU whole, once (Fashion-MNIST, CIFAR-10); a larger one
stays in pinned CPU memory and each job's shard is moved when the job starts."""


class _Runtime:
    """Per-process state: the federation, the algorithm's client half, reusable models, the device."""

    def __init__(
        self, fed: Federation, algo_name: str, params: Any, compute: Compute | None = None, place: bool = True
    ) -> None:
        self.compute = compute or Compute()
        self.device = self.compute.torch_device
        self.fed = _place(fed, self.device) if place else fed  # place=False: ``fed`` is on the device already
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
            self.eval_model = use_channels_last(self.algo.fed.model.build().to(self.device))  # the method's spec
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
    on the client's own test split ``test``. The client sees the method's ``algo.fed`` (``info`` with, for a method
    that has its own head, FedETF's, the spec it builds its model from).
    """
    device = compute.torch_device
    on_cpu = device.type == "cpu"
    if not on_cpu:
        msg = Message(to_device(msg.arrays, device), msg.config, msg.metrics)
        state = to_device(state, device)
    privacy = ClientPrivacy.of(msg.config, info.seed, rnd, cid)  # what [privacy] asks of this upload, if anything
    ctx = ClientContext(
        cid=cid, round=rnd, x=x.to(device, non_blocking=True), y=y.to(device), fed=algo.fed, state=state,
        model_cache=model_cache if model_cache is not None else {}, device=device, privacy=privacy,
    )
    with num_threads(1), use_compute(compute):
        if task == EVALUATE:
            if test is None:
                raise FedskewError(f"client {cid} holds no test split of its own (partition.client_test_fraction)")
            ctx.x_test, ctx.y_test = test[0].to(device), test[1].to(device)
            reply = algo.evaluate_client(msg, ctx)
        else:
            reply = algo.client_step(task, msg, ctx)
            if privacy is not None:  # local DP's noise, or DP-SGD's steps, before the reply leaves the client
                reply = privacy.finish(algo.upload, msg, reply)
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


_FED: Federation | None = None  # a pool worker's federation, placed on its device once
_COMPUTE: Compute | None = None  # a pool worker's compute (its device) as it started
_RUN: tuple[int, _Runtime] | None = None  # the runtime of the run whose jobs this worker runs now
_BARRIER: Any = None  # the pool's start-up barrier (see WorkerPool)
START_TIMEOUT_S = 600.0
"""How long the pool waits for every worker to start (import torch, map the federation) before giving up."""


@dataclass(frozen=True)
class RunSetup:
    """What a pool worker needs to run one run's jobs; it travels with each job, and a worker builds the run's
    runtime (the algorithm's client half, reusable models) on the first job of the run and keeps it until a
    job of another run comes. ``params`` travels pickled: a worker unpickles it only once it has imported the
    run's plug-ins, which may define its class. ``info`` is the run's (its seed and model: the data may be
    shared by runs of other seeds and models); ``compute`` its amp and determinism (the device is the worker's)."""

    token: int
    plugins: tuple[str, ...]
    info: FederationInfo
    algo_name: str
    params: bytes
    compute: Compute


_RUN_TOKENS = itertools.count(1)


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


def _init_worker(plugins: list[str], fed: Federation, compute: Compute, devices: Any, barrier: Any) -> None:
    """Start a pool worker; ``devices`` hands each worker its device in turn (round robin over the GPUs).

    The parent's plug-ins are imported first (each run's jobs bring the run's, see :class:`RunSetup`).
    """
    global _FED, _COMPUTE, _BARRIER
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
    _COMPUTE = dataclasses.replace(compute, device=device)
    _FED = _place(fed, _COMPUTE.torch_device)
    _BARRIER = barrier
    _warm_up(_COMPUTE)


def _warm_up(compute: Compute) -> None:
    """Do now what a worker's first job would do once: torch's first optimiser imports ``torch._dynamo`` and
    ``use_deterministic_algorithms`` (entered by every job) ``torch._inductor``, 2-5 s of CPU on a 2-core box
    that the first round paid before; a first convolution and matrix product create the device's kernel
    handles (on a GPU: cuDNN, cuBLAS). On zeros: nothing is drawn from any random stream."""
    device = compute.torch_device
    weight = torch.zeros(1, 1, 3, 3, device=device, requires_grad=True)
    torch.optim.SGD([weight], lr=0.1)
    with use_compute(compute):
        torch.nn.functional.conv2d(torch.zeros(1, 1, 8, 8, device=device), weight).sum().backward()
        torch.zeros(8, 8, device=device) @ torch.zeros(8, 8, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _started() -> int:
    """A start-up task: it returns once every worker of the pool holds one, so each has started."""
    _BARRIER.wait(START_TIMEOUT_S)
    return os.getpid()


def _runtime(setup: RunSetup) -> _Runtime:
    """This worker's runtime for ``setup``'s run: kept from the run's earlier jobs, else built afresh (as a
    worker of a pool of its own would build it at start-up), the previous run's dropped first."""
    global _RUN
    assert _FED is not None and _COMPUTE is not None
    if _RUN is None or _RUN[0] != setup.token:
        _RUN = None
        load_plugins(setup.plugins)
        compute = dataclasses.replace(setup.compute, device=_COMPUTE.device)
        fed = dataclasses.replace(_FED, info=setup.info)
        _RUN = setup.token, _Runtime(fed, setup.algo_name, pickle.loads(setup.params), compute, place=False)
    return _RUN[1]


def _client_task(args: tuple[RunSetup, ClientJob]) -> tuple[bytes | str, dict[str, Any]]:
    """Run a job in a worker; the reply goes back as safetensors bytes (see Message.to_bytes), or as the
    reason it cannot (:func:`~fedskew.engine.replies.encode_reply`)."""
    setup, job = args
    reply, state = _runtime(setup).run_client(job)
    return encode_reply(reply), state


def _eval_task(args: tuple[RunSetup, dict[str, torch.Tensor], int, int]) -> EvalCounts:
    setup, model_state, start, stop = args
    return _runtime(setup).run_eval(model_state, start, stop)


T = TypeVar("T")

BROKEN = (
    "a worker process died{detail}. If you start fedskew from your own script, put the call under "
    "`if __name__ == \"__main__\":` (worker processes are spawned and re-import the main module), "
    "or set workers=1"
)

LIVENESS_S = 1.0
"""How often the pool, while it waits for results, looks for a worker that died (see :meth:`WorkerPool.gather`)."""


class WorkerPool:
    """``size`` spawned worker processes holding one federation's tensors (shared memory, placed on each
    worker's device once), all started before this returns; they run the jobs of any run on that federation.

    ``devices`` lists the device of each worker (worker k gets ``devices[k % len(devices)]``). An experiment
    keeps one pool for its runs on the same data (:class:`~fedskew.engine.runner.EngineCache`); a run
    started alone has a pool of its own. A dead worker breaks the pool (``broken``) and is reported as
    :data:`BROKEN`.

    A worker that dies while it sends a result back (SIGTERM, Ctrl-C, the out-of-memory killer) leaves part of
    a message in the result pipe. The executor's manager thread then waits in ``recv()`` for the rest, and
    would wait forever: this process holds the pipe's write end too, so no end of file ever comes, and
    ``shutdown(wait=True)`` (and the interpreter's exit, which joins that thread) hung with it. A stopped run
    then ended only by its watchdog (``fedskew.cli.process.STOP_GRACE_S``), with its ``.lock`` left behind and the
    pool's semaphores leaked. So this process closes its copy of that write end once the workers have started
    (only they write results), and once a worker has died the pool ends the others: with every writer gone
    the manager thread reads an end of file, marks the pool broken and ends.
    """

    def __init__(self, fed: Federation, size: int, compute: Compute, devices: list[str]) -> None:
        if mp.parent_process() is not None and mp.current_process().name != "MainProcess":
            # We are being imported by a spawned worker: starting a pool here would recurse.
            raise FedskewError(BROKEN.format(detail=" while starting"))
        self.fed, self.size, self.broken = fed, size, False
        fed.share_memory()
        ctx = tmp.get_context("spawn")
        queue = None
        if len(set(devices)) > 1:
            queue = ctx.Queue()
            for k in range(size):
                queue.put(devices[k % len(devices)])
        else:
            compute = dataclasses.replace(compute, device=devices[0])
        barrier = ctx.Barrier(size)
        # A ProcessPoolExecutor, not multiprocessing.Pool: if a worker dies (out of memory, or a script
        # without a main guard), the executor breaks and we report it; a Pool would silently respawn workers
        # forever.
        self._executor: ProcessPoolExecutor | None = ProcessPoolExecutor(
            size, mp_context=ctx, initializer=_init_worker,
            initargs=(loaded_plugins(), fed, compute, queue, barrier),
        )
        spawned = getattr(self._executor, "_processes", None)  # pid -> process, filled as the workers spawn
        self._processes: dict[int, Any] = spawned if isinstance(spawned, dict) else {}
        # The executor spawns a worker per submitted task while none is idle, and each start-up task waits
        # at the barrier until all ``size`` are held: so every worker starts now, not in a later round.
        try:
            pids = self.gather([self.submit(_started) for _ in range(size)])
        except threading.BrokenBarrierError:
            self.close()
            raise FedskewError(f"the {size} worker processes did not all start within {START_TIMEOUT_S:.0f} s; "
                               "set fewer workers") from None
        except BaseException:
            self.close()
            raise
        self.pids: list[int] = pids  # one per worker: the barrier held them all at once
        _close_write_end(self._executor)

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        assert self._executor is not None
        try:
            return self._executor.submit(fn, *args)
        except BrokenProcessPool as e:  # a worker died while the pool was idle
            self.broken = True
            raise FedskewError(BROKEN.format(detail=f" ({e})" if str(e) else "")) from None

    def gather(self, futures: list[Future[T]]) -> list[T]:
        """The futures' results, in order. While waiting, a worker that died (and may have left half a reply in
        the result pipe) has the others ended, so the pool breaks rather than waits forever."""
        try:
            while wait(futures, timeout=LIVENESS_S).not_done:
                if self._a_worker_died():
                    self._end_workers()
            return [f.result() for f in futures]
        except BrokenProcessPool as e:
            self.broken = True
            raise FedskewError(BROKEN.format(detail=f" ({e})" if str(e) else "")) from None

    def _a_worker_died(self) -> bool:
        """Whether a worker has ended (its sentinel is ready; nothing is reaped here)."""
        return bool(multiprocessing.connection.wait([p.sentinel for p in list(self._processes.values())], timeout=0))

    def _end_workers(self) -> None:
        """SIGKILL every worker: the pool is broken once one has died, and a survivor may wait forever for the lock
        of the result pipe, which the dead one held."""
        for p in list(self._processes.values()):
            p.kill()

    def close(self) -> None:
        """End the pool: its workers finish their jobs and exit; should one have died (a stop, a crash), the
        others are ended first, so that the executor's clean-up never waits on a half-sent reply."""
        if self._executor is not None:
            if self._a_worker_died():
                self._end_workers()
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def _close_write_end(executor: ProcessPoolExecutor) -> None:
    """Close this process's copy of the write end of ``executor``'s result pipe (CPython's
    ``ProcessPoolExecutor._result_queue``, a SimpleQueue only the workers write to; each holds its own copy), so
    that the pipe reads an end of file once every worker has died (see :class:`WorkerPool`). Call it only once
    every worker has started: a worker started later is handed this end. An executor laid out otherwise is left
    as it is."""
    writer = getattr(getattr(executor, "_result_queue", None), "_writer", None)
    if writer is not None:
        writer.close()


class Workers:
    """A run's runner on this machine: its client jobs and evaluation chunks run inline (``workers=1``, in
    this process) or in a :class:`WorkerPool`: ``pool`` when given (an experiment's, kept open by
    :meth:`close`), else one of its own of ``workers`` processes on ``devices`` (closed by :meth:`close`).
    """

    def __init__(
        self, fed: Federation, algo_name: str, params: Any, workers: int,
        compute: Compute | None = None, devices: list[str] | None = None, pool: WorkerPool | None = None,
    ) -> None:
        compute = compute or Compute()
        devices = devices or [compute.device]
        self._offsets = fed.offsets
        self._own = pool is None
        self._pool: WorkerPool | None = None
        self._inline: _Runtime | None = None
        if pool is None and workers <= 1:
            self.workers = 1
            self._inline = _Runtime(fed, algo_name, params, dataclasses.replace(compute, device=devices[0]))
            return
        self._pool = pool or WorkerPool(fed, workers, compute, devices)
        self.workers = self._pool.size
        self._setup = RunSetup(
            next(_RUN_TOKENS), tuple(loaded_plugins()), fed.info, algo_name, pickle.dumps(params), compute
        )

    def run_clients(self, jobs: list[ClientJob]) -> list[tuple[Message | Undecodable, dict[str, Any]]]:
        if self._inline is not None:
            return [self._inline.run_client(j) for j in jobs]
        assert self._pool is not None
        # Largest client first: the pool hands the next job to whichever worker frees up, so the
        # round does not end with one worker still training a big client while the other idles.
        sizes = [self._size(j.cid) for j in jobs]
        order = sorted(range(len(jobs)), key=lambda i: -sizes[i])
        for job in jobs:
            _share(job.msg.arrays, job.state)
        pending = {i: self._pool.submit(_client_task, (self._setup, jobs[i])) for i in order}
        done = self._pool.gather([pending[i] for i in range(len(jobs))])
        return [(decode_reply(data), state) for data, state in done]

    def _size(self, cid: int) -> int:
        return self._offsets[cid + 1] - self._offsets[cid]

    def evaluate_chunks(self, model_state: dict[str, torch.Tensor], bounds: list[tuple[int, int]]) -> list[EvalCounts]:
        if self._inline is not None:
            return [self._inline.run_eval(model_state, s, e) for s, e in bounds]
        assert self._pool is not None
        _share(model_state)
        return self._pool.gather([self._pool.submit(_eval_task, (self._setup, model_state, s, e)) for s, e in bounds])

    def close(self) -> None:
        if self._pool is not None and self._own:
            self._pool.close()
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
