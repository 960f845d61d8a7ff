"""FedETF: the fixed simplex-ETF classifier, its projection and temperature, and the fine-tuned own models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.base import ClientContext
from fedskew.algorithms.fedetf import ETF_KEY, PROJECTION, FedETF, balanced_logits
from fedskew.config import typed_config, validate
from fedskew.core.errors import ConfigError
from fedskew.core.message import Message, state_to_arrays
from fedskew.core.seeding import torch_generator
from fedskew.engine.round_loop import RoundLoop
from fedskew.models.heads import ETFClassifier, simplex_etf
from tests.helpers.configs import config_for


def _config(**algorithm: Any) -> dict[str, Any]:
    cfg = config_for("fedetf", rounds=2)
    cfg["partition"]["client_test_fraction"] = 0.25
    cfg["algorithm"].update({"finetune_rounds": 2, **algorithm})
    return cfg


@pytest.mark.parametrize("dim", [9, 10, 16])
def test_the_frame_is_a_simplex_etf(dim: int) -> None:
    k = 10
    v = simplex_etf(k, dim, torch_generator(0, "fedetf", "etf")).double()
    assert v.shape == (k, dim)
    gram = v @ v.T
    off = ~torch.eye(k, dtype=torch.bool)
    torch.testing.assert_close(gram.diagonal(), torch.ones(k, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(gram[off], torch.full((k * (k - 1),), -1 / (k - 1), dtype=torch.float64),
                               atol=1e-6, rtol=0)
    again = simplex_etf(k, dim, torch_generator(0, "fedetf", "etf"))
    assert torch.equal(again, v.float())  # from the seed alone
    assert not torch.equal(simplex_etf(k, dim, torch_generator(1, "fedetf", "etf")), again)


def test_a_frame_needs_dim_at_least_k_minus_one() -> None:
    with pytest.raises(ConfigError, match="dim >= 9"):
        simplex_etf(10, 8, torch_generator(0, "x"))


def test_head_normalises_the_projection_and_scales_by_the_temperature() -> None:
    head = ETFClassifier(5, 4, 3, 2.5, torch_generator(0, "x"))
    z = torch.randn(7, 5)
    h = head.projection(z)
    expected = 2.5 * (h / h.norm(dim=1, keepdim=True)) @ head.etf.T
    torch.testing.assert_close(head(z), expected)
    assert "etf" in dict(head.named_buffers()) and "etf" not in dict(head.named_parameters())
    assert {n for n, _ in head.named_parameters()} == {"projection.weight", "projection.bias", "temperature"}


def test_balanced_logits_add_log_counts_and_drop_absent_classes() -> None:
    out = balanced_logits(torch.zeros(2, 3), torch.tensor([1, 0, 4]))
    assert out[0, 1] == float("-inf")
    torch.testing.assert_close(out[:, 2], torch.full((2,), float(torch.tensor(4.0).log())))


@pytest.mark.parametrize(("over", "words"), [
    ({"etf_dim": 2}, "etf_dim must be 0"),
    ({"temperature_init": 0.0}, "temperature_init"),
    ({"finetune_epochs": 0}, "finetune_epochs"),
    ({"finetune_etf_lr": -1.0}, "finetune_etf_lr"),
])
def test_bad_values_are_refused_in_one_line(tmp_path: Path, over: dict[str, Any], words: str) -> None:
    cfg = _config(**over)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
        RoundLoop(typed_config(cfg), tmp_path, progress=False)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_frame_is_fixed_and_shared_the_projection_trains_and_own_models_are_recorded(tmp_path: Path) -> None:
    cfg = _config()
    sim = RoundLoop(typed_config(cfg), tmp_path, progress=False)
    algo = sim.algorithm
    assert isinstance(algo, FedETF)
    before = {k: v.clone() for k, v in sim.server.model.state_dict().items()}
    # A client (a worker, a Flower node) builds the model from the method's spec, whatever its RNG state.
    client_model = algo.fed.model.build()
    assert isinstance(client_model.classifier, ETFClassifier)
    assert torch.equal(client_model.state_dict()[ETF_KEY], before[ETF_KEY])
    assert torch.equal(algo.etf(), before[ETF_KEY])
    assert before[ETF_KEY].shape == (4, 4)  # etf_dim 0: the number of classes
    recs = sim.run().records
    after = sim.server.model.state_dict()
    assert torch.equal(after[ETF_KEY], before[ETF_KEY])  # bit for bit, after two rounds of averaging
    assert all(not torch.equal(after[k], before[k]) for k in PROJECTION)
    assert not torch.equal(after["classifier.temperature"], before["classifier.temperature"])
    assert all(r["personal_accuracy_mean"] is not None and r["accuracy"] is not None for r in recs)
    spec = algo.reply_spec("train", sim.server)
    assert spec is not None and ETF_KEY not in spec and set(PROJECTION) <= set(spec)


def test_the_own_model_fine_tunes_frame_and_projection_and_leaves_the_message(tmp_path: Path) -> None:
    sim = RoundLoop(typed_config(_config(finetune_rounds=1)), tmp_path, progress=False)
    algo = sim.algorithm
    assert isinstance(algo, FedETF)
    glob = state_to_arrays(sim.server.model.state_dict())
    kept = {k: v.clone() for k, v in glob.items()}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 1, 8, 8, generator=g), torch.arange(24) % 3
    client = ClientContext(cid=0, round=1, x=x, y=y, fed=algo.fed)
    own = algo.personal_state(Message(arrays=glob), client)
    assert all(torch.equal(glob[k], kept[k]) for k in kept)  # the global model is untouched
    assert not torch.equal(own[ETF_KEY], glob[ETF_KEY])  # the local adaptation moves the frame
    assert all(not torch.equal(own[k], glob[k]) for k in PROJECTION)
    again = algo.personal_state(Message(arrays=glob), client)
    assert all(torch.equal(own[k], again[k]) for k in own)  # reproducible from the client's stream
