"""The pytest plugin: `fmt` over the registry, the `formats` marker, the `run` fixture.

The plugin is loaded in this very session (entry point), so the tests below
use it directly; a user's view is checked by running pytest on a small test
file in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dtypes
from precision.testing import arrays, assert_representable
from precision.testing._plugin import EagerAndJit, selected_formats

SEEN: set[str] = set()


def test_fmt_is_each_registered_format(fmt, request):
    assert request.node.callspec.id == fmt.name
    assert dtypes.get(fmt.name) == fmt
    assert dtypes.REGISTRY[fmt.name] is fmt  # named encodings included


@pytest.mark.formats(kinds="int")
def test_marker_narrows_to_kinds(fmt):
    assert fmt.kind == "int"


@pytest.mark.formats("bf16", "e4m3")
def test_marker_takes_names_and_aliases(fmt, request):
    assert request.node.callspec.id in ("bfloat16", "float8_e4m3fn")


@pytest.mark.parametrize("fmt", [dtypes.int4], ids=["own"])
def test_explicit_parametrize_wins(fmt, request):
    assert request.node.callspec.id == "own"


@pytest.mark.formats("bfloat16", "float8_e4m3fn")
@settings(max_examples=10)
@given(st.data())
def test_fmt_works_with_given_and_run(fmt, run, data):
    x = data.draw(arrays(fmt, 8, allow_nan=False))
    y = run(fmt.round, x)
    assert_representable(y, fmt)


def test_selected_formats():
    names = [f.name for f in selected_formats()]
    # every entry of the registry, element formats and named encodings alike, but float64:
    # this suite runs without jax_enable_x64
    assert names == [n for n in dtypes.REGISTRY if n != "float64"]
    assert {"mxfp4", "nvfp4", "nf4", "uint4", "float8_e8m0fnu"} <= set(names)
    assert [f.name for f in selected_formats(kinds="float", min_bits=8, max_bits=16)] == [
        "bfloat16",
        "float16",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3",
        "float8_e3m4",
        "mxfp8_e4m3",
        "mxfp8_e5m2",
    ]
    assert [f.name for f in selected_formats(kinds=("codebook", "uint"))] == [
        "nf4",
        "uint8",
        "uint4",
    ]
    assert [f.name for f in selected_formats("float64")] == ["float64"]
    with pytest.raises(ValueError, match="selects no format"):
        selected_formats(kinds="int", min_bits=16)
    with pytest.raises(ValueError, match="'float' or 'int'"):
        selected_formats(kinds="complex")


def test_run_returns_the_eager_result_and_checks_jit():
    run = EagerAndJit()
    x = jnp.float32([1.0, 2.5, np.nan])
    np.testing.assert_array_equal(run(lambda v: v * 2, x), [2.0, 5.0, np.nan])
    eager, jitted = run.both(jnp.sum, x[:2], axis=0)
    assert float(eager) == float(jitted) == 3.5


def test_run_reports_a_difference_between_eager_and_jit():
    def differs(x):
        # Under jit the Python-side branch sees a tracer, eagerly a concrete array.
        return x + (1.0 if isinstance(x, jax.core.Tracer) else 0.0)

    with pytest.raises(AssertionError, match=r"differs: eager and jitted results differ in 1 of"):
        EagerAndJit()(differs, jnp.float32([1.0]))


def test_run_reports_a_structure_difference():
    def structure(x):
        return (x,) if isinstance(x, jax.core.Tracer) else [x]

    with pytest.raises(AssertionError, match="differ in structure"):
        EagerAndJit()(structure, jnp.float32(1.0))


USER_TEST = """
import pytest

def test_every_format(fmt):
    assert fmt.bits >= 1

@pytest.mark.formats(kinds="float", max_bits=8)
def test_float8(fmt, run):
    import numpy as np
    assert run(fmt.round, np.float32([1.0, 3.0])).tolist() == [1.0, 3.0]

def test_no_fmt_no_parametrization():
    pass
"""


OWN_FIXTURE_CONFTEST = """
import pytest

@pytest.fixture
def fmt():
    return "mine"
"""

OWN_FIXTURE_TEST = """
def test_own_fmt(fmt):
    assert fmt == "mine"
"""


def test_a_users_suite_gets_fmt_from_the_installed_plugin(tmp_path):
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TEST))
    own = tmp_path / "own"
    own.mkdir()
    (own / "conftest.py").write_text(textwrap.dedent(OWN_FIXTURE_CONFTEST))
    (own / "test_own.py").write_text(textwrap.dedent(OWN_FIXTURE_TEST))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    passed = {line.split("::")[-1] for line in result.stdout.splitlines() if "PASSED" in line}
    ids = {p.split()[0] for p in passed}
    every = ("bfloat16", "int4", "int1", "mxfp4", "nvfp4", "nf4", "uint4", "float8_e8m0fnu")
    assert {f"test_every_format[{name}]" for name in every} <= ids
    assert "test_every_format[float64]" not in ids
    assert {"test_float8[float8_e4m3fn]", "test_float8[float8_e5m2]", "test_float8[mxfp4]"} <= ids
    assert not any(i.startswith("test_float8[bfloat16") for i in ids)
    assert "test_no_fmt_no_parametrization" in ids
    assert "test_own_fmt" in ids  # a conftest's own `fmt` fixture wins, unparametrized


def test_loading_the_plugin_imports_neither_hypothesis_nor_the_strategies():
    code = (
        "import sys, precision.testing._plugin; "
        "print('hypothesis' in sys.modules, 'precision.testing._strategies' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "False"]


def test_the_entry_point_is_the_top_level_module():
    from importlib.metadata import entry_points

    (point,) = [e for e in entry_points(group="pytest11") if e.name == "precision"]
    assert point.value == "_precision_pytestplugin"


# A project that knows nothing of precision: its conftest configures JAX the
# common way (environment variables read when the backend starts). numpy is
# not checked: other installed plugins (jaxtyping's) import it.
FOUR_DEVICES_CONFTEST = """
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
HEAVY_AT_CONFTEST = sorted(m for m in ("jax", "precision", "dtypes") if m in sys.modules)
"""

FOUR_DEVICES_TEST = """
import conftest


def test_nothing_heavy_was_imported_before_the_conftest():
    assert conftest.HEAVY_AT_CONFTEST == []


def test_the_conftest_decides_the_device_count():
    import jax

    assert jax.device_count() == 4
"""


@pytest.mark.parametrize("plugin", ["active", "disabled"])
def test_a_projects_conftest_still_configures_jax(tmp_path, plugin):
    (tmp_path / "conftest.py").write_text(FOUR_DEVICES_CONFTEST)
    (tmp_path / "test_devices.py").write_text(FOUR_DEVICES_TEST)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.pop("PYTEST_PLUGINS", None)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"]
    if plugin == "disabled":
        args += ["-p", "no:precision"]
    result = subprocess.run(
        [*args, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
    if plugin == "active":  # the plugin really was loaded in that session
        probe = subprocess.run(
            [*args, "--markers", str(tmp_path)],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=240,
            check=True,
        )
        assert "@pytest.mark.formats(" in probe.stdout


OWN_FMT_NO_IMPORT_CONFTEST = """
import pytest

@pytest.fixture
def fmt():
    return "the project's own"
"""

OWN_FMT_NO_IMPORT_TEST = """
import sys

def test_own_fmt_and_nothing_of_precision_imported(fmt):
    assert fmt == "the project's own"
    assert "precision" not in sys.modules
    assert "dtypes" not in sys.modules

def test_unrelated():
    assert "precision" not in sys.modules
"""


def test_a_session_that_never_uses_the_fixtures_never_imports_precision(tmp_path):
    (tmp_path / "conftest.py").write_text(OWN_FMT_NO_IMPORT_CONFTEST)
    (tmp_path / "test_own.py").write_text(OWN_FMT_NO_IMPORT_TEST)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
