"""Code-book formats: each code indexes a sorted table of values (NF4 built in).

A storage encoding: values are scaled per group so the group's absmax maps to
the table's largest magnitude, then each is replaced by the index of a table
entry, packed densely at `ceil(log2(len(values)))` bits. Decoding is a table
look-up times the group's scale.

Rounding to table entries:

- `nearest_even`: the nearest entry; a value exactly halfway between two
  neighbours goes to the one with the even index. The halfway points are
  computed exactly (as fractions, when the format is built) and the
  comparisons are made against their float32 neighbours, so the choice is
  exact for every float32.
- `stochastic`: between neighbours `a <= y <= b`, `b` with probability
  `(y - a) / (b - a)` (unbiased inside the table's range); values beyond the
  table go to its end entries.

Other modes have no meaning for a table that need not be a grid and are
refused.

The class, its table and the exact halfway points need only numpy; its
operations are computed in its codec, `_codebook_codec`, which `Format`'s
methods import on first use.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from ._argument_checks import check_format_fields, check_scaling_field, resolve_scaling
from ._errors import FormatError, PrecisionTypeError
from ._format import Format, packed_nbytes
from ._scaling import PerBlock, PerTensor, Scaling, scale_nbytes, shape_of

__all__ = ["NF4_VALUES", "CodebookFormat", "nf4"]


@dataclasses.dataclass(frozen=True)
class CodebookFormat(Format):
    """A format whose codes index `values`, a sorted table of float32 numbers.

    Args:
        values: the table (2 to 65536 distinct finite numbers, any order;
            kept sorted as float32).
        scaling: the default scaling (per-tensor absmax when omitted); a
            group's scale is `absmax / max(|values|)`.
        name: display name (default `codebook<n>`).

    Examples:
        >>> import numpy as np
        >>> fmt = CodebookFormat([-1.0, 0.0, 0.5, 1.0], name="tiny")
        >>> fmt.bits, fmt.values
        (2, (-1.0, 0.0, 0.5, 1.0))
        >>> enc = fmt.encode(np.array([0.2, 0.3, -2.0, 1.6], np.float32))
        >>> enc.decode().tolist(), enc.nbytes  # one byte of codes, a float32 scale
        ([0.0, 0.0, -2.0, 2.0], 5)
    """

    values: Sequence[float]  # any sequence of numbers; kept as a sorted tuple of float32s
    scaling: Scaling | None = dataclasses.field(default=None, kw_only=True)
    name: str = dataclasses.field(default="", kw_only=True, compare=False)

    kind: ClassVar[str] = "codebook"
    _codec: ClassVar[str] = "_codebook_codec"

    def __post_init__(self) -> None:
        check_scaling_field(self, self.scaling)
        try:
            table = np.asarray(self.values, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise PrecisionTypeError(
                f"CodebookFormat needs a sequence of numbers, got {self.values!r}"
            ) from None
        # sorted and distinct (as np.unique, whose first call imports numpy.ma: a fifth of
        # the command line's start)
        table32 = np.sort(table.astype(np.float32))
        table32 = table32[np.concatenate([[True], table32[1:] != table32[:-1]])]
        if not np.all(np.isfinite(table32)) or not 2 <= table32.size <= 1 << 16:
            raise FormatError(
                f"CodebookFormat needs 2 to 65536 distinct finite values, got {table.size} "
                f"({table32.size} distinct after rounding to float32); pass a table such as "
                "[-1.0, -0.5, 0.0, 0.5, 1.0]"
            )
        tiny = (table32 != 0) & (np.abs(table32) < np.float32(2.0**-126))
        if tiny.any():
            raise FormatError(
                f"CodebookFormat entries must be 0 or at least 2**-126 in magnitude, got the "
                f"float32 subnormal {float(table32[tiny][0])!r} (XLA on CPU reads subnormals as "
                "zero, so it could not be told apart from 0); scale the table up"
            )
        if np.max(np.abs(table32)) == 0:
            raise FormatError("a CodebookFormat table needs a nonzero entry to scale to")
        object.__setattr__(self, "values", tuple(float(v) for v in table32))
        if self.scaling is not None and not isinstance(self.scaling, Scaling):
            raise PrecisionTypeError(f"scaling must be a dtypes Scaling, got {self.scaling!r}")
        check_format_fields(self, "CodebookFormat(values)")
        if not self.name:
            object.__setattr__(self, "name", f"codebook{len(self.values)}")

    # -- numbers ---------------------------------------------------------
    @property
    def bits(self) -> int:
        """Code width: `ceil(log2(len(values)))`."""
        return max(1, math.ceil(math.log2(len(self.values))))

    @property
    def container(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def code_bits(self) -> int:
        return self.bits

    @property
    def max(self) -> float:
        """Largest magnitude in the table (what a group's absmax maps to)."""
        return float(max(abs(v) for v in self.values))

    def default_scaling(self) -> Scaling:
        return self.scaling if self.scaling is not None else PerTensor()

    def _table(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        return np.asarray(self.values, np.float32)

    def _thresholds(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        """float32 t_k with: code > k exactly when y > t_k (nearest, ties to even)."""
        return _thresholds(self.values)

    def nbytes(self, shape: tuple[int, ...], scaling: Scaling | None = None) -> int:
        """Packed codes plus the scales, at the scale format's width."""
        shape = shape_of(shape)
        scaling = resolve_scaling(self, scaling)
        assert scaling is not None  # a default scaling, always
        return packed_nbytes(shape, self.code_bits) + scale_nbytes(scaling, shape)

    def __repr__(self) -> str:
        return f"CodebookFormat(<{len(self.values)} values>, name={self.name!r})"


_TINY = np.float32(2.0**-126)  # float32's smallest normal


@functools.lru_cache(maxsize=64)
def _thresholds(values: tuple[float, ...]) -> np.ndarray[Any, np.dtype[np.float32]]:
    """See `CodebookFormat._thresholds` (cached: exact rational arithmetic per entry)."""
    from fractions import Fraction  # (only here: its import is most of `fractions`' cost)

    v = [Fraction(a) for a in values]
    out = []
    for k in range(len(v) - 1):
        mid = (v[k] + v[k + 1]) / 2  # exact
        upper_even = (k + 1) % 2 == 0
        # the largest float32 t with "y > t" meaning "y > mid" (or "y >= mid"
        # when the upper entry wins the tie)
        t = np.float32(float(mid))
        while Fraction(float(t)) > mid or (upper_even and Fraction(float(t)) == mid):
            t = np.nextafter(t, np.float32(-np.inf))
        while Fraction(float(np.nextafter(t, np.float32(np.inf)))) < mid or (
            not upper_even and Fraction(float(np.nextafter(t, np.float32(np.inf)))) == mid
        ):
            t = np.nextafter(t, np.float32(np.inf))
        if 0 < abs(t) < _TINY:  # a subnormal threshold, which XLA:CPU reads as zero:
            # the one that splits normals and zeros alike (values compared are flushed)
            t = np.float32(0.0) if t > 0 else np.float32(-_TINY)
        out.append(t)
    return np.asarray(out, np.float32)


# The NF4 table of QLoRA (Dettmers et al., 2023): the 16 values are quantiles
# of a standard normal distribution, scaled into [-1, 1], with an exact 0
# (8 positive levels from the quantiles in [0.5, 0.9677083], 7 negative).
NF4_VALUES = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)

nf4 = CodebookFormat(NF4_VALUES, scaling=PerBlock(64), name="nf4")
"""nf4: QLoRA's 4-bit normal-float code book, absmax scales per block of 64 (float32)."""
