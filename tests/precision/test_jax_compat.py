"""`precision._jax_compat` reads the equation parameters that JAX releases spell
differently: both spellings, and this JAX's own equations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from precision._jax_compat import scan_counts, while_counts


class _FlatInputs:
    """Stands in for jax 0.11's `ft_in`: (consts, carry, xs), each with a length."""

    def __init__(self, *lengths: int) -> None:
        self.parts = [list(range(n)) for n in lengths]

    def unpack(self) -> list[list[int]]:
        return self.parts


def test_scan_counts_reads_both_spellings():
    assert scan_counts({"num_consts": 2, "num_carry": 1, "jaxpr": None}) == (2, 1)
    assert scan_counts({"ft_in": _FlatInputs(2, 1, 3), "jaxpr": None}) == (2, 1)


def test_the_counts_of_this_jax_s_own_loops():
    w, b = jnp.ones(3), jnp.zeros(3)

    def scanned(c, xs):
        return lax.scan(lambda c, x: (c * w + b + x, c), c, xs)

    eqn = next(e for e in jax.make_jaxpr(scanned)(jnp.ones(3), jnp.ones((4, 3))).eqns)
    assert eqn.primitive.name == "scan"
    assert scan_counts(eqn.params) == (2, 1)  # w and b closed over, one carry

    def looped(c):
        return lax.while_loop(lambda c: c[0] < w[0] * 5, lambda c: c + b + 1, c)

    eqn = next(e for e in jax.make_jaxpr(looped)(jnp.ones(3)).eqns if e.primitive.name == "while")
    assert while_counts(eqn.params) == (1, 1)
