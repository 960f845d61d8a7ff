"""Run folders: the names of the files a run writes, finding run folders, and reading them back.

The engine writes one folder per run (variant x seed), named :func:`run_folder_name`::

    config.toml       the fully resolved configuration of the run (every default filled in)
    environment.json  the versions of fedskew, Python, PyTorch and NumPy, and the device's name
    metrics.jsonl     one JSON object per round
    timing.jsonl      seconds per round
    summary.json      per-run figures
    model.pt          the final global model's weights
    checkpoints/      last.pt, the last checkpoint
    artifacts/<name>/ round_NNNN.safetensors, what an algorithm keeps per round (``synthetic``: uploads)
    audit.json        written by ``fedskew audit``
    .lock             held (``flock``) by the process that runs or resumes the run, for the life of the run

This module knows only these names and formats, so the engine, the report, the audit and the command
line agree on them without importing one another. It also holds the rules every run folder follows:
names that stay inside their parent (:func:`check_folder_name`), one process per run folder at a time
(:func:`locked_run_folder`), and file-system failures reported as one line naming the folder
(:func:`describe_os_error`, :func:`os_errors_name`).
"""


from __future__ import annotations

from fedskew.runs.folders import (
    ARTIFACTS_DIR,
    AUDIT_FILE,
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    ENVIRONMENT_FILE,
    HIDDEN_CATEGORIES,
    LOCK_FILE,
    MAX_LABEL,
    METRICS_FILE,
    MODEL_FILE,
    REQUIRED_SUMMARY_KEYS,
    SUMMARY_FILE,
    SYNTHETIC_ARTIFACT,
    TIMING_FILE,
    check_folder_name,
    check_label,
    check_no_links,
    check_out_folder,
    describe_os_error,
    folder_label,
    hidden_character,
    locked_run_folder,
    os_errors_name,
    run_config_path,
    run_folder_name,
    synthetic_dir,
    synthetic_files,
)
from fedskew.runs.reading import (
    RunData,
    experiment_of,
    experiment_runs,
    find_runs,
    flat_config,
    is_number,
    load_run,
    report_folder,
)

__all__ = [
    "ARTIFACTS_DIR",
    "AUDIT_FILE",
    "CHECKPOINTS_DIR",
    "CHECKPOINT_FILE",
    "CONFIG_FILE",
    "ENVIRONMENT_FILE",
    "HIDDEN_CATEGORIES",
    "LOCK_FILE",
    "MAX_LABEL",
    "METRICS_FILE",
    "MODEL_FILE",
    "REQUIRED_SUMMARY_KEYS",
    "SUMMARY_FILE",
    "SYNTHETIC_ARTIFACT",
    "TIMING_FILE",
    "RunData",
    "check_folder_name",
    "check_label",
    "check_no_links",
    "check_out_folder",
    "describe_os_error",
    "experiment_of",
    "experiment_runs",
    "find_runs",
    "flat_config",
    "folder_label",
    "hidden_character",
    "is_number",
    "load_run",
    "locked_run_folder",
    "os_errors_name",
    "report_folder",
    "run_config_path",
    "run_folder_name",
    "synthetic_dir",
    "synthetic_files",
]
