"""CCVR: the pooled class statistics, the virtual features, the classifier-only calibration and its wire cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.ccvr import (
    calibrate_classifier,
    class_feature_stats,
    pooled_feature_stats,
    sample_virtual_features,
)
from fedskew.config import typed_config, validate
from fedskew.core.errors import ConfigError
from fedskew.engine.experiment import resume_run
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.runs import assert_resumes_exactly, run_records

C = 4  # classes of the tiny config


def _cfg(rounds: int = 2, **algo: Any) -> dict[str, Any]:
    cfg = tiny_config(rounds=rounds)
    cfg["algorithm"] = {"name": "ccvr", "clients_per_round": 3, "batch_size": 16, "lr": 0.1, **algo}
    return cfg


def _run(cfg: dict[str, Any], path: Path) -> tuple[RoundLoop, list[dict[str, Any]]]:
    sim = RoundLoop(typed_config(cfg), path, progress=False)
    sim.run()
    return sim, [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_pooled_statistics_equal_those_of_the_pooled_features() -> None:
    """Two clients, four classes: class 0 on both, 1 on both (one sample on client 0), 2 only on client 1 with a
    single sample, 3 nowhere; the paper's combination gives the pooled mean and unbiased covariance."""
    g = torch.Generator().manual_seed(3)
    y0 = torch.tensor([0, 0, 0, 0, 0, 1])
    y1 = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2])
    z0 = torch.randn(len(y0), 3, generator=g, dtype=torch.float64) + 2.0
    z1 = torch.randn(len(y1), 3, generator=g, dtype=torch.float64) * 3.0 - 1.0
    stats = [class_feature_stats(z, y, C) for z, y in ((z0, y0), (z1, y1))]
    counts, mean, cov = pooled_feature_stats(*(torch.stack([s[i] for s in stats]) for i in range(3)))
    z, y = torch.cat([z0, z1]), torch.cat([y0, y1])
    assert counts.tolist() == [9, 4, 1, 0]
    for c in (0, 1):
        zc = z[y == c]
        torch.testing.assert_close(mean[c], zc.mean(dim=0))
        torch.testing.assert_close(cov[c], torch.cov(zc.T))  # unbiased, as the clients' are
    torch.testing.assert_close(mean[2], z[y == 2][0])
    assert torch.count_nonzero(cov[2]) == 0 and torch.count_nonzero(mean[3]) == 0 and torch.count_nonzero(cov[3]) == 0
    assert torch.count_nonzero(stats[0][2][1]) == 0  # one sample of class 1 on client 0: no covariance of its own


def test_virtual_features_have_the_shared_means_and_covariances() -> None:
    """n = 40000 draws per class. The sample mean's standard error is sqrt(Sigma_ii / n) <= sqrt(4 / 40000) =
    0.01, so a tolerance of 0.05 is 5 standard errors; a sample covariance entry's standard error is
    sqrt((Sigma_ii Sigma_jj + Sigma_ij^2) / n) <= sqrt(32 / 40000) ~ 0.028, so 0.15 is over 5."""
    n = 40000
    a = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.5, -0.5, 0.5]], dtype=torch.float64)
    full = a @ a.T  # positive definite, largest variance 4
    singular = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)  # rank 1
    mean = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
    cov = torch.stack([full, singular, torch.zeros(3, 3, dtype=torch.float64)])
    counts = torch.tensor([10, 2, 0])  # class 2 held by nobody: no draws
    x, y = sample_virtual_features(counts, mean, cov, n, 0.0, torch.Generator().manual_seed(0))
    assert y.tolist() == [0] * n + [1] * n
    for c in (0, 1):
        xc = x[y == c]
        torch.testing.assert_close(xc.mean(dim=0), mean[c], atol=0.05, rtol=0)
        torch.testing.assert_close(torch.cov(xc.T), cov[c], atol=0.15, rtol=0)
    x1 = x[y == 1] - mean[1]
    assert torch.allclose(x1[:, 0], x1[:, 1]) and torch.allclose(x1[:, 2], torch.zeros(n, dtype=torch.float64))
    again, _ = sample_virtual_features(counts, mean, cov, n, 0.0, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)  # the server's seeded stream: the same draws on a resume
    ridged, _ = sample_virtual_features(counts, mean, cov, n, 0.5, torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.cov(ridged[y == 1].T), singular + 0.5 * torch.eye(3, dtype=torch.float64),
                               atol=0.15, rtol=0)


def test_calibration_trains_the_given_head_only() -> None:
    head = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in head.parameters()]
    x = torch.cat([torch.randn(50, 3) + 2, torch.randn(50, 3) - 2]).double()
    y = torch.tensor([0] * 50 + [1] * 50)
    calibrate_classifier(head, x, y, 0.1, 16, 2, torch.Generator().manual_seed(0))
    assert all(not torch.equal(b, p) for b, p in zip(before, head.parameters(), strict=True))


def test_calibration_changes_only_the_classifier_and_training_stays_fedavgs(tmp_path: Path) -> None:
    """CCVR's run equals FedAvg's except the final classifier: the feature extractor is FedAvg's bit for bit,
    the uncalibrated classifier the server keeps is FedAvg's, and the calibrated one differs."""
    sim, recs = _run(_cfg(), tmp_path / "ccvr")
    cfg = _cfg()
    cfg["algorithm"]["name"] = "fedavg"
    avg, avg_recs = _run(cfg, tmp_path / "fedavg")
    ours, theirs = sim.server.model.state_dict(), avg.server.model.state_dict()
    for k in theirs:
        if k.startswith("classifier."):
            assert not torch.equal(ours[k], theirs[k]), k
            assert torch.equal(sim.server.state["uncalibrated." + k[len("classifier."):]], theirs[k])
        else:
            assert torch.equal(ours[k], theirs[k]), k
    assert "calibrated" not in recs[0] and recs[1]["calibrated"] is True  # "final": after the last round only
    assert recs[1]["statistics_from"] == list(range(6))
    assert [r["clients"] for r in recs] == [r["clients"] for r in avg_recs]
    assert [r["samples"] for r in recs] == [r["samples"] for r in avg_recs]
    assert recs[0]["accuracy"] == avg_recs[0]["accuracy"]


def test_the_feature_statistics_are_on_the_byte_ledger(tmp_path: Path) -> None:
    """Round 2 (the last) adds the model to all six clients and their statistics: C int64 counts, C x D float32
    means and C x D x D float32 covariances each, D the embedding width (the MLP's hidden layer, 32)."""
    sim, recs = _run(_cfg(), tmp_path)
    model_bytes = sum(t.numel() * t.element_size() for t in sim.server.model.state_dict().values())
    d = 32
    stats_bytes = C * 8 + C * d * 4 + C * d * d * 4
    assert recs[0]["bytes_server_to_client"] == recs[0]["bytes_client_to_server"] == 3 * model_bytes
    assert recs[1]["bytes_server_to_client"] == (3 + 6) * model_bytes
    assert recs[1]["bytes_client_to_server"] == 3 * model_bytes + 6 * stats_bytes


def test_every_round_calibration_resumes_exactly(tmp_path: Path) -> None:
    full = assert_resumes_exactly(tmp_path, lambda rounds: _cfg(rounds, calibrate="every_round"))
    recs = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert all(r["calibrated"] is True for r in recs)


def test_a_finished_final_calibration_extended_trains_on_from_the_uncalibrated_classifier(tmp_path: Path) -> None:
    """``calibrate = "final"`` calibrates whatever round ends the run. A finished 2-round run resumed to 4 rounds
    keeps its calibrated round 2 (the 4-round run's round 2 is not calibrated), and its rounds 3 and 4 are the
    4-round run's, byte for byte: the training went on from the kept uncalibrated classifier."""
    full, part = tmp_path / "full", tmp_path / "part"
    run_records(_cfg(4), full)
    run_records(_cfg(2), part)
    resume_run(part, {"rounds": 4}, data_dir=None, progress=False)
    ours = (part / "metrics.jsonl").read_text().splitlines()
    theirs = (full / "metrics.jsonl").read_text().splitlines()
    assert json.loads(ours[1])["calibrated"] is True and "calibrated" not in json.loads(theirs[1])
    assert ours[0] == theirs[0] and ours[2:] == theirs[2:]
    assert json.loads(ours[3])["calibrated"] is True


@pytest.mark.parametrize(("key", "value", "words"), [
    ("calibrate", "sometimes", "calibrate"),
    ("virtual_per_class", 0, "virtual_per_class"),
    ("calibration_lr", 0.0, "calibration_lr"),
    ("calibration_epochs", 0, "calibration_epochs"),
    ("ridge", -1.0, "ridge"),
])
def test_bad_parameters_are_refused_in_one_line(key: str, value: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        validate(_cfg(**{key: value}))
    assert "\n" not in str(err.value)
