"""The import graph: one direction between the packages, no cycles inside them.

`precision` imports `dtypes` through its public names only (never a private
`dtypes._module`), `dtypes` never imports `precision`, and within each
package the imports form no cycle: module-level imports, and imports inside
functions too. `LAZY_EDGES` is the allow-list for an import inside a function that
closes a cycle, each with its reason; it is empty, and should stay so.
Imports under `TYPE_CHECKING` do not count (they never run).
The modules that describe formats import no JAX at module level, even
indirectly (`tests/dtypes/test_import.py` checks the same at run time).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dtypes", "precision")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _top_level_imports(module: str, path: Path) -> list[str]:
    """Absolute names imported at module level (outside functions and TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: list[str] = []

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(module, path.name == "__init__.py", node)
                found.append(target)
                found.extend(f"{target}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return found


GRAPH = {name: _top_level_imports(name, path) for name, path in _modules().items()}


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("precision")))
def test_precision_uses_only_public_dtypes(module):
    private = [n for n in GRAPH[module] if n.startswith("dtypes._")]
    lazy = [
        n
        for n in ast.walk(ast.parse(_modules()[module].read_text()))
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("dtypes._")
    ]
    assert not private, f"{module} imports private dtypes modules: {private}"
    assert not lazy, f"{module} imports private dtypes modules inside a function"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("dtypes")))
def test_dtypes_never_imports_precision(module):
    assert not [n for n in GRAPH[module] if n.split(".")[0] == "precision"]


def _all_imports(module: str, path: Path) -> list[str]:
    """Absolute names imported anywhere in the module (functions included), except
    under TYPE_CHECKING."""
    found: list[str] = []
    is_package = path.name == "__init__.py"

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.extend(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            target = _resolve(module, is_package, node)
            found.append(target)
            found.extend(f"{target}.{alias.name}" for alias in node.names)

    Visitor().visit(ast.parse(path.read_text()))
    return found


FULL_GRAPH = {name: _all_imports(name, path) for name, path in _modules().items()}

# Imports inside functions that close a cycle, each there for a reason; the graph
# without them has no cycle. A format's methods importing its codec are not listed:
# codecs import their format only under TYPE_CHECKING, so those close no cycle.
# (importer, imported) -> why the import must wait for a call. Empty: Tensor's
# operators, the last entry, are attached by `precision._applied_operators` instead.
LAZY_EDGES: dict[tuple[str, str], str] = {}


def _edges(graph: dict[str, list[str]]) -> dict[str, list[str]]:
    modules = set(graph)
    return {
        m: sorted({n for n in graph[m] if n in modules and n != m and not m.startswith(n + ".")})
        for m in graph
    }


def test_the_allowed_lazy_edges_exist():
    edges = _edges(FULL_GRAPH)
    for a, b in LAZY_EDGES:
        assert b in edges[a], f"{a} no longer imports {b}: drop it from LAZY_EDGES"


@pytest.mark.parametrize("graph", ["module level", "with function-level imports"])
def test_no_import_cycles(graph):
    edges = _edges(GRAPH if graph == "module level" else FULL_GRAPH)
    for a, b in LAZY_EDGES:
        if b in edges[a]:
            edges[a].remove(b)
    # a package's __init__ re-exporting its own modules is not a cycle through them
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in edges[node]:
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in sorted(edges):
        if m not in state:
            walk(m, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# The modules that describe formats (the classes, their numbers, the registry,
# scalings, rounding-mode names) import no JAX at module level, directly or
# through another module: `import dtypes` and `dtypes.get(name).max` stay cheap.
# The codecs (`_*_codec`, `_scale_rules`, `_bit_rounding`, ...) import JAX; `Format`
# imports its class's codec by name (importlib) on the first operation.
JAX_FREE = (
    "dtypes",
    "dtypes._argument_checks",
    "dtypes._asymmetric",
    "dtypes._codebook",
    "dtypes._e8m0",
    "dtypes._errors",
    "dtypes._float",
    "dtypes._format",
    "dtypes._int",
    "dtypes._named_encodings",
    "dtypes._registry",
    "dtypes._rounding_modes",
    "dtypes._scaling",
)


def _reachable(module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        for name in GRAPH.get(m, []):
            if name in GRAPH and name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


@pytest.mark.parametrize("module", JAX_FREE)
def test_format_descriptions_import_no_jax(module):
    assert module in GRAPH
    via = [module, *sorted(_reachable(module))]
    found = [
        f"{m} imports {n}" for m in via for n in GRAPH[m] if n.split(".")[0] in ("jax", "jaxlib")
    ]
    assert not found, f"{module} loads JAX at import: {found}"


def test_every_dtypes_module_is_classified():
    # Every other dtypes module computes with JAX (and is imported lazily):
    # a new module that needs no JAX belongs in JAX_FREE, so this list stays whole.
    unlisted = [
        m
        for m in GRAPH
        if m.startswith("dtypes.")
        and m not in JAX_FREE
        and not any(n.split(".")[0] == "jax" for n in GRAPH[m])
    ]
    assert not unlisted, f"add {unlisted} to JAX_FREE (or to the codecs, importing JAX)"
