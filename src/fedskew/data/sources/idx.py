"""IDX files (the MNIST format): MNIST and Fashion-MNIST."""

from __future__ import annotations

import gzip
import hashlib
import math
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedskew.core.errors import DataError
from fedskew.data.download import RemoteFile, fetch, verify_checksum
from fedskew.data.sources.base import DATASETS, FilesParams, cached
from fedskew.data.sources.container import ArrayDataset

__all__ = ["parse_idx", "read_idx"]

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
    name: str, release: _IdxRelease, p: FilesParams, data_dir: Path, cache_dir: str | Path | None
) -> ArrayDataset:
    folder = data_dir / release.folder
    specs = (release.train_images, release.train_labels, release.test_images, release.test_labels)
    paths = [_find_idx(name, release, spec, folder, p.download) for spec in specs]

    def build() -> ArrayDataset:
        arrays = []
        for spec, path in zip(specs, paths, strict=True):
            # The stored-file MD5 is only meaningful for the official .gz; the content MD5 always is.
            md5 = spec.md5 if p.verify and spec.content_md5 is None and path.suffix == ".gz" else None
            arrays.append(read_idx(path, md5=md5, content_md5=spec.content_md5 if p.verify else None))
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

    return cached(name, {}, paths, cache_dir, build, verify=p.verify)


@DATASETS.register("mnist", params=FilesParams)
def mnist(p: FilesParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """MNIST from the four IDX files (``.gz`` or unpacked) in ``<data_dir>/mnist/``.

    ``verify`` checks the official MD5 of each ``.gz``; unpacked files have no published
    checksum and are checked structurally (IDX header and length).
    """
    return _load_idx_release("mnist", _MNIST, p, data_dir, cache_dir)


@DATASETS.register("fashion_mnist", params=FilesParams)
def fashion_mnist(p: FilesParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """Fashion-MNIST from the four IDX files (``.gz`` or unpacked) in ``<data_dir>/fashion-mnist/``.

    ``verify`` checks the MD5 of the decompressed contents, which holds both for the official
    downloads and for re-compressed copies such as Debian's ``dataset-fashion-mnist``.
    """
    return _load_idx_release("fashion_mnist", _FASHION_MNIST, p, data_dir, cache_dir)
