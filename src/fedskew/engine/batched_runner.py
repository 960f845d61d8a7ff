"""Batched clients: a round's clients train together on one device (``clients_in_parallel``).

The runner runs each client job's ``client_step`` in a thread of its own, one thread at a time. When a
job's ``train_local`` can be batched (:mod:`fedskew.components.batching`) the job hands its training
over and waits; once every job of the group is waiting or done, the runner trains the waiting clients
together (:func:`~fedskew.components.batched.train_batched`: one SGD step of every client still
training at a time), puts each client's trained weights into its model and lets the jobs go on, one
after another, to their next training or their reply. Any method's client half thus batches its
``train_local`` calls unchanged; a training that cannot be batched (gradient hooks, loss terms without a
batched form, running statistics, mixed precision) runs in its job as it does without this runner, and
the runner says so once in the log.

HFLDD's KIP (with its NTK kernel) is handed over the same way: a job gives the runner its prepared request
and waits, and the runner distils the waiting clients together
(:func:`~fedskew.components.batched_kip.kip_batched`). Waiting requests are grouped by kind (training,
distillation), then by compatible settings. FedDM's and FedAF's distribution matching and FedDC's gradient
matching run in their jobs, one client at a time as without this runner, and the runner says so once (on a
GPU, worker processes run them side by side: ``workers_per_device``).

Replies come back in job order. Each job gets a model cache of its own (the sequential runner shares
one), so the jobs of a group never touch one another's model. Results equal the sequential runner's up
to float rounding (tests/engine/test_batched_clients.py, float64).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedskew.algorithms.base import EVALUATE, ModelSpec
from fedskew.components import batched, batched_kip
from fedskew.components.batching import BatchRequest, Request, batching, install_hand_off
from fedskew.components.trainer import LocalResult
from fedskew.condense.kip import KIPRequest
from fedskew.condense.synthetic import SyntheticSet
from fedskew.core.device import current_compute, use_compute
from fedskew.core.message import Message
from fedskew.core.threads import num_threads
from fedskew.engine.runner import ClientJob, EngineContext, width_of
from fedskew.engine.workers import _Runtime, client_step_on
from fedskew.models.evaluation import EvalCounts
from fedskew.models.layout import as_model_format, is_channels_last, use_channels_last

log = logging.getLogger(__name__)

Reply = tuple[Message, dict[str, Any]]
Result = LocalResult | SyntheticSet


EVAL_SPAN = 2000
"""Test samples a forward pass of the batched runner's evaluation on a CPU (eight of the engine's chunks)."""
EVAL_SPAN_GPU = 10_000
"""The same on a GPU."""


def evaluate_together(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, bounds: list[tuple[int, int]],
    span: int,
) -> list[EvalCounts]:
    """:func:`~fedskew.models.evaluation.evaluate_chunk` of each chunk in ``bounds``, adjacent chunks of up to
    ``span`` samples in one forward pass. Loss sums equal the chunk by chunk ones up to float rounding, and so
    do the logits, so a prediction whose two best classes tie within rounding may come out the other way."""
    out: list[EvalCounts] = []
    i = 0
    while i < len(bounds):
        j = i + 1
        while j < len(bounds) and bounds[j][0] == bounds[j - 1][1] and bounds[j][1] - bounds[i][0] <= span:
            j += 1
        out += _evaluate_span(model, x, y, num_classes, bounds[i:j])
        i = j
    return out


def _evaluate_span(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, bounds: list[tuple[int, int]]
) -> list[EvalCounts]:
    start, stop = bounds[0][0], bounds[-1][1]
    device = next(model.parameters()).device
    xs, ys = x[start:stop].to(device), y[start:stop].to(device)
    sizes = [e - s for s, e in bounds]
    was_training = model.training
    model.eval()
    with torch.inference_mode(), current_compute().precision().autocast():
        logits = model(as_model_format(xs, is_channels_last(model)))
        losses = F.cross_entropy(logits.float(), ys, reduction="none")
        width = sizes[0]
        if all(n == width for n in sizes[:-1]):  # the engine's chunks: equal but the last; padded, one sum
            padded = F.pad(losses, (0, width * len(sizes) - losses.shape[0]))
            sums = padded.view(len(sizes), width).sum(1).tolist()
        else:
            sums = torch.stack([part.sum() for part in losses.split(sizes)]).tolist()
        pred = logits.argmax(dim=1).cpu().numpy()
    if was_training:
        model.train()
    yn = ys.cpu().numpy()
    out, at = [], 0
    for size, loss_sum in zip(sizes, sums, strict=True):
        yc, pc = yn[at:at + size], pred[at:at + size]
        correct = np.bincount(yc[pc == yc], minlength=num_classes).astype(np.int64)
        out.append(EvalCounts(correct, np.bincount(yc, minlength=num_classes).astype(np.int64), float(loss_sum)))
        at += size
    return out


def clients_in_parallel(ctx: EngineContext) -> int:
    """How many clients the run trains at once (:func:`width_of` of the run's settings)."""
    return width_of(ctx.config.run.clients_in_parallel, ctx.algorithm, ctx.compute, ctx.config.run.workers)


def batched_runner(ctx: EngineContext) -> BatchedClients | None:
    """The batched runner of ``engine = "local"`` when the run batches clients, else None."""
    width = clients_in_parallel(ctx)
    if width == 1:
        return None
    device = (ctx.compute.workers or (ctx.compute.device,))[0]
    compute = dataclasses.replace(ctx.compute, device=device)
    return BatchedClients(_Runtime(ctx.fed, ctx.algorithm, ctx.params, compute), width)


class _Aborted(Exception):
    """Ends a waiting job whose group failed elsewhere."""


class _Job:
    """One client job in its thread; the coordinator and the thread take turns (one runs at a time)."""

    def __init__(self, run: Any, back: threading.Semaphore, coordinator: BatchedClients) -> None:
        self.run, self.back, self.coordinator = run, back, coordinator
        self.wake = threading.Semaphore(0)
        self.request: Request | None = None
        self.reply: Result | BaseException | None = None
        self.outcome: Reply | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="fedskew-client", daemon=True)

    # ---- in the job's thread ---------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            with batching(self):
                self.outcome = self.run()
        except BaseException as e:  # handed to the coordinator, which raises it in the round's thread
            self.error = e
        finally:
            self.back.release()

    def submit(self, request: Request) -> Result:
        self.request = request
        self.back.release()
        self.wake.acquire()
        reply, self.reply = self.reply, None
        if isinstance(reply, BaseException):
            raise reply
        assert reply is not None
        return reply

    def sequential(self, reason: str, kind: str = "training") -> None:
        self.coordinator.note_sequential(reason, kind)

    # ---- in the coordinator's thread -----------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()
        self.back.acquire()

    def resume(self, reply: Result | BaseException) -> None:
        self.request, self.reply = None, reply
        self.wake.release()
        self.back.acquire()


class BatchedClients:
    """A runner whose client jobs train batched, ``width`` at a time (0: all of a round's jobs at once);
    evaluation chunks run inline. The runtime's device is the run's (the first of several GPUs)."""

    def __init__(self, runtime: _Runtime, width: int) -> None:
        install_hand_off()  # train_local and KIP offer a batching thread's work to its runner
        self.runtime, self.width = runtime, width
        self.caches: list[dict[ModelSpec, torch.nn.Module]] = []
        self._said: set[tuple[str, str]] = set()

    def note_sequential(self, reason: str, kind: str = "training") -> None:
        if (kind, reason) not in self._said:
            self._said.add((kind, reason))
            log.warning("clients_in_parallel: %s runs some clients' %s one at a time: %s",
                        self.runtime.algo.name, kind, reason)

    def run_clients(self, jobs: list[ClientJob]) -> list[Reply]:
        width = self.width or max(len(jobs), 1)
        while len(self.caches) < min(width, len(jobs)):
            self.caches.append({})
        out: list[Reply] = []
        compute = self.runtime.compute
        # The job threads set these too; set here, their save-and-restore (interleaved across threads) holds.
        with num_threads(1), use_compute(compute):
            for start in range(0, len(jobs), width):
                out += self._run_group(jobs[start:start + width])
        return out

    def _job(self, job: ClientJob, cache: dict[ModelSpec, torch.nn.Module]) -> Reply:
        rt = self.runtime
        x, y = rt.fed.client_data(job.cid)
        test = rt.fed.client_test(job.cid) if job.task == EVALUATE else None
        return client_step_on(rt.algo, job.task, job.msg, job.cid, job.round, x, y, rt.fed.info, job.state,
                              rt.compute, cache, test)

    def _run_group(self, jobs: list[ClientJob]) -> list[Reply]:
        back = threading.Semaphore(0)
        group = [_Job(lambda j=job, c=cache: self._job(j, c), back, self)
                 for job, cache in zip(jobs, self.caches, strict=False)]
        for job in group:
            job.start()
            if job.error is not None:
                break
        while True:
            waiting = [j for j in group if j.request is not None]
            if not waiting or any(j.error is not None for j in group):
                break
            for job, reply in zip(waiting, self._serve([j.request for j in waiting]), strict=True):
                job.resume(reply)
        for job in group:
            if job.request is not None:
                job.resume(_Aborted())
        for job in group:
            if job.thread.ident is not None:
                job.thread.join()
        errors = [j.error for j in group if j.error is not None and not isinstance(j.error, _Aborted)]
        if errors:
            raise errors[0]
        assert all(j.outcome is not None for j in group)
        return [j.outcome for j in group if j.outcome is not None]

    def _serve(self, requests: list[Request | None]) -> list[Result | BaseException]:
        """The waiting requests run together, by kind (trainings, KIPs); their results in order."""
        replies: list[Result | BaseException | None] = [None] * len(requests)
        trainings = [i for i, r in enumerate(requests) if isinstance(r, BatchRequest)]
        distillations = [i for i, r in enumerate(requests) if isinstance(r, KIPRequest)]
        try:
            if trainings:
                trained = batched.train_batched([r for r in requests if isinstance(r, BatchRequest)])
                for i, res in zip(trainings, trained, strict=True):
                    replies[i] = res
            if distillations:
                made = batched_kip.kip_batched([r for r in requests if isinstance(r, KIPRequest)])
                for i, syn in zip(distillations, made, strict=True):
                    replies[i] = syn
        except BaseException as e:  # every waiting job fails with it, the first one raises it
            return [e] * len(requests)
        assert all(r is not None for r in replies)
        return [r for r in replies if r is not None]

    def evaluate_chunks(self, model_state: dict[str, torch.Tensor], bounds: list[tuple[int, int]]) -> list[EvalCounts]:
        """The chunks' counts, several adjacent chunks a forward pass (:func:`evaluate_together`)."""
        rt = self.runtime
        if rt.eval_model is None:
            rt.eval_model = use_channels_last(rt.algo.fed.model.build().to(rt.device))  # the method's spec
        rt.eval_model.load_state_dict(model_state)
        span = EVAL_SPAN if rt.device.type == "cpu" else EVAL_SPAN_GPU
        with num_threads(1), use_compute(rt.compute):
            return evaluate_together(rt.eval_model, rt.fed.x_test, rt.fed.y_test, rt.fed.info.num_classes, bounds, span)

    def close(self) -> None:
        self.caches.clear()
