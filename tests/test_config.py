from __future__ import annotations

from pathlib import Path

import pytest

from fedskew.config import parse_overrides, read_config, resolve
from fedskew.core.errors import ConfigError


def test_default_config_expands_to_two_runs() -> None:
    runs = resolve(read_config(None))
    assert [r.label for r in runs] == ["FedAvg", "Centralised"]
    assert runs[1].config["algorithm"]["name"] == "centralized"
    # Shared hyper-parameters carry over; FedAvg-only ones are dropped for the centralised run.
    assert runs[1].config["algorithm"]["lr"] == runs[0].config["algorithm"]["lr"]
    assert "local_epochs" not in runs[1].config["algorithm"]


def test_overrides_apply_to_every_variant_and_seeds_multiply() -> None:
    runs = resolve(read_config(None), parse_overrides(["rounds=3", "partition.alpha=0.5", "seeds=[1, 2]"]))
    assert len(runs) == 4
    assert {r.config["seed"] for r in runs} == {1, 2}
    assert all(r.config["rounds"] == 3 and r.config["partition"]["alpha"] == 0.5 for r in runs)


def test_algorithm_override_replaces_variants() -> None:
    runs = resolve(read_config(None), parse_overrides(["algorithm.name=centralized"]))
    assert len(runs) == 1 and runs[0].config["algorithm"]["name"] == "centralized"


@pytest.mark.parametrize(
    ("items", "needle"),
    [
        (["bogus=1"], "unknown config key 'bogus'"),
        (["rounds=0"], "rounds must be an integer in [1, 1_000_000], got 0"),
        (["dataset.name=imagenet"], "unknown dataset 'imagenet'; allowed:"),
        (["model.name=gpt"], "unknown model 'gpt'; allowed:"),
        (["algorithm.name=fedmagic"], "unknown algorithm 'fedmagic'; allowed:"),
        (["partition.name=zebra"], "unknown partitioner 'zebra'; allowed:"),
        (["algorithm.lr=-1"], "algorithm.lr must be > 0, got -1.0"),
        (["algorithm.nonsense=1"], "unknown key 'algorithm.nonsense'"),
        (["rounds"], "must look like key=value"),
        (["dataset.name.x=1"], "nested too deeply"),
    ],
)
def test_bad_values_are_named(items: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        resolve(read_config(None), parse_overrides(items))
    assert needle in str(e.value)


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="not found"):
        read_config("no/such/file.toml")


def test_algorithm_override_goes_to_variants_that_have_the_parameter() -> None:
    raw = {
        "algorithm": {"name": "fedavg"},
        "variants": [{"label": "FedAvg"}, {"label": "FedProx", "algorithm.name": "fedprox"}],
    }
    runs = resolve(raw, parse_overrides(["algorithm.mu=0.5", "algorithm.lr=0.2"]))
    assert "mu" not in runs[0].config["algorithm"] and runs[1].config["algorithm"]["mu"] == 0.5
    assert all(r.config["algorithm"]["lr"] == 0.2 for r in runs)
    with pytest.raises(ConfigError, match="no variant's algorithm has this parameter"):
        resolve(raw, parse_overrides(["algorithm.zeta=1"]))


def test_only_keeps_an_override_to_the_selected_variants(tmp_path: Path) -> None:
    """Two methods share a parameter name with different values allowed (FedRS's and FedDC drift's ``scaling``):
    with ``--only`` the override reaches the selected variant, and the left-out one neither refuses it nor runs;
    an override that no selected variant has is refused instead of dropped unseen."""
    from fedskew.api import plan

    raw = {
        "rounds": 1,
        "algorithm": {"name": "fedavg", "momentum": 0.0},
        "variants": [{"label": "FedAvg"}, {"label": "FedRS", "algorithm.name": "fedrs"},
                     {"label": "FedDC drift", "algorithm.name": "feddc_drift"}],
    }
    over = parse_overrides(["algorithm.scaling=shard"])
    with pytest.raises(ConfigError) as err:
        resolve(raw, over)  # without --only, FedRS would run with it: refused, as before, naming the run
    assert str(err.value) == ("run 'FedRS': algorithm.scaling must be one of 'absent', 'proportional', got 'shard'; "
                              "--only LABEL ... runs the others without it")
    runs = resolve(raw, over, only=["FedDC drift"])
    chosen = [r for r in runs if r.label == "FedDC drift"]
    assert len(runs) == 3 and len(chosen) == 1
    assert chosen[0].typed.algorithm.params.scaling == "shard"
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.scaling': no selected \(--only\) variant"):
        resolve(raw, over, only=["FedAvg"])
    with pytest.raises(ConfigError, match="no selected"):
        plan(raw, {"algorithm.scaling": "shard"}, only=["FedAvg"], out=tmp_path / "a")
    runs, _ = plan(raw, {"algorithm.scaling": "proportional"}, only=["FedRS"], out=tmp_path / "b")
    assert [r.label for r in runs] == ["FedRS"]


def test_a_label_gives_one_shell_safe_folder_and_collisions_are_refused(tmp_path: Path) -> None:
    raw = {
        "dataset": {"name": "synthetic"},
        "variants": [{"label": "FedAF w/o CDC"}, {"label": "FedAF"}],
        "seeds": [3],
    }
    runs = resolve(raw)
    assert [r.folder_name for r in runs] == ["FedAF_w_o_CDC-seed3", "FedAF-seed3"]
    assert runs[0].label == "FedAF w/o CDC"  # the label itself is kept for tables and plots
    (tmp_path / runs[0].folder_name).mkdir()  # one path component
    assert [p.name for p in tmp_path.iterdir()] == ["FedAF_w_o_CDC-seed3"]
    raw["variants"] = [{"label": "a/b"}, {"label": "a_b"}]
    with pytest.raises(ConfigError, match="folder name"):
        resolve(raw)


def test_a_label_template_names_each_variant_by_its_settings() -> None:
    from fedskew.config import resolve

    raw = {"rounds": 1, "variants": [{"label": "A"}, {"label": "B", "algorithm.name": "fedprox", "algorithm.mu": 0.1}]}
    runs = resolve(raw, {"label": "{label}: lr={algorithm.lr}, {partition.name}"})
    assert [r.label for r in runs] == ["A: lr=0.01, iid", "B: lr=0.01, iid"]  # lr: the method's default
    assert [r.config["label"] for r in runs] == [r.label for r in runs]
    one = resolve({"rounds": 1, "algorithm": {"name": "fedprox"}}, {"label": "mu {algorithm.mu}"})
    assert one[0].label == "mu 0.01" and one[0].folder_name == "mu_0.01-seed0"
    with pytest.raises(ConfigError, match=r"\{algorithm\.nope\} is not a key of the run's config"):
        resolve(raw, {"label": "{algorithm.nope}"})
    with pytest.raises(ConfigError, match="share the label"):
        resolve(raw, {"label": "same"})
