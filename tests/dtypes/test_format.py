"""The `Format` base: storage sizes, for every format, against the arrays really held.

`data_shape` and `nbytes` are computed from a format's numbers alone (no
JAX); here they are compared with what `encode` actually produces, and the
packed length with exact integer arithmetic. The formats are every entry of
`dtypes.REGISTRY`, through the `fmt` fixture of `precision.testing`'s plugin
(float64 where 64-bit JAX is on: it cannot encode without it).
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import dtypes
from dtypes._format import packed_length, packed_nbytes

SHAPES = [(), (5,), (3, 33)]


def test_sizes_match_the_encoded_arrays(fmt):
    rng = np.random.default_rng(len(fmt.name))
    # (a scalar has no axis to cut into blocks: block-scaled formats refuse it)
    blocked = isinstance(fmt.default_scaling(), dtypes.PerBlock)
    for shape in SHAPES[1:] if blocked else SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        if fmt.kind == "scale":  # E8M0 holds positive values only
            x = np.abs(x) + 0.5
        enc = fmt.encode(x)
        assert tuple(enc.data.shape) == fmt.data_shape(shape), (fmt.name, shape)
        assert enc.nbytes == fmt.nbytes(shape), (fmt.name, shape)
        assert enc.shape == shape


def test_sizes_run_over_every_registry_entry():
    """No marker narrows the plugin's `fmt`: every registry entry (float64 under 64-bit JAX)."""
    import jax
    from checks import params_of

    from precision.testing._plugin import selected_formats

    assert "fmt" in inspect.signature(test_sizes_match_the_encoded_arrays).parameters
    assert not params_of(test_sizes_match_the_encoded_arrays)  # no `formats` marker
    x64 = jax.config.read("jax_enable_x64")
    assert selected_formats() == [f for f in dtypes.REGISTRY.values() if x64 or f.bits <= 32]


@pytest.mark.parametrize("bits", range(1, 17))
def test_packed_length_is_the_exact_ceiling(bits):
    for n in [*range(0, 70), 2**31 + 3, 10**6 + 1]:
        assert packed_length(n, bits) == -(-(n * bits) // 8)
        assert packed_nbytes((7, n), bits) == 7 * -(-(n * bits) // 8)
    assert packed_nbytes((), bits) == math.ceil(bits / 8)
