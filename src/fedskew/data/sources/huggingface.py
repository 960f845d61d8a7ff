"""Hugging Face ``datasets`` as a source: ``huggingface`` (optional extra: ``pip install -e '.[huggingface]'``
in fedskew's clone).

It reads a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, a folder of data
files that ``datasets.load_dataset`` reads (parquet, arrow, an image folder ...), or a dataset that
``datasets.load_dataset`` has put in the local Hugging Face cache. fedskew never reaches the Hub: every
call runs in the library's offline mode. The image column (an ``Image`` feature or pixel arrays) becomes
the same ``uint8`` NCHW arrays every other source gives, the label column (a ``ClassLabel`` or integers)
the labels, and the result is cached like the other sources.

``datasets`` is imported only when such a dataset is validated or loaded, never by ``import fedskew``.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fedskew.core.errors import DataError, FedskewError
from fedskew.core.params import check, maximums, minimums
from fedskew.data.download import DATA_DIR_HINT
from fedskew.data.sources.base import DATASETS, DecodeParams, cached
from fedskew.data.sources.checks import MAX_IMAGE_SIZE, check_channels, check_names, check_path
from fedskew.data.sources.container import ArrayDataset
from fedskew.data.sources.images import _guess_channels, decode_all

__all__ = ["MISSING_DATASETS", "HuggingFaceParams"]

MISSING_DATASETS = ("dataset 'huggingface' needs the datasets package: pip install -e '.[huggingface]' in "
                    "fedskew's clone")

_NAME = "huggingface"
_SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes (DatasetDict, Dataset)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_SPLIT_SEED = 0  # test_fraction's hold-out is part of the dataset, the same for every run and seed
_SHOWN = 20  # label names listed in an error at most


def _datasets_installed() -> bool:
    return importlib.util.find_spec("datasets") is not None


def _import_datasets() -> Any:
    if not _datasets_installed():
        raise FedskewError(MISSING_DATASETS)
    try:
        import datasets
    except ImportError as exc:
        raise FedskewError(f"{MISSING_DATASETS} (importing it failed: {exc})") from None
    return datasets


class HuggingFaceParams(DecodeParams, kw_only=True):
    """Options of ``huggingface``.

    Attributes
    ----------
    path : str or pathlib.Path, optional
        A folder written by ``save_to_disk``, a folder of data files ``datasets.load_dataset`` reads, or
        the name of a dataset in the local Hugging Face cache (``"ylecun/mnist"``). A relative path is
        relative to the data dir, which is also the default; a name is used when no such folder exists.
    image_column, label_column : str
        The columns holding the images (an ``Image`` feature or pixel arrays) and the labels (a
        ``ClassLabel`` feature or integers).
    train_split, test_split : str
        The splits used for training and testing (a ``DatasetDict``'s keys).
    test_fraction : float, optional
        Hold out this share of each class of the train split as the test set (drawn with a fixed seed)
        instead of reading ``test_split``; needed for a ``Dataset`` saved alone, which has no splits.
    classes : list of str, optional
        Label names to use, in label order; other images are left out. Default all, in the
        ``ClassLabel``'s order, else the sorted label values.
    image_size : int, optional
        Resize every image to ``image_size`` x ``image_size``; default keep the size, which then must be
        the same for all images.
    channels : int, optional
        1 (grayscale) or 3 (RGB); default from the first image.
    """

    path: str | Path | None = None
    image_column: str = "image"
    label_column: str = "label"
    train_split: str = "train"
    test_split: str = "test"
    test_fraction: float | None = None
    classes: list[str] | None = None
    image_size: int | None = None
    channels: int | None = None

    at_least = minimums(image_size=1)
    at_most = maximums(image_size=MAX_IMAGE_SIZE)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not _datasets_installed():
            raise FedskewError(MISSING_DATASETS)
        check_path(self.path)
        for key in ("image_column", "label_column", "train_split", "test_split"):
            check(getattr(self, key) != "", key, getattr(self, key), "a non-empty name")
        fraction = self.test_fraction  # an open interval: no declaration says it
        check(fraction is None or 0 < fraction < 1, "test_fraction", fraction, "a number in (0, 1)")
        check_names("classes", self.classes)
        check_channels(self.channels, optional=True)


@DATASETS.register(_NAME, params=HuggingFaceParams)
def huggingface(p: HuggingFaceParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """A Hugging Face dataset from a local folder or the local Hugging Face cache (see :class:`HuggingFaceParams`)."""
    hf = _import_datasets()
    local = _local_folder(data_dir, p.path)
    options: dict[str, Any] = {
        key: getattr(p, key)
        for key in ("image_column", "label_column", "train_split", "test_split", "test_fraction", "classes",
                    "image_size", "channels")
    }
    workers = p.num_workers()
    if local is not None:  # the folder's files key the cache: a hit needs no call into datasets
        source = str(local)
        return cached(_NAME, options, [local], cache_dir, lambda: _build(p, _open(hf, local, source), source, workers))
    source = str(p.path)
    opened = _open(hf, None, source)
    splits = opened.values() if isinstance(opened, hf.DatasetDict) else [opened]
    files = sorted({Path(f["filename"]) for ds in splits for f in ds.cache_files})
    options["hub"] = {"name": source, "fingerprints": [ds._fingerprint for ds in splits]}
    return cached(_NAME, options, files, cache_dir, lambda: _build(p, opened, source, workers))


# ----------------------------------------------------------------------------------------------
# Finding and opening the dataset, offline
# ----------------------------------------------------------------------------------------------


def _local_folder(data_dir: Path, path: str | Path | None) -> Path | None:
    """The local file or folder ``path`` names, or None for a name to look up in the Hugging Face cache."""
    if path is None:
        resolved = data_dir
    else:
        resolved = Path(path).expanduser()
        if not resolved.is_absolute():
            resolved = data_dir / resolved
    if resolved.exists():
        return resolved
    if path is not None and not Path(path).is_absolute() and _HUB_ID.fullmatch(str(path)):
        return None
    raise DataError(
        f"{_NAME}: {resolved} not found; set option path to a folder written by save_to_disk, a folder of data "
        f"files, or the name of a dataset in the local Hugging Face cache (relative paths are relative to the "
        f"data dir; {DATA_DIR_HINT})"
    )


@contextmanager
def _offline(hf: Any) -> Iterator[None]:
    """Switch ``datasets`` and ``huggingface_hub`` to offline mode for the block, whatever the environment says."""
    import huggingface_hub.constants as hub

    switches = [(hf.config, "HF_DATASETS_OFFLINE"), (hf.config, "HF_HUB_OFFLINE"), (hub, "HF_HUB_OFFLINE")]
    present = [(module, attr, getattr(module, attr)) for module, attr in switches if hasattr(module, attr)]
    for module, attr, _ in present:
        setattr(module, attr, True)
    try:
        yield
    finally:
        for module, attr, value in present:
            setattr(module, attr, value)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _open(hf: Any, local: Path | None, source: str) -> Any:
    """``load_from_disk`` for a save_to_disk folder, else ``load_dataset``, both offline."""
    failures: tuple[type[BaseException], ...] = (OSError, ValueError)
    library_error = getattr(getattr(hf, "exceptions", None), "DatasetsError", None)
    if isinstance(library_error, type) and issubclass(library_error, Exception):
        failures = (*failures, library_error)
    with _offline(hf):
        if local is not None and any((local / marker).is_file() for marker in _SAVED_MARKERS):
            try:
                return hf.load_from_disk(str(local))
            except failures as exc:
                raise DataError(f"{_NAME}: cannot read the saved dataset {local} ({_first_line(exc)})") from None
        try:
            return hf.load_dataset(source)
        except failures as exc:
            if local is not None:
                raise DataError(
                    f"{_NAME}: datasets.load_dataset cannot open {local} ({_first_line(exc)}); allowed: a folder "
                    "written by save_to_disk, or a folder of data files load_dataset reads"
                ) from None
            raise DataError(
                f"{_NAME}: {source!r} is neither a folder under the data dir nor a dataset in the local Hugging Face "
                f"cache ({hf.config.HF_DATASETS_CACHE}), and fedskew never downloads from the Hub: run "
                f"datasets.load_dataset({source!r}) once where the Hub is reachable, or save_to_disk a copy and set "
                "path to its folder"
            ) from None


# ----------------------------------------------------------------------------------------------
# Splits, labels and images -> arrays
# ----------------------------------------------------------------------------------------------


Part = tuple[str, Any, np.ndarray]
"""(split name, ``datasets.Dataset``, the rows of it to use)."""


def _build(p: HuggingFaceParams, opened: Any, source: str, workers: int) -> ArrayDataset:
    hf = _import_datasets()
    parts: list[Part] = list(_splits(hf, p, opened, source))
    names, labels = _labels(hf, p.label_column, source, parts[0], parts[1])
    if p.classes is not None:
        names, labels = _pick_classes(p.classes, names, labels, source)
        kept = [y >= 0 for y in labels]
        parts = [(split, ds, rows[keep]) for (split, ds, rows), keep in zip(parts, kept, strict=True)]
        labels = [y[keep] for y, keep in zip(labels, kept, strict=True)]
    channels = p.channels
    arrays = []
    for split, ds, rows in parts:
        if len(rows) == 0:
            used = f" of classes {list(p.classes)}" if p.classes is not None else ""
            raise DataError(f"{_NAME}: {source} split {split!r} has no images{used}")
        column = _column(ds, p.image_column, "image_column", source, split)
        pixels, channels = _images(hf, ds, column, rows, f"{source}:{split}", p.image_size, channels, workers)
        arrays.append(pixels)
    return ArrayDataset.from_arrays(_NAME, arrays[0], labels[0], arrays[1], labels[1], names)


def _splits(hf: Any, p: HuggingFaceParams, opened: Any, source: str) -> tuple[Part, Part]:
    if isinstance(opened, hf.DatasetDict):
        available = ", ".join(sorted(opened))
        if p.train_split not in opened:
            raise DataError(
                f"{_NAME}: {source} has no split train_split = {p.train_split!r}; allowed: {available}"
            )
        base = opened[p.train_split]
        if p.test_fraction is None:
            if p.test_split not in opened:
                raise DataError(
                    f"{_NAME}: {source} has no split test_split = {p.test_split!r}; allowed: {available} (or set "
                    "test_fraction to hold out a share of the train split)"
                )
            test = opened[p.test_split]
            return (p.train_split, base, np.arange(len(base))), (p.test_split, test, np.arange(len(test)))
    else:
        if p.test_fraction is None:
            raise DataError(
                f"{_NAME}: {source} holds a single Dataset (no splits); set test_fraction to hold out a share of it "
                "as the test set, or save a DatasetDict with train and test splits"
            )
        base = opened
    column = _column(base, p.label_column, "label_column", source, p.train_split)
    train_rows, test_rows = _hold_out(_raw_labels(hf, base, column, source, p.train_split), p.test_fraction)
    return (p.train_split, base, train_rows), (f"{p.train_split} (held out)", base, test_rows)


def _hold_out(labels: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a stratified split: ``round(fraction * n_c)`` of each class to the test set, one kept for training."""
    rng = np.random.default_rng(_SPLIT_SEED)
    held = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        take = min(round(fraction * len(rows)), len(rows) - 1)
        held.append(rng.choice(rows, size=take, replace=False))
    test_rows = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    return np.setdiff1d(np.arange(len(labels)), test_rows), test_rows


def _column(ds: Any, column: str, key: str, source: str, split: str) -> Any:
    """The feature of ``column``; a one-line error lists the columns there are."""
    if column not in ds.features:
        raise DataError(
            f"{_NAME}: {source} split {split!r} has no column {key} = {column!r}; allowed: {', '.join(ds.features)}"
        )
    return column


def _raw_labels(hf: Any, ds: Any, column: str, source: str, split: str) -> np.ndarray:
    feature = ds.features[column]
    dtype = getattr(feature, "dtype", "")
    if not isinstance(feature, hf.ClassLabel) and not re.fullmatch(r"u?int(8|16|32|64)", str(dtype)):
        kind = f"{dtype} values" if isinstance(feature, hf.Value) else f"a {type(feature).__name__} feature"
        raise DataError(
            f"{_NAME}: {source} split {split!r}: label column {column!r} holds {kind}; allowed: integer labels or a "
            f"ClassLabel feature (string labels: dataset.class_encode_column({column!r}))"
        )
    values = np.asarray(ds.with_format("numpy", columns=[column])[:][column])
    if values.dtype.kind not in "iu":
        raise DataError(f"{_NAME}: {source} split {split!r}: label column {column!r} has missing labels")
    return values.astype(np.int64)


def _labels(hf: Any, column: str, source: str, train: Part, test: Part) -> tuple[list[str], list[np.ndarray]]:
    """Class names and each part's labels in ``[0, len(names))``."""
    raw = []
    for split, ds, rows in (train, test):
        _column(ds, column, "label_column", source, split)
        raw.append(_raw_labels(hf, ds, column, source, split)[rows])
    feature = train[1].features[column]
    if isinstance(feature, hf.ClassLabel):
        names = [str(n) for n in feature.names]
        test_feature = test[1].features[column]
        if not isinstance(test_feature, hf.ClassLabel) or list(test_feature.names) != list(feature.names):
            raise DataError(f"{_NAME}: {source}: the {test[0]!r} split's label names differ from the train split's")
        for (split, _, _), y in zip((train, test), raw, strict=True):
            bad = y[(y < 0) | (y >= len(names))]
            if len(bad):
                raise DataError(
                    f"{_NAME}: {source} split {split!r}: label {int(bad[0])} in column {column!r}; allowed: labels "
                    f"in [0, {len(names)}) (-1 marks an unlabelled example)"
                )
        return names, raw
    values = np.unique(raw[0])
    orphans = np.setdiff1d(np.unique(raw[1]), values)
    if len(orphans):
        raise DataError(f"{_NAME}: {source}: test labels {orphans.tolist()} have no train images")
    return [str(v) for v in values.tolist()], [np.searchsorted(values, y).astype(np.int64) for y in raw]


def _pick_classes(
    classes: Sequence[str], names: list[str], labels: list[np.ndarray], source: str
) -> tuple[list[str], list[np.ndarray]]:
    """Keep the images of ``classes`` only, relabelled in that order (the rows are filtered by the caller)."""
    unknown = [c for c in classes if c not in names]
    if unknown:
        shown = ", ".join(names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
        raise DataError(f"{_NAME}: {source}: classes {unknown} are not label names; allowed: {shown}")
    lookup = np.full(len(names), -1, dtype=np.int64)
    lookup[[names.index(c) for c in classes]] = np.arange(len(classes))
    return list(classes), [lookup[y] for y in labels]


def _images(
    hf: Any, ds: Any, column: str, rows: np.ndarray, where: str, size: int | None, channels: int | None, workers: int
) -> tuple[np.ndarray, int]:
    """The ``rows`` of ``column`` as ``(N, C, H, W)`` ``uint8``, and C (``channels``, else the first image's)."""
    names = [f"{where}[{r}]" for r in rows]
    if isinstance(ds.features[column], hf.Image):
        records = _encoded(hf, ds, column)
        blobs = [_blob(records[r], name) for r, name in zip(rows, names, strict=True)]
        if channels is None:
            channels = _guess_channels(blobs[0], names[0])
        pixels = decode_all(blobs, names, image_size=size, channels=channels, workers=workers, desc=f"{_NAME} {where}")
        return pixels, channels
    arrays = _pixel_arrays(hf, ds, column, where)
    if channels is None:
        channels = 1 if _hwc(np.asarray(arrays[rows[0]]), names[0]).ndim == 2 else 3
    mode = "L" if channels == 1 else "RGB"
    out = [_array_pixels(arrays[r], name, size, mode) for r, name in zip(rows, names, strict=True)]
    odd = next((i for i, a in enumerate(out) if a.shape != out[0].shape), None)
    if odd is not None:
        raise DataError(
            f"{names[odd]}: image is {out[odd].shape[2]}x{out[odd].shape[1]} but earlier ones are "
            f"{out[0].shape[2]}x{out[0].shape[1]}; set option image_size to resize all images"
        )
    return np.stack(out), channels


def _encoded(hf: Any, ds: Any, column: str) -> list[dict[str, Any]]:
    """The ``Image`` column undecoded: one ``{"bytes", "path"}`` record per row."""
    plain = ds.select_columns([column]).cast_column(column, hf.Image(decode=False))
    return list(plain.with_format(None)[:][column])


def _blob(record: dict[str, Any], name: str) -> bytes:
    if record.get("bytes") is not None:
        return bytes(record["bytes"])
    path = record.get("path")
    if not path:
        raise DataError(f"{name}: the image is empty (no bytes and no path)")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise DataError(f"{name}: cannot read the image file {path} ({exc.strerror or exc})") from None


def _pixel_arrays(hf: Any, ds: Any, column: str, where: str) -> Any:
    feature = ds.features[column]
    if isinstance(feature, hf.Value | hf.ClassLabel):
        kind = f"{feature.dtype} values" if isinstance(feature, hf.Value) else "class labels"
        raise DataError(
            f"{where}: image column {column!r} holds {kind}; allowed: an Image feature or arrays of pixels"
        )
    return ds.with_format("numpy", columns=[column])[:][column]


def _hwc(a: np.ndarray, name: str) -> np.ndarray:
    """A pixel array as ``(H, W)`` or ``(H, W, C)`` with C = 3 or 4; ``(C, H, W)`` is transposed."""
    if a.ndim == 3 and a.shape[-1] not in (1, 3, 4) and a.shape[0] in (1, 3):
        a = a.transpose(1, 2, 0)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[-1] in (3, 4))):
        raise DataError(
            f"{name}: a pixel array of shape {a.shape}; allowed: (H, W), (H, W, C) or (C, H, W) with C = 1 or 3 "
            "(4: RGBA, alpha dropped)"
        )
    if a.dtype.kind not in "iu" or (a.size and (int(a.min()) < 0 or int(a.max()) > 255)):
        raise DataError(f"{name}: pixels of type {a.dtype}; allowed: uint8 (or integers in [0, 255])")
    return a


def _array_pixels(array: Any, name: str, size: int | None, mode: str) -> np.ndarray:
    """One pixel array -> ``uint8`` CHW, converted to ``mode`` and resized as an image file would be."""
    image = Image.fromarray(np.ascontiguousarray(_hwc(np.asarray(array), name), dtype=np.uint8)).convert(mode)
    if size is not None and image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)
