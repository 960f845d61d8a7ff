"""The Ray engine (``engine = "ray"``): the same metrics as the inline engine, on a real two-node cluster.

A module fixture starts a head node and a second node on this machine (:mod:`tests.helpers.ray_cluster`,
one CPU each, so a round's jobs must spread over both), and runs join it through ``ray.address``; one
test lets the engine start and stop its own local instance. The tests skip only where Ray is not
installed (``pip install -e '.[ray]'``; scripts/test.sh installs it); the missing-Ray error is tested
everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fedskew
from fedskew.config import dump
from fedskew.core.errors import FedskewError
from fedskew.engine.ray_workers import MISSING_RAY
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import tiny_config
from tests.helpers.plugins import fresh_registries, plugin_config, write_plugin
from tests.helpers.ray_cluster import LocalRayCluster, auth_env, free_port
from tests.helpers.runs import assert_resumes_exactly

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray is optional: pip install -e '.[ray]'"
)

# FedAvg, SCAFFOLD: its clients keep a control variate c_i in their state between rounds, and Ditto:
# they keep a personal model.
ALGORITHMS = [{"name": "fedavg"}, {"name": "scaffold"}, {"name": "ditto"}]


@pytest.fixture(scope="module")
def ray_env() -> Iterator[dict[str, str]]:
    """A fresh Ray token for this module's clusters and drivers (Ray writes none to ~/.ray then)."""
    with pytest.MonkeyPatch.context() as mp:
        env = auth_env()
        for k, v in env.items():
            mp.setenv(k, v)
        yield env


@pytest.fixture(scope="module")
def cluster(ray_env: dict[str, str]) -> Iterator[LocalRayCluster]:
    src = str(Path(fedskew.__file__).resolve().parents[1])  # the nodes import the fedskew under test
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    c = LocalRayCluster({**os.environ, **ray_env, "PYTHONPATH": path}, nodes=2, cpus=1)
    print(f"\nRay cluster of 2 nodes started in {c.seconds:.1f} s")
    try:
        yield c
    finally:
        left = c.stop()
        assert not left, f"Ray processes still running after the cluster stopped: {left}"


def _run(cfg: dict[str, Any], path: Path) -> bytes:
    path.mkdir(parents=True)
    (path / "config.toml").write_text(dump(cfg))
    RoundLoop(cfg, path, progress=False).run()
    return (path / "metrics.jsonl").read_bytes()


@needs_ray
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a["name"])
def test_cluster_metrics_equal_the_inline_engine(
    tmp_path: Path, cluster: LocalRayCluster, caplog: pytest.LogCaptureFixture, algorithm: dict[str, Any]
) -> None:
    inline = _run(tiny_config(workers=1, algorithm=algorithm), tmp_path / "inline")
    on_ray = tiny_config(engine="ray", ray={"address": cluster.address}, algorithm=algorithm)
    with caplog.at_level(logging.INFO, logger="fedskew"):
        assert _run(on_ray, tmp_path / "ray") == inline
    # 3 rounds of 3 client jobs and one evaluation chunk, spread (ray.scheduling = "spread") over both nodes.
    assert "ray: 12 tasks ran on 2 nodes" in caplog.messages


@needs_ray
def test_resume_on_the_cluster_equals_an_uninterrupted_run(tmp_path: Path, cluster: LocalRayCluster) -> None:
    def config(rounds: int) -> dict[str, Any]:
        ray = {"address": cluster.address}
        return tiny_config(rounds=rounds, engine="ray", ray=ray, algorithm={"name": "scaffold"})

    assert_resumes_exactly(tmp_path, config, rounds=3, stop=2)


@needs_ray
def test_a_plugin_runs_on_the_cluster(tmp_path: Path, cluster: LocalRayCluster) -> None:
    """The Ray workers of both nodes import the run's plug-in (a file outside the repository) before they build
    its algorithm and model: the metrics equal the inline engine's."""
    plugin = str(write_plugin(tmp_path / "code"))
    with fresh_registries():
        inline = _run(plugin_config(workers=1, plugins=[plugin]), tmp_path / "inline")
        on_ray = plugin_config(engine="ray", ray={"address": cluster.address}, plugins=[plugin])
        assert _run(on_ray, tmp_path / "ray") == inline


@needs_ray
def test_a_local_instance_is_started_and_stopped_by_the_run(tmp_path: Path, ray_env: dict[str, str]) -> None:
    import ray

    inline = _run(tiny_config(rounds=2), tmp_path / "inline")
    assert _run(tiny_config(rounds=2, engine="ray"), tmp_path / "ray") == inline
    assert not ray.is_initialized()


@needs_ray
def test_an_address_where_no_cluster_answers_is_one_line(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    loop = RoundLoop(tiny_config(engine="ray", ray={"address": address}), tmp_path / "run", progress=False)
    with pytest.raises(FedskewError, match=f"ray.address '{address}': nothing answers there"):
        loop.run()


def test_missing_ray_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
    loop = RoundLoop(tiny_config(engine="ray"), tmp_path / "run", progress=False)
    with pytest.raises(FedskewError) as e:
        loop.run()
    assert str(e.value) == MISSING_RAY == ("engine 'ray' needs Ray: pip install ray (from a clone: "
                                           "pip install -e '.[ray]')")


@needs_ray
@pytest.mark.parametrize("kind", ["string", "bool"])
def test_a_broken_reply_on_the_cluster_is_that_clients_rejection(tmp_path: Path, cluster: LocalRayCluster,
                                                                 kind: str) -> None:
    """Issue 35, rule 2, on the Ray path: a client whose ``num_samples`` is ``"12"`` or ``True`` once ended the run
    ("undecodable message"); it is rejected with the inline engine's reason and the records are identical."""
    from tests.helpers.plugins import BAD_REPLY

    plugin = tmp_path / "bad_reply.py"
    plugin.write_text(BAD_REPLY)
    with fresh_registries():
        base = tiny_config(workers=1, plugins=[str(plugin)])
        base["algorithm"] = {**base["algorithm"], "name": "bad_reply", "kind": kind, "clients_per_round": 6}
        inline = _run(base, tmp_path / "inline")
        on_ray = _run({**base, "engine": "ray", "ray": {"address": cluster.address}}, tmp_path / "ray")
    assert on_ray == inline
    records = [json.loads(line) for line in on_ray.decode().splitlines()]
    assert all([cid for cid, _ in r["rejected"]] == [0] for r in records)
