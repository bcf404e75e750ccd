"""The one table of primitives holds every primitive JAX's numpy, lax, nn and scipy
define on the JAX installed, and the walk names any primitive it does not hold."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.extend import core as jex

import precision
from precision import _primitives

_ENUMERATE = """
import jax, jax.numpy, jax.lax, jax.nn, jax.scipy, jax.scipy.special, jax.scipy.linalg
from precision._jax_compat import primitive_names
print("\\n".join(sorted(primitive_names())))
"""


def test_the_table_holds_every_primitive_of_numpy_lax_nn_and_scipy():
    """In a fresh process, so that only JAX's own modules (and precision's) are loaded."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", _ENUMERATE], capture_output=True, text=True, env=env, check=True
    )
    names = set(done.stdout.split())
    assert len(names) > 200  # the enumeration did run
    missing = sorted(names - set(_primitives.PRIMITIVES))
    assert not missing, (
        f"jax {jax.__version__} defines primitives precision/_primitives.py does not hold: "
        f"{missing}; give each its kind there"
    )


def test_every_kind_is_a_kind_and_the_derived_sets_nest():
    assert set(_primitives.PRIMITIVES.values()) <= set(_primitives.KINDS)
    assert _primitives.CUTS <= _primitives.CODE_MOVES <= _primitives.MOVES
    assert _primitives.IDENTITIES <= _primitives.MOVES
    assert not _primitives.MOVES & _primitives.GRID
    assert _primitives.kind_of("dot_general") == "contraction"
    assert _primitives.kind_of("no such primitive") is None


def test_a_primitive_the_table_does_not_hold_is_named_and_computed_as_compute():
    twice_p = jex.Primitive("precision_test_twice")
    twice_p.def_impl(lambda x: x * 2)
    twice_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    jax.interpreters.mlir.register_lowering(
        twice_p, jax.interpreters.mlir.lower_fun(lambda x: x * 2, multiple_results=False)
    )
    t = precision.Tensor(jnp.array([1.0, 1.5], jnp.float32)).to_reduced_precision("bfloat16")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = precision.apply(lambda x: twice_p.bind(x) + 0.01)(t)
    named = [w for w in seen if issubclass(w.category, precision.PrecisionFallbackWarning)]
    assert len(named) == 1
    assert "precision_test_twice" in str(named[0].message)
    assert out.format.name == "bfloat16"
    bf16 = ml_dtypes.bfloat16
    want = np.float32([2.0, 3.0]).astype(bf16).astype(np.float32) + np.float32(bf16(0.01))
    np.testing.assert_array_equal(out.numpy(), want.astype(bf16).astype(np.float32))
    assert out.numpy()[0] != np.float32(2.0) + np.float32(0.01)  # (rounded, visibly)
