"""The scheduling core's shape: its modules, its largest functions and its import graph.

Reads the source of gpud/core (no import), of this checkout or of another
one, and prints:
- the module map: each module's lines and the first line of its docstring;
- the largest functions: lines and cyclomatic complexity (1 + branches);
- the import graph inside the core (TYPE_CHECKING imports included) and its
  cycles, if any.

    python bench/core_map.py [CHECKOUT] [--top 10] [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent.parent
CORE_FOLDER = HERE / "gpud" / "core"
BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.ExceptHandler, ast.With, ast.IfExp,
            ast.comprehension, ast.Assert, ast.match_case)


def complexity(node: ast.AST) -> int:
    """McCabe's number, counted as 1 + each branch point (and each extra operand of and/or)."""
    count = 1
    for child in ast.walk(node):
        if isinstance(child, BRANCHES):
            count += 1
        elif isinstance(child, ast.BoolOp):
            count += len(child.values) - 1
    return count


def functions(tree: ast.Module, module: str) -> list[dict]:
    """Every function and method of the module, with its qualified name, lines and complexity."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append({"function": f"{module}.{name}", "lines": child.end_lineno - child.lineno + 1,
                              "complexity": complexity(child)})
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
    visit(tree, "")
    return found


def core_imports(source: str, modules: set[str]) -> set[str]:
    """The core modules one module's source imports, wherever the import stands (functions and
    ``if TYPE_CHECKING:`` blocks included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gpud.core":
                found.update(alias.name for alias in node.names if alias.name in modules)
            elif node.module.startswith("gpud.core."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import x / from .x import y
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[2] for alias in node.names if alias.name.startswith("gpud.core."))
    return found & modules


def import_graph(folder: pathlib.Path = CORE_FOLDER) -> dict[str, set[str]]:
    """Each module of the core (``__init__`` aside: it only re-exports) with the core modules it imports."""
    files = {path.stem: path for path in folder.glob("*.py") if path.stem != "__init__"}
    names = set(files)
    return {name: core_imports(path.read_text(), names) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in sorted(graph.get(name, ())):
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def core_map(root: pathlib.Path) -> dict:
    """The module map, every function and the import graph of ``root``'s gpud/core."""
    paths = sorted(p for p in (root / "gpud" / "core").glob("*.py") if p.name != "__init__.py")
    trees = {p.stem: ast.parse(p.read_text(), str(p)) for p in paths}
    graph = import_graph(root / "gpud" / "core")
    return {
        "modules": [{"module": name, "lines": len((root / "gpud" / "core" / f"{name}.py").read_text().splitlines()),
                     "about": (ast.get_docstring(tree) or "").splitlines()[0] if ast.get_docstring(tree) else ""}
                    for name, tree in trees.items()],
        "functions": [f for name, tree in trees.items() for f in functions(tree, name)],
        "imports": {name: sorted(edges) for name, edges in graph.items()},
        "cycles": cycles(graph),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", nargs="?", default=str(HERE), help="the checkout to read (default: this one)")
    parser.add_argument("--top", type=int, default=10, help="how many of the largest functions to list")
    parser.add_argument("--json", action="store_true", help="print the whole map as JSON")
    args = parser.parse_args()
    found = core_map(pathlib.Path(args.checkout))
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    total = sum(m["lines"] for m in found["modules"])
    print(f"gpud/core: {len(found['modules'])} modules, {total} lines")
    for m in sorted(found["modules"], key=lambda m: -m["lines"]):
        print(f"  {m['module']:<16} {m['lines']:>5}  {m['about'][:90]}")
    print(f"\nthe {args.top} largest functions (lines, complexity)")
    for f in sorted(found["functions"], key=lambda f: (-f["lines"], f["function"]))[:args.top]:
        print(f"  {f['lines']:>4} {f['complexity']:>4}  {f['function']}")
    worst = max(found["functions"], key=lambda f: f["complexity"])
    print(f"  most complex: {worst['function']} ({worst['complexity']})")
    print("\nimports inside the core (TYPE_CHECKING included)")
    for name, edges in sorted(found["imports"].items()):
        print(f"  {name:<16} -> {', '.join(edges) or '-'}")
    print(f"\nimport cycles: {found['cycles'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
