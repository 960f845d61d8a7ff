"""One run's session: the steps every way of starting a run shares (``fedskew run``, ``fedskew run --resume``
and a Flower deployment), so that each checks and writes the same things in the same order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedskew.config import dump
from fedskew.config.files import read_toml
from fedskew.config.schema import RunConfig, full_config
from fedskew.engine.callbacks import Record, RoundCallback
from fedskew.engine.checkpoint import check_resume, load_checkpoint
from fedskew.engine.federation import Federation
from fedskew.engine.round_loop import RoundLoop, RunResult
from fedskew.engine.runner import ClientSide, EngineCache
from fedskew.runs import CHECKPOINT_FILE, CHECKPOINTS_DIR, CONFIG_FILE, os_errors_name


def start_run(
    config: RunConfig, run_dir: Path, *, resume: bool, data_dir: str | None = None, progress: bool = True,
    federation: Federation | None = None, on_round: Callable[[Record], None] | None = None,
    clients: ClientSide | None = None, stored: dict[str, Any] | None = None,
    before: Callable[[RoundLoop], None] | None = None, callbacks: Sequence[RoundCallback] = (),
    engine_cache: EngineCache | None = None,
) -> RunResult:
    """Run (``resume``: continue) the run configured as ``config`` in ``run_dir``; the caller holds the folder.

    ``engine_cache`` is an experiment's (:func:`~fedskew.engine.experiment.run_experiment`): its engine keeps
    there what the next run may use, such as a started worker pool.

    1. Resuming: the last checkpoint against the run's rounds and the config the folder holds (``stored``,
       read from ``config.toml`` when not given), before any data is loaded.
    2. The round loop (federation, algorithm, model); resuming: the checkpoint against the model.
    3. ``config.toml``, every default filled in; then ``before(loop)`` (a deployment connects to its nodes).
    4. The rounds. A file that cannot be written is one line naming the run folder.
    """
    with os_errors_name(run_dir, run=True):
        ck_path = run_dir / CHECKPOINTS_DIR / CHECKPOINT_FILE
        ck = None
        if resume:
            if stored is None:
                stored = read_toml(run_dir / CONFIG_FILE, "run config")
            ck = load_checkpoint(run_dir / CHECKPOINTS_DIR)
            check_resume(ck, ck_path, stored, config.run.rounds)
        loop = RoundLoop(
            config, run_dir, data_dir=data_dir, progress=progress, federation=federation,
            on_round=on_round, clients=clients, callbacks=callbacks, engine_cache=engine_cache,
        )
        if ck is not None:
            assert stored is not None  # read above whenever a checkpoint was
            check_resume(ck, ck_path, stored, config.run.rounds, loop.server.model.state_dict())
            del ck  # the loop reads it again
        (run_dir / CONFIG_FILE).write_text(dump(full_config(config)))
        if before is not None:
            before(loop)
        return loop.run(resume=resume)
