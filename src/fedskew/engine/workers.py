"""Where client work and evaluation chunks run: inline, or in a pool of worker processes.

Every task runs on one intra-op thread (see :mod:`fedskew.core.threads`), and tasks are returned in
submission order, so results are bit-identical for any number of workers. Worker processes receive the
federation's tensors once, through shared memory, at start-up.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.multiprocessing as tmp

from fedskew.algorithms.base import ALGORITHMS, Algorithm, ClientContext, ModelSpec
from fedskew.core.allocator import keep_freed_memory
from fedskew.core.errors import FedskewError
from fedskew.core.message import Message
from fedskew.core.threads import num_threads
from fedskew.engine.federation import Federation
from fedskew.models.evaluation import EvalCounts, evaluate_chunk
from fedskew.models.layout import use_channels_last


@dataclass
class ClientJob:
    task: str
    cid: int
    round: int
    msg: Message
    state: dict[str, Any]


class _Runtime:
    """Per-process state: the federation, the algorithm's client half, reusable models."""

    def __init__(self, fed: Federation, algo_name: str, params: Any) -> None:
        self.fed = fed
        self.algo: Algorithm = ALGORITHMS.get(algo_name)(params, fed.info)
        self.models: dict[ModelSpec, torch.nn.Module] = {}
        self.eval_model: torch.nn.Module | None = None

    def run_client(self, job: ClientJob) -> tuple[Message, dict[str, Any]]:
        x, y = self.fed.client_data(job.cid)
        ctx = ClientContext(
            cid=job.cid, round=job.round, x=x, y=y, fed=self.fed.info, state=job.state,
            model_cache=self.models,
        )
        with num_threads(1):
            reply = self.algo.client_step(job.task, job.msg, ctx)
        return reply, ctx.state

    def run_eval(self, model_state: dict[str, torch.Tensor], start: int, stop: int) -> EvalCounts:
        if self.eval_model is None:
            self.eval_model = use_channels_last(self.fed.info.model.build())
        self.eval_model.load_state_dict(model_state)
        with num_threads(1):
            return evaluate_chunk(
                self.eval_model, self.fed.x_test[start:stop], self.fed.y_test[start:stop],
                self.fed.info.num_classes,
            )


_RUNTIME: _Runtime | None = None


def _init_worker(fed: Federation, algo_name: str, params: Any) -> None:
    global _RUNTIME
    torch.set_num_threads(1)
    keep_freed_memory()
    _RUNTIME = _Runtime(fed, algo_name, params)


def _client_task(job: ClientJob) -> tuple[bytes, dict[str, Any]]:
    """Run a job in a worker; the reply goes back as safetensors bytes (see Message.to_bytes)."""
    assert _RUNTIME is not None
    reply, state = _RUNTIME.run_client(job)
    return reply.to_bytes(), state


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
    """Runs client jobs and evaluation chunks, inline (``workers=1``) or in a process pool."""

    def __init__(self, fed: Federation, algo_name: str, params: Any, workers: int) -> None:
        self.workers = workers
        self._offsets = fed.offsets
        self._pool: Any = None
        self._inline: _Runtime | None = None
        if workers <= 1:
            self._inline = _Runtime(fed, algo_name, params)
        else:
            if mp.parent_process() is not None and mp.current_process().name != "MainProcess":
                # We are being imported by a spawned worker: starting a pool here would recurse.
                raise FedskewError(BROKEN.format(detail=" while starting"))
            fed.share_memory()
            # A ProcessPoolExecutor, not multiprocessing.Pool: if a worker dies (out of memory, or
            # a script without a main guard), the executor breaks and we report it; a Pool would
            # silently respawn workers forever.
            self._pool = ProcessPoolExecutor(
                workers, mp_context=tmp.get_context("spawn"), initializer=_init_worker,
                initargs=(fed, algo_name, params),
            )

    def run_clients(self, jobs: list[ClientJob]) -> list[tuple[Message, dict[str, Any]]]:
        if self._inline is not None:
            return [self._inline.run_client(j) for j in jobs]
        # Largest client first: the pool hands the next job to whichever worker frees up, so the
        # round does not end with one worker still training a big client while the other idles.
        sizes = [self._size(j.cid) for j in jobs]
        order = sorted(range(len(jobs)), key=lambda i: -sizes[i])
        pending = {i: self._pool.submit(_client_task, jobs[i]) for i in order}
        return [(Message.from_bytes(data), state) for data, state in _gather([pending[i] for i in range(len(jobs))])]

    def _size(self, cid: int) -> int:
        return self._offsets[cid + 1] - self._offsets[cid]

    def evaluate_chunks(self, model_state: dict[str, torch.Tensor], bounds: list[tuple[int, int]]) -> list[EvalCounts]:
        if self._inline is not None:
            return [self._inline.run_eval(model_state, s, e) for s, e in bounds]
        return _gather([self._pool.submit(_eval_task, (model_state, s, e)) for s, e in bounds])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def default_workers() -> int:
    """Worker processes to use when the config says 0 (auto): one per core, at most 2."""
    return max(1, min(2, mp.cpu_count()))
