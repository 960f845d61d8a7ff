"""Every registered algorithm runs on a tiny federation; stateful baselines resume exactly.

The first test is parametrised over ``ALGORITHMS.names()``, so a newly registered method is covered
without touching this file, as long as it runs with its defaults on the tiny config.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fedskew.algorithms.base import ALGORITHMS
from fedskew.config import dump, typed_config, validate
from fedskew.core.errors import ConfigError
from fedskew.engine.experiment import resume_run
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import LABEL_SKEW, config_for, methods, runnable_config


def _run(cfg: dict[str, Any], path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return path


@pytest.mark.parametrize("name", methods(ALGORITHMS.names()))
def test_every_algorithm_runs_changes_the_model_and_is_counted(tmp_path: Path, name: str) -> None:
    cfg = config_for(name, rounds=2)
    if not ALGORITHMS.get(name).has_global_model:  # `local`: the clients' own models change, nothing is sent
        with pytest.raises(ConfigError, match="has no global model"):
            RoundLoop(typed_config(cfg), tmp_path / "refused", progress=False)
        cfg = runnable_config(name, rounds=2)
        sim = RoundLoop(typed_config(cfg), tmp_path / name, progress=False)
        initial = sim.algorithm.init_model().state_dict()
        recs = sim.run().records
        assert all(r["personal_accuracy_mean"] is not None and r["accuracy"] is None for r in recs)
        assert sum(r[k] for r in recs for k in r if k.startswith("bytes_")) == 0
        own = [s["model"] for s in sim.client_states.values()]
        assert own and all(any(not torch.equal(m[k], initial[k]) for k in initial) for m in own)
        return
    sim = RoundLoop(typed_config(cfg), tmp_path / name, progress=False)
    before = {k: v.clone() for k, v in sim.server.model.state_dict().items()}
    sim.run()
    after = sim.server.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), f"{name} left the global model unchanged"
    recs = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in recs] == [1, 2]
    assert all(r["accuracy"] is not None and r["rejected"] == [] for r in recs)
    total = sum(r[k] for r in recs for k in r if k.startswith("bytes_"))
    assert total > 0


ROBUST: dict[str, dict[str, Any]] = {
    "median": {"rule": "median"},
    "trimmed_mean": {"rule": "trimmed_mean", "trim": 0.34},  # three clients: one cut at each end
    "clipping": {"clip_norm": 0.01},
}
"""[algorithm.aggregation] settings that each change a round's mean of the clients' models."""
MANY_REPLIES: dict[str, dict[str, Any]] = {"hfldd": {"num_homogeneous": 1}}
"""Settings under which a method averages several replies (HFLDD: one homogeneous cluster, so every
client heads a heterogeneous cluster of its own)."""


@pytest.mark.parametrize("name", methods(ALGORITHMS.names()))
def test_every_averaging_method_takes_the_robust_rules(tmp_path: Path, name: str) -> None:
    """Median, trimmed mean and norm clipping reach the model of every method that averages client models;
    the other methods refuse [algorithm.aggregation] with one line."""
    params = ALGORITHMS.get(name).Params
    fields = {f.name for f in dataclasses.fields(params)}
    if "aggregation" not in fields or not params.averages_models:
        cfg = config_for(name, rounds=1)
        cfg["algorithm"]["aggregation"] = {"rule": "median"}
        with pytest.raises(ConfigError, match=r"algorithm\.aggregation") as err:
            validate(cfg)
        assert "\n" not in str(err.value)
        return
    models = {}
    for label, aggregation in {"mean": {}, **ROBUST}.items():
        cfg = config_for(name, rounds=1)
        cfg["algorithm"].update(MANY_REPLIES.get(name, {}), aggregation=aggregation)
        sim = RoundLoop(typed_config(cfg), tmp_path / label, progress=False)
        [record] = sim.run().records
        assert record["rejected"] == [] and len(record["clients"]) >= 2, record
        models[label] = sim.server.model.state_dict()
    mean = models.pop("mean")
    for label, model in models.items():
        assert any(not torch.equal(mean[k], model[k]) for k in mean if mean[k].is_floating_point()), \
            f"{name} ignored [algorithm.aggregation] {ROBUST[label]}"


STATEFUL = ["scaffold", "feddyn", "feddc_drift", "fedavgm", "fedadam", "fedgen", "moon", "fedbn"]
PERSONAL = ["fedper", "fedrep", "fedbabu", "ditto", "apfl", "pfedme", "perfedavg", "fedala", "fedrod", "fedetf"]
"""The personalised methods: their clients' own models are client state, measured on the clients' test splits."""


RESUMED = STATEFUL + PERSONAL + [n for n in LABEL_SKEW if n not in STATEFUL + PERSONAL]
"""Also issue 48's label-skew family, whose stateless members must resume exactly too."""


READINGS: dict[str, dict[str, Any]] = {
    "feddc_drift:shard": {"scaling": "shard", "max_grad_norm": 10.0},  # its own client config each round
}
"""Other readings of a method that keep more state: ``NAME:reading`` runs NAME with these options."""


@pytest.mark.parametrize("name", [*methods(RESUMED), *READINGS])
def test_stateful_baselines_resume_exactly(tmp_path: Path, name: str) -> None:
    """Server state (c, h, optimiser slots, generator) and client state survive a checkpoint; for the
    personalised methods the per-client accuracies of their own models are in the compared metrics."""

    def config(rounds: int) -> dict[str, Any]:
        cfg = config_for(name.split(":")[0], rounds=rounds)
        cfg["algorithm"].update(READINGS.get(name, {}))
        if name == "ccvr":  # "final" calibrates whatever round ends the run: tests/algorithms/test_ccvr.py
            cfg["algorithm"]["calibrate"] = "every_round"
        if name in PERSONAL:
            cfg["partition"]["client_test_fraction"] = 0.25
        return cfg

    full = _run(config(4), tmp_path / "full")
    part = _run(config(2), tmp_path / "part")
    resume_run(part, {"rounds": 4}, data_dir=None, progress=False)
    assert (part / "metrics.jsonl").read_bytes() == (full / "metrics.jsonl").read_bytes()



def test_every_built_in_method_cites_its_paper_and_the_two_feddcs_cannot_be_confused() -> None:
    built_in = [n for n in ALGORITHMS.names() if ALGORITHMS.get(n).__module__.startswith("fedskew.algorithms.")]
    assert len(built_in) >= 31
    missing = [n for n in built_in if not ALGORITHMS.get(n).paper]
    assert not missing, f"no paper: {missing}"
    for name in ("feddc", "feddc_plus"):  # Kim & Choi's dataset condensation, not Gao et al.'s drift correction
        paper = ALGORITHMS.get(name).paper
        assert "Kim & Choi" in paper and "not the drift-correcting FedDC of Gao et al." in paper
