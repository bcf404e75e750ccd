"""`__all__` says what a module offers: every name it lists exists, and every public
name the module defines (a function, a class, a constant not starting with `_`) is
listed. A stale list misleads whoever reads the module to learn what it holds.

The packages' `__init__` files load their names lazily (PEP 562 `__getattr__`):
their lists name what `_HOME` maps and the TYPE_CHECKING block imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dtypes", "precision")


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _names(tree: ast.Module) -> tuple[set[str], set[str], list[str] | None]:
    """(names defined at top level, names imported anywhere at top level, `__all__`)."""
    defined: set[str] = set()
    imported: set[str] = set()
    listed: list[str] | None = None

    def visit(body: list[ast.stmt]) -> None:
        nonlocal listed
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        defined.add(target.id)
                        if target.id == "__all__" and node.value is not None:
                            listed = list(ast.literal_eval(node.value))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                # names for type checkers only: listable (lazy packages), never required
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom | ast.ClassDef):
                        names = (
                            [inner.name]
                            if isinstance(inner, ast.ClassDef)
                            else [(a.asname or a.name).split(".")[0] for a in inner.names]
                        )
                        imported.update(names)
                    elif isinstance(inner, ast.Assign | ast.AnnAssign):
                        targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                        imported.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return defined, imported, listed


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_all_lists_what_the_module_offers(path):
    defined, imported, listed = _names(ast.parse(path.read_text()))
    if listed is None:
        return  # no list: `from module import *` is not how the package is used
    missing = sorted(set(listed) - defined - imported)
    assert not missing, f"__all__ names what the module does not have: {missing}"
    if path.name == "__init__.py":
        return  # a package re-exports from its modules
    public = {n for n in defined if not n.startswith("_") and n != "TYPE_CHECKING"}
    unlisted = sorted(public - set(listed))
    assert not unlisted, f"public names missing from __all__: {unlisted}"
