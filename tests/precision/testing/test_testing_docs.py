"""The `>>>` examples of docs/testing.md run, and its worked example is the tested one."""

from __future__ import annotations

import doctest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "testing.md"


def test_the_page_examples_run():
    result = doctest.testfile(str(PAGE), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8
    assert result.failed == 0


def test_the_worked_example_matches_the_example_file():
    # The page shows the kernels of examples/naive_sum_property_test.py verbatim.
    page = PAGE.read_text()
    source = (ROOT / "examples" / "naive_sum_property_test.py").read_text()
    for kernel in ("def naive_sum", "def fixed_sum"):
        body = source[source.index(kernel) :].split("\n\n\n")[0]
        assert body in page, f"docs/testing.md is out of date with the example's {kernel}"
    data_line = next(line for line in source.splitlines() if line.startswith("data = "))
    assert data_line in page
