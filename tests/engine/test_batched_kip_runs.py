"""The batched runner distils HFLDD's clients together (issue 34): whole runs against the sequential runner; what
does not batch (FedDM's and FedAF's distribution matching, FedDC's gradient matching, KIP's random ConvNet kernel)
runs in its job and says so once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from fedskew.components import batched_kip
from fedskew.config import typed_config
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.batched import final_model, max_diff
from tests.helpers.configs import config_for, tiny_config
from tests.helpers.spies import spy_calls

FAST: dict[str, Any] = {"condense_iterations": 3, "ipc": 2, "real_batch": 8, "clients_per_round": 4,
                        "server": {"epochs": 2, "batch_size": 16, "lr": 0.1}}


def _config(algorithm: dict[str, Any], norm: str, **over: Any) -> dict[str, Any]:
    cfg = tiny_config(rounds=2, checkpoint_every=0, algorithm={**FAST, **algorithm}, **over,
                      partition={"name": "dirichlet", "num_clients": 6, "alpha": 0.3, "min_size": 5})
    cfg["model"] = {"name": "convnet", "net_width": 6, "net_depth": 2, "net_norm": norm}
    return cfg


@pytest.mark.parametrize("algorithm", ["feddm", "fedaf"])
def test_distribution_matching_runs_in_its_job_as_the_sequential_runner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, algorithm: str
) -> None:
    """FedDM's and FedAF's matching has no batched form: under the batched runner each client matches in its job,
    bit for bit as the sequential runner (BatchNorm ConvNet and the server's training, as the FedAF configs; FedAF's
    round 2 with its CDC term), and the runner says so once."""
    sequential = final_model(_config({"name": algorithm}, "batchnorm"), tmp_path / "seq")
    with caplog.at_level(logging.WARNING, logger="fedskew.engine.batched_runner"):
        together = final_model(_config({"name": algorithm}, "batchnorm", clients_in_parallel=4), tmp_path / "bat")
    assert max_diff(sequential, together) == 0.0
    said = [r.message for r in caplog.records if "clients_in_parallel" in r.message]
    assert len(said) == 1
    assert "condensation one at a time: distribution matching has no batched form" in said[0]


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
    ("feddm", {}, "distribution matching has no batched form"),
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
