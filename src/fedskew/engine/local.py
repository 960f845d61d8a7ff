"""``engine = "local"``: the runner on this machine, chosen from the run's typed config.

The batched runner (:mod:`fedskew.engine.batched_runner`) where ``clients_in_parallel`` asks for it; else
:class:`~fedskew.engine.workers.Workers`, inline or over the experiment's worker pool.
"""

from __future__ import annotations

from fedskew.engine.batched_runner import BatchedClients, batched_runner
from fedskew.engine.pool_size import default_workers
from fedskew.engine.runner import EngineContext
from fedskew.engine.workers import WorkerPool, Workers


def round_jobs(ctx: EngineContext) -> int:
    """Client jobs of a round: the algorithm's ``clients_per_round`` (every client for one without it)."""
    n = ctx.fed.info.num_clients
    per_round = getattr(ctx.params, "clients_per_round", None)
    return min(per_round, n) if isinstance(per_round, int) and per_round >= 1 else n


def local_engine(ctx: EngineContext) -> Workers | BatchedClients:
    """``engine = "local"``: :class:`Workers` on this machine, ``workers`` of them (0: :func:`default_workers`
    for the round's jobs and ``workers_per_device``). Within an experiment (``ctx.cache``) the pool is the one
    the previous run used when it has the same data, size, devices and determinism. The batched runner
    where ``clients_in_parallel`` asks for it (:mod:`fedskew.engine.batched_runner`)."""
    batched = batched_runner(ctx)
    if batched is not None:
        if ctx.cache is not None:
            ctx.cache.release("local")  # it runs in this process: no idle pool holding memory
        return batched
    run = ctx.config.run
    devices = list(ctx.compute.workers or (ctx.compute.device,))  # resolved once, with the run's device
    size = run.workers or default_workers(devices, round_jobs(ctx), run.workers_per_device)
    if size <= 1 or ctx.cache is None:
        if ctx.cache is not None:
            ctx.cache.release("local")  # an inline run leaves no idle pool holding memory
        return Workers(ctx.fed, ctx.algorithm, ctx.params, size, ctx.compute, devices)
    key = (tuple(id(t) for t in ctx.fed.tensors()), size, tuple(devices), ctx.compute.deterministic)
    pool = ctx.cache.get("local", key, lambda: WorkerPool(ctx.fed, size, ctx.compute, devices))
    return Workers(ctx.fed, ctx.algorithm, ctx.params, size, ctx.compute, devices, pool=pool)
