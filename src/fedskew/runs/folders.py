"""Run folders as they are written: the file names, folder names and labels, one process per run folder
(:func:`locked_run_folder`), and file-system failures as one line naming the folder (:func:`describe_os_error`,
:func:`os_errors_name`). :mod:`fedskew.runs` says what a run folder holds."""
from __future__ import annotations

import errno
import os
import re
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath, PureWindowsPath

from fedskew.core.errors import ConfigError, FedskewError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; run folders are not protected there
    fcntl = None  # type: ignore[assignment]

CONFIG_FILE = "config.toml"
METRICS_FILE = "metrics.jsonl"
TIMING_FILE = "timing.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model.pt"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_FILE = "last.pt"
ARTIFACTS_DIR = "artifacts"
SYNTHETIC_ARTIFACT = "synthetic"
"""The artifact in which condensation-based methods keep the synthetic images their clients sent."""
AUDIT_FILE = "audit.json"
ENVIRONMENT_FILE = "environment.json"
"""The versions (fedskew, Python, PyTorch, NumPy) and the device a run started with."""
LOCK_FILE = ".lock"

REQUIRED_SUMMARY_KEYS = (
    "algorithm",
    "rounds",
    "final_accuracy",
    "best_accuracy",
    "max_drop",
    "mean_drop",
    "mean_rise",
    "mean_class_variance",
    "bytes_server_to_client",
    "bytes_client_to_server",
)


def run_folder_name(label: str, seed: object) -> str:
    """A run's folder name, ``<label>-seed<k>`` (simulator and Flower deployment alike)."""
    return f"{folder_label(label)}-seed{seed}"


def folder_label(label: str) -> str:
    """A label as a shell-safe folder name: every run of characters other than letters, digits, ``.``, ``+``,
    ``-`` and ``_`` becomes one ``_``, and ``_`` and ``-`` are trimmed from the ends ("FedAF, mean KL" ->
    "FedAF_mean_KL", "FedAF w/o CDC" -> "FedAF_w_o_CDC"). The label itself keeps its text in the records."""
    return re.sub(r"[^\w.+-]+", "_", label).strip("_-") or "run"


def check_folder_name(key: str, value: object) -> None:
    """Require ``value`` to name a folder inside its parent: the experiment ``name`` (``runs/<name>``).

    Refused: an empty name, an absolute path (``/x``, ``~/x``, ``C:\\x``), a ``..`` part (it leaves the
    parent) or a ``.`` part, and control characters. A name may have parts (``fmnist/alpha0.1``).
    """
    ok = isinstance(value, str) and value.strip() != "" and not re.search(r"[\x00-\x1f]", value)
    if isinstance(value, str) and ok:
        absolute = PurePosixPath(value).is_absolute() or bool(PureWindowsPath(value).drive) or value.startswith("~")
        ok = not absolute and not {".", ".."} & set(re.split(r"[/\\]", value))
    if not ok:
        raise ConfigError(
            f"{key} must be a folder name inside runs/ (not empty, not absolute, no '.' or '..' parts, no control "
            f"characters), got {value!r}"
        )


MAX_LABEL = 100
"""The longest run label (``<label>-seed<k>`` stays well inside a file system's 255-byte names)."""


def check_label(value: object, key: str = "label", longest: int | None = MAX_LABEL) -> str:
    """Require ``value`` to be a run label that is also a tidy folder name; returns it.

    Refused: an empty label, one over :data:`MAX_LABEL` characters (``longest``; None: any length, for a label
    about to be replaced), spaces at either end, a leading ``.`` (a hidden folder, or ``../x``), and characters
    that print as nothing or reorder the text (:func:`hidden_character`): control characters (a newline breaks
    the printed tables), and invisible and bidirectional format characters (U+202E, U+200B: a label that prints
    as another, a spoofed table or report.html).
    """
    if (
        isinstance(value, str) and value.strip() == value and 0 < len(value) <= (longest or len(value))
        and not value.startswith(".") and hidden_character(value) is None
    ):
        return value
    hidden = hidden_character(value) if isinstance(value, str) else None
    found = f" (U+{ord(hidden):04X}, {unicodedata.name(hidden, 'unnamed')})" if hidden is not None else ""
    raise ConfigError(
        f"{key} must be 1 to {MAX_LABEL} characters, with no control, invisible or bidirectional format characters"
        f"{found}, no spaces at either end and no leading '.', got {value!r}"
    )


HIDDEN_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")
"""Unicode categories a label may not hold: control (``\n``, ``\x85``), format (U+202E right-to-left override,
U+200B zero-width space, U+2066 isolates, U+FEFF), surrogates, and the line and paragraph separators."""


def hidden_character(text: str) -> str | None:
    """The first character of ``text`` that prints as nothing or changes how the text around it prints
    (:data:`HIDDEN_CATEGORIES`); None when there is none."""
    for char in text:
        if unicodedata.category(char) in HIDDEN_CATEGORIES:
            return char
    return None


def check_out_folder(out: str | Path) -> Path:
    """``--out`` as a path: it must name something (``--out ""`` would write into the current folder)."""
    if not str(out).strip():
        raise ConfigError("--out must name a folder, got ''")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path} is a file, not a folder")
    return path


_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}
"""Errors of a full disk, a quota or a file-size limit (``ulimit -f``): they name the folder being written,
not a file."""
_OS_ERRORS = {
    errno.ENOSPC: "the disk is full (no space left on device)",
    getattr(errno, "EDQUOT", -1): "the disk quota is exceeded",
    errno.EFBIG: "a file would exceed the largest size allowed (file too large)",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EISDIR: "is a folder, not a file",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "exists and is not a folder",
    errno.ENOENT: "no such file or folder",
    errno.ENAMETOOLONG: "file name too long",
}


def describe_os_error(e: OSError, folder: Path | None = None) -> str:
    """One line for a file-system failure, naming the file (or ``folder`` when the error names none).

    A full disk names the folder being written: ``the disk is full (no space left on device) while
    writing runs/x/FedAvg-seed0``.
    """
    what = _OS_ERRORS.get(e.errno or 0, e.strerror or str(e) or type(e).__name__)
    path = os.fsdecode(e.filename) if isinstance(e.filename, bytes | str) else e.filename  # TensorBoard gives bytes
    if e.errno in _DISK_FULL:
        where = folder if folder is not None else (Path(path).parent if path else None)
        return f"{what} while writing {where}" if where is not None else what
    if path:
        return f"{path}: {what}"
    return f"{what} in {folder}" if folder is not None else what


@contextmanager
def os_errors_name(folder: Path, *, run: bool = False) -> Iterator[None]:
    """Turn an ``OSError`` raised inside into a :class:`FedskewError` of one line naming ``folder``.

    With ``run`` (``folder`` is a run folder being written), a full disk also says how to go on: from
    the last checkpoint, which a failed write leaves intact, or from the start when there is none yet.
    """
    try:
        yield
    except OSError as e:
        line = describe_os_error(e, folder)
        if run and e.errno in _DISK_FULL:
            if (folder / CHECKPOINTS_DIR / CHECKPOINT_FILE).is_file():
                line += f"; its last checkpoint is intact: free some space, then `fedskew run --resume {folder}`"
            else:
                line += "; no checkpoint was written yet: free some space and start the run again"
        raise FedskewError(line) from None


def check_no_links(run_dir: Path) -> None:
    """Refuse a run folder that is a symbolic link: a run's files are written where its folder is, never
    through a link to somewhere else (the link's target would be written, and the run folder stay empty)."""
    if run_dir.is_symlink():
        raise FedskewError(
            f"{run_dir} is a symbolic link (to {os.readlink(run_dir)}); a run writes only into a folder of its own: "
            "replace the link by a folder, or choose another --out"
        )


@contextmanager
def locked_run_folder(run_dir: Path) -> Iterator[Path]:
    """Hold the run folder for the life of a run: at most one process runs or resumes it at a time.

    Creates ``run_dir`` and takes an exclusive ``flock`` on its ``.lock`` file (which names the holder's
    pid), released when the block ends or the process dies (the operating system releases it, so a killed
    run leaves no stale lock). A folder another process holds, one that cannot be created, or one that is
    (or holds) a symbolic link (:func:`check_no_links`) is refused with one line naming it.

    Nothing is left behind: the ``.lock`` file is removed when the block ends, and so is ``run_dir`` if
    this call created it and it is still empty (a run that failed before writing anything).
    """
    run_dir = Path(run_dir)
    check_no_links(run_dir)
    created = not run_dir.exists()
    lock = run_dir / LOCK_FILE
    with os_errors_name(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    owned = False
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                pid = f" (pid {holder})" if holder.isdigit() else ""
                raise FedskewError(
                    f"{run_dir} is in use by another fedskew process{pid}; wait for it to end, or choose another "
                    "folder"
                ) from None
            if not _same_file(fd, lock):  # the holder before us removed it as we opened it: that one is gone
                raise FedskewError(f"{run_dir} was in use by another fedskew process a moment ago; try again")
            owned = True
            with os_errors_name(run_dir):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield run_dir
    finally:
        if owned:  # removed while still held, so no other process can take a lock on the removed file
            _remove_quietly(lock)
            if created:
                _remove_quietly(run_dir, folder=True)  # only if empty: a run that wrote nothing leaves nothing
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _remove_quietly(path: Path, *, folder: bool = False) -> None:
    """Remove ``path``; a folder with files in it stays, a file already gone is fine."""
    with suppress(OSError):
        path.rmdir() if folder else path.unlink()


def run_config_path(run_dir: Path) -> Path:
    """``run_dir/config.toml``, or an error that says what ``run_dir`` is instead.

    Passing an experiment's output folder (``--out``) where one run's folder is meant is the usual
    slip; the error then names the run folders inside it.
    """
    path = run_dir / CONFIG_FILE
    if path.is_file():
        return path
    if not run_dir.is_dir():
        raise FedskewError(f"{run_dir} is not a run folder: it does not exist")
    inside = sorted(p.parent.name for p in run_dir.glob(f"*/{CONFIG_FILE}"))
    if inside:
        shown = ", ".join(inside[:5]) + (f" (and {len(inside) - 5} more)" if len(inside) > 5 else "")
        raise FedskewError(
            f"{run_dir} is an experiment folder, not a run folder; pass one of its runs ({shown}), or resume "
            f"them all with: fedskew run CONFIG --out {run_dir} --resume"
        )
    raise FedskewError(f"{run_dir} is not a run folder: no {CONFIG_FILE}")


def synthetic_dir(run_dir: Path) -> Path:
    """``run_dir/artifacts/synthetic``: where a run keeps the synthetic images its clients sent."""
    return run_dir / ARTIFACTS_DIR / SYNTHETIC_ARTIFACT


def synthetic_files(run_dir: Path) -> list[Path]:
    """The per-round files of :func:`synthetic_dir`, in round order (empty when there are none)."""
    return sorted(synthetic_dir(run_dir).glob("round_*.safetensors"))
