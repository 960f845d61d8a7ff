"""Official download locations, checksums, and fetching a file or explaining why it is missing.

fedskew never downloads behind the user's back: a missing file is fetched only when the loader
is called with ``download=True``. Either way a missing or damaged file ends in one
:class:`~fedskew.core.errors.DataError` line that names the exact path, where the data dir
comes from and the official URL, because that is all a user needs to fix it by hand (for
example on a machine without internet access).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from fedskew.core.errors import DataError

#: How the data dir is chosen, quoted in every "file not found" message.
DATA_DIR_HINT = "the data dir is --data-dir, else $FEDSKEW_DATA, else ~/.cache/fedskew/data"

_CHUNK = 1 << 20
_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RemoteFile:
    """A file of an official dataset release.

    Attributes
    ----------
    filename : str
        Name the file is stored under, inside the dataset's folder of the data dir.
    urls : tuple of str
        Download locations, tried in order (official mirror first).
    md5 : str or None
        MD5 of the file exactly as served. ``None`` where no published value is known to us:
        such files are then checked only structurally by their parser.
    """

    filename: str
    urls: tuple[str, ...]
    md5: str | None = None


def file_digest(path: Path, algorithm: str) -> str:
    """Hex digest of a file, read in chunks so multi-GB archives do not fill memory."""
    digest = hashlib.new(algorithm)
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    return digest.hexdigest()


def verify_checksum(path: Path, *, md5: str | None = None, sha256: str | None = None) -> None:
    """Raise :class:`DataError` unless ``path`` has the given digest(s).

    A mismatch means a truncated download or a different release; parsing it anyway could
    silently train on wrong data, so it is an error that tells the user to fetch it again.
    """
    for algorithm, expected in (("md5", md5), ("sha256", sha256)):
        if expected is None:
            continue
        actual = file_digest(path, algorithm)
        if actual != expected.lower():
            raise DataError(
                f"{path}: checksum mismatch ({algorithm} {actual}, expected {expected}); the file is "
                "damaged or not the official release: delete it and fetch it again"
            )


def missing_file_error(dataset: str, path: Path, url: str | None, reason: str | None = None) -> DataError:
    """The one-line error for a dataset file that is not where fedskew looks for it."""
    message = f"{dataset}: file not found: {path}"
    if reason is not None:
        message += f", and downloading it failed ({reason})"
    message += f". Put it there ({DATA_DIR_HINT})"
    if url is not None:
        message += f"; official download: {url}"
        if reason is None:
            message += "; or let fedskew download it: dataset.download=true (Python: download=True)"
    return DataError(message)


def fetch(dataset: str, remote: RemoteFile, folder: Path, *, download: bool) -> Path:
    """Return ``folder/remote.filename``, downloading it first if allowed.

    Parameters
    ----------
    dataset : str
        Dataset name, used only to make error messages self-explanatory.
    remote : RemoteFile
        What to fetch and how to check it.
    folder : pathlib.Path
        Where the file belongs (created when downloading).
    download : bool
        Whether a missing file may be downloaded. Off by default in every loader so that
        offline machines fail fast with instructions instead of hanging on a timeout.
    """
    path = folder / remote.filename
    if path.is_file():
        return path
    if not download:
        raise missing_file_error(dataset, path, remote.urls[0] if remote.urls else None)
    reasons = []
    for url in remote.urls:
        try:
            _download(url, path, remote.md5)
        except DataError as exc:
            reasons.append(str(exc))
        else:
            return path
    reason = "; ".join(reasons) if reasons else "no download URL is known"
    raise missing_file_error(dataset, path, remote.urls[0] if remote.urls else None, reason)


def _download(url: str, dest: Path, md5: str | None) -> None:
    """Stream ``url`` into ``dest`` atomically, checking the MD5 before the file appears.

    Writing to a temporary name and renaming at the end means an interrupted download never
    leaves a partial file that a later run would mistake for the real one.
    """
    tmp_name: str | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.md5()
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
            with (
                os.fdopen(fd, "wb") as out,
                tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, file=sys.stderr, disable=None) as bar,
            ):
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if md5 is not None and digest.hexdigest() != md5:
            raise DataError(f"{url}: checksum mismatch (md5 {digest.hexdigest()}, expected {md5})")
        os.replace(tmp_name, dest)
        tmp_name = None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise DataError(f"{url}: {exc}") from exc
    finally:
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)
