"""Devices and mixed precision.

A run names its device in the config (``device = "auto" | "cpu" | "cuda" | "cuda:N" | "mps"``); this
module turns that word into a :class:`torch.device`, refusing in one line a device the machine does
not have, and gives the autocast context every tensor path uses for ``amp = "off" | "bf16" | "fp16"``.

Conventions the rest of fedskew follows, so that a seed gives the same draws on every device:

- random draws come from CPU ``torch.Generator`` streams (:mod:`fedskew.core.seeding`) and are moved
  to the device afterwards (:func:`randn`, :func:`rand`, :func:`randperm` below);
- tensors a computation creates take the device of its inputs (``device=x.device``);
- what is saved or sent (checkpoints, model files, messages) is on the CPU (:func:`to_cpu`), so a run
  started on a GPU resumes on a CPU and the reverse.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fedskew.core.errors import ConfigError

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cuda_count() -> int:
    """CUDA devices this process can see (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def mps_available() -> bool:
    """Whether Apple's Metal backend is usable here."""
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def available_devices() -> list[str]:
    """The devices this machine offers, as config words: ``cpu``, ``cuda:0`` ..., ``mps``."""
    out = ["cpu"] + [f"cuda:{i}" for i in range(cuda_count())]
    if mps_available():
        out.append("mps")
    return out


def resolve_device(spec: str) -> torch.device:
    """The device a config's ``device`` names; ``auto`` is CUDA if present, else MPS, else the CPU.

    Raises
    ------
    ConfigError
        One line naming the device and what is available, when the machine lacks it.
    """
    if spec == "auto":
        if cuda_count() > 0:
            return torch.device("cuda", 0)
        return torch.device("mps") if mps_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    available = ", ".join(available_devices())
    if spec == "mps":
        if not mps_available():
            raise ConfigError(f"device 'mps' is not available on this machine; available: {available}")
        return torch.device("mps")
    if spec == "cuda" or spec.startswith("cuda:"):
        index = int(spec.split(":", 1)[1]) if ":" in spec else 0
        if index >= cuda_count():
            what = "no CUDA device" if cuda_count() == 0 else f"{cuda_count()} CUDA device(s)"
            raise ConfigError(f"device {spec!r} is not available on this machine ({what}); available: {available}")
        return torch.device("cuda", index)
    raise ConfigError(f"device must be one of auto, cpu, cuda, cuda:N, mps, got {spec!r}")


def check_amp(amp: str, device: torch.device) -> None:
    """Refuse in one line a precision the device cannot run (fp16 needs CUDA: its gradient scaler does)."""
    if amp not in ("off", *AMP_DTYPES):
        raise ConfigError(f"amp must be one of 'off', 'bf16', 'fp16', got {amp!r}")
    if amp == "fp16" and device.type != "cuda":
        raise ConfigError(f"amp 'fp16' needs a CUDA device (it trains with a gradient scaler), got {device}; "
                          "use amp=bf16 or amp=off")


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of ``amp`` on ``device`` (a no-op for ``off``).

    Mixed precision covers the forward passes of training, evaluation and condensation; parameters,
    optimiser state, synthetic images and everything on the wire stay float32.
    """
    if amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AMP_DTYPES[amp])


class Precision:
    """Mixed precision of one training loop: the autocast context and, for fp16, the gradient scaler.

    ``backward(loss)`` and ``step(optimizer)`` replace ``loss.backward()`` and ``optimizer.step()``;
    with ``amp = "off"`` they are exactly those calls, so CPU float32 results do not change.
    """

    def __init__(self, device: torch.device, amp: str = "off") -> None:
        check_amp(amp, device)
        self.device, self.amp = device, amp
        self.scaler = torch.amp.GradScaler("cuda") if amp == "fp16" else None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast(self.device, self.amp)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Before editing gradients (clipping, SCAFFOLD's correction): bring them back to true scale."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()


@contextlib.contextmanager
def deterministic_algorithms(on: bool) -> Iterator[None]:
    """PyTorch's deterministic kernels for the block (GPU runs with ``deterministic = true``).

    cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG`` set before its first use; the engine sets it when a run
    asks for determinism (see :func:`set_deterministic_env`). On the CPU fedskew is deterministic
    anyway (one intra-op thread per task), so this changes nothing there.
    """
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on or before)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def set_deterministic_env() -> None:
    """The cuBLAS workspace setting deterministic GPU matrix products need (before CUDA starts)."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def to_cpu(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A device-free copy of named tensors (what is saved or sent)."""
    return {k: v.detach().cpu() for k, v in tensors.items()}


def randn(shape: tuple[int, ...], generator: torch.Generator, device: torch.device, **kw: Any) -> torch.Tensor:
    """``torch.randn`` drawn from a CPU stream, then moved: the same draw on every device."""
    return torch.randn(shape, generator=generator, **kw).to(device)


def rand(shape: tuple[int, ...], generator: torch.Generator, device: torch.device, **kw: Any) -> torch.Tensor:
    """``torch.rand`` drawn from a CPU stream, then moved."""
    return torch.rand(shape, generator=generator, **kw).to(device)


def randperm(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``torch.randperm`` drawn from a CPU stream, then moved."""
    return torch.randperm(n, generator=generator).to(device)


@dataclass(frozen=True)
class Compute:
    """Where and how a process computes: the device, the mixed precision, deterministic kernels.

    Picklable (it travels to worker processes); the engine sets it for each client job and
    evaluation chunk with :func:`use_compute`, and the trainer, the evaluation and the condensation
    loops read it with :func:`current_compute`, so a method's code need not pass it around.
    """

    device: str = "cpu"
    amp: str = "off"
    deterministic: bool = False
    workers: tuple[str, ...] = ()
    """The device of each worker process in turn (every visible GPU for ``auto`` and ``cuda``, one
    process each); empty: ``device``."""

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    def precision(self) -> Precision:
        return Precision(self.torch_device, self.amp)


def worker_devices(spec: str) -> list[str]:
    """The device of each pool worker for a config's ``device``: every visible GPU for ``auto`` and
    ``cuda`` (one process each), the named one for ``cuda:N`` and ``mps``, else the CPU."""
    if spec in ("auto", "cuda") and cuda_count() > 0:
        return [f"cuda:{i}" for i in range(cuda_count())]
    return [str(resolve_device(spec))]


def resolve_compute(device: str, amp: str = "off", deterministic: bool = False) -> Compute:
    """A config's ``device``, ``amp`` and ``deterministic`` as one :class:`Compute`: the device resolved
    and present, the precision possible on it, and the workers' devices."""
    resolved = resolve_device(device)
    check_amp(amp, resolved)
    return Compute(str(resolved), amp, deterministic, tuple(worker_devices(device)))


_COMPUTE: contextvars.ContextVar[Compute | None] = contextvars.ContextVar("fedskew_compute", default=None)
_CPU = Compute()


def current_compute() -> Compute:
    """The compute settings of the running job (CPU, float32 outside any :func:`use_compute`)."""
    return _COMPUTE.get() or _CPU


@contextlib.contextmanager
def use_compute(compute: Compute) -> Iterator[Compute]:
    """Run the block with ``compute`` as the current settings (deterministic kernels if it asks)."""
    if compute.deterministic:
        set_deterministic_env()  # every engine's process (pool, Ray, Flower node) before cuBLAS starts
    token = _COMPUTE.set(compute)
    try:
        with deterministic_algorithms(compute.deterministic):
            yield compute
    finally:
        _COMPUTE.reset(token)


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor inside (dicts, lists, tuples) moved to ``device``; other values as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_device(v, device) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_device(v, device) for v in obj)
    return obj
