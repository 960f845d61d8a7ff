"""Devices and mixed precision.

A run names its device in the config (``device = "auto" | "cpu" | "cuda" | "cuda:N" | "mps"``); this
module turns that word into a :class:`torch.device`, refusing in one line a device the machine does
not have, and gives the autocast context every tensor path uses for ``amp = "off" | "bf16" | "fp16"``.
Beside ``amp`` sit the switches that cut the kernel launches of a training step, all off by default
(:class:`Compute`, docs/configuration.md): ``sgd_impl`` (torch's foreach or fused SGD), ``compile``
(``torch.compile`` of the model's forward pass in local training) and ``tf32`` (TF32 matrix products on CUDA).

Conventions the rest of fedskew follows, so that a seed gives the same draws on every device:

- random draws come from CPU ``torch.Generator`` streams (:mod:`fedskew.core.seeding`) and are moved
  to the device afterwards (:func:`randn`, :func:`rand`, :func:`randperm` below), with ``non_blocking=True``:
  a copy from ordinary (pageable) host memory is staged at once, so the host does not wait for the GPU's
  queue to drain as a blocking copy makes it (PyTorch synchronises the stream after one); on the CPU it
  is no copy at all;
- tensors a computation creates take the device of its inputs (``device=x.device``);
- what is saved or sent (checkpoints, model files, messages) is on the CPU (:func:`to_cpu`), so a run
  started on a GPU resumes on a CPU and the reverse.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
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


SGD_IMPLS = ("default", "foreach", "fused")
"""``sgd_impl``: torch's own choice (a loop over the tensors on the CPU, foreach on CUDA), or one of its
multi-tensor (``foreach``) or single-kernel (``fused``) implementations."""
COMPILE_MODES = ("off", "default", "reduce-overhead")
"""``compile``: no compilation, ``torch.compile`` (inductor), or inductor with CUDA graphs (CUDA only)."""


def check_speed(sgd_impl: str, compile: str, tf32: bool, device: torch.device) -> None:
    """Refuse in one line a launch-cutting switch the device cannot run (see :class:`Compute`)."""
    if sgd_impl not in SGD_IMPLS:
        raise ConfigError(f"sgd_impl must be one of {', '.join(map(repr, SGD_IMPLS))}, got {sgd_impl!r}")
    if compile not in COMPILE_MODES:
        raise ConfigError(f"compile must be one of {', '.join(map(repr, COMPILE_MODES))}, got {compile!r}")
    if sgd_impl == "fused" and device.type not in ("cpu", "cuda"):
        raise ConfigError(f"sgd_impl 'fused' runs on cpu or cuda, got {device}; use sgd_impl=default or foreach")
    if compile == "reduce-overhead" and device.type != "cuda":
        raise ConfigError(f"compile 'reduce-overhead' records CUDA graphs and needs a CUDA device, got {device}; "
                          "use compile=default or compile=off")
    if tf32 and device.type != "cuda":
        raise ConfigError(f"tf32 = true needs a CUDA device (TF32 is a tensor-core format), got {device}; "
                          "use tf32=false")


def _forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


@functools.cache
def compiled_forward(mode: str) -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    """``forward(model, x) = model(x)`` through ``torch.compile`` in ``mode`` (``default`` or
    ``reduce-overhead``), one compiled function per mode and process.

    The model is an argument, not a compiled module's attribute: nothing is stored on the model (methods
    deepcopy their models), and its weights may be reloaded in place between calls. Each batch shape
    (the last, smaller batch of an epoch) and each model class is one more graph; past torch's
    recompilation limit (``torch._dynamo.config.recompile_limit``, 8) a new one runs uncompiled.
    """
    return torch.compile(_forward, mode=None if mode == "default" else mode, dynamic=False)


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
    if not on or torch.are_deterministic_algorithms_enabled():
        # nothing to switch: no call (it would reset a caller's ``warn_only``)
        yield
        return
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def set_deterministic_env() -> None:
    """The cuBLAS workspace setting deterministic GPU matrix products need (before CUDA starts)."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def to_cpu(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A device-free copy of named tensors (what is saved or sent)."""
    return {k: v.detach().cpu() for k, v in tensors.items()}


def randn(shape: tuple[int, ...], generator: torch.Generator, device: torch.device, **kw: Any) -> torch.Tensor:
    """``torch.randn`` drawn from a CPU stream, then moved: the same draw on every device."""
    return torch.randn(shape, generator=generator, **kw).to(device, non_blocking=True)


def rand(shape: tuple[int, ...], generator: torch.Generator, device: torch.device, **kw: Any) -> torch.Tensor:
    """``torch.rand`` drawn from a CPU stream, then moved."""
    return torch.rand(shape, generator=generator, **kw).to(device, non_blocking=True)


def randperm(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``torch.randperm`` drawn from a CPU stream, then moved."""
    return torch.randperm(n, generator=generator).to(device, non_blocking=True)


@dataclass(frozen=True)
class Compute:
    """Where and how a process computes: the device, the mixed precision, deterministic kernels, and the
    switches that cut a training step's kernel launches (the run's top-level keys of the same names).

    Picklable (it travels to worker processes); the engine sets it for each client job and
    evaluation chunk with :func:`use_compute`, and the trainer, the evaluation and the condensation
    loops read it with :func:`current_compute`, so a method's code need not pass it around.

    Attributes
    ----------
    sgd_impl
        The SGD of local training (:func:`~fedskew.components.trainer.train_local`): ``default``,
        ``foreach`` or ``fused`` (:data:`SGD_IMPLS`).
    compile
        ``torch.compile`` of the model's forward pass in local training (:data:`COMPILE_MODES`).
    tf32
        TF32 for float32 matrix products on CUDA (``torch.backends.cuda.matmul.allow_tf32``) inside
        :func:`use_compute`; cuDNN's convolutions use TF32 in PyTorch's default settings already.
    """

    device: str = "cpu"
    amp: str = "off"
    deterministic: bool = False
    workers: tuple[str, ...] = ()
    """The device of each worker process in turn (every visible GPU for ``auto`` and ``cuda``, one
    process each); empty: ``device``."""
    sgd_impl: str = "default"
    compile: str = "off"
    tf32: bool = False

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    def precision(self) -> Precision:
        return Precision(self.torch_device, self.amp)

    def check(self) -> None:
        """Refuse in one line a setting this device cannot run (``amp``, ``sgd_impl``, ``compile``, ``tf32``)."""
        check_amp(self.amp, self.torch_device)
        check_speed(self.sgd_impl, self.compile, self.tf32, self.torch_device)

    def on_device(self, device: torch.device) -> Compute:
        """These settings on ``device``, less what it cannot run (a Flower node computing elsewhere than the
        run's device): off CUDA, ``tf32`` goes off, ``compile = "reduce-overhead"`` becomes ``default`` and, off
        the CPU too, fused SGD becomes foreach. ``amp`` stays as the run says (fp16 is refused off CUDA)."""
        if device.type == "cuda":
            return dataclasses.replace(self, device=str(device))
        return dataclasses.replace(
            self, device=str(device), tf32=False,
            compile="default" if self.compile == "reduce-overhead" else self.compile,
            sgd_impl="foreach" if self.sgd_impl == "fused" and device.type != "cpu" else self.sgd_impl,
        )

    def sgd_options(self) -> dict[str, bool]:
        """Keyword arguments of ``torch.optim.SGD`` for :attr:`sgd_impl` (none for ``default``)."""
        return {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(self.sgd_impl, {})

    def forward(self, model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        """``model``'s forward pass, compiled when :attr:`compile` asks for it."""
        if self.compile == "off":
            return model
        return functools.partial(compiled_forward(self.compile), model)


def worker_devices(spec: str) -> list[str]:
    """The device of each pool worker for a config's ``device``: every visible GPU for ``auto`` and
    ``cuda`` (one process each), the named one for ``cuda:N`` and ``mps``, else the CPU."""
    if spec in ("auto", "cuda") and cuda_count() > 0:
        return [f"cuda:{i}" for i in range(cuda_count())]
    return [str(resolve_device(spec))]


def resolve_compute(
    device: str, amp: str = "off", deterministic: bool = False, sgd_impl: str = "default", compile: str = "off",
    tf32: bool = False,
) -> Compute:
    """A config's ``device``, ``amp``, ``deterministic`` and launch-cutting switches as one :class:`Compute`:
    the device resolved and present, the precision and switches possible on it (refused in one line each
    otherwise), and the workers' devices."""
    resolved = resolve_device(device)
    compute = Compute(str(resolved), amp, deterministic, tuple(worker_devices(device)), sgd_impl=sgd_impl,
                      compile=compile, tf32=tf32)
    compute.check()
    return compute


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
        with deterministic_algorithms(compute.deterministic), tf32_matmul(compute.tf32):
            yield compute
    finally:
        _COMPUTE.reset(token)


@contextlib.contextmanager
def tf32_matmul(on: bool) -> Iterator[None]:
    """TF32 float32 matrix products on CUDA for the block (``tf32 = true``); off: the process's setting as it is."""
    if not on:
        yield
        return
    matmul = torch.backends.cuda.matmul
    # torch >= 2.9 has fp32_precision and refuses a mix of it and the older allow_tf32: use one of them.
    key, value = ("fp32_precision", "tf32") if isinstance(getattr(matmul, "fp32_precision", None), str) \
        else ("allow_tf32", True)
    before = getattr(matmul, key)
    setattr(matmul, key, value)
    try:
        yield
    finally:
        setattr(matmul, key, before)


def host_floats(values: Sequence[torch.Tensor]) -> list[float]:
    """Scalar tensors (on any device) as Python floats, in one copy to the host for all of them instead of a
    sync each: ``[float(v) for v in values]``, the same numbers bit for bit (float64 holds every float32,
    bf16 and fp16 value exactly)."""
    if not values:
        return []
    scalars = values if all(v.dim() == 0 for v in values) else [v.reshape(()) for v in values]
    return [float(v) for v in torch.stack(list(scalars)).cpu().double().tolist()]


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
