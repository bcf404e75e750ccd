"""The documentation cannot drift from the code.

- The format tables on docs/formats.md are built from the registry by docs/hooks.py;
  their numbers are checked here against ml_dtypes and exact powers of two.
- The MX footprint table is checked against byte counts worked out by hand.
- Every code block of the README and the docs runs: tests/test_docs_blocks.py.
- The README's first screen holds the two one-line commands.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import yaml

import dtypes

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

MAIN_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[demo]' && precision demo"
)
TEST_COMMAND = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && pytest"


def _load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()


def _table(markdown: str) -> list[dict[str, str]]:
    """The rows of the one Markdown table in `markdown`, keyed by header (backticks dropped)."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    head = [c.strip().strip("`") for c in lines[0].strip("|").split(" | ")]
    assert set(lines[1].replace("|", "")) == {"-"}
    return [
        dict(zip(head, (c.strip() for c in line.strip("|").split(" | ")), strict=True))
        for line in lines[2:]
    ]


def _float_rows() -> list[dict[str, str]]:
    return _table(hooks.table(hooks.FLOAT_COLUMNS, hooks.float_rows()))


def _number_rows() -> list[dict[str, str]]:
    return _table(hooks.table(hooks.NUMBER_COLUMNS, hooks.number_rows(), code=True))


def _int_rows() -> list[dict[str, str]]:
    return _table(hooks.table(hooks.INT_COLUMNS, hooks.int_rows()))


def _value(cell: str) -> float:
    """A numeric cell: `65504`, `2^-126 ≈ 1.18e-38`, `(2 - 2^-7) × 2^127 ≈ 3.39e+38`."""
    cell = cell.split(" ≈ ")[0]
    if m := re.fullmatch(r"2\^(-?\d+)", cell):
        return math.ldexp(1.0, int(m[1]))
    if m := re.fullmatch(r"\(2 - 2\^(-\d+)\) × 2\^(\d+)", cell):
        return math.ldexp(2.0 - math.ldexp(1.0, int(m[1])), int(m[2]))
    return float(cell)


def test_formats_page_has_the_marker_and_the_hook_fills_it():
    source = (DOCS / "formats.md").read_text()
    assert source.count(hooks.MARKER) == 1
    assert source.count(hooks.MX_MARKER) == 1
    rendered = hooks.on_page_markdown(source, page=None, config=None, files=None)
    assert hooks.MARKER not in rendered
    assert hooks.MX_MARKER not in rendered
    assert hooks.format_table() in rendered
    assert hooks.mx_table() in rendered


def test_format_tables_list_the_registry_in_order():
    rendered = hooks.format_table()
    assert rendered.count(f'<div class="{hooks.TABLE_CLASS}" markdown>') == 3
    floats, numbers, ints = _float_rows(), _number_rows(), _int_rows()
    assert hooks.table(hooks.FLOAT_COLUMNS, hooks.float_rows()) in rendered
    assert hooks.table(hooks.NUMBER_COLUMNS, hooks.number_rows(), code=True) in rendered
    assert hooks.table(hooks.INT_COLUMNS, hooks.int_rows()) in rendered
    names = [row["name"].strip("`") for row in floats + ints]
    assert names == list(dtypes.FORMATS)
    assert [row["name"] for row in numbers] == [row["name"] for row in floats]
    for row in floats + ints:
        fmt = dtypes.FORMATS[row["name"].strip("`")]
        aliases = {a for a, name in dtypes.ALIASES.items() if name == fmt.name}
        assert set(re.findall(r"`([^`]+)`", row["aliases"])) == aliases
        assert int(row["bits"]) == fmt.bits
        assert row["container"].split(" ")[0].strip("`") == fmt.container.name
        assert ("packed" in row["container"]) == fmt.packed
    assert all(dtypes.FORMATS[r["name"].strip("`")].kind == "float" for r in floats)
    assert all(dtypes.FORMATS[r["name"].strip("`")].kind == "int" for r in ints)


def test_format_tables_fit_a_page():
    # A 1280-px page leaves about 690 px for a table (docs/screenshots.py checks it in a
    # browser): at most six columns, and no cell but the notes longer than a number.
    for columns in (hooks.FLOAT_COLUMNS, hooks.NUMBER_COLUMNS, hooks.INT_COLUMNS):
        assert len(columns) <= 6
    for row in hooks.float_rows() + hooks.number_rows() + hooks.int_rows():
        assert all(len(cell) <= 40 for cell in row[:-1] if "per group" not in cell), row


@pytest.mark.parametrize(
    "name", [n for n, f in dtypes.FORMATS.items() if f.kind == "float" and f.native_dtype]
)
def test_format_table_numbers_match_ml_dtypes(name):
    row = next(r for r in _number_rows() if r["name"] == f"`{name}`")
    info = ml_dtypes.finfo(dtypes.FORMATS[name].native_dtype)
    assert _value(row["max"]) == float(info.max)
    assert _value(row["min_normal"]) == float(info.smallest_normal)
    assert _value(row["smallest_subnormal"]) == float(info.smallest_subnormal)
    assert _value(row["eps"]) == float(info.eps)


def test_format_table_numbers_of_tf32():
    # tf32: float32's exponent range with 10 mantissa bits.
    row = next(r for r in _number_rows() if r["name"] == "`tf32`")
    assert _value(row["max"]) == (2 - 2**-10) * 2.0**127
    assert _value(row["min_normal"]) == 2.0**-126
    assert _value(row["smallest_subnormal"]) == 2.0**-136
    assert _value(row["eps"]) == 2.0**-10


def test_format_table_integer_rows():
    for row in _int_rows():
        fmt = dtypes.FORMATS[row["name"].strip("`")]
        qmax = 1 if fmt.bits == 1 else 2 ** (fmt.bits - 1) - 1
        assert row["qmax"] == str(qmax)


def test_mx_table_bytes():
    # 1024*1024 values: MX stores one E8M0 byte per block of 32; NVFP4 one e4m3 byte per
    # block of 16 and a 4-byte float32 tensor scale.
    n = 1024 * 1024
    expected = {  # element bits per value, bytes of scales
        "MXFP8 (E4M3)": (8, n // 32),
        "MXFP8 (E5M2)": (8, n // 32),
        "MXFP6 (E3M2)": (6, n // 32),
        "MXFP6 (E2M3)": (6, n // 32),
        "MXFP4": (4, n // 32),
        "MXINT8": (8, n // 32),
        "NVFP4": (4, n // 16 + 4),
    }
    rows = _table(hooks.mx_table())
    assert [row["composition"] for row in rows] == list(expected)
    for row in rows:
        bits, scale_bytes = expected[row["composition"]]
        got = int(row["bytes of a 1024×1024 tensor"].replace(",", ""))
        assert got == n * bits // 8 + scale_bytes


def test_mx_compositions_encode_with_power_of_two_block_scales():
    x = np.linspace(-3, 5, 64, dtype=np.float32).reshape(2, 32)
    mx = dtypes.PerBlock(32, power_of_two=True)
    for fmt in hooks.mx_formats().values():
        enc = fmt.encode(x, scaling=mx)
        scale = np.asarray(enc.scale)
        assert scale.shape == (2, 1)
        mantissa, _ = np.frexp(scale)
        assert np.all(mantissa == 0.5), f"{fmt.name} MX scales are not powers of two: {scale}"
        assert enc.nbytes == fmt.nbytes(x.shape, mx)


def test_the_jax_versions_tested_are_the_documented_ones():
    # .ci/run fails unless JAX_VERSIONS_TESTED is exactly the JAX releases its suites ran
    # on; the README and the install section say the same versions.
    from precision._jax_compat import JAX_VERSIONS_TESTED

    for page in (ROOT / "README.md", DOCS / "getting-started.md"):
        named = re.findall(r"\bjax\s+(\d+\.\d+\.\d+(?:\.\d+)?)\s+\(Python", page.read_text())
        assert tuple(named) == JAX_VERSIONS_TESTED, page.name


def test_readme_first_screen_has_the_two_commands():
    first = (ROOT / "README.md").read_text().splitlines()[:40]
    assert MAIN_COMMAND in first
    assert TEST_COMMAND in first


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]'" in ci
    assert "mkdocs build --strict" in ci


def _nav(items):
    """(title, page) of every entry of the nav, sections flattened; a bare page's title is None."""
    for item in items:
        title, value = next(iter(item.items())) if isinstance(item, dict) else (None, item)
        if isinstance(value, list):
            yield from _nav(value)
        else:
            yield title, value


def test_nav_pages_exist():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    entries = list(_nav(config["nav"]))
    assert [p for _, p in entries if not (DOCS / p).is_file()] == []
    pages = {page for _, page in entries}
    assert [p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).as_posix() not in pages] == []
    titles = [next(iter(entry)) for entry in config["nav"]]
    assert titles == [
        "Home",
        "Getting started",
        "Concepts",
        "Formats",
        "Training",
        "Models",
        "Calibrated conversion",
        "Explain",
        "Will it be faster?",
        "Testing",
        "Command line",
        "Reliability",
        "Design",
        "Benchmarks",
        "API reference",
    ]


def test_apply_is_one_click_from_the_nav():
    # The API reference is a section of the nav: its pages are listed under it, apply's first.
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    api = next(entry["API reference"] for entry in config["nav"] if "API reference" in entry)
    assert api[0] == "api/index.md"
    title, page = next(iter(api[1].items()))
    assert page == "api/apply.md"
    assert title.startswith("apply")
    assert re.search(r"^::: precision\.apply$", (DOCS / page).read_text(), flags=re.M)


def _browser_missing(reason: str) -> None:
    """Skip, or fail where the browser is required: .ci/run installs it and sets
    PRECISION_REQUIRE_BROWSER=1, so CI never passes with this check skipped."""
    if os.environ.get("PRECISION_REQUIRE_BROWSER") == "1":
        pytest.fail(f"PRECISION_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def test_screenshots_show_no_horizontal_overflow(tmp_path):
    # docs/screenshots.py in headless Chromium: the formats page and the API index at
    # 1280 px, every table and code block within its box, no format name broken.
    if importlib.util.find_spec("playwright") is None:
        _browser_missing("playwright is not installed (pip install playwright)")
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        _browser_missing("no Chromium on the PATH (apt-get install chromium)")
    result = subprocess.run(
        [sys.executable, str(DOCS / "screenshots.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "no horizontal overflow at 1280 px" in result.stdout
    assert {p.name for p in tmp_path.glob("*.png")} >= {"formats-1280.png", "api-1280.png"}
