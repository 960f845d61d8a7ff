"""A simulated federation: the dataset split into client shards, held as preloaded tensors.

All clients' training data sits in one tensor, ordered by client, so a client's shard is a view
(``x[offsets[k]:offsets[k+1]]``): nothing is copied per round, and the single tensor can be put in
shared memory once for worker processes. With ``partition.client_test_fraction > 0`` each client's
held-out test split sits the same way in ``x_client_test`` (offsets ``client_test_offsets``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedskew.algorithms.base import FederationInfo, ModelSpec
from fedskew.core.params import as_table
from fedskew.core.seeding import derive_seed, torch_generator

ENGINE_KEYS = ("data_dir", "train_fraction", "normalize")
"""``[dataset]`` keys the engine applies (every dataset's Params has them), not the loader."""

if TYPE_CHECKING:
    from fedskew.config.schema import Component, RunConfig


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
    counts: np.ndarray  # (num_clients, num_classes) training samples per class per client
    x_client_test: torch.Tensor | None = None  # every client's own test split, ordered by client
    y_client_test: torch.Tensor | None = None
    client_test_offsets: list[int] | None = None

    def client_data(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        s, e = self.offsets[cid], self.offsets[cid + 1]
        return self.x[s:e], self.y[s:e]

    @property
    def has_client_test(self) -> bool:
        """Whether the clients hold test splits of their own (``partition.client_test_fraction > 0``)."""
        return self.client_test_offsets is not None

    def client_test(self, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client ``cid``'s own test split (empty without ``partition.client_test_fraction``)."""
        if self.client_test_offsets is None or self.x_client_test is None or self.y_client_test is None:
            return self.x[:0], self.y[:0]
        s, e = self.client_test_offsets[cid], self.client_test_offsets[cid + 1]
        return self.x_client_test[s:e], self.y_client_test[s:e]

    def client_test_sizes(self) -> list[int]:
        """Test samples per client (zeros without a per-client split)."""
        o = self.client_test_offsets or [0] * (self.info.num_clients + 1)
        return [o[k + 1] - o[k] for k in range(self.info.num_clients)]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every data tensor of the federation."""
        extra = (self.x_client_test, self.y_client_test)
        return (self.x, self.y, self.x_test, self.y_test, *(t for t in extra if t is not None))

    def share_memory(self) -> None:
        """Move the tensors to shared memory so worker processes map them instead of copying."""
        for t in self.tensors():
            t.share_memory_()


def freeze(v: Any) -> Any:
    """Lists to tuples, so a model spec is hashable (it keys the per-process model cache)."""
    return tuple(freeze(x) for x in v) if isinstance(v, list | tuple) else v


def build_federation(
    dataset: Component, partition_cfg: Component, model: Component, seed: int, data_dir: str | None = None,
) -> Federation:
    """Load the dataset, partition it and build the client shards.

    Parameters
    ----------
    dataset, partition_cfg, model
        The run's typed ``[dataset]``, ``[partition]`` and ``[model]`` (:class:`~fedskew.config.schema.Component`:
        a name and its checked options; :func:`~fedskew.config.schema.component` builds one from a table).
        ``dataset.train_fraction`` keeps a class-stratified random fraction of the training split, drawn from a
        stream of the run seed, before partitioning. ``partition.client_test_fraction`` then holds out that
        fraction of each client's samples as its own test split (:func:`~fedskew.data.partition.hold_out`, drawn
        from a stream of the partition seed).
    seed
        The run's root seed. The partition uses ``partition.seed`` if given, else a stream derived from this
        seed, so changing the run seed also redraws the partition unless pinned.
    data_dir
        Folder with local dataset copies (overrides ``dataset.data_dir`` when given).
    """
    from fedskew.data import load_dataset
    from fedskew.data.partition import hold_out, partition

    dparams = dataset.params
    ddir = data_dir or dparams.data_dir or None
    ds = load_dataset(dataset.name, ddir, **as_table(dparams, leave=ENGINE_KEYS)).train_subset(
        dparams.train_fraction, derive_seed(seed, "train_fraction") % (2**32)
    )
    if not dparams.normalize:  # raw pixels in [0, 1]: x / 255 (mean 0, std 1 everywhere downstream)
        ds = dataclasses.replace(ds, mean=(0.0,) * ds.in_channels, std=(1.0,) * ds.in_channels)

    pparams = partition_cfg.params
    num_clients = pparams.num_clients
    pseed = pparams.seed if pparams.seed is not None else derive_seed(seed, "partition") % (2**32)
    test_fraction = pparams.client_test_fraction
    own = as_table(pparams, leave=("num_clients", "seed", "client_test_fraction"))
    part = partition(partition_cfg.name, ds.y_train, num_clients, pseed, domains=ds.domains_train, **own)
    indices, held = part.indices, None
    if test_fraction > 0:
        indices, held = hold_out(part.indices, ds.y_train, test_fraction, derive_seed(pseed, "client_test") % (2**32))

    def gather(parts: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        order = np.concatenate([np.asarray(ix, dtype=np.int64) for ix in parts])
        # Reorder the uint8 images, then convert: one float copy of the training set, not two.
        xs, ys = ds.to_tensors("train", order)
        return xs, ys, [0, *np.cumsum([len(ix) for ix in parts]).tolist()]

    x, y, offsets = gather(indices)
    x_ct, y_ct, ct_offsets = gather(held) if held is not None else (None, None, None)
    x_test, y_test = ds.to_tensors("test")
    if part.noise_std is not None:
        # Noise-based feature skew: a fixed draw per client, added once to the normalised inputs (its
        # own test split gets its own draw at the same level: the client's feature skew).
        for cid, std in enumerate(part.noise_std):
            if std > 0:
                s, e = offsets[cid], offsets[cid + 1]
                g = torch_generator(seed, "noise", cid)
                x[s:e] += std * torch.randn(x[s:e].shape, generator=g)
                if x_ct is not None and ct_offsets is not None:
                    s, e = ct_offsets[cid], ct_offsets[cid + 1]
                    x_ct[s:e] += std * torch.randn(x_ct[s:e].shape, generator=torch_generator(seed, "noise-test", cid))

    info = FederationInfo(
        num_clients=num_clients,
        num_classes=ds.num_classes,
        model=model_spec(model, ds.in_channels, ds.num_classes, ds.image_size),
        seed=seed,
        mean=tuple(ds.mean),
        std=tuple(ds.std),
        image_shape=(ds.in_channels, ds.image_size, ds.image_size),
    )
    return Federation(
        info=info, x=x, y=y, offsets=offsets, x_test=x_test, y_test=y_test,
        class_names=list(ds.classes),
        counts=dataclasses.replace(part, indices=indices).class_counts(ds.y_train, ds.num_classes),
        x_client_test=x_ct, y_client_test=y_ct, client_test_offsets=ct_offsets,
    )


def federation_for(config: RunConfig, data_dir: str | None = None) -> Federation:
    """The federation of the run configured as ``config`` (its dataset, partition, model and seed)."""
    return build_federation(config.dataset, config.partition, config.model, config.run.seed, data_dir)


def model_spec(model: Component, in_channels: int, num_classes: int, image_size: int) -> ModelSpec:
    """The typed ``[model]`` as the spec every process builds the model from (every option, defaults included)."""
    return ModelSpec(name=model.name, in_channels=in_channels, num_classes=num_classes, image_size=image_size,
                     options=tuple(sorted((k, freeze(v)) for k, v in as_table(model.params).items())))


TENSORS = ("x", "y", "x_test", "y_test", "x_client_test", "y_client_test")
"""The federation's data tensors, by field name."""


def with_model(fed: Federation, model: Component) -> Federation:
    """``fed`` for a run of another ``[model]``: the same tensors (the same objects), the run's model spec."""
    spec = model_spec(model, fed.info.model.in_channels, fed.info.num_classes, fed.info.model.image_size)
    return fed if spec == fed.info.model else dataclasses.replace(fed, info=dataclasses.replace(fed.info, model=spec))


def same_data(a: Federation, b: Federation) -> bool:
    """Whether two federations hold equal data (shards, test sets, per-client test splits), value by value."""
    if a.offsets != b.offsets or a.client_test_offsets != b.client_test_offsets:
        return False
    for name in TENSORS:
        ta, tb = getattr(a, name), getattr(b, name)
        if (ta is None) != (tb is None):
            return False
        if ta is not None and (ta.dtype != tb.dtype or ta.shape != tb.shape or not torch.equal(ta, tb)):
            return False
    return True


def sharing_tensors(fed: Federation, data: Federation) -> Federation:
    """``fed`` holding ``data``'s tensor objects (equal by :func:`same_data`): a worker pool started on
    ``data`` serves it."""
    return dataclasses.replace(fed, **{name: getattr(data, name) for name in TENSORS})
