"""Decoding encoded images (optionally in a small process pool), and image-folder datasets.

``image_folder`` reads any ``train/<class>/<image>`` + ``test/<class>/<image>`` tree from a folder or
an archive; ``cifar10_jpeg`` is the offline JPEG copy of CIFAR-10 stored that way.
"""

from __future__ import annotations

import io
import multiprocessing
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image
from tqdm import tqdm

from fedskew.core.errors import DataError
from fedskew.core.params import maximums, minimums
from fedskew.data.download import DATA_DIR_HINT, verify_checksum
from fedskew.data.sources.archive import Tree
from fedskew.data.sources.base import DATASETS, DecodeParams, cached, resolve_path
from fedskew.data.sources.checks import MAX_IMAGE_SIZE, check_channels, check_names, check_path
from fedskew.data.sources.cifar import CIFAR10_ARCHIVE, CIFAR10_CLASSES
from fedskew.data.sources.container import ArrayDataset

__all__ = ["ImageFolderParams", "JpegParams", "decode_all", "is_image"]

_IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff"})
_GRAY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F"})
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
_CHUNK = 512
_POOL_MIN_IMAGES = 4096


def is_image(filename: str) -> bool:
    """Whether ``filename`` has the suffix of an image format (any case)."""
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


def decode_all(
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
    with Tree(source) as tree:
        for member in tree.names():
            parts = member.split("/")
            if len(parts) >= 3 and parts[-3] in groups and is_image(parts[-1]):
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
    pixels = decode_all(ordered, names, image_size=image_size, channels=channels, workers=workers, desc=name)
    y = np.asarray(labels, dtype=np.int64)
    return ArrayDataset.from_arrays(
        name, pixels[:num_train], y[:num_train], pixels[num_train:], y[num_train:], class_list
    )


_CIFAR10_JPEG_FILE = "cifar10-jpeg.tar.gz"
_CIFAR10_JPEG_SHA256 = "ba71b9da469a0642b511b82cb7e817f919872cb21e6b3681ebca2fc4bdd50bf3"


class JpegParams(DecodeParams, kw_only=True):
    """Options of ``cifar10_jpeg``: ``verify`` checks the tarball's SHA-256."""

    verify: bool = True


@DATASETS.register("cifar10_jpeg", params=JpegParams)
def cifar10_jpeg(p: JpegParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """CIFAR-10 re-encoded as JPEGs, from the image-folder tarball ``<data_dir>/cifar10-jpeg.tar.gz``.

    This is the offline copy described in the shared datasets README (not an official
    release, so there is no download): ``train/<class>/NNNN.jpg`` and ``test/<class>/NNNN.jpg``
    in CIFAR-10's label order. JPEG smooths the pixels slightly, so report results as
    "CIFAR-10 (JPEG)". ``verify`` checks the tarball's SHA-256; ``workers`` decoding
    processes (default up to 2).
    """
    name = "cifar10_jpeg"
    source = data_dir / _CIFAR10_JPEG_FILE
    if not source.is_file():
        raise DataError(
            f"{name}: file not found: {source}. Put the CIFAR-10 JPEG image-folder tarball there "
            f"({DATA_DIR_HINT}); it has no official download: use dataset 'cifar10' for the official "
            f"files ({CIFAR10_ARCHIVE.urls[0]})"
        )
    num_workers = p.num_workers()

    def build() -> ArrayDataset:
        if p.verify:
            verify_checksum(source, sha256=_CIFAR10_JPEG_SHA256)
        return _load_split_tree(
            name, source, classes=list(CIFAR10_CLASSES), image_size=None, channels=3, workers=num_workers
        )

    return cached(name, {}, [source], cache_dir, build, verify=p.verify)


class ImageFolderParams(DecodeParams, kw_only=True):
    """Options of ``image_folder``.

    Attributes
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
    """

    path: str | Path | None = None
    classes: list[str] | None = None
    image_size: int | None = None
    channels: int | None = None

    at_least = minimums(image_size=1)
    at_most = maximums(image_size=MAX_IMAGE_SIZE)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_path(self.path)
        check_names("classes", self.classes)
        check_channels(self.channels, optional=True)


@DATASETS.register("image_folder", params=ImageFolderParams)
def image_folder(p: ImageFolderParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """Any dataset stored as ``train/<class>/<image>`` and ``test/<class>/<image>`` (see :class:`ImageFolderParams`)."""
    name = "image_folder"
    source = resolve_path(name, data_dir, p.path, "a folder or archive with train/ and test/")
    num_workers = p.num_workers()
    options = {"classes": p.classes, "image_size": p.image_size, "channels": p.channels}
    return cached(
        name,
        options,
        [source],
        cache_dir,
        lambda: _load_split_tree(
            name, source, classes=p.classes, image_size=p.image_size, channels=p.channels, workers=num_workers
        ),
    )
