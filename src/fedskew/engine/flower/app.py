"""A Flower App folder for ``flwr run``, and per-client shard files for sites that keep their own data.

Neither needs Flower installed, so ``fedskew deploy init`` can prepare an app on any machine. The app
folder holds ``pyproject.toml`` (Flower's app metadata, pointing at the ServerApp and ClientApp of
``fedskew_app.py``, with the run settings as ``[tool.flwr.app.config]``), ``experiment.toml`` (an ordinary
fedskew config, as given), ``fedskew_app.py`` (fedskew's ServerApp and ClientApp, after the app's
plug-ins are imported) and ``plugins/`` (a copy of each plug-in file the experiment or ``--import``
names). ``flwr run`` packs them all into the app bundle it sends to the SuperLink, which hands it to
every SuperNode.
"""

from __future__ import annotations

import shlex
import shutil
import tomllib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import tomli_w
import torch

from fedskew.core.errors import ConfigError
from fedskew.core.params import as_table, build_params
from fedskew.engine.flower.settings import DeploySettings, check_secure_aggregation

EXPERIMENT = "experiment.toml"
APP_MODULE = "fedskew_app"
"""The app's module: Flower loads its ``serverapp`` and ``clientapp`` (see :data:`APP_CODE`)."""
PLUGINS_DIR = "plugins"
"""The app's folder of plug-in files."""

PYPROJECT = """\
# A Flower App that runs a fedskew experiment (written by `fedskew deploy init`).
# Every machine (SuperLink and SuperNodes) needs `pip install "fedskew[flower]"`; start the SuperLink
# with --disable-runtime-dependency-installation so Flower uses that environment as it is, and bound to
# 127.0.0.1 (--host 127.0.0.1): its Control API has no account authentication, so reach it from other
# machines through an SSH tunnel (see docs/deploy.md).
[project]
name = "fedskew-app"
version = "1.0.0"
description = "fedskew experiment over Flower"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "fedskew"

[tool.flwr.app.components]
serverapp = "fedskew_app:serverapp"
clientapp = "fedskew_app:clientapp"

# Run settings; override any of them with `flwr run APP --run-config 'key=value ...'`
# (see docs/deploy.md for what each means).
"""

APP_CODE = '''"""This Flower App's ServerApp and ClientApp (written by `fedskew deploy init`): fedskew's own, after
the app's plug-ins are imported, in every process that runs them. PLUGINS are the app's plug-in files
(relative to this folder) and the installed modules the experiment names; they replace its `plugins`."""

from fedskew.engine.flower.components import client, server

PLUGINS = {plugins}

serverapp = server(__file__, PLUGINS)
clientapp = client(__file__, PLUGINS)
'''
"""``fedskew_app.py``; ``{plugins}`` is the list of the app's plug-ins."""

def run_config_defaults() -> dict[str, Any]:
    """The app's run settings as ``fedskew deploy init`` writes them: every :class:`~.settings.DeploySettings`
    field at its default (docs/deploy.md says what each means)."""
    return as_table(DeploySettings())


def resolve_experiment(
    path: Path, overrides: str, label: str, plugins: Sequence[str] | None = None
) -> dict[str, Any]:
    """The one run a deployment makes: the config at ``path`` with ``overrides``, variant ``label``;
    ``plugins`` (not None) replace the config's own."""
    from fedskew.config import read_config

    return one_run(read_config(path), overrides, label, path.name, plugins=plugins)


def one_run(
    raw: dict[str, Any], overrides: str, label: str, where: str, *,
    plugins: Sequence[str] | None = None, imports: Sequence[str] = (),
) -> dict[str, Any]:
    """The resolved config of the run of ``raw`` labelled ``label``; every variant is checked.

    ``plugins`` (not None) replace the plug-ins of ``raw`` and ``overrides``; ``imports`` add to them.
    """
    from fedskew.config import parse_overrides, resolve

    parsed = parse_overrides(shlex.split(overrides))
    if plugins is not None:
        parsed["plugins"] = list(plugins)
    runs = resolve(raw, parsed, where=where, imports=imports)
    if label:
        runs = [r for r in runs if r.label == label]
    if len(runs) != 1:
        found = ", ".join(r.folder_name for r in runs) or "none"
        raise ConfigError(
            f"a deployment makes one run, but {where} with label={label!r} gives {found}; choose a label "
            "(`fedskew deploy init --label`, or the label run setting) and a single seed (override seeds=[K])"
        )
    return runs[0].config


def write_app(
    folder: Path, config: str | None, overrides: list[str], label: str = "", force: bool = False,
    imports: Sequence[str] = (), settings: Mapping[str, Any] | None = None,
) -> Path:
    """Write a Flower App folder running ``config`` (a file or built-in name) with ``overrides``.

    The config is resolved and every value checked first, so a typo, a bad value, an ambiguous variant or a
    broken plug-in fails now, not on the server, and leaves nothing written. The plug-ins (the
    config's ``plugins``, a ``plugins`` override, ``imports``) are packed: each file is copied into
    ``plugins/``, and ``fedskew_app.py`` imports them, and the modules named, wherever the app runs.
    ``settings`` are run settings other than their defaults (``secagg = true`` and its parameters), checked too:
    with secure aggregation, a method or config it cannot carry is refused here (:func:`.settings.
    check_secure_aggregation`).
    """
    from fedskew.config import builtin_configs
    from fedskew.config.files import read_text, with_plugin_base
    from fedskew.config.schema import typed_config

    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is a file, not a folder: choose another app folder")
    target = folder / "pyproject.toml"
    if target.exists() and not force:
        raise ConfigError(f"{target} exists; pass --force to overwrite it")
    source = Path(config) if config is not None else None
    base = Path.cwd()
    if source is not None and source.exists():
        if source.is_dir():
            raise ConfigError(f"config {source} is a folder, not a TOML file")
        text, base = read_text(source, "config"), source.resolve().parent
    elif config is None or config in builtin_configs():
        text = resources.files("fedskew.configs").joinpath(f"{config or 'default'}.toml").read_text(encoding="utf-8")
    else:
        raise ConfigError(f"config {config!r} not found: give a TOML file or a built-in config name")
    # A plugins override is packed with the others, so the app's overrides leave it out.
    kept = [o for o in overrides if o.partition("=")[0].strip() != "plugins"]
    run_settings = {**run_config_defaults(), **(settings or {}), "overrides": shlex.join(kept), "label": label}
    checked = build_params(DeploySettings, run_settings, prefix="run setting ")
    try:
        raw = with_plugin_base(tomllib.loads(text), base, str(config or "default"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config {config or 'default'}: invalid TOML: {e}") from None
    run = one_run(raw, shlex.join(overrides), label, str(config or "default"), imports=imports)
    check_secure_aggregation(typed_config(run), checked)
    plugins = run.get("plugins", [])
    folder.mkdir(parents=True, exist_ok=True)
    packed = _pack_plugins(plugins, folder / PLUGINS_DIR)
    (folder / EXPERIMENT).write_text(text, encoding="utf-8")
    (folder / f"{APP_MODULE}.py").write_text(APP_CODE.format(plugins=repr(packed)), encoding="utf-8")
    target.write_text(PYPROJECT + tomli_w.dumps({"tool": {"flwr": {"app": {"config": run_settings}}}}))
    return folder


def _pack_plugins(plugins: Sequence[str], into: Path) -> list[str]:
    """Copy each plug-in file into ``into`` (``name.py``, ``name_2.py`` ... for equal names); return the app's
    plug-in list: the copies relative to the app folder, and the module names as they are."""
    from fedskew.plugins import is_file_spec

    packed: list[str] = []
    taken: set[str] = set()
    if into.is_dir():
        shutil.rmtree(into)  # a --force rewrite keeps no plug-in the experiment no longer names
    for spec in plugins:
        if not is_file_spec(spec):
            packed.append(spec)
            continue
        path = Path(spec)
        name, k = path.name, 2
        while name in taken:
            name, k = f"{path.stem}_{k}.py", k + 1
        taken.add(name)
        into.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, into / name)
        packed.append(f"{into.name}/{name}")
    return packed


SUPERLINK_HOST = "127.0.0.1"
"""Where :func:`superlink_command` binds the SuperLink by default. Flower 1.41 serves the Fleet API
(SuperNodes), the Control API (``flwr``: register nodes, submit and stop runs) and the runtime on one
address, and its open-source Control API has no account authentication: whoever reaches it (with the CA
certificate) may register SuperNodes and submit apps. Bound to the loopback interface, it is reachable
only from this machine; SuperNodes and ``flwr`` elsewhere come in through an SSH tunnel (docs/deploy.md)."""


def superlink_command(certs: str = "certs", host: str = SUPERLINK_HOST, port: int = 9093) -> str:
    """The ``flower-superlink`` command of docs/deploy.md: TLS, SuperNode authentication, bound to ``host``.

    The default host is the loopback interface (see :data:`SUPERLINK_HOST`); pass another only where the
    network in front of the SuperLink admits nobody but the SuperNodes and the operators.
    """
    return (
        f"flower-superlink --ssl-ca-certfile {certs}/ca.crt --ssl-certfile {certs}/server.pem "
        f"--ssl-keyfile {certs}/server.key --enable-supernode-auth --disable-runtime-dependency-installation "
        f"--host {host} --port {port}"
    )


def shard_path(folder: str | Path, cid: int) -> Path:
    """The file of client ``cid``'s training data in a SuperNode's ``data-path`` folder."""
    return Path(folder).expanduser() / f"client-{cid}.pt"


def write_shards(cfg: dict[str, Any], out: Path, data_dir: str | None) -> list[Path]:
    """One file per client with its training data (and its own test split), exactly as the simulator would give it.

    For deployments where each site must hold only its own data: give site ``k`` the file
    ``client-<k>.pt`` and start its SuperNode with ``--node-config 'partition-id=k data-path="DIR"'``.
    """
    from fedskew.config.schema import component
    from fedskew.engine.federation import build_federation

    dataset, partition, model = (component(section, cfg[section]) for section in ("dataset", "partition", "model"))
    fed = build_federation(dataset, partition, model, int(cfg["seed"]), data_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for cid in range(fed.info.num_clients):
        x, y = fed.client_data(cid)
        paths.append(shard_path(out, cid))
        shard = {"x": x.clone(), "y": y.clone()}
        if fed.has_client_test:  # the client's own test split (partition.client_test_fraction)
            xt, yt = fed.client_test(cid)
            shard.update(x_test=xt.clone(), y_test=yt.clone())
        torch.save(shard, paths[-1])
    return paths
