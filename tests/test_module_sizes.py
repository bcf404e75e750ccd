"""Sizes: no module over 600 lines, no function over 60 lines, in `dtypes` and `precision`.

A module counts every line of its file. A function counts from its first
statement after the docstring to its last line (the signature, decorators and
docstring are not counted); a nested function counts towards its own size and,
as lines inside it, towards its enclosing function's. What is still over a
limit is listed below with its reason (a table that reads best whole, code
being split); an entry that fits again must leave its list, so the lists only
shrink.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dtypes", "precision")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

# Modules over MAX_MODULE_LINES, by path from the repository root, with the reason.
LONG_MODULES: dict[str, str] = {}

# Functions over MAX_FUNCTION_LINES, as (path, qualified name), with the reason.
LONG_FUNCTIONS: dict[tuple[str, str], str] = {
    ("precision/_cli/_main.py", "_parser"): (
        "a table: the argparse declaration of every command and its options, one "
        "add_argument each; split by command it would read worse, not better"
    ),
}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _path(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


@functools.cache
def module_lines() -> dict[str, int]:
    return {_path(p): len(p.read_text().splitlines()) for p in _sources()}


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the function's last line."""
    body = node.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        if len(body) == 1:
            return 1
        first = body[1]
    assert node.end_lineno is not None
    return node.end_lineno - first.lineno + 1


@functools.cache
def function_lines() -> dict[tuple[str, str], int]:
    """Code lines of every function and method, keyed by (path, qualified name)."""
    sizes: dict[tuple[str, str], int] = {}
    for p in _sources():

        def visit(node: ast.AST, prefix: str, path: str = _path(p)) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = prefix + child.name
                    sizes[(path, name)] = _code_lines(child)
                    visit(child, name + ".<locals>.")
                elif isinstance(child, ast.ClassDef):
                    visit(child, prefix + child.name + ".")
                else:
                    visit(child, prefix)

        visit(ast.parse(p.read_text()), "")
    return sizes


def test_no_module_is_over_the_limit():
    over = {
        path: n
        for path, n in module_lines().items()
        if n > MAX_MODULE_LINES and path not in LONG_MODULES
    }
    assert not over, (
        f"modules over {MAX_MODULE_LINES} lines: {over}; move a coherent group of "
        "definitions into a module named for what it holds"
    )


def test_no_function_is_over_the_limit():
    over = {
        f"{path}: {name}": n
        for (path, name), n in function_lines().items()
        if n > MAX_FUNCTION_LINES and (path, name) not in LONG_FUNCTIONS
    }
    assert not over, (
        f"functions over {MAX_FUNCTION_LINES} lines (docstring excluded): {over}; extract "
        "helpers that each do one thing"
    )


def test_what_is_allowed_over_a_limit_is_still_over_it():
    modules, functions = module_lines(), function_lines()
    stale = [
        f"LONG_MODULES: {path} ({modules.get(path, 'gone')} lines)"
        for path in LONG_MODULES
        if modules.get(path, 0) <= MAX_MODULE_LINES
    ] + [
        f"LONG_FUNCTIONS: {path}: {name} ({functions.get((path, name), 'gone')} lines)"
        for path, name in LONG_FUNCTIONS
        if functions.get((path, name), 0) <= MAX_FUNCTION_LINES
    ]
    assert not stale, f"within the limits now, drop them from their list: {stale}"
