"""Multi-domain image trees ``<domain>/<class>/<image>``: any such folder or archive, and DomainNet.

Both fill ``domains_train``/``domains_test``/``domain_names`` so partitioners can build
domain-skewed (feature-skew) clients.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from fedskew.core.errors import ConfigError, DataError
from fedskew.core.params import check, maximums, minimums
from fedskew.data.download import RemoteFile, fetch
from fedskew.data.sources.archive import Tree
from fedskew.data.sources.base import DATASETS, DecodeParams, cached, resolve_path
from fedskew.data.sources.checks import MAX_IMAGE_SIZE, check_channels, check_min, check_names, check_path
from fedskew.data.sources.container import ArrayDataset
from fedskew.data.sources.images import decode_all, is_image

__all__ = ["DOMAINNET_DOMAINS", "DomainFolderParams", "DomainNetParams", "DomainSplitParams"]

#: DomainNet's six domains; each is one zip of ``<domain>/<class>/<image>.jpg``.
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
_DOMAINNET_URL = "http://csr.bu.edu/ftp/visda/2019/multi-source/"
# clipart and painting are served in their cleaned ("groundtruth") versions.
_DOMAINNET_FILES = {
    d: RemoteFile(f"{d}.zip", (f"{_DOMAINNET_URL}{'groundtruth/' if d in ('clipart', 'painting') else ''}{d}.zip",))
    for d in DOMAINNET_DOMAINS
}


class DomainSplitParams(DecodeParams, kw_only=True):
    """Options shared by the multi-domain datasets.

    Attributes
    ----------
    domains : list of str, optional
        Domains to use, in id order; default all, sorted.
    classes : list of str or int, optional
        Classes in label order, or ``k`` for the ``k`` classes with most images over the
        selected domains (then sorted by name); default all, sorted.
    image_size : int or None
        Resize to ``image_size`` x ``image_size`` (default 64, since such trees mix sizes);
        ``None`` keeps the size, which then must be uniform.
    test_fraction : float
        Share of each (domain, class) group held out for test, in [0, 1).
    max_per_class : int, optional
        Cap on images per (domain, class), drawn at random, to keep big trees manageable.
    seed : int
        Seed of the train/test split and the capping draw.
    """

    domains: list[str] | None = None
    classes: list[str] | int | None = None
    image_size: int | None = 64
    test_fraction: float = 0.2
    max_per_class: int | None = None
    seed: int = 0

    at_least = minimums(image_size=1, max_per_class=1, seed=0)
    at_most = maximums(image_size=MAX_IMAGE_SIZE)
    fractions = ("test_fraction",)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_names("domains", self.domains)
        if isinstance(self.classes, int):  # a count or a list of names: the bound depends on the kind
            check_min("classes", self.classes, 1)
        else:
            check_names("classes", self.classes)


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


def _load_domain_tree(
    name: str,
    sources: Sequence[Path],
    p: DomainSplitParams,
    *,
    domains: list[str] | None,
    channels: int,
    workers: int,
) -> ArrayDataset:
    """Read ``<domain>/<class>/<image>`` trees and split every (domain, class) group train/test.

    ``domains`` (default: all found) overrides ``p.domains``; the other options come from ``p``.
    Each group is shuffled by its own generator seeded from ``p.seed`` and the domain and class
    names, so the split of one group does not change when other domains or classes are
    selected. At least one image per group stays in train.
    """
    where = ", ".join(str(s) for s in sources)
    with ExitStack() as stack:
        trees = [stack.enter_context(Tree(s)) for s in sources]
        groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for index, tree in enumerate(trees):
            for member in tree.names():
                parts = member.split("/")
                if len(parts) >= 3 and is_image(parts[-1]):
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
        class_list = _pick_classes(where, counts, p.classes)

        picked: dict[str, list[tuple[int, str, int, int]]] = {"train": [], "test": []}
        for d_index, domain in enumerate(domain_list):
            for label, cls in enumerate(class_list):
                items = sorted(groups.get((domain, cls), []))
                rng = np.random.default_rng([p.seed, zlib.crc32(domain.encode()), zlib.crc32(cls.encode())])
                order = rng.permutation(len(items))[:p.max_per_class]
                n_test = min(math.floor(len(order) * p.test_fraction + 0.5), max(len(order) - 1, 0))
                for split, idx in (("test", order[:n_test]), ("train", order[n_test:])):
                    picked[split].extend((*items[i], label, d_index) for i in np.sort(idx))
        selected = picked["train"] + picked["test"]
        wanted: list[set[str]] = [set() for _ in trees]
        for index, member, _, _ in selected:
            wanted[index].add(member)
        contents = [tree.read(w) for tree, w in zip(trees, wanted, strict=True)]
    if not picked["train"]:
        raise DataError(f"{where}: no images for the selected domains and classes")
    pixels = decode_all(
        [contents[i][m] for i, m, _, _ in selected],
        [f"{sources[i]}:{m}" for i, m, _, _ in selected],
        image_size=p.image_size,
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


class DomainFolderParams(DomainSplitParams, kw_only=True):
    """Options of ``domain_folder``: those of :class:`DomainSplitParams`, plus ``path`` (folder or archive
    holding the domain folders, relative to the data dir, which is the default) and ``channels`` (1 or 3)."""

    path: str | Path | None = None
    channels: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        check_path(self.path)
        check_channels(self.channels)


@DATASETS.register("domain_folder", params=DomainFolderParams)
def domain_folder(p: DomainFolderParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """A multi-domain image tree ``<domain>/<class>/<image>`` (DomainNet, PACS, Office-Home style)."""
    name = "domain_folder"
    source = resolve_path(name, data_dir, p.path, "a folder or archive of <domain>/<class>/<image>")
    options = {
        "domains": p.domains,
        "classes": p.classes,
        "image_size": p.image_size,
        "channels": p.channels,
        "test_fraction": p.test_fraction,
        "max_per_class": p.max_per_class,
        "seed": p.seed,
    }
    num_workers = p.num_workers()
    return cached(
        name,
        options,
        [source],
        cache_dir,
        lambda: _load_domain_tree(name, [source], p, domains=p.domains, channels=p.channels, workers=num_workers),
    )


class DomainNetParams(DomainSplitParams, kw_only=True):
    """Options of ``domainnet``: those of :class:`DomainSplitParams` with DomainNet's defaults (the 10
    largest classes, 64x64 pixels; ``image_size`` must be set), ``domains`` among
    :data:`DOMAINNET_DOMAINS`, and ``download``."""

    classes: list[str] | int | None = 10
    download: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        # DomainNet's images differ in size: image_size must be set (the bounds let None through).
        check(self.image_size is not None, "image_size", self.image_size, f"an integer in [1, {MAX_IMAGE_SIZE}]")
        unknown = sorted(set(self.domains or ()) - set(DOMAINNET_DOMAINS))
        check(not unknown, "domains", self.domains, f"a list of DomainNet domains ({', '.join(DOMAINNET_DOMAINS)})")


@DATASETS.register("domainnet", params=DomainNetParams)
def domainnet(p: DomainNetParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """DomainNet from ``<data_dir>/domainnet/``: per domain, ``<domain>.zip`` or the extracted ``<domain>/``.

    Options are those of ``domain_folder``, with defaults suited to DomainNet's 345 classes and
    ~600,000 images: the 10 largest classes, 64x64 pixels. The official zips carry no published
    checksum, so they are checked only by reading them.
    """
    name = "domainnet"
    folder = data_dir / "domainnet"
    domain_list = p.domains or list(DOMAINNET_DOMAINS)
    num_workers = p.num_workers()
    sources: list[Path] = []
    if any((folder / d).is_dir() for d in domain_list):
        sources.append(folder)
    sources.extend(
        fetch(name, _DOMAINNET_FILES[d], folder, download=p.download)
        for d in domain_list
        if not (folder / d).is_dir()
    )
    options = {
        "domains": domain_list,
        "classes": p.classes,
        "image_size": p.image_size,
        "test_fraction": p.test_fraction,
        "max_per_class": p.max_per_class,
        "seed": p.seed,
    }
    return cached(
        name,
        options,
        sources,
        cache_dir,
        lambda: _load_domain_tree(name, sources, p, domains=domain_list, channels=3, workers=num_workers),
    )
