"""On-disk cache of decoded dataset arrays.

Decoding a dataset (60,000 JPEGs, a gzipped IDX file, pickled CIFAR batches) is slow compared
with reading the finished ``uint8`` arrays back, and every experiment run loads its dataset
again. So each decoded dataset is stored once as an uncompressed ``.npz`` file and reused.

The cache key covers the dataset name, every option that changes the arrays, whether the sources'
checksums were verified, and the size and modification time of each source file (every file, for a
source folder), so replacing or editing a source invalidates the entry without any manual step, and an
entry cached without verification never stands in for a verified load. Entries are written to a
temporary file and renamed into place, so a crash or two runs racing never leave a half
written entry behind. The cache can be deleted at any time.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedskew.core.errors import DataError

#: Bumped whenever the stored layout or a decoder changes, so old entries stop matching.
CACHE_FORMAT = 1

#: What the cache stores for one dataset: named arrays plus JSON-serialisable metadata.
Entry = tuple[dict[str, np.ndarray], dict[str, Any]]

_META_KEY = "__meta__"


def resolve_folder(explicit: str | Path | None, env: str, default: str) -> Path:
    """``explicit`` if given, else ``$<env>`` if set and non-empty, else ``~/.cache/fedskew/<default>``."""
    if explicit is not None:
        return Path(explicit).expanduser()
    value = os.environ.get(env)
    if value:
        return Path(value).expanduser()
    return Path.home() / ".cache" / "fedskew" / default


def resolve_cache_dir(cache_dir: str | Path | None) -> Path:
    """Directory for cached arrays: explicit argument > ``$FEDSKEW_CACHE`` > ``~/.cache/fedskew/arrays``."""
    return resolve_folder(cache_dir, "FEDSKEW_CACHE", "arrays")


def source_fingerprint(path: Path) -> list[Any]:
    """Identify the current state of a source file or folder cheaply (no hashing of contents).

    Size and nanosecond mtime change whenever a file is replaced or edited; hashing the
    contents instead would cost as much as decoding for large archives.
    """
    try:
        resolved = path.resolve()
        if not resolved.is_dir():
            stat = resolved.stat()
            return [str(resolved), stat.st_size, stat.st_mtime_ns]
        digest = hashlib.sha256()
        for dirpath, dirnames, filenames in os.walk(resolved):
            dirnames.sort()
            for filename in sorted(filenames):
                full = Path(dirpath, filename)
                stat = full.stat()
                rel = full.relative_to(resolved).as_posix()
                digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        return [str(resolved), "dir", digest.hexdigest()]
    except OSError as exc:
        inside = f" at {exc.filename}" if exc.filename and str(exc.filename) != str(path) else ""
        raise DataError(f"{path}: cannot inspect source ({exc.strerror or exc}{inside}: a broken link or an "
                        "unreadable file in the folder)") from exc


def cache_key(name: str, options: Mapping[str, Any], sources: Sequence[Path], verified: bool | None = None) -> str:
    """Hex key for a dataset built from ``sources`` with ``options``; ``verified`` records whether the
    sources' checksums were checked (None: the dataset has no checksums, and the key says nothing)."""
    payload: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "name": name,
        "options": dict(options),
        "sources": [source_fingerprint(p) for p in sources],
    }
    if verified is not None:
        payload["verified"] = verified
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ArrayCache:
    """A folder of ``<name>-<key>.npz`` entries.

    Parameters
    ----------
    directory : pathlib.Path
        Where entries live; created on first write.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_for(self, name: str, key: str) -> Path:
        """File that holds (or would hold) the entry for ``name`` and ``key``."""
        return self.directory / f"{name}-{key[:24]}.npz"

    def load(self, name: str, key: str) -> Entry | None:
        """Return the stored entry, or ``None`` when absent or unreadable.

        An unreadable entry (truncated by a full disk, say) is treated as a miss and later
        overwritten: the cache only ever saves time, so it must never be a reason to fail.
        """
        path = self.path_for(name, key)
        if not path.is_file():
            return None
        try:
            with np.load(path, mmap_mode=None, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files if k != _META_KEY}
                meta = json.loads(str(npz[_META_KEY][()]))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            warnings.warn(f"ignoring unreadable cache entry {path} ({exc})", stacklevel=2)
            return None
        if not isinstance(meta, dict):
            warnings.warn(f"ignoring cache entry {path} with malformed metadata", stacklevel=2)
            return None
        return arrays, meta

    def save(self, name: str, key: str, entry: Entry) -> None:
        """Store ``entry`` atomically; a failure to write only warns (the data is still returned)."""
        arrays, meta = entry
        path = self.path_for(name, key)
        tmp_name: str | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=self.directory)
            payload: dict[str, Any] = {**arrays, _META_KEY: np.array(json.dumps(meta))}
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp_name, 0o644)  # mkstemp makes 0600; entries are plain data others may share
            os.replace(tmp_name, path)
            tmp_name = None
        except OSError as exc:
            warnings.warn(f"could not write cache entry {path} ({exc})", stacklevel=2)
        finally:
            if tmp_name is not None:
                Path(tmp_name).unlink(missing_ok=True)

    def get_or_build(
        self,
        name: str,
        options: Mapping[str, Any],
        sources: Sequence[Path],
        build: Callable[[], Entry],
        verified: bool | None = None,
    ) -> Entry:
        """Return the cached entry for this name/options/sources, building and storing it on a miss.

        ``verified`` says whether ``build`` checks the sources' published checksums (None: the dataset
        has none). An entry built with the check serves both kinds of request; one built without it
        serves only requests without, so asking to verify a source cached unverified builds (and
        checks) it again.
        """
        wanted = [True] if verified else [False, True] if verified is False else [None]
        for flag in wanted:
            entry = self.load(name, cache_key(name, options, sources, flag))
            if entry is not None:
                return entry
        entry = build()
        self.save(name, cache_key(name, options, sources, verified), entry)
        return entry
