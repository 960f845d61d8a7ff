"""The client half of ``[privacy]``, run where the client's data is (:func:`fedskew.engine.workers.client_step_on`,
which every engine's client jobs go through: inline, the worker pool, Ray, a Flower SuperNode).

The server's request for the upload task says which mechanism the client applies (:data:`CONFIG_KEYS` in the
request's config, set by :meth:`fedskew.privacy.run.RunPrivacy.requests`); the client then

- ``local``: clips its own update to ``clip`` and adds N(0, (noise_multiplier * clip)^2) to it before the reply
  leaves (:meth:`ClientPrivacy.finish`);
- ``sample``: hands a :class:`~fedskew.privacy.dpsgd.SampleDP` to the ``train_local`` that trains its upload
  (:meth:`ClientPrivacy.train_options`, reached through :meth:`fedskew.algorithms.base.ClientContext.dpsgd`) and
  reports the noisy steps and their sampling rate in the reply's metrics (:data:`DP_STEPS`,
  :data:`DP_SAMPLE_RATE`), which the server accounts.

The noise is drawn from ``torch_generator(seed, "privacy", round, cid)``: the same whichever process runs the
client, so a private run is reproducible and resumes byte-identically; with ``privacy.noise_seed = "secret"`` from
a stream seeded by the client's operating system (:func:`~fedskew.privacy.mechanisms.noise_stream`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedskew.core.errors import ConfigError, FedskewError
from fedskew.core.message import Message, Scalar
from fedskew.privacy.mechanisms import noise_stream
from fedskew.privacy.uploads import Upload, clipped, flat_update, float_keys, gaussian, references, with_update

MODE, CLIP, NOISE, NOISE_SEED = "privacy.mode", "privacy.clip", "privacy.noise_multiplier", "privacy.noise_seed"
CONFIG_KEYS = (MODE, CLIP, NOISE, NOISE_SEED)
"""The request config keys that tell a client its mechanism (only on requests of the upload task; NOISE_SEED only
when it is ``secret``)."""
DP_STEPS, DP_SAMPLE_RATE = "dp_steps", "dp_sample_rate"
"""The metrics of a ``sample``-mode reply: DP-SGD's noisy steps this round and their per-step sampling rate."""

MISSING_DPSGD = (
    'privacy.mode = "sample" needs DP-SGD (fedskew.privacy.dpsgd), which this version of fedskew lacks: use '
    'privacy.mode = "central" or "local"'
)


def sample_dp_class() -> Any:
    """DP-SGD's :class:`~fedskew.privacy.dpsgd.SampleDP` (its contract: ``SampleDP(clip, noise_multiplier,
    generator)``, given to ``train_local(private=...)``, which sets its ``steps`` and ``sample_rate``); a
    :class:`ConfigError` of one line where the module is missing."""
    try:
        dpsgd = importlib.import_module("fedskew.privacy.dpsgd")
    except ImportError:
        raise ConfigError(MISSING_DPSGD) from None
    return dpsgd.SampleDP


def request_config(mode: str, clip: float, noise_multiplier: float, noise_seed: str = "run") -> dict[str, Scalar]:
    """The config entries of an upload request under ``mode`` (``local`` or ``sample``)."""
    out: dict[str, Scalar] = {MODE: mode, CLIP: float(clip), NOISE: float(noise_multiplier)}
    if noise_seed != "run":
        out[NOISE_SEED] = noise_seed
    return out


@dataclass
class ClientPrivacy:
    """One client job's mechanism, read from its request (:meth:`of`)."""

    mode: str
    clip: float
    noise_multiplier: float
    generator: torch.Generator
    handed: list[Any] = field(default_factory=list)
    """The SampleDP objects handed to ``train_local`` in this job (``sample``)."""

    @staticmethod
    def of(config: Mapping[str, Any], seed: int, rnd: int, cid: int) -> ClientPrivacy | None:
        """The mechanism a request asks for (None: none); its noise stream is (seed, ``privacy``, round, cid)."""
        mode = config.get(MODE)
        if mode is None:
            return None
        if mode not in ("local", "sample"):
            raise FedskewError(f"the request asks for an unknown privacy mechanism {mode!r}")
        noise_seed = config.get(NOISE_SEED, "run")
        if noise_seed not in ("run", "secret"):
            raise FedskewError(f"the request asks for an unknown noise seed {noise_seed!r}")
        return ClientPrivacy(str(mode), float(config[CLIP]), float(config[NOISE]),
                             noise_stream(str(noise_seed), seed, "privacy", rnd, cid))

    def train_options(self) -> dict[str, Any]:
        """Keyword arguments for the ``train_local`` that trains the upload: ``private`` (a new SampleDP, drawing
        from this job's noise stream) in ``sample`` mode, else none."""
        if self.mode != "sample":
            return {}
        private = sample_dp_class()(clip=self.clip, noise_multiplier=self.noise_multiplier, generator=self.generator)
        self.handed.append(private)
        return {"private": private}

    def finish(self, upload: Upload | Any, request: Message, reply: Message) -> Message:
        """The reply as it leaves the client: ``local``: its upload clipped and noised; ``sample``: with the steps
        DP-SGD took and their sampling rate in its metrics."""
        if not isinstance(reply, Message):
            return reply  # the server rejects it as it stands
        if not isinstance(upload, Upload):
            raise FedskewError("a private request reached a method that declares no model upload")
        if self.mode == "sample":
            if not self.handed:
                raise FedskewError('privacy.mode = "sample": the client trained its upload without DP-SGD '
                                   "(its train_local got no SampleDP: see Algorithm.upload.dpsgd)")
            steps = sum(int(p.steps) for p in self.handed)
            rate = max(float(p.sample_rate) for p in self.handed)
            return Message(reply.arrays, reply.config, {**reply.metrics, DP_STEPS: float(steps),
                                                        DP_SAMPLE_RATE: rate})
        return Message(local_update(upload, request.arrays, reply.arrays, self.clip, self.noise_multiplier,
                                    self.generator), reply.config, reply.metrics)


def local_update(
    upload: Upload, request: Mapping[str, torch.Tensor], reply: Mapping[str, torch.Tensor], clip: float,
    noise_multiplier: float, generator: torch.Generator,
) -> dict[str, torch.Tensor]:
    """Local DP's upload: the update (reply minus request, :class:`Upload`) clipped to ``clip`` in joint L2 norm,
    plus N(0, (noise_multiplier * clip)^2) on every coordinate, written back as the reply's arrays."""
    refs = references(upload, request, reply)
    keys = float_keys(reply)
    update = flat_update(reply, refs, keys)
    bounded, _ = clipped(update, clip)
    noisy = bounded + gaussian(update.numel(), noise_multiplier * clip, generator, update.device)
    return with_update(reply, refs, keys, noisy)
