"""CIFAR-10 and CIFAR-100 from the official python pickles, read without running pickled code."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedskew.core.errors import DataError
from fedskew.core.params import check
from fedskew.data.download import RemoteFile, fetch, verify_checksum
from fedskew.data.sources.archive import Tree
from fedskew.data.sources.base import DATASETS, FilesParams, cached
from fedskew.data.sources.container import ArrayDataset

__all__ = ["CIFAR10_ARCHIVE", "CIFAR10_CLASSES", "Cifar100Params"]


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler that only builds numpy arrays, so a tampered batch file cannot run code.

    The CIFAR batches are pickles; a plain ``pickle.load`` of a file from the internet would
    execute whatever it names. These are the only globals the official files (and re-pickled
    copies under numpy 1 or 2) need.
    """

    _ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("numpy.core.numeric", "_frombuffer"),
            ("numpy._core.numeric", "_frombuffer"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("_codecs", "encode"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _unpickle(raw: bytes, where: str) -> dict[bytes, Any]:
    try:
        obj = _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as exc:  # a damaged pickle can fail in many ways, all of them the file's fault
        raise DataError(f"{where}: not a valid CIFAR pickle ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, dict):
        raise DataError(f"{where}: not a valid CIFAR pickle (a {type(obj).__name__}, expected a dict)")
    return obj


class _CifarRelease(NamedTuple):
    archive: RemoteFile
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str


#: The official CIFAR-10 release.
CIFAR10_ARCHIVE = RemoteFile(
    "cifar-10-python.tar.gz",
    ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
    "c58f30108f718f92721af3b95e74349a",
)

_CIFAR10 = _CifarRelease(
    archive=CIFAR10_ARCHIVE,
    folder="cifar-10-batches-py",
    train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
    test_files=("test_batch",),
    meta_file="batches.meta",
)

_CIFAR100 = _CifarRelease(
    archive=RemoteFile(
        "cifar-100-python.tar.gz",
        ("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",),
        "eb9058c3a382ffc7106e4002c42a8d85",
    ),
    folder="cifar-100-python",
    train_files=("train",),
    test_files=("test",),
    meta_file="meta",
)

#: CIFAR-10 label order 0..9.
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _cifar_source(name: str, release: _CifarRelease, root: Path, download: bool) -> Path:
    """The official tarball if present, else an extracted folder, else the download (or its error)."""
    archive = root / release.archive.filename
    folder = root / release.folder
    if not archive.is_file() and folder.is_dir():
        return folder
    return fetch(name, release.archive, root, download=download)


def _read_cifar(
    name: str, release: _CifarRelease, source: Path, label_key: bytes, names_key: bytes, verify: bool
) -> ArrayDataset:
    if verify and source.is_file() and release.archive.md5 is not None:
        verify_checksum(source, md5=release.archive.md5)
    prefix = "" if source.is_dir() else f"{release.folder}/"
    files = (*release.train_files, *release.test_files, release.meta_file)
    with Tree(source) as tree:
        raw = tree.read([prefix + f for f in files])

    def batch(file: str) -> tuple[np.ndarray, np.ndarray]:
        where = f"{source}:{prefix}{file}"
        content = _unpickle(raw[prefix + file], where)
        if b"data" not in content or label_key not in content:
            raise DataError(f"{where}: CIFAR batch lacks {b'data'!r} or {label_key!r}")
        data = np.asarray(content[b"data"])
        labels = np.asarray(content[label_key])
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DataError(f"{where}: expected uint8 data of shape (N, 3072), got {data.dtype} {data.shape}")
        if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
            raise DataError(f"{where}: expected {len(data)} integer labels, got shape {labels.shape}")
        # Rows hold the 1024 red, then green, then blue values of a 32x32 image: already CHW.
        return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)

    meta = _unpickle(raw[prefix + release.meta_file], f"{source}:{prefix}{release.meta_file}")
    if names_key not in meta:
        raise DataError(f"{source}:{prefix}{release.meta_file}: lacks {names_key!r}")
    classes = [n.decode() if isinstance(n, bytes) else str(n) for n in meta[names_key]]
    train = [batch(f) for f in release.train_files]
    test = [batch(f) for f in release.test_files]
    return ArrayDataset.from_arrays(
        name,
        np.concatenate([x for x, _ in train]),
        np.concatenate([y for _, y in train]),
        np.concatenate([x for x, _ in test]),
        np.concatenate([y for _, y in test]),
        classes,
    )


@DATASETS.register("cifar10", params=FilesParams)
def cifar10(p: FilesParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """CIFAR-10 from the official ``cifar-10-python.tar.gz`` (or its extracted ``cifar-10-batches-py/``).

    ``verify`` checks the tarball's official MD5 before decoding.
    """
    source = _cifar_source("cifar10", _CIFAR10, data_dir, p.download)
    return cached(
        "cifar10",
        {},
        [source],
        cache_dir,
        lambda: _read_cifar("cifar10", _CIFAR10, source, b"labels", b"label_names", p.verify),
        verify=p.verify,
    )


class Cifar100Params(FilesParams, kw_only=True):
    """Options of ``cifar100``: ``labels`` picks the 100 ``"fine"`` classes or the 20 ``"coarse"`` superclasses."""

    labels: str = "fine"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.labels in ("fine", "coarse"), "labels", self.labels, "'fine' or 'coarse'")


@DATASETS.register("cifar100", params=Cifar100Params)
def cifar100(p: Cifar100Params, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """CIFAR-100 from the official ``cifar-100-python.tar.gz`` (or its extracted ``cifar-100-python/``).

    ``labels`` picks the 100 ``"fine"`` classes (the usual benchmark) or the 20 ``"coarse"``
    superclasses. ``verify`` checks the tarball's official MD5 before decoding.
    """
    source = _cifar_source("cifar100", _CIFAR100, data_dir, p.download)
    label_key = f"{p.labels}_labels".encode()
    names_key = f"{p.labels}_label_names".encode()
    return cached(
        "cifar100",
        {"labels": p.labels},
        [source],
        cache_dir,
        lambda: _read_cifar("cifar100", _CIFAR100, source, label_key, names_key, p.verify),
        verify=p.verify,
    )
