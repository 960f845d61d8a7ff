"""The local engine's worker pool: how many workers ``workers = 0`` starts, that the pool starts all of them
before the first round and once for an experiment's runs on the same data, that a dead worker is still
reported, and that none of it changes a byte of ``metrics.jsonl``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from fedskew.config import dump, resolve
from fedskew.config.schema import typed_config
from fedskew.core.device import Compute
from fedskew.core.errors import ConfigError, FedskewError
from fedskew.core.message import Message, state_to_arrays
from fedskew.engine import pool_size as pool_module
from fedskew.engine.experiment import run_experiment
from fedskew.engine.federation import build_federation
from fedskew.engine.local import round_jobs
from fedskew.engine.pool_size import WORKER_BYTES, pool_size
from fedskew.engine.round_loop import RoundLoop
from fedskew.engine.runner import ClientJob, EngineCache, EngineContext
from fedskew.engine.workers import WorkerPool, Workers
from tests.helpers.configs import federation_from, tiny_config
from tests.helpers.spies import spy_pools

GB = 2**30


# ---- how many: pool_size with injected cores, memory and jobs -------------------------------------------
def test_the_automatic_count_never_exceeds_the_rounds_jobs() -> None:
    assert pool_size(["cpu"], 1, jobs=10, cores=16, memory=None) == 10  # W on 16 cores: 10, not 16
    assert pool_size(["cpu"], 1, jobs=10, cores=4, memory=None) == 4
    assert pool_size(["cpu"], 1, jobs=None, cores=16, memory=None) == 16


def test_the_automatic_count_fits_the_available_memory() -> None:
    assert pool_size(["cpu"], 1, jobs=10, cores=16, memory=4 * GB) == 4 * GB // WORKER_BYTES == 5
    assert pool_size(["cpu"], 1, jobs=10, cores=16, memory=100 * GB) == 10
    assert pool_size(["cpu"], 1, jobs=10, cores=16, memory=0) == 1  # never none


def test_workers_per_device_multiplies_gpus_and_cores() -> None:
    assert pool_size(["cuda:0"], 1, jobs=10, cores=16, memory=None) == 1
    assert pool_size(["cuda:0"], 4, jobs=10, cores=16, memory=None) == 4
    assert pool_size(["cuda:0", "cuda:1"], 4, jobs=10, cores=2, memory=None) == 8  # GPUs, not cores, count
    assert pool_size(["cuda:0", "cuda:1"], 8, jobs=10, cores=2, memory=None) == 10
    assert pool_size(["cuda:0"], 4, jobs=10, cores=16, memory=2 * GB) == 2
    assert pool_size(["cpu"], 2, jobs=10, cores=2, memory=None) == 4
    assert pool_size(["mps"], 4, jobs=10, cores=16, memory=None) == 1


def test_default_workers_reads_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "usable_cores", lambda: 16)
    monkeypatch.setattr(pool_module, "available_memory", lambda: 6 * GB)
    assert pool_module.default_workers(["cpu"], jobs=10) == 7
    assert pool_module.default_workers(["cpu"], jobs=3, per_device=2) == 3


def test_available_memory_is_the_smaller_of_the_kernels_and_the_containers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    files = {"/proc/meminfo": "MemTotal: 32000000 kB\nMemAvailable: 8000000 kB\n",
             "/sys/fs/cgroup/memory.max": f"{6 * GB}\n", "/sys/fs/cgroup/memory.current": f"{2 * GB}\n"}
    real = pool_module.Path

    def fake(path: str) -> Path:
        if path in files:
            (tmp_path / Path(path).name).write_text(files[path])
            return tmp_path / Path(path).name
        return real(tmp_path / "absent")

    monkeypatch.setattr(pool_module, "Path", fake)
    assert pool_module.available_memory() == 4 * GB  # the container's 6 GB less the 2 GB it uses
    files["/sys/fs/cgroup/memory.max"] = "max\n"
    assert pool_module.available_memory() == 8000000 * 1024


def test_round_jobs_is_clients_per_round_at_most_every_client() -> None:
    fed = federation_from(tiny_config(), 0)
    for per_round in (3, 6):
        config = typed_config(tiny_config(algorithm={"clients_per_round": per_round}))
        ctx = EngineContext(fed, "fedavg", config.algorithm.params, config, Compute())
        assert round_jobs(ctx) == per_round
    assert round_jobs(EngineContext(fed, "plugin_method", object(), config, Compute())) == 6  # no such field


def test_workers_per_device_is_checked_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"workers_per_device must be an integer in \[1, 1024\], got 0"):
        typed_config(tiny_config(workers_per_device=0))


# ---- results: the same bytes whatever the pool ------------------------------------------------------------
def _metrics(cfg: dict[str, Any], path: Path) -> bytes:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return (path / "metrics.jsonl").read_bytes()


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every worker pool started from now on, in order."""
    return spy_pools(monkeypatch)


@pytest.mark.slow
def test_workers_per_device_does_not_change_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    pools: list[int]) -> None:
    """``workers = 0`` on a CPU of one core (injected): 2 and 3 processes for 2 and 3 per device, one for 1
    (inline); the round has 3 jobs. metrics.jsonl is byte-identical in all three."""
    monkeypatch.setattr(pool_module, "usable_cores", lambda: 1)
    monkeypatch.setattr(pool_module, "available_memory", lambda: None)
    one = _metrics(tiny_config(rounds=2, workers=0), tmp_path / "d1")
    two = _metrics(tiny_config(rounds=2, workers=0, workers_per_device=2), tmp_path / "d2")
    three = _metrics(tiny_config(rounds=2, workers=0, workers_per_device=3), tmp_path / "d3")
    assert pools == [2, 3]
    assert one == two == three


@pytest.mark.slow
def test_the_pool_starts_every_worker_before_the_first_job() -> None:
    fed = federation_from(tiny_config(), 0)
    pool = WorkerPool(fed, 2, Compute(), ["cpu"])
    try:
        assert len(set(pool.pids)) == 2 and os.getpid() not in pool.pids
        assert set(pool.pids) <= {p.pid for p in multiprocessing.active_children()}
    finally:
        pool.close()
    assert not set(pool.pids) & {p.pid for p in multiprocessing.active_children()}


def _grid(tmp_path: Path, pinned: bool) -> list[Any]:
    raw = {k: v for k, v in tiny_config(rounds=2, workers=2).items() if k not in ("label", "seed")}
    raw["seeds"] = [0, 1]
    if pinned:
        raw["partition"] = {**raw["partition"], "seed": 3}
    raw["variants"] = [
        {"label": "avg"},
        {"label": "prox", "algorithm.name": "fedprox", "algorithm.mu": 0.1},
        {"label": "small", "model.hidden": [16]},
    ]
    return resolve(raw)


@pytest.mark.slow
def test_an_experiment_starts_one_pool_for_its_runs_on_the_same_data(tmp_path: Path, pools: list[int]) -> None:
    """Three variants (two algorithms, two models) x two seeds on a pinned partition: one pool for all six
    runs, and each run's metrics.jsonl byte-identical to the same run alone, inline."""
    runs = _grid(tmp_path, pinned=True)
    results = run_experiment(runs, tmp_path / "grid", progress=False)
    assert pools == [2]
    assert [r.run_dir.name for r in results] == [spec.folder_name for spec in runs]  # in the order given
    for spec in runs:
        alone = _metrics({**spec.config, "workers": 1}, tmp_path / "alone" / spec.folder_name)
        assert (tmp_path / "grid" / spec.folder_name / "metrics.jsonl").read_bytes() == alone, spec.folder_name


@pytest.mark.slow
def test_runs_on_other_data_get_their_own_pool_and_runs_on_the_same_data_run_together(
    tmp_path: Path, pools: list[int]
) -> None:
    """Seeds redraw an unpinned partition: one pool per seed, each seed's runs one after another."""
    runs = _grid(tmp_path, pinned=False)
    first_rounds: list[tuple[str, int]] = []

    def on_round(rec: dict[str, Any]) -> None:
        if rec["round"] == 1:
            first_rounds.append((rec["label"], rec["seed"]))

    run_experiment(runs, tmp_path / "grid", progress=False, on_round=on_round)
    assert pools == [2, 2]
    assert first_rounds == [("avg", 0), ("prox", 0), ("small", 0), ("avg", 1), ("prox", 1), ("small", 1)]


@pytest.mark.slow
def test_a_dead_worker_is_reported_and_the_next_run_gets_a_fresh_pool(tmp_path: Path) -> None:
    cfg = tiny_config()
    config = typed_config(cfg)
    fed = build_federation(config.dataset, config.partition, config.model, 0)
    loop = RoundLoop(typed_config(cfg), tmp_path / "r", progress=False, federation=fed)
    cache = EngineCache()
    try:
        def make() -> WorkerPool:
            return WorkerPool(fed, 2, Compute(), ["cpu"])

        pool = cache.get("local", "key", make)
        assert cache.get("local", "key", make) is pool
        runner = Workers(fed, "fedavg", config.algorithm.params, 2, pool=pool)
        msg = Message(state_to_arrays(loop.server.model.state_dict()))
        jobs = [ClientJob("train", cid, 1, msg, {}) for cid in range(2)]
        assert len(runner.run_clients(jobs)) == 2
        os.kill(pool.pids[0], signal.SIGKILL)
        # The executor learns of the death from its own thread: a round submitted before it has may still
        # be served by the other worker. The death is reported at the latest a few rounds on.
        with pytest.raises(FedskewError, match="a worker process died"):
            for _ in range(50):
                runner.run_clients(jobs)
                time.sleep(0.1)
        assert pool.broken
        fresh = cache.get("local", "key", make)
        assert fresh is not pool and not set(fresh.pids) & set(pool.pids)
        again = Workers(fed, "fedavg", config.algorithm.params, 2, pool=fresh).run_clients(jobs)
        sizes = [float(fed.offsets[c + 1] - fed.offsets[c]) for c in (0, 1)]
        assert [m.metrics["num_samples"] for m, _ in again] == sizes  # type: ignore[union-attr]
    finally:
        cache.close()
