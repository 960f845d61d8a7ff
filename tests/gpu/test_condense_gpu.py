"""The condensation library on CUDA: the same draws as on the CPU, results equal up to rounding, and every
method under bf16 and fp16 autocast (fp16 with its gradient scaler) returning finite float32 images.

Skipped without CUDA (tests/gpu/conftest.py). On a GPU machine: ``python -m pytest tests/gpu -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

import fedskew.condense as cd
from tests.helpers.device_draws import assert_same, computed, draws, tiny3, toy_data

pytestmark = pytest.mark.gpu

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def test_a_seed_draws_the_same_on_cuda_as_on_the_cpu() -> None:
    assert_same(draws(CUDA), draws(CPU))


def test_results_on_cuda_equal_the_cpus_up_to_rounding() -> None:
    # cuDNN may use TF32 for convolutions, hence the loose tolerance; KIP's float64 is far tighter.
    assert_same(computed(CUDA), computed(CPU), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_every_method_runs_under_autocast_on_cuda(amp: str) -> None:
    x, y = toy_data(CUDA)
    g = torch.Generator().manual_seed(0)
    base = cd.fresh_model(tiny3, g, CUDA)
    outs = [
        cd.distribution_matching(x, y, cd.perturbed_model_sampler(base, tiny3, 1.0),
                                 cd.DMConfig(iterations=3, ipc=2, real_batch=8, clip_norm=2.0, amp=amp), g),
        cd.distribution_matching(x, y, cd.interpolated_model_sampler(base, tiny3, 0.9),
                                 cd.DMConfig(iterations=3, ipc=2, real_batch=8, amp=amp), g),
        cd.gradient_matching(x, y, tiny3, cd.GMConfig(iterations=2, ipc=2, real_batch=8, amp=amp), g),
        cd.gradient_matching(x, y, tiny3, cd.GMConfig(iterations=2, ipc=2, real_batch=8, amp=amp), g, batched_ok=False),
        cd.kip(x, y, 3, cd.KIPConfig(iterations=2, ipc=2, target_batch=12, kernel="rf_convnet", rf_width=4, depth=2,
                                     amp=amp), g),
    ]
    for syn in outs:
        assert syn.images.device.type == "cuda" and syn.images.dtype == torch.float32
        assert bool(torch.isfinite(syn.images).all())
        assert syn.to_uint8([0.5], [0.25]).images.device.type == "cpu"
