"""The table of wrong calls: every public function refuses bad input the same way.

One row per wrong call: the call (given a fresh temporary directory), the
exception class it must raise, and text the message must contain: the value
received and the fix. Every row also checks what holds for all of them: the
exception is a `precision.PrecisionError` and the builtin users already
catch (`ValueError` or `TypeError`), so `except ValueError:` keeps working.

Add a row here for every new argument check; the command line has its own
table in tests/precision/test_cli.py.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dtypes
import precision
import precision.numpy
from precision import CheckpointError, DynamicLossScale, StaticLossScale, select_tree
from precision._errors import (
    KitError,
    LossScaleError,
    LossScaleTypeError,
    SaveError,
    SaveTypeError,
    SelectionWarning,
)
from precision.testing._plugin import selected_formats

NAN = float("nan")
INF = float("inf")
W = {"w": jnp.ones((4, 128))}


def _not_a_checkpoint(tmp: Path) -> Any:
    path = tmp / "notes.txt"
    path.write_bytes(b"hello, this is text and not a checkpoint")
    return precision.load(path)


def _save(tree: Any, **kwargs: Any) -> Callable[[Path], Any]:
    return lambda tmp: precision.save(tmp / "x.safetensors", tree, **kwargs)


def _overwrite_flag(tmp: Path) -> Any:
    precision.save(tmp / "x.safetensors", {"a": np.ones(2)})
    return precision.save(tmp / "x.safetensors", {"a": np.ones(2)}, overwrite="no")


def _hand_built(**change: Any) -> dtypes.Encoded:
    """An int8 encoding of two values with one of its arrays replaced."""
    enc = dtypes.int8.encode(np.array([1.0, -2.0], np.float32))
    parts = {"data": enc.data, "scale": enc.scale, **change}
    return dtypes.Encoded(parts["data"], parts["scale"], enc.format, enc.scaling)


def _hand_built_nvfp4(tensor_scale: Any, name: str = "nvfp4") -> dtypes.Encoded:
    """A two-level (NVFP4) encoding of a (2, 3, 16) stack with its tensor scale replaced."""
    enc = dtypes.get(name).encode(np.ones((2, 3, 16), np.float32))
    return dtypes.Encoded(
        enc.data, enc.scale, enc.format, enc.scaling, 16, tensor_scale=tensor_scale
    )


def _calibrate_batches(batches: Any) -> Any:
    w = {"w": jnp.ones((2, 32))}
    return precision.calibrate(lambda p, x: x @ p["w"].T, w, batches)


def _calibrate(**options: Any) -> Any:
    w = {"w": jnp.ones((2, 32))}
    return precision.calibrate(lambda p, x: x @ p["w"].T, w, [jnp.ones((2, 32))], **options)


def _adam() -> Any:
    import optax

    return optax.adam(1e-2)


def _reduced_state(*args: Any, **kwargs: Any) -> Any:
    from precision.optax import reduced_state

    return reduced_state(*args, **kwargs)


def _reduced_adam() -> Any:
    """`reduced_state(optax.adam)` and a state it built for params {"w": (4, 128)}."""
    tx = _reduced_state(_adam(), mu="bfloat16", nu="int8")
    with jax.numpy_dtype_promotion("standard"):  # optax's own bias correction mixes dtypes
        return tx, tx.init(W)


def _bf16(shape: tuple[int, ...]) -> precision.Tensor:
    return precision.Tensor(jnp.ones(shape)).to_reduced_precision("bfloat16")


def _update(updates: Any, params: Any = None) -> Any:
    tx, state = _reduced_adam()
    return tx.update(updates, state, params)


def _draw(strategy: Any) -> Any:
    """One example of a hypothesis strategy (argument checks may wait for the first draw)."""
    from hypothesis import HealthCheck, given, settings

    drawn = []

    @settings(max_examples=1, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(x: Any) -> None:
        drawn.append(x)

    draw()
    return drawn[0]


# (call, exception class, substrings the message must contain)
WRONG_CALLS = [
    # -- Tensors, apply, trees, policies, updates (precision) ---------------------------
    pytest.param(
        lambda tmp: precision.Tensor("abc"),
        TypeError,
        ["<U3", "pass a float, int or bool array"],
        id="tensor-of-text",
    ),
    pytest.param(
        lambda tmp: precision.Tensor(np.ones(2, np.complex64)),
        TypeError,
        ["complex", "jnp.real(x)"],
        id="tensor-of-complex",
    ),
    pytest.param(
        lambda tmp: precision.Tensor(np.ones(2)).astype("int8"),
        TypeError,
        ["'int8'", "to_reduced_precision('int8')"],
        id="astype-a-format",
    ),
    pytest.param(
        lambda tmp: precision.Tensor(np.ones(2)).to_reduced_precision("int9"),
        precision.FormatError,
        ["'int9'", "int8"],
        id="tensor-unknown-format",
    ),
    pytest.param(
        lambda tmp: precision.apply(jnp.sin, compute="int8"),
        precision.FormatError,
        ["compute='int8'", "storage encoding", 'compute="bfloat16"'],
        id="apply-storage-compute",
    ),
    pytest.param(
        lambda tmp: precision.apply(jnp.sin, policy=3),
        TypeError,
        ["int", "params=float32,compute=bfloat16"],
        id="apply-policy-type",
    ),
    pytest.param(
        lambda tmp: precision.apply(lambda a, b: a + b)(
            precision.Tensor(np.ones(2)).to_reduced_precision("bfloat16"),
            precision.Tensor(np.ones(2)).to_reduced_precision("float16"),
        ),
        precision.PrecisionMismatchError,
        ["bfloat16", "float16", "to_reduced_precision", "to_full_precision"],
        id="apply-two-compute-formats",
    ),
    pytest.param(
        lambda tmp: precision.apply(lambda w, x: x @ w)(
            precision.Tensor(np.ones((2, 2))).to_reduced_precision("int8"),
            precision.Tensor(np.ones((1, 2))).to_reduced_precision("bfloat16"),
        ),
        precision.PrecisionMismatchError,
        ["int8", "bfloat16", 'precision.apply(f, compute="bfloat16")'],
        id="apply-undeclared-narrow-compute",
    ),
    pytest.param(
        lambda tmp: precision.Policy.parse("compute=bf17"),
        precision.PolicyError,
        ["'bf17'", "float32"],
        id="policy-unknown-format",
    ),
    pytest.param(
        lambda tmp: precision.to_reduced_precision({"a": jnp.ones(2)}, "int8", where="("),
        precision.SelectionError,
        ["'('", "regular expression"],
        id="tree-bad-regex",
    ),
    pytest.param(
        lambda tmp: precision.apply_updates({"w": jnp.ones(3)}, {"w": jnp.ones((2, 3))}),
        precision.UpdateError,
        ["['w']", "(2, 3)", "(3,)"],
        id="update-changes-shape",
    ),
    pytest.param(
        lambda tmp: precision.apply_updates({"w": jnp.ones(3)}, {"w": jnp.ones(3)}, rounding="up!"),
        ValueError,
        ["'up!'", "nearest_even"],
        id="update-unknown-rounding",
    ),
    pytest.param(
        lambda tmp: precision.Contract(forward="int3"),
        precision.PrecisionError,
        ["int3"],
        id="contract-unknown-format",
    ),
    # -- formats, scalings and rounding (dtypes) --------------------------------------
    pytest.param(
        lambda tmp: dtypes.get("bfloat17"),
        precision.FormatError,
        ["'bfloat17'", "known formats", "bfloat16"],
        id="get-unknown-name",
    ),
    pytest.param(
        lambda tmp: dtypes.get(3), TypeError, ["int 3", "'bfloat16'"], id="get-not-a-name"
    ),
    pytest.param(
        lambda tmp: dtypes.PerAxis(1.5), ValueError, ["float 1.5", "PerAxis(0)"], id="peraxis-float"
    ),
    pytest.param(
        lambda tmp: dtypes.PerBlock(True),
        ValueError,
        ["bool True", "PerBlock(32)"],
        id="block-bool",
    ),
    pytest.param(
        lambda tmp: dtypes.PerTensor(power_of_two="no"),
        ValueError,
        ["str 'no'", "power_of_two=True"],
        id="power-of-two-str",
    ),
    pytest.param(
        lambda tmp: precision.Tensor([1.0]).to_reduced_precision("int8", rounding="nearest"),
        ValueError,
        ["'nearest'", "nearest_even"],
        id="unknown-rounding",
    ),
    pytest.param(
        lambda tmp: precision.Tensor([NAN]).to_reduced_precision("int8"),
        ValueError,
        ["nan", "nan_to_num"],
        id="nan-into-int8",
    ),
    pytest.param(
        lambda tmp: dtypes.int4.nbytes((-2, 5)),
        ValueError,
        ["(-2, 5)", "(1024, 1024)"],
        id="nbytes-negative-dim",
    ),
    # -- trees and policies -------------------------------------------------------------
    pytest.param(
        lambda tmp: precision.to_reduced_precision({"a": np.ones(2)}, "bf17"),
        precision.FormatError,
        ["'bf17'", "known formats"],
        id="tree-unknown-format",
    ),
    pytest.param(
        lambda tmp: precision.default_format("bf17").__enter__(),
        precision.FormatError,
        ["'bf17'", "known formats"],
        id="default-format-unknown",
    ),
    # -- loss scaling -------------------------------------------------------------------
    pytest.param(
        lambda tmp: StaticLossScale(NAN),
        LossScaleError,
        ["nan", "2.0**15"],
        id="static-scale-nan",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0, factor=INF),
        LossScaleError,
        ["inf", "factor=2"],
        id="dynamic-factor-inf",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0, min_loss_scale=INF),
        LossScaleError,
        ["inf", "min_loss_scale=1.0"],
        id="dynamic-min-inf",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0, counter=-1),
        LossScaleError,
        ["-1", "counter=0"],
        id="dynamic-counter-negative",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0, period=0),
        LossScaleError,
        ["int 0", "period=2000"],
        id="dynamic-period-zero",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0).adjust(NAN),
        LossScaleTypeError,
        ["nan", "all_finite(grads)"],
        id="adjust-float-flag",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0).adjust(jnp.array([True, False])),
        LossScaleError,
        ["(2,)", "all_finite(grads)"],
        id="adjust-vector-flag",
    ),
    pytest.param(
        lambda tmp: select_tree(NAN, {"w": jnp.ones(2)}, {"w": jnp.zeros(2)}),
        LossScaleTypeError,
        ["nan", "all_finite(grads)"],
        id="select-tree-float-pred",
    ),
    pytest.param(
        lambda tmp: select_tree(True, {"a": jnp.ones(1)}, {"b": jnp.ones(1)}),
        LossScaleError,
        ["'a'", "'b'", "same tree"],
        id="select-tree-structures",
    ),
    pytest.param(
        lambda tmp: select_tree(
            True, {"a": jnp.ones(1, jnp.float16)}, {"a": jnp.ones(1, jnp.float32)}
        ),
        LossScaleTypeError,
        ["['a']", "float16", "float32", ".astype("],
        id="select-tree-dtypes",
    ),
    pytest.param(
        lambda tmp: StaticLossScale(2.0).scale(
            {"t": precision.Tensor([1.0]).to_reduced_precision("bf16")}
        ),
        LossScaleTypeError,
        ["Tensor", "precision.to_full_precision(tree)"],
        id="scale-a-tensor-leaf",
    ),
    # -- loss scales, Optax, policies, updates and the testing kit: plain builtins or
    #    silent wrong results before ---------------------------------------------------
    pytest.param(
        lambda tmp: StaticLossScale(1e300),
        LossScaleError,
        ["1e+300", "inf in float32", "2.0**15"],
        id="static-scale-past-float32",
    ),
    pytest.param(
        lambda tmp: StaticLossScale(True), LossScaleTypeError, ["True", "2.0**15"], id="scale-bool"
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0, period=2**40).adjust(True),
        LossScaleError,
        ["1099511627776", "period=2000"],
        id="dynamic-period-past-int32",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0, min_loss_scale=1e300),
        LossScaleError,
        ["1e+300", "min_loss_scale=1.0"],
        id="dynamic-min-past-float32",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0, min_loss_scale=1e-50),
        LossScaleError,
        ["1e-50", "min_loss_scale=1.0"],
        id="dynamic-min-rounds-to-zero",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0, factor=1e300),
        LossScaleError,
        ["1e+300", "factor=2"],
        id="dynamic-factor-past-float32",
    ),
    pytest.param(
        lambda tmp: StaticLossScale(2.0).adjust(NAN),
        LossScaleTypeError,
        ["nan", "all_finite(grads)"],
        id="static-adjust-float-flag",
    ),
    pytest.param(
        lambda tmp: precision.NoOpLossScale().adjust(jnp.array([True, False])),
        LossScaleError,
        ["(2,)", "all_finite(grads)"],
        id="noop-adjust-vector-flag",
    ),
    pytest.param(
        lambda tmp: StaticLossScale(2.0).scale({"loss": "abc"}),
        LossScaleTypeError,
        ["['loss']", "'abc'", "drop non-numeric leaves"],
        id="scale-text-leaf",
    ),
    pytest.param(
        lambda tmp: precision.all_finite({"a": object()}),
        LossScaleTypeError,
        ["['a']", "object", "not a number"],
        id="all-finite-object-leaf",
    ),
    pytest.param(
        lambda tmp: select_tree(True, {"a": "x"}, {"a": "y"}),
        LossScaleTypeError,
        ["['a']", "'x'", "not a number"],
        id="select-tree-text-leaves",
    ),
    pytest.param(
        lambda tmp: select_tree(True, {"a": jnp.ones(1)}, {"a": jnp.ones(3)}),
        LossScaleError,
        ["['a']", "(1,)", "(3,)", "same tree"],
        id="select-tree-shapes",
    ),
    pytest.param(
        lambda tmp: _reduced_state("abc"),
        dtypes.PrecisionTypeError,
        ["str 'abc'", "reduced_state(optax.adam(1e-3))"],
        id="reduced-state-not-a-transformation",
    ),
    pytest.param(
        lambda tmp: _reduced_state(_adam(), patterns="mu"),
        dtypes.PrecisionTypeError,
        ["str 'mu'", "patterns={"],
        id="reduced-state-patterns-str",
    ),
    pytest.param(
        lambda tmp: _reduced_state(_adam(), patterns={3: "int8"}),
        dtypes.PrecisionTypeError,
        ["int 3", "patterns={"],
        id="reduced-state-patterns-int-key",
    ),
    pytest.param(
        lambda tmp: _reduced_state(_adam(), patterns={"(": "int8"}),
        precision.SelectionError,
        ["'('", "regular expression", "re.escape"],
        id="reduced-state-patterns-bad-regex",
    ),
    pytest.param(
        lambda tmp: _reduced_state(_adam(), scaling="per-block"),
        dtypes.PrecisionTypeError,
        ["'per-block'", "dtypes.PerBlock(64)"],
        id="reduced-state-scaling-str",
    ),
    pytest.param(
        lambda tmp: _reduced_state(
            _adam(), mu=None, nu="int8", scaling=dtypes.PerBlock(64, axis=3)
        ).init({"w": jnp.ones((4, 128))}),
        dtypes.ScalingError,
        ["axis=3", "(4, 128)", "PerTensor()"],
        id="reduced-state-block-axis",
    ),
    pytest.param(
        lambda tmp: _reduced_state(_adam()).update({"w": jnp.ones(2)}, None, {"w": jnp.ones(2)}),
        dtypes.PrecisionTypeError,
        ["NoneType None", "tx.init(params)"],
        id="reduced-state-update-none-state",
    ),
    pytest.param(
        lambda tmp: precision.Policy(float32_ops=3),
        dtypes.PrecisionTypeError,
        ["int 3", "float32_ops={"],
        id="policy-float32-ops-int",
    ),
    pytest.param(
        lambda tmp: precision.Policy.parse("c=float8_e8m0fnu"),
        precision.FormatError,
        ["compute='float8_e8m0fnu'", "scale format", "compute='bfloat16'"],
        id="policy-scale-format",
    ),
    pytest.param(
        lambda tmp: precision.Policy.parse("p=float64").cast_to_param({"w": jnp.ones(2)}),
        dtypes.PrecisionTypeError,
        ["float64", "jax_enable_x64"],
        id="policy-float64-without-x64",
    ),
    # -- bad input reaching optax through reduced_state, float32_ops names that are no
    #    primitive, integer loss-scale flags: plain builtins or silent wrong results before
    pytest.param(
        lambda tmp: _reduced_adam()[0].init("abc"),
        dtypes.PrecisionTypeError,
        ["<root>", "str 'abc'", "tx.init(params)"],
        id="reduced-state-init-text",
    ),
    pytest.param(
        lambda tmp: _reduced_adam()[0].init(None),
        dtypes.PrecisionTypeError,
        ["None", "tx.init(params)"],
        id="reduced-state-init-none",
    ),
    pytest.param(
        lambda tmp: _reduced_adam()[0].init({"w": jnp.ones(2), "b": object()}),
        dtypes.PrecisionTypeError,
        ["['b']", "object", "tx.init(params)"],
        id="reduced-state-init-object",
    ),
    pytest.param(
        lambda tmp: _reduced_adam()[0].init({"w": _bf16((4, 128))}),
        dtypes.PrecisionTypeError,
        ["['w']", "bfloat16", "precision.to_full_precision(params)"],
        id="reduced-state-init-tensor",
    ),
    pytest.param(
        lambda tmp: _update({"v": jnp.ones((4, 128))}, W),
        precision.UpdateError,
        ["'v'", "'w'", "tx.init(params)"],
        id="reduced-state-update-structure",
    ),
    pytest.param(
        lambda tmp: _update({"v": jnp.ones((4, 128))}),
        precision.UpdateError,
        ["'v'", "'w'", "tx.init(params)"],
        id="reduced-state-update-structure-without-params",
    ),
    pytest.param(
        lambda tmp: _update(None),
        dtypes.PrecisionTypeError,
        ["None", "the gradients"],
        id="reduced-state-update-none",
    ),
    pytest.param(
        lambda tmp: _update({"w": jnp.ones((4, 1))}),
        precision.UpdateError,
        ["['w']", "(4, 1)", "(4, 128)"],
        id="reduced-state-update-shape",
    ),
    pytest.param(
        lambda tmp: _update({"w": jnp.ones((4, 128))}, {"w": jnp.ones((4, 1))}),
        precision.UpdateError,
        ["params", "['w']", "(4, 1)", "(4, 128)"],
        id="reduced-state-update-params-shape",
    ),
    pytest.param(
        lambda tmp: _update("abc"),
        dtypes.PrecisionTypeError,
        ["<root>", "str 'abc'", "gradients"],
        id="reduced-state-update-text",
    ),
    pytest.param(
        lambda tmp: _update({"w": _bf16((4, 128))}),
        dtypes.PrecisionTypeError,
        ["['w']", "bfloat16", "precision.to_full_precision(updates)"],
        id="reduced-state-update-tensor",
    ),
    pytest.param(
        lambda tmp: _update({"w": jnp.ones((4, 128))}, {"w": _bf16((4, 128))}),
        dtypes.PrecisionTypeError,
        ["['w']", "bfloat16", "precision.to_full_precision(params)"],
        id="reduced-state-update-tensor-params",
    ),
    pytest.param(
        lambda tmp: precision.Policy(float32_ops={"exp", "softmaxx", "layer_norm"}),
        precision.PolicyError,
        ["'softmaxx'", "'layer_norm'", "jax.make_jaxpr"],
        id="policy-float32-ops-not-primitives",
    ),
    pytest.param(
        lambda tmp: precision.Policy(float32_ops=["reduce_summ"]),
        precision.PolicyError,
        ["'reduce_summ'", "did you mean", "'reduce_sum'"],
        id="policy-float32-ops-misspelled",
    ),
    pytest.param(
        lambda tmp: precision.Policy(float32_ops=["sum"]),
        precision.PolicyError,
        ["'sum'", "'reduce_sum'"],
        id="policy-float32-ops-numpy-name",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0).adjust(1),
        LossScaleTypeError,
        ["int 1", "boolean flag", "all_finite(grads)"],
        id="adjust-int-flag",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0).adjust(np.int32(0)),
        LossScaleTypeError,
        ["int32", "boolean flag", "all_finite(grads)"],
        id="adjust-numpy-int-flag",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale(2.0).adjust(jnp.sum(jnp.isfinite(jnp.array([1.0, NAN])))),
        LossScaleTypeError,
        ["int32", "boolean flag", "all_finite(grads)"],
        id="adjust-count-flag",
    ),
    pytest.param(
        lambda tmp: jax.jit(lambda f: DynamicLossScale(2.0).adjust(f))(jnp.int32(1)),
        LossScaleTypeError,
        ["int32", "boolean flag", "all_finite(grads)"],
        id="adjust-traced-int-flag",
    ),
    pytest.param(
        lambda tmp: StaticLossScale(2.0).adjust(1),
        LossScaleTypeError,
        ["int 1", "all_finite(grads)"],
        id="static-adjust-int-flag",
    ),
    pytest.param(
        lambda tmp: select_tree(np.uint8(1), {"w": jnp.ones(2)}, {"w": jnp.zeros(2)}),
        LossScaleTypeError,
        ["uint8", "boolean flag", "all_finite(grads)"],
        id="select-tree-int-pred",
    ),
    pytest.param(
        lambda tmp: precision.apply_updates({"w": jnp.ones(3)}, {"w": "abc"}),
        precision.UpdateError,
        ["['w']", "str 'abc'", "floating updates"],
        id="update-text-leaf",
    ),
    pytest.param(
        lambda tmp: precision.apply_updates(
            {"w": jnp.ones(3, jnp.bfloat16)},
            {"w": jnp.ones(3)},
            rounding="stochastic",
            key=jax.random.split(jax.random.key(0), 2),
        ),
        dtypes.RoundingError,
        ["(2,)", "key=keys[0]"],
        id="update-batch-of-keys",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.arrays(None)),
        dtypes.PrecisionTypeError,
        ["None", "'bfloat16'"],
        id="arrays-format-none",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.arrays("bfloat16", shape="abc")),
        dtypes.ShapeError,
        ["'abc'", "shape=(3, 5)"],
        id="arrays-shape-text",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.arrays("bfloat16", min_value="abc")),
        dtypes.PrecisionTypeError,
        ["'abc'", "min_value=0.0"],
        id="arrays-bound-text",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.values("bfloat16", max_value=NAN)),
        KitError,
        ["max_value=nan", "min_value <= max_value"],
        id="values-bound-nan",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.arrays("bfloat16", min_value=INF)),
        KitError,
        ["min_value=inf", "allow_infinity=True"],
        id="arrays-bound-inf",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.arrays("bfloat16", allow_nan="no")),
        dtypes.PrecisionTypeError,
        ["'no'", "allow_nan=False"],
        id="arrays-flag-text",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.formats(kinds=None)),
        dtypes.PrecisionTypeError,
        ["None", "kinds='float'"],
        id="formats-kinds-none",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.formats(kinds="complex")),
        KitError,
        ["'complex'", "'float' or 'int'"],
        id="formats-kinds-unknown",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.formats(max_bits="8")),
        dtypes.PrecisionTypeError,
        ["'8'", "max_bits="],
        id="formats-bits-text",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.scalings(dtypes.int8, ndim=1.5)),
        dtypes.PrecisionTypeError,
        ["1.5", "ndim="],
        id="scalings-ndim-float",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.scalings(dtypes.int8, block_sizes=(0,))),
        KitError,
        ["got 0", "block_sizes"],
        id="scalings-block-zero",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.scalings(dtypes.int8, scale_formats="float32")),
        dtypes.PrecisionTypeError,
        ["'float32'", "scale_formats=('float32',)"],
        id="scalings-scale-formats-str",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.scalings("abc")),
        precision.FormatError,
        ["'abc'"],
        id="scalings-unknown-format",
    ),
    pytest.param(
        lambda tmp: _draw(precision.testing.roundings(deterministic_only="yes")),
        dtypes.PrecisionTypeError,
        ["'yes'", "deterministic_only=False"],
        id="roundings-flag-text",
    ),
    pytest.param(
        lambda tmp: precision.testing.ulp_distance("abc", 1.0, "bfloat16"),
        dtypes.PrecisionTypeError,
        ["'abc'", "<U3", "float or int array"],
        id="ulp-distance-text",
    ),
    pytest.param(
        lambda tmp: precision.testing.ulp_distance([1.0, 2.0], [1.0, 2.0, 3.0], "bfloat16"),
        KitError,
        ["(2,)", "(3,)", "broadcastable"],
        id="ulp-distance-shapes",
    ),
    pytest.param(
        lambda tmp: precision.testing.ulp_distance(
            [1.0, 2.0], [1.0, 2.0], "int8", scale=[1.0, 1.0, 1.0]
        ),
        KitError,
        ["(3,)", "broadcastable"],
        id="ulp-distance-scale-shape",
    ),
    pytest.param(
        lambda tmp: precision.testing.assert_ulp_close([NAN], [1.0], "bfloat16", max_ulps=INF),
        KitError,
        ["inf", "max_ulps=1"],
        id="assert-ulp-close-infinite-tolerance",
    ),
    pytest.param(
        lambda tmp: precision.testing.assert_ulp_close(1.0, 2.0, "bfloat16", err_msg=3),
        dtypes.PrecisionTypeError,
        ["int 3", "err_msg="],
        id="assert-ulp-close-err-msg-int",
    ),
    pytest.param(
        lambda tmp: precision.testing.assert_representable([1.1], "bfloat16", limit=-1),
        KitError,
        ["-1", "limit=5"],
        id="assert-representable-negative-limit",
    ),
    pytest.param(
        lambda tmp: precision.testing.sqnr_db({"a": 1}, 1.0),
        dtypes.PrecisionTypeError,
        ["{'a': 1}", "float or int array"],
        id="sqnr-dict",
    ),
    pytest.param(
        lambda tmp: precision.testing.relative_error([1.0, 2.0], [1.0, 2.0, 3.0]),
        KitError,
        ["(2,)", "(3,)", "broadcastable"],
        id="relative-error-shapes",
    ),
    # -- checkpoints --------------------------------------------------------------------
    pytest.param(
        _not_a_checkpoint, CheckpointError, ["notes.txt", "not a safetensors"], id="load-text"
    ),
    pytest.param(
        _overwrite_flag, SaveTypeError, ["str 'no'", "overwrite=True"], id="save-overwrite-str"
    ),
    pytest.param(
        lambda tmp: precision.save({"a": np.ones(2)}, tmp / "x.safetensors"),
        SaveTypeError,
        ["path first", "save(path, tree)", "x.safetensors"],
        id="save-arguments-swapped",
    ),
    pytest.param(
        _save({"a": "text"}), SaveTypeError, ["'a'", "str", "arrays of dtypes"], id="save-str-leaf"
    ),
    pytest.param(
        _save({1.5: np.ones(1)}), SaveTypeError, ["1.5", "strings or integers"], id="save-float-key"
    ),
    pytest.param(
        _save({"n" * 5000: np.ones(1)}),
        SaveError,
        ["5000 characters", "4096"],
        id="save-long-name",
    ),
    pytest.param(
        _save({"a": {"b": np.ones(1)}, "a.b": np.ones(1)}),
        SaveError,
        ["'a.b'", "rename one of the keys"],
        id="save-name-clash",
    ),
    pytest.param(
        _save(
            {"w": precision.Tensor.from_encoded(dtypes.FloatFormat(5, 2, name="int8").encode(1.0))}
        ),
        SaveError,
        ["'int8'", "name='int8_custom'"],
        id="save-custom-format-named-int8",
    ),
    # -- the bad calls issue 21 measured: each a plain builtin before ------------------
    pytest.param(
        lambda tmp: dtypes.int8.data_shape("abc"),
        ValueError,
        ["'abc'", "(1024, 1024)"],
        id="data-shape-text",
    ),
    pytest.param(
        lambda tmp: dtypes.int4.data_shape((-1,)),
        ValueError,
        ["(-1,)", "non-negative"],
        id="data-shape-negative",
    ),
    *[
        pytest.param(
            lambda tmp, n=name: dtypes.get(n).round("abc"),
            TypeError,
            ["<U3", "float"],
            id=f"round-text-{name}",
        )
        for name in ("nf4", "uint4", "float8_e8m0fnu")
    ],
    *[
        pytest.param(
            lambda tmp, n=name: dtypes.get(n).nbytes(None),
            ValueError,
            ["None", "(1024, 1024)"],
            id=f"nbytes-none-{name}",
        )
        for name in ("nf4", "uint4", "float8_e8m0fnu")
    ],
    pytest.param(
        lambda tmp: dtypes.bfloat16.round(np.ones(3), rounding="stochastic", key=5),
        ValueError,
        ["int 5", "jax.random.key(0)"],
        id="stochastic-seed-for-key",
    ),
    pytest.param(
        lambda tmp: dtypes.check_rounding("stochastic", 5),
        ValueError,
        ["int 5", "not a seed"],
        id="check-rounding-seed",
    ),
    pytest.param(
        lambda tmp: DynamicLossScale("x"), TypeError, ["'x'", "2.0**15"], id="loss-scale-text"
    ),
    pytest.param(
        lambda tmp: dtypes.FloatFormat(4, 3, scaling="pertensor"),
        TypeError,
        ["'pertensor'", "dtypes.PerTensor()"],
        id="format-scaling-text",
    ),
    pytest.param(
        lambda tmp: dtypes.get("float8_e8m0fnu").decode(None),
        TypeError,
        ["NoneType", "encode(x)"],
        id="decode-none",
    ),
    pytest.param(
        lambda tmp: dtypes.int8.decode(dtypes.int8.encode(np.ones(2)), dtype=np.int8),
        TypeError,
        ["int8", "floating dtype"],
        id="decode-into-int8",
    ),
    pytest.param(
        lambda tmp: precision.load(tmp / "x", as_arrays="no"),
        TypeError,
        ["'no'", "as_arrays=True"],
        id="load-as-arrays-text",
    ),
    pytest.param(
        lambda tmp: _hand_built(scale=None).decode(),
        ValueError,
        ["needs scales", "none"],
        id="decode-missing-scale",
    ),
    pytest.param(
        lambda tmp: _hand_built(scale=jnp.ones((2, 2))).decode(),
        ValueError,
        ["(2, 2)", "(1,)"],
        id="decode-scale-shape",
    ),
    pytest.param(
        lambda tmp: _hand_built(scale=jnp.array([INF])).decode(),
        ValueError,
        ["inf", "encode(x)"],
        id="decode-infinite-scale",
    ),
    pytest.param(
        lambda tmp: _hand_built(scale=jnp.array([-1.0])).decode(),
        ValueError,
        ["-1.0"],
        id="decode-negative-scale",
    ),
    pytest.param(
        lambda tmp: _hand_built(data=jnp.array([-128, 3], jnp.int8)).decode(),
        ValueError,
        ["-128", "±127"],
        id="decode-code-past-range",
    ),
    pytest.param(
        lambda tmp: _hand_built_nvfp4(None).decode(),
        ValueError,
        ["nvfp4", "needs its float32 tensor scale", "encode(x)"],
        id="decode-missing-tensor-scale",
    ),
    pytest.param(
        lambda tmp: _hand_built_nvfp4(jnp.ones(2)).decode(),
        ValueError,
        ["(2,)", "(2, 1, 1)", "encode(x)"],
        id="decode-tensor-scale-shape",
    ),
    pytest.param(
        lambda tmp: _hand_built_nvfp4(jnp.array([[[1.0]], [[-1.0]]])).decode(),
        ValueError,
        ["tensor scale", "-1.0"],
        id="decode-negative-tensor-scale",
    ),
    pytest.param(
        lambda tmp: _hand_built_nvfp4(jnp.float32(1), "mxfp4").decode(),
        ValueError,
        ["mxfp4", "holds no tensor scale"],
        id="decode-tensor-scale-not-two-level",
    ),
    # -- calibrate's yes/no options and numbers -----------------------------------------
    *[
        pytest.param(
            lambda tmp, o=option, v=value: _calibrate(**{o: v}),
            ValueError,
            [option, repr(value)[:5], "True or False"],
            id=f"calibrate-{option}-{type(value).__name__}",
        )
        for option, value in [
            ("act_order", "no"),
            ("clip", "no"),
            ("sequential", "no"),
            ("progress", NAN),
        ]
    ],
    pytest.param(
        lambda tmp: _calibrate(damp=True), ValueError, ["damp", "True"], id="calibrate-damp-bool"
    ),
    # -- what is not a path, a function, a flag ------------------------------------------
    pytest.param(
        lambda tmp: precision.load(None),
        TypeError,
        ["precision.load", "NoneType", "path"],
        id="load-path-none",
    ),
    pytest.param(
        lambda tmp: precision.save(None, {"a": np.ones(2)}),
        TypeError,
        ["precision.save", "NoneType", "path"],
        id="save-path-none",
    ),
    pytest.param(
        _save({"a": np.ones(2)}, overwrite=np.array([True, False])),
        TypeError,
        ["overwrite must be True or False", "ndarray"],
        id="save-overwrite-array",
    ),
    pytest.param(
        lambda tmp: precision.load(tmp, as_arrays=1),
        TypeError,
        ["as_arrays must be True or False", "int 1"],
        id="load-as-arrays-int",
    ),
    pytest.param(
        lambda tmp: precision.apply(None),
        TypeError,
        ["precision.apply needs the function", "NoneType"],
        id="apply-not-callable",
    ),
    pytest.param(
        lambda tmp: precision.explain("abc", jnp.ones(2)),
        TypeError,
        ["needs the function", "str 'abc'"],
        id="explain-not-callable",
    ),
    # -- Tensor methods and operators -----------------------------------------------------
    *[
        pytest.param(
            lambda tmp, c=call: c(precision.Tensor(SAMPLE)),
            error,
            says,
            id=f"tensor-{label}",
        )
        for label, call, error, says in [
            ("sum-axis-text", lambda t: t.sum(axis="a"), TypeError, ["axis", "str 'a'"]),
            ("sum-axis-float", lambda t: t.sum(axis=1.5), TypeError, ["axis", "1.5"]),
            ("sum-axis-past", lambda t: t.sum(axis=5), ValueError, ["axis 5", "[-2, 1]"]),
            ("sum-axis-twice", lambda t: t.mean(axis=(0, 0)), ValueError, ["(0, 0)", "distinct"]),
            ("sum-keepdims-text", lambda t: t.sum(keepdims="no"), TypeError, ["keepdims", "'no'"]),
            ("argmax-axes", lambda t: t.argmax(axis=(0, 1)), TypeError, ["axis", "(0, 1)"]),
            ("transpose-past", lambda t: t.transpose(0, 5), ValueError, ["(0, 5)", "(1, 0)"]),
            ("transpose-empty", lambda t: t.transpose([]), ValueError, ["()", "permutation"]),
            ("add-text", lambda t: t + "abc", TypeError, ["str 'abc'", "`add`"]),
            ("radd-text", lambda t: "abc" + t, TypeError, ["str 'abc'", "`add`"]),
            ("matmul-none", lambda t: t @ None, TypeError, ["NoneType", "`matmul`"]),
            ("item-many", lambda t: t.item(), ValueError, ["item()", "(2, 32)", "t[i]"]),
            ("float-many", lambda t: float(t), ValueError, ["float()", "(2, 32)"]),
            ("bool-many", lambda t: bool(t), ValueError, ["bool()", "(2, 32)"]),
            ("to-device-text", lambda t: t.to_device("cpu"), TypeError, ["'cpu'", "jax.devices()"]),
            (
                "device-put-text",
                lambda t: precision.device_put({"w": t}, {"w": "cpu"}),
                TypeError,
                ["'cpu'", "jax.devices()"],
            ),
            (
                "add-shapes",
                lambda t: t + np.ones((3, 5)),
                ValueError,
                ["Tensor `add`", "(2, 32)", "(3, 5)"],
            ),
            ("matmul-shapes", lambda t: t @ t, ValueError, ["Tensor `matmul`", "contracting"]),
            ("add-huge-int", lambda t: t + 2**63, TypeError, ["Tensor `add`", "int 9223372"]),
            (
                "numpy-sin-text",
                lambda t: precision.numpy.sin("abc"),
                TypeError,
                ["precision.numpy.sin", "str 'abc'"],
            ),
            ("index-array-past", lambda t: t[np.array([0, 100])], IndexError, ["index 100"]),
            ("index-jax-past", lambda t: t[:, jnp.array(-33)], IndexError, ["index -33", "32"]),
            (
                "nbytes-of-shapes",
                lambda t: jax.tree.map(lambda x: x.shape, t).nbytes,
                TypeError,
                ["tuple", "jax.tree.map"],
            ),
        ]
    ],
    pytest.param(
        lambda tmp: precision.explain(lambda a: a @ a, np.ones((2, 3), np.float32)),
        ValueError,
        ["explain: f", "(2, 3)", "contracting"],
        id="explain-f-refused",
    ),
    pytest.param(
        lambda tmp: _calibrate_batches(np.float32(1)),
        ValueError,
        ["batches", "iterable"],
        id="calibrate-batches-0d",
    ),
    pytest.param(
        lambda tmp: dtypes.PerTensor().group_reduce(np.array(["a"]), jnp.max),
        TypeError,
        ["PerTensor.group_reduce", "numeric array"],
        id="group-reduce-text",
    ),
    pytest.param(
        lambda tmp: dtypes.PerTensor().group_reduce(np.ones(3), None),
        TypeError,
        ["reduce=None", "function"],
        id="group-reduce-not-callable",
    ),
    pytest.param(
        lambda tmp: precision.Tensor(SAMPLE, dtype=np.float32(1.5)),
        TypeError,
        ["the value", "1.5", "dtype=np.float32"],
        id="tensor-dtype-value",
    ),
    pytest.param(
        _save(jax.tree.map(lambda x: x.shape, {"w": precision.Tensor(np.ones(3, np.float32))})),
        TypeError,
        ["cannot save leaf 'w'", "tuple"],
        id="save-tree-of-shapes",
    ),
    pytest.param(
        lambda tmp: precision.testing.arrays("bfloat16", shape=2**63),
        ValueError,
        ["arrays()", "smaller shape"],
        id="arrays-shape-huge",
    ),
    # -- the pytest plugin --------------------------------------------------------------
    pytest.param(
        lambda tmp: selected_formats(kinds="complex"),
        KitError,
        ["'complex'", "'float' or 'int'"],
        id="formats-marker-kind",
    ),
    pytest.param(
        lambda tmp: selected_formats(kinds="int", min_bits=16),
        KitError,
        ["min_bits=16", "selects no format"],
        id="formats-marker-empty",
    ),
]


@pytest.mark.parametrize(("call", "error", "says"), WRONG_CALLS)
def test_a_wrong_call_raises_a_precision_error_naming_value_and_fix(tmp_path, call, error, says):
    with pytest.raises(error) as info:
        call(tmp_path)
    exc = info.value
    assert isinstance(exc, precision.PrecisionError), type(exc).__mro__
    assert isinstance(exc, ValueError | TypeError | IndexError), type(exc).__mro__  # (numpy's)
    message = str(exc)
    missing = [s for s in says if s not in message]
    assert not missing, f"{type(exc).__name__}: {message!r} does not say {missing}"
    # nothing was left behind by a refused save
    assert all(not name.startswith(".") for name in os.listdir(tmp_path)), os.listdir(tmp_path)


# -- values that once came back wrong without an error ------------------------------------


def test_values_that_once_came_back_wrong_are_now_right():
    # a NaN held in a Python float (or complex) read as finite
    assert not bool(precision.all_finite({"loss": NAN}))
    assert not bool(precision.all_finite([complex(NAN, 0.0)]))
    # Python float and complex leaves were returned unscaled
    ls = StaticLossScale(4.0)
    assert float(ls.scale({"loss": 1.5})["loss"]) == 6.0
    grads = ls.scale({"z": jnp.ones(2, jnp.complex64)})
    assert jnp.allclose(grads["z"], 4.0)
    assert jnp.allclose(ls.unscale(grads)["z"], 1.0)
    # an overflow raised a scale that started below min_loss_scale up to the floor
    assert float(DynamicLossScale(0.5).adjust(False).loss_scale) == 0.5
    assert float(DynamicLossScale(8.0, min_loss_scale=3).adjust(False).loss_scale) == 4.0
    assert float(DynamicLossScale(4.0, min_loss_scale=3).adjust(False).loss_scale) == 3.0
    # a Python float parameter dropped its update
    assert float(precision.apply_updates({"w": 1.0}, {"w": 0.5})["w"]) == 1.5
    # a generator of float32_ops was stored empty (consumed by the check)
    ops = precision.Policy(float32_ops=(o for o in ["exp"])).float32_ops
    assert ops == frozenset({"exp"})
    # a lower bound above float32's subnormals was refused by hypothesis at the first draw
    assert float(np.min(_draw(precision.testing.arrays("bfloat16", min_value=2.5)))) >= 2.5
    assert float(_draw(precision.testing.values("bfloat16", max_value=-1.0))) <= -1.0
    # a keepdims of "no" was read as True, and transpose([]) as a full transpose
    t = precision.Tensor(SAMPLE)
    assert t.sum(axis=1, keepdims=False).shape == (2,)
    assert t.transpose(None).shape == t.T.shape == (32, 2)
    # an index array past the end was clamped to the last value
    assert np.asarray(t[np.array([0, -2])]).tolist() == SAMPLE[[0, -2]].tolist()


def test_a_bytes_path_loads_and_saves(tmp_path):
    path = os.fsencode(tmp_path / "b.safetensors")
    precision.save(path, {"a": np.arange(3, dtype=np.float32)})
    assert precision.load(path, as_arrays=True)["a"].tolist() == [0.0, 1.0, 2.0]


def test_an_exclude_that_excludes_nothing_is_said(recwarn):
    params = {"dense": {"kernel": np.ones((2, 2), np.float32), "bias": np.ones(2, np.float32)}}
    with pytest.warns(SelectionWarning, match=r"exclude='kernal' matched none of the 2"):
        out = precision.to_reduced_precision(params, "int8", exclude="kernal")
    assert out["dense"]["kernel"].format.name == "int8"  # converted all the same
    precision.to_reduced_precision(params, "int8", exclude="bias")
    assert not [w for w in recwarn if issubclass(w.category, SelectionWarning)]


# -- the sweep: every format method and Tensor entry point, every kind of bad value --------

BAD_VALUES = {
    "None": None,
    "text": "abc",
    "mixed list": [1, "a"],
    "object": object(),
    "nan": NAN,
    "negative": -1,
    "long tuple": (1, 2, 3),
    "dict": {"a": 1},
    "bool": True,
    "complex": 1j,
}
SWEPT = ["bfloat16", "float8_e4m3fn", "int8", "int4", "uint8", "nf4", "mxfp4", "float8_e8m0fnu"]
SAMPLE = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)


def _format_calls(fmt: dtypes.Format, enc: dtypes.Encoded, v: Any) -> dict[str, Callable[[], Any]]:
    return {
        "encode": lambda: fmt.encode(v),
        "round": lambda: fmt.round(v),
        "check": lambda: fmt.check(v),
        "encode scaling=": lambda: fmt.encode(SAMPLE, scaling=v),
        "encode rounding=": lambda: fmt.encode(SAMPLE, rounding=v),
        "stochastic key=": lambda: fmt.encode(SAMPLE, rounding="stochastic", key=v),
        "decode": lambda: fmt.decode(v),
        "decode dtype=": lambda: fmt.decode(enc, dtype=v),
        "nbytes": lambda: fmt.nbytes(v),
        "data_shape": lambda: fmt.data_shape(v),
        "result_dtype": lambda: fmt.result_dtype(v),
    }


def _tensor_calls(v: Any) -> dict[str, Callable[[], Any]]:
    t = precision.Tensor(SAMPLE)
    return {
        "Tensor": lambda: precision.Tensor(v),
        "Tensor dtype=": lambda: precision.Tensor(SAMPLE, dtype=v),
        "to_reduced_precision": lambda: t.to_reduced_precision(v),
        "to_reduced_precision scaling=": lambda: t.to_reduced_precision("int8", scaling=v),
        "to_reduced_precision rounding=": lambda: t.to_reduced_precision("bf16", rounding=v),
        "reshape": lambda: t.reshape(v),
        "index": lambda: t[v],
        "tree where=": lambda: precision.to_reduced_precision({"w": SAMPLE}, "int8", where=v),
        "tree format": lambda: precision.to_reduced_precision({"w": SAMPLE}, v),
        "apply compute=": lambda: precision.apply(lambda a: a, compute=v)(t),
        "apply contract=": lambda: precision.apply(lambda a: a, contract=v)(t),
    }


def _outcome(call: Callable[[], Any]) -> str | None:
    """None when the call succeeds or raises a PrecisionError (or a call-site arity error);
    else what leaked: a plain builtin raised from inside the library."""
    try:
        call()
    except (precision.PrecisionError, SelectionWarning):  # (a warning the filters raise)
        return None
    except Exception as exc:  # the point: which ones leak
        frames = traceback.extract_tb(exc.__traceback__)[1:]
        if any(f"{os.sep}dtypes{os.sep}" in f.filename or f"{os.sep}precision{os.sep}" in f.filename
               for f in frames):  # fmt: skip
            return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize("name", SWEPT)
def test_the_sweep_of_bad_values_raises_no_plain_builtin(name):
    fmt = dtypes.get(name)
    enc = fmt.encode(np.abs(SAMPLE) + 0.5 if fmt.kind == "scale" else SAMPLE)
    leaked = {}
    for label, value in BAD_VALUES.items():
        calls = _format_calls(fmt, enc, value)
        if name == SWEPT[0]:
            calls |= _tensor_calls(value)
        for what, call in calls.items():
            problem = _outcome(call)
            if problem is not None:
                leaked[f"{what}({label})"] = problem
    assert not leaked, leaked
