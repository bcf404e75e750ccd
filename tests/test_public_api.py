"""The public surface: frozen, documented, in the API reference, and only re-exported.

Docstrings are read the way the docs site reads them (griffe, statically), so a
module-level constant counts as documented only with an attribute docstring,
exactly when the API reference can show it.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import re
import typing
from pathlib import Path

import griffe
import pytest

import dtypes
import precision

ROOT = Path(__file__).resolve().parents[1]
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
PUBLIC_MODULES = ("dtypes", "precision", "precision.testing")

DTYPES_ALL = [
    "ALIASES",
    "ENCODINGS",
    "ENCODING_ALIASES",
    "FORMATS",
    "REGISTRY",
    "ROUNDING_MODES",
    "SCALE_FORMATS",
    "AsymmetricIntFormat",
    "CodebookFormat",
    "E8M0Format",
    "Encoded",
    "FloatFormat",
    "Format",
    "FormatError",
    "FormatTypeError",
    "IntFormat",
    "NonFiniteError",
    "PerAxis",
    "PerBlock",
    "PerTensor",
    "PrecisionError",
    "PrecisionTypeError",
    "RoundingError",
    "Scaling",
    "ScalingError",
    "ShapeError",
    "astype",
    "bfloat16",
    "check_rounding",
    "computed_once",
    "float8_e4m3fn",
    "float8_e5m2",
    "float16",
    "float32",
    "float64",
    "from_codes",
    "get",
    "int1",
    "int2",
    "int4",
    "int8",
    "is_tracer",
    "tf32",
]


def test_dtypes_all_is_frozen():
    # A change here is an API change: update the docs and this list together.
    assert dtypes.__all__ == DTYPES_ALL


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_has_no_repeats(module_name):
    # Its order is ruff's (RUF022, isort-style), checked by the linter.
    names = importlib.import_module(module_name).__all__
    assert len(set(names)) == len(names), f"{module_name}.__all__ repeats a name"


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_resolves(module_name):
    module = importlib.import_module(module_name)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing, f"{module_name}.__all__ lists names it does not define: {missing}"


@functools.cache
def _griffe_modules() -> griffe.ModulesCollection:
    """Both packages, read statically once for this module: a load reads every file and
    resolves every alias (seconds each), and the tests below only read the result."""
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    for top in ("dtypes", "precision"):
        loader.load(top)
    # external: precision re-exports dtypes' error classes.
    loader.resolve_aliases(external=True)
    return loader.modules_collection


def _griffe_package(module_name: str) -> griffe.Object:
    top = module_name.split(".")[0]
    package = _griffe_modules()[top]
    return package if module_name == top else package[module_name.split(".", 1)[1]]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_has_a_docstring(module_name):
    module = importlib.import_module(module_name)
    static = _griffe_package(module_name)
    undocumented = []
    for name in module.__all__:
        obj = static[name]
        docstring = obj.docstring.value.strip() if obj.docstring else ""
        if not docstring:
            undocumented.append(f"{module_name}.{name}")
    assert not undocumented, (
        f"public names without a docstring (a constant needs a string literal on the line after "
        f"its assignment): {undocumented}"
    )


def _api_directives() -> list[str]:
    return [
        name
        for page in API_PAGES
        for name in re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), flags=re.MULTILINE)
    ]


def test_api_pages_cover_every_public_module():
    # `::: module` renders every name in that module's __all__, `::: module.name` one name;
    # docs/hooks.py checks the rendered pages have an entry for each one when the site is
    # built, on exactly one page.
    directives = _api_directives()
    for module_name in PUBLIC_MODULES:
        names = importlib.import_module(module_name).__all__
        uncovered = [
            name
            for name in names
            if module_name not in directives and f"{module_name}.{name}" not in directives
        ]
        assert not uncovered, f"no ::: directive in docs/api/ covers {uncovered}"


def test_format_and_policy_names_are_the_registry():
    # The literal names in the annotations of compute= and policy= are the registry's, so
    # an editor's completion offers exactly the built-in names.
    format_names = typing.get_args(typing.get_args(precision.FormatLike)[0])
    assert format_names == tuple(dtypes.FORMATS)
    policy_names = typing.get_args(typing.get_args(precision.PolicyLike)[1])
    assert policy_names == ("mixed_bfloat16", "mixed_float16")
    for name in policy_names:
        assert precision.Policy.parse(name).compute.name == name.removeprefix("mixed_")


def test_apply_and_explain_are_typed_with_what_they_take():
    for fn in (precision.apply, precision.explain):
        hints = typing.get_type_hints(fn)
        assert hints["compute"] == precision.FormatLike | None
        assert hints["policy"] == precision.PolicyLike | None
        assert hints["contract"] == precision.ContractLike | None


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_init_only_reexports(module_name):
    static = _griffe_package(module_name)
    defined_here = [
        name
        for name, member in static.members.items()
        if not member.is_alias and not member.is_module and name in static.exports
    ]
    assert not defined_here, (
        f"{module_name}/__init__.py defines {defined_here} itself; define them in a private "
        "module and re-export them"
    )
    module = importlib.import_module(module_name)
    package = module_name.split(".")[0]
    for name in module.__all__:
        obj = getattr(module, name)
        # precision re-exports dtypes' error classes: one hierarchy for both packages.
        shared = package == "precision" and getattr(obj, "__module__", "") == "dtypes._errors"
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not shared:
            assert obj.__module__.startswith(f"{package}."), (
                f"{module_name}.{name} comes from {obj.__module__}, outside the package"
            )


ERROR_MODULES = ("dtypes/_errors.py", "precision/_errors.py")


def _raises_kind(base: ast.expr) -> bool:
    """Whether a class base, as written, is an exception or warning class: a builtin
    one, or a name spelled like one (`PrecisionError`, `_errors.SaveError`)."""
    name = ast.unparse(base).rsplit(".", 1)[-1]
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        return True
    return re.search(r"(Error|Warning|Exception|Exit|Interrupt)$", name) is not None


def test_exception_classes_live_in_the_two_error_modules():
    # One hierarchy, read in one place: an exception or warning class defined anywhere
    # else, public or private, is a second home.
    elsewhere = []
    for package in ("dtypes", "precision"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where in ERROR_MODULES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(map(_raises_kind, node.bases)):
                    elsewhere.append(f"{where}:{node.lineno}: {node.name}")
    assert not elsewhere, f"exception classes outside {ERROR_MODULES}: {elsewhere}"


def _error_classes() -> list[type[BaseException]]:
    """Every exception and warning class the two error modules define and every one
    `dtypes` and `precision` export, once each."""
    import dtypes._errors
    import precision._errors

    found: dict[int, type[BaseException]] = {}
    for module in (dtypes._errors, precision._errors, dtypes, precision):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                found.setdefault(id(obj), obj)
    return sorted(found.values(), key=lambda c: c.__name__)


def test_the_error_modules_export_every_class_they_define():
    import dtypes._errors
    import precision._errors

    for module in (dtypes._errors, precision._errors):
        defined = {
            name
            for name, obj in vars(module).items()
            if inspect.isclass(obj)
            and issubclass(obj, BaseException)
            and obj.__module__ == module.__name__
        }
        assert defined <= set(module.__all__), (module.__name__, defined - set(module.__all__))


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_each_error_is_a_precision_error_and_a_builtin_and_says_why(cls):
    assert (cls.__doc__ or "").strip(), f"{cls.__name__} says nowhere why it exists"
    assert cls.__module__ in ("dtypes._errors", "precision._errors"), cls.__module__
    if issubclass(cls, Warning):
        assert issubclass(cls, UserWarning)
        return
    assert issubclass(cls, dtypes.PrecisionError)
    builtins_caught = (ValueError, TypeError, IndexError, RuntimeError)
    assert cls is dtypes.PrecisionError or issubclass(cls, builtins_caught), cls.__mro__
    # `except dtypes.PrecisionTypeError` catches every TypeError raised on purpose
    assert not issubclass(cls, TypeError) or issubclass(cls, dtypes.PrecisionTypeError)


def test_every_type_error_is_caught_as_a_precision_type_error():
    # The promise of errors.md, tried as a caller would: one `except` for each.
    type_errors = [c for c in _error_classes() if issubclass(c, TypeError)]
    assert {c.__name__ for c in type_errors} >= {
        "FormatTypeError",
        "LossScaleTypeError",
        "PrecisionMismatchError",
        "SaveTypeError",
    }
    for cls in type_errors:
        with pytest.raises(dtypes.PrecisionTypeError):
            raise cls("refused")
        with pytest.raises(precision.PrecisionTypeError):
            raise cls("refused")


def test_every_error_is_public_or_caught_as_its_builtin():
    # A class users may catch apart is public; the three that are not are raised as the
    # builtin they are (an index past its dimension, a testing-kit argument, a
    # command-line usage error), as docs/api/errors.md says.
    public = {id(getattr(m, n)) for m in (dtypes, precision) for n in m.__all__}
    private = {c.__name__ for c in _error_classes() if id(c) not in public}
    assert private == {"KitError", "TensorIndexError", "UsageError"}
