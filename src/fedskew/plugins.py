"""Plug-ins: user modules that register algorithms, models, datasets or partitioners, imported by name or path.

A plug-in is an ordinary Python module whose import registers entries (``@register_algorithm``,
``@MODELS.register``, ``@DATASETS.register``, ``@PARTITIONERS.register``). It is named in one of three ways:

- a config's ``plugins = ["my_package.my_module", "path/to/file.py"]`` (paths relative to the config file's
  folder) or the command line's ``--import MODULE_OR_FILE`` (paths relative to the current folder);
- an installed package's entry point in the group ``fedskew.plugins`` (:data:`ENTRY_POINT_GROUP`), loaded
  in every process the first time any plug-in is asked for.

A spec ending in ``.py`` or holding a path separator is a file, imported by its path under a module name
of its own (:func:`module_name`); anything else is a module name, found on ``sys.path`` or, failing that,
in the current folder (as ``python -m`` finds it). Each plug-in is imported once per process. Every
failure (not found, not a module name, anything raised while importing it, ``SystemExit`` and
``KeyboardInterrupt`` included) is one
:class:`~fedskew.core.errors.ConfigError` line naming the plug-in and the reason, raised before anything
runs.

Worker processes (the process pool, Ray tasks) import :func:`loaded_plugins` of their parent before they
build the algorithm, and a run's ``config.toml`` records its plug-ins as absolute paths and module names,
so ``fedskew run --resume`` and ``fedskew audit`` import them again.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from fedskew.core.errors import ConfigError

ENTRY_POINT_GROUP = "fedskew.plugins"
"""Entry-point group of installed plug-ins (a package's ``pyproject.toml``:
``[project.entry-points."fedskew.plugins"]`` ``my_name = "my_package.module"``)."""

_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_LOADED: dict[str, str] = {}  # normalised spec -> the module name it was imported as
_ENTRY_POINTS_DONE = False


def is_file_spec(spec: str) -> bool:
    """Whether ``spec`` names a file (it ends in ``.py`` or holds a path separator) rather than a module."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def normalise(spec: str, base: str | Path | None = None) -> str:
    """``spec`` as a run records it: a file as its absolute path (relative ones against ``base``, default the
    current folder), a module name as it is."""
    if not is_file_spec(spec):
        return spec
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = Path(base if base is not None else Path.cwd()) / path
    return str(path.resolve())


def check_specs(specs: object, what: str = "plugins") -> list[str]:
    """``specs`` as a list of strings, or a ConfigError naming what a ``plugins`` value must be."""
    if not isinstance(specs, list | tuple) or not all(isinstance(s, str) and s.strip() for s in specs):
        raise ConfigError(
            f"{what} must be a list of module names and .py files, e.g. [\"my_package.my_module\", "
            f"\"path/to/file.py\"], got {specs!r}"
        )
    return [s.strip() for s in specs]


def load_plugins(specs: Iterable[str] = (), base: str | Path | None = None) -> list[str]:
    """Import the plug-ins ``specs`` (each once per process) and every installed ``fedskew.plugins`` entry point.

    Parameters
    ----------
    specs
        Module names and ``.py`` files; relative file paths are relative to ``base`` (default: the
        current folder).
    base
        The folder relative file paths start from (a config file's folder for its ``plugins`` key).

    Returns
    -------
    list of str
        The specs normalised (:func:`normalise`), without repeats, in order: what a run records.

    Raises
    ------
    ConfigError
        One line ``plugin 'X' ...: <reason>`` for a plug-in that cannot be found or raises on import.
    """
    load_entry_points()
    out: list[str] = []
    for spec in check_specs(specs if isinstance(specs, str) else list(specs)):
        key = normalise(spec, base)
        if key not in _LOADED:
            _LOADED[key] = _import_file(spec, Path(key)) if is_file_spec(spec) else _import_module(spec)
        if key not in out:
            out.append(key)
    return out


def loaded_plugins() -> list[str]:
    """Every plug-in this process imported through :func:`load_plugins` (normalised specs, in order): what a
    worker process it starts imports before it builds anything."""
    return list(_LOADED)


def load_entry_points() -> None:
    """Import every installed entry point of :data:`ENTRY_POINT_GROUP`, once per process.

    An entry point names a module (``my_package.fedskew_plugin``), whose import registers its entries, or
    a callable (``my_package.plugin:register``), which is then called without arguments.
    """
    global _ENTRY_POINTS_DONE
    if _ENTRY_POINTS_DONE:
        return
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = f" of package {ep.dist.name}" if ep.dist is not None else ""
        label = f"{ep.name!r} (entry point {ep.value!r}{dist})"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, ModuleType):
                obj()
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: a plug-in never ends fedskew
            raise ConfigError(f"plugin {label} failed: {_reason(e)}") from None
    _ENTRY_POINTS_DONE = True  # a broken one is reported again at the next call


def module_name(path: Path) -> str:
    """The module name a plug-in file is imported as: ``fedskew_plugin_<stem>_<8 hex digits of its path>``,
    the same in every process (pickled objects of the plug-in find their classes in worker processes)."""
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path).encode("utf-8")).hexdigest()[:8]
    return f"fedskew_plugin_{stem}_{digest}"


def _import_file(spec: str, path: Path) -> str:
    if path.is_dir():
        raise ConfigError(f"plugin {spec!r} is a folder ({path}); give a .py file, or the folder's package as a "
                          "module name")
    if not path.is_file():
        raise ConfigError(f"plugin {spec!r} not found: no such file" + ("" if spec == str(path) else f" {path}"))
    if path.suffix != ".py":
        raise ConfigError(f"plugin {spec!r} is not a .py file ({path})")
    name = module_name(path)
    found = importlib.util.spec_from_file_location(name, path)
    assert found is not None and found.loader is not None  # a .py file always has a source loader
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module  # before it runs: dataclasses and pickle look their module up there
    try:
        found.loader.exec_module(module)
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: a plug-in never ends fedskew
        sys.modules.pop(name, None)
        raise ConfigError(f"plugin {spec!r} failed: {_reason(e, str(path))}") from None
    return name


def _import_module(spec: str) -> str:
    if not _MODULE_NAME.fullmatch(spec):
        raise ConfigError(
            f"plugin {spec!r} is neither a .py file nor a module name; give a path ending in .py or a dotted "
            "module name such as my_package.my_module"
        )
    _current_folder_on_path(spec.split(".")[0])
    origin = None
    try:
        origin = _origin(spec)
        importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name is not None and (spec == e.name or spec.startswith(e.name + ".")):
            raise ConfigError(
                f"plugin {spec!r} not found: no module named {e.name!r} among the installed packages, "
                "PYTHONPATH and the current folder"
            ) from None
        raise ConfigError(f"plugin {spec!r} failed: {_reason(e, origin)}") from None
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: a plug-in never ends fedskew
        raise ConfigError(f"plugin {spec!r} failed: {_reason(e, origin)}") from None
    return spec


def _origin(spec: str) -> str | None:
    """The file of module ``spec`` (imports its parent packages), or None."""
    found = importlib.util.find_spec(spec)
    return found.origin if found is not None else None


def _current_folder_on_path(top: str) -> None:
    """Append the current folder to ``sys.path`` when it holds module ``top`` and nothing on the path does
    (the ``fedskew`` command, unlike ``python -m``, does not put it there)."""
    here = Path.cwd()
    if str(here) in sys.path or importlib.util.find_spec(top) is not None:
        return
    if (here / f"{top}.py").is_file() or (here / top / "__init__.py").is_file():
        sys.path.append(str(here))


def _reason(e: BaseException, origin: str | None = None) -> str:
    """``Type: message (at FILE, line N)``: where the plug-in raised it.

    The place is the innermost frame in the plug-in's own file ``origin``, else the innermost outside
    fedskew and importlib (a module the plug-in imports), else the innermost there is.
    """
    text = " ".join(f"{type(e).__name__}: {e}".split())
    if isinstance(e, SyntaxError):
        return text  # its message names the file and line
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<frozen")]
    ours = str(Path(__file__).resolve().parent)
    preferred = [f for f in frames if origin is not None and f.filename == origin] or [
        f for f in frames if not f.filename.startswith(ours)
    ] or frames
    if preferred:
        text += f" (at {preferred[-1].filename}, line {preferred[-1].lineno})"
    return text
