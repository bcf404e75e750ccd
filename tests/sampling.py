"""How much of a long sweep the default run takes; the `hunt` profile takes all of it.

A sweep over every registry entry x scaling x mode compiles a program per
combination, and the README's `pytest` must stay short (tests/conftest.py: the
`ci` profile). Such a sweep runs a principled sample by default, a
representative of each code path, with a comment at the call saying why the
sample reaches every path, and all of it under `HYPOTHESIS_PROFILE=hunt`.
tests/ is on `sys.path` (tests/conftest.py lives there), so test files
anywhere below import this as `from sampling import ...`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

#: The long search before a release (tests/conftest.py registers the profile).
HUNT = os.environ.get("HYPOTHESIS_PROFILE") == "hunt"


def sample(cases: Iterable[T], keep: Callable[[T], bool]) -> list[T]:
    """Every case under the hunt profile; else those `keep` admits, in order."""
    every = list(cases)
    chosen = [c for c in every if HUNT or keep(c)]
    if every and not chosen:
        raise AssertionError(f"{keep.__name__} keeps none of {len(every)} cases")
    return chosen
