"""Dataset sources: parse the official files of each dataset into plain ``uint8`` arrays.

Every dataset becomes the same thing, an :class:`ArrayDataset` of NCHW ``uint8`` images and
``int64`` labels, so partitioners, models and algorithms never care where the data came from.
Loaders are registered by name in :data:`DATASETS` and called through :func:`load_dataset`.

Loaders read the official release formats (IDX files, the CIFAR python pickles, image-folder
trees and archives) from the data dir; they download only when asked (``download=True``) and
check official checksums where they are published. Every problem with the files becomes a
one-line :class:`~fedskew.core.errors.DataError` naming the file, never a traceback. Decoded
arrays are cached on disk (see :mod:`fedskew.data.cache`), so only the first load is slow.
"""

from __future__ import annotations

import gzip
import hashlib
import inspect
import io
import math
import multiprocessing
import os
import pickle
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from fedskew.core.errors import ConfigError, DataError
from fedskew.core.registry import Registry
from fedskew.data.cache import ArrayCache, Entry, resolve_cache_dir
from fedskew.data.download import DATA_DIR_HINT, RemoteFile, fetch, verify_checksum

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "DOMAINNET_DOMAINS",
    "ArrayDataset",
    "channel_stats",
    "load_dataset",
    "parse_idx",
    "read_idx",
    "resolve_data_dir",
]


# ----------------------------------------------------------------------------------------------
# The dataset container
# ----------------------------------------------------------------------------------------------


@dataclass(eq=False, repr=False)
class ArrayDataset:
    """A whole dataset in memory as ``uint8`` images and ``int64`` labels.

    Images stay ``uint8`` (a quarter of the memory of ``float32``) until a model needs them;
    :meth:`to_tensors` normalises with the per-channel ``mean``/``std`` of the train split,
    which are computed once from ``x_train`` rather than copied from papers, so every
    dataset (including custom image folders) is normalised the same way.

    Attributes
    ----------
    name : str
        Registered dataset name (or a custom label).
    x_train, x_test : numpy.ndarray
        ``uint8`` images, shape ``(N, C, H, W)``.
    y_train, y_test : numpy.ndarray
        ``int64`` labels in ``[0, len(classes))``, shape ``(N,)``.
    classes : list of str
        Class names; the label is the index into this list.
    mean, std : tuple of float
        Per-channel mean and standard deviation of ``x_train / 255``.
    domains_train, domains_test : numpy.ndarray or None
        ``int64`` domain id per sample, for datasets whose clients differ by domain
        (feature skew); ``None`` for single-domain datasets.
    domain_names : list of str or None
        Name of each domain id.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    domains_train: np.ndarray | None = None
    domains_test: np.ndarray | None = None
    domain_names: list[str] | None = None

    def __post_init__(self) -> None:
        """Check shapes and dtypes up front: a wrong array would otherwise fail deep in training."""
        for split in ("train", "test"):
            x, y = self._split(split)
            if x.dtype != np.uint8 or x.ndim != 4:
                raise DataError(f"{self.name}: x_{split} must be uint8 (N, C, H, W), got {x.dtype} {x.shape}")
            if y.dtype != np.int64 or y.shape != (len(x),):
                raise DataError(f"{self.name}: y_{split} must be int64 of shape ({len(x)},), got {y.dtype} {y.shape}")
            if len(y) and (y.min() < 0 or y.max() >= len(self.classes)):
                raise DataError(f"{self.name}: y_{split} has labels outside [0, {len(self.classes)})")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise DataError(
                f"{self.name}: train images {self.x_train.shape[1:]} and test images "
                f"{self.x_test.shape[1:]} differ in shape"
            )
        if len(self.mean) != self.in_channels or len(self.std) != self.in_channels:
            raise DataError(f"{self.name}: mean/std need one value per channel ({self.in_channels})")
        self._check_domains()

    def _check_domains(self) -> None:
        train, test, names = self.domains_train, self.domains_test, self.domain_names
        if train is None and test is None and names is None:
            return
        if train is None or test is None or names is None:
            raise DataError(f"{self.name}: domains_train, domains_test and domain_names go together")
        for split, domains, count in (("train", train, len(self.y_train)), ("test", test, len(self.y_test))):
            if domains.dtype != np.int64 or domains.shape != (count,):
                raise DataError(f"{self.name}: domains_{split} must be int64 of shape ({count},)")
            if count and (domains.min() < 0 or domains.max() >= len(names)):
                raise DataError(f"{self.name}: domains_{split} has ids outside [0, {len(names)})")

    @classmethod
    def from_arrays(
        cls,
        name: str,
        x_train: np.ndarray,
        y_train: np.ndarray,
        x_test: np.ndarray,
        y_test: np.ndarray,
        classes: Sequence[str],
        *,
        domains_train: np.ndarray | None = None,
        domains_test: np.ndarray | None = None,
        domain_names: Sequence[str] | None = None,
    ) -> ArrayDataset:
        """Build a dataset, computing ``mean``/``std`` from ``x_train`` so callers cannot get them wrong."""
        mean, std = channel_stats(x_train)
        return cls(
            name=name,
            x_train=x_train,
            y_train=y_train,
            x_test=x_test,
            y_test=y_test,
            classes=list(classes),
            mean=mean,
            std=std,
            domains_train=domains_train,
            domains_test=domains_test,
            domain_names=None if domain_names is None else list(domain_names),
        )

    @property
    def num_classes(self) -> int:
        """Number of classes (length of :attr:`classes`)."""
        return len(self.classes)

    @property
    def in_channels(self) -> int:
        """Image channels ``C`` (1 for grayscale, 3 for RGB)."""
        return int(self.x_train.shape[1])

    @property
    def image_size(self) -> int:
        """Image height ``H`` (all bundled datasets are square)."""
        return int(self.x_train.shape[2])

    def _split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split == "train":
            return self.x_train, self.y_train
        if split == "test":
            return self.x_test, self.y_test
        raise ConfigError(f"unknown split {split!r}; allowed: test, train")

    def to_tensors(self, split: str, index: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, y)`` of ``split`` (``"train"`` or ``"test"``) as torch tensors.

        ``x`` is ``float32`` normalised as ``(x / 255 - mean) / std``; ``y`` is ``int64``.
        Both are copies, so training code may modify them freely. ``index`` (integer rows) selects
        and orders the samples before the conversion, so no full-size float copy is made first.
        """
        x, y = self._split(split)
        if index is not None:
            x, y = x[index], y[index]
        shape = (1, self.in_channels, 1, 1)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(shape)
        std = torch.tensor(self.std, dtype=torch.float32).view(shape)
        images = torch.from_numpy(np.asarray(x, dtype=np.float32))  # a fresh, writable copy
        images.div_(255.0).sub_(mean).div_(std)
        return images, torch.from_numpy(y.copy())

    def train_subset(self, fraction: float, seed: int) -> ArrayDataset:
        """A class-stratified random ``fraction`` of the training split; the test split is kept whole.

        Each class keeps ``round(fraction * n_c)`` of its ``n_c`` images (at least one), drawn with
        ``seed``. ``mean``/``std`` stay those of the full training split, so a model sees inputs
        normalised the same way whatever the fraction. Used to scale experiments down to a small
        machine (the ``dataset.train_fraction`` config key).
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
            raise ConfigError(f"dataset.train_fraction = {fraction!r} is not allowed; allowed: 0 < fraction <= 1")
        if fraction == 1:
            return self
        rng = np.random.default_rng(seed)
        keep = []
        for c in np.unique(self.y_train):
            rows = np.flatnonzero(self.y_train == c)
            take = max(1, round(fraction * len(rows)))
            keep.append(rng.choice(rows, size=take, replace=False))
        index = np.sort(np.concatenate(keep))
        return replace(
            self,
            x_train=self.x_train[index],
            y_train=self.y_train[index],
            domains_train=None if self.domains_train is None else self.domains_train[index],
        )

    def __repr__(self) -> str:
        shape = "x".join(str(d) for d in self.x_train.shape[1:])
        domains = f", domains={len(self.domain_names)}" if self.domain_names is not None else ""
        return (
            f"ArrayDataset({self.name!r}, train={len(self.y_train)}, test={len(self.y_test)}, "
            f"image={shape}, classes={self.num_classes}{domains})"
        )


def channel_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std of ``x / 255`` for NCHW ``uint8`` images.

    Accumulates in float64 over chunks so 60,000 CIFAR images need no full float copy. A
    constant channel gets std 1.0 instead of 0, so normalising it cannot divide by zero.
    """
    channels = x.shape[1]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    for start in range(0, len(x), 4096):
        chunk = x[start : start + 4096].astype(np.float64) / 255.0
        total += chunk.sum(axis=(0, 2, 3))
        squares += np.square(chunk).sum(axis=(0, 2, 3))
    count = max(1, x.shape[0] * x.shape[2] * x.shape[3])
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    std[std < 1e-6] = 1.0
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


# ----------------------------------------------------------------------------------------------
# Registry, data dir and the public entry point
# ----------------------------------------------------------------------------------------------

#: Dataset loaders by name. Each is called as ``loader(data_dir, *, cache_dir=..., **options)``.
DATASETS: Registry[Callable[..., ArrayDataset]] = Registry("dataset")

_COMMON_PARAMS = ("data_dir", "cache_dir")


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """Folder holding dataset files: explicit argument > ``$FEDSKEW_DATA`` > ``~/.cache/fedskew/data``."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get("FEDSKEW_DATA")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "fedskew" / "data"


def load_dataset(
    name: str,
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> ArrayDataset:
    """Load the registered dataset ``name``.

    Parameters
    ----------
    name : str
        A name from :data:`DATASETS` (``DATASETS.names()`` lists them).
    data_dir : str or pathlib.Path, optional
        Where the dataset files are; see :func:`resolve_data_dir`.
    cache_dir : str or pathlib.Path, optional
        Where decoded arrays are cached; default ``$FEDSKEW_CACHE`` or ``~/.cache/fedskew/arrays``.
    **options
        Dataset-specific options (see each loader). Unknown options raise
        :class:`~fedskew.core.errors.ConfigError` listing the allowed ones, so a typo in a
        config file is reported instead of being silently ignored.
    """
    loader = DATASETS.get(name)
    allowed = [p for p in inspect.signature(loader).parameters if p not in _COMMON_PARAMS]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"dataset {name!r} has no option {', '.join(unknown)}; allowed: {', '.join(allowed) or 'none'}"
        )
    return loader(data_dir, cache_dir=cache_dir, **options)


def _cached(
    name: str,
    options: dict[str, Any],
    sources: Sequence[Path],
    cache_dir: str | Path | None,
    build: Callable[[], ArrayDataset],
) -> ArrayDataset:
    """Return ``build()``'s dataset, from the array cache when the sources are unchanged."""
    cache = ArrayCache(resolve_cache_dir(cache_dir))
    entry = cache.get_or_build(name, options, sources, lambda: _to_entry(build()))
    return _from_entry(name, entry)


def _to_entry(ds: ArrayDataset) -> Entry:
    arrays = {"x_train": ds.x_train, "y_train": ds.y_train, "x_test": ds.x_test, "y_test": ds.y_test}
    if ds.domains_train is not None and ds.domains_test is not None:
        arrays["domains_train"] = ds.domains_train
        arrays["domains_test"] = ds.domains_test
    meta = {"classes": ds.classes, "mean": ds.mean, "std": ds.std, "domain_names": ds.domain_names}
    return arrays, meta


def _from_entry(name: str, entry: Entry) -> ArrayDataset:
    arrays, meta = entry
    return ArrayDataset(
        name=name,
        x_train=arrays["x_train"],
        y_train=arrays["y_train"],
        x_test=arrays["x_test"],
        y_test=arrays["y_test"],
        classes=list(meta["classes"]),
        mean=tuple(meta["mean"]),
        std=tuple(meta["std"]),
        domains_train=arrays.get("domains_train"),
        domains_test=arrays.get("domains_test"),
        domain_names=meta["domain_names"],
    )


# ----------------------------------------------------------------------------------------------
# Option checking
# ----------------------------------------------------------------------------------------------


def _int_option(dataset: str, option: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ConfigError(f"{dataset}: option {option} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _optional_int(dataset: str, option: str, value: object, minimum: int) -> int | None:
    return None if value is None else _int_option(dataset, option, value, minimum)


def _channels_option(dataset: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in (1, 3):
        raise ConfigError(f"{dataset}: option channels must be 1 or 3, got {value!r}")
    return value


def _fraction_option(dataset: str, option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ConfigError(f"{dataset}: option {option} must be a number in [0, 1), got {value!r}")
    return float(value)


def _names_option(dataset: str, option: str, value: object) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{dataset}: option {option} must be a list of names, got {value!r}")
    if len(set(value)) != len(value) or not value:
        raise ConfigError(f"{dataset}: option {option} must list distinct names, got {value!r}")
    return list(value)


def _workers_option(dataset: str, value: object) -> int:
    if value is None:
        return min(2, os.cpu_count() or 1)
    return _int_option(dataset, "workers", value, 1)


def _path_option(dataset: str, root: Path, path: str | Path | None, expected: str) -> Path:
    """Resolve a ``path`` option (relative paths are relative to the data dir) and require it to exist."""
    resolved = root if path is None else Path(path).expanduser()
    if not resolved.is_absolute():
        resolved = root / resolved
    if not resolved.exists():
        raise DataError(
            f"{dataset}: {resolved} not found; set option path to {expected} "
            f"(relative paths are relative to the data dir; {DATA_DIR_HINT})"
        )
    return resolved


# ----------------------------------------------------------------------------------------------
# Built-in small datasets: scikit-learn digits and a synthetic generator
# ----------------------------------------------------------------------------------------------


@DATASETS.register("digits")
def digits(data_dir: str | Path | None = None, *, cache_dir: str | Path | None = None) -> ArrayDataset:
    """scikit-learn's 8x8 handwritten digits: 1,437 train / 360 test, 1 channel, 10 classes.

    Bundled with scikit-learn, so it needs no files (``data_dir`` and ``cache_dir`` are
    accepted for a uniform loader signature and ignored); ideal for quick runs. Pixel values
    0..16 are scaled to 0..255. The split is stratified with a fixed seed, so it never changes.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = np.rint(np.asarray(bunch.data, dtype=np.float64) * (255.0 / 16.0)).astype(np.uint8).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = train_test_split(np.arange(len(y)), test_size=360, stratify=y, random_state=0)
    train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
    classes = [str(i) for i in range(10)]
    return ArrayDataset.from_arrays("digits", x[train_idx], y[train_idx], x[test_idx], y[test_idx], classes)


@DATASETS.register("synthetic")
def synthetic(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    num_train: int = 512,
    num_test: int = 128,
    num_classes: int = 10,
    image_size: int = 16,
    channels: int = 1,
    noise: float = 0.6,
    num_domains: int = 0,
    seed: int = 0,
) -> ArrayDataset:
    """A tiny generated dataset for tests and smoke runs (no files; data/cache dirs are ignored).

    Each class has a smooth random prototype image; samples are the prototype plus Gaussian
    pixel noise of std ``noise`` (prototypes have unit std), so a small model learns it within
    a few steps while it is not trivially separable. Labels are balanced. With
    ``num_domains > 0`` every sample also gets a domain whose brightness gain and per-channel
    offset change its appearance but not its class, which mimics domain (feature) skew.
    """
    name = "synthetic"
    num_train = _int_option(name, "num_train", num_train, 1)
    num_test = _int_option(name, "num_test", num_test, 0)
    num_classes = _int_option(name, "num_classes", num_classes, 2)
    image_size = _int_option(name, "image_size", image_size, 2)
    channels = _channels_option(name, channels)
    num_domains = _int_option(name, "num_domains", num_domains, 0)
    if isinstance(noise, bool) or not isinstance(noise, int | float) or noise < 0:
        raise ConfigError(f"{name}: option noise must be a number >= 0, got {noise!r}")
    rng = np.random.default_rng(_int_option(name, "seed", seed, 0))

    # Low-frequency prototypes: random values on a coarse grid, upsampled by repetition.
    coarse = max(2, image_size // 4)
    grid = rng.normal(size=(num_classes, channels, coarse, coarse))
    reps = math.ceil(image_size / coarse)
    protos = grid.repeat(reps, axis=2).repeat(reps, axis=3)[:, :, :image_size, :image_size]
    protos /= protos.std(axis=(1, 2, 3), keepdims=True)
    gains = rng.uniform(0.6, 1.4, size=num_domains)
    offsets = rng.normal(scale=0.8, size=(num_domains, channels, 1, 1))

    def draw(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        labels = rng.permutation(np.arange(count) % num_classes).astype(np.int64)
        domains = rng.integers(max(num_domains, 1), size=count).astype(np.int64)
        values = protos[labels] + noise * rng.normal(size=(count, channels, image_size, image_size))
        if num_domains:
            values = values * gains[domains][:, None, None, None] + offsets[domains]
        pixels = np.clip(np.rint(128.0 + 40.0 * values), 0, 255).astype(np.uint8)
        return pixels, labels, domains

    x_train, y_train, d_train = draw(num_train)
    x_test, y_test, d_test = draw(num_test)
    classes = [f"class_{i}" for i in range(num_classes)]
    if not num_domains:
        return ArrayDataset.from_arrays(name, x_train, y_train, x_test, y_test, classes)
    return ArrayDataset.from_arrays(
        name,
        x_train,
        y_train,
        x_test,
        y_test,
        classes,
        domains_train=d_train,
        domains_test=d_test,
        domain_names=[f"domain_{i}" for i in range(num_domains)],
    )


# ----------------------------------------------------------------------------------------------
# IDX files: MNIST and Fashion-MNIST
# ----------------------------------------------------------------------------------------------

_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    """Whole file contents, transparently gunzipped when it starts with the gzip magic bytes.

    Sniffing the content instead of trusting the ``.gz`` suffix accepts files that were
    decompressed or renamed by a package manager.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({exc.strerror or exc})") from exc
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt gzip data ({exc})") from exc


def parse_idx(raw: bytes, source: str) -> np.ndarray:
    """Decode the bytes of an IDX file (the MNIST format) into a native-endian array.

    The header is two zero bytes, a type code, the number of dimensions, then one big-endian
    uint32 per dimension; images are ``0x00000803`` (2051) and labels ``0x00000801`` (2049).
    The data length must match the header exactly, which catches truncated files.
    """
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise DataError(f"{source}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{source}: truncated IDX header ({len(raw)} bytes, {ndim} dimensions)")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_DTYPES[raw[2]]
    expected = math.prod(dims) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"{source}: IDX header announces shape {dims} ({expected} bytes) but the file holds "
            f"{len(raw) - header} data bytes; the file is truncated or corrupt"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def read_idx(path: str | Path, *, md5: str | None = None, content_md5: str | None = None) -> np.ndarray:
    """Read an IDX file, raw or gzipped, optionally verifying checksums.

    Parameters
    ----------
    path : str or pathlib.Path
        The file.
    md5 : str, optional
        Expected MD5 of the file as stored (the official ``.gz``).
    content_md5 : str, optional
        Expected MD5 of the decompressed contents; unlike ``md5`` it also holds for files that
        were re-compressed or unpacked, as distribution packages do.
    """
    path = Path(path)
    if md5 is not None:
        verify_checksum(path, md5=md5)
    raw = _read_bytes(path)
    if content_md5 is not None:
        actual = hashlib.md5(raw).hexdigest()
        if actual != content_md5:
            raise DataError(
                f"{path}: checksum mismatch (md5 of the decompressed data {actual}, expected "
                f"{content_md5}); the file is damaged or not the official release: delete it and fetch it again"
            )
    return parse_idx(raw, str(path))


class _IdxFile(NamedTuple):
    stem: str  # file name without ".gz"
    md5: str | None  # of the official .gz
    content_md5: str | None  # of the decompressed file


class _IdxRelease(NamedTuple):
    folder: str
    base_urls: tuple[str, ...]
    train_images: _IdxFile
    train_labels: _IdxFile
    test_images: _IdxFile
    test_labels: _IdxFile
    classes: tuple[str, ...]


_MNIST = _IdxRelease(
    folder="mnist",
    base_urls=("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
    train_images=_IdxFile("train-images-idx3-ubyte", "f68b3c2dcbeaaa9fbdd348bbdeb94873", None),
    train_labels=_IdxFile("train-labels-idx1-ubyte", "d53e105ee54ea40749a09fcbcd1e9432", None),
    test_images=_IdxFile("t10k-images-idx3-ubyte", "9fb629c4189551a2d022fa330f9573f3", None),
    test_labels=_IdxFile("t10k-labels-idx1-ubyte", "ec29112dd5afa0611ce80d1b7f02629c", None),
    classes=tuple(str(i) for i in range(10)),
)

_FASHION_MNIST = _IdxRelease(
    folder="fashion-mnist",
    base_urls=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    train_images=_IdxFile(
        "train-images-idx3-ubyte", "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "f4a8712d7a061bf5bd6d2ca38dc4d50a"
    ),
    train_labels=_IdxFile(
        "train-labels-idx1-ubyte", "25c81989df183df01b3e8a0aad5dffbe", "9018921c3c673c538a1fc5bad174d6f9"
    ),
    test_images=_IdxFile(
        "t10k-images-idx3-ubyte", "bef4ecab320f06d8554ea6380940ec79", "8181f5470baa50b63fa0f6fddb340f0a"
    ),
    test_labels=_IdxFile(
        "t10k-labels-idx1-ubyte", "bb300cfdad3c16e7a12a480ee83cd310", "15d484375f8d13e6eb1aabb0c3f46965"
    ),
    classes=(
        "T-shirt/top",
        "Trouser",
        "Pullover",
        "Dress",
        "Coat",
        "Sandal",
        "Shirt",
        "Sneaker",
        "Bag",
        "Ankle boot",
    ),
)


def _find_idx(name: str, release: _IdxRelease, spec: _IdxFile, folder: Path, download: bool) -> Path:
    """The ``.gz`` file if present, else the unpacked file, else the download (or its error)."""
    for candidate in (folder / f"{spec.stem}.gz", folder / spec.stem):
        if candidate.is_file():
            return candidate
    remote = RemoteFile(f"{spec.stem}.gz", tuple(url + f"{spec.stem}.gz" for url in release.base_urls), spec.md5)
    return fetch(name, remote, folder, download=download)


def _load_idx_release(
    name: str,
    release: _IdxRelease,
    data_dir: str | Path | None,
    cache_dir: str | Path | None,
    download: bool,
    verify: bool,
) -> ArrayDataset:
    folder = resolve_data_dir(data_dir) / release.folder
    specs = (release.train_images, release.train_labels, release.test_images, release.test_labels)
    paths = [_find_idx(name, release, spec, folder, download) for spec in specs]

    def build() -> ArrayDataset:
        arrays = []
        for spec, path in zip(specs, paths, strict=True):
            # The stored-file MD5 is only meaningful for the official .gz; the content MD5 always is.
            md5 = spec.md5 if verify and spec.content_md5 is None and path.suffix == ".gz" else None
            arrays.append(read_idx(path, md5=md5, content_md5=spec.content_md5 if verify else None))
        splits = []
        for images, labels, image_path, label_path in (
            (arrays[0], arrays[1], paths[0], paths[1]),
            (arrays[2], arrays[3], paths[2], paths[3]),
        ):
            if images.ndim != 3 or images.dtype != np.uint8:
                raise DataError(f"{image_path}: expected uint8 images (N, H, W), got {images.dtype} {images.shape}")
            if labels.shape != (len(images),):
                raise DataError(f"{label_path}: expected {len(images)} labels, got shape {labels.shape}")
            y = labels.astype(np.int64)
            if len(y) and y.max() >= len(release.classes):
                raise DataError(f"{label_path}: label {y.max()} outside [0, {len(release.classes)})")
            splits.append((images[:, None], y))
        (x_train, y_train), (x_test, y_test) = splits
        return ArrayDataset.from_arrays(name, x_train, y_train, x_test, y_test, release.classes)

    return _cached(name, {}, paths, cache_dir, build)


@DATASETS.register("mnist")
def mnist(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    download: bool = False,
    verify: bool = True,
) -> ArrayDataset:
    """MNIST from the four IDX files (``.gz`` or unpacked) in ``<data_dir>/mnist/``.

    ``verify`` checks the official MD5 of each ``.gz``; unpacked files have no published
    checksum and are checked structurally (IDX header and length).
    """
    return _load_idx_release("mnist", _MNIST, data_dir, cache_dir, download, verify)


@DATASETS.register("fashion_mnist")
def fashion_mnist(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    download: bool = False,
    verify: bool = True,
) -> ArrayDataset:
    """Fashion-MNIST from the four IDX files (``.gz`` or unpacked) in ``<data_dir>/fashion-mnist/``.

    ``verify`` checks the MD5 of the decompressed contents, which holds both for the official
    downloads and for re-compressed copies such as Debian's ``dataset-fashion-mnist``.
    """
    return _load_idx_release("fashion_mnist", _FASHION_MNIST, data_dir, cache_dir, download, verify)


# ----------------------------------------------------------------------------------------------
# Folders and archives of files
# ----------------------------------------------------------------------------------------------

_ARCHIVE_ERRORS = (OSError, EOFError, zlib.error, tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile)


class _Tree:
    """Read-only view of the files in a folder, a tar archive (any compression) or a zip archive.

    Members are named by relative POSIX paths. Hidden files and macOS ``__MACOSX`` debris are
    skipped. Reading happens in archive order, which keeps compressed tar streams sequential.
    """

    def __init__(self, source: Path) -> None:
        self.source = source
        self._tar: tarfile.TarFile | None = None
        self._zip: zipfile.ZipFile | None = None
        self._tar_members: dict[str, tarfile.TarInfo] = {}
        try:
            if source.is_dir():
                return
            if tarfile.is_tarfile(source):
                self._tar = tarfile.open(source, "r:*")  # noqa: SIM115  (closed in __exit__)
            elif zipfile.is_zipfile(source):
                self._zip = zipfile.ZipFile(source)
            else:
                raise DataError(f"{source}: not a folder, tar or zip archive")
        except _ARCHIVE_ERRORS as exc:
            raise DataError(f"{source}: cannot open ({exc})") from exc

    def __enter__(self) -> _Tree:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._tar is not None:
            self._tar.close()
        if self._zip is not None:
            self._zip.close()

    @staticmethod
    def _visible(name: str) -> bool:
        return not any(part.startswith(".") or part == "__MACOSX" for part in name.split("/"))

    def names(self) -> list[str]:
        """All visible files, as relative POSIX paths."""
        try:
            if self._tar is not None:
                for info in self._tar.getmembers():
                    name = info.name.removeprefix("./")
                    if info.isfile() and self._visible(name):
                        self._tar_members[name] = info
                return list(self._tar_members)
            if self._zip is not None:
                return [i.filename for i in self._zip.infolist() if not i.is_dir() and self._visible(i.filename)]
            found: list[str] = []
            for dirpath, dirnames, filenames in os.walk(self.source):
                dirnames[:] = sorted(d for d in dirnames if self._visible(d))
                rel = Path(dirpath).relative_to(self.source)
                found.extend((rel / f).as_posix() for f in sorted(filenames) if self._visible(f))
            return found
        except _ARCHIVE_ERRORS as exc:
            raise DataError(f"{self.source}: corrupt or unreadable ({exc})") from exc

    def read(self, names: Collection[str]) -> dict[str, bytes]:
        """Contents of the given members (which must come from :meth:`names`)."""
        wanted = set(names)
        out: dict[str, bytes] = {}
        try:
            if self._tar is not None:
                if not self._tar_members:
                    self.names()
                for name, info in self._tar_members.items():
                    if name in wanted:
                        handle = self._tar.extractfile(info)
                        if handle is None:
                            raise DataError(f"{self.source}:{name}: not a regular file")
                        out[name] = handle.read()
            elif self._zip is not None:
                for name in sorted(wanted):
                    out[name] = self._zip.read(name)
            else:
                for name in sorted(wanted):
                    out[name] = (self.source / name).read_bytes()
        except KeyError as exc:
            raise DataError(f"{self.source}: missing member {exc}") from exc
        except _ARCHIVE_ERRORS as exc:
            raise DataError(f"{self.source}: corrupt or unreadable ({exc})") from exc
        missing = wanted - set(out)
        if missing:
            raise DataError(f"{self.source}: missing {sorted(missing)[0]}")
        return out


# ----------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 python pickles
# ----------------------------------------------------------------------------------------------


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


_CIFAR10 = _CifarRelease(
    archive=RemoteFile(
        "cifar-10-python.tar.gz",
        ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
        "c58f30108f718f92721af3b95e74349a",
    ),
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
    with _Tree(source) as tree:
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


@DATASETS.register("cifar10")
def cifar10(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    download: bool = False,
    verify: bool = True,
) -> ArrayDataset:
    """CIFAR-10 from the official ``cifar-10-python.tar.gz`` (or its extracted ``cifar-10-batches-py/``).

    ``verify`` checks the tarball's official MD5 before decoding.
    """
    source = _cifar_source("cifar10", _CIFAR10, resolve_data_dir(data_dir), download)
    return _cached(
        "cifar10",
        {},
        [source],
        cache_dir,
        lambda: _read_cifar("cifar10", _CIFAR10, source, b"labels", b"label_names", verify),
    )


@DATASETS.register("cifar100")
def cifar100(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    labels: str = "fine",
    download: bool = False,
    verify: bool = True,
) -> ArrayDataset:
    """CIFAR-100 from the official ``cifar-100-python.tar.gz`` (or its extracted ``cifar-100-python/``).

    ``labels`` picks the 100 ``"fine"`` classes (the usual benchmark) or the 20 ``"coarse"``
    superclasses. ``verify`` checks the tarball's official MD5 before decoding.
    """
    if labels not in ("fine", "coarse"):
        raise ConfigError(f"cifar100: option labels must be 'fine' or 'coarse', got {labels!r}")
    source = _cifar_source("cifar100", _CIFAR100, resolve_data_dir(data_dir), download)
    label_key = f"{labels}_labels".encode()
    names_key = f"{labels}_label_names".encode()
    return _cached(
        "cifar100",
        {"labels": labels},
        [source],
        cache_dir,
        lambda: _read_cifar("cifar100", _CIFAR100, source, label_key, names_key, verify),
    )


# ----------------------------------------------------------------------------------------------
# Image decoding (optionally in a small process pool)
# ----------------------------------------------------------------------------------------------

_IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff"})
_GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F"})
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
_CHUNK = 512
_POOL_MIN_IMAGES = 4096


def _is_image(filename: str) -> bool:
    return Path(filename).suffix.lower() in _IMAGE_SUFFIXES


class _DecodeJob(NamedTuple):
    names: list[str]
    blobs: list[bytes]
    size: int | None
    mode: str
    shape: tuple[int, int, int]


def _decode_one(blob: bytes, name: str, size: int | None, mode: str) -> np.ndarray:
    """One encoded image -> ``uint8`` CHW array, converted to ``mode`` and optionally resized."""
    try:
        with Image.open(io.BytesIO(blob)) as img:
            if size is not None:
                img.draft(mode, (size, size))  # lets JPEG decode big photos at reduced scale: much faster
            converted = img.convert(mode)
        if size is not None and converted.size != (size, size):
            converted = converted.resize((size, size), Image.Resampling.BILINEAR)
        pixels = np.asarray(converted, dtype=np.uint8)
    except _DECODE_ERRORS as exc:
        raise DataError(f"{name}: cannot decode image ({exc})") from exc
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def _decode_chunk(job: _DecodeJob) -> np.ndarray:
    out = []
    for blob, name in zip(job.blobs, job.names, strict=True):
        pixels = _decode_one(blob, name, job.size, job.mode)
        if pixels.shape != job.shape:
            raise DataError(
                f"{name}: image is {pixels.shape[2]}x{pixels.shape[1]} but earlier ones are "
                f"{job.shape[2]}x{job.shape[1]}; set option image_size to resize all images"
            )
        out.append(pixels)
    return np.stack(out)


def _run_jobs(jobs: list[_DecodeJob], workers: int) -> Iterator[np.ndarray]:
    """Decode chunks in order, in a forked pool when it pays off.

    Only ``fork`` is used (Linux): ``spawn`` would re-import the user's main script in each
    worker, which breaks scripts without a ``__main__`` guard; elsewhere decoding stays serial.
    """
    total = sum(len(job.names) for job in jobs)
    use_pool = workers > 1 and total >= _POOL_MIN_IMAGES and sys.platform.startswith("linux")
    if not use_pool:
        yield from map(_decode_chunk, jobs)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_decode_chunk, jobs)


def _guess_channels(blob: bytes, name: str) -> int:
    try:
        with Image.open(io.BytesIO(blob)) as img:
            return 1 if img.mode in _GRAY_MODES else 3
    except _DECODE_ERRORS as exc:
        raise DataError(f"{name}: cannot decode image ({exc})") from exc


def _decode_all(
    blobs: Sequence[bytes], names: Sequence[str], *, image_size: int | None, channels: int, workers: int, desc: str
) -> np.ndarray:
    """Decode encoded images into one ``(N, C, H, W)`` ``uint8`` array, with a progress bar on stderr."""
    mode = "L" if channels == 1 else "RGB"
    first = _decode_one(blobs[0], names[0], image_size, mode)
    shape = (int(first.shape[0]), int(first.shape[1]), int(first.shape[2]))
    out = np.empty((len(blobs), *shape), dtype=np.uint8)
    starts = range(0, len(blobs), _CHUNK)
    jobs = [
        _DecodeJob(list(names[s : s + _CHUNK]), list(blobs[s : s + _CHUNK]), image_size, mode, shape) for s in starts
    ]
    with tqdm(total=len(blobs), desc=desc, unit="img", file=sys.stderr, disable=None) as bar:
        for start, pixels in zip(starts, _run_jobs(jobs, workers), strict=True):
            out[start : start + len(pixels)] = pixels
            bar.update(len(pixels))
    return out


# ----------------------------------------------------------------------------------------------
# Image-folder datasets: train/<class>/<image>, test/<class>/<image>
# ----------------------------------------------------------------------------------------------


def _load_split_tree(
    name: str,
    source: Path,
    *,
    classes: list[str] | None,
    image_size: int | None,
    channels: int | None,
    workers: int,
) -> ArrayDataset:
    """Read ``train/<class>/<image>`` and ``test/<class>/<image>`` from a folder or archive.

    The split and class are the last folders above each image, so archives that wrap the
    tree in one top-level folder work as they are.
    """
    groups: dict[str, dict[str, list[str]]] = {"train": {}, "test": {}}
    with _Tree(source) as tree:
        for member in tree.names():
            parts = member.split("/")
            if len(parts) >= 3 and parts[-3] in groups and _is_image(parts[-1]):
                groups[parts[-3]].setdefault(parts[-2], []).append(member)
        for split, found in groups.items():
            if not found:
                raise DataError(
                    f"{source}: no images under {split}/<class>/; expected train/<class>/<image> "
                    "and test/<class>/<image>"
                )
        if classes is None:
            class_list = sorted(groups["train"])
            orphans = sorted(set(groups["test"]) - set(class_list))
            if orphans:
                raise DataError(f"{source}: test classes {orphans} have no train images")
        else:
            class_list = classes
            missing = [c for c in class_list if c not in groups["train"]]
            if missing:
                raise DataError(f"{source}: classes {missing} have no train images; found {sorted(groups['train'])}")
        picked = {
            split: [(m, label) for label, cls in enumerate(class_list) for m in sorted(groups[split].get(cls, []))]
            for split in ("train", "test")
        }
        num_train = len(picked["train"])
        members = [m for m, _ in picked["train"] + picked["test"]]
        labels = [label for _, label in picked["train"] + picked["test"]]
        blobs = tree.read(members)
    ordered = [blobs[m] for m in members]
    names = [f"{source}:{m}" for m in members]
    if channels is None:
        channels = _guess_channels(ordered[0], names[0])
    pixels = _decode_all(ordered, names, image_size=image_size, channels=channels, workers=workers, desc=name)
    y = np.asarray(labels, dtype=np.int64)
    return ArrayDataset.from_arrays(
        name, pixels[:num_train], y[:num_train], pixels[num_train:], y[num_train:], class_list
    )


_CIFAR10_JPEG_FILE = "cifar10-jpeg.tar.gz"
_CIFAR10_JPEG_SHA256 = "ba71b9da469a0642b511b82cb7e817f919872cb21e6b3681ebca2fc4bdd50bf3"


@DATASETS.register("cifar10_jpeg")
def cifar10_jpeg(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    verify: bool = True,
    workers: int | None = None,
) -> ArrayDataset:
    """CIFAR-10 re-encoded as JPEGs, from the image-folder tarball ``<data_dir>/cifar10-jpeg.tar.gz``.

    This is the offline copy described in the shared datasets README (not an official
    release, so there is no download): ``train/<class>/NNNN.jpg`` and ``test/<class>/NNNN.jpg``
    in CIFAR-10's label order. JPEG smooths the pixels slightly, so report results as
    "CIFAR-10 (JPEG)". ``verify`` checks the tarball's SHA-256; ``workers`` decoding
    processes (default up to 2).
    """
    name = "cifar10_jpeg"
    source = resolve_data_dir(data_dir) / _CIFAR10_JPEG_FILE
    if not source.is_file():
        raise DataError(
            f"{name}: file not found: {source}. Put the CIFAR-10 JPEG image-folder tarball there "
            f"({DATA_DIR_HINT}); it has no official download: use dataset 'cifar10' for the official "
            f"files ({_CIFAR10.archive.urls[0]})"
        )
    num_workers = _workers_option(name, workers)

    def build() -> ArrayDataset:
        if verify:
            verify_checksum(source, sha256=_CIFAR10_JPEG_SHA256)
        return _load_split_tree(
            name, source, classes=list(CIFAR10_CLASSES), image_size=None, channels=3, workers=num_workers
        )

    return _cached(name, {}, [source], cache_dir, build)


@DATASETS.register("image_folder")
def image_folder(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    path: str | Path | None = None,
    classes: Sequence[str] | None = None,
    image_size: int | None = None,
    channels: int | None = None,
    workers: int | None = None,
) -> ArrayDataset:
    """Any dataset stored as ``train/<class>/<image>`` and ``test/<class>/<image>``.

    Parameters
    ----------
    path : str or pathlib.Path, optional
        Folder or archive (``.tar``, ``.tar.gz``, ``.zip``) holding the tree; relative paths are
        relative to the data dir, which is also the default.
    classes : list of str, optional
        Class folders to use, in label order; default all train class folders, sorted.
    image_size : int, optional
        Resize every image to ``image_size`` x ``image_size``; default keep the size, which
        then must be the same for all images.
    channels : int, optional
        1 (grayscale) or 3 (RGB); default from the first image.
    workers : int, optional
        Decoding processes (default up to 2).
    """
    name = "image_folder"
    source = _path_option(name, resolve_data_dir(data_dir), path, "a folder or archive with train/ and test/")
    class_list = _names_option(name, "classes", classes)
    size = _optional_int(name, "image_size", image_size, 1)
    num_channels = None if channels is None else _channels_option(name, channels)
    num_workers = _workers_option(name, workers)
    options = {"classes": class_list, "image_size": size, "channels": num_channels}
    return _cached(
        name,
        options,
        [source],
        cache_dir,
        lambda: _load_split_tree(
            name, source, classes=class_list, image_size=size, channels=num_channels, workers=num_workers
        ),
    )


# ----------------------------------------------------------------------------------------------
# Multi-domain datasets: <domain>/<class>/<image>
# ----------------------------------------------------------------------------------------------


def _pick_classes(where: str, counts: dict[str, int], classes: list[str] | int | None) -> list[str]:
    """Resolve the ``classes`` option: all (sorted), the top-k by image count (sorted), or a given list."""
    if classes is None:
        return sorted(counts)
    if isinstance(classes, int):
        if classes > len(counts):
            raise ConfigError(f"{where}: option classes={classes} but only {len(counts)} classes exist")
        top = sorted(counts, key=lambda c: (-counts[c], c))[:classes]
        return sorted(top)
    missing = [c for c in classes if c not in counts]
    if missing:
        raise DataError(f"{where}: classes {missing} not found in any selected domain")
    return classes


def _classes_option(dataset: str, value: object) -> list[str] | int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return _int_option(dataset, "classes", value, 1)
    return _names_option(dataset, "classes", value)


def _load_domain_tree(
    name: str,
    sources: Sequence[Path],
    *,
    domains: list[str] | None,
    classes: list[str] | int | None,
    image_size: int | None,
    channels: int,
    test_fraction: float,
    max_per_class: int | None,
    seed: int,
    workers: int,
) -> ArrayDataset:
    """Read ``<domain>/<class>/<image>`` trees and split every (domain, class) group train/test.

    Each group is shuffled by its own generator seeded from ``seed`` and the domain and class
    names, so the split of one group does not change when other domains or classes are
    selected. At least one image per group stays in train.
    """
    where = ", ".join(str(s) for s in sources)
    with ExitStack() as stack:
        trees = [stack.enter_context(_Tree(s)) for s in sources]
        groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for index, tree in enumerate(trees):
            for member in tree.names():
                parts = member.split("/")
                if len(parts) >= 3 and _is_image(parts[-1]):
                    groups.setdefault((parts[-3], parts[-2]), []).append((index, member))
        found_domains = sorted({d for d, _ in groups})
        if not found_domains:
            raise DataError(f"{where}: no images found; expected <domain>/<class>/<image>")
        domain_list = domains if domains is not None else found_domains
        missing = [d for d in domain_list if d not in found_domains]
        if missing:
            raise DataError(f"{where}: domains {missing} not found; found {found_domains}")
        counts: dict[str, int] = {}
        for (domain, cls), items in groups.items():
            if domain in domain_list:
                counts[cls] = counts.get(cls, 0) + len(items)
        class_list = _pick_classes(where, counts, classes)

        picked: dict[str, list[tuple[int, str, int, int]]] = {"train": [], "test": []}
        for d_index, domain in enumerate(domain_list):
            for label, cls in enumerate(class_list):
                items = sorted(groups.get((domain, cls), []))
                rng = np.random.default_rng([seed, zlib.crc32(domain.encode()), zlib.crc32(cls.encode())])
                order = rng.permutation(len(items))[:max_per_class]
                n_test = min(math.floor(len(order) * test_fraction + 0.5), max(len(order) - 1, 0))
                for split, idx in (("test", order[:n_test]), ("train", order[n_test:])):
                    picked[split].extend((*items[i], label, d_index) for i in np.sort(idx))
        selected = picked["train"] + picked["test"]
        wanted: list[set[str]] = [set() for _ in trees]
        for index, member, _, _ in selected:
            wanted[index].add(member)
        contents = [tree.read(w) for tree, w in zip(trees, wanted, strict=True)]
    if not picked["train"]:
        raise DataError(f"{where}: no images for the selected domains and classes")
    pixels = _decode_all(
        [contents[i][m] for i, m, _, _ in selected],
        [f"{sources[i]}:{m}" for i, m, _, _ in selected],
        image_size=image_size,
        channels=channels,
        workers=workers,
        desc=name,
    )
    labels = np.asarray([label for _, _, label, _ in selected], dtype=np.int64)
    domain_ids = np.asarray([d for _, _, _, d in selected], dtype=np.int64)
    n = len(picked["train"])
    return ArrayDataset.from_arrays(
        name,
        pixels[:n],
        labels[:n],
        pixels[n:],
        labels[n:],
        class_list,
        domains_train=domain_ids[:n],
        domains_test=domain_ids[n:],
        domain_names=domain_list,
    )


@DATASETS.register("domain_folder")
def domain_folder(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    path: str | Path | None = None,
    domains: Sequence[str] | None = None,
    classes: Sequence[str] | int | None = None,
    image_size: int | None = 64,
    channels: int = 3,
    test_fraction: float = 0.2,
    max_per_class: int | None = None,
    seed: int = 0,
    workers: int | None = None,
) -> ArrayDataset:
    """A multi-domain image tree ``<domain>/<class>/<image>`` (DomainNet, PACS, Office-Home style).

    Fills ``domains_train``/``domains_test``/``domain_names`` so partitioners can build
    domain-skewed (feature-skew) clients.

    Parameters
    ----------
    path : str or pathlib.Path, optional
        Folder or archive holding the domain folders; relative to the data dir (the default).
    domains : list of str, optional
        Domains to use, in id order; default all, sorted.
    classes : list of str or int, optional
        Classes in label order, or ``k`` for the ``k`` classes with most images over the
        selected domains (then sorted by name); default all, sorted.
    image_size : int or None
        Resize to ``image_size`` x ``image_size`` (default 64, since such trees mix sizes);
        ``None`` keeps the size, which then must be uniform.
    channels : int
        1 or 3 (default).
    test_fraction : float
        Share of each (domain, class) group held out for test.
    max_per_class : int, optional
        Cap on images per (domain, class), drawn at random, to keep big trees manageable.
    seed : int
        Seed of the train/test split and the capping draw.
    workers : int, optional
        Decoding processes (default up to 2).
    """
    name = "domain_folder"
    source = _path_option(name, resolve_data_dir(data_dir), path, "a folder or archive of <domain>/<class>/<image>")
    domain_list = _names_option(name, "domains", domains)
    class_choice = _classes_option(name, classes)
    size = _optional_int(name, "image_size", image_size, 1)
    num_channels = _channels_option(name, channels)
    fraction = _fraction_option(name, "test_fraction", test_fraction)
    cap = _optional_int(name, "max_per_class", max_per_class, 1)
    split_seed = _int_option(name, "seed", seed, 0)
    num_workers = _workers_option(name, workers)
    options = {
        "domains": domain_list,
        "classes": class_choice,
        "image_size": size,
        "channels": num_channels,
        "test_fraction": fraction,
        "max_per_class": cap,
        "seed": split_seed,
    }
    return _cached(
        name,
        options,
        [source],
        cache_dir,
        lambda: _load_domain_tree(
            name,
            [source],
            domains=domain_list,
            classes=class_choice,
            image_size=size,
            channels=num_channels,
            test_fraction=fraction,
            max_per_class=cap,
            seed=split_seed,
            workers=num_workers,
        ),
    )


#: DomainNet's six domains; each is one zip of ``<domain>/<class>/<image>.jpg``.
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
_DOMAINNET_URL = "http://csr.bu.edu/ftp/visda/2019/multi-source/"
# clipart and painting are served in their cleaned ("groundtruth") versions.
_DOMAINNET_FILES = {
    d: RemoteFile(f"{d}.zip", (f"{_DOMAINNET_URL}{'groundtruth/' if d in ('clipart', 'painting') else ''}{d}.zip",))
    for d in DOMAINNET_DOMAINS
}


@DATASETS.register("domainnet")
def domainnet(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    domains: Sequence[str] | None = None,
    classes: Sequence[str] | int | None = 10,
    image_size: int = 64,
    test_fraction: float = 0.2,
    max_per_class: int | None = None,
    seed: int = 0,
    download: bool = False,
    workers: int | None = None,
) -> ArrayDataset:
    """DomainNet from ``<data_dir>/domainnet/``: per domain, ``<domain>.zip`` or the extracted ``<domain>/``.

    Options are those of ``domain_folder``, with defaults suited to DomainNet's 345 classes and
    ~600,000 images: the 10 largest classes, 64x64 pixels. The official zips carry no published
    checksum, so they are checked only by reading them.
    """
    name = "domainnet"
    folder = resolve_data_dir(data_dir) / "domainnet"
    domain_list = _names_option(name, "domains", domains) or list(DOMAINNET_DOMAINS)
    unknown = sorted(set(domain_list) - set(DOMAINNET_DOMAINS))
    if unknown:
        raise ConfigError(f"{name}: unknown domains {unknown}; allowed: {', '.join(DOMAINNET_DOMAINS)}")
    class_choice = _classes_option(name, classes)
    size = _int_option(name, "image_size", image_size, 1)
    fraction = _fraction_option(name, "test_fraction", test_fraction)
    cap = _optional_int(name, "max_per_class", max_per_class, 1)
    split_seed = _int_option(name, "seed", seed, 0)
    num_workers = _workers_option(name, workers)
    sources: list[Path] = []
    if any((folder / d).is_dir() for d in domain_list):
        sources.append(folder)
    sources.extend(
        fetch(name, _DOMAINNET_FILES[d], folder, download=download) for d in domain_list if not (folder / d).is_dir()
    )
    options = {
        "domains": domain_list,
        "classes": class_choice,
        "image_size": size,
        "test_fraction": fraction,
        "max_per_class": cap,
        "seed": split_seed,
    }
    return _cached(
        name,
        options,
        sources,
        cache_dir,
        lambda: _load_domain_tree(
            name,
            sources,
            domains=domain_list,
            classes=class_choice,
            image_size=size,
            channels=3,
            test_fraction=fraction,
            max_per_class=cap,
            seed=split_seed,
            workers=num_workers,
        ),
    )


# ----------------------------------------------------------------------------------------------
# Tiny ImageNet
# ----------------------------------------------------------------------------------------------

_TINY_IMAGENET = RemoteFile("tiny-imagenet-200.zip", ("http://cs231n.stanford.edu/tiny-imagenet-200.zip",))


def _find_member(names: Sequence[str], suffix: str, source: Path) -> str:
    for member in names:
        if member == suffix or member.endswith("/" + suffix):
            return member
    raise DataError(f"{source}: no {suffix} inside (not a Tiny ImageNet archive?)")


def _read_tiny_imagenet(source: Path, image_size: int, workers: int) -> ArrayDataset:
    """Train images from ``train/<wnid>/images/``; the labelled ``val/`` split serves as test."""
    with _Tree(source) as tree:
        names = tree.names()
        wnids_member = _find_member(names, "wnids.txt", source)
        notes_member = _find_member(names, "val/val_annotations.txt", source)
        text = tree.read([wnids_member, notes_member])
        wnids = text[wnids_member].decode().split()
        index = {w: i for i, w in enumerate(wnids)}
        val_wnid = {}
        for line in text[notes_member].decode().splitlines():
            fields = line.split("\t")
            if len(fields) >= 2:
                val_wnid[fields[0]] = fields[1]
        train: list[tuple[str, int]] = []
        test: list[tuple[str, int]] = []
        for member in sorted(names):
            parts = member.split("/")
            if not _is_image(parts[-1]) or len(parts) < 3 or parts[-2] != "images":
                continue
            if len(parts) >= 4 and parts[-4] == "train" and parts[-3] in index:
                train.append((member, index[parts[-3]]))
            elif parts[-3] == "val":
                if val_wnid.get(parts[-1]) not in index:
                    raise DataError(f"{source}:{member}: no valid label in val_annotations.txt")
                test.append((member, index[val_wnid[parts[-1]]]))
        if not train or not test:
            raise DataError(f"{source}: no train/<wnid>/images/ or val/images/ pictures found")
        blobs = tree.read([m for m, _ in train + test])
    members = train + test
    pixels = _decode_all(
        [blobs[m] for m, _ in members],
        [f"{source}:{m}" for m, _ in members],
        image_size=image_size,
        channels=3,
        workers=workers,
        desc="tiny_imagenet",
    )
    y = np.asarray([label for _, label in members], dtype=np.int64)
    n = len(train)
    return ArrayDataset.from_arrays("tiny_imagenet", pixels[:n], y[:n], pixels[n:], y[n:], wnids)


@DATASETS.register("tiny_imagenet")
def tiny_imagenet(
    data_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    image_size: int = 64,
    download: bool = False,
    workers: int | None = None,
) -> ArrayDataset:
    """Tiny ImageNet (200 classes, 64x64) from ``<data_dir>/tiny-imagenet-200.zip`` or its extracted folder.

    The labelled validation split is used as the test split (the official test split has no
    labels). Class names are the WordNet ids of ``wnids.txt``, in its order. No checksum is
    published, so the archive is checked only by reading it.
    """
    name = "tiny_imagenet"
    root = resolve_data_dir(data_dir)
    size = _int_option(name, "image_size", image_size, 1)
    num_workers = _workers_option(name, workers)
    extracted = root / "tiny-imagenet-200"
    source = extracted if extracted.is_dir() else fetch(name, _TINY_IMAGENET, root, download=download)
    return _cached(
        name, {"image_size": size}, [source], cache_dir, lambda: _read_tiny_imagenet(source, size, num_workers)
    )
