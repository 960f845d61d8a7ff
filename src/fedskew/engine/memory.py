"""A run's memory, estimated jointly before it starts, and the refusal of a run this machine cannot hold.

Every size-like option has a bound of its own (:data:`fedskew.core.params.SIZE_LIMITS`), and the generated
dataset a joint bound on its pixels (:data:`fedskew.data.sources.small.SYNTHETIC_MAX_PIXELS`); but sizes bounded
one by one still multiply. FedDM with ``ipc = 10000`` on 100 classes of 3x256x256 images, each value within its
bound, condenses a million images: about 1 TB. :func:`estimate` adds up what a run holds at once:

- **data**: the federation's training and test images as float32 (``[dataset]``: the synthetic dataset's sizes,
  or the known sizes of the datasets of :data:`KNOWN_DATASETS`; a dataset whose size is only known once it is
  read, an image folder or a Hugging Face dataset, counts nothing here and nothing below that needs its shape);
- **model**: its parameters, counted on PyTorch's ``meta`` device (nothing allocated), as float32, once for the
  server's global model and twice (weights and gradients) for every process that trains a client at a time;
- **condensed sets** (FedDC, FedDM, FedAF: methods with ``ipc``; HFLDD's KIP images): the larger of the server's
  union of a round's sets, held as it arrived (``wire_dtype``) and decoded as float32, and the sets the condensing
  clients hold at once (float32 and their gradients);
- **batched clients** (``clients_in_parallel``): the stacked models and gradients of the clients trained together.

It is a lower bound, as the run itself needs more (activations, optimiser states, per-client states, PyTorch):
each part counts only what the run certainly holds, so the check can refuse only runs that cannot fit, never one
that could. What it assumes: a client that trains holds at least one class, and when every client takes part in
every round, every class of the training split is held by some client (``classes_per_client``: as many as its
clients can hold). It is compared with the machine's **total** memory (RAM, capped by a container's limit, plus
the memory of the GPUs when the run uses CUDA), not with what is free at the moment: what other processes hold
comes and goes, and the run's own pieces are not all held at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedskew.algorithms.base import ModelSpec
from fedskew.config.schema import RunConfig
from fedskew.core.errors import ConfigError
from fedskew.engine.runner import width_of

FLOAT = 4
"""Bytes of a float32 value."""

WIRE_BYTES = {"uint8": 1, "float16": 2, "float32": 4}
"""Bytes a condensed image's value takes on the wire (``wire_dtype``), as the server pools it."""


@dataclass(frozen=True)
class DataShape:
    """What the memory of a run's data depends on: the split sizes, the image shape and the classes."""

    train: int
    test: int
    channels: int
    size: int
    classes: int

    @property
    def values(self) -> int:
        """Values of one image (channels x size x size)."""
        return self.channels * self.size * self.size


KNOWN_DATASETS: dict[str, DataShape] = {
    "digits": DataShape(1437, 360, 1, 8, 10),
    "mnist": DataShape(60000, 10000, 1, 28, 10),
    "fashion_mnist": DataShape(60000, 10000, 1, 28, 10),
    "cifar10": DataShape(50000, 10000, 3, 32, 10),
    "cifar10_jpeg": DataShape(50000, 10000, 3, 32, 10),
    "cifar100": DataShape(50000, 10000, 3, 32, 100),
    "tiny_imagenet": DataShape(100000, 10000, 3, 64, 200),
}
"""The registered datasets whose sizes are known before they are read (their official splits)."""

COVERING = {"iid", "dirichlet", "shards", "quantity", "noise", "domain"}
"""Partitioners that hand every training sample to some client (so every class has a holder)."""


def data_shape(config: RunConfig) -> DataShape | None:
    """The run's data as :class:`DataShape` (the training split after ``train_fraction``), or None when it is only
    known once the dataset is read."""
    name, p = config.dataset.name, config.dataset.params
    if name == "synthetic":
        shape = DataShape(p.num_train, p.num_test, p.channels, p.image_size, p.num_classes)
    elif name in KNOWN_DATASETS:
        shape = KNOWN_DATASETS[name]
        if name == "cifar100" and getattr(p, "labels", "fine") == "coarse":
            shape = dataclasses.replace(shape, classes=20)
        if name == "tiny_imagenet":
            shape = dataclasses.replace(shape, size=int(p.image_size))
    else:
        return None
    return dataclasses.replace(shape, train=max(1, math.floor(shape.train * float(p.train_fraction))))


def model_parameters(config: RunConfig, shape: DataShape) -> int | None:
    """The model's parameter and buffer count, built on the ``meta`` device (no memory, no random draw); None when
    it cannot be built there (a plug-in's model may not; the run reports its own errors). Counted once per model
    spec: a grid's runs mostly share theirs."""
    from fedskew.engine.federation import model_spec

    spec = model_spec(config.model, shape.channels, shape.classes, shape.size)
    try:
        hash(spec)
    except TypeError:  # an option that is a table: not a cache key
        return _count.__wrapped__(spec)
    return _count(spec)


@functools.lru_cache(maxsize=256)
def _count(spec: ModelSpec) -> int | None:
    import torch

    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = spec.build()
    except Exception:  # a model that cannot be built on meta, or not at all: not this estimate's to say
        return None
    return sum(t.numel() for t in (*model.parameters(), *model.buffers()))


@dataclass(frozen=True)
class Estimate:
    """The bytes a run holds at least, by part (``data``, ``model``, ``condensed sets``, ``batched clients``), and
    a few words on each part's size."""

    parts: dict[str, int]
    notes: dict[str, str]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """``data 0.0 GB, model 0.0 GB, condensed sets 983.0 GB (1,000,000 images of 3x256x256), ...``"""
        return ", ".join(f"{k} {gb(v)}" + (f" ({self.notes[k]})" if k in self.notes else "")
                         for k, v in self.parts.items())


def gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def estimate(config: RunConfig) -> Estimate:
    """The least memory the run configured as ``config`` holds at once (see the module's docstring)."""
    parts: dict[str, int] = {}
    notes: dict[str, str] = {}
    shape = data_shape(config)
    if shape is None:
        return Estimate(parts, notes)
    parts["data"] = (shape.train + shape.test) * (shape.values * FLOAT + 8)  # float32 images, int64 labels
    run, params = config.run, config.algorithm.params
    clients = int(config.partition.params.num_clients)
    per_round = max(1, min(int(getattr(params, "clients_per_round", clients)), clients))
    trainers = max(1, min(run.workers, per_round)) if run.workers >= 2 else 1  # 0 (auto): not known yet
    width = width_of(run.clients_in_parallel, config.algorithm.name, config.compute, run.workers)
    batched = per_round if width == 0 else max(1, min(width, per_round))  # 0: every client of the round
    count = model_parameters(config, shape)
    if count is not None:
        parts["model"] = count * FLOAT * (1 + 2 * trainers)  # the global model; weights and gradients a trainer
        notes["model"] = f"{count:,} values"
        if batched > 1:
            parts["batched clients"] = count * FLOAT * 2 * batched
            notes["batched clients"] = f"{batched} models and their gradients"
    images, each = _condensed(config, shape, per_round, clients)
    if images or each:
        wire = WIRE_BYTES.get(str(getattr(params, "wire_dtype", "float32")), FLOAT)
        server = images * shape.values * (wire + FLOAT)  # the pool as it arrived, decoded as float32
        # a batched runner distils HFLDD's clients together (KIP with its NTK kernel, without amp); every other
        # condensation runs one client at a time
        kip_batches = getattr(params, "kip_kernel", None) == "ntk" and config.compute.amp == "off"
        together = batched if kip_batches else 1
        condensing = max(trainers, together) * each * shape.values * FLOAT * 2  # sets and their gradients
        parts["condensed sets"] = max(server, condensing)
        notes["condensed sets"] = (f"{images:,} images of {shape.channels}x{shape.size}x{shape.size}" if server >=
                                   condensing else f"{each:,} images a client")
    return Estimate(parts, notes)


def _condensed(config: RunConfig, shape: DataShape, per_round: int, clients: int) -> tuple[int, int]:
    """The condensed images a round's clients send at least, and those one condensing client holds at least."""
    params = config.algorithm.params
    ipc = getattr(params, "ipc", None)
    if isinstance(ipc, int) and hasattr(params, "condense_iterations"):  # FedDC, FedDM, FedAF
        classes = per_round  # each client that condenses holds at least one class
        if per_round >= clients:  # every client condenses every round: together they hold every class
            classes = max(classes, _covered_classes(config, shape, clients))
        return ipc * classes, ipc
    kip = getattr(params, "kip_images", None)
    if isinstance(kip, int):  # HFLDD: KIP images per member (kip_ipc a class held, else kip_images in all)
        each = int(getattr(params, "kip_ipc", 0) or kip)
        return 0, each
    return 0, 0


def _covered_classes(config: RunConfig, shape: DataShape, clients: int) -> int:
    """Classes held by some client: every class of the training split where the partitioner hands out every
    sample (:data:`COVERING`), at most ``clients x classes`` for ``classes_per_client``; else unknown (0)."""
    present = min(shape.classes, shape.train)
    name = config.partition.name
    if name in COVERING:
        return present
    if name == "classes_per_client":
        return min(present, clients * int(config.partition.params.classes))
    return 0


def machine_memory(config: RunConfig) -> tuple[int, str] | None:
    """The memory this machine has for the run, and what it is: total RAM (a container's limit, when lower), plus
    the total memory of the visible GPUs when the run computes on CUDA; None where it cannot be read."""
    ram = total_ram()
    if ram is None:
        return None
    what = "RAM"
    if config.compute.torch_device.type == "cuda":
        import torch

        gpus = sum(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
        ram, what = ram + gpus, "RAM and GPU memory"
    return ram, what


def total_ram() -> int | None:
    """Total RAM: ``MemTotal`` of ``/proc/meminfo`` (else the physical pages), capped by a cgroup memory limit."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        with contextlib.suppress(ValueError, OSError, AttributeError):
            found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            cap = Path(limit).read_text().strip()
            if cap != "max" and int(cap) < 2**60:  # v1 writes "no limit" as a huge number
                found.append(int(cap))
            break
        except (OSError, ValueError):
            continue
    return min(found) if found else None


def check_memory(configs: Sequence[RunConfig],
                 memory: Callable[[RunConfig], tuple[int, str] | None] | None = None) -> None:
    """Refuse, in one line naming the run, its estimate and the parts, a run whose :func:`estimate` exceeds the
    machine's memory (``memory(config)``: bytes and what they are; default :func:`machine_memory`)."""
    memory = memory or machine_memory
    for config in configs:
        need = estimate(config)
        have = memory(config) if need.total else None
        if have is None or need.total <= have[0]:
            continue
        raise ConfigError(
            f"run {config.label!r} (seed {config.run.seed}) would run out of memory: it needs at least "
            f"{gb(need.total)} ({need.describe()}), more than this machine's {gb(have[0])} of {have[1]} in all; make "
            "the condensed sets (ipc), the images, the model or the clients trained at once smaller"
        )
