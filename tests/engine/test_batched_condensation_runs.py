"""The batched runner condenses FedDM's, FedAF's and HFLDD's clients together (issue 34): whole runs against the
sequential runner; what does not batch (FedDC's gradient matching, KIP's random ConvNet kernel) says so once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

import fedskew.algorithms.fedaf as fedaf_module
import fedskew.algorithms.feddm as feddm_module
from fedskew.components import batched_condensation, batched_kip
from fedskew.config import typed_config
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.batched import federation64, final_model, max_diff
from tests.helpers.configs import config_for, tiny_config
from tests.helpers.spies import spy_calls

TOL = 1e-9
FAST: dict[str, Any] = {"condense_iterations": 3, "ipc": 2, "real_batch": 8, "clients_per_round": 4,
                        "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}}
NO_SERVER: dict[str, Any] = {"server": {"epochs": 0}}
"""In float64: the server trains on the uploads decoded as float32 images, which a float64 model refuses."""


@pytest.fixture
def matched(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The images every FedDM and FedAF client's ``distribution_matching`` returned, in call order."""
    out: list[torch.Tensor] = []
    for module in (feddm_module, fedaf_module):
        run = module.distribution_matching

        def recording(*args: Any, _run: Any = run, **kwargs: Any) -> Any:
            syn = _run(*args, **kwargs)
            out.append(syn.images.detach().clone())
            return syn

        monkeypatch.setattr(module, "distribution_matching", recording)
    return out


terms: list[list[str]] = []


@pytest.fixture
def condensed(monkeypatch: pytest.MonkeyPatch) -> list[list[torch.Tensor]]:
    """The images of every batched condensation's clients; ``terms`` the kinds of their extra loss terms."""
    calls: list[list[torch.Tensor]] = []
    run = batched_condensation.condense_batched

    def spying(requests: Any) -> Any:
        out = run(requests)
        calls.append([s.images for s in out])
        terms.append([type(r.extra_loss).__name__ for r in requests])
        return out

    monkeypatch.setattr(batched_condensation, "condense_batched", spying)
    terms.clear()
    return calls


def _config(algorithm: dict[str, Any], norm: str, **over: Any) -> dict[str, Any]:
    cfg = tiny_config(rounds=2, checkpoint_every=0, algorithm={**FAST, **algorithm}, **over,
                      partition={"name": "dirichlet", "num_clients": 6, "alpha": 0.3, "min_size": 5})
    cfg["model"] = {"name": "convnet", "net_width": 6, "net_depth": 2, "net_norm": norm}
    return cfg


@pytest.mark.parametrize("norm", ["instancenorm", "batchnorm"])
@pytest.mark.parametrize("algorithm", [
    {"name": "feddm"},
    {"name": "fedaf"},  # round 2 has the global logits: the CDC term, batched too
])
def test_batched_condensation_equals_sequential_in_float64(
    tmp_path: Path, float64: None, matched: list[torch.Tensor], condensed: list[list[torch.Tensor]],
    algorithm: dict[str, Any], norm: str,
) -> None:
    algorithm = {**algorithm, **NO_SERVER}
    seq_cfg = _config(algorithm, norm)
    fed = federation64(seq_cfg)
    final_model(seq_cfg, tmp_path / "seq", fed)
    sequential = list(matched)
    matched.clear()
    assert not condensed and len(sequential) == 8  # 2 rounds of 4 clients
    final_model(_config(algorithm, norm, clients_in_parallel=4), tmp_path / "bat", fed)
    assert len(condensed) == 2 and all(len(c) == 4 for c in condensed)  # each round's four clients together
    assert len(matched) == 8
    if algorithm["name"] == "fedaf":  # round 1 without the CDC term, round 2 with it
        assert terms == [["NoneType"] * 4, ["ClassSWD"] * 4]
    for alone, together in zip(sequential, matched, strict=True):
        assert together.dtype == torch.float64
        assert alone.shape == together.shape
        assert (alone - together).abs().max().item() <= TOL


@pytest.mark.parametrize("algorithm", [{"name": "feddm"}, {"name": "fedaf"}])
def test_batched_condensation_runs_as_sequential_in_float32(
    tmp_path: Path, condensed: list[list[torch.Tensor]], algorithm: dict[str, Any]
) -> None:
    """The whole run with the server's training (BatchNorm ConvNet, as the FedAF configs): the global model
    of the sequential runner up to float32 rounding (and 8-bit uploads)."""
    sequential = final_model(_config(algorithm, "batchnorm"), tmp_path / "seq")
    together = final_model(_config(algorithm, "batchnorm", clients_in_parallel=4), tmp_path / "bat")
    assert len(condensed) == 2
    assert max_diff(sequential, together) <= 1e-4


def test_fallback_condenses_as_the_sequential_runner(
    tmp_path: Path, condensed: list[list[torch.Tensor]], caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A condensation that cannot batch runs in its job, bit for bit as alone, and the runner says so once."""
    monkeypatch.setattr("fedskew.components.batching.why_dm_sequential", lambda request: "a test's reason")
    cfg = _config({"name": "feddm"}, "instancenorm")
    sequential = final_model(cfg, tmp_path / "seq")
    with caplog.at_level(logging.WARNING, logger="fedskew.engine.batched_runner"):
        fallback = final_model(_config({"name": "feddm"}, "instancenorm", clients_in_parallel=4), tmp_path / "bat")
    assert max_diff(sequential, fallback) == 0.0
    assert not condensed
    said = [r.message for r in caplog.records if "clients_in_parallel" in r.message]
    assert len(said) == 1 and "condensation one at a time: a test's reason" in said[0]


@pytest.mark.slow
def test_hfldd_distils_its_clients_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HFLDD's KIP (NTK kernel) batched: float32, the sequential runner's global model up to rounding."""
    calls = spy_calls(monkeypatch, batched_kip, "kip_batched")

    def config(width: int) -> dict[str, Any]:
        cfg = config_for("hfldd", rounds=2, clients_in_parallel=width)
        cfg["algorithm"]["kip_init"] = "class_mean"  # no repeated start images (those run one client at a time)
        cfg["model"] = {"name": "cnn"}
        return cfg

    sequential = final_model(config(1), tmp_path / "s")
    assert not calls
    together = final_model(config(3), tmp_path / "b")
    assert calls and max(calls) >= 2  # several clients' KIP in one batch
    assert max_diff(sequential, together) <= 1e-4


@pytest.mark.parametrize(("name", "over", "words"), [
    ("hfldd", {"kip_kernel": "rf_convnet", "kip_iterations": 5}, "rf_convnet kernel draws networks"),
    ("feddc", {}, "gradient matching has no batched form"),
])
def test_what_does_not_batch_says_once_it_runs_one_client_at_a_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, over: dict[str, Any], words: str
) -> None:
    cfg = config_for(name, rounds=1, clients_in_parallel=3)
    cfg["algorithm"].update(over)
    cfg["model"] = {"name": "cnn"}
    with caplog.at_level(logging.WARNING, logger="fedskew.engine.batched_runner"):
        RoundLoop(typed_config(cfg), tmp_path / name, progress=False).run()
    said = [r.message for r in caplog.records if words in r.message]
    assert len(said) == 1 and "condensation one at a time" in said[0]
