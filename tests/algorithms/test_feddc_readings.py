"""FedDC's two readings (issue 38): the paper's (the default) and its authors' code
(``reading = "authors_code"``): the preset's settings, the interpolated matching network and the
mixed-class real batches."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn

from fedskew.algorithms.feddc import AUTHORS_CODE, FedDC, FedDCPlus, interpolate, interpolated_networks
from fedskew.condense import GMConfig, gradient_matching
from fedskew.core.errors import ConfigError
from fedskew.core.params import build_params
from tests.helpers.feddc import feddc_config, run_recording

# ---- the preset ------------------------------------------------------------------------------------


def test_the_authors_preset_sets_every_setting_read_from_their_code() -> None:
    p = build_params(FedDC.Params, {"reading": "authors_code"})
    for key, value in AUTHORS_CODE.items():
        if key != "server":
            assert getattr(p, key) == value, key
    assert (p.init, p.distance, p.match_batches, p.match_network) == ("real", "dc", "mixed", "interpolated")
    assert (p.real_batch, p.outer_loop, p.inner_loop, p.image_lr, p.image_momentum) == (50, 3, 1, 0.5, 0.5)
    assert (p.net_lr, p.net_momentum, p.clip_norm, p.wire_dtype) == (0.01, 0.5, 0.0, "float32")
    s = p.server
    assert (s.epochs, s.lr, s.momentum, s.weight_decay, s.batch_size) == (10, 0.01, 0.0, 1e-3, 64)
    assert p.condense_iterations == FedDC.Params().condense_iterations  # K is the method's: not in the code


def test_keys_a_config_gives_win_over_the_preset() -> None:
    p = build_params(
        FedDC.Params,
        {"reading": "authors_code", "condense_iterations": 0, "real_batch": 20, "server": {"epochs": 3}},
    )
    assert (p.condense_iterations, p.real_batch, p.server.epochs) == (0, 20, 3)
    assert (p.server.batch_size, p.server.weight_decay, p.init) == (64, 1e-3, "real")  # the rest: the preset's


def test_the_default_reading_is_the_papers_and_unchanged() -> None:
    assert build_params(FedDC.Params, {}) == FedDC.Params()
    p = FedDC.Params()
    assert (p.reading, p.match_batches, p.match_network, p.outer_loop, p.inner_loop) == (
        "paper", "per_class", "fresh", 1, 0,
    )
    assert FedDCPlus.Params().reading == "paper"


def test_an_unknown_reading_names_the_allowed_words() -> None:
    with pytest.raises(ConfigError, match="reading"):
        build_params(FedDC.Params, {"reading": "authors"}, prefix="algorithm.")


# ---- the interpolated matching network -------------------------------------------------------------


def _states() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    local = {"w": torch.randn(5, 4, generator=g), "b": torch.randn(4, generator=g), "n": torch.tensor(3)}
    glob = {"w": torch.randn(5, 4, generator=g), "b": torch.randn(4, generator=g), "n": torch.tensor(9)}
    return local, glob


def test_interpolation_lies_between_the_local_and_the_global_weights() -> None:
    local, glob = _states()
    assert torch.equal(interpolate(local, glob, 0.0)["w"], local["w"])
    assert torch.allclose(interpolate(local, glob, 1.0)["w"], glob["w"])
    for ratio in (0.01, 0.37, 0.99):
        mixed = interpolate(local, glob, ratio)
        for k in ("w", "b"):
            low, high = torch.minimum(local[k], glob[k]), torch.maximum(local[k], glob[k])
            assert bool(((mixed[k] >= low - 1e-6) & (mixed[k] <= high + 1e-6)).all())
            assert torch.allclose(mixed[k], ratio * glob[k] + (1 - ratio) * local[k], atol=1e-6)
        assert int(mixed["n"]) == 3  # counters are the local model's


class _Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)


def test_each_draw_of_the_network_is_a_new_ratio_of_a_shuffled_hundred() -> None:
    local = {k: torch.zeros_like(v) for k, v in _Lin().state_dict().items()}
    glob = {k: torch.ones_like(v) for k, v in local.items()}
    factory = interpolated_networks(_Lin, local, glob, torch.Generator().manual_seed(1))
    ratios = [round(float(factory().lin.weight[0, 0].detach()), 6) for _ in range(200)]
    assert sorted(ratios[:100]) == [round(i / 100, 6) for i in range(100)]  # each of 0..0.99 once
    assert ratios[:100] != sorted(ratios[:100])  # shuffled
    assert ratios[100:] == ratios[:100]  # then the same order again, as the authors' ratio_list[it % 100]


# ---- mixed-class real batches ----------------------------------------------------------------------


class _Recorder(nn.Module):
    """A small network that notes the label encoded in each image of every batch it sees."""

    seen: ClassVar[list[list[int]]] = []

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _Recorder.seen.append([int(v) for v in x[:, 0, 0, 0].detach().round().tolist()])
        return self.lin(x.flatten(1))


def _labelled_set() -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.arange(3).repeat_interleave(20)[torch.randperm(60, generator=torch.Generator().manual_seed(2))]
    x = y.float().view(-1, 1, 1, 1).expand(-1, 1, 2, 2).clone()
    return x, y


@pytest.mark.parametrize("batches", ["mixed", "per_class"])
def test_mixed_batches_draw_across_classes_per_class_batches_do_not(batches: str) -> None:
    x, y = _labelled_set()
    _Recorder.seen = []
    cfg = GMConfig(iterations=1, ipc=1, real_batch=8, batches=batches, init="real", outer_loop=2, inner_loop=0)
    syn = gradient_matching(x, y, _Recorder, cfg, torch.Generator().manual_seed(3), batched_ok=False)
    assert syn.images.shape[0] == 3
    real = [b for b in _Recorder.seen if len(b) == 8 or (batches == "mixed" and len(b) == 4)]
    if batches == "mixed":
        assert len(real) == 2 * 8  # two passes of ceil(60 / 8) batches
        first_pass = [v for b in real[:8] for v in b]
        assert sorted(first_pass) == sorted(y.tolist())  # a pass covers the whole local set once
        assert sum(len(set(b)) > 1 for b in real) >= len(real) - 1  # batches hold several classes
    else:
        assert real and all(len(set(b)) == 1 for b in real)  # each real batch one class


def test_committed_behaviour_uploads_one_real_image_per_held_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = feddc_config(reading="authors_code", condense_iterations=0)
    sim, _, made, uploads, _ = run_recording(cfg, tmp_path / "r", monkeypatch)
    for (cid, _), images in zip(uploads[0], made, strict=False):
        x, y = sim.fed.client_data(cid)
        x = x.to(images.device)
        labels = sorted(set(y.tolist()))
        assert images.shape[0] == len(labels)
        for image, label in zip(images, labels, strict=True):
            own = x[y == label]
            assert bool((own - image).flatten(1).abs().amax(dim=1).eq(0).any())  # an unchanged real image
    assert all(m.arrays["syn.images"].dtype == torch.float32 for _, m in uploads[0])


def test_the_authors_reading_runs_and_changes_the_images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = feddc_config(reading="authors_code", condense_iterations=2)
    sim, records, made, uploads, _ = run_recording(cfg, tmp_path / "r", monkeypatch)
    assert len(records) == 2 and all(r["synthetic_images"] > 0 for r in records)
    cid = uploads[0][0][0]
    x, _ = sim.fed.client_data(cid)
    first = made[0]
    distances = torch.cdist(first.flatten(1), x.to(first.device).flatten(1)).amin(dim=1)
    assert bool((distances > 0).all())  # matching moved every image off its real start


def test_every_new_option_is_checked() -> None:
    for key, bad in (("outer_loop", 0), ("inner_loop", -1), ("net_momentum", -0.1), ("clip_norm", -1.0)):
        with pytest.raises(ConfigError, match=key):
            build_params(FedDC.Params, {key: bad})
    for key, bad in (("match_batches", "random"), ("match_network", "global")):
        with pytest.raises(ConfigError, match=key):
            build_params(FedDC.Params, {key: bad})
