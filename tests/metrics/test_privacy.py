"""Privacy checks: nearest neighbours, SSIM, membership-inference AUC, and the audit of a run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from fedskew.audit import audit_run
from fedskew.config import dump, typed_config
from fedskew.core.errors import FedskewError
from fedskew.engine.round_loop import RoundLoop
from fedskew.metrics.privacy import auc, nearest_neighbours, ssim
from tests.helpers.configs import tiny_config


def test_nearest_neighbours_by_hand() -> None:
    pool = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.0]])
    q = torch.tensor([[0.9, 1.0], [0.0, 0.1]])
    d, i = nearest_neighbours(q, pool)
    assert i.tolist() == [1, 0]
    assert d[0].item() == pytest.approx(np.sqrt(0.01 / 2), rel=1e-5)
    assert d[1].item() == pytest.approx(np.sqrt(0.01 / 2), rel=1e-5)


def test_ssim_identity_symmetry_and_noise() -> None:
    g = torch.Generator().manual_seed(0)
    a = torch.rand(4, 3, 16, 16, generator=g)
    b = (a + 0.3 * torch.randn(a.shape, generator=g)).clamp(0, 1)
    assert torch.allclose(ssim(a, a), torch.ones(4), atol=1e-5)
    assert torch.allclose(ssim(a, b), ssim(b, a), atol=1e-6)
    assert (ssim(a, b) < 0.9).all()
    assert ssim(torch.rand(2, 1, 8, 8), torch.rand(2, 1, 8, 8)).shape == (2,)  # small images work


def test_auc_matches_sklearn_and_edges() -> None:
    rng = np.random.default_rng(0)
    m, n = rng.normal(1, 1, 50), rng.normal(0, 1, 70)
    m[:5] = n[:5]  # ties
    expected = roc_auc_score(np.r_[np.ones(50), np.zeros(70)], np.r_[m, n])
    assert auc(m, n) == pytest.approx(expected)
    assert auc(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0
    assert auc(np.ones(3), np.ones(4)) == 0.5


def _run_with_synthetic(tmp_path: Path, kind: str) -> Path:
    cfg = tiny_config(rounds=1)
    run = tmp_path / kind
    run.mkdir()
    (run / "config.toml").write_text(dump(cfg))
    sim = RoundLoop(typed_config(cfg), run, progress=False)
    sim.run()
    fed = sim.fed
    mean = torch.tensor(fed.info.mean).view(1, -1, 1, 1)
    std = torch.tensor(fed.info.std).view(1, -1, 1, 1)
    imgs, labels, clients = [], [], []
    for k in range(3):
        x, y = fed.client_data(k)
        if kind == "copies":  # a "condensation" that sends raw images: must be flagged
            u8 = ((x[:4] * std + mean).clamp(0, 1) * 255).round().to(torch.uint8)
        else:  # pure noise: nothing to learn about the client
            u8 = torch.randint(0, 256, x[:4].shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(k))
        imgs.append(u8)
        labels.append(y[:4])
        clients.append(torch.full((len(u8),), k, dtype=torch.int64))
    sim.round = 1
    sim._save_artifact("synthetic", {"images": torch.cat(imgs), "labels": torch.cat(labels),
                                     "clients": torch.cat(clients)})
    return run


def test_audit_flags_copies_and_not_noise(tmp_path: Path) -> None:
    copies = audit_run(_run_with_synthetic(tmp_path, "copies"), epochs=5)
    noise = audit_run(_run_with_synthetic(tmp_path, "noise"), epochs=5)
    assert copies.syn_nn_rmse_median < 0.01 and copies.syn_nn_ssim_mean > 0.99
    assert copies.nn_ratio < 0.05
    assert noise.nn_ratio > 1.0 and noise.syn_nn_ssim_mean < 0.5
    assert copies.mia_auc is not None and 0.0 <= copies.mia_auc <= 1.0 and copies.synthetic_images == 12


def test_audit_of_a_run_without_synthetic_data(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=1)
    (tmp_path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), tmp_path, progress=False).run()
    with pytest.raises(FedskewError, match="holds no synthetic images"):
        audit_run(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == 1


def test_fedskew_audit_puts_its_table_in_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedskew.cli import main

    runs = tmp_path / "runs"
    runs.mkdir()
    _run_with_synthetic(runs, "copies")
    _run_with_synthetic(runs, "noise")
    assert main(["audit", str(runs), "--epochs", "2"]) == 0
    captured = capsys.readouterr()
    assert "MIA AUC" in captured.out
    # Progress (issue 36, point 8): stderr is no terminal here, so plain lines, one per run at least.
    progress = [line for line in captured.err.splitlines() if line.startswith("audit ")]
    assert [line.split(":")[0] for line in progress] == ["audit copies", "audit noise"]
    assert all(" 5/5 step" in line for line in progress) and "\r" not in captured.err
    table = (runs / "report" / "audit.md").read_text()
    assert table.count("\n") == 4  # header, rule, one row per audited run
    page = (runs / "report" / "report.html").read_text()
    assert "Privacy audit" in page and "NN RMSE held-out" in page and "synthetic images" in page
    # One image grid per label (both runs carry the tiny config's label), inlined in the page.
    grids = sorted((runs / "report").glob("synthetic_*.png"))
    assert len(grids) == 1 and grids[0].stem in page
    # A damaged audit.json is named in a one-line error, not a traceback.
    next(runs.rglob("audit.json")).write_text("{not json")
    assert main(["report", str(runs)]) == 2
    assert "audit.json" in capsys.readouterr().err
