"""The experiment configs shipped in ``experiments/`` resolve and validate without loading data.

docs/results.md gives commands on these files; a renamed parameter or a mistyped key in one of them
would otherwise surface only when somebody starts a long run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedskew.config import parse_overrides, read_config, resolve

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
CONFIGS = sorted(EXPERIMENTS.rglob("*.toml"))


def test_the_experiments_folder_is_found() -> None:
    assert len(CONFIGS) >= 10, f"expected the shipped experiment configs under {EXPERIMENTS}"


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(EXPERIMENTS)) for p in CONFIGS])
def test_config_resolves_and_validates(path: Path) -> None:
    raw = read_config(path)
    runs = resolve(raw, where=str(path))  # validate() runs on every (variant, seed)
    assert runs, f"{path} expands to no runs"
    assert isinstance(raw.get("name"), str) and raw["name"], f"{path} has no name"
    labels = {r.label for r in runs}
    assert len(labels) == len(raw.get("variants") or [{}])


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.stem.endswith("_quick")], ids=lambda p: p.stem)
def test_each_quick_config_has_its_paper_scale_config_beside_it(path: Path) -> None:
    paper = path.with_name(path.name.replace("_quick.toml", "_paper.toml"))
    assert paper.is_file(), f"{path.name} has no {paper.name} beside it"
    assert paper in CONFIGS  # so test_config_resolves_and_validates covers it


@pytest.mark.parametrize("dataset", ["cifar10", "fmnist"])
def test_fedaf_quick_configs_hold_the_table_4_ablations(dataset: str) -> None:
    raw = read_config(EXPERIMENTS / "fedaf" / f"{dataset}_quick.toml")
    runs = {r.label: r.config["algorithm"] for r in resolve(raw) if r.config["seed"] == 0}
    assert set(runs) == {"FedAvg", "FedDM", "FedAF", "FedAF w/o CDC", "FedAF w/o LGKM"}
    assert runs["FedAF"]["name"] == runs["FedAF w/o CDC"]["name"] == runs["FedAF w/o LGKM"]["name"] == "fedaf"
    assert runs["FedAF w/o CDC"]["use_cdc"] is False and runs["FedAF w/o CDC"].get("use_lgkm", True) is True
    assert runs["FedAF w/o LGKM"]["use_lgkm"] is False and runs["FedAF w/o LGKM"].get("use_cdc", True) is True
    # The commands in docs/results.md: an alpha override reaches every variant.
    with_alpha = resolve(raw, parse_overrides(["partition.alpha=0.1"]))
    alphas = {r.config["partition"]["alpha"] for r in with_alpha}
    assert alphas == {0.1}


def test_fedaf_fmnist_k200_config_is_the_quick_config_with_200_steps() -> None:
    # docs/results.md reports the 200-step Fashion-MNIST runs as the quick config plus one override; the
    # k200 config must run exactly those (the two ablations left out).
    k200 = resolve(read_config(EXPERIMENTS / "fedaf" / "fmnist_k200.toml"))
    quick = resolve(
        read_config(EXPERIMENTS / "fedaf" / "fmnist_quick.toml"),
        parse_overrides(["algorithm.condense_iterations=200"]),
    )
    quick_by_key = {(r.label, r.config["seed"]): r.config for r in quick}
    ablations = {"FedAF w/o CDC", "FedAF w/o LGKM"}
    assert {(r.label, r.config["seed"]) for r in k200} == {k for k in quick_by_key if k[0] not in ablations}
    for run in k200:
        other = quick_by_key[(run.label, run.config["seed"])]
        differing = {k for k in run.config if run.config[k] != other.get(k)}
        assert differing == {"name", "description"}, (run.label, differing)
        if run.label != "FedAvg":  # FedAvg's resolved config has no condensation parameters
            assert run.config["algorithm"]["condense_iterations"] == 200


def test_feddc_k100_config_is_the_quick_config_with_batch_16_and_k_100() -> None:
    # docs/results.md reports the K = 100 runs as the quick config plus two overrides; the k100 config
    # must run exactly those (FedDC+ left out), or its numbers are not the ones in the docs.
    k100 = resolve(read_config(EXPERIMENTS / "feddc" / "cifar10_k100.toml"))
    quick = resolve(
        read_config(EXPERIMENTS / "feddc" / "cifar10_quick.toml"),
        parse_overrides(["algorithm.batch_size=16", "algorithm.condense_iterations=100"]),
    )
    quick_by_key = {(r.label, r.config["seed"]): r.config for r in quick}
    assert {(r.label, r.config["seed"]) for r in k100} == {k for k in quick_by_key if k[0] != "FedDC+"}
    for run in k100:
        other = quick_by_key[(run.label, run.config["seed"])]
        differing = {k for k in run.config if run.config[k] != other.get(k)}
        assert differing == {"name", "description"}, (run.label, differing)
        assert run.config["algorithm"]["batch_size"] == 16
