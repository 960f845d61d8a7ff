"""Issue 26, deployment: the Control API bound to localhost by default, a SuperNode's data location
decided by its own node config, and a deployment's run folder held and checked as ``fedskew run``'s."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flwr", reason="Flower is optional: pip install -e '.[flower]'")

from flwr.app import Message as FlowerMessage

from fedskew.core.errors import FedskewError
from fedskew.engine.flower.app import SUPERLINK_HOST, superlink_command
from fedskew.engine.flower.client_app import load_shard, node_dataset
from fedskew.engine.flower.messages import HEADER
from fedskew.runs import locked_run_folder
from tests.helpers.cli import fedskew, snapshot
from tests.helpers.configs import tiny_config
from tests.helpers.flower import FakeGrid, deploy_on


def test_the_superlink_command_binds_to_localhost() -> None:
    assert SUPERLINK_HOST == "127.0.0.1"
    cmd = superlink_command()
    assert "--host 127.0.0.1 " in cmd and "--enable-supernode-auth" in cmd and "--ssl-certfile" in cmd
    assert "--insecure" not in cmd


@pytest.mark.slow
def test_deploy_init_tells_to_start_the_superlink_on_localhost(tmp_path: Path) -> None:
    res = fedskew("deploy", "init", "app", "default", "rounds=2", "--label", "FedAvg", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "--host 127.0.0.1" in res.out and "SSH tunnel" in res.out
    assert "--host 127.0.0.1" in (tmp_path / "app" / "pyproject.toml").read_text()


def test_docs_deploy_starts_the_superlink_on_localhost() -> None:
    """docs/deploy.md gives ``deploy init``'s command, and no ``--host`` other than the loopback interface."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    assert set(re.findall(r"--host (\S+)", doc)) == {SUPERLINK_HOST}
    block = re.search(r"```bash\n(flower-superlink .*?)\n```", doc, re.DOTALL)
    assert block is not None and " ".join(block.group(1).replace("\\\n", " ").split()) == superlink_command()
    assert "ssh -N -L 9093:localhost:9093" in doc


def test_a_node_takes_no_path_from_the_server() -> None:
    table = {"name": "image_folder", "data_dir": "/srv/server-data", "path": "pacs/photo", "image_size": 32}
    assert node_dataset(table) == {"name": "image_folder", "path": "pacs/photo", "image_size": 32}
    for path in ("/etc", "~/secrets", "../../home", "pacs/../../x"):
        with pytest.raises(FedskewError, match="outside this node's data folder"):
            node_dataset({"name": "image_folder", "path": path})


def test_a_node_refuses_a_server_named_path_before_reading_anything(tmp_path: Path) -> None:
    run = {"dataset": {"name": "image_folder", "path": str(tmp_path)}, "partition": {"name": "iid", "num_clients": 2},
           "model": {"name": "mlp"}, "seed": 0}
    with pytest.raises(FedskewError, match="outside this node's data folder"):
        load_shard(0, run, None, {"partition-id": 0})  # type: ignore[arg-type]  # refused before info is used


def test_the_server_sends_the_nodes_no_path(probe: str, tmp_path: Path) -> None:
    cfg = tiny_config(rounds=1, dataset={"data_dir": "/srv/server-only"})
    grid = FakeGrid([{"partition-id": "0,1,2,3,4,5"}])
    sent: list[dict[str, Any]] = []
    original = grid.push_messages

    def push(messages: list[FlowerMessage]) -> list[str]:
        sent.extend(json.loads(str(m.content[HEADER]["run"])) for m in messages if "run" in m.content[HEADER])
        return original(messages)

    grid.push_messages = push  # type: ignore[method-assign]
    deploy_on(grid, tmp_path, cfg)
    assert sent and all("data_dir" not in run["dataset"] for run in sent)


def test_a_deployment_holds_its_run_folder_and_refuses_a_shortened_resume(probe: str, tmp_path: Path) -> None:
    cfg = tiny_config(rounds=2)
    grid = FakeGrid([{"partition-id": "0,1,2,3,4,5"}])
    run_dir = deploy_on(grid, tmp_path, cfg)
    before = snapshot(run_dir)
    with pytest.raises(FedskewError, match="is at round 2, beyond the run's rounds = 1"):
        deploy_on(grid, tmp_path, cfg, resume=True, overrides="rounds=1")
    with locked_run_folder(run_dir), pytest.raises(FedskewError, match="in use by another fedskew process"):
        deploy_on(grid, tmp_path, cfg, resume=True)
    assert snapshot(run_dir) == before
