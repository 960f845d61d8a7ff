"""Private runs end to end: every method that shares its model runs under central and local DP, the server's
aggregate gets the noised mean, epsilon reaches the records, the summary, TensorBoard, the trackers and the report,
a private run resumes byte-identically (its accountants included), a budget stops a run resumably, and DP-SGD's
glue accounts what the clients report."""

from __future__ import annotations

import json
import logging
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.base import ALGORITHMS
from fedskew.config import dump, typed_config
from fedskew.core.errors import ConfigError
from fedskew.engine.experiment import resume_run, run_state, stopped_early
from fedskew.engine.round_loop import RoundLoop
from fedskew.engine.tensorboard import grouped_scalars, tensorboard_tag
from fedskew.privacy.accounting import Accountant
from fedskew.privacy.uploads import Upload
from tests.helpers.configs import SLOW_METHODS, config_for, tiny_config

pytest.importorskip("opacus")  # the privacy extra: scripts/test.sh installs it

SHARING = sorted(n for n in ALGORITHMS.names() if isinstance(ALGORITHMS.get(n).upload, Upload))


def _run(cfg: dict[str, Any], path: Path) -> RoundLoop:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    loop = RoundLoop(typed_config(cfg), path, progress=False)
    loop.run()
    return loop


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _summary(path: Path) -> dict[str, Any]:
    return json.loads((path / "summary.json").read_text())


def _carried(mode: str) -> list[str]:
    """The model-sharing methods ``mode`` carries (the others are refused, in test_client_level)."""
    refusal = {"central": "central", "local": "", "sample": "dpsgd"}[mode]
    return [n for n in SHARING if not (refusal and getattr(ALGORITHMS.get(n).upload, refusal))]


@pytest.mark.parametrize(("mode", "name"), [
    pytest.param(mode, name, marks=[pytest.mark.slow] if name in SLOW_METHODS else [])
    for mode in ("central", "local", "sample") for name in _carried(mode)
])
def test_every_method_that_shares_its_model_runs_privately(tmp_path: Path, name: str, mode: str) -> None:
    upload = ALGORITHMS.get(name).upload
    assert isinstance(upload, Upload)
    cfg = config_for(name, rounds=2, privacy={"mode": mode, "noise_multiplier": 0.8, "clip": 0.1})
    if mode == "sample":  # DP-SGD refuses BatchNorm: the ConvNet with a per-sample normalisation
        cfg["model"]["net_norm"] = "instancenorm"
    loop = _run(cfg, tmp_path / name)
    recs = _records(tmp_path / name)
    assert all(r["accuracy"] is not None and r["rejected"] == [] for r in recs)
    eps = [r["epsilon"] for r in recs]
    assert 0 < eps[0] < eps[1]
    assert _summary(tmp_path / name)["epsilon"] == eps[-1]
    assert loop.privacy is not None and loop.privacy.epsilon() == eps[-1]


def test_the_aggregate_applies_the_noised_mean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FedAvg under central DP: the algorithm's aggregate gets equal replies, request + Delta~, and the global model
    becomes exactly that; the round's epsilon is one sampled Gaussian release at q = 3/6 a round."""
    import fedskew.privacy.run as run_module

    seen: list[list[dict[str, torch.Tensor]]] = []
    real = run_module.noised_mean

    def spy(*args: Any, **kwargs: Any) -> Any:
        out, norms = real(*args, **kwargs)
        seen.append([m.arrays for _, m in out])
        return out, norms

    monkeypatch.setattr(run_module, "noised_mean", spy)
    cfg = tiny_config(rounds=2, privacy={"mode": "central", "noise_multiplier": 1.1, "clip": 0.5})
    loop = _run(cfg, tmp_path / "run")
    assert len(seen) == 2 and all(len(replies) == 3 for replies in seen)
    last = seen[-1]
    model = loop.server.model.state_dict()
    for key in model:
        assert all(torch.equal(r[key], last[0][key]) for r in last)
        assert torch.equal(model[key], last[0][key])
    acc = Accountant("rdp")
    expected = []
    for _ in range(2):
        acc.step(1.1, 0.5)
        expected.append(acc.epsilon(1e-5))
    assert [r["epsilon"] for r in _records(tmp_path / "run")] == expected


def test_local_dp_charges_each_client_for_its_rounds(tmp_path: Path) -> None:
    """Local DP: a client's epsilon is that of as many q = 1 releases as rounds it was asked to train in; the
    record holds the largest and the mean over all clients (0 for a client never asked)."""
    cfg = tiny_config(rounds=3, privacy={"mode": "local", "noise_multiplier": 2.0})
    _run(cfg, tmp_path / "run")
    recs = _records(tmp_path / "run")

    def eps(n: int) -> float:
        acc = Accountant("rdp")
        acc.step(2.0, 1.0, n)
        return acc.epsilon(1e-5)

    for i, r in enumerate(recs):
        counts = [sum(c in rr["clients"] for rr in recs[: i + 1]) for c in range(6)]
        per_client = [eps(n) if n else 0.0 for n in counts]
        assert r["epsilon_max"] == r["epsilon"] == max(per_client)
        assert r["epsilon_mean"] == pytest.approx(sum(per_client) / 6, rel=1e-12)
    privacy = _summary(tmp_path / "run")["privacy"]
    assert privacy["mode"] == "local" and privacy["epsilon_max"] == recs[-1]["epsilon_max"]


@pytest.mark.parametrize("privacy", [
    {"mode": "central", "adaptive_clip": True, "count_noise": 1.0, "clip": 0.3},
    {"mode": "local", "noise_multiplier": 0.7},
], ids=["central-adaptive", "local"])
def test_a_private_run_resumes_byte_identically(tmp_path: Path, privacy: dict[str, Any]) -> None:
    """Stopped after 2 rounds and resumed to 4: the same metrics (epsilon and the adaptive clip each round), model
    and final checkpoint, accountants included, as 4 rounds at once. SCAFFOLD: client state too."""
    def config(rounds: int) -> dict[str, Any]:
        return tiny_config(rounds=rounds, algorithm={"name": "scaffold"}, privacy=privacy)

    full = _run(config(4), tmp_path / "full")
    _run(config(2), tmp_path / "part")
    resume_run(tmp_path / "part", {"rounds": 4}, data_dir=None, progress=False)
    for name in ("metrics.jsonl", "model.pt"):
        assert (tmp_path / "part" / name).read_bytes() == (tmp_path / "full" / name).read_bytes(), name
    ck = [torch.load(p / "checkpoints" / "last.pt", weights_only=True) for p in (tmp_path / "full", tmp_path / "part")]
    assert ck[0]["privacy"] == ck[1]["privacy"] and ck[0]["privacy"] == full.privacy.state()  # type: ignore[union-attr]
    recs = _records(tmp_path / "full")
    if privacy.get("adaptive_clip"):
        clips = [r["privacy_clip"] for r in recs]
        assert clips[0] == 0.3 and len(set(clips)) == 4  # the clip moves every round


def test_a_budget_stops_the_run_and_a_larger_one_resumes_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """target_epsilon 5 with central epsilon 3.89, 5.38, 6.48 ... stops after round 1 in one line; the summary says
    so, the checkpoint is at round 1, and --resume with target 100 continues to the run of target 100 at once."""
    def config(target: float) -> dict[str, Any]:
        return tiny_config(rounds=4, checkpoint_every=3, privacy={"mode": "central", "target_epsilon": target})

    part = tmp_path / "part"
    with caplog.at_level(logging.WARNING, logger="fedskew"):
        _run(config(5.0), part)
    lines = [m for m in caplog.messages if "privacy budget" in m]
    assert lines == ["privacy budget reached: epsilon 3.89 after round 1 of 4; the next round would reach 5.38 > "
                     "target_epsilon 5"]
    summary = _summary(part)
    assert summary["rounds"] == 1 and summary["stopped"] == {
        "reason": "privacy budget", "round": 1, "rounds": 4, "epsilon": summary["epsilon"],
        "next_epsilon": pytest.approx(5.377, abs=1e-3), "target_epsilon": 5.0}
    assert torch.load(part / "checkpoints" / "last.pt", weights_only=True)["round"] == 1
    assert stopped_early(part / "summary.json")
    assert run_state(part, typed_config(config(100.0))) == "partial"  # an experiment's --resume goes on with it
    resume_run(part, {"privacy.target_epsilon": 100.0}, data_dir=None, progress=False)
    _run(config(100.0), tmp_path / "full")
    assert (part / "metrics.jsonl").read_bytes() == (tmp_path / "full" / "metrics.jsonl").read_bytes()
    assert "stopped" not in _summary(part) and _summary(part)["privacy"]["target_epsilon"] == 100.0
    with pytest.raises(ConfigError, match=r"^privacy.target_epsilon = 1 is spent by the first round \(epsilon 3.89\)"):
        _run(config(1.0), tmp_path / "too_small")


def test_calibration_derives_the_noise_for_the_planned_rounds(tmp_path: Path) -> None:
    cfg = tiny_config(rounds=3, privacy={"mode": "central", "target_epsilon": 6.0, "on_target": "calibrate"})
    _run(cfg, tmp_path / "run")
    privacy = _summary(tmp_path / "run")["privacy"]
    assert privacy["calibrated"] is True and privacy["noise_multiplier"] != 1.0
    assert 5.9 <= _records(tmp_path / "run")[-1]["epsilon"] <= 6.0


def test_epsilon_goes_to_tensorboard_and_the_trackers(tmp_path: Path) -> None:
    """The trackers log grouped_scalars(record) (engine/trackers.py); TensorBoard logs the same, read back here."""
    rec = {"round": 2, "accuracy": 0.5, "epsilon": 3.5, "epsilon_max": 3.5, "epsilon_mean": 1.0, "privacy_clip": 0.4}
    assert grouped_scalars(rec) == {"eval/accuracy": 0.5, "privacy/epsilon": 3.5, "privacy/epsilon_max": 3.5,
                                    "privacy/epsilon_mean": 1.0, "privacy/privacy_clip": 0.4}
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(rounds=2, logging={"tensorboard": True},
                      privacy={"mode": "central", "adaptive_clip": True, "count_noise": 1.0})
    _run(cfg, tmp_path / "run")
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    for key in ("epsilon", "privacy_clip"):
        logged = [(e.step, e.value) for e in acc.Scalars(tensorboard_tag(key))]
        assert logged == [(r["round"], pytest.approx(r[key], rel=1e-6)) for r in _records(tmp_path / "run")]


def test_the_report_has_an_epsilon_column_and_a_privacy_curve(tmp_path: Path) -> None:
    from fedskew.report import comparison_table, load_run, write_report

    _run(tiny_config(rounds=2, label="dp", privacy={"mode": "central"}), tmp_path / "exp" / "dp")
    _run(tiny_config(rounds=2, label="plain"), tmp_path / "exp" / "plain")
    rows = {r["label"]: r for r in comparison_table([load_run(tmp_path / "exp" / n) for n in ("dp", "plain")])}
    assert rows["dp"]["epsilon"] == round(_summary(tmp_path / "exp" / "dp")["epsilon"], 2)
    assert rows["plain"]["epsilon"] is None
    assert "epsilon" not in comparison_table([load_run(tmp_path / "exp" / "plain")])[0]  # non-private: as before
    html = write_report([tmp_path / "exp"], tmp_path / "report")
    assert html.exists() and (tmp_path / "report" / "privacy.png").exists()
    assert "epsilon" in (tmp_path / "report" / "results.md").read_text()


# ---- DP-SGD (privacy.mode = "sample"): the glue, against the contract of fedskew.privacy.dpsgd ---------------------
@dataclass
class _FakeSampleDP:
    clip: float
    noise_multiplier: float
    generator: torch.Generator
    steps: int = 0
    sample_rate: float = 0.0


def test_sample_mode_hands_train_local_a_sampledp_and_accounts_what_it_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Against the contract (``train_local(..., private=SampleDP(clip, noise_multiplier, generator))`` sets
    ``private.steps`` and ``private.sample_rate``), with a stand-in for DP-SGD that trains as usual and reports
    batch / samples as its rate: each client's accountant holds its rounds' (z, q, steps)."""
    import fedskew.algorithms.fedavg as fedavg

    module = types.ModuleType("fedskew.privacy.dpsgd")
    module.SampleDP = _FakeSampleDP  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fedskew.privacy.dpsgd", module)
    real = fedavg.train_local
    handed: list[_FakeSampleDP] = []

    def train_local(model: Any, x: torch.Tensor, y: torch.Tensor, cfg: Any, *args: Any,
                    private: _FakeSampleDP | None = None, **kwargs: Any) -> Any:
        res = real(model, x, y, cfg, *args, **kwargs)
        if private is not None:
            private.steps, private.sample_rate = res.steps, min(1.0, cfg.batch_size / max(len(y), 1))
            handed.append(private)
        return res

    monkeypatch.setattr(fedavg, "train_local", train_local)
    cfg = tiny_config(rounds=2, privacy={"mode": "sample", "noise_multiplier": 1.2, "clip": 0.5})
    loop = _run(cfg, tmp_path / "run")
    recs = _records(tmp_path / "run")
    assert len(handed) == 6 and all((p.clip, p.noise_multiplier) == (0.5, 1.2) for p in handed)
    sizes = loop.fed.offsets
    expected: dict[int, Accountant] = {}
    for r in recs:
        for cid in r["clients"]:
            n = sizes[cid + 1] - sizes[cid]
            expected.setdefault(cid, Accountant("rdp")).step(1.2, min(1.0, 16 / n), -(-n // 16))
    assert loop.privacy is not None
    assert {c: a.history for c, a in loop.privacy.clients.items()} == {c: a.history for c, a in expected.items()}
    assert recs[-1]["epsilon_max"] == max(a.epsilon(1e-5) for a in expected.values())


def test_sample_mode_with_the_real_dpsgd(tmp_path: Path) -> None:
    """DP-SGD (fedskew.privacy.dpsgd) through the glue: each client's accountant holds (z, batch / n, its steps)."""
    cfg = tiny_config(rounds=2, privacy={"mode": "sample", "noise_multiplier": 1.0, "clip": 1.0})
    loop = _run(cfg, tmp_path / "run")
    recs = _records(tmp_path / "run")
    assert 0 < recs[0]["epsilon_max"] <= recs[1]["epsilon_max"]
    sizes = loop.fed.offsets
    assert loop.privacy is not None and loop.privacy.clients
    for cid, acc in loop.privacy.clients.items():
        n = sizes[cid + 1] - sizes[cid]
        rounds = sum(cid in r["clients"] for r in recs)
        assert acc.history == [(1.0, min(1.0, 16 / n), rounds * -(-n // 16))]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["central", "local"])
def test_the_noise_does_not_depend_on_the_worker_count(tmp_path: Path, mode: str) -> None:
    """Inline and with two worker processes (whose replies cross a process boundary as safetensors bytes, their
    arrays in another order): the same records, byte for byte."""
    runs = []
    for workers in (1, 2):
        cfg = tiny_config(rounds=2, workers=workers, privacy={"mode": mode, "noise_multiplier": 0.5})
        _run(cfg, tmp_path / f"w{workers}")
        runs.append((tmp_path / f"w{workers}" / "metrics.jsonl").read_bytes())
    assert runs[0] == runs[1]


@pytest.mark.parametrize("mode", ["central", "local", "sample"])
def test_secret_noise_is_not_the_run_seeds(tmp_path: Path, mode: str) -> None:
    """noise_seed = "secret": two runs of one config draw different noise (their models and accuracies part) and
    account the same epsilon; with the default ("run") they are byte-identical, as every fedskew run."""
    def records(noise_seed: str, name: str) -> list[dict[str, Any]]:
        privacy = {"mode": mode, "noise_multiplier": 1.0, "clip": 0.5, "noise_seed": noise_seed}
        _run(tiny_config(rounds=2, privacy=privacy), tmp_path / name)
        return _records(tmp_path / name)

    first, second = records("secret", "s1"), records("secret", "s2")
    assert [r["epsilon"] for r in first] == [r["epsilon"] for r in second] and first[-1]["epsilon"] > 0
    assert any(a["loss"] != b["loss"] for a, b in zip(first, second, strict=True))
    assert (records("run", "r1") == records("run", "r2"))
