"""Stacked layers outside `apply`: a stack scaled per layer maps under `vmap` and `scan`.

A `(layers, in, out)` stack whose scales have a leading axis per layer
(`PerAxis(0)`, `PerAxis((0, -1))`, blocks along another axis) is mapped by
JAX like any array: each slice is one layer's codes and scales, and its
scaling follows (`Scaling.refit`). Each result is compared with plain JAX on
the decoded weights.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from sampling import HUNT

import dtypes
import precision
from precision import CheckpointError, Tensor
from precision._checkpoint._layout import scaling_from_json
from precision.testing._plugin import selected_formats

rng = np.random.default_rng(0)
W = rng.standard_normal((3, 8, 5)).astype(np.float32)
X = jnp.asarray(rng.standard_normal((2, 8)).astype(np.float32))

PER_LAYER = [dtypes.PerAxis(0), dtypes.PerAxis((0, -1)), dtypes.PerBlock(4, axis=1)]


def takes_scalings(fmt: dtypes.Format) -> bool:
    """Whether a format takes a scaling of the caller's: not a scale format (E8M0 is
    itself the scales), not a float with float32's exponent range (scales cannot help)."""
    return fmt.kind != "scale" and not (fmt.kind == "float" and fmt.emax >= 127)


def layout_twin(fmt: dtypes.Format) -> str | None:
    """The other registry entry whose elements `fmt` stores, if any: under a caller's
    scaling a named block encoding (MX, NVFP4) stores what its element format does
    (mxfp4 under PerAxis(0) is float4_e2m1fn under PerAxis(0))."""
    element = dataclasses.replace(fmt, scaling=None, name=None)
    return next((n for n, f in dtypes.REGISTRY.items() if f == element and n != fmt.name), None)


def two_level(fmt: dtypes.Format) -> bool:
    """Whether a format's own scaling has a second level: one float32 scale for the
    whole tensor (NVFP4), which no per-layer slice owns."""
    scaling = fmt.default_scaling()
    return scaling is not None and scaling.scale_format == "float8_e4m3fn"


REGISTERED = selected_formats()  # float64 only with 64-bit JAX
# Formats a stack is scaled per layer in by the caller's scalings: every one that takes
# scalings, less the layout twins (their storage is their element format's).
CALLER_SCALED = [f.name for f in REGISTERED if takes_scalings(f) and layout_twin(f) is None]
# Formats whose own scaling is blocks along the last axis: per layer already.
OWN_BLOCKS = [
    f.name
    for f in REGISTERED
    if isinstance(f.default_scaling(), dtypes.PerBlock) and not two_level(f)
]
UNSCALABLE = [f.name for f in REGISTERED if not takes_scalings(f)]


def _mapped_cases() -> list:
    """Each format with one (mapping, scaling) in turn: a caller-scaled format with one
    of the six (mapping, per-layer scaling) pairs, a block encoding with its own
    scaling and one mapping, so every format and every pair is covered (each case
    compiles a stack's programs); every pair for every format under the hunt profile.

    Each case runs the mapping eagerly; `outer` also runs it under `jax.jit`. Eagerly,
    `apply` already runs in a `jax.jit` of its own inside the vmap or scan, so the outer
    jit compiles the same programs again over traced Tensor leaves: in CI the first case
    of each (mapping, scaling) pair takes it, every case under the hunt profile."""
    mappings = [("vmap", _vmapped), ("scan", _scanned)]
    pairs = [(m, s) for s in PER_LAYER for m in mappings]
    cases, seen = [], set()
    for i, name in enumerate(CALLER_SCALED):
        for (label, mapped), scaling in pairs if HUNT else [pairs[i % len(pairs)]]:
            outer = HUNT or (label, scaling) not in seen
            seen.add((label, scaling))
            cases.append(pytest.param(name, scaling, mapped, outer, id=f"{label}-{name}-{scaling}"))
    for i, name in enumerate(OWN_BLOCKS):
        for label, mapped in mappings if HUNT else [mappings[i % 2]]:
            outer = HUNT or (label, None) not in seen
            seen.add((label, None))
            cases.append(pytest.param(name, None, mapped, outer, id=f"{label}-{name}-own"))
    return cases


def _layer(w, x):
    return jnp.tanh(x @ w)


def _reference(t: Tensor) -> np.ndarray:
    decoded = jnp.asarray(np.asarray(t))  # the decoded weights, then plain JAX
    return np.asarray(jnp.stack([_layer(decoded[i], X) for i in range(decoded.shape[0])]))


def _scanned(t: Tensor):
    step = precision.apply(_layer)
    return lax.scan(lambda c, w: (c, step(w, X)), 0, t)[1]


def _vmapped(t: Tensor):
    return jax.vmap(precision.apply(_layer), in_axes=(0, None))(t, X)


MAPPED = [_vmapped, _scanned]


def test_the_lists_cover_the_registry():
    names = {f.name for f in REGISTERED}
    twins = {n for n in names if takes_scalings(dtypes.get(n)) and layout_twin(dtypes.get(n))}
    assert set(CALLER_SCALED) | twins | set(UNSCALABLE) == names
    assert all(layout_twin(dtypes.get(n)) in CALLER_SCALED for n in twins)
    cases = [p.values for p in _mapped_cases()]
    assert {n for n, _, _, _ in cases} == set(CALLER_SCALED) | set(OWN_BLOCKS)
    every_pair = {(s, m) for s in PER_LAYER for m in MAPPED}
    assert {(s, m) for _, s, m, _ in cases if s is not None} == every_pair
    # and each pair, and each mapping of an own scaling, under an outer jit too
    assert {(s, m) for _, s, m, outer in cases if outer} == every_pair | {(None, m) for m in MAPPED}
    # a twin's own scaling is mapped, or its tensor scale made per layer (test_stacks.py)
    assert all(n in OWN_BLOCKS or two_level(dtypes.get(n)) for n in twins)


@pytest.mark.parametrize("name", UNSCALABLE)
def test_formats_that_take_no_scaling_refuse_per_layer_ones_by_name(name):
    for scaling in PER_LAYER:
        with pytest.raises(dtypes.ScalingError, match=name):
            Tensor(np.abs(W) + 1).to_reduced_precision(name, scaling=scaling)


@pytest.mark.parametrize(("name", "scaling", "mapped", "outer"), _mapped_cases())
def test_a_stack_scaled_per_layer_maps_from_outside_apply(name, scaling, mapped, outer):
    t = Tensor(W).to_reduced_precision(name, scaling=scaling)
    ref = _reference(t)
    # (a batched dot sums in another order than each layer's own: float32 rounding apart)
    for run in (jax.jit(mapped), mapped) if outer else (mapped,):
        np.testing.assert_allclose(np.asarray(run(t)), ref, rtol=2e-6, atol=1e-6)


def test_one_layer_of_the_stack_has_its_own_scaling():
    seen = {}

    def grab(w):
        seen["scaling"] = w.encoded.scaling
        return jnp.zeros(())

    for scaling, one_layer in [
        (dtypes.PerAxis(0), dtypes.PerTensor()),
        (dtypes.PerAxis((0, -1)), dtypes.PerAxis(1)),
        (dtypes.PerAxis((0, 2), power_of_two=True), dtypes.PerAxis(1, power_of_two=True)),
        (dtypes.PerBlock(4, axis=1), dtypes.PerBlock(4, axis=0)),
        (dtypes.PerBlock(4, axis=-1), dtypes.PerBlock(4, axis=-1)),
    ]:
        t = Tensor(W).to_reduced_precision("int8", scaling=scaling)
        jax.vmap(grab)(t)
        assert seen["scaling"] == one_layer, scaling


@pytest.mark.parametrize("name", CALLER_SCALED)
def test_encodings_made_under_vmap_come_out_scaled_per_example(name):
    """Per-tensor encodings of each slice, made under `vmap`, are `PerAxis(0)` of the stack."""
    per_tensor = dtypes.PerTensor()
    encode = jax.vmap(lambda w: Tensor(w).to_reduced_precision(name, scaling=per_tensor))
    made = jax.jit(encode)(jnp.asarray(W))
    assert made.encoded.scaling == dtypes.PerAxis(0)
    assert made.format.name == name
    for i in range(W.shape[0]):  # each slice as it would be encoded alone
        alone = Tensor(W[i]).to_reduced_precision(name, scaling=per_tensor)
        np.testing.assert_array_equal(np.asarray(made)[i], np.asarray(alone))
    # a consistent Tensor: it indexes, saves and loads like one made directly
    direct = Tensor(W).to_reduced_precision(name, scaling=dtypes.PerAxis(0))
    np.testing.assert_array_equal(np.asarray(made), np.asarray(direct))
    assert made.nbytes == direct.nbytes


def test_several_axes_round_trip_through_a_checkpoint(tmp_path):
    t = Tensor(W).to_reduced_precision("int4", scaling=dtypes.PerAxis((0, -1)))
    path = tmp_path / "stack.safetensors"
    precision.save(path, {"w": t})
    back = precision.load(path)["w"]
    assert back.encoded.scaling == dtypes.PerAxis((0, -1))
    np.testing.assert_array_equal(np.asarray(back), np.asarray(t))


@pytest.mark.parametrize("axis", [[0], [0, 0], [0, "1"], [0, 2**40], [], [0, True]])
def test_the_reader_refuses_axis_lists_no_writer_writes(axis):
    spec = {"type": "per-axis", "axis": axis, "power_of_two": False, "scale_format": "float32"}
    with pytest.raises(CheckpointError):
        scaling_from_json(spec)
