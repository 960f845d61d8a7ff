"""The pytest-xdist groups of ``tests/conftest.py`` (scripts/test.sh runs the suite with ``-n auto --dist loadgroup``):
each names tests that exist, so a renamed test cannot quietly leave its group and start a second Flower federation,
Ray cluster or GPU-check dry run on another worker."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import XDIST_GROUPS, xdist_scope

ROOT = Path(__file__).resolve().parents[1]


def test_every_group_names_a_test_module_or_function_that_exists() -> None:
    for prefix in XDIST_GROUPS:
        path, _, name = prefix.partition("::")
        assert (ROOT / path).is_file(), prefix
        if name:
            assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.MULTILINE), prefix


def test_a_test_goes_to_its_group_with_its_parameters_and_any_other_test_alone() -> None:
    assert xdist_scope("tests/engine/test_flower.py::test_fedaf_over_flower[fedaf]") == "flower_federation"
    assert xdist_scope("tests/engine/test_ray.py::test_cluster_metrics_equal_the_inline_engine[fedavg]") == "ray"
    assert xdist_scope("tests/engine/test_flower_local.py::test_local_simulation_recipe_runs_one_round") == "ray"
    alone = "tests/engine/test_flower.py::test_deploy_equals_simulation[fedaf]"  # the stand-in SuperLink: no group
    assert xdist_scope(alone) == alone
    assert xdist_scope("tests/engine/test_ray_other.py::test_x") == "tests/engine/test_ray_other.py::test_x"
