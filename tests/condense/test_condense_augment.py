"""Differentiable Siamese augmentation."""

from __future__ import annotations

import pytest
import torch

from fedskew.condense import DSAConfig, apply_dsa, dsa, sample_dsa_params
from fedskew.condense.augment import FAMILIES
from fedskew.core.errors import ConfigError


def _batch(seed: int = 0, n: int = 6) -> torch.Tensor:
    return torch.randn((n, 3, 8, 8), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_same_params_same_output_different_params_different_output(family: str) -> None:
    cfg = DSAConfig(strategy=family)
    x = _batch()
    g = torch.Generator().manual_seed(0)
    params = sample_dsa_params(cfg, None, g)
    real, syn = apply_dsa(x, params), apply_dsa(x.clone(), params)
    assert torch.equal(real, syn)
    outputs = [apply_dsa(x, sample_dsa_params(cfg, None, g)) for _ in range(8)]
    assert any(not torch.equal(outputs[0], o) for o in outputs[1:])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_shared_draw_transforms_every_sample_alike(family: str) -> None:
    """Siamese mode: one draw for the whole batch, so identical samples stay identical."""
    x = _batch(n=1).expand(4, -1, -1, -1).contiguous()
    out = apply_dsa(x, sample_dsa_params(DSAConfig(strategy=family), None, torch.Generator().manual_seed(2)))
    assert all(torch.equal(out[0], o) for o in out[1:])


def test_siamese_on_different_batches_and_gradient() -> None:
    cfg = DSAConfig(mode="all")
    real, syn = _batch(1, 5), _batch(2, 2).requires_grad_(True)
    params = sample_dsa_params(cfg, None, torch.Generator().manual_seed(0))
    out_real = apply_dsa(real, params)
    out_syn = apply_dsa(syn, params)
    # the same transform: applying it to the concatenation gives the same result
    both = apply_dsa(torch.cat([real, syn.detach()]), params)
    assert torch.allclose(both, torch.cat([out_real, out_syn.detach()]))
    out_syn.square().sum().backward()
    assert syn.grad is not None and torch.isfinite(syn.grad).all() and syn.grad.abs().sum() > 0


def test_per_sample_draws_differ_between_samples() -> None:
    x = _batch(n=1).expand(8, -1, -1, -1).contiguous()
    out = dsa(x, DSAConfig(strategy="color", mode="all"), torch.Generator().manual_seed(0))
    assert not torch.equal(out[0], out[1])
    with pytest.raises(ValueError):
        apply_dsa(_batch(n=3), sample_dsa_params(DSAConfig(), 8, torch.Generator()))


def test_crop_is_an_integer_translation() -> None:
    cfg = DSAConfig(strategy="crop", ratio_crop_pad=0.25)
    x = _batch(n=2)
    params = sample_dsa_params(cfg, None, torch.Generator().manual_seed(0))
    params.draws["crop"] = torch.tensor([[1.0 - 1e-6, 0.0]])  # +2 rows, -2 columns on 8x8
    out = apply_dsa(x, params)
    assert torch.equal(out[:, :, 2:, :6], x[:, :, :6, 2:])
    assert (out[:, :, :2] == 0).all() and (out[:, :, :, 6:] == 0).all()


def test_flip_and_colour_magnitudes() -> None:
    x = _batch(n=2)
    params = sample_dsa_params(DSAConfig(strategy="flip"), None, torch.Generator())
    params.draws["flip"] = torch.tensor([[0.2]])
    assert torch.equal(apply_dsa(x, params), x.flip(3))
    params = sample_dsa_params(DSAConfig(strategy="color", mode="all"), None, torch.Generator())
    params.draws.update(
        brightness=torch.tensor([[1.0]]), saturation=torch.tensor([[0.5]]), contrast=torch.tensor([[0.5]])
    )
    assert torch.allclose(apply_dsa(x, params), x + 0.5, atol=1e-6)  # +0.5, saturation x1, contrast x1


def test_scale_and_rotate_identity_draws() -> None:
    """Draws that map to scale factor 1 and angle 0 leave the image unchanged."""
    x = _batch(n=2)
    unit_scale = (1.0 - 1 / 1.2) / (1.2 - 1 / 1.2)
    for family, u in (("scale", torch.full((1, 2), unit_scale)), ("rotate", torch.tensor([[0.5]]))):
        params = sample_dsa_params(DSAConfig(strategy=family), None, torch.Generator())
        params.draws[family] = u
        assert torch.allclose(apply_dsa(x, params), x, atol=1e-5)


def test_config_validation() -> None:
    with pytest.raises(ConfigError):
        DSAConfig(strategy="color_blur")
    with pytest.raises(ConfigError):
        DSAConfig(strategy="flip", flip=False)
    assert "flip" not in DSAConfig(flip=False).families()
    ops = {sample_dsa_params(DSAConfig(flip=False), None, torch.Generator().manual_seed(s)).ops for s in range(40)}
    assert ("flip",) not in ops and len(ops) == 5
