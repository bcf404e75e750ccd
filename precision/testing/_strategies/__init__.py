"""Hypothesis strategies for formats, rounding modes, scalings and the data they hold.

hypothesis cannot build bfloat16, float8 or int4 values itself (it refuses
their dtypes), so these strategies draw float32 data: bit patterns decoded
exactly for grid values, and hand-picked families for the cases that break
numerical code (signed zeros, subnormals, the smallest normal, the top of the
range and just past it, exact ties between neighbours and the float32 values
beside them, NaN and infinities).

Every strategy is built so that a failing example shrinks toward small,
simple values: each is a `one_of` whose first branch holds the simplest
cases (zero first), and grid values come from integer codes that grow with
the magnitude, so shrinking a code shrinks the value.
"""

from ._arrays import arrays as arrays
from ._arrays import tensors as tensors
from ._formats import formats as formats
from ._formats import keys as keys
from ._formats import roundings as roundings
from ._formats import scalings as scalings
from ._values import representable as representable
from ._values import values as values

__all__ = [
    "arrays",
    "formats",
    "keys",
    "representable",
    "roundings",
    "scalings",
    "tensors",
    "values",
]
