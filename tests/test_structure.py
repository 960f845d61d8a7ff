"""benchmarks/structure.py: each measure on a tiny tree written here, then the real tree under ``--check``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import structure

SCRIPT = Path(structure.__file__)

TABLE = """# Architecture

## Layers: what may import what

| floor | package | holds | may import |
|---|---|---|---|
| 1 | `core/` | basics | nothing of fedskew |
| 1 | `progress.py` | bars | nothing of fedskew |
| 1 | `metrics/` | measures | core |
| 2 | `models/` | models | core |
| 2 | `data/` | data | core |
| 2 | `runs.py` | run folders | core |
| 2 | `privacy/` | differential privacy | core, models |
| 2 | `plugins.py` | user code | core |
| 3 | `condense/` | condensation | core, models, progress |
| 3 | `components/` | parts | core, models, condense |
| 4 | `algorithms/` | methods | the floors below |
| 5 | `config/` | config | the floors below |
| 6 | `engine/` | engine | the floors below |
| 7 | `audit.py` | audit | the floors below |
| 7 | `attack.py` | attack | the floors below |
| 8 | `report/` | report | the floors below |
| 8 | `api.py` | API | config, engine, runs |
| 9 | `cli/` | CLI | everything |

## Next section
"""


def write_tree(root: Path, files: dict[str, str], doc: str = TABLE) -> Path:
    """``files`` (paths under src/fedskew or tests/) written under ``root``, with a docs/architecture.md."""
    for name, text in files.items():
        path = root / (name if name.startswith("tests/") else f"src/fedskew/{name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in {p.parent for p in (root / "src" / "fedskew").rglob("*.py")}:
        (package / "__init__.py").touch()
    (root / "tests").mkdir(exist_ok=True)
    (root / "docs").mkdir(exist_ok=True)
    (root / "docs" / "architecture.md").write_text(doc)
    return root


def test_a_two_module_loop_is_found_and_type_checking_imports_are_not(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {
        "core/a.py": "from fedskew.core import b\n",
        "core/b.py": "import fedskew.core.a\n",
        "core/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fedskew.core import d\n",
        "core/d.py": "from fedskew.core.c import x\n",
        "core/e.py": "def later():\n    from fedskew.core import f\n",
        "core/f.py": "from fedskew.core import e\n",
    })
    figures = structure.measure(root)
    assert figures["import_loops"] == [["fedskew.core.a", "fedskew.core.b", "fedskew.core.a"]]
    assert figures["import_loop_count"] == 1
    # e -> f only inside a function: listed apart, not a load-time loop
    assert figures["loops_through_function_imports"] == [["fedskew.core.e", "fedskew.core.f", "fedskew.core.e"]]
    assert structure.main(["--root", str(root)]) == 0  # a measurement
    assert structure.main(["--root", str(root), "--check"]) == 1


def test_an_upward_import_is_found_and_a_listed_exception_is_not_counted(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {
        "core/low.py": "X = 1\n",
        "core/up.py": "from fedskew.engine.runner import make_runner\n",
        "models/lazy.py": "def f():\n    import fedskew.algorithms.base\n",
        "engine/runner.py": "from fedskew.core.low import X\n",  # downward: fine
        "engine/flower/server_app.py": "from fedskew.report import write_report\n",
        "report/__init__.py": "def write_report(): ...\n",
        "algorithms/base.py": "",
    })
    figures = structure.measure(root)
    found = {(u["file"], u["line"], u["target"], u["deferred"]) for u in figures["upward_imports"]}
    assert found == {("core/up.py", 1, "fedskew.engine.runner", False),
                     ("models/lazy.py", 2, "fedskew.algorithms.base", True)}
    assert [(u["file"], u["target"]) for u in figures["listed_exceptions"]] == [
        ("engine/flower/server_app.py", "fedskew.report")]
    assert figures["layer_table_differences"] == []
    assert structure.main(["--root", str(root), "--check"]) == 1


def test_the_layer_table_is_compared_with_floors(tmp_path: Path) -> None:
    doc = tmp_path / "architecture.md"
    moved = TABLE.replace("| 7 | `audit.py`", "| 8 | `audit.py`")
    doc.write_text(moved.replace("| 9 | `cli/` | CLI | everything |\n", ""))
    assert structure.table_differences(doc) == [
        "audit: floor 8 in architecture.md, 7 in FLOORS", "cli: floor None in architecture.md, 9 in FLOORS"]


def test_a_dict_read_of_the_config_is_found_under_any_name(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {
        "engine/reads.py": (
            "from fedskew.core.titles import title as heading\n"
            "\n"
            "def dataset_name(config):\n"
            "    table = config.table('dataset')\n"  # RunConfig.table: a dict
            "    return table['name'], heading(config.table('partition'))\n"  # 5; and a call passing one
            "\n"
            "def learning_rate(options):\n"
            "    return options.get('lr')\n"  # 8: options is passed a config dict below
            "\n"
            "def run_lr(spec):\n"
            "    return learning_rate(dict(spec.config['algorithm']))\n"  # 11: the read of spec.config
            "\n"
            "def delta(msg, rounds):\n"
            "    return msg.config['delta'], rounds.get(3)\n"  # a Message's config; rounds is no config
            "\n"
            "def typed(config):\n"
            "    return config.run.seed\n"
        ),
        "core/titles.py": "def title(partition):\n    return partition['name']\n",  # passed a table, under an alias
        "config/own.py": "def seed(cfg):\n    return cfg['seed']\n",  # the config package may
    })
    reads = structure.measure(root)["config_reads"]
    assert [(r["file"], r["line"]) for r in reads] == [
        ("core/titles.py", 2), ("engine/reads.py", 5), ("engine/reads.py", 8), ("engine/reads.py", 11)]


BLOCK = [
    "total = 0",
    "for value in values:",
    "    if value > limit:",
    "        total += value * weight",
    "    else:",
    "        total -= value",
]


def test_a_duplicated_six_line_block_is_found_and_a_five_line_one_is_not() -> None:
    six = "\n".join(BLOCK)
    copy = "\n".join([BLOCK[0], "# a comment", "", *BLOCK[1:3], "        total  +=  value*weight", *BLOCK[4:]])
    five = "\n".join(BLOCK[:5])
    files = {
        "a.py": f"import os\nstart = 1\n{six}\nend = 2\n",
        "b.py": f"from x import y\nother = 3\n{copy}\ndone = 4\n",  # the same tokens, spaced differently
        "c.py": f"first = 5\n{five}\nlast = 6\n",  # five lines alike only
        "d.py": f"{six.replace('weight', 'factor')}\n",  # a name changed: not alike
    }
    pairs = structure.duplicated_blocks(files)
    assert [(p["a"], p["a_lines"], p["b"], p["b_lines"], p["lines"]) for p in pairs] == [
        ("a.py", [3, 8], "b.py", [3, 10], 6)]


def test_the_real_tree_has_no_import_loop_and_no_unlisted_upward_import() -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--check", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    figures = json.loads(res.stdout)
    assert figures["import_loops"] == [] and figures["upward_imports"] == []
    assert figures["layer_table_differences"] == []
    assert [(u["file"], u["target"]) for u in figures["listed_exceptions"]] == [
        ("engine/flower/server_app.py", "fedskew.report")]
    assert figures["src_files"] > 100 and figures["largest"][0]["lines"] >= figures["largest"][-1]["lines"]


def test_condense_methods_are_the_published_iterations_keys() -> None:
    """fedskew.cli.condensation checks a method against PUBLISHED_ITERATIONS' keys (no import of the CLI's
    METHODS, which would close an import loop): the two lists must be one."""
    from fedskew.cli.condensation import PUBLISHED_ITERATIONS
    from fedskew.cli.condense import METHODS

    assert tuple(PUBLISHED_ITERATIONS) == METHODS
