"""A wheel built from this checkout installs in a fresh virtual environment and runs the default experiment
(issue 36, point 5): what ``pip install`` of a release would give, package data (the built-in configs)
included.

Nothing large is downloaded: the fresh environment sees this interpreter's installed packages (torch, numpy,
...) through a ``.pth`` file, the wheel goes in with ``--no-index`` (so every dependency it declares must
already be satisfied), and the build uses the installed setuptools (``--no-build-isolation``). About
30-60 s; marked ``slow``, and part of the default run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert res.returncode == 0, f"{' '.join(cmd)}:\n{res.stdout}\n{res.stderr}"
    return res.stdout + res.stderr


@pytest.mark.slow
def test_a_built_wheel_installs_in_a_fresh_venv_and_runs_the_default_experiment(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy of the working tree (not ignored files): the build writes build/
    tracked = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT).split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file() and not name.startswith("results/"):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
          "-w", str(dist)], tmp_path)
    (wheel,) = dist.glob("fedskew-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fedskew/configs/default.toml" in names  # package data: `fedskew run` needs the built-in config
    assert not any(n.startswith(("tests/", "benchmarks/", "experiments/")) for n in names)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)
                .strip())
    (site / "installed_here.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co., not fedskew
    # --ignore-installed: this interpreter's editable fedskew is visible through the .pth file too
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps",
          "--ignore-installed", "-q", str(wheel)], tmp_path)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["FEDSKEW_CACHE"] = str(tmp_path / "cache")
    where = _run([str(python), "-c", "import fedskew; print(fedskew.__file__)"], tmp_path, env).strip()
    assert Path(where).is_relative_to(site), where  # the wheel's fedskew, not this checkout's
    # Every dependency the wheel declares (extras aside) is installed at a version it accepts.
    check = ("from importlib.metadata import requires, version\nfrom packaging.requirements import Requirement\n"
             "for r in map(Requirement, requires('fedskew')):\n"
             "    if r.marker is None or r.marker.evaluate({'extra': ''}):\n"
             "        assert r.specifier.contains(version(r.name), prereleases=True), (r, version(r.name))\n"
             "        print(r.name)")
    declared = _run([str(python), "-c", check], tmp_path, env).split()
    assert {"torch", "numpy", "matplotlib", "tqdm"} <= set(declared)
    work = tmp_path / "work"
    work.mkdir()
    out = _run([str(env_dir / "bin" / "fedskew"), "run", "rounds=1", "--no-progress"], work, env, timeout=300)
    assert "run folder: runs/default" in out
    for label in ("FedAvg", "Centralised"):
        summary = json.loads((work / "runs" / "default" / f"{label}-seed0" / "summary.json").read_text())
        assert summary["rounds"] == 1
    assert (work / "runs" / "default" / "report" / "report.html").is_file()
