"""A simulated federation: the dataset split into client shards, held as preloaded tensors.

All clients' training data sits in one tensor, ordered by client, so a client's shard is a view
(``x[offsets[k]:offsets[k+1]]``): nothing is copied per round, and the single tensor can be put in
shared memory once for worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedskew.algorithms.base import FederationInfo, ModelSpec
from fedskew.core.seeding import derive_seed, torch_generator


@dataclass
class Federation:
    """Client shards and the server's test set."""

    info: FederationInfo
    x: torch.Tensor
    y: torch.Tensor
    offsets: list[int]
    x_test: torch.Tensor
    y_test: torch.Tensor
    class_names: list[str]
    counts: np.ndarray  # (num_clients, num_classes) samples per class per client

    def client_data(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        s, e = self.offsets[cid], self.offsets[cid + 1]
        return self.x[s:e], self.y[s:e]

    def share_memory(self) -> None:
        """Move the tensors to shared memory so worker processes map them instead of copying."""
        for t in (self.x, self.y, self.x_test, self.y_test):
            t.share_memory_()


def _freeze(v: Any) -> Any:
    """Lists to tuples, so a model spec is hashable (it keys the per-process model cache)."""
    return tuple(_freeze(x) for x in v) if isinstance(v, list | tuple) else v


def build_federation(
    dataset: dict[str, Any],
    partition_cfg: dict[str, Any],
    model: dict[str, Any],
    seed: int,
    data_dir: str | None = None,
) -> Federation:
    """Load the dataset, partition it and build the client shards.

    Parameters
    ----------
    dataset, partition_cfg, model
        The ``[dataset]``, ``[partition]`` and ``[model]`` config tables (each with ``name``).
        ``dataset.train_fraction`` (default 1) keeps a class-stratified random fraction of the
        training split, drawn from a stream of the run seed, before partitioning.
    seed
        The run's root seed. The partition uses ``partition_cfg["seed"]`` if given, else a stream
        derived from this seed, so changing the run seed also redraws the partition unless pinned.
    data_dir
        Folder with local dataset copies (overrides ``dataset.data_dir`` when given).
    """
    from fedskew.data import load_dataset
    from fedskew.data.partition import partition

    dopts = dict(dataset)
    dname = dopts.pop("name")
    ddir = data_dir or dopts.pop("data_dir", None) or None
    dopts.pop("data_dir", None)
    fraction = dopts.pop("train_fraction", 1.0)
    ds = load_dataset(dname, ddir, **dopts).train_subset(fraction, derive_seed(seed, "train_fraction") % (2**32))

    popts = dict(partition_cfg)
    pname = popts.pop("name")
    num_clients = int(popts.pop("num_clients"))
    pseed = popts.pop("seed", None)
    pseed = int(pseed) if pseed is not None else derive_seed(seed, "partition") % (2**32)
    part = partition(pname, ds.y_train, num_clients, pseed, domains=ds.domains_train, **popts)

    order = np.concatenate([np.asarray(ix, dtype=np.int64) for ix in part.indices])
    offsets = [0, *np.cumsum([len(ix) for ix in part.indices]).tolist()]
    # Reorder the uint8 images, then convert: one float copy of the training set, not two.
    x, y = ds.to_tensors("train", order)
    x_test, y_test = ds.to_tensors("test")
    if part.noise_std is not None:
        # Noise-based feature skew: a fixed draw per client, added once to the normalised inputs.
        for cid, std in enumerate(part.noise_std):
            if std > 0:
                s, e = offsets[cid], offsets[cid + 1]
                g = torch_generator(seed, "noise", cid)
                x[s:e] += std * torch.randn(x[s:e].shape, generator=g)

    mopts = dict(model)
    mname = mopts.pop("name")
    spec = ModelSpec(
        name=mname,
        in_channels=ds.in_channels,
        num_classes=ds.num_classes,
        image_size=ds.image_size,
        options=tuple(sorted((k, _freeze(v)) for k, v in mopts.items())),
    )
    info = FederationInfo(
        num_clients=num_clients,
        num_classes=ds.num_classes,
        model=spec,
        seed=seed,
        mean=tuple(ds.mean),
        std=tuple(ds.std),
        image_shape=(ds.in_channels, ds.image_size, ds.image_size),
    )
    return Federation(
        info=info, x=x, y=y, offsets=offsets, x_test=x_test, y_test=y_test,
        class_names=list(ds.classes), counts=part.class_counts(ds.y_train, ds.num_classes),
    )
