"""The Ray engine (``engine = "ray"``): the same metrics as the inline engine, on a real two-node cluster; and
Flower's local simulation, which runs its clients on Ray.

A module fixture starts a head node and a second node on this machine (:mod:`tests.helpers.ray_cluster`,
one CPU each, so a round's jobs must spread over both), and runs join it through ``ray.address``; one
test lets the engine start and stop its own local instance. The tests skip only where Ray is not
installed (``pip install -e '.[ray]'``; scripts/test.sh installs it); the missing-Ray error is tested
everywhere.

Flower's local simulation (docs/deploy.md's first recipe) starts a local Ray instance, which would join a
cluster it finds: its tests are in this file, before the cluster's, so that they never run beside the cluster.
pytest runs a file's tests in order, and pytest-xdist (``--dist loadfile``, scripts/test.sh) keeps a file on
one worker; the cluster starts with the first test that asks for it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fedskew
from fedskew.config import dump, typed_config
from fedskew.core.errors import FedskewError
from fedskew.engine.ray_workers import MISSING_RAY
from fedskew.engine.round_loop import RoundLoop
from tests.helpers.configs import LABEL_SKEW, config_for, tiny_config
from tests.helpers.plugins import BAD_REPLY, fresh_registries, plugin_config, write_plugin
from tests.helpers.ray_cluster import LocalRayCluster, auth_env, free_port
from tests.helpers.runs import assert_resumes_exactly

ROOT = Path(__file__).resolve().parents[2]

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray is optional: pip install -e '.[ray]'"
)
needs_flower = pytest.mark.skipif(
    importlib.util.find_spec("flwr") is None, reason="Flower is optional: pip install -e '.[flower]'"
)

# FedAvg, SCAFFOLD: its clients keep a control variate c_i in their state between rounds, and Ditto:
# they keep a personal model.
ALGORITHMS = [{"name": "fedavg"}, {"name": "scaffold"}, {"name": "ditto"}]


# ---- Flower's local simulation (issue 36, point 4), before the cluster starts ------------------------------
def _pids_with(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (the managed SuperLink is detached: no parent to ask)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
    return pids


@needs_flower
def test_the_flower_extra_brings_the_simulation() -> None:
    """``flwr run`` on a local connection simulates the clients on Ray: ``flwr`` alone cannot run it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("flwr[simulation]") for req in extras["flower"])


@needs_flower
@pytest.mark.slow
def test_local_simulation_recipe_runs_one_round(tmp_path: Path) -> None:
    """``fedskew deploy init``, then ``flwr run APP --stream --federation-config num-supernodes=N`` with the
    environment's commands on ``PATH`` (``flwr run`` starts ``flower-superlink`` by name) and nothing else set
    up: no certificates, no SuperNodes, no Flower configuration file. Flower's simulation runs the clients on
    Ray, which the ``flower`` extra brings (``flwr[simulation]``); this test does not skip without Ray."""
    from tests.helpers.flower_federation import BIN, descendants

    home = tmp_path / "flwr-home"
    port, control = free_port(), free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # docs/deploy.md: the venv's commands
        "FLWR_HOME": str(home),  # a first-time user's: no configuration yet
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),  # not the fixed default ports, which may be taken
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
        "FLWR_TELEMETRY_ENABLED": "0",
        # the fedskew this test imports, in every process (the app's too), whatever the working directory
        "PYTHONPATH": os.pathsep.join([str(Path(fedskew.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    init = subprocess.run(
        [sys.executable, "-m", "fedskew.cli", "deploy", "init", "my-app", "--label", "FedAvg", "rounds=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert init.returncode == 0, init.stderr
    assert "flwr run my-app --stream --federation-config 'num-supernodes=10'" in init.stdout  # the local recipe
    try:
        res = subprocess.run(
            [str(BIN / "flwr"), "run", "my-app", "--stream", "--federation-config", "num-supernodes=10"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )
    finally:
        superlinks = _pids_with(f"--port {port}")
        victims = [*superlinks, *(d for p in superlinks for d in descendants(p))]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(1)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log
    assert "ray is not available" not in log.lower()
    run = tmp_path / "runs" / "deploy" / "FedAvg-seed0"  # the ServerApp writes where the SuperLink started
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1]
    assert sorted(records[0]["clients"]) == list(range(10))
    assert json.loads((run / "summary.json").read_text())["rounds"] == 1


# ---- the Ray engine --------------------------------------------------------------------------------------
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
    RoundLoop(typed_config(cfg), path, progress=False).run()
    return (path / "metrics.jsonl").read_bytes()


@needs_ray
@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda a: a["name"])
@pytest.mark.slow
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
@pytest.mark.parametrize("name", LABEL_SKEW)
@pytest.mark.slow
def test_the_label_skew_family_on_the_cluster_equals_the_inline_engine(
    tmp_path: Path, cluster: LocalRayCluster, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """Issue 48's eight methods, two rounds each on the two-node cluster: the inline engine's metrics."""
    inline = _run(config_for(name, rounds=2), tmp_path / "inline")
    with caplog.at_level(logging.INFO, logger="fedskew"):
        on_ray = config_for(name, rounds=2, engine="ray", ray={"address": cluster.address})
        assert _run(on_ray, tmp_path / "ray") == inline
    assert any(m.startswith("ray: ") and m.endswith("ran on 2 nodes") for m in caplog.messages), caplog.messages


@needs_ray
@pytest.mark.parametrize("privacy", [{"mode": "central"}, {"mode": "local", "clip": 0.5}], ids=["central", "local"])
@pytest.mark.slow
def test_private_runs_on_the_cluster_equal_the_inline_engine(
    tmp_path: Path, cluster: LocalRayCluster, privacy: dict[str, Any]
) -> None:
    """[privacy]: central DP at the driver's exchange, local DP's noise in the Ray workers (its stream is the
    client's, wherever it runs): the inline engine's metrics, epsilon included."""
    inline = _run(tiny_config(workers=1, privacy=privacy), tmp_path / "inline")
    on_ray = tiny_config(engine="ray", ray={"address": cluster.address}, privacy=privacy)
    assert _run(on_ray, tmp_path / "ray") == inline and b'"epsilon"' in inline


@needs_ray
@pytest.mark.slow
def test_resume_on_the_cluster_equals_an_uninterrupted_run(tmp_path: Path, cluster: LocalRayCluster) -> None:
    def config(rounds: int) -> dict[str, Any]:
        ray = {"address": cluster.address}
        return tiny_config(rounds=rounds, engine="ray", ray=ray, algorithm={"name": "scaffold"})

    assert_resumes_exactly(tmp_path, config, rounds=3, stop=2)


@needs_ray
@pytest.mark.slow
def test_a_plugin_runs_on_the_cluster(tmp_path: Path, cluster: LocalRayCluster) -> None:
    """The Ray workers of both nodes import the run's plug-in (a file outside the repository) before they build
    its algorithm and model: the metrics equal the inline engine's."""
    plugin = str(write_plugin(tmp_path / "code"))
    with fresh_registries():
        inline = _run(plugin_config(workers=1, plugins=[plugin]), tmp_path / "inline")
        on_ray = plugin_config(engine="ray", ray={"address": cluster.address}, plugins=[plugin])
        assert _run(on_ray, tmp_path / "ray") == inline


@needs_ray
@pytest.mark.slow
def test_a_local_instance_is_started_and_stopped_by_the_run(tmp_path: Path, ray_env: dict[str, str]) -> None:
    import ray

    inline = _run(tiny_config(rounds=2), tmp_path / "inline")
    assert _run(tiny_config(rounds=2, engine="ray"), tmp_path / "ray") == inline
    assert not ray.is_initialized()


@needs_ray
def test_an_address_where_no_cluster_answers_is_one_line(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    config = typed_config(tiny_config(engine="ray", ray={"address": address}))
    loop = RoundLoop(config, tmp_path / "run", progress=False)
    with pytest.raises(FedskewError, match=f"ray.address '{address}': nothing answers there"):
        loop.run()


def test_missing_ray_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails, as where it is not installed
    loop = RoundLoop(typed_config(tiny_config(engine="ray")), tmp_path / "run", progress=False)
    with pytest.raises(FedskewError) as e:
        loop.run()
    assert str(e.value) == MISSING_RAY == ("engine 'ray' needs Ray: pip install ray (from a clone: "
                                           "pip install -e '.[ray]')")


@needs_ray
@pytest.mark.parametrize("kind", ["string", "bool"])
@pytest.mark.slow
def test_a_broken_reply_on_the_cluster_is_that_clients_rejection(tmp_path: Path, cluster: LocalRayCluster,
                                                                 kind: str) -> None:
    """Issue 35, rule 2, on the Ray path: a client whose ``num_samples`` is ``"12"`` or ``True`` once ended the run
    ("undecodable message"); it is rejected with the inline engine's reason and the records are identical."""
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
