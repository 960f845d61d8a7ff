"""The numbers docs/architecture.md gives about the code's structure, printed from the code as it is.

    python benchmarks/structure.py

Files and lines under src/fedskew, the largest files, the length of the RoundLoop class, and the reads of
the config's dict form (``cfg.get(`` / ``cfg[``) outside the config package and the wire/file layer
(``engine/flower/``, the CLI). Import loops and upward imports: ``farm-studio look``; duplicated code:
``duplicates``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "fedskew"
WIRE = ("config/", "engine/flower/", "cli/")
DICT_READ = re.compile(r"\bcfg(\.get\(|\[)")


def main() -> None:
    files = sorted(SRC.rglob("*.py"))
    lines = {f.relative_to(SRC).as_posix(): len(f.read_text().splitlines()) for f in files}
    print(f"python files in src/fedskew: {len(files)}, lines: {sum(lines.values())}")
    for name, n in sorted(lines.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {n:4d}  {name}")
    tree = ast.parse((SRC / "engine" / "round_loop.py").read_text())
    loop = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RoundLoop")
    print(f"RoundLoop: {loop.end_lineno - loop.lineno + 1} lines")
    reads = [
        f"{name}:{i}" for name in lines if not name.startswith(WIRE)
        for i, line in enumerate((SRC / name).read_text().splitlines(), 1) if DICT_READ.search(line)
    ]
    print(f"cfg.get( / cfg[ outside {', '.join(WIRE)}: {len(reads)}")
    for where in reads:
        print(f"  {where}")


if __name__ == "__main__":
    main()
