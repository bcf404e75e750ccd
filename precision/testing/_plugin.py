"""Implementation of the pytest plugin of `precision.testing`: `fmt`, `run`, `formats`.

The plugin pytest registers (entry point `pytest11`) is the top-level module
`_precision_pytestplugin`, which imports nothing but pytest, so that
installing `precision` never imports JAX into another project's test
session before its `conftest.py` has configured JAX. Its hooks and fixtures
call into this module only when a collected test asks for `fmt` or `run`.

- A test that takes an argument named `fmt` runs once per entry of
  `dtypes.REGISTRY`, element formats and named encodings alike (ids are the
  format names; float64 only when `jax_enable_x64` is on, since it cannot
  encode without it). `@pytest.mark.formats(...)` narrows the set, by name,
  kind (`Format.kind`) or bits.
- `run(f, *args)` calls `f` eagerly and under `jax.jit` and checks the two
  results agree bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from .._errors import KitError


def _ours(metafunc: pytest.Metafunc, plugin: str) -> bool:
    """Whether `fmt` resolves to the plugin's fixture (a conftest may define its own)."""
    defs = getattr(metafunc, "_arg2fixturedefs", {}).get("fmt")
    if not defs:
        return True
    func = getattr(defs[-1], "func", None)
    return getattr(func, "__module__", plugin) == plugin


def _parametrized(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def selected_formats(
    *names: Any,
    kinds: str | tuple[str, ...] | None = None,
    min_bits: int = 1,
    max_bits: int = 64,
) -> list[Any]:
    """The registry formats a `formats` marker with these arguments selects.

    Without names, every entry of `dtypes.REGISTRY` (element formats and
    named encodings alike; float64 only with `jax_enable_x64`); `kinds`
    (each a `Format.kind`: "float", "int", "uint", "codebook", "scale";
    all of them when None) and the bit range narrow the set.
    """
    import dtypes

    known = tuple(dict.fromkeys(f.kind for f in dtypes.REGISTRY.values()))
    kinds = known if kinds is None else (kinds,) if isinstance(kinds, str) else tuple(kinds)
    bad = [k for k in kinds if k not in known]
    if bad:
        storage = ", ".join(repr(k) for k in known if k not in ("float", "int"))
        raise KitError(
            f"@pytest.mark.formats(kinds={kinds!r}): each kind is 'float' or 'int', or one of "
            f"the storage kinds {storage} (a Format's `kind`)"
        )
    if names:
        pool = [dtypes.get(n) for n in names]
    else:
        import jax

        # float64 encodes only with 64-bit JAX; without it, name it explicitly.
        x64 = jax.config.read("jax_enable_x64")
        pool = [f for f in dtypes.REGISTRY.values() if x64 or f.bits <= 32]
    chosen = [f for f in pool if f.kind in kinds and min_bits <= f.bits <= max_bits]
    if not chosen:
        shown = "all" if kinds == known else repr(kinds)
        raise KitError(
            f"@pytest.mark.formats({', '.join(map(repr, names))}{', ' if names else ''}"
            f"kinds={shown}, min_bits={min_bits}, max_bits={max_bits}) selects no format"
        )
    return chosen


def parametrize_fmt(metafunc: pytest.Metafunc, plugin: str) -> None:
    """Parametrize a test's `fmt` over the formats its `formats` marker selects.

    `plugin` names the module that defines the `fmt` fixture: a test whose
    `fmt` comes from elsewhere (a conftest's own fixture) is left alone, and
    so is one that parametrizes `fmt` itself.
    """
    if "fmt" not in metafunc.fixturenames or not _ours(metafunc, plugin):
        return
    if _parametrized(metafunc, "fmt"):
        return  # the test chose its own formats
    marker = metafunc.definition.get_closest_marker("formats")
    args, kwargs = (marker.args, marker.kwargs) if marker else ((), {})
    chosen = selected_formats(*args, **kwargs)
    metafunc.parametrize("fmt", chosen, ids=[f.name for f in chosen], indirect=True)


class EagerAndJit:
    """Calls a function eagerly and under `jax.jit` and compares the results.

    `run(f, *args, **kwargs)` returns the eager result after checking that
    the jitted one has the same tree structure, dtypes, shapes and bits
    (NaNs compare equal to NaNs). Positional arguments are traced; keyword
    arguments are bound as static. `run.both(f, *args)` returns the pair
    without comparing.
    """

    def __init__(self) -> None:
        # jax.jit caches compilations per wrapped function object; a bound method
        # or a partial is a new object at every call, so keep one wrapper each.
        self._jitted: dict[Any, Callable[..., Any]] = {}

    def both(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        import jax

        g = functools.partial(f, **kwargs) if kwargs else f
        with jax.disable_jit():
            eager = g(*args)
        try:
            key = (f, tuple(sorted(kwargs.items())))
            jitted_f = self._jitted.get(key)
            if jitted_f is None:
                jitted_f = self._jitted[key] = jax.jit(g)
        except TypeError:  # unhashable keyword values: no reuse
            jitted_f = jax.jit(g)
        return eager, jitted_f(*args)

    def __call__(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        eager, jitted = self.both(f, *args, **kwargs)
        _assert_same(eager, jitted, getattr(f, "__name__", repr(f)))
        return eager


def _assert_same(eager: Any, jitted: Any, name: str) -> None:
    import jax
    import numpy as np

    left, tree_l = jax.tree_util.tree_flatten_with_path(eager)
    right, tree_r = jax.tree_util.tree_flatten_with_path(jitted)
    if tree_l != tree_r:  # type: ignore[operator]  # jaxlib ships no stub for PyTreeDef
        raise AssertionError(
            f"{name}: eager and jitted results differ in structure:\n  eager: {tree_l}\n"
            f"  jit:   {tree_r}"
        )
    for (path, a), (_, b) in zip(left, right, strict=True):
        where = f"{name}{jax.tree_util.keystr(path)}"
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            raise AssertionError(
                f"{where}: eager gives {a.dtype}{list(a.shape)}, jit gives {b.dtype}{list(b.shape)}"
            )
        if a.dtype.kind == "c":
            same = (a == b) | (np.isnan(a) & np.isnan(b))
        elif a.dtype.kind in "fV":  # V: ml_dtypes' bfloat16, float8, int4...
            uint = np.dtype(f"u{a.dtype.itemsize}")
            same = (a.view(uint) == b.view(uint)) | (
                np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
            )
        else:
            same = a == b
        if not np.all(same):
            first = tuple(int(i) for i in np.argwhere(~same)[0]) if a.ndim else ()
            raise AssertionError(
                f"{where}: eager and jitted results differ in {int(np.sum(~same))} of "
                f"{same.size} elements; first at index {first}: eager {a[first]!r}, "
                f"jit {b[first]!r}. A difference only under jit usually means XLA "
                "simplified a rounding away (e.g. an astype round trip) or fused arithmetic."
            )
