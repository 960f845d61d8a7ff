"""Synthetic (condensed) sets, their initialisation, and the seeded sampling helpers shared by the
condensation methods.

Images live in the *normalised* space ``(x / 255 - mean) / std`` in which models are trained; a set is
sent over the network as 8-bit images by default (FedAF, Wang et al. CVPR 2024, App. C counts one byte per
pixel and channel), hence :meth:`SyntheticSet.to_uint8` / :meth:`SyntheticSet.from_uint8`; the 8-bit
range clamps pixels that condensation pushed outside it (:meth:`SyntheticSet.clamped_fraction`).

Randomness: every function takes an explicit :class:`torch.Generator`. Model constructors draw their
initial weights from torch's global generator, so :func:`fresh_model` runs the constructor inside
:func:`torch.random.fork_rng` with a seed drawn from the caller's generator: the initialisation is
reproducible and the global stream is left untouched.

Devices (:mod:`fedskew.core.device`): generators are CPU streams; every draw is made on the CPU and then
moved to the device of the data it serves, so a seed gives the same sets and networks on every device.
Networks are built on the CPU by their factory and moved; what goes on the wire (:class:`UInt8Set`) is
computed on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fedskew.core.device import AMP_DTYPES, Precision, randn
from fedskew.core.errors import ConfigError, DataError
from fedskew.core.params import Options

INITS = ("noise", "real", "mean")
"""Ways to initialise a synthetic set, see :func:`init_synthetic`."""

ModelFactory = Callable[[], nn.Module]
"""A constructor returning a freshly, randomly initialised network (weights from the global torch RNG)."""

_SEED_BOUND = 2**63 - 1


def default_generator(generator: torch.Generator | None) -> torch.Generator:
    """Return ``generator``, or a new generator seeded with 0 when it is ``None``.

    ``None`` therefore means "deterministic", never "the global RNG": results never depend on what
    else the process has drawn.
    """
    if generator is not None:
        return generator
    g = torch.Generator()
    g.manual_seed(0)
    return g


def draw_seed(generator: torch.Generator) -> int:
    """Draw a 63-bit seed from ``generator`` (to seed a forked global RNG or a child generator)."""
    return int(torch.randint(0, _SEED_BOUND, (1,), generator=generator).item())


def fresh_model(
    model_factory: ModelFactory, generator: torch.Generator, device: torch.device | None = None
) -> nn.Module:
    """Build a randomly initialised network whose initial weights are determined by ``generator``.

    ``model_factory()`` initialises its weights from the global RNG (as every ``nn.Module`` does) on the
    CPU; we fork that RNG and seed it with a number drawn from ``generator``, so two calls with equally
    seeded generators return identical networks and the caller's global RNG state is unchanged. Only
    the CPU generator is seeded (``torch.manual_seed`` would also seed, and leave changed, the CUDA
    generators, and costs ~60 us a call here); the network is then moved to ``device`` (``None``: left
    on the CPU), so its weights are the same on every device.
    """
    seed = draw_seed(generator)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = model_factory()
    return model if device is None else model.to(device, non_blocking=True)


def model_device(model: nn.Module) -> torch.device:
    """Where a network's parameters (or, lacking any, buffers) are; the CPU for a network without tensors."""
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


def check_amp_word(amp: str) -> None:
    """Raise :class:`ConfigError` unless ``amp`` is ``"off"``, ``"bf16"`` or ``"fp16"`` (whether the
    device can run it is checked when the condensation starts, on the data's device)."""
    if amp != "off" and amp not in AMP_DTYPES:
        raise ConfigError(f"amp must be one of 'off', 'bf16', 'fp16', got {amp!r}")


class SynthesisOptions(Options, kw_only=True):
    """What the settings of every condensation method (:class:`~fedskew.condense.DMConfig`,
    :class:`~fedskew.condense.GMConfig`, :class:`~fedskew.condense.KIPConfig`) share: ``amp``. Each declares
    its bounds (:class:`~fedskew.core.params.Options`: ``at_least``, ``positive``; an option that is ``None``
    is off and passes) and checks its words in ``__post_init__`` (:func:`check_choice`), each failing with
    one line naming the option, its value and what is allowed.

    Attributes
    ----------
    amp
        Mixed precision of the networks' forward passes: ``"off"`` (float32), ``"bf16"``, or ``"fp16"``
        (CUDA only, with a gradient scaler). The methods pass the run's ``amp``.
    """

    amp: str = "off"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_amp_word(self.amp)


def backward_to(loss: torch.Tensor, inputs: list[torch.Tensor], precision: Precision) -> None:
    """``loss.backward(inputs=inputs)``, through ``precision``'s gradient scaler when it has one (fp16)."""
    (loss if precision.scaler is None else precision.scaler.scale(loss)).backward(inputs=inputs)


def model_features(model: nn.Module) -> nn.Module:
    """Return ``model.features``, the embedding network ``h_w`` of DM/FedAF (all but the last layer)."""
    features = getattr(model, "features", None)
    if not isinstance(features, nn.Module):
        raise ConfigError(f"condensation needs a model with a `features` sub-module, got {type(model).__name__}")
    return features


def check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    """Raise :class:`ConfigError` unless the option ``name`` is one of the words ``allowed`` (a condensation
    setting's words are checked where it is built, in Python as from a table)."""
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def check_init(init: str) -> None:
    """Raise :class:`ConfigError` unless ``init`` is one of :data:`INITS`."""
    check_choice("init", init, INITS)


def check_data(x: torch.Tensor, y: torch.Tensor) -> None:
    """Raise :class:`DataError` unless ``x`` is a float (N, C, H, W) batch with N matching labels."""
    if x.dim() != 4 or not x.is_floating_point():
        raise DataError(f"expected float images of shape (N, C, H, W), got {tuple(x.shape)} {x.dtype}")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise DataError(f"expected {x.shape[0]} labels of shape (N,), got {tuple(y.shape)}")
    if y.shape[0] == 0:
        raise DataError("no real data to condense")


def class_indices(y: torch.Tensor, classes: Sequence[int]) -> list[torch.Tensor]:
    """Indices of the samples of each class in ``classes``; :class:`DataError` if one has none."""
    out = []
    for c in classes:
        idx = torch.nonzero(y == c).flatten()
        if idx.numel() == 0:
            raise DataError(f"class {c} has no real samples to condense from")
        out.append(idx)
    return out


def sample_indices(idx: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """``min(k, len(idx))`` entries of ``idx`` drawn without replacement (drawn on the CPU, on ``idx``'s device)."""
    perm = torch.randperm(idx.numel(), generator=generator)[:k]
    return idx[perm.to(idx.device, non_blocking=True)]


def _channel_stats(values: Sequence[float] | torch.Tensor, channels: int, name: str) -> torch.Tensor:
    """Per-channel statistics as a float64 (1, C, 1, 1) tensor."""
    t = torch.as_tensor(values, dtype=torch.float64).flatten()
    if t.numel() == 1:
        t = t.expand(channels)
    if t.numel() != channels:
        raise ConfigError(f"{name} has {t.numel()} values for {channels} image channels")
    return t.reshape(1, channels, 1, 1)


@dataclass
class UInt8Set:
    """A synthetic set quantised to 8-bit pixels, the form in which it is transmitted.

    Attributes
    ----------
    images
        uint8 (N, C, H, W), pixel values in [0, 255].
    labels
        int64 (N,).
    soft_labels
        Optional float32 (N, L) learned labels (KIP label learning); sent as they are.
    """

    images: torch.Tensor
    labels: torch.Tensor
    soft_labels: torch.Tensor | None = None


@dataclass
class SyntheticSet:
    """A condensed dataset.

    Attributes
    ----------
    images
        float32 (N, C, H, W) in the normalised space ``(x / 255 - mean) / std``.
    labels
        int64 (N,) hard labels.
    soft_labels
        Optional float32 (N, L) labels (filled by KIP when it learns labels).
    """

    images: torch.Tensor
    labels: torch.Tensor
    soft_labels: torch.Tensor | None = None

    def __post_init__(self) -> None:
        check_data(self.images, self.labels)
        if self.soft_labels is not None and self.soft_labels.shape[0] != self.images.shape[0]:
            raise DataError(f"{self.soft_labels.shape[0]} soft labels for {self.images.shape[0]} synthetic images")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def by_class(self) -> dict[int, torch.Tensor]:
        """Images of each class, keyed by label, in order of first appearance."""
        return {int(c): self.images[self.labels == c] for c in dict.fromkeys(self.labels.tolist())}

    def pixels(self, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor) -> torch.Tensor:
        """The images de-normalised to the 8-bit pixel scale, ``(x * std + mean) * 255``, unclamped and
        unrounded: float64 on the CPU (MPS has no float64)."""
        channels = self.images.shape[1]
        m = _channel_stats(mean, channels, "mean")
        s = _channel_stats(std, channels, "std")
        return (self.images.detach().cpu().to(torch.float64) * s + m) * 255.0

    def clamped_fraction(self, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor) -> float:
        """The fraction of pixel values (over images, channels and positions) that :meth:`to_uint8` clamps:
        those outside [0, 255] on the pixel scale (:meth:`pixels`), which 8 bits cannot represent."""
        pixels = self.pixels(mean, std)
        return int(((pixels < 0.0) | (pixels > 255.0)).sum()) / pixels.numel()

    def to_uint8(self, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor) -> UInt8Set:
        """Quantise to 8-bit pixels: de-normalise, scale to [0, 255], clamp and round.

        The arithmetic is done in float64 so that ``from_uint8(u).to_uint8(mean, std)`` returns ``u``
        exactly: only the first quantisation loses information. It runs on the CPU (MPS has no
        float64), and the result is on the CPU: it is what goes on the wire. :meth:`clamped_fraction`
        says how much the clamp cut.
        """
        images = self.pixels(mean, std).clamp(0.0, 255.0).round().to(torch.uint8)
        soft = None if self.soft_labels is None else self.soft_labels.detach().cpu().clone()
        return UInt8Set(images, self.labels.cpu().clone(), soft)

    @staticmethod
    def from_uint8(
        u: UInt8Set, mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor
    ) -> SyntheticSet:
        """Return the float set in the normalised space, ``(u / 255 - mean) / std``.

        Decoded on the CPU in float64 (as :meth:`to_uint8`), returned on the device of ``u.images``.
        """
        channels = u.images.shape[1]
        m = _channel_stats(mean, channels, "mean")
        s = _channel_stats(std, channels, "std")
        device = u.images.device
        images = ((u.images.cpu().to(torch.float64) / 255.0 - m) / s).to(torch.float32).to(device)
        soft = None if u.soft_labels is None else u.soft_labels.clone()
        return SyntheticSet(images, u.labels.to(torch.int64).clone(), soft)


def init_synthetic(
    x: torch.Tensor,
    y: torch.Tensor,
    classes: Sequence[int],
    ipc: int,
    init: str = "noise",
    generator: torch.Generator | None = None,
    mean_samples: int = 16,
) -> SyntheticSet:
    """Initialise ``ipc`` synthetic images for each class in ``classes`` (class-major order).

    Parameters
    ----------
    x, y
        Real images (N, C, H, W), normalised, and their labels (N,).
    classes
        Labels to create images for, in the order they appear in the result.
    ipc
        Images per class.
    init
        ``"noise"``: standard normal pixels in the normalised space (the FedDC default: its Fig. 7
        images are unrecognisable; also DC's noise option). ``"real"``: distinct random real images of
        the class (DC/DM's default; a class with fewer than ``ipc`` images repeats them, every image
        once before any twice). ``"mean"``: each synthetic image is the average of ``mean_samples``
        random real images of the class (all of them if fewer), FedAF Sec. 5.1 "initialize each class
        of condensed data using the average of randomly sampled local original data".
    generator
        Source of randomness (``None``: a generator seeded with 0).
    mean_samples
        Real images averaged per synthetic image for ``init="mean"``. FedAF does not give the number;
        16 keeps some of the class's diversity between the ``ipc`` averages while removing most of the
        individual images' detail.

    Raises
    ------
    ConfigError
        For an unknown ``init`` or non-positive ``ipc`` / ``mean_samples``.
    DataError
        If ``init`` needs real images of a class that has none.
    """
    check_init(init)
    if ipc < 1 or mean_samples < 1:
        raise ConfigError(f"ipc and mean_samples must be positive, got {ipc} and {mean_samples}")
    if len(classes) == 0:
        raise ConfigError("no classes to initialise")
    check_data(x, y)
    g = default_generator(generator)
    labels = torch.tensor(list(classes), dtype=torch.int64).repeat_interleave(ipc).to(y.device)
    shape = (len(classes) * ipc, *x.shape[1:])
    if init == "noise":
        return SyntheticSet(randn(shape, g, x.device, dtype=torch.float32), labels)
    parts = []
    for idx in class_indices(y, classes):
        if init == "real":
            rounds = -(-ipc // idx.numel())
            order = torch.cat([torch.randperm(idx.numel(), generator=g) for _ in range(rounds)])
            parts.append(x[idx[order[:ipc].to(idx.device)]])
        else:
            parts.append(torch.stack([x[sample_indices(idx, mean_samples, g)].mean(dim=0) for _ in range(ipc)]))
    return SyntheticSet(torch.cat(parts).to(torch.float32).clone(), labels)


def start_set(
    x: torch.Tensor, y: torch.Tensor, ipc: int, init: str, generator: torch.Generator
) -> SyntheticSet:
    """Where a condensation starts: ``ipc`` images of every class present in ``y``, in increasing
    label order, initialised by :func:`init_synthetic` (DC, DM and KIP alike)."""
    check_data(x, y)
    return init_synthetic(x, y, sorted(set(y.tolist())), ipc, init, generator)
