"""The examples of ``docs/python-api.md``, ``docs/extending.md`` and ``docs/architecture.md`` run as written.

Each page's fenced blocks are taken in order: a block whose first line is ``# file: NAME`` is written to
``NAME`` (a plug-in, a config), and the ``python`` blocks are joined into one script, run with this
interpreter in an empty folder, as a reader who copies them would run them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import environment

DOCS = Path(__file__).resolve().parents[1] / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE = re.compile(r"# file: (\S+)")


def run_page(page: str, folder: Path) -> str:
    """Write the page's file blocks into ``folder``, run its Python blocks there; return what they printed."""
    script = []
    for language, code in FENCE.findall((DOCS / page).read_text()):
        named = FILE.fullmatch(code.splitlines()[0]) if code.strip() else None
        if named:
            (folder / named[1]).write_text(code)
        elif language == "python":
            script.append(code)
    assert script, f"{page} has no python blocks"
    (folder / "page.py").write_text("\n".join(script))
    env = environment(FEDSKEW_CACHE=str(folder / "cache"))
    res = subprocess.run([sys.executable, "page.py"], cwd=folder, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, f"{page}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.mark.parametrize("page", ["python-api.md", "extending.md", "architecture.md"])
@pytest.mark.slow
def test_the_examples_run(page: str, tmp_path: Path) -> None:
    run_page(page, tmp_path)
