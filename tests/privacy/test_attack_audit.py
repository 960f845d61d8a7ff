"""``fedskew audit --attack``: DLG/iDLG on a config and on finished runs, in one table with the upload audit,
and its bad values refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedskew.cli import main
from fedskew.config import dump, typed_config
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.metrics.test_privacy import _run_with_synthetic


def _config_file(tmp_path: Path, **over: object) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(dump(tiny_config(rounds=1, **over)))
    return path


def test_an_attack_on_a_config_scores_each_privacy_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config_file(tmp_path)
    out = tmp_path / "out"
    assert main(["audit", str(config), "--attack", "idlg", "--attack-iterations", "4", "--dp-mode", "local",
                 "--noise-multiplier", "0.01", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    rows = json.loads((out / "tiny-seed0" / "audit.json").read_text())
    assert [r["leak"] for r in rows] == ["iDLG on gradient, B=1", "iDLG on gradient, B=1, DP local z=0.01 C=1",
                                         "iDLG on gradient, B=1, DP local z=1 C=1"]
    assert all(r["leak"] in captured.out for r in rows) and "PSNR held-out" in captured.out
    # The tiny model is an MLP: its first layer's gradient holds the image itself, so the clean attack is
    # exact (measured: 100 dB, the cap, and SSIM 1.000), and noise at z = 1 leaves nothing (6.4 dB, SSIM 0.10).
    clean, _, noisy = rows
    assert clean["syn_nn_psnr_mean"] > 60 and clean["syn_nn_ssim_mean"] > 0.99
    assert clean["attack"]["label_accuracy"] == 1.0 and clean["attack"]["nearest_is_attacked"] == 1.0
    assert noisy["syn_nn_psnr_mean"] < clean["syn_nn_psnr_mean"] - 30 and noisy["nn_ratio"] > 1
    assert noisy["attack"]["noise_multiplier"] == 1.0 and noisy["mia_auc"] is None
    assert (out / "tiny-seed0" / clean["attack"]["grid"]).stat().st_size > 0
    # The progress bar: plain lines (stderr is no terminal here), complete at the end.
    assert "attack tiny (iDLG): 12/12 step" in captured.err


def test_one_table_holds_uploads_and_an_attack_on_a_weight_sharing_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    _run_with_synthetic(runs, "copies")  # a "condensation" that sends raw images
    cfg = tiny_config(rounds=1, label="fedavg")
    fedavg = runs / "fedavg"
    fedavg.mkdir()
    (fedavg / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), fedavg, progress=False).run()
    # The weight-sharing run's privacy table gives the DP row.
    (fedavg / "config.toml").write_text(dump({**cfg, "privacy": {"mode": "sample", "noise_multiplier": 0.5}}))
    assert main(["audit", str(runs), "--epochs", "2", "--attack", "dlg", "--attack-iterations", "2",
                 "--no-progress"]) == 0
    table = (runs / "report" / "audit.md").read_text().splitlines()
    assert len(table) == 5  # header, rule, the uploads' row, the attack's two rows
    assert "| tiny | synthetic images |" in table[2]
    assert "| fedavg | DLG on gradient, B=1 |" in table[3] and "DP sample z=0.5 C=1" in table[4]
    assert isinstance(json.loads((fedavg / "audit.json").read_text()), list)
    assert (fedavg / "attack_dlg.png").is_file()
    assert "DLG on gradient" in (runs / "report" / "report.html").read_text()
    capsys.readouterr()
    # Without --attack the weight-sharing run is left out, as before.
    assert main(["audit", str(fedavg), "--no-progress"]) == 2
    assert "--attack dlg or idlg scores weight-sharing runs" in capsys.readouterr().err


@pytest.mark.parametrize(("words", "message"), [
    (["--attack", "foo"], "--attack must be one of 'dlg', 'idlg', got 'foo'"),
    (["--attack", "dlg", "--attack-iterations", "0"], "--attack-iterations must be an integer in [1, 1_000_000]"),
    (["--attack", "dlg", "--attack-lr", "abc"], "--attack-lr must be a number"),
    (["--attack", "dlg", "--attack-batch-size", "65"], "--attack-batch-size must be an integer in [1, 64]"),
    (["--attack", "dlg", "--attack-target", "weights"], "--attack-target must be one of 'gradient', 'update'"),
    (["--attack", "idlg", "--dp-mode", "local", "--noise-multiplier", "-1"], "--noise-multiplier must be numbers >= 0"),
    (["--attack", "idlg", "--noise-multiplier", "0.1"], "--noise-multiplier needs a privacy mode"),
    (["--attack", "idlg", "--attack-client", "99"], "--attack-client must be below the 6 clients, got 99"),
    (["--attack", "idlg", "--attack-batches", "1000"], "client 0 holds"),
    (["--attack-iterations", "5"], "--attack-iterations needs --attack dlg or --attack idlg"),
    ([], "a config (or an override) is audited only by an attack"),
])
def test_bad_attack_values_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str],
                                        message: str) -> None:
    config = _config_file(tmp_path)
    assert main(["audit", str(config), *words, "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
