"""The package's import graph, read from the source (none of its modules is imported for it): used by the
tests."""

from __future__ import annotations

import ast
from pathlib import Path

from xpufleet.server.run.graph import strongly_connected

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "xpufleet"
SUBPACKAGES = ("common", "nodes", "server", "predictor")


def modules() -> dict[str, Path]:
    """Every module of the installed package, by its dotted name."""
    out = {PACKAGE: REPO / "__init__.py", f"{PACKAGE}.constants": REPO / "constants.py"}
    for sub in SUBPACKAGES:
        for path in sorted((REPO / sub).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([PACKAGE, *parts])] = path
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level:
        base = base[: len(base) - (level - 1)] if level > 1 else base
        return ".".join([*base, *([target] if target else [])])
    return target or ""


def _import_nodes(tree: ast.Module, top_level_only: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run: at module level (``top_level_only``) or anywhere, never those
    under ``if TYPE_CHECKING:`` (type hints only)."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif top_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if top_level_only and isinstance(node, ast.ClassDef):
            todo.extend(n for n in node.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def imports(top_level_only: bool) -> dict[str, set[str]]:
    """module -> the package's modules it imports (``top_level_only``: at import time, not inside
    functions); ``from pkg import name`` counts as importing ``pkg.name`` when that is a module."""
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for node in _import_nodes(tree, top_level_only):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = _resolve(name, is_package, node.level, node.module)
                subs = [f"{base}.{a.name}" for a in node.names]
                # `from . import x` of submodules depends on them, not on the package's own code
                targets = subs if all(s in mods for s in subs) else [base, *subs]
            for t in targets:
                if t in mods and t != name:
                    graph[name].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, each sorted: the graph rule's own
    iterative Tarjan (server/run/graph.py), fed the modules in name order."""
    components = strongly_connected({name: sorted(graph[name]) for name in sorted(graph)})
    return sorted(sorted(comp) for comp in components if len(comp) > 1)
