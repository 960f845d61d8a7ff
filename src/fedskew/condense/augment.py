"""Differentiable Siamese Augmentation (DSA; Zhao & Bilen, ICML 2021).

DSA augments the real and the synthetic batch of a matching step with *the same* random transform
(Siamese), through operations that are differentiable with respect to the pixels, so the matching loss
back-propagates through the augmentation to the synthetic images. The design is split so that the draw
can be reused:

>>> params = sample_dsa_params(cfg, None, generator)   # one draw shared by the whole batch
>>> real_aug, syn_aug = apply_dsa(real, params), apply_dsa(syn, params)

``batch_size=None`` gives one draw broadcast over every sample (DSA's Siamese "batch mode"); an integer
gives independent per-sample draws (DSA with ``seed=-1``, used when a network is trained on a
synthetic set).

Families (DSA's strategy names): ``color`` (brightness, then saturation, then contrast), ``crop``
(translation with zero padding), ``cutout``, ``flip`` (horizontal), ``scale``, ``rotate``. As in DSA's
default ("single" mode), each draw picks *one* family at random; ``mode="all"`` composes all of them.
The magnitudes are DSA's defaults (inherited from DiffAugment, Zhao et al. NeurIPS 2020):
brightness offset in ``[-brightness/2, brightness/2]``, saturation factor in ``[0, saturation]``,
contrast factor in ``[contrast, 1 + contrast]``, translation up to ``ratio_crop_pad`` of the side,
a cutout square of side ``ratio_cutout`` of the side, scale factors in ``[1/ratio_scale, ratio_scale]``
per axis and rotation angles in ``[-ratio_rotate, ratio_rotate]`` degrees. "Zero" (padding, cutout)
is 0 in the normalised space, i.e. the dataset's mean colour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedskew.core.errors import ConfigError
from fedskew.core.params import Options, minimums

FAMILIES: dict[str, tuple[str, ...]] = {
    "color": ("brightness", "saturation", "contrast"),
    "crop": ("crop",),
    "cutout": ("cutout",),
    "flip": ("flip",),
    "scale": ("scale",),
    "rotate": ("rotate",),
}
"""DSA strategy names and the operations each applies, in order."""

_DRAWS = {"brightness": 1, "saturation": 1, "contrast": 1, "crop": 2, "cutout": 2, "flip": 1, "scale": 2, "rotate": 1}
MODES = ("single", "all")


class DSAConfig(Options):
    """DSA settings (defaults: DSA's ``ParamDiffAug``).

    Attributes
    ----------
    strategy
        Families joined by ``_`` (see :data:`FAMILIES`).
    ratio_scale, ratio_rotate, ratio_crop_pad, ratio_cutout, brightness, saturation, contrast
        Magnitudes, see the module docstring.
    flip
        Include ``flip`` if the strategy names it; set ``False`` for digit-like data, where a mirrored
        image may be another class (DSA drops flip for MNIST).
    mode
        ``"single"``: one randomly chosen family per draw (DSA's default); ``"all"``: every family.
    """

    strategy: str = "color_crop_cutout_flip_scale_rotate"
    ratio_scale: float = 1.2
    ratio_rotate: float = 15.0
    ratio_crop_pad: float = 0.125
    ratio_cutout: float = 0.5
    brightness: float = 1.0
    saturation: float = 2.0
    contrast: float = 0.5
    flip: bool = True
    mode: str = "single"

    at_least = minimums(ratio_scale=1)

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = [f for f in self.strategy.split("_") if f not in FAMILIES]
        if unknown:
            raise ConfigError(f"unknown DSA families {unknown}; choose from {sorted(FAMILIES)}")
        if self.mode not in MODES:
            raise ConfigError(f"DSA mode must be one of {MODES}, got {self.mode!r}")
        if not self.families():
            raise ConfigError("the DSA strategy has no family left (only 'flip', with flip=False)")

    def families(self) -> tuple[str, ...]:
        """The strategy's families, without ``flip`` when ``flip`` is off."""
        return tuple(f for f in self.strategy.split("_") if self.flip or f != "flip")


@dataclass
class DSAParams:
    """One augmentation draw.

    Attributes
    ----------
    cfg
        The configuration the draw was made with (maps the raw draws to magnitudes).
    ops
        Operations to apply, in order.
    draws
        Per operation, uniform [0, 1) draws of shape (n, k): ``n == 1`` is shared by every sample of
        any batch (Siamese), otherwise ``n`` must equal the batch size.
    """

    cfg: DSAConfig
    ops: tuple[str, ...]
    draws: dict[str, torch.Tensor]


def sample_dsa_params(cfg: DSAConfig, batch_size: int | None, generator: torch.Generator) -> DSAParams:
    """Draw augmentation parameters.

    Parameters
    ----------
    cfg
        DSA settings.
    batch_size
        ``None`` for one draw shared by all samples (Siamese mode: apply the result to the real and the
        synthetic batch); an integer for independent per-sample draws.
    generator
        Source of randomness.
    """
    families = cfg.families()
    if cfg.mode == "single":
        families = (families[int(torch.randint(len(families), (1,), generator=generator).item())],)
    ops = tuple(op for f in families for op in FAMILIES[f])
    n = 1 if batch_size is None else batch_size
    draws = {op: torch.rand((n, _DRAWS[op]), generator=generator) for op in ops}
    return DSAParams(cfg, ops, draws)


def apply_dsa(x: torch.Tensor, params: DSAParams) -> torch.Tensor:
    """Apply the drawn transform to the batch ``x`` (N, C, H, W); differentiable with respect to ``x``.

    The draws (made on the CPU) are moved to ``x``'s device, so a seed augments alike on every device.
    """
    for op in params.ops:
        u = params.draws[op]
        if u.shape[0] not in (1, x.shape[0]):
            raise ValueError(f"DSA draws for {u.shape[0]} samples applied to a batch of {x.shape[0]}")
        x = _OPS[op](x, u.to(device=x.device, dtype=x.dtype, non_blocking=True), params.cfg)
    return x


def dsa(x: torch.Tensor, cfg: DSAConfig, generator: torch.Generator) -> torch.Tensor:
    """Augment ``x`` with independent per-sample draws (e.g. to train a network on a synthetic set)."""
    return apply_dsa(x, sample_dsa_params(cfg, x.shape[0], generator))


def _col(u: torch.Tensor, k: int) -> torch.Tensor:
    """Column ``k`` of the draws as an (n, 1, 1, 1) tensor broadcasting over (N, C, H, W)."""
    return u[:, k].reshape(-1, 1, 1, 1)


def _brightness(x: torch.Tensor, u: torch.Tensor, cfg: DSAConfig) -> torch.Tensor:
    return x + (_col(u, 0) - 0.5) * cfg.brightness


def _saturation(x: torch.Tensor, u: torch.Tensor, cfg: DSAConfig) -> torch.Tensor:
    gray = x.mean(dim=1, keepdim=True)
    return (x - gray) * (_col(u, 0) * cfg.saturation) + gray


def _contrast(x: torch.Tensor, u: torch.Tensor, cfg: DSAConfig) -> torch.Tensor:
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * (_col(u, 0) + cfg.contrast) + mean


def _pixel_offsets(u: torch.Tensor, reach: int) -> torch.Tensor:
    """Map uniform draws to integers uniform in ``[-reach, reach]``."""
    return (u * (2 * reach + 1)).floor().long().clamp(max=2 * reach) - reach


def _crop(x: torch.Tensor, u: torch.Tensor, cfg: DSAConfig) -> torch.Tensor:
    """Translate by up to ``ratio_crop_pad`` of each side, filling with zeros (DSA's "crop")."""
    n, c, h, w = x.shape
    ph, pw = int(h * cfg.ratio_crop_pad + 0.5), int(w * cfg.ratio_crop_pad + 0.5)
    ty = _pixel_offsets(u[:, 0], ph).expand(n)
    tx = _pixel_offsets(u[:, 1], pw).expand(n)
    padded = F.pad(x, (pw, pw, ph, ph))
    dev = x.device
    rows = torch.arange(h, device=dev)[None, :] + ph - ty[:, None]
    cols = torch.arange(w, device=dev)[None, :] + pw - tx[:, None]
    return padded[
        torch.arange(n, device=dev)[:, None, None, None],
        torch.arange(c, device=dev)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]


def _cutout(x: torch.Tensor, u: torch.Tensor, cfg: DSAConfig) -> torch.Tensor:
    """Zero a square of side ``ratio_cutout`` of the image side centred anywhere in the image."""
    _, _, h, w = x.shape
    sh, sw = int(h * cfg.ratio_cutout + 0.5), int(w * cfg.ratio_cutout + 0.5)
    top = (u[:, 0] * h).floor().long().clamp(max=h - 1) - sh // 2
    left = (u[:, 1] * w).floor().long().clamp(max=w - 1) - sw // 2
    rows = torch.arange(h, device=x.device)[None, :] - top[:, None]
    cols = torch.arange(w, device=x.device)[None, :] - left[:, None]
    in_rows = (rows >= 0) & (rows < sh)
    in_cols = (cols >= 0) & (cols < sw)
    keep = ~(in_rows[:, :, None] & in_cols[:, None, :])
    return x * keep[:, None].to(x.dtype)


def _flip(x: torch.Tensor, u: torch.Tensor, cfg: DSAConfig) -> torch.Tensor:
    return torch.where(_col(u, 0) < 0.5, x.flip(3), x)


def _affine(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Resample ``x`` on the grid ``theta`` (n, 2, 3), bilinear, zeros outside."""
    theta = theta.expand(x.shape[0], 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _scale(x: torch.Tensor, u: torch.Tensor, cfg: DSAConfig) -> torch.Tensor:
    r = cfg.ratio_scale
    s = u * (r - 1.0 / r) + 1.0 / r
    zero = torch.zeros_like(s[:, 0])
    theta = torch.stack([torch.stack([s[:, 0], zero, zero], dim=1), torch.stack([zero, s[:, 1], zero], dim=1)], dim=1)
    return _affine(x, theta)


def _rotate(x: torch.Tensor, u: torch.Tensor, cfg: DSAConfig) -> torch.Tensor:
    angle = (u[:, 0] - 0.5) * 2.0 * cfg.ratio_rotate * math.pi / 180.0
    cos, sin, zero = torch.cos(angle), torch.sin(angle), torch.zeros_like(angle)
    theta = torch.stack([torch.stack([cos, sin, zero], dim=1), torch.stack([-sin, cos, zero], dim=1)], dim=1)
    return _affine(x, theta)


_OPS = {
    "brightness": _brightness,
    "saturation": _saturation,
    "contrast": _contrast,
    "crop": _crop,
    "cutout": _cutout,
    "flip": _flip,
    "scale": _scale,
    "rotate": _rotate,
}
