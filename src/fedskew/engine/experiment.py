"""Running an experiment: every run (variant x seed) of a config, each in its own folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from fedskew.config import RunSpec, dump, validate
from fedskew.config.files import read_toml
from fedskew.core.device import check_amp, resolve_device
from fedskew.core.errors import ConfigError
from fedskew.engine.checkpoint import RESUMABLE, check_resume, load_checkpoint
from fedskew.engine.federation import Federation, build_federation
from fedskew.engine.round_loop import RoundLoop, RunResult
from fedskew.runs import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    MODEL_FILE,
    SUMMARY_FILE,
    TIMING_FILE,
    check_out_folder,
    locked_run_folder,
    os_errors_name,
    run_config_path,
)


def choose_parent(out: str | Path | None, name: str, runs: list[RunSpec], force: bool) -> Path:
    """The experiment folder: ``--out`` as given, else ``runs/<name>`` (``runs/<name>-2`` ... if taken).

    An explicit ``--out`` that already holds one of these runs is refused unless ``force``: a finished
    run is never overwritten by accident. An empty ``--out`` or one naming a file is refused.
    """
    if out is None:
        base = Path("runs") / name
        parent, k = base, 2
        while parent.exists() and (not parent.is_dir() or any(parent.iterdir())):
            parent = base.with_name(f"{base.name}-{k}")
            k += 1
        return parent
    parent = check_out_folder(out)
    if not force:
        for r in runs:
            if (parent / r.folder_name / METRICS_FILE).exists():
                raise ConfigError(
                    f"{parent / r.folder_name} already holds a run; choose another --out, pass --force to "
                    "overwrite it, or continue it with --resume"
                )
    return parent


def check_devices(configs: list[dict[str, Any]]) -> None:
    """Refuse, before any run starts or any folder is written, a device or precision this machine lacks."""
    for cfg in configs:
        device = resolve_device(str(cfg.get("device", "auto")))
        check_amp(str(cfg.get("amp", "off")), device)
        if cfg.get("engine", "local") == "ray":
            continue  # Ray's workers may hold GPUs this machine lacks; Ray checks the request


def run_experiment(
    runs: list[RunSpec],
    parent: Path,
    *,
    data_dir: str | None = None,
    progress: bool = True,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> list[RunResult]:
    """Run each spec into ``parent/<label>-seed<k>``; runs sharing data and partition share the federation.

    Every run folder is claimed (:func:`~fedskew.runs.locked_run_folder`) before the first run starts and
    held until the last ends, so no other process runs, resumes or overwrites any of them meanwhile.
    ``on_round`` gets each round's record (a copy of the line ``metrics.jsonl`` holds, with the run's
    ``label`` and ``seed`` added) once the round is written.
    """
    check_devices([spec.config for spec in runs])
    folders = [parent / spec.folder_name for spec in runs]
    if len(set(folders)) != len(folders):  # resolve() refuses this already; a caller of this function may not
        raise ConfigError(f"two runs would share a folder in {parent}; give the runs distinct labels and seeds")
    with os_errors_name(parent):
        parent.mkdir(parents=True, exist_ok=True)
    feds: dict[str, Federation] = {}
    results = []
    with ExitStack() as held:
        for run_dir in folders:
            held.enter_context(locked_run_folder(run_dir))
        for spec, run_dir in zip(runs, folders, strict=True):
            cfg = spec.config
            key = json.dumps([cfg["dataset"], cfg["partition"], cfg["model"], cfg["seed"], data_dir], sort_keys=True)
            if key not in feds:
                feds.clear()  # keep one federation in memory at a time
                feds[key] = build_federation(
                    cfg["dataset"], cfg["partition"], cfg["model"], int(cfg["seed"]), data_dir
                )
            with os_errors_name(run_dir, run=True):
                # A run started afresh (--force) leaves nothing of the old one to mix with or resume from.
                for f in (METRICS_FILE, TIMING_FILE, SUMMARY_FILE, MODEL_FILE, f"{CHECKPOINTS_DIR}/{CHECKPOINT_FILE}"):
                    (run_dir / f).unlink(missing_ok=True)
                (run_dir / CONFIG_FILE).write_text(dump(cfg))
                sim = RoundLoop(cfg, run_dir, data_dir=data_dir, progress=progress, federation=feds[key],
                                on_round=_tagged(on_round, spec))
                results.append(sim.run())
    return results


def _tagged(
    on_round: Callable[[dict[str, Any]], None] | None, spec: RunSpec
) -> Callable[[dict[str, Any]], None] | None:
    """``on_round`` called with a copy of each record that also names the run (``label``, ``seed``)."""
    if on_round is None:
        return None
    callback = on_round

    def tagged(record: dict[str, Any]) -> None:
        callback({**record, "label": spec.label, "seed": spec.config["seed"]})

    return tagged


RESUME_OVERRIDES = RESUMABLE
"""What a resumed run may change (see :data:`fedskew.engine.checkpoint.RESUMABLE`)."""


def resume_run(run_dir: Path, overrides: dict[str, Any], *, data_dir: str | None, progress: bool) -> RunResult:
    """Continue a run from its last checkpoint (``rounds=N`` may extend it).

    Everything is checked before the folder changes: the overrides, the config (unreadable, invalid, or
    edited since the checkpoint), the checkpoint (its layout, its round against ``rounds``, its model
    against the run's), and that no other process holds the folder.
    """
    path = run_config_path(run_dir)
    for key in overrides:
        if key not in RESUME_OVERRIDES:
            allowed = ", ".join(RESUME_OVERRIDES)
            raise ConfigError(f"--resume accepts only the overrides {allowed}, not {key!r}")
    with locked_run_folder(run_dir):
        stored = read_toml(path, "run config")
        cfg = {**stored, **overrides}
        cfg.setdefault("target_accuracy", None)
        validate(cfg)
        check_devices([cfg])
        ck = load_checkpoint(run_dir / CHECKPOINTS_DIR)
        ck_path = run_dir / CHECKPOINTS_DIR / CHECKPOINT_FILE
        check_resume(ck, ck_path, stored, int(cfg["rounds"]))  # before the data is loaded
        loop = RoundLoop(cfg, run_dir, data_dir=data_dir, progress=progress)
        check_resume(ck, ck_path, stored, int(cfg["rounds"]), loop.server.model.state_dict())
        del ck  # the loop reads it again
        with os_errors_name(run_dir, run=True):
            (run_dir / CONFIG_FILE).write_text(dump(cfg))
            return loop.run(resume=True)
