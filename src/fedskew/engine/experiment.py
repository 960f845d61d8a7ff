"""Running an experiment: every run (variant x seed) of a config, each in its own folder."""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Sequence
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

from fedskew.config import RunSpec
from fedskew.config.files import flat_keys, read_toml
from fedskew.config.resume import check_resume_overrides, resumed_config, same_length, same_run
from fedskew.config.schema import RESUMABLE, RunConfig, comparable_config, full_config
from fedskew.core.errors import ConfigError
from fedskew.core.params import as_table
from fedskew.engine.checkpoint import check_resume, load_checkpoint
from fedskew.engine.federation import Federation, federation_for, same_data, sharing_tensors, with_model
from fedskew.engine.round_loop import RunResult
from fedskew.engine.runner import EngineCache
from fedskew.engine.session import start_run
from fedskew.progress import progress_bar
from fedskew.runs import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    MODEL_FILE,
    SUMMARY_FILE,
    TIMING_FILE,
    check_no_links,
    check_out_folder,
    load_run,
    locked_run_folder,
    os_errors_name,
    run_config_path,
)


def choose_parent(
    out: str | Path | None, name: str, runs: list[RunSpec], force: bool, resume: bool = False
) -> Path:
    """The experiment folder: ``--out`` as given, else ``runs/<name>`` (``runs/<name>-2`` ... if taken).

    An explicit ``--out`` that already holds one of these runs is refused unless ``force`` (start them
    afresh) or ``resume`` (continue them): a finished run is never overwritten by accident. An empty
    ``--out`` or one naming a file is refused; ``resume`` needs an explicit ``--out``.
    """
    if resume:
        if out is None:
            raise ConfigError("resuming an experiment needs its folder: fedskew run CONFIG --out DIR --resume")
        if force:
            raise ConfigError("--resume continues the runs in --out and --force starts them afresh: give one")
        parent = check_out_folder(out)
        for r in runs:
            check_no_links(parent / r.folder_name)
        return parent
    if out is None:
        base = Path("runs") / name
        parent, k = base, 2
        while parent.exists() and (not parent.is_dir() or any(parent.iterdir())):
            parent = base.with_name(f"{base.name}-{k}")
            k += 1
        return parent
    parent = check_out_folder(out)
    for r in runs:
        check_no_links(parent / r.folder_name)
    if not force:
        for r in runs:
            if (parent / r.folder_name / METRICS_FILE).exists():
                raise ConfigError(
                    f"{parent / r.folder_name} already holds a run; choose another --out, pass --force to "
                    "overwrite it, or continue it with --resume"
                )
    return parent


def check_devices(configs: Sequence[RunConfig]) -> None:
    """Refuse, before any run starts or any folder is written, what this machine lacks for the runs: a device or
    precision (each config's :attr:`~fedskew.config.schema.RunConfig.compute`, resolved here once for its run),
    the memory a run needs at least (:func:`~fedskew.engine.memory.check_memory`: data, model, condensed sets and
    batched clients together) and an MLflow tracking server it cannot reach
    (:func:`~fedskew.engine.trackers.check_tracking_servers`)."""
    from fedskew.engine.memory import check_memory
    from fedskew.engine.trackers import check_tracking_servers

    for config in configs:
        config.compute  # noqa: B018 (resolves and checks)
    check_memory(configs)
    check_tracking_servers(configs)


def run_experiment(
    runs: list[RunSpec],
    parent: Path,
    *,
    data_dir: str | None = None,
    progress: bool = True,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    resume: bool = False,
    states: Sequence[str] | None = None,
) -> list[RunResult]:
    """Run each spec into ``parent/<label>-seed<k>``; runs sharing data and partition share the federation.

    Every run folder is claimed (:func:`~fedskew.runs.locked_run_folder`) before the first run starts and
    held until the last ends, so no other process runs, resumes or overwrites any of them meanwhile.
    ``on_round`` gets each round's record (a copy of the line ``metrics.jsonl`` holds, with the run's
    ``label`` and ``seed`` added) once the round is written. Runs on the same data (dataset, partition, seed)
    run one after another, in the order given otherwise, and share one federation and one worker pool (the
    local engine's :class:`~fedskew.engine.workers.WorkerPool`, started once for them); results come back in
    the order of ``runs``. With ``resume``, finished runs are kept as
    they are, interrupted ones continue from their last checkpoint, and the others start
    (:func:`run_state`, which also refuses a run folder made with another config; ``states`` gives them
    when the caller has them already, one per run). With more than one
    run, an overall progress bar counts the runs beside each run's own bar.
    """
    check_devices([spec.typed for spec in runs])
    folders = [parent / spec.folder_name for spec in runs]
    if len(set(folders)) != len(folders):  # resolve() refuses this already; a caller of this function may not
        raise ConfigError(f"two runs would share a folder in {parent}; give the runs distinct labels and seeds")
    with os_errors_name(parent):
        parent.mkdir(parents=True, exist_ok=True)
    if states is None or not resume:
        states = [run_state(d, spec.typed) if resume else "new" for spec, d in zip(runs, folders, strict=True)]
    configs = [spec.typed for spec in runs]
    keys = [_data_key(config, data_dir) for config in configs]
    first = {key: i for i, key in reversed(list(enumerate(keys)))}
    order = sorted(range(len(runs)), key=lambda i: first[keys[i]])  # stable: runs on the same data together
    results: list[RunResult | None] = [None] * len(runs)
    with ExitStack() as held:
        for run_dir in folders:
            held.enter_context(locked_run_folder(run_dir))
        bar = held.enter_context(progress_bar(  # a bar in a terminal, plain lines in a log file
            total=len(runs), desc=parent.name or "experiment", unit="run", enabled=progress and len(runs) >= 2,
        ))
        cache = held.enter_context(closing(EngineCache()))  # the worker pool, started once per data
        data = _Data(cache, data_dir)
        for i in order:
            spec, run_dir, state, config = runs[i], folders[i], states[i], configs[i]
            if state == "done":
                results[i] = _finished(run_dir)
                bar.update(1)
                continue
            fed = with_model(data.get(keys[i], config), config.model)
            if state == "new":
                # A run started afresh (--force) leaves nothing of the old one to mix with or resume from.
                with os_errors_name(run_dir, run=True):
                    old = (METRICS_FILE, TIMING_FILE, SUMMARY_FILE, MODEL_FILE, f"{CHECKPOINTS_DIR}/{CHECKPOINT_FILE}")
                    for f in old:
                        (run_dir / f).unlink(missing_ok=True)
            results[i] = start_run(
                config, run_dir, resume=state == "partial", data_dir=data_dir, progress=progress,
                federation=fed, on_round=_tagged(on_round, spec), engine_cache=cache,
            )
            bar.update(1)
            del fed
    done = [r for r in results if r is not None]
    assert len(done) == len(runs)
    return done


def _data_key(config: RunConfig, data_dir: str | None) -> str:
    """What a run's federation data depends on, as a key: runs of equal keys share the data (whatever their
    model: it only names the spec the processes build)."""
    tables = [{"name": c.name, **as_table(c.params)} for c in (config.dataset, config.partition)]
    return json.dumps([*tables, config.run.seed, data_dir], sort_keys=True)


class _Data:
    """The federation of the runs now running, one in memory at a time, and the engines' cache (its worker
    pool serves that federation)."""

    def __init__(self, cache: EngineCache, data_dir: str | None) -> None:
        self.cache, self.data_dir = cache, data_dir
        self.key: str | None = None
        self.fed: Federation | None = None

    def get(self, key: str, config: RunConfig) -> Federation:
        """The federation of ``config``'s data (``key``: :func:`_data_key`).

        The previous one and its pool go before the next loads, unless both can hold the same data (the
        partition seed is pinned and the whole training split used: a run seed then changes nothing but a
        noise skew's draw): then the two are compared value by value, and equal data keeps the previous
        tensors and the pool started on them.
        """
        if key == self.key and self.fed is not None:
            return self.fed
        previous, self.fed, self.key = self.fed, None, None
        pinned = config.partition.params.seed is not None and config.dataset.params.train_fraction == 1.0
        if previous is not None and not pinned:
            previous = None
            self.cache.release()
            gc.collect()  # the last run's loop (a reference cycle) may still hold the tensors
        fed = federation_for(config, self.data_dir)
        if previous is not None and same_data(previous, fed):
            fed = sharing_tensors(fed, previous)
        else:
            self.cache.release()
        self.fed, self.key = fed, key
        return fed


def run_state(run_dir: Path, config: RunConfig) -> str:
    """What ``--resume`` does with the run folder ``run_dir`` of a run configured as ``config``.

    ``"done"``: finished with this config (its summary is there); ``"partial"``: it continues from its
    checkpoint (interrupted, finished with fewer ``rounds``, or stopped by its privacy budget); ``"new"``: it
    starts (no folder, or stopped before its first checkpoint). A folder whose config differs in anything a
    resume may not change (:data:`RESUMABLE`) is refused in one line naming the key, before any run starts.
    """
    recorded = run_dir / CONFIG_FILE
    if not (run_dir / METRICS_FILE).exists() or not recorded.exists():
        return "new"
    stored = read_toml(recorded, "run config")
    differ = same_run(stored, config)
    if differ:
        k = differ[0]
        then, now = flat_keys(comparable_config(stored)), flat_keys(full_config(config))
        raise ConfigError(
            f"{run_dir} was run with {k} = {then.get(k)!r}, this config has {now.get(k)!r}: --resume continues "
            "runs of the same config (it may change only " + ", ".join(RESUMABLE) + "); use another --out"
        )
    ck_path = run_dir / CHECKPOINTS_DIR / CHECKPOINT_FILE
    summary = run_dir / SUMMARY_FILE
    if summary.exists() and same_length(stored, config) and not stopped_early(summary):
        return "done"
    if not ck_path.exists():
        return "new"
    check_resume(load_checkpoint(run_dir / CHECKPOINTS_DIR), ck_path, stored, config.run.rounds)
    return "partial"


def stopped_early(summary: Path) -> bool:
    """Whether the run whose ``summary.json`` this is stopped before its last round (its ``privacy.target_epsilon``
    was spent): ``--resume`` then continues it, which goes on where a larger budget allows."""
    try:
        return "stopped" in json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False  # reading the run back names the damaged file


def _finished(run_dir: Path) -> RunResult:
    """A finished run as a result, read from its folder (a damaged file is one line naming it and the line)."""
    run = load_run(run_dir)
    return RunResult(run_dir, run.summary, run.records)


def _tagged(
    on_round: Callable[[dict[str, Any]], None] | None, spec: RunSpec
) -> Callable[[dict[str, Any]], None] | None:
    """``on_round`` called with a copy of each record that also names the run (``label``, ``seed``)."""
    if on_round is None:
        return None
    callback = on_round

    def tagged(record: dict[str, Any]) -> None:
        callback({**record, "label": spec.label, "seed": spec.typed.run.seed})

    return tagged


def resume_run(run_dir: Path, overrides: dict[str, Any], *, data_dir: str | None, progress: bool) -> RunResult:
    """Continue a run from its last checkpoint (``rounds=N`` may extend it).

    Everything is checked before the folder changes: the overrides, the config (unreadable, invalid, or
    edited since the checkpoint), the checkpoint (its layout, its round against ``rounds``, its model
    against the run's), and that no other process holds the folder.
    """
    path = run_config_path(run_dir)
    check_resume_overrides(overrides)
    with locked_run_folder(run_dir):
        stored = read_toml(path, "run config")
        config = resumed_config(stored, overrides)
        check_devices([config])
        return start_run(config, run_dir, resume=True, data_dir=data_dir, progress=progress, stored=stored)
