"""Tiny ImageNet (200 classes, 64x64) from its official zip or the extracted folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedskew.core.errors import DataError
from fedskew.core.params import maximums, minimums
from fedskew.data.download import RemoteFile, fetch
from fedskew.data.sources.archive import Tree
from fedskew.data.sources.base import DATASETS, DecodeParams, cached
from fedskew.data.sources.checks import MAX_IMAGE_SIZE
from fedskew.data.sources.container import ArrayDataset
from fedskew.data.sources.images import decode_all, is_image

__all__ = ["TinyImageNetParams"]

_TINY_IMAGENET = RemoteFile("tiny-imagenet-200.zip", ("http://cs231n.stanford.edu/tiny-imagenet-200.zip",))


def _find_member(names: Sequence[str], suffix: str, source: Path) -> str:
    for member in names:
        if member == suffix or member.endswith("/" + suffix):
            return member
    raise DataError(f"{source}: no {suffix} inside (not a Tiny ImageNet archive?)")


def _read_tiny_imagenet(source: Path, image_size: int, workers: int) -> ArrayDataset:
    """Train images from ``train/<wnid>/images/``; the labelled ``val/`` split serves as test."""
    with Tree(source) as tree:
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
            if not is_image(parts[-1]) or len(parts) < 3 or parts[-2] != "images":
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
    pixels = decode_all(
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


class TinyImageNetParams(DecodeParams, kw_only=True):
    """Options of ``tiny_imagenet``: ``image_size`` (resize to it, default the native 64) and ``download``."""

    image_size: int = 64
    download: bool = False

    at_least = minimums(image_size=1)
    at_most = maximums(image_size=MAX_IMAGE_SIZE)


@DATASETS.register("tiny_imagenet", params=TinyImageNetParams)
def tiny_imagenet(p: TinyImageNetParams, data_dir: Path, cache_dir: str | Path | None) -> ArrayDataset:
    """Tiny ImageNet (200 classes, 64x64) from ``<data_dir>/tiny-imagenet-200.zip`` or its extracted folder.

    The labelled validation split is used as the test split (the official test split has no
    labels). Class names are the WordNet ids of ``wnids.txt``, in its order. No checksum is
    published, so the archive is checked only by reading it.
    """
    name = "tiny_imagenet"
    num_workers = p.num_workers()
    extracted = data_dir / "tiny-imagenet-200"
    source = extracted if extracted.is_dir() else fetch(name, _TINY_IMAGENET, data_dir, download=p.download)
    return cached(
        name,
        {"image_size": p.image_size},
        [source],
        cache_dir,
        lambda: _read_tiny_imagenet(source, p.image_size, num_workers),
    )
