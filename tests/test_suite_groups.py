"""How the suite runs on several workers: scripts/test.sh runs ``pytest -n auto --dist loadfile``, and pytest-xdist
then hands out whole files, each file's tests on one worker in file order. The tests that share a costly module
fixture, or must never run beside each other, are therefore kept in one file each:

- the four tests on the real Flower federation of tests/engine/test_flower.py's module fixture ``federation``
  (it starts the SuperLink and three SuperNodes once), in file order: the last leaves the federation a node short;
- the two-node Ray cluster of tests/engine/test_ray.py's module fixture ``cluster``, and Flower's local
  simulation (a local Ray instance, which would join a cluster it finds): both in test_ray.py, the simulation
  first, before the cluster starts;
- benchmarks/gpu_check.py's dry run, tests/test_gpu_check.py's module fixture ``report`` (about a minute).

These tests check that each group still is one file, in the order it needs, and that the installed pytest-xdist
keeps a file on one worker. (Its ``xdist_group`` mark does not group tests with pytest 9.2: pytest-xdist 3.8
renames the tests through an attribute that pytest no longer reads.)
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def _tests(path: Path) -> list[tuple[str, list[str]]]:
    """The test functions of ``path`` in file order, each with the names of its parameters (its fixtures)."""
    tree = ast.parse(path.read_text())
    return [(node.name, [a.arg for a in node.args.args]) for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def _files_whose_tests_take(fixture: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py")
                  if any(fixture in params for _, params in _tests(p)))


def _files_containing(text: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py")
                  if p != Path(__file__) and text in p.read_text())


def test_the_suite_is_handed_out_by_file_and_each_group_is_one_file_in_the_order_it_needs() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "--dist loadfile" in script and "loadgroup" not in script
    readme = (ROOT / "README.md").read_text()
    assert "--dist loadfile" in readme and "loadgroup" not in readme
    # The Flower federation: one file, its last test the one that kills a SuperNode.
    assert _files_whose_tests_take("federation") == ["tests/engine/test_flower.py"]
    users = [name for name, params in _tests(TESTS / "engine" / "test_flower.py") if "federation" in params]
    assert users == [
        "test_fedaf_over_flower",
        "test_a_plugin_runs_over_flower",
        "test_secure_aggregation_over_flower_equals_fedavg_up_to_its_quantisation",
        "test_fedavg_over_flower_equals_simulation_and_survives_a_killed_node",
    ]
    # The Ray cluster and Flower's local simulation (`flwr run` on Ray): one file, the simulation first.
    assert _files_whose_tests_take("cluster") == ["tests/engine/test_ray.py"]
    assert _files_containing("num-supernodes") == ["tests/engine/test_ray.py"]
    ray_tests = _tests(TESTS / "engine" / "test_ray.py")
    first_on_the_cluster = min(i for i, (_, params) in enumerate(ray_tests) if "cluster" in params)
    assert [name for name, _ in ray_tests].index("test_local_simulation_recipe_runs_one_round") < first_on_the_cluster
    # The GPU check's dry run: one file, whose every test reads the module fixture's report.
    assert _files_containing('"--device", "cpu", "--quick"') == ["tests/test_gpu_check.py"]
    assert all("report" in params for _, params in _tests(TESTS / "test_gpu_check.py"))


@pytest.mark.slow
def test_pytest_xdist_keeps_each_file_on_one_worker(tmp_path: Path) -> None:
    """Four files of three tests on two workers with ``--dist loadfile``: each file's tests run on one worker,
    in file order (the mechanism scripts/test.sh relies on, checked with the installed pytest and pytest-xdist)."""
    log = tmp_path / "log"
    for f in "abcd":
        (tmp_path / f"test_{f}.py").write_text(
            "import os, time\n" + "".join(
                f"def test_{i}():\n    time.sleep(0.1)\n"
                f"    with open({str(log)!r}, 'a') as out:\n"
                f"        out.write('{f} {i} ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
                for i in range(3)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    res = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider",
                          "-q", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    runs = [line.split() for line in log.read_text().splitlines()]
    assert sorted((f, i) for f, i, _ in runs) == [(f, str(i)) for f in "abcd" for i in range(3)]
    for f in "abcd":
        assert len({worker for g, _, worker in runs if g == f}) == 1, runs
        assert [i for g, i, _ in runs if g == f] == ["0", "1", "2"], runs
