"""The dataset registry, its typed options, the data dir and the public entry point :func:`load_dataset`.

Every loader is registered in :data:`DATASETS` with a Params dataclass (a subclass of
:class:`DatasetParams`) that declares its options, their defaults and allowed ranges, so a config
table is checked before any file is read. A loader is called as ``loader(params, data_dir,
cache_dir)`` and returns an :class:`~fedskew.data.sources.container.ArrayDataset`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from fedskew.core.errors import ConfigError, DataError
from fedskew.core.params import Options, maximums, minimums
from fedskew.core.registry import Registry
from fedskew.data.cache import ArrayCache, Entry, resolve_cache_dir, resolve_folder
from fedskew.data.download import DATA_DIR_HINT
from fedskew.data.sources.container import ArrayDataset

__all__ = [
    "DATASETS",
    "DatasetParams",
    "DecodeParams",
    "FilesParams",
    "Loader",
    "load_dataset",
    "resolve_data_dir",
]


# ----------------------------------------------------------------------------------------------
# Typed options
# ----------------------------------------------------------------------------------------------


class DatasetParams(Options, kw_only=True):
    """Keys every ``[dataset]`` table may hold besides ``name``; each dataset's Params adds its options.

    Attributes
    ----------
    data_dir : str or None
        Folder with the dataset files (``--data-dir`` overrides it); see :func:`resolve_data_dir`.
    train_fraction : float
        Share of the training split to keep, in (0, 1]; the engine applies it with
        :meth:`ArrayDataset.train_subset`, not the loader.
    normalize : bool
        Standardise each channel with the training split's mean and std (the default); ``false``: the raw
        pixels in [0, 1], as NIID-Bench feeds its models (``transforms.ToTensor()`` alone). The engine applies
        it, not the loader.
    """

    data_dir: str | None = None
    train_fraction: float = 1.0
    normalize: bool = True

    positive: ClassVar[tuple[str, ...]] = ("train_fraction",)  # a dataset's Params may add its own
    at_most = maximums(train_fraction=1)


class FilesParams(DatasetParams, kw_only=True):
    """Options of a dataset read from official release files.

    Attributes
    ----------
    download : bool
        Fetch missing files from the official URLs (never done unless asked).
    verify : bool
        Check the published checksums before decoding.
    """

    download: bool = False
    verify: bool = True


class DecodeParams(DatasetParams, kw_only=True):
    """Options of a dataset of encoded images.

    Attributes
    ----------
    workers : int or None
        Decoding processes, >= 1; default up to 2.
    """

    workers: int | None = None

    at_least = minimums(workers=1)

    def num_workers(self) -> int:
        """``workers``, or up to 2 (the CPUs there are) when not set."""
        return self.workers if self.workers is not None else min(2, os.cpu_count() or 1)


# ----------------------------------------------------------------------------------------------
# Registry, data dir and the public entry point
# ----------------------------------------------------------------------------------------------

Loader = Callable[[Any, Path, str | Path | None], ArrayDataset]
"""``loader(params, data_dir, cache_dir) -> ArrayDataset`` with the registered Params and a resolved data dir."""

#: Dataset loaders by name, each registered with its Params class.
DATASETS: Registry[Loader] = Registry("dataset", DatasetParams)


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    """Folder holding dataset files: explicit argument > ``$FEDSKEW_DATA`` > ``~/.cache/fedskew/data``."""
    return resolve_folder(data_dir, "FEDSKEW_DATA", "data")


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
        Dataset-specific options (the fields of its Params class, ``DATASETS.params_of(name)``).
        Unknown options raise :class:`~fedskew.core.errors.ConfigError` listing the allowed ones,
        so a typo in a config file is reported instead of being silently ignored.
    """
    if "train_fraction" in options:
        raise ConfigError("dataset.train_fraction is not an option of load_dataset; use ArrayDataset.train_subset")
    if "normalize" in options:
        raise ConfigError("dataset.normalize is not an option of load_dataset; ArrayDataset.to_tensors standardises "
                          "with its mean and std (set them to 0 and 1 for raw pixels)")
    params = DATASETS.build_params(name, options, prefix="dataset.")
    return DATASETS.get(name)(params, resolve_data_dir(data_dir), cache_dir)


def resolve_path(dataset: str, root: Path, path: str | Path | None, expected: str) -> Path:
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
# The array cache
# ----------------------------------------------------------------------------------------------


def cached(
    name: str,
    options: dict[str, Any],
    sources: Sequence[Path],
    cache_dir: str | Path | None,
    build: Callable[[], ArrayDataset],
    *,
    verify: bool | None = None,
) -> ArrayDataset:
    """Return ``build()``'s dataset, from the array cache when the sources are unchanged.

    ``verify``: the dataset's ``verify`` option, for a dataset whose sources have published checksums
    (``build`` checks them when it is true); the cache keys it, so an unverified entry never serves
    a verified load.
    """
    cache = ArrayCache(resolve_cache_dir(cache_dir))
    entry = cache.get_or_build(name, options, sources, lambda: _to_entry(build()), verified=verify)
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
