"""Bad-input sweep: no public callable lets a plain builtin exception out of the library.

The project's rule: bad input to a public function, class or method raises a
`precision.PrecisionError` subclass that also inherits the builtin users
catch (`ValueError`, `TypeError`, `IndexError`). This file calls every public
callable of `precision`, `precision.testing`, `precision.optax` and `dtypes`
(each module's `__all__`, and the public methods of its classes), plus the
Tensor operators, Format methods over `dtypes.REGISTRY`, the scalings,
`Encoded`, `from_codes`, the loss scales, Policy/Contract, `calibrate` and
`explain` options and `save`/`load` with bad paths, flags and damaged files,
with one argument at a time replaced by a bad value. Each outcome is one of

- OK: a `PrecisionError` that is also a builtin exception (passes);
- NOBUILTIN: a `PrecisionError` that inherits no builtin exception (fails);
- BUILTIN: any other exception whose traceback passes through
  `precision/` or `dtypes/` and was not raised by a callback this file gave
  the library (fails, unless allowlisted below as documented behaviour);
- EXT: an exception with no library frame, raised at the call site (for
  example by Python's argument binding) (passes);
- RET: the call returned (passes: values are not judged, except in the few
  cases marked "must refuse", where a return fails);
- HANG: the call ran past `TIMEOUT_S` (fails).

The cases come from tables: a recipe is a callable with a valid baseline call,
and every parameter (by position or keyword, found from the signature so new
keywords are swept too) is replaced in turn by each value of a bad-value set.
The baseline itself must succeed (else the recipe tests nothing). Cases run
with JAX's default promotion rules and warnings ignored, as a user runs them.

Cost: the default profile runs a deterministic subset, `PER_SLOT` cases per
(callable, parameter) rotating through its bad values by the parameter's index;
`HYPOTHESIS_PROFILE=hunt` runs every case. A new public name without a recipe
fails `test_every_public_callable_has_a_recipe`.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import operator
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dtypes
import precision

HUNT = os.environ.get("HYPOTHESIS_PROFILE") == "hunt"
PER_SLOT = 1  # default profile: cases kept per (callable, parameter) rotation slot
TIMEOUT_S = 20  # per call; HANG past it
THIS_FILE = os.path.abspath(__file__)
LIB_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (precision, dtypes))

NAN = float("nan")
INF = float("inf")

# ---------------------------------------------------------------------------- bad values

SCALARS: dict[str, Any] = {
    "None": None,
    "str": "abc",
    "bytes": b"abc",
    "dict": {"a": 1},
    "object": object(),
    "mixedlist": [1, "a"],
    "tuple3": (1, 2, 3),
    "emptylist": [],
    "nan": NAN,
    "inf": INF,
    "neg": -1,
    "huge": 2**63,
    "bool": True,
    "complex": 1j,
    "float1.5": 1.5,
}
SHAPES: dict[str, Any] = {
    "shape-1": (-1,),
    "shape2^47": (2**47,),
    "shape2^47x2": (2**47, 2**47),
    "shape2^63": (2**63,),
    "shape1.5": (1.5,),
    "shapebool": (True, 2),
    "shape-str": "abc",
    "shapeNone": (None,),
}


@functools.cache
def _arrays() -> dict[str, Any]:
    return {
        "nanarr": np.array([NAN, 1.0, 2.0, 3.0], np.float32),
        "infarr": np.array([INF, -INF, 1.0, 2.0], np.float32),
        "empty": np.zeros((0,), np.float32),
        "empty2d": np.zeros((0, 32), np.float32),
        "zero-d": np.array(1.5, np.float32),
        "npscalar": np.float32(1.5),
        "int32arr": np.arange(4, dtype=np.int32),
        "int64huge": np.array([2**40, -(2**40)], np.int64),
        "boolarr": np.array([True, False]),
        "complexarr": np.ones(4, np.complex64),
        "uint8arr": np.arange(4, dtype=np.uint8),
        "f16arr": np.ones(4, np.float16),
        "bf16jnp": jnp.ones(4, jnp.bfloat16),
        "objarr": np.array([1, "a"], dtype=object),
        "strarr": np.array(["a", "b"]),
        "hugef32": np.array([3e38, -3e38], np.float32),
        "tiny": np.array([1e-45, 0.0], np.float32),
    }


def values(kind: str) -> list[tuple[str, Any]]:
    """A bad-value set: scalar, array, value (both), shape, option (scalars, a few arrays)."""
    arrays = _arrays()
    if kind == "scalar":
        return list(SCALARS.items())
    if kind == "array":
        return list(arrays.items())
    if kind == "value":
        return [*SCALARS.items(), *arrays.items()]
    if kind == "shape":
        return [*SCALARS.items(), *SHAPES.items()]
    if kind == "option":
        few = ("zero-d", "int32arr", "empty", "objarr")
        return [*SCALARS.items(), *((k, arrays[k]) for k in few)]
    if kind == "number":
        return [*SCALARS.items(), ("np.int64(2)", np.int64(2)), ("np.float32(1)", np.float32(1))]
    raise AssertionError(kind)


# ---------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    label: str
    thunk: Callable[[], Any]
    slot: str  # rotation key: the default profile keeps PER_SLOT cases of each slot
    always: bool = False  # run in every profile (cheap, important)
    refuse: bool = False  # must refuse: a return fails
    baseline: bool = False  # the recipe's valid call: any exception fails


class Lazy:
    """A baseline argument computed on first use (so building cases stays cheap)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    @functools.cached_property
    def value(self) -> Any:
        return self.make()


def _bound(fn: Callable[..., Any], args: tuple, kwargs: dict, then: Callable | None) -> Callable:
    def thunk() -> Any:
        a = [x.value if isinstance(x, Lazy) else x for x in args]
        out = fn(*a, **kwargs)
        return then(out) if then is not None else out

    return thunk


def sweep(
    name: str,
    fn: Callable[..., Any],
    args: tuple = (),
    kwargs: dict | None = None,
    slots: dict[int | str, str] | None = None,
    *,
    then: Callable[[Any], Any] | None = None,
    auto: bool = True,
    skip: tuple[str, ...] = (),
    key: str | None = None,
    baseline: bool = True,
) -> list[Case]:
    """`fn(*args, **kwargs)` (then `then(result)`) with one argument replaced at a time.

    `slots` maps a position in `args` or a keyword to a bad-value set; with
    `auto`, every other named parameter of `fn`'s signature (but `skip`) gets
    the scalar set, so a new keyword is swept without a table change. `key`
    names the rotation slot (default `name`): recipes that share it (one per
    format, say) share their default-profile budget.
    """
    kwargs = dict(kwargs or {})
    slots = dict(slots or {})
    if auto:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        for i, p in enumerate(params):
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in skip:
                continue
            positional = p.kind is p.POSITIONAL_ONLY or (
                p.kind is p.POSITIONAL_OR_KEYWORD and i < len(args)
            )
            slot: int | str = i if positional else p.name
            if slot not in slots and p.name not in slots:
                slots[slot] = "scalar"
    rot = key or name
    cases = [
        Case(
            f"{name}(<baseline>)",
            _bound(fn, args, kwargs, then),
            f"{rot}:baseline",
            baseline=baseline,
        )
    ]
    for slot, kind in slots.items():
        for vname, v in values(kind):
            a, kw = list(args), dict(kwargs)
            if isinstance(slot, int):
                a[slot : slot + 1] = [v]
                where = f"#{slot}"
            else:
                kw[slot] = v
                where = slot
            cases.append(
                Case(f"{name}({where}={vname})", _bound(fn, tuple(a), kw, then), f"{rot}.{where}")
            )
    return cases


def specials(group: str, items: list[tuple[str, Callable[[], Any]]], **flags: Any) -> list[Case]:
    """Hand-written cases (one thunk each), sharing one rotation slot."""
    return [Case(label, thunk, f"{group}:special", **flags) for label, thunk in items]


def select(cases: list[Case]) -> list[Case]:
    """Every case under `hunt`; else `PER_SLOT` of each slot, rotating by the slot's index."""
    if HUNT:
        return cases
    sizes: dict[str, int] = {}
    for c in cases:
        sizes[c.slot] = sizes.get(c.slot, 0) + 1
    order = {s: r for r, s in enumerate(sizes)}
    seen: dict[str, int] = {}
    kept = []
    for c in cases:
        i = seen[c.slot] = seen.get(c.slot, -1) + 1  # the case's position in its slot
        stride = max(1, math.ceil(sizes[c.slot] / PER_SLOT))
        if c.always or i % stride == (order[c.slot] * 7) % stride:
            kept.append(c)
    return kept


# ---------------------------------------------------------------------------- running


class Hang(BaseException):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang


# Outcomes that are documented behaviour, not leaks: (group, label prefix, exception class,
# reason). An entry matches a case of a group whose name starts with `group` and whose
# label starts with `label prefix`, raising an instance of the class.
ALLOWLIST: list[tuple[str, str, type[BaseException], str]] = [
    (
        "precision.load",
        "",
        OSError,
        "load documents `OSError: the file cannot be opened` (a missing file, no "
        "permission): the caller's filesystem problem, caught as OSError.",
    ),
    (
        "precision.save",
        "",
        OSError,
        "save documents `FileExistsError` (the path exists, overwrite=False) and `OSError: "
        "the destination cannot be written` (a missing or read-only directory, a directory).",
    ),
    (
        "dtypes.Scaling.group_reduce",
        "",
        ValueError,
        "an error of the caller's own `reduce` (jnp.max of an empty group): group_reduce "
        "calls it on the array as given, as jnp's reductions do.",
    ),
    (
        "dtypes.Scaling.broadcast",
        "",
        jax.errors.JaxRuntimeError,
        "an eager array larger than the machine's memory: XLA's RESOURCE_EXHAUSTED, as "
        "numpy raises MemoryError; shapes past what XLA can count are refused by name.",
    ),
    (
        "precision.Explanation",
        "",
        Exception,
        "the result type `explain` returns, a plain dataclass: built by hand with fields of "
        "the wrong types, printing it fails as any dataclass's formatting would.",
    ),
    (
        "precision.testing",
        "assert_",
        AssertionError,
        "assert_ulp_close and assert_representable are test assertions: they document "
        "`AssertionError` when the values are off (a bad value can simply be far off).",
    ),
]


def _allowed(group: str, label: str, exc: BaseException) -> bool:
    return any(
        group.startswith(g) and label.startswith(p) and isinstance(exc, t)
        for g, p, t, _ in ALLOWLIST
    )


def _builtin_ancestor(exc: BaseException) -> bool:
    return any(
        c.__module__ == "builtins" and c not in (Exception, BaseException, object)
        for c in type(exc).__mro__
    )


def _lib_origin(tb: Any) -> str | None:
    """Where a library frame raised: the last one in the traceback, unless a callback
    this file passed to the library ran after it (the callback's own exception)."""
    frames = traceback.extract_tb(tb)
    lib = [i for i, f in enumerate(frames) if f.filename.startswith(LIB_DIRS)]
    if not lib:
        return None
    if any(f.filename == THIS_FILE for f in frames[lib[-1] + 1 :]):
        return None
    f = frames[lib[-1]]
    root = os.path.dirname(LIB_DIRS[0].rstrip(os.sep)) + os.sep
    return f"{f.filename.replace(root, '')}:{f.lineno}"


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0][:160] if text else ""


def run_case(case: Case, group: str) -> str | None:
    """Run one case; a failure's description, or None when it passes."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGALRM, _on_alarm) if main else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):
                if main:
                    signal.alarm(TIMEOUT_S)
                try:
                    out = case.thunk()
                    if hasattr(out, "block_until_ready"):
                        out.block_until_ready()
                finally:
                    if main:
                        signal.alarm(0)
    except Hang:
        return f"{case.label} -> HANG (> {TIMEOUT_S} s)"
    except precision.PrecisionError as e:
        if not _builtin_ancestor(e):
            name = type(e).__name__
            return f"{case.label} -> {name} inherits no builtin exception: {_first_line(e)}"
        if case.baseline:
            return f"{case.label} -> baseline refused: {type(e).__name__}: {_first_line(e)}"
        return None
    except Exception as e:
        where = _lib_origin(e.__traceback__)
        if case.baseline:
            return f"{case.label} -> baseline raised {type(e).__name__}: {_first_line(e)}"
        if where is None or _allowed(group, case.label, e):
            return None
        return (
            f"{case.label} -> {type(e).__module__}.{type(e).__name__}: {_first_line(e)} @ {where}"
        )
    finally:
        if main:
            signal.signal(signal.SIGALRM, old)
    if case.refuse:
        return f"{case.label} -> returned, but must refuse"
    return None


# ---------------------------------------------------------------------------- context


class Ctx:
    """Inputs shared by the recipes, built on first use."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sample = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
        self.sample8 = np.linspace(-1, 1, 256, dtype=np.float32).reshape(8, 32)
        self.key = jax.random.key(0)

    @functools.cached_property
    def weights(self) -> dict[str, Any]:
        return {"w": jnp.asarray(self.sample), "b": jnp.ones(32)}

    @functools.cached_property
    def sharding(self) -> Any:
        return jax.sharding.SingleDeviceSharding(jax.devices()[0])

    @functools.cached_property
    def tensors(self) -> dict[str, precision.Tensor]:
        t = precision.Tensor(self.sample)
        return {
            "t": t,
            "tb": t.to_reduced_precision("bfloat16"),
            "ti": t.to_reduced_precision("int8"),
            "t4": t.to_reduced_precision("int4", scaling=dtypes.PerBlock(16)),
        }

    @functools.cached_property
    def enc(self) -> dtypes.Encoded:
        return dtypes.int8.encode(self.sample)

    @functools.cached_property
    def checkpoint(self) -> Path:
        path = self.tmp / "ok.safetensors"
        precision.save(path, self.weights, overwrite=True)
        return path

    def x_for(self, fmt: dtypes.Format) -> np.ndarray:
        return np.abs(self.sample) + 0.5 if fmt.kind == "scale" else self.sample

    def matmul_fn(self) -> Callable[[Any, Any], Any]:
        return lambda p, x: x @ p["w"].T


def draw(strategy: Any) -> Any:
    """One example from a hypothesis strategy (building one may defer all checks)."""
    from hypothesis import HealthCheck, Phase, given, settings

    out: list[Any] = []

    @settings(
        max_examples=1,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def take(x: Any) -> None:
        out.append(x)

    take()
    return out[0] if out else None


def _entered(cm: Any) -> Any:
    with cm as value:
        return value


# ---------------------------------------------------------------------------- groups

GROUPS: dict[str, Callable[[Ctx], list[Case]]] = {}
COVERS: dict[str, tuple[str, ...]] = {}


def group(name: str, *covers: str) -> Callable:
    """Register a case builder as test `name`, covering the public API names `covers`."""

    def register(builder: Callable[[Ctx], list[Case]]) -> Callable[[Ctx], list[Case]]:
        GROUPS[name] = builder
        COVERS[name] = covers or (name,)
        return builder

    return register


def _formats() -> list[tuple[str, dtypes.Format]]:
    return [(n, dtypes.get(n)) for n in dtypes.REGISTRY]


def _fmt_baseline(fmt: dtypes.Format) -> bool:
    # float64 needs 64-bit JAX (the subprocess test covers it): its baselines refuse here.
    return fmt.name != "float64"


def _format_method(method: str) -> Callable[[Ctx], list[Case]]:
    def build(ctx: Ctx) -> list[Case]:
        cases: list[Case] = []
        for n, fmt in _formats():
            x, ok, rot = ctx.x_for(fmt), _fmt_baseline(fmt), f"Format.{method}"
            f = getattr(fmt, method)
            opt = {"scaling": "option", "rounding": "option", "key": "option"}
            if method in ("encode", "round"):
                cases += sweep(
                    f"{n}.{method}", f, (x,), None, {0: "value", **opt}, key=rot, baseline=ok
                )
                if n != "float8_e8m0fnu":  # rounds to nearest only
                    kw = {"rounding": "stochastic", "key": ctx.key}
                    cases += sweep(
                        f"{n}.{method}[stochastic]",
                        f,
                        (x,),
                        kw,
                        {"key": "option"},
                        auto=False,
                        key=rot + "[stochastic]",
                        baseline=ok,
                    )
            elif method == "check":
                y = (
                    Lazy(functools.partial(lambda f, x: np.asarray(f.round(x)), fmt, x))
                    if ok
                    else x
                )
                cases += sweep(
                    f"{n}.check",
                    f,
                    (y,),
                    None,
                    {0: "value", "scaling": "option"},
                    key=rot,
                    baseline=ok,
                )
            elif method == "decode":
                enc = Lazy(functools.partial((fmt if ok else dtypes.float32).encode, x))
                cases += sweep(
                    f"{n}.decode",
                    f,
                    (enc,),
                    None,
                    {0: "value", "dtype": "option"},
                    key=rot,
                    baseline=ok,
                )
                other = dtypes.int8 if n == "bfloat16" else dtypes.bfloat16
                cases += specials(
                    rot,
                    [
                        (
                            f"{n}.decode(<{other.name} encoding>)",
                            functools.partial(lambda f, e, x: f(e.encode(x)), f, other, x),
                        )
                    ],
                )
            elif method == "result_dtype":
                cases += sweep(
                    f"{n}.result_dtype",
                    f,
                    (np.float32,),
                    None,
                    {0: "option", "scaling": "option"},
                    key=rot,
                )
            elif method == "nbytes":
                cases += sweep(
                    f"{n}.nbytes", f, ((2, 32),), None, {0: "shape", "scaling": "option"}, key=rot
                )
            elif method == "data_shape":
                cases += sweep(f"{n}.data_shape", f, ((2, 32),), None, {0: "shape"}, key=rot)
            elif method == "default_scaling":
                cases += sweep(f"{n}.default_scaling", f, key=rot)
        return cases

    return build


for _m in (
    "encode",
    "round",
    "check",
    "decode",
    "result_dtype",
    "nbytes",
    "data_shape",
    "default_scaling",
):
    group(f"dtypes.Format.{_m}")(_format_method(_m))


# the arrays a jitted call is swept with (its argument's kinds: specials, empty, 0-d, ints)
JIT_ARRAYS = ("nanarr", "infarr", "empty", "zero-d", "int32arr", "boolarr", "f16arr", "hugef32")


@group("dtypes.Format.jit")
def _format_jit(ctx: Ctx) -> list[Case]:
    items = []
    for n, fmt in _formats():
        for vn in JIT_ARRAYS:
            v = _arrays()[vn]
            items.append(
                (
                    f"jit({n}.round)({vn})",
                    functools.partial(lambda f, a: jax.jit(f.round)(a), fmt, v),
                )
            )
            items.append(
                (
                    f"jit({n}.encode.decode)({vn})",
                    functools.partial(
                        lambda f, a: jax.jit(lambda b: f.encode(b).decode())(a), fmt, v
                    ),
                )
            )
        x = ctx.x_for(fmt)
        items.append(
            (
                f"jit({n}.round stochastic, key=traced uint32)",
                functools.partial(
                    lambda f, y: jax.jit(lambda k: f.round(y, rounding="stochastic", key=k))(
                        jnp.uint32(3)
                    ),
                    fmt,
                    x,
                ),
            )
        )
    return specials("Format.jit", items)


@group(
    "dtypes.constructors",
    "dtypes.FloatFormat",
    "dtypes.IntFormat",
    "dtypes.AsymmetricIntFormat",
    "dtypes.CodebookFormat",
    "dtypes.E8M0Format",
    "dtypes.get",
    "dtypes.check_rounding",
    "dtypes.Format",
)
def _format_constructors(ctx: Ctx) -> list[Case]:
    d = dtypes
    cases = [
        *sweep("FloatFormat", d.FloatFormat, (4, 3)),
        *sweep("IntFormat", d.IntFormat, (8,)),
        *sweep("AsymmetricIntFormat", d.AsymmetricIntFormat, (8,)),
        *sweep("CodebookFormat", d.CodebookFormat, ([-1.0, 0.0, 0.5, 1.0],), None, {0: "value"}),
        *sweep("E8M0Format", d.E8M0Format),
        *sweep("get", d.get, ("int8",), None, {0: "value"}),
        *sweep("check_rounding", d.check_rounding, ("nearest_even", None)),
        *sweep(
            "check_rounding[stochastic]",
            d.check_rounding,
            ("stochastic", ctx.key),
            None,
            {1: "value"},
            auto=False,
        ),
    ]
    s = ctx.sample
    items: list[tuple[str, Callable[[], Any]]] = [("Format()", d.Format)]
    for a in [(0, 3), (1, 0), (8, 23), (11, 52), (15, 0), (5, 60), (1, 1), (2, 0), (3, 30)]:
        items.append(
            (f"FloatFormat{a}.round", functools.partial(lambda a: d.FloatFormat(*a).round(s), a))
        )
    for b in [0, 1, 9, 16, 17, 32, 64, 65]:
        items.append(
            (f"IntFormat({b}).round", functools.partial(lambda b: d.IntFormat(b).round(s), b))
        )
        items.append(
            (
                f"AsymmetricIntFormat({b}).round",
                functools.partial(lambda b: d.AsymmetricIntFormat(b).round(s), b),
            )
        )
    for vals in [
        [0.0],
        [1.0, 1.0],
        [NAN, 1.0],
        [INF, 0.0],
        [],
        [1e40, 0],
        list(range(300)),
        [-1.0, 1.0],
    ]:
        items.append(
            (
                f"CodebookFormat({vals[:3]}..{len(vals)}).round",
                functools.partial(lambda v: d.CodebookFormat(v).round(s), vals),
            )
        )
    items.append(
        ("E8M0Format(name='x').round", lambda: d.E8M0Format(name="x").round(np.array([1.0, 2.0])))
    )
    return cases + specials("constructors", items)


def _scalings() -> dict[str, dtypes.Scaling]:
    return {
        "PerTensor": dtypes.PerTensor(),
        "PerAxis(0)": dtypes.PerAxis(0),
        "PerAxis((0,-1))": dtypes.PerAxis((0, -1)),
        "PerBlock(32)": dtypes.PerBlock(32),
        "PerBlock(4,axis=0)": dtypes.PerBlock(4, axis=0),
    }


@group(
    "dtypes.scaling_constructors",
    "dtypes.PerTensor",
    "dtypes.PerAxis",
    "dtypes.PerBlock",
    "dtypes.Scaling",
)
def _scaling_constructors(ctx: Ctx) -> list[Case]:
    d = dtypes
    cases = [
        *sweep(
            "PerTensor", d.PerTensor, (), None, {"power_of_two": "number", "scale_format": "number"}
        ),
        *sweep("PerAxis", d.PerAxis, (0,), None, {0: "number"}),
        *sweep(
            "PerAxis((0,_))", lambda a: d.PerAxis((0, a)), (1,), None, {0: "number"}, auto=False
        ),
        *sweep("PerBlock", d.PerBlock, (32,), None, {0: "number", "axis": "number"}),
        *sweep("Scaling", d.Scaling, baseline=False),  # the abstract base refuses itself
    ]
    items: list[tuple[str, Callable[[], Any]]] = []
    for sf in [
        "int8",
        "nf4",
        "float8_e5m2",
        "float64",
        "mxfp4",
        "bf16",
        "e8m0",
        "float4_e2m1fn",
        "uint8",
    ]:
        items.append(
            (f"PerBlock(32,scale_format={sf})", functools.partial(d.PerBlock, 32, scale_format=sf))
        )
    items += [
        ("PerAxis([0,1])", lambda: d.PerAxis([0, 1])),
        ("PerAxis(())", lambda: d.PerAxis(())),
        ("PerBlock(2**64)", lambda: d.PerBlock(2**64)),
        ("PerAxis(2**64)", lambda: d.PerAxis(2**64)),
        ("Scaling().describe()", lambda: d.Scaling().describe()),
        ("Scaling().scale_shape((2,3))", lambda: d.Scaling().scale_shape((2, 3))),
        ("str(Scaling())", lambda: str(d.Scaling())),
        (
            "int8.encode(x, scaling=Scaling())",
            lambda: d.int8.encode(ctx.sample, scaling=d.Scaling()),
        ),
    ]
    return cases + specials("scaling_constructors", items)


def _scaling_method(method: str) -> Callable[[Ctx], list[Case]]:
    def build(ctx: Ctx) -> list[Case]:
        cases: list[Case] = []
        shape = (8, 32)
        x = jnp.asarray(ctx.sample8)
        for sn, sc in _scalings().items():
            f, rot = getattr(sc, method, None), f"Scaling.{method}"
            if f is None:
                continue
            ss = sc.scale_shape(shape)
            table: dict[str, tuple[tuple, dict[int | str, str]]] = {
                "scale_shape": ((shape,), {0: "shape"}),
                "validate": ((shape,), {0: "shape"}),
                "broadcast": ((jnp.ones(ss), shape), {0: "value", 1: "shape"}),
                "refit": ((shape, ss), {0: "shape", 1: "shape"}),
                "group_reduce": ((x, jnp.max), {0: "value", 1: "scalar"}),
                "tensor_scale_fits": (((1, 1), shape), {0: "shape", 1: "shape"}),
                "describe": ((), {}),
                "kept": ((2,), {0: "scalar"}),
            }
            args, slots = table[method]
            cases += sweep(f"{sn}.{method}", f, args, None, slots, key=rot)
            if method == "scale_shape":
                cases += specials(
                    rot,
                    [
                        (f"{sn}.scale_shape(())", functools.partial(f, ())),
                        (f"{sn}.scale_shape((0,0))", functools.partial(f, (0, 0))),
                    ],
                )
            if method == "broadcast":
                cases += specials(
                    rot,
                    [
                        (
                            f"{sn}.broadcast(wrong scale)",
                            functools.partial(f, jnp.ones((3, 5)), shape),
                        )
                    ],
                )
            if method == "group_reduce":
                cases += specials(
                    rot,
                    [
                        (f"{sn}.group_reduce(numpy)", functools.partial(f, ctx.sample8, jnp.max)),
                        (f"{sn}.group_reduce(list)", functools.partial(f, [[1.0, 2.0]], jnp.max)),
                    ],
                )
        return cases

    return build


for _m in (
    "scale_shape",
    "validate",
    "broadcast",
    "refit",
    "group_reduce",
    "tensor_scale_fits",
    "describe",
    "kept",
):
    group(f"dtypes.Scaling.{_m}")(_scaling_method(_m))


@group(
    "dtypes.Encoded",
    "dtypes.Encoded",
    "dtypes.Encoded.decode",
    "dtypes.Encoded.group_scales",
    "dtypes.Encoded.fitted_scaling",
    "dtypes.Encoded.fitted_tensor_scale",
)
def _encoded(ctx: Ctx) -> list[Case]:
    E, enc = dtypes.Encoded, ctx.enc
    decode = operator.methodcaller("decode")
    base = (enc.data, enc.scale, dtypes.int8, enc.scaling)
    return [
        *sweep(
            "Encoded(...).decode()",
            E,
            base,
            None,
            {0: "value", 1: "value", 2: "value", 3: "value"},
            then=decode,
        ),
        *sweep(
            "repr(Encoded)",
            E,
            (enc.data, None, dtypes.float32, None),
            None,
            {0: "value"},
            then=repr,
            auto=False,
        ),
        *sweep(
            "Tensor.from_encoded(Encoded)",
            E,
            base,
            None,
            {0: "value", 1: "value"},
            then=precision.Tensor.from_encoded,
            auto=False,
        ),
        *sweep("enc.decode", enc.decode, (), None, {"dtype": "option"}),
        *sweep("enc.group_scales", enc.group_scales),
        *sweep(
            "Encoded.fitted_scaling",
            E.fitted_scaling,
            (dtypes.int8, enc.scaling, None, enc.data, enc.scale),
        ),
        *sweep(
            "Encoded.fitted_tensor_scale",
            E.fitted_tensor_scale,
            (None, enc.scale),
            None,
            {0: "value"},
        ),
    ]


@group(
    "dtypes.IntFormat.host",
    "dtypes.Format.host_rule",
    "dtypes.Format.host_absmax",
    "dtypes.Format.host_codes",
    "dtypes.Format.host_scales",
)
def _int_host(ctx: Ctx) -> list[Case]:
    int8, x = dtypes.int8, np.ones((2, 4), np.float32)
    absmax = np.float32([[1.0], [0.0]])
    return [
        *sweep(
            "int8.host_rule",
            int8.host_rule,
            (dtypes.PerAxis(0), "nearest_even"),
            None,
            {0: "option", 1: "option"},
        ),
        *sweep("int8.host_absmax", int8.host_absmax, (absmax,), None, {0: "value"}),
        *sweep(
            "int8.host_codes",
            int8.host_codes,
            (x, absmax),
            {"out": np.empty_like(x)},
            {0: "value", 1: "value", "out": "value"},
        ),
        *sweep("int8.host_scales", int8.host_scales, (absmax,), None, {0: "value"}),
    ]


@group("dtypes.is_tracer")
def _is_tracer(ctx: Ctx) -> list[Case]:
    return sweep("is_tracer", dtypes.is_tracer, (np.ones(2),), None, {0: "value"})


@group("dtypes.computed_once")
def _computed_once(ctx: Ctx) -> list[Case]:
    return sweep(
        "computed_once",
        dtypes.computed_once,
        (lambda a: a * 2, np.ones(4, np.float32)),
        None,
        {0: "scalar", 1: "value"},
    )


@group("dtypes.astype")
def _astype(ctx: Ctx) -> list[Case]:
    return sweep(
        "astype", dtypes.astype, (np.ones(4, np.float32), jnp.float8_e4m3fn), None,
        {0: "value", 1: "scalar"},
    )  # fmt: skip


@group("dtypes.from_codes")
def _from_codes(ctx: Ctx) -> list[Case]:
    codes = np.zeros((2, 4), np.int8)
    return [
        *sweep(
            "from_codes",
            dtypes.from_codes,
            (codes, 1.0, "int8", dtypes.PerTensor()),
            None,
            {0: "value", 1: "value", 2: "value", 3: "value"},
            skip=("zero_point",),
        ),
        *sweep(
            "from_codes[uint8]",
            dtypes.from_codes,
            (codes.astype(np.uint8), 1.0, "uint8", dtypes.PerTensor()),
            {"zero_point": 0},
            {"zero_point": "value"},
            auto=False,
        ),
    ]


# ---- precision.Tensor


@group("precision.Tensor", "precision.Tensor", "precision.Tensor.from_encoded")
def _tensor_constructors(ctx: Ctx) -> list[Case]:
    T = precision.Tensor
    return [
        *sweep("Tensor", T, (ctx.sample,), None, {0: "value", "dtype": "value"}),
        *sweep(
            "Tensor.from_encoded", T.from_encoded, (ctx.enc,), None, {0: "value", "dtype": "value"}
        ),
    ]


@group(
    "precision.Tensor.methods",
    *(
        f"precision.Tensor.{m}"
        for m in (
            "to_reduced_precision",
            "toReducedPrecision",
            "reshape",
            "sum",
            "max",
            "min",
            "mean",
            "argmax",
            "argmin",
            "transpose",
            "astype",
            "to_device",
            "item",
            "numpy",
            "signature",
            "to_full_precision",
            "toFullPrecision",
            "check_holds_arrays",
        )
    ),
)
def _tensor_methods(ctx: Ctx) -> list[Case]:
    cases: list[Case] = []
    dev = jax.devices()[0]
    for tn, t in ctx.tensors.items():

        def sw(name: str, *a: Any, key: str = "", **kw: Any) -> list[Case]:
            return sweep(f"{tn}.{name}", *a, key=f"Tensor.{key or name}", **kw)  # noqa: B023

        cases += sw("to_reduced_precision", t.to_reduced_precision, ("int8",))
        cases += sw(
            "to_reduced_precision[stochastic]",
            t.to_reduced_precision,
            ("bfloat16",),
            {"rounding": "stochastic", "key": ctx.key},
            {"key": "option"},
            auto=False,
        )
        cases += sw(
            "toReducedPrecision", t.toReducedPrecision, ("int8",), None, {0: "scalar"}, auto=False
        )
        cases += sw("reshape", t.reshape, (64,), None, {0: "shape"}, key="reshape(n)")
        cases += sw(
            "reshape", t.reshape, (2, 32), None, {0: "shape", 1: "shape"}, key="reshape(*n)"
        )
        cases += sw("reshape(tuple)", t.reshape, ((2, 32),), None, {0: "shape"})
        for m in ("sum", "max", "min", "mean", "argmax", "argmin"):
            cases += sw(m, getattr(t, m), key="reduce")
        cases += sw("transpose", t.transpose, (1, 0), None, {0: "scalar"})
        cases += sw("transpose(tuple)", t.transpose, ((1, 0),), None, {0: "shape"})
        cases += sw("astype", t.astype, (np.float32,), None, {0: "value"})
        cases += sw("to_device", t.to_device, (dev,))
        cases += sw("check_holds_arrays", t.check_holds_arrays, ("x",))
        for m in ("numpy", "signature", "to_full_precision", "toFullPrecision"):
            cases += sw(m, getattr(t, m), key="nullary")
        cases += sw("[0].item", t.__getitem__, ((0, 0),), then=lambda r: r.item(), auto=False)
    return cases


_BINOPS = (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "matmul",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
)


@group("precision.Tensor.operators")
def _tensor_operators(ctx: Ctx) -> list[Case]:
    cases: list[Case] = []
    for tn, t in ctx.tensors.items():
        for op in _BINOPS:
            f = getattr(operator, op)
            kind = "value" if op in ("add", "matmul", "eq") else "scalar"
            u = t.T if op == "matmul" else t  # a valid baseline: (2, 32) @ (32, 2)
            cases += sweep(f"{tn} {op} _", f, (t, u), None, {1: kind}, auto=False, key=f"op.{op}")
            cases += sweep(f"_ {op} {tn}", f, (u, t), None, {0: kind}, auto=False, key=f"rop.{op}")
        cases += sweep(
            f"{tn}[_]", operator.getitem, (t, 0), None, {1: "value"}, auto=False, key="getitem"
        )
        cases += sweep(
            f"{tn}[0,_]",
            lambda t, i: t[0, i],
            (t, 0),
            None,
            {1: "scalar"},
            auto=False,
            key="getitem2",
        )
    return cases


@group("precision.Tensor.specials")
def _tensor_specials(ctx: Ctx) -> list[Case]:
    import copy

    import precision.numpy as pnp

    items: list[tuple[str, Callable[[], Any]]] = []
    for tn, t in ctx.tensors.items():

        def add(label: str, f: Callable[..., Any], *extra: Any) -> None:
            items.append((label.format(t=tn), functools.partial(f, t, *extra)))  # noqa: B023

        add("{t}.item()", lambda t: t.item())
        for idx in (5, -3, 2**63, None, (slice(None), 40), (0, 0, 0), (Ellipsis, None, Ellipsis)):
            add(f"{{t}}[{idx!r}]", operator.getitem, idx)
        add("{t}[bool mask]", lambda t: t[np.array([True, False])])
        add("{t}[wrong bool mask]", lambda t: t[np.array([True, False, True])])
        add("{t}[float index array]", lambda t: t[np.array([0.5])])
        add("{t}[int array out of bounds]", lambda t: t[np.array([5])])
        add("{t}[jnp int array out of bounds]", lambda t: t[jnp.array([5])])
        for axes in ((0, 0), (0, 5), (1, 0, 2), ([],)):
            add(f"{{t}}.transpose{axes}", lambda t, a: t.transpose(*a), axes)
        for axis in (5, (0, 0)):
            add(f"{{t}}.sum(axis={axis})", lambda t, a: t.sum(axis=a), axis)
        add("{t}.argmax(axis=(0,1))", lambda t: t.argmax(axis=(0, 1)))
        for shape in ((3, -1), (-1, -1), (65,)):
            add(f"{{t}}.reshape{shape}", lambda t, s: t.reshape(*s), shape)
        for dt in (np.int8, bool, np.complex64, np.float64, dtypes.bfloat16):
            add(f"{{t}}.astype({getattr(dt, '__name__', dt)})", lambda t, d: t.astype(d), dt)
        for fmt, sc, make in (
            ("float64", "None", lambda: None),
            ("float8_e8m0fnu", "None", lambda: None),
            ("int8", "PerAxis(5)", lambda: dtypes.PerAxis(5)),
            ("bfloat16", "PerTensor()", dtypes.PerTensor),
            ("mxfp4", "PerAxis(0)", dtypes.PerAxis),
            ("int8", "PerBlock(e8m0)", lambda: dtypes.PerBlock(32, scale_format="float8_e8m0fnu")),
        ):
            add(
                f"{{t}}.to_reduced_precision({fmt}, scaling={sc})",
                lambda t, f, m: t.to_reduced_precision(f, scaling=m()),
                fmt,
                make,
            )
        add(
            "{t}.to_reduced_precision(nf4, rounding=up)",
            lambda t: t.to_reduced_precision("nf4", rounding="up"),
        )
        for on, other in (
            ("complex", jnp.ones((2, 32), jnp.complex64)),
            ("int32", jnp.ones((2, 32), jnp.int32)),
            ("f64 numpy", np.ones((2, 32))),
            ("wrong shape", jnp.ones((3, 5))),
        ):
            add(f"{{t}} + <{on}>", operator.add, other)
        add("{t} @ {t}", lambda t: t @ t)
        add("{t} @ {t}.T", lambda t: t @ t.T)
        for op in ("truediv", "floordiv", "mod"):
            add(f"{{t}} {op} 0", getattr(operator, op), 0)
        for f in (
            bool,
            float,
            int,
            len,
            list,
            hash,
            np.asarray,
            jnp.asarray,
            jnp.sin,
            pnp.sin,
            copy.deepcopy,
        ):
            add(f"{getattr(f, '__name__', f)}({{t}})", f)
        add("pnp.matmul({t}, 'abc')", pnp.matmul, "abc")
        add("pickle({t})", lambda t: pickle.loads(pickle.dumps(t)))
        add("jit(sum)({t})", lambda t: jax.jit(lambda a: a.sum())(t))
        add("jit(getitem)({t}, 5)", lambda t: jax.jit(lambda a, i: a[i])(t, 5))
        add("jit(reshape(3,-1))({t})", lambda t: jax.jit(lambda a: a.reshape(3, -1))(t))
        add("grad(sum)({t})", lambda t: jax.grad(lambda a: a.sum())(t))
        add("vmap(sum)({t})", lambda t: jax.vmap(lambda a: a.sum())(t))
    items.append(("pnp.sin('abc')", functools.partial(pnp.sin, "abc")))
    return specials("Tensor.specials", items)


@group("precision.Tensor.jit")
def _tensor_jit(ctx: Ctx) -> list[Case]:
    T = precision.Tensor
    items = []
    for vn in (*JIT_ARRAYS, "int64huge"):
        v = _arrays()[vn]
        for f in ["int8", "bfloat16", "mxfp4", "nf4", "uint4", "float8_e4m3fn", "float8_e8m0fnu"]:

            def rt(a: Any, f: str) -> Any:
                return T(a).to_reduced_precision(f).to_full_precision()

            items.append(
                (
                    f"jit Tensor({vn}).to_reduced_precision({f})",
                    functools.partial(lambda a, f: jax.jit(functools.partial(rt, f=f))(a), v, f),
                )
            )
            items.append((f"Tensor({vn}).to_reduced_precision({f})", functools.partial(rt, v, f)))
    return specials("Tensor.jit", items)


# ---- precision functions


def _simple(
    name: str, fn_name: str, args: Callable[[Ctx], tuple], slots: dict | None = None, **kw: Any
) -> None:
    def build(ctx: Ctx) -> list[Case]:
        return sweep(name, getattr(precision, fn_name), args(ctx), None, slots, **kw)

    group(name)(build)


_simple("precision.all_finite", "all_finite", lambda c: (c.weights,), {0: "value"})
_simple("precision.to_full_precision", "to_full_precision", lambda c: (c.weights,), {0: "value"})
_simple(
    "precision.is_reduced_precision", "is_reduced_precision", lambda c: (c.weights,), {0: "value"}
)
_simple("precision.tree_nbytes", "tree_nbytes", lambda c: (c.weights,), {0: "value"})
_simple(
    "precision.select_tree",
    "select_tree",
    lambda c: (True, c.weights, c.weights),
    {0: "value", 1: "value", 2: "value"},
)
_simple(
    "precision.device_put", "device_put", lambda c: (c.weights, None), {0: "value", 1: "scalar"}
)
_simple(
    "precision.storage_shardings",
    "storage_shardings",
    lambda c: (c.weights, jax.tree.map(lambda _: c.sharding, c.weights)),
    {0: "value", 1: "value"},
)
_simple("precision.get_default_format", "get_default_format", lambda c: ())
_simple(
    "precision.default_format",
    "default_format",
    lambda c: ("bfloat16",),
    {0: "scalar"},
    then=_entered,
)
_simple(
    "precision.apply_updates",
    "apply_updates",
    lambda c: (c.weights, c.weights),
    {0: "value", 1: "value"},
)


@group("precision.to_reduced_precision")
def _to_reduced(ctx: Ctx) -> list[Case]:
    f, w = precision.to_reduced_precision, ctx.weights
    return [
        *sweep("to_reduced_precision", f, (w, "int8"), None, {0: "value"}),
        *sweep(
            "to_reduced_precision[stochastic]",
            f,
            (w, "bfloat16"),
            {"rounding": "stochastic", "key": ctx.key},
            {"key": "option"},
            auto=False,
        ),
    ]


@group("precision.quantize")
def _quantize(ctx: Ctx) -> list[Case]:
    return sweep("quantize", precision.quantize, ({"w": jnp.ones((4, 64))},), None, {0: "value"})


@group("precision.scales_per_layer")
def _scales_per_layer(ctx: Ctx) -> list[Case]:
    q = precision.to_reduced_precision(
        {"w": jnp.ones((4, 8, 32))}, "int8", scaling=dtypes.PerAxis(0)
    )
    return sweep("scales_per_layer", precision.scales_per_layer, (q,), None, {0: "value"})


@group("precision.apply_updates[stochastic]")
def _apply_updates_stochastic(ctx: Ctx) -> list[Case]:
    wb = precision.to_reduced_precision(ctx.weights, "bfloat16")
    return sweep(
        "apply_updates[stochastic]",
        precision.apply_updates,
        (wb, ctx.weights),
        {"rounding": "stochastic", "key": ctx.key},
        {"key": "option"},
        auto=False,
    )


@group("precision.apply")
def _apply(ctx: Ctx) -> list[Case]:
    x = ctx.sample

    def call(wrapper: Any) -> Any:
        return wrapper(x)

    return [
        *sweep("apply", precision.apply, (lambda a: a * 2,), None, {0: "value"}, then=call),
        *sweep("apply(_)", precision.apply, (lambda a: a * 2,), None, {0: "value"}, auto=False),
    ]


@group("precision.explain")
def _explain(ctx: Ctx) -> list[Case]:
    return sweep(
        "explain", precision.explain, (lambda a: a * 2, ctx.sample), None, {0: "value", 1: "value"}
    )


@group("precision.calibrate")
def _calibrate(ctx: Ctx) -> list[Case]:
    w, x = {"w": jnp.asarray(ctx.sample)}, jnp.asarray(ctx.sample)
    return sweep(
        "calibrate",
        precision.calibrate,
        (ctx.matmul_fn(), w, [x]),
        None,
        {0: "scalar", 1: "value", 2: "value"},
        skip=("progress",),
    ) + sweep(
        "calibrate",
        precision.calibrate,
        (ctx.matmul_fn(), w, [x]),
        {"progress": False},
        {"progress": "scalar"},
        auto=False,
    )


@group(
    "precision.Policy",
    "precision.Policy",
    "precision.Policy.parse",
    "precision.Policy.with_output",
    "precision.Policy.cast_to_compute",
    "precision.Policy.cast_to_output",
    "precision.Policy.cast_to_param",
)
def _policy(ctx: Ctx) -> list[Case]:
    P = precision.Policy
    p = P.parse("p=float32,c=bfloat16,o=float32")
    return [
        *sweep("Policy", P),
        *sweep("Policy.parse", P.parse, ("c=bfloat16",), None, {0: "value"}),
        *sweep("policy.with_output", p.with_output, ("bfloat16",)),
        *(
            c
            for m in ("cast_to_compute", "cast_to_output", "cast_to_param")
            for c in sweep(
                f"policy.{m}", getattr(p, m), (ctx.weights,), None, {0: "value"}, key="policy.cast"
            )
        ),
        *specials(
            "Policy",
            [("policy.cast_to_compute({'a': 'abc'})", lambda: p.cast_to_compute({"a": "abc"}))],
        ),
    ]


@group("precision.Contract", "precision.Contract", "precision.Contract.describe")
def _contract(ctx: Ctx) -> list[Case]:
    C = precision.Contract
    return [
        *sweep("Contract", C, ("int8",), None, {0: "value"}),
        *sweep("Contract(float8)", C, ("float8_e4m3fn",), None, {"backward": "scalar"}, auto=False),
        *sweep("contract.describe", C("int8").describe),
    ]


@group(
    "precision.loss_scales",
    *(
        f"precision.{c}{m}"
        for c in ("StaticLossScale", "DynamicLossScale", "NoOpLossScale")
        for m in ("", ".scale", ".unscale", ".adjust")
    ),
)
def _loss_scales(ctx: Ctx) -> list[Case]:
    P = precision
    cases = [
        *sweep("StaticLossScale", P.StaticLossScale, (2.0,), None, {0: "value"}),
        *sweep("DynamicLossScale", P.DynamicLossScale, (2.0,), None, {0: "value"}),
        *sweep("NoOpLossScale", P.NoOpLossScale),
    ]
    for name, ls in (
        ("static", P.StaticLossScale(2.0)),
        ("dynamic", P.DynamicLossScale(2.0)),
        ("noop", P.NoOpLossScale()),
    ):
        cases += sweep(
            f"{name}.scale", ls.scale, (ctx.weights,), None, {0: "value"}, key="ls.scale"
        )
        cases += sweep(
            f"{name}.unscale", ls.unscale, (ctx.weights,), None, {0: "value"}, key="ls.unscale"
        )
        cases += sweep(
            f"{name}.adjust", ls.adjust, (jnp.bool_(True),), None, {0: "value"}, key="ls.adjust"
        )
    return cases


@group("precision.Explanation", "precision.Explanation", "precision.Explanation.to_json")
def _explanation(ctx: Ctx) -> list[Case]:
    def show(e: Any) -> Any:
        return e.to_json(), str(e)

    return sweep("Explanation", precision.Explanation, ("cpu", (), 0, 0, 0), then=show)


# ---- save and load


def _write_raw(path: Path, header: bytes, body: bytes = b"") -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + body)
    return path


@group("precision.load")
def _load(ctx: Ctx) -> list[Case]:
    tmp, load = ctx.tmp, precision.load
    cases = [
        *sweep("load", load, (ctx.checkpoint,), None, {0: "value"}),
        *sweep("load(<dir>)", load, (str(tmp),), None, {}, auto=False, baseline=False),
    ]
    w16 = b'"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}'
    damaged = {
        "empty": (b"", None),
        "huge header": (struct.pack("<Q", 2**62) + b"{}", None),
        "big shape": (
            b'{"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,16]}}',
            16,
        ),
        "negative shape": (b'{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,16]}}', 16),
        "bad offsets": (b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}}', 16),
        "bad metadata": (b"{" + w16 + b',"__metadata__":{"precision":"{garbage"}}', 16),
        "header list": (b"[1,2,3]", 0),
        "bad dtype": (b'{"w":{"dtype":"XX","shape":[4],"data_offsets":[0,16]}}', 16),
        "overlapping": (
            b"{" + w16 + b',"w.__scale":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}',
            16,
        ),
        "metadata int": (b"{" + w16 + b', "__metadata__": 5}', 16),
        "bad utf8": (b"{" + w16 + b"}\xff", 16),
        "truncated": (b"{" + w16 + b"}", 8),
        "not a checkpoint": (b"hello, this is text", None),
    }
    items = []
    for i, (what, (header, body)) in enumerate(damaged.items()):
        path = tmp / f"damaged{i}.safetensors"
        if body is None:
            path.write_bytes(header)
        else:
            _write_raw(path, header, b"\0" * body)
        items.append((f"load(<{what}>)", functools.partial(load, path)))
    refusals = specials("load.damaged", items, always=True, refuse=True)
    others = specials(
        "load",
        [
            ("load(<missing file>)", functools.partial(load, tmp / "missing.safetensors")),
            ("load(/dev/null)", functools.partial(load, "/dev/null")),
        ],
        always=True,
    )
    return cases + refusals + others


@group("precision.save")
def _save(ctx: Ctx) -> list[Case]:
    tmp, save, w = ctx.tmp, precision.save, ctx.weights
    ro = tmp / "ro"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    trees = {
        "empty tree": {},
        "nan": {"a": np.array([NAN])},
        "0-d": {"a": np.float32(1)},
        "python int": {"a": 3},
        "complex": {"a": np.ones(2, np.complex64)},
        "list tree": [np.ones(2), np.ones(3)],
        "None leaf": {"a": None, "b": np.ones(2)},
        "dotted key": {"a.b": np.ones(2)},
        "empty key": {"": np.ones(2)},
        "__metadata__ key": {"__metadata__": np.ones(2)},
        "object leaf": {"a": object()},
        "str leaf": {"a": "abc"},
        "object array": {"a": _arrays()["objarr"]},
    }
    items = [
        (f"save(<{k}>)", functools.partial(save, tmp / f"t{i}.safetensors", v, overwrite=True))
        for i, (k, v) in enumerate(trees.items())
    ]
    items += [
        ("save(<missing dir>)", functools.partial(save, tmp / "nope" / "x.safetensors", w)),
        ("save(<read-only dir>)", functools.partial(save, ro / "x.safetensors", w)),
        ("save(<a directory>)", functools.partial(save, tmp, w)),
        ("save(<existing, overwrite=False>)", functools.partial(save, ctx.checkpoint, w)),
    ]
    return [
        *sweep(
            "save", save, (tmp / "s.safetensors", w), {"overwrite": True}, {0: "value", 1: "value"}
        ),
        *sweep(
            "save(overwrite)",
            save,
            (tmp / "o.safetensors", w),
            {"overwrite": True},
            {"overwrite": "scalar"},
            auto=False,
        ),
        *specials("save", items),
    ]


# ---- precision.testing


@group(
    "precision.testing",
    *(
        f"precision.testing.{n}"
        for n in (
            "ulp_distance",
            "assert_ulp_close",
            "assert_representable",
            "error_report",
            "relative_error",
            "sqnr_db",
            "ErrorReport",
        )
    ),
)
def _testing_functions(ctx: Ctx) -> list[Case]:
    import precision.testing as pt

    s = ctx.sample
    items = [
        ("ulp_distance(nan, nan, bf16)", lambda: pt.ulp_distance(NAN, NAN, "bfloat16")),
        ("ulp_distance(inf, 1, bf16)", lambda: pt.ulp_distance(INF, 1.0, "bfloat16")),
        ("assert_ulp_close(nan, 1, bf16)", lambda: pt.assert_ulp_close(NAN, 1.0, "bfloat16")),
        ("sqnr_db(zeros, zeros)", lambda: pt.sqnr_db(np.zeros(4), np.zeros(4))),
        ("error_report(empty, empty)", lambda: pt.error_report(np.zeros(0), np.zeros(0))),
    ]
    for fmt, scale in (
        ("int8", None),
        ("mxfp4", None),
        ("float8_e8m0fnu", None),
        ("nf4", 1.0),
        ("uint4", 1.0),
        ("int8", 0.0),
        ("int8", NAN),
        ("int8", -1.0),
        ("bfloat16", 2.0),
    ):
        items.append(
            (
                f"ulp_distance([1],[0.5],{fmt},scale={scale})",
                functools.partial(pt.ulp_distance, [1.0], [0.5], fmt, scale=scale),
            )
        )
    return [
        *sweep(
            "ulp_distance",
            pt.ulp_distance,
            ([1.0], [1.0], "bfloat16"),
            None,
            {0: "value", 1: "value", 2: "value"},
        ),
        *sweep(
            "ulp_distance[int8]",
            pt.ulp_distance,
            ([1.0], [1.0], "int8"),
            {"scale": 1.0},
            {"scale": "value"},
            auto=False,
        ),
        *sweep(
            "assert_ulp_close",
            pt.assert_ulp_close,
            ([1.0], [1.0], "bfloat16"),
            None,
            {0: "value", 1: "value", 2: "value", "max_ulps": "value"},
        ),
        *sweep(
            "assert_representable",
            pt.assert_representable,
            ([1.0], "bfloat16"),
            None,
            {0: "value", 1: "value", "scaling": "value"},
        ),
        *sweep("error_report", pt.error_report, (s, s), None, {0: "value", 1: "value", 2: "value"}),
        *sweep("relative_error", pt.relative_error, (s, s), None, {0: "value", 1: "value"}),
        *sweep("sqnr_db", pt.sqnr_db, (s, s), None, {0: "value", 1: "value"}),
        *sweep("ErrorReport", pt.ErrorReport, (1, 0.0, 0.0, 0.0, 0.0, 0.0), None, {}, auto=False),
        *specials("testing", items),
    ]


@group(
    "precision.testing.strategies",
    *(
        f"precision.testing.{n}"
        for n in (
            "arrays",
            "tensors",
            "values",
            "representable",
            "formats",
            "scalings",
            "keys",
            "roundings",
        )
    ),
)
def _testing_strategies(ctx: Ctx) -> list[Case]:
    import precision.testing as pt

    def sw(name: str, *a: Any, **kw: Any) -> list[Case]:
        return sweep(name, *a, then=draw, **kw)

    return [
        *sw("arrays", pt.arrays, ("bfloat16", (4,)), None, {0: "scalar", 1: "shape"}),
        *sw(
            "tensors",
            pt.tensors,
            ("int8", (4,), None),
            None,
            {0: "scalar", 1: "shape", 2: "scalar"},
        ),
        *sw("values", pt.values, ("bfloat16",)),
        *sw("representable", pt.representable, ("bfloat16",)),
        *sw("formats", pt.formats),
        *sw("scalings", pt.scalings, (dtypes.int8,)),
        *sw("keys", pt.keys),
        *sw("roundings", pt.roundings),
    ]


# ---- precision.optax


@group(
    "precision.optax",
    "precision.optax.ParamsLayout.of",
    "precision.optax.ParamsLayout.check",
    *(
        f"precision.optax.{n}"
        for n in (
            "reduced_state",
            "loss_scaling",
            "scale_loss",
            "LossScalingState",
            "ParamsLayout",
            "ReducedState",
        )
    ),
)
def _optax(ctx: Ctx) -> list[Case]:
    import optax

    import precision.optax as po

    adam = optax.adam(1e-3)
    params = {"w": jnp.ones(4)}
    ls = po.loss_scaling(adam, precision.DynamicLossScale(2.0))
    state = ls.init(params)

    def init(tx: Any) -> Any:
        return tx.init(params)

    items = [
        (
            "reduced_state(adam, mu=float8_e8m0fnu).init",
            lambda: po.reduced_state(adam, mu="float8_e8m0fnu").init(params),
        ),
        (
            "reduced_state(adam, mu=float64).init",
            lambda: po.reduced_state(adam, mu="float64").init(params),
        ),
        ("reduced_state(sgd).init", lambda: po.reduced_state(optax.sgd(1e-3)).init(params)),
        (
            "reduced_state(adam).init(int params)",
            lambda: po.reduced_state(adam).init({"w": jnp.ones(4, jnp.int32)}),
        ),
    ]
    return [
        *sweep("reduced_state", po.reduced_state, (adam,), None, {0: "scalar"}, then=init),
        *sweep(
            "loss_scaling",
            po.loss_scaling,
            (adam, precision.DynamicLossScale(2.0)),
            None,
            {0: "scalar", 1: "value"},
            then=init,
        ),
        *sweep("loss_scaling(adam).init", ls.init, (params,), None, {0: "value"}),
        *sweep(
            "loss_scaling(adam).update",
            ls.update,
            (params, state, params),
            None,
            {0: "value", 1: "scalar", 2: "value"},
            auto=False,
        ),
        *sweep("scale_loss", po.scale_loss, (state, 1.0), None, {0: "value", 1: "value"}),
        *sweep("ParamsLayout", po.ParamsLayout, (None, ()), None, {}, auto=False),
        *sweep("ParamsLayout.of", po.ParamsLayout.of, (params,), None, {0: "value"}),
        *sweep(
            "layout.check", po.ParamsLayout.of(params).check, (params, "params"), None, {0: "value"}
        ),
        *sweep(
            "LossScalingState",
            po.LossScalingState,
            (None, precision.NoOpLossScale()),
            None,
            {},
            auto=False,
        ),
        *sweep("ReducedState", po.ReducedState, (None,), None, {}, auto=False),
        *specials("optax", items),
    ]


# ---------------------------------------------------------------------------- coverage

# Public callables deliberately not swept, with the reason.
EXEMPT: dict[str, str] = {
    "precision.ContractLike": "a typing alias, not a callable",
    "precision.FormatLike": "a typing alias, not a callable",
    "precision.PolicyLike": "a typing alias, not a callable",
}
_PROTOCOL_METHODS = {
    "tree_flatten",
    "tree_unflatten",
    "tree_flatten_with_keys",
}  # JAX's pytree protocol


def _public_api() -> set[str]:
    import precision.optax
    import precision.testing

    names: set[str] = set()
    for mod in (precision, precision.testing, precision.optax, dtypes):
        for n in mod.__all__:
            obj = getattr(mod, n)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                continue
            if not (inspect.isfunction(obj) or isinstance(obj, type)):
                continue
            names.add(f"{mod.__name__}.{n}")
            if not isinstance(obj, type):
                continue
            owner = f"{mod.__name__}.{n}"
            if issubclass(obj, dtypes.Format):
                owner = "dtypes.Format"
            elif issubclass(obj, dtypes.Scaling):
                owner = "dtypes.Scaling"
            for attr, value in inspect.getmembers(obj):
                if attr.startswith("_") or attr in _PROTOCOL_METHODS:
                    continue
                static = inspect.getattr_static(obj, attr)
                if isinstance(static, property | functools.cached_property):
                    continue
                if not callable(value) or getattr(value, "__module__", None) in (None, "builtins"):
                    continue
                if inspect.isclass(value):
                    continue
                names.add(f"{owner}.{attr}")
    return names


def test_every_public_callable_has_a_recipe() -> None:
    covered = {c for cs in COVERS.values() for c in cs}
    missing = sorted(_public_api() - covered - set(EXEMPT))
    assert not missing, (
        "public callables without a bad-input recipe (add one to a group): " + ", ".join(missing)
    )


# ---------------------------------------------------------------------------- the sweep


@pytest.mark.parametrize("name", list(GROUPS))
def test_bad_input(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # bad paths ("abc", b"abc") land in the temporary directory
    ctx = Ctx(tmp_path)
    cases = select(GROUPS[name](ctx))
    failures = [f for f in (run_case(c, name) for c in cases) if f is not None]
    if failures:
        pytest.fail(f"{len(failures)} of {len(cases)} calls leaked:\n" + "\n".join(failures), False)


# ---------------------------------------------------------------------------- 64-bit JAX


def _x64_cases(tmp: Path) -> list[Case]:
    x64 = np.linspace(-1, 1, 64).reshape(2, 32)
    items: list[tuple[str, Callable[[], Any]]] = []
    names = [
        "float64",
        "float32",
        "bfloat16",
        "int8",
        "int4",
        "mxfp4",
        "nf4",
        "uint8",
        "float8_e8m0fnu",
        "nvfp4",
    ]
    for n in names:
        fmt = dtypes.get(n)
        x = np.abs(x64) + 0.5 if fmt.kind == "scale" else x64
        items += [
            (f"x64 {n}.round(f64)", functools.partial(fmt.round, x)),
            (
                f"x64 {n}.encode(f64).decode(f64)",
                functools.partial(lambda f, y: f.encode(y).decode(np.float64), fmt, x),
            ),
            (f"x64 {n}.round(±1e300)", functools.partial(fmt.round, np.array([1e300, -1e300]))),
            (f"x64 {n}.round(5e-324)", functools.partial(fmt.round, np.array([5e-324, 1.0]))),
            (
                f"x64 jit({n}.round)(f64)",
                functools.partial(lambda f, y: jax.jit(f.round)(y), fmt, x),
            ),
            (
                f"x64 {n}.round(int64 2**62)",
                functools.partial(fmt.round, np.array([2**62, -(2**62)])),
            ),
            (
                f"x64 Tensor(f64).to_reduced_precision({n})",
                functools.partial(
                    lambda y, f: (
                        precision.Tensor(y, dtype=np.float64)
                        .to_reduced_precision(f)
                        .to_full_precision()
                    ),
                    x,
                    n,
                ),
            ),
            (f"x64 {n}.result_dtype(f64)", functools.partial(fmt.result_dtype, np.float64)),
        ]
    key, P = jax.random.key(0), precision
    path = tmp / "x64.safetensors"
    items += [
        (
            "x64 float64.round stochastic",
            lambda: dtypes.float64.round(x64, rounding="stochastic", key=key),
        ),
        (
            "x64 float32.round(f64) stochastic",
            lambda: dtypes.float32.round(x64, rounding="stochastic", key=key),
        ),
        ("x64 Tensor(f64).sum()", lambda: P.Tensor(x64, dtype=np.float64).sum()),
        (
            "x64 select_tree(int64)",
            lambda: P.select_tree(True, {"a": np.array([2**40])}, {"a": np.array([0])}),
        ),
        ("x64 all_finite(1e300)", lambda: P.all_finite({"a": np.array([1e300])})),
        ("x64 StaticLossScale(1e300)", lambda: P.StaticLossScale(1e300)),
        (
            "x64 apply_updates(f64)",
            lambda: P.apply_updates({"w": np.array([1.0])}, {"w": np.array([1e-17])}),
        ),
        (
            "x64 apply_updates(bf16, f64 update, stochastic)",
            lambda: P.apply_updates(
                P.to_reduced_precision({"w": jnp.ones(4)}, "bfloat16"),
                {"w": np.ones(4) * 1e-3},
                rounding="stochastic",
                key=key,
            ),
        ),
        (
            "x64 ulp_distance(f64)",
            lambda: __import__("precision.testing").testing.ulp_distance(
                np.array([1.0]), np.array([1.0 + 2**-52]), "float64"
            ),
        ),
        (
            "x64 save/load(f64)",
            lambda: P.load(P.save(path, {"a": np.ones(2)}, overwrite=True) or path),
        ),
        (
            "x64 Policy(p=float64).cast_to_param",
            lambda: P.Policy.parse("p=float64").cast_to_param({"w": jnp.ones(2)}),
        ),
        (
            "x64 apply(compute=float64)",
            lambda: P.apply(lambda a: a * 2, compute="float64")(P.Tensor(x64, dtype=np.float64)),
        ),
        ("x64 quantize(f64 tree)", lambda: P.quantize({"w": np.ones((4, 64))})),
        (
            "x64 DynamicLossScale.adjust(False)",
            lambda: P.DynamicLossScale(2.0).adjust(jnp.bool_(False)),
        ),
    ]
    return specials("x64", items)


def _x64_main(tmp: str) -> None:
    """Entry point of the 64-bit subprocess: prints the failures as JSON."""
    cases = select(_x64_cases(Path(tmp)))
    failures = [f for f in (run_case(c, "x64") for c in cases) if f is not None]
    print(json.dumps({"ran": len(cases), "failures": failures}))


def test_bad_input_x64(tmp_path: Path) -> None:
    """float64 paths need `jax_enable_x64`, which a process sets once: run them in a child."""
    boot = (
        "import importlib.util, sys, jax\n"
        "jax.config.update('jax_enable_x64', True)\n"
        f"spec = importlib.util.spec_from_file_location('bad_input_sweep_x64', {THIS_FILE!r})\n"
        "m = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "m._x64_main(sys.argv[1])\n"
    )
    root = os.path.dirname(os.path.dirname(THIS_FILE))
    proc = subprocess.run(
        [sys.executable, "-c", boot, str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    failures = report["failures"]
    if failures:
        pytest.fail(
            f"{len(failures)} of {report['ran']} calls leaked:\n" + "\n".join(failures), False
        )
