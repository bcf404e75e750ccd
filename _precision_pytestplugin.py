"""The pytest plugin of `precision.testing` (entry point `pytest11`): `fmt`, `run`, `formats`.

pytest imports every installed `pytest11` plugin at startup, before any
`conftest.py` runs. This module therefore lives outside the `precision`
package and imports nothing but pytest: importing `precision` would import
JAX, and a project's conftest must still be the first to decide how JAX
starts (`XLA_FLAGS=--xla_force_host_platform_device_count=4`,
`JAX_PLATFORMS`, memory settings). The registry, numpy and JAX load only
when a collected test asks for `fmt` or `run`; the implementation is in
`precision.testing._plugin`.

Disable it for one run with `pytest -p no:precision`.
"""

from __future__ import annotations

from typing import Any

import pytest

_MARKER_HELP = (
    "formats(*names, kinds=None, min_bits=1, max_bits=64): run a test that takes the `fmt` "
    "fixture over only these formats; kinds are Format.kind values ('float', 'int', 'uint', "
    "'codebook', 'scale'), all when None (precision.testing)"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _MARKER_HELP)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "fmt" not in metafunc.fixturenames:
        return  # the common case: nothing of precision is imported
    defs = getattr(metafunc, "_arg2fixturedefs", {}).get("fmt")
    if defs and getattr(getattr(defs[-1], "func", None), "__module__", __name__) != __name__:
        return  # a conftest's own `fmt` fixture: not ours, nothing to import
    from precision.testing._plugin import parametrize_fmt

    parametrize_fmt(metafunc, __name__)


# Session scope: formats are immutable values, and hypothesis refuses
# function-scoped fixtures in @given tests (they are not reset between inputs).
@pytest.fixture(scope="session")
def fmt(request: pytest.FixtureRequest) -> Any:
    """Each entry of `dtypes.REGISTRY` in turn (narrow with `@pytest.mark.formats(...)`).

    A test that takes `fmt` is collected once per format or named encoding,
    with its name as its id: `test_round[bfloat16]`, `test_round[int4]`,
    `test_round[mxfp4]`, `test_round[nf4]`, ...
    """
    return request.param


@pytest.fixture(scope="session")
def run() -> Any:
    """Run a function eagerly and under `jax.jit`, assert equal bits, return the result.

    Examples: `y = run(fmt.round, x)`; `y = run(f, x, axis=0)` (keywords static).
    """
    from precision.testing._plugin import EagerAndJit

    return EagerAndJit()
