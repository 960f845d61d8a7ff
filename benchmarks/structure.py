"""The structure docs/architecture.md describes, measured from the code as it is (standard library only).

    python benchmarks/structure.py            # the report
    python benchmarks/structure.py --json     # the same figures as JSON
    python benchmarks/structure.py --check    # exit 1 on an import loop, an unlisted upward import, or a layer
                                              # table in docs/architecture.md that differs from FLOORS below

What it measures, and how:

- Import loops among fedskew's modules. An edge is a module-level import (``import fedskew.x``, ``from fedskew.x
  import y``: to ``fedskew.x.y`` when that is a module, else to ``fedskew.x``; relative imports resolved), at any
  depth of the module's top-level code (under ``if``/``try``, in class bodies), except the body of ``if
  TYPE_CHECKING:``. Importing a submodule runs its parent packages first; those implicit edges are not added (no
  import tool adds them, and every package would loop with its own modules). Imports inside functions run when
  the function is called, not when the module loads: loops that close only through them are listed apart,
  as information, and ``--check`` ignores them.
- Upward imports: an import (module-level or inside a function; not under ``if TYPE_CHECKING:``) from a module on
  one floor of FLOORS to a module on a higher floor. EXCEPTIONS lists the ones made on purpose; they are printed
  as such and not counted. The table in docs/architecture.md ("Layers: what may import what", its first two
  columns) is parsed and compared with FLOORS.
- Reads of the config's dict form outside ``config/``, ``engine/flower/`` and ``cli/`` (the file and wire
  boundary) and ALLOWED_READERS: a subscript (``X[...]``, not an assignment target) or a ``X.get(``,
  ``X.setdefault(`` or ``X.pop(`` call whose ``X`` is a config dict; a chain (``cfg["dataset"]["name"]``) counts
  once, at its innermost read; a line counts once. ``X`` is a config dict when it is (``_is_config``):
  a name ``cfg`` (the project's name for the dict form; the typed form is ``config``); an attribute ``.cfg`` or
  ``.source`` (``RunConfig.source``); an attribute ``.config`` (``RunSpec.config``, a finished run's
  ``run.config``) unless its owner is a Message (a Message's ``config`` holds a request's instructions, not the
  config file: owners named ``msg``, ``message``, ``reply``, ``request``, ``m``, or annotated ``Message``); a call
  of ``.table(section)`` (``RunConfig.table``) or of a function that returns the dict form (CONFIG_FUNCTIONS);
  ``dict(X)``, ``copy.deepcopy(X)``, ``X or {}``, ``{**X}``, ``X[...]``, ``X.get(...)`` of a config dict (a table
  of it); a name assigned one of these in the same function; and a parameter that some call in src/fedskew
  passes one of these (the callee found by its name: in the module, through its imports, else the one function
  or method of that name), or that PASSED_CONFIG names. So a read is found under any name, one call away or
  more; what it cannot follow (a dict decoded from JSON, a dataclass field) it misses.
- The largest files of src/fedskew (top 10 by lines) and the files of src/fedskew and tests over MAX_LINES lines;
  the length of the RoundLoop class.
- Duplicated blocks in src and tests: each file's tokens (comments, blank lines and import statements left
  out; names and literals kept as written), grouped by the line they start on; MIN_DUP_LINES or more
  consecutive lines alike in two places make a duplicated block, printed as a pair (file:lines vs
  file:lines), each maximal match once.

It always exits 0 (it is a measurement) unless ``--check`` is given.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "fedskew"

FLOORS: dict[int, tuple[str, ...]] = {
    1: ("core", "progress", "metrics"),
    2: ("models", "data", "runs", "plugins", "privacy"),
    3: ("condense", "components"),
    4: ("algorithms",),
    5: ("config",),
    6: ("engine",),
    7: ("audit", "attack"),
    8: ("report", "api"),
    9: ("cli",),
}
"""docs/architecture.md's layers: a package or module of src/fedskew on each floor may import its own floor and
the floors below. ``fedskew/__init__.py`` (the lazy public names) and ``configs/`` (TOML files) have no floor."""

EXCEPTIONS: dict[tuple[str, str], str] = {
    ("engine/flower/server_app.py", "report"): "the Flower ServerApp writes the run's report when a deployment ends",
}
"""Upward imports made on purpose: (importing file under src/fedskew, imported package) -> why."""

WIRE = ("config/", "engine/flower/", "cli/")
"""Where the config's dict form may be read: the config package and the file/wire boundary."""
MESSAGE_OWNERS = {"msg", "message", "reply", "request", "m"}
"""Names whose ``.config`` is a Message's (the request's instructions), not the config file."""
CONFIG_FUNCTIONS = {"read_config", "read_toml", "full_config", "comparable_config", "flat_config", "flat_keys"}
"""Functions that return the config's dict form (or a flat dict of its keys)."""
READ_METHODS = {"get", "setdefault", "pop"}
PASSED_CONFIG: dict[str, tuple[str, ...]] = {}
"""Parameters passed a config table by code the rule cannot follow (none today: the Flower ClientApp, which
decodes the run's tables from a request's JSON, types them itself with ``config.schema.component``)."""
ALLOWED_READERS: dict[str, str] = {
    "core/params.py": "build_params turns a table into its typed, checked Params: the config's own parser",
    "runs/reading.py": "RunData reads a finished run's config.toml (the file boundary); the report asks it, through "
               "recorded() and recorded_table(), for what a run recorded",
}
"""Files outside WIRE whose reads of a config table are the point (not counted)."""

MAX_LINES = 450
MIN_DUP_LINES = 6
LAYERS_HEADING = "## Layers: what may import what"


@dataclass
class Module:
    name: str  # fedskew.engine.session
    rel: str  # engine/session.py (under src/fedskew)
    tree: ast.Module
    text: list[str]  # its lines


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    deferred: bool  # inside a function: runs when the function is called


# ---------------------------------------------------------------------------------------------------- modules


def load_modules(package_dir: Path) -> dict[str, Module]:
    """Every module under ``package_dir`` (src/fedskew), by dotted name."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir)
        parts = [PACKAGE, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        text = path.read_text(encoding="utf-8")
        out[".".join(parts)] = Module(".".join(parts), rel.as_posix(), ast.parse(text), text.splitlines())
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _package_of(module: Module) -> str:
    return module.name if module.rel.endswith("__init__.py") else module.name.rpartition(".")[0]


def _from_base(module: Module, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative imports resolved (one level up per dot after the first)."""
    if not node.level:
        return node.module or ""
    package = _package_of(module).split(".")
    package = package[: len(package) - node.level + 1]
    return ".".join([*package, node.module] if node.module else package)


def _known_prefix(name: str, known: dict[str, Module]) -> str | None:
    """The longest prefix of a dotted name that is one of the ``known`` modules."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: Module, known: dict[str, Module]) -> list[Import]:
    """The module's imports of other fedskew modules, outside ``if TYPE_CHECKING:`` bodies."""
    found: list[Import] = []

    def add(target: str | None, line: int, deferred: bool) -> None:
        if target and target != module.name:
            found.append(Import(module.name, target, line, deferred))

    def visit(node: ast.AST, deferred: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.orelse:
                visit(stmt, deferred)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    add(_known_prefix(alias.name, known), node.lineno, deferred)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(module, node)
            if base.split(".")[0] == PACKAGE:
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    add(full if full in known else _known_prefix(base, known), node.lineno, deferred)
        else:
            deferred = deferred or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            for child in ast.iter_child_nodes(node):
                visit(child, deferred)

    visit(module.tree, False)
    return list(dict.fromkeys(found))


# ---------------------------------------------------------------------------------------------------- loops


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(groups)


def shortest_cycle(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """The shortest import path from ``start`` back to itself inside ``within`` (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w not in within:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return []


def import_graph(imports: list[Import], deferred: bool = False) -> dict[str, set[str]]:
    """Module -> the modules it imports when it loads (``deferred``: and inside its functions)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        if deferred or not imp.deferred:
            graph[imp.source].add(imp.target)
    return graph


def import_loops(imports: list[Import], deferred: bool = False) -> list[list[str]]:
    """The import loops, each as a shortest cycle ``[a, b, ..., a]``: one per module of each strongly
    connected group, without repeats. ``deferred``: with the imports inside functions too."""
    graph = import_graph(imports, deferred)
    cycles: dict[tuple[str, ...], list[str]] = {}
    for group in strongly_connected(graph):
        for start in group:
            cycle = shortest_cycle(graph, start, set(group))
            ring = cycle[:-1]
            turn = ring.index(min(ring))
            key = tuple(ring[turn:] + ring[:turn])
            cycles.setdefault(key, [*key, key[0]])
    return sorted(cycles.values())


# ---------------------------------------------------------------------------------------------------- layers


def floor_of(module: str, floors: dict[int, tuple[str, ...]] = FLOORS) -> int | None:
    """The floor of a module (``fedskew.engine.session`` -> 6), None for one the table does not place."""
    top = module.split(".")[1] if "." in module else None
    return next((floor for floor, names in floors.items() if top in names), None)


def upward_imports(
    imports: list[Import], modules: dict[str, Module], floors: dict[int, tuple[str, ...]] = FLOORS,
    exceptions: dict[tuple[str, str], str] = EXCEPTIONS,
) -> tuple[list[dict], list[dict]]:
    """(unlisted, listed) imports from a floor to a higher one, each as {file, line, target, ..., deferred}."""
    unlisted, listed = [], []
    for imp in imports:
        low, high = floor_of(imp.source, floors), floor_of(imp.target, floors)
        if low is None or high is None or high <= low:
            continue
        rel = modules[imp.source].rel
        package = imp.target.split(".")[1]
        item = {"file": rel, "line": imp.line, "target": imp.target, "from_floor": low, "to_floor": high,
                "deferred": imp.deferred}
        if (rel, package) in exceptions:
            listed.append({**item, "why": exceptions[rel, package]})
        else:
            unlisted.append(item)
    return unlisted, listed


def unplaced(modules: dict[str, Module], floors: dict[int, tuple[str, ...]] = FLOORS) -> list[str]:
    """The top-level packages and modules of src/fedskew that no floor names."""
    tops = {m.rel.split("/")[0].removesuffix(".py") for m in modules.values()} - {"__init__"}
    return sorted(t for t in tops if floor_of(f"{PACKAGE}.{t}", floors) is None)


def doc_floors(doc: Path) -> dict[int, tuple[str, ...]]:
    """The first two columns of the layer table of docs/architecture.md: floor -> packages, in the page's order."""
    text = doc.read_text(encoding="utf-8")
    section = text.split(LAYERS_HEADING, 1)[1].split("\n## ", 1)[0] if LAYERS_HEADING in text else ""
    out: dict[int, tuple[str, ...]] = {}
    for row in re.finditer(r"^\|\s*(\d+)\s*\|\s*`([^`]+)`", section, re.MULTILINE):
        name = row[2].removesuffix("/").removesuffix(".py")
        out[int(row[1])] = (*out.get(int(row[1]), ()), name)
    return out


def table_differences(doc: Path, floors: dict[int, tuple[str, ...]] = FLOORS) -> list[str]:
    """How the page's layer table differs from ``floors`` (nothing when they agree)."""
    if not doc.is_file():
        return [f"{doc} not found"]
    page = doc_floors(doc)
    if not page:
        return [f"{doc.name}: no layer table under {LAYERS_HEADING!r}"]
    placed = {name: floor for floor, names in page.items() for name in names}
    coded = {name: floor for floor, names in floors.items() for name in names}
    out = []
    for name in sorted(placed.keys() | coded.keys()):
        if placed.get(name) != coded.get(name):
            out.append(f"{name}: floor {placed.get(name)} in {doc.name}, {coded.get(name)} in FLOORS")
    return out


# ---------------------------------------------------------------------------------------------------- config reads


def _is_message(owner: ast.expr, messages: set[str]) -> bool:
    return isinstance(owner, ast.Name) and owner.id in messages


def _is_config(node: ast.expr, names: set[str], messages: set[str]) -> bool:
    """Whether ``node`` holds the config's dict form (the rule in the module's docstring)."""
    match node:
        case ast.Name(id=name):
            return name in names
        case ast.Attribute(attr="cfg" | "source"):
            return True
        case ast.Attribute(value=owner, attr="config"):
            return not _is_message(owner, messages)
        case ast.Call(func=ast.Attribute(attr="table"), args=[_]):
            return True
        case ast.Call(func=ast.Name(id=name) | ast.Attribute(attr=name), args=args):
            if name in CONFIG_FUNCTIONS:
                return True
            if name in ("dict", "deepcopy", "copy") and args:
                return _is_config(args[0], names, messages)
            if isinstance(node.func, ast.Attribute) and name in READ_METHODS:
                return _is_config(node.func.value, names, messages)
            return False
        case ast.Subscript(value=value):
            return _is_config(value, names, messages)
        case ast.BoolOp(values=values):
            return any(_is_config(v, names, messages) for v in values)
        case ast.IfExp(body=body, orelse=orelse):
            return _is_config(body, names, messages) or _is_config(orelse, names, messages)
        case ast.Dict(keys=keys, values=values):
            return any(k is None and _is_config(v, names, messages) for k, v in zip(keys, values, strict=True))
    return False


def _scopes(tree: ast.Module) -> list[ast.AST]:
    """The module itself (its code outside functions) and each outermost function (nested ones share its names)."""
    return [tree, *(n for n in _walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]


def _walk(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a scope: a function's whole body; for the module, everything outside its functions."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not (isinstance(scope, ast.Module) and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)):
            todo += ast.iter_child_nodes(node)


def _names_in(scope: ast.AST, params: set[str]) -> tuple[set[str], set[str]]:
    """(names that hold a config dict, names that hold a Message) in a scope: ``cfg``, ``params`` (the scope's
    parameters that are passed a config dict somewhere) and the names assigned one, followed to a fixpoint."""
    messages = set(MESSAGE_OWNERS)
    assigned: list[tuple[str, ast.expr]] = []
    for node in _walk(scope):
        if isinstance(node, ast.arg) and node.annotation is not None and "Message" in ast.unparse(node.annotation):
            messages.add(node.arg)
        elif isinstance(node, ast.Assign):
            assigned += [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr) and isinstance(node.target, ast.Name) and node.value:
            assigned.append((node.target.id, node.value))
    names = {"cfg", *params}
    while True:
        more = {name for name, value in assigned if name not in names and _is_config(value, names, messages)}
        if not more:
            return names, messages
        names |= more


Function = ast.FunctionDef | ast.AsyncFunctionDef
Callee = tuple[Function, int]
"""A function, and how many of its leading parameters a call does not pass (1 for ``self`` or ``cls``)."""


def _skip(function: Function) -> int:
    first = function.args.posonlyargs + function.args.args
    return int(bool(first) and first[0].arg in ("self", "cls"))


def _callee_finder(modules: dict[str, Module]) -> Callable[[str, ast.Call], Callee | None]:
    """``find(module, call)``: the function of src/fedskew that ``call`` (in ``module``) calls, or None. A plain
    name is looked up in the module, then through its ``from ... import`` (and the packages' re-exports); a
    class's name calls its ``__init__``; failing that, and for ``x.name(...)``, the one function or method of
    src/fedskew with that name (None when there are several)."""
    own: dict[str, dict[str, Callee]] = defaultdict(dict)
    imported: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    by_name: dict[str, list[Callee]] = defaultdict(list)
    for module in modules.values():
        methods: set[int] = set()
        for node in ast.walk(module.tree):  # a class comes before its methods
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    imported[module.name][alias.asname or alias.name] = (_from_base(module, node), alias.name)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, Function):
                        methods.add(id(item))
                        if item.name == "__init__":
                            by_name[node.name].append((item, _skip(item)))
                            if node in module.tree.body:
                                own[module.name][node.name] = (item, _skip(item))
                        elif not item.name.startswith("__"):
                            by_name[item.name].append((item, _skip(item)))
            elif isinstance(node, Function) and id(node) not in methods:
                by_name[node.name].append((node, 0))
                if node in module.tree.body:
                    own[module.name][node.name] = (node, 0)

    def find(module: str, call: ast.Call) -> Callee | None:
        if isinstance(call.func, ast.Name):
            name, seen = call.func.id, set()
            while (module, name) not in seen:
                seen.add((module, name))
                if name in own[module]:
                    return own[module][name]
                if name not in imported[module]:
                    break
                module, name = imported[module][name]
        name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
        found = by_name.get(name, [])
        return found[0] if len(found) == 1 else None

    return find


def _config_params(modules: dict[str, Module]) -> dict[int, set[str]]:
    """The parameters passed a config dict by some call in src/fedskew (wherever the call is), by ``id`` of
    their function, followed to a fixpoint."""
    find = _callee_finder(modules)
    scopes = [(module.name, scope) for module in modules.values() for scope in _scopes(module.tree)]
    params: dict[int, set[str]] = defaultdict(set)
    for function, names in PASSED_CONFIG.items():
        module, _, name = function.rpartition(".")
        if module in modules and name in (found := {n.name: n for n in ast.walk(modules[module].tree)
                                                    if isinstance(n, Function)}):
            params[id(found[name])].update(names)
    changed = True
    while changed:
        changed = False
        for module, scope in scopes:
            names, messages = _names_in(scope, _params_of(scope, params))
            for call in _walk(scope):
                callee = find(module, call) if isinstance(call, ast.Call) else None
                if callee is None:
                    continue
                function, skip = callee
                every = function.args.posonlyargs + function.args.args
                positional = [a.arg for a in every][skip:]
                keywords = {a.arg for a in every + function.args.kwonlyargs}
                passed = [(positional[i] if i < len(positional) else None, arg) for i, arg in enumerate(call.args)
                          if not any(isinstance(a, ast.Starred) for a in call.args[: i + 1])]
                passed += [(kw.arg if kw.arg in keywords else None, kw.value) for kw in call.keywords]
                for param, arg in passed:
                    if param and param not in params[id(function)] and _is_config(arg, names, messages):
                        params[id(function)].add(param)
                        changed = True
    return params


def _params_of(scope: ast.AST, params: dict[int, set[str]]) -> set[str]:
    """The config-dict parameters of a scope's function and of the functions nested in it."""
    return {p for node in [scope, *_walk(scope)] if isinstance(node, Function) for p in params.get(id(node), ())}


def config_reads(modules: dict[str, Module], allowed: tuple[str, ...] = WIRE) -> list[dict]:
    """Reads of the config's dict form outside ``allowed``: {file, line, code}, in file and line order."""
    params = _config_params(modules)
    out = []
    for module in modules.values():
        if module.rel.startswith(allowed) or module.rel in ALLOWED_READERS:
            continue
        found: set[int] = set()
        for scope in _scopes(module.tree):
            names, messages = _names_in(scope, _params_of(scope, params))
            for node in _walk(scope):
                receiver = None
                if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                    receiver = node.value
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr in READ_METHODS):
                    receiver = node.func.value
                if receiver is None or not _is_config(receiver, names, messages) or _is_read(receiver):
                    continue
                found.add(node.lineno)
        out += [{"file": module.rel, "line": n, "code": module.text[n - 1].strip()} for n in sorted(found)]
    return sorted(out, key=lambda r: (r["file"], r["line"]))


def _is_read(node: ast.expr) -> bool:
    """Whether ``node`` is itself a read (so that a chain counts once, at its innermost read)."""
    return isinstance(node, ast.Subscript) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READ_METHODS)


# ---------------------------------------------------------------------------------------------------- duplicates

SKIPPED_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                  tokenize.ENCODING, tokenize.ENDMARKER}


def code_lines(text: str) -> list[tuple[int, int, tuple[str, ...]]]:
    """(first line, last line, tokens) of each line that holds code, import statements left out; a token
    spanning lines (a long string) belongs to the line it starts on."""
    out: list[tuple[int, int, tuple[str, ...]]] = []
    statement: list[tokenize.TokenInfo] = []

    def flush() -> None:
        if statement and statement[0].string not in ("import", "from"):
            by_line: dict[int, list[tokenize.TokenInfo]] = defaultdict(list)
            for tok in statement:
                by_line[tok.start[0]].append(tok)
            out.extend((n, max(t.end[0] for t in toks), tuple(t.string for t in toks))
                       for n, toks in sorted(by_line.items()))
        statement.clear()

    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            flush()
        elif tok.type not in SKIPPED_TOKENS:
            statement.append(tok)
    flush()
    return out


def duplicated_blocks(files: dict[str, str], min_lines: int = MIN_DUP_LINES) -> list[dict]:
    """Pairs of blocks of ``min_lines`` or more lines of code alike token for token, each maximal match once:
    {a, a_lines, b, b_lines, lines}. ``files``: name -> text."""
    names = sorted(files)
    lines = {name: code_lines(files[name]) for name in names}
    tokens = {name: [entry[2] for entry in lines[name]] for name in names}
    windows: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    for name in names:
        seq = tokens[name]
        for i in range(len(seq) - min_lines + 1):
            windows[tuple(seq[i:i + min_lines])].append((name, i))
    pairs = []
    for places in windows.values():
        for x, (a, i) in enumerate(places):
            for b, j in places[x + 1:]:
                if a == b and j - i < min_lines:
                    continue  # a run of repeated lines overlapping itself
                ta, tb = tokens[a], tokens[b]
                if i and j and ta[i - 1] == tb[j - 1]:
                    continue  # inside a longer match, found from its start
                k = min_lines
                while i + k < len(ta) and j + k < len(tb) and ta[i + k] == tb[j + k] and not (a == b and i + k >= j):
                    k += 1
                pairs.append({"a": a, "a_lines": [lines[a][i][0], lines[a][i + k - 1][1]],
                              "b": b, "b_lines": [lines[b][j][0], lines[b][j + k - 1][1]], "lines": k})
    return sorted(pairs, key=lambda p: (-p["lines"], p["a"], p["a_lines"], p["b"], p["b_lines"]))


# ---------------------------------------------------------------------------------------------------- all of it


def round_loop_lines(modules: dict[str, Module]) -> int | None:
    module = modules.get(f"{PACKAGE}.engine.round_loop")
    loop = module and next((n for n in module.tree.body if isinstance(n, ast.ClassDef) and n.name == "RoundLoop"), None)
    return loop.end_lineno - loop.lineno + 1 if loop else None


def measure(root: Path = ROOT) -> dict:
    """Every figure, as a JSON-ready dict, for the tree at ``root`` (src/fedskew, tests, docs/architecture.md)."""
    modules = load_modules(root / "src" / PACKAGE)
    imports = [imp for m in modules.values() for imp in imports_of(m, modules)]
    loops = import_loops(imports)
    at_load = import_graph(imports)
    later = [c for c in import_loops(imports, deferred=True) if any(b not in at_load[a] for a, b in pairwise(c))]
    unlisted, listed = upward_imports(imports, modules)
    sizes = sorted(((len(m.text), m.rel) for m in modules.values()), key=lambda s: (-s[0], s[1]))
    tests = {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
             for p in sorted((root / "tests").rglob("*.py"))}
    texts = {f"src/{PACKAGE}/{m.rel}": "\n".join(m.text) + "\n" for m in modules.values()} | tests
    reads = config_reads(modules)
    dups = duplicated_blocks(texts)
    return {
        "src_files": len(modules), "src_lines": sum(s[0] for s in sizes),
        "tests_files": len(tests), "tests_lines": sum(len(t.splitlines()) for t in tests.values()),
        "largest": [{"file": rel, "lines": n} for n, rel in sizes[:10]],
        "over_max_lines": [{"file": rel, "lines": n} for n, rel in sizes if n > MAX_LINES],
        "tests_over_max_lines": sorted(({"file": f, "lines": len(t.splitlines())} for f, t in tests.items()
                                        if len(t.splitlines()) > MAX_LINES), key=lambda s: -s["lines"]),
        "max_lines": MAX_LINES,
        "round_loop_lines": round_loop_lines(modules),
        "imports": len(imports), "imports_in_functions": sum(imp.deferred for imp in imports),
        "import_loops": loops, "import_loop_count": len(loops),
        "loops_through_function_imports": later,
        "upward_imports": unlisted, "upward_import_count": len(unlisted),
        "listed_exceptions": listed,
        "unplaced": unplaced(modules),
        "layer_table_differences": table_differences(root / "docs" / "architecture.md"),
        "config_reads": reads, "config_read_count": len(reads),
        "duplicates": dups, "duplicate_count": len(dups), "duplicate_min_lines": MIN_DUP_LINES,
    }


def failures(figures: dict) -> list[str]:
    """What ``--check`` fails on: import loops, unlisted upward imports, a layer table unlike FLOORS."""
    return [*(f"import loop: {' -> '.join(c)}" for c in figures["import_loops"]),
            *(f"upward import: {u['file']}:{u['line']} -> {u['target']}" for u in figures["upward_imports"]),
            *(f"layer table: {d}" for d in figures["layer_table_differences"])]


def report(f: dict) -> str:
    out = [f"src/{PACKAGE}: {f['src_files']} files, {f['src_lines']} lines; tests: {f['tests_files']} files, "
           f"{f['tests_lines']} lines",
           "largest files of src/fedskew:", *(f"  {s['lines']:5d}  {s['file']}" for s in f["largest"]),
           f"files over {f['max_lines']} lines: src/{PACKAGE} {len(f['over_max_lines'])}, tests "
           f"{len(f['tests_over_max_lines'])}",
           *(f"  {s['lines']:5d}  src/{PACKAGE}/{s['file']}" for s in f["over_max_lines"]),
           *(f"  {s['lines']:5d}  {s['file']}" for s in f["tests_over_max_lines"]),
           f"RoundLoop class: {f['round_loop_lines']} lines",
           "",
           f"imports between fedskew's modules: {f['imports']} ({f['imports_in_functions']} inside functions)",
           f"import loops (module-level imports): {f['import_loop_count']}",
           *(f"  {' -> '.join(c)}" for c in f["import_loops"]),
           f"loops closed only through imports inside functions (not load-time loops; not checked): "
           f"{len(f['loops_through_function_imports'])}",
           *(f"  {' -> '.join(c)}" for c in f["loops_through_function_imports"]),
           f"upward imports between layers: {f['upward_import_count']}",
           *(f"  {u['file']}:{u['line']}  floor {u['from_floor']} -> {u['target']} (floor {u['to_floor']})"
             f"{'  [inside a function]' if u['deferred'] else ''}" for u in f["upward_imports"]),
           f"listed exceptions (on purpose, not counted): {len(f['listed_exceptions'])}",
           *(f"  {u['file']}:{u['line']}  -> {u['target']}: {u['why']}" for u in f["listed_exceptions"]),
           f"not on any floor: {', '.join(f['unplaced']) or 'none'}",
           "docs/architecture.md's layer table: " + ("matches FLOORS" if not f["layer_table_differences"] else
                                                      "differs from FLOORS"),
           *(f"  {d}" for d in f["layer_table_differences"]),
           "",
           f"lines reading the config's dict form outside {', '.join(WIRE)}: {f['config_read_count']}",
           *(f"  {r['file']}:{r['line']}  {r['code']}" for r in f["config_reads"]),
           *(f"  not counted: {name}: {why}" for name, why in ALLOWED_READERS.items()),
           "",
           f"duplicated blocks ({f['duplicate_min_lines']}+ lines of code alike, src and tests): "
           f"{f['duplicate_count']}",
           *(f"  {d['lines']:3d} lines  {d['a']}:{d['a_lines'][0]}-{d['a_lines'][1]}  vs  "
             f"{d['b']}:{d['b_lines'][0]}-{d['b_lines'][1]}" for d in f["duplicates"])]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 on an import loop, an unlisted upward import or a layer table unlike FLOORS")
    parser.add_argument("--root", type=Path, default=ROOT, help="the tree to measure (default: this checkout)")
    args = parser.parse_args(argv)
    figures = measure(args.root)
    print(json.dumps(figures, indent=1) if args.json else report(figures))
    failed = failures(figures)
    if args.check and failed:
        print(f"--check: {len(failed)} failure(s)", file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
