"""Running an experiment: every run (variant x seed) of a config, each in its own folder."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from fedskew.config import RunSpec, dump, validate
from fedskew.core.device import check_amp, resolve_device
from fedskew.core.errors import ConfigError
from fedskew.engine.federation import Federation, build_federation
from fedskew.engine.round_loop import RoundLoop, RunResult
from fedskew.runs import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, TIMING_FILE, run_config_path


def choose_parent(out: str | Path | None, name: str, runs: list[RunSpec], force: bool) -> Path:
    """The experiment folder: ``--out`` as given, else ``runs/<name>`` (``runs/<name>-2`` ... if taken).

    An explicit ``--out`` that already holds one of these runs is refused unless ``force``: a finished
    run is never overwritten by accident.
    """
    if out is None:
        base = Path("runs") / name
        parent, k = base, 2
        while parent.exists() and any(parent.iterdir()):
            parent = base.with_name(f"{name}-{k}")
            k += 1
        return parent
    parent = Path(out)
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
) -> list[RunResult]:
    """Run each spec into ``parent/<label>-seed<k>``; runs sharing data and partition share the federation."""
    check_devices([spec.config for spec in runs])
    parent.mkdir(parents=True, exist_ok=True)
    feds: dict[str, Federation] = {}
    results = []
    for spec in runs:
        cfg = spec.config
        key = json.dumps([cfg["dataset"], cfg["partition"], cfg["model"], cfg["seed"], data_dir], sort_keys=True)
        if key not in feds:
            feds.clear()  # keep one federation in memory at a time
            feds[key] = build_federation(cfg["dataset"], cfg["partition"], cfg["model"], int(cfg["seed"]), data_dir)
        run_dir = parent / spec.folder_name
        if run_dir.exists():
            for f in (METRICS_FILE, TIMING_FILE, SUMMARY_FILE):
                (run_dir / f).unlink(missing_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / CONFIG_FILE).write_text(dump(cfg))
        sim = RoundLoop(cfg, run_dir, data_dir=data_dir, progress=progress, federation=feds[key])
        results.append(sim.run())
    return results


RESUME_OVERRIDES = ("rounds", "workers", "checkpoint_every", "device")
"""What a resumed run may change: its length, where it computes (checkpoints are device-free), how often
it saves."""


def resume_run(run_dir: Path, overrides: dict[str, Any], *, data_dir: str | None, progress: bool) -> RunResult:
    """Continue a run from its last checkpoint (``rounds=N`` may extend it)."""
    path = run_config_path(run_dir)
    cfg = tomllib.loads(path.read_text())
    for key in overrides:
        if key not in RESUME_OVERRIDES:
            allowed = ", ".join(RESUME_OVERRIDES)
            raise ConfigError(f"--resume accepts only the overrides {allowed}, not {key!r}")
    cfg.update(overrides)
    cfg.setdefault("target_accuracy", None)
    validate(cfg)
    (run_dir / CONFIG_FILE).write_text(dump(cfg))
    return RoundLoop(cfg, run_dir, data_dir=data_dir, progress=progress).run(resume=True)
