"""Suite-wide configuration: hypothesis profiles, strict JAX promotion, eager/jit variants.

Hypothesis profiles live here and nowhere else: `dev` (quick, the default),
`ci` (thorough and derandomized, so a run on a clean clone is reproducible),
chosen by the `CI` environment variable (`CI=true`), and `hunt` (many random
examples, for looking for counterexamples before a release), chosen by
`HYPOTHESIS_PROFILE=hunt`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator

import jax
import pytest
from hypothesis import HealthCheck, settings


def _import_real_packages() -> None:
    """Import `dtypes` and `precision` themselves before their test folders shadow them.

    tests/ mirrors the packages without `__init__.py` files, and pytest puts
    tests/ on sys.path to import this file; `import dtypes` would then find
    tests/dtypes as a namespace package ahead of the editable install.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import dtypes  # noqa: F401
        import precision  # noqa: F401
    finally:
        sys.path[:] = saved


_import_real_packages()

settings.register_profile(
    "dev",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# `ci` is sized so the whole suite fits CI's time on two cores: 100 examples per
# property (200 cost about 3 more minutes there); `hunt` runs ten times as many.
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "hunt",
    max_examples=1000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if _ci else "dev"))

# One compilation cache for the whole run. The suite is compile-bound, and the same
# programs (an encoder at a shape, a model's step) are compiled in many tests, in both
# xdist workers and in the subprocesses tests start; XLA keys each entry by the program,
# the JAX and XLA versions, the XLA flags and the devices, so a cached executable is the
# one the compiler would give again. The directory is made by the first process of the
# run (pytest's controller), reaches the others through the environment and is removed
# at the end; a cache the user configured (JAX_COMPILATION_CACHE_DIR) is used as it is.
_CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
_own_cache: str | None = None
if not os.environ.get(_CACHE_VARIABLE):
    _own_cache = tempfile.mkdtemp(prefix="precision-tests-xla-cache-")
    os.environ[_CACHE_VARIABLE] = _own_cache
    # Every program, however quick to compile: most of the suite's are small.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    jax.config.update("jax_compilation_cache_dir", _own_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _own_cache is not None:
        shutil.rmtree(_own_cache, ignore_errors=True)


# Mixing ranks or dtypes implicitly is refused in the whole suite, so the
# library cannot rely on it by accident.
jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


# The test files that depend most on how a JAX release works inside: those that read its
# jaxprs (apply's interpreter and its independent reference, calibration's walk, the
# per-primitive rules), its compiled text (explain, contractions), its tracers and
# transformations (autodiff, vmap/scan stacks, sharding, `__jax_array__`, first use), the
# libraries built on it (models) and XLA's flags (backend bits). They carry the
# `jax_internals` marker: `pytest -m jax_internals` runs them alone, and .ci/run runs them
# a second time on the newest Python there, with the JAX pip installs for it.
JAX_INTERNALS = frozenset(
    {
        "tests/dtypes/test_backend_bits.py",
        "tests/dtypes/test_backend_forms.py",
        "tests/precision/test_apply.py",
        "tests/precision/test_autodiff.py",
        "tests/precision/test_calibrate.py",
        "tests/precision/test_calibrate_structures.py",
        "tests/precision/test_compute_rules.py",
        "tests/precision/test_contract.py",
        "tests/precision/test_explain.py",
        "tests/precision/test_first_use_order.py",
        "tests/precision/test_gpu_programs.py",
        "tests/precision/test_jax_compat.py",
        "tests/precision/test_mixing.py",
        "tests/precision/test_models.py",
        "tests/precision/test_policy.py",
        "tests/precision/test_primitives.py",
        "tests/precision/test_roofline.py",
        "tests/precision/test_sharding.py",
        "tests/precision/test_stacked.py",
        "tests/precision/test_stacks.py",
        "tests/precision/test_tensor.py",
        "tests/precision/test_walk.py",
    }
)
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if os.path.relpath(item.path, _ROOT).replace(os.sep, "/") in JAX_INTERNALS:
            item.add_marker(pytest.mark.jax_internals)


@pytest.fixture(params=["eager", "jit"])
def eager_and_jit(request) -> Callable[[Callable], Callable]:
    """Run the test body's function eagerly and under `jax.jit` (one test each).

    Usage: `f = eager_and_jit(lambda x: fmt.round(x)); f(x)`.
    """
    if request.param == "eager":
        return lambda f: f
    return jax.jit


@pytest.fixture
def x64() -> Iterator[None]:
    """64-bit JAX for one test (`jax_enable_x64`), restored afterwards."""
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)
