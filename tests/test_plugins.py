"""Plug-ins: a module outside the repository registers an algorithm, a model and a partitioner, and fedskew uses
them by name (``--import``, a config's ``plugins``, spawned workers, resume, list, partition, deploy init,
entry points of installed packages); every way a plug-in can fail is one line before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from fedskew.cli import main
from fedskew.config import dump, read_config, resolve
from fedskew.core.errors import ConfigError
from fedskew.plugins import load_plugins, module_name
from tests.helpers.cli import SRC, command, environment, fedskew, one_error, write_config
from tests.helpers.plugins import ALGORITHM, MODEL, PARTITIONER, SOURCE, fresh_registries, plugin_config, write_plugin

FOLDER = f"{ALGORITHM}-seed0"


def _config(path: Path, **over: object) -> Path:
    """A config file of the plug-in's federation (``seeds = [0]``, labelled by the algorithm)."""
    cfg = plugin_config(**over)
    cfg.pop("label")
    cfg["seeds"] = [0]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(cfg))
    return path


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``fedskew ARGV`` in this process; it must fail with one line, which is returned."""
    with fresh_registries():
        assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedskew: error: "), err
    return err


# ---- running -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_import_and_the_config_key_run_the_plugin_also_in_spawned_workers(tmp_path: Path) -> None:
    """``--import`` (relative to the current folder) in one process, the config's ``plugins`` (relative to the
    config's folder) with two spawned workers: both run, with identical metrics, and record the plug-in."""
    plugin = write_plugin(tmp_path / "code")
    _config(tmp_path / "a.toml", workers=1, rounds=2)
    res = fedskew("run", "a.toml", "--import", "code/my_plugin.py", "--out", "a", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    _config(tmp_path / "exp" / "b.toml", workers=2, rounds=2, plugins=["../code/my_plugin.py"])
    res = fedskew("run", "exp/b.toml", "--out", "b", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    a, b = tmp_path / "a" / FOLDER, tmp_path / "b" / FOLDER
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    for run in (a, b):
        assert read_config(run / "config.toml")["plugins"] == [str(plugin)]


@pytest.mark.slow
def test_resume_needs_no_import(tmp_path: Path) -> None:
    """The run's config.toml names the plug-in: ``--resume`` imports it again."""
    write_plugin(tmp_path / "code")
    _config(tmp_path / "c.toml", rounds=1, plugins=["code/my_plugin.py"])
    assert fedskew("run", "c.toml", "--out", "c", "--no-progress", cwd=tmp_path).code == 0
    res = fedskew("run", "--resume", f"c/{FOLDER}", "rounds=2", "--no-progress", cwd=tmp_path)
    assert res.code == 0, res.err
    records = [json.loads(line) for line in (tmp_path / "c" / FOLDER / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]


@pytest.mark.slow
def test_list_and_partition_see_the_plugin(tmp_path: Path) -> None:
    write_plugin(tmp_path)
    res = fedskew("list", "--import", "my_plugin.py", cwd=tmp_path)
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    for name, option in ((ALGORITHM, "damping=1.0"), (MODEL, "hidden=16"), (PARTITIONER, "")):
        assert any(line.split()[:1] == [name] and option in line for line in lines), (name, res.out)
    assert f"plugins:      {tmp_path / 'my_plugin.py'}" in lines
    _config(tmp_path / "p.toml")
    res = fedskew("partition", "p.toml", f"partition.name={PARTITIONER}", "--import", "my_plugin.py",
                  "--out", "p.png", cwd=tmp_path)
    assert res.code == 0, res.err
    assert (tmp_path / "p.png").is_file()
    # 400 samples sorted by label, cut into 6 blocks: each client holds one or two of the 4 classes.
    rows = [[int(n) for n in line.split()[1:5]] for line in res.out.splitlines() if line[:6].strip().isdigit()]
    assert len(rows) == 6 and all(1 <= sum(n > 0 for n in row) <= 2 for row in rows), res.out


@pytest.mark.slow
def test_a_module_name_is_found_in_the_current_folder(tmp_path: Path) -> None:
    """``--import my_plugin`` finds ``my_plugin.py`` in the current folder, as ``python -m`` would."""
    write_plugin(tmp_path)
    res = fedskew("list", "--import", "my_plugin", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "plugins:      my_plugin" in res.out.splitlines()


@pytest.mark.slow
def test_an_installed_entry_point_is_loaded_in_every_process(tmp_path: Path) -> None:
    """A package's ``fedskew.plugins`` entry point registers its model in the command and in its workers."""
    site = tmp_path / "site"
    (site / "ep_plugin-0.1.dist-info").mkdir(parents=True)
    (site / "ep_plugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-plugin\nVersion: 0.1\n")
    (site / "ep_plugin-0.1.dist-info" / "entry_points.txt").write_text("[fedskew.plugins]\nmine = ep_plugin\n")
    (site / "ep_plugin.py").write_text(SOURCE)
    cfg = _config(tmp_path / "ep.toml", workers=2, rounds=1)
    env = environment(PYTHONPATH=f"{SRC}:{site}")
    res = subprocess.run(command("run", str(cfg), "--out", "ep", "--no-progress"), cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "plugins" not in read_config(tmp_path / "ep" / FOLDER / "config.toml")  # installed: nothing to record
    (site / "ep_plugin.py").write_text("raise RuntimeError('broken install')\n")
    res = subprocess.run(command("list"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and res.stderr.strip() == (
        "fedskew: error: plugin 'mine' (entry point 'ep_plugin' of package ep-plugin) failed: "
        f"RuntimeError: broken install (at {site / 'ep_plugin.py'}, line 1)"
    ), res.stderr


# ---- failures: one line each, before anything runs ----------------------------------------------------------
def test_a_plugin_that_cannot_be_found_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _error(capsys, "list", "--import", "nowhere.py") == (
        f"fedskew: error: plugin 'nowhere.py' not found: no such file {tmp_path / 'nowhere.py'}"
    )
    assert _error(capsys, "list", "--import", "no_such_package.module") == (
        "fedskew: error: plugin 'no_such_package.module' not found: no module named 'no_such_package' among the "
        "installed packages, PYTHONPATH and the current folder"
    )
    assert "is neither a .py file nor a module name" in _error(capsys, "list", "--import", "my-plugin")
    (tmp_path / "folder").mkdir()
    assert "is a folder" in _error(capsys, "list", "--import", "folder/")


def test_a_plugin_that_raises_is_one_line_naming_its_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("import math\n\nx = math.sqrt(-1)\n")
    assert _error(capsys, "list", "--import", "bad.py") == (
        f"fedskew: error: plugin 'bad.py' failed: ValueError: math domain error (at {tmp_path / 'bad.py'}, line 3)"
    )
    (tmp_path / "syntax.py").write_text("def f(:\n")
    assert "plugin 'syntax.py' failed: SyntaxError: " in _error(capsys, "list", "--import", "syntax.py")
    (tmp_path / "needs.py").write_text("import not_installed_anywhere\n")
    assert _error(capsys, "list", "--import", "needs.py") == (
        "fedskew: error: plugin 'needs.py' failed: ModuleNotFoundError: No module named 'not_installed_anywhere' "
        f"(at {tmp_path / 'needs.py'}, line 1)"
    )
    # A name that is taken: the line says by whom.
    (tmp_path / "dup.py").write_text(textwrap.dedent("""\
        from fedskew import FedAvg, register_algorithm


        @register_algorithm("fedavg")
        class Mine(FedAvg):
            pass
    """))
    line = _error(capsys, "list", "--import", "dup.py")
    assert line.startswith("fedskew: error: plugin 'dup.py' failed: ValueError: algorithm 'fedavg' is registered "
                           "twice (by fedskew.algorithms.fedavg.FedAvg and by fedskew_plugin_dup_"), line
    assert line.endswith(f"choose another name (at {tmp_path / 'dup.py'}, line 4)"), line


def test_bad_plugins_in_a_config_are_one_line_and_nothing_runs(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    cfg = _config(tmp_path / "exp" / "x.toml", plugins=["missing.py"])
    assert _error(capsys, "run", str(cfg), "--out", str(tmp_path / "out")) == (
        f"fedskew: error: plugin '{tmp_path / 'exp' / 'missing.py'}' not found: no such file"  # the config's folder
    )
    assert not (tmp_path / "out").exists()
    cfg.write_text(cfg.read_text().replace('plugins = [\n    "missing.py",\n]', 'plugins = "missing.py"'))
    assert "plugins must be a list of module names and .py files" in _error(capsys, "run", str(cfg))
    raw = {**plugin_config(), "variants": [{"label": "A", "plugins": ["x.py"]}]}
    with pytest.raises(ConfigError, match="variant 'A' sets plugins; the plugins apply to every variant"):
        resolve(raw)


# ---- in this process -----------------------------------------------------------------------------------------
def test_each_plugin_is_imported_once_under_a_stable_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = write_plugin(tmp_path)
    monkeypatch.chdir(tmp_path)
    with fresh_registries():
        first = load_plugins(["my_plugin.py"])
        assert first == load_plugins([str(plugin), "./my_plugin.py"]) == [str(plugin)]  # no second import
        assert module_name(plugin) in sys.modules
        assert module_name(plugin) == module_name(Path(str(plugin)))  # the same in every process
        runs = resolve(plugin_config(plugins=["my_plugin.py"]))
        assert runs[0].config["plugins"] == [str(plugin)]


@pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning")  # inside Flower's app builder
@pytest.mark.slow
def test_deploy_init_packs_the_plugin_and_the_app_imports_it(tmp_path: Path) -> None:
    """The app holds a copy of each plug-in file and its fedskew_app module imports them: with the original files
    gone, the app's module registers the plug-in's entries and the ServerApp resolves the experiment with it."""
    write_plugin(tmp_path / "code")
    write_plugin(tmp_path / "more", "my_plugin.py").write_text("from fedskew import MODELS  # a second, same name\n")
    _config(tmp_path / "exp.toml", plugins=["code/my_plugin.py"])
    res = fedskew("deploy", "init", "app", "exp.toml", "rounds=2", "--import", "more/my_plugin.py", cwd=tmp_path)
    assert res.code == 0, res.err
    app = tmp_path / "app"
    assert (app / "plugins" / "my_plugin.py").read_text() == SOURCE
    assert (app / "plugins" / "my_plugin_2.py").read_text().startswith("from fedskew import MODELS")
    assert "PLUGINS = ['plugins/my_plugin.py', 'plugins/my_plugin_2.py']" in (app / "fedskew_app.py").read_text()
    pyproject = (app / "pyproject.toml").read_text()
    assert 'serverapp = "fedskew_app:serverapp"' in pyproject and 'clientapp = "fedskew_app:clientapp"' in pyproject
    build = pytest.importorskip("flwr.cli.build", reason="Flower is optional: pip install -e '.[flower]'")
    from flwr.cli.config_utils import load_and_validate

    load_and_validate(app / "pyproject.toml")  # as `flwr run` checks it: the components are found
    with zipfile.ZipFile(BytesIO(build.build_fab_from_disk(app))) as fab:  # what `flwr run` sends
        assert {"fedskew_app.py", "plugins/my_plugin.py", "plugins/my_plugin_2.py"} <= set(fab.namelist())
    for folder in ("code", "more"):
        (tmp_path / folder / "my_plugin.py").unlink()
    probe = textwrap.dedent(f"""\
        import sys
        from pathlib import Path

        sys.path.insert(0, "app")
        import fedskew_app
        from fedskew.algorithms.base import ALGORITHMS
        from fedskew.engine.flower.app import resolve_experiment
        from fedskew.models import MODELS
        from fedskew.plugins import load_plugins

        assert "{ALGORITHM}" in ALGORITHMS and "{MODEL}" in MODELS
        packed = load_plugins(fedskew_app.PLUGINS, base=Path("app"))
        cfg = resolve_experiment(Path("app/experiment.toml"), "rounds=2", "", packed)
        print(cfg["plugins"])
    """)
    res = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=environment(), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str([str(app / "plugins" / n) for n in ("my_plugin.py", "my_plugin_2.py")])


def test_a_failing_import_stops_fedskew_run_before_it_starts(tmp_path: Path) -> None:
    """As a user sees it: exit 2, one line, no traceback, no run folder."""
    (tmp_path / "bad.py").write_text("raise SystemError('nope')\n")
    cfg = write_config(tmp_path / "x.toml")
    line = one_error(fedskew("run", str(cfg), "--import", "bad.py", "--out", "out", "--no-progress", cwd=tmp_path))
    assert line == f"fedskew: error: plugin 'bad.py' failed: SystemError: nope (at {tmp_path / 'bad.py'}, line 1)"
    assert not (tmp_path / "out").exists()
