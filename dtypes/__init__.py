"""Storage formats for reduced-precision numbers: pure numerics, no Tensor.

Each format encodes float values into the bytes it really needs (scaled and
packed where it is an integer format), decodes them back, and rounds onto its
grid in six rounding modes, bit-exactly and under `jit`, `vmap` and `grad`.
"""

# Names load on first use (the pattern of `precision/__init__.py`): `import
# dtypes` imports neither JAX nor the codecs, only numpy and ml_dtypes once a
# format is looked up. Describing formats (`dtypes.get("bf16").max`, the
# registry, scalings) never loads JAX; the first encode, decode or round does,
# as does `dtypes.Encoded` (a JAX pytree). Static tools and the docs read the
# names from the TYPE_CHECKING block.
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._asymmetric import AsymmetricIntFormat as AsymmetricIntFormat
    from ._codebook import CodebookFormat as CodebookFormat
    from ._e8m0 import E8M0Format as E8M0Format
    from ._encode_input_checks import is_tracer as is_tracer
    from ._encoded import Encoded as Encoded
    from ._errors import FormatError as FormatError
    from ._errors import FormatTypeError as FormatTypeError
    from ._errors import NonFiniteError as NonFiniteError
    from ._errors import PrecisionError as PrecisionError
    from ._errors import PrecisionTypeError as PrecisionTypeError
    from ._errors import RoundingError as RoundingError
    from ._errors import ScalingError as ScalingError
    from ._errors import ShapeError as ShapeError
    from ._float import FloatFormat as FloatFormat
    from ._format import Format as Format
    from ._from_codes import from_codes as from_codes
    from ._ieee import astype as astype
    from ._int import IntFormat as IntFormat
    from ._per_group import computed_once as computed_once
    from ._registry import ALIASES as ALIASES
    from ._registry import ENCODING_ALIASES as ENCODING_ALIASES
    from ._registry import ENCODINGS as ENCODINGS
    from ._registry import FORMATS as FORMATS
    from ._registry import REGISTRY as REGISTRY
    from ._registry import bfloat16 as bfloat16
    from ._registry import float8_e4m3fn as float8_e4m3fn
    from ._registry import float8_e5m2 as float8_e5m2
    from ._registry import float16 as float16
    from ._registry import float32 as float32
    from ._registry import float64 as float64
    from ._registry import get as get
    from ._registry import int1 as int1
    from ._registry import int2 as int2
    from ._registry import int4 as int4
    from ._registry import int8 as int8
    from ._registry import tf32 as tf32
    from ._rounding_modes import ROUNDING_MODES as ROUNDING_MODES
    from ._rounding_modes import check_rounding as check_rounding
    from ._scaling import SCALE_FORMATS as SCALE_FORMATS
    from ._scaling import PerAxis as PerAxis
    from ._scaling import PerBlock as PerBlock
    from ._scaling import PerTensor as PerTensor
    from ._scaling import Scaling as Scaling

_HOME = {
    "AsymmetricIntFormat": "_asymmetric",
    "CodebookFormat": "_codebook",
    "computed_once": "_per_group",
    "E8M0Format": "_e8m0",
    "Encoded": "_encoded",
    "is_tracer": "_encode_input_checks",
    "FormatError": "_errors",
    "FormatTypeError": "_errors",
    "NonFiniteError": "_errors",
    "PrecisionError": "_errors",
    "PrecisionTypeError": "_errors",
    "RoundingError": "_errors",
    "ScalingError": "_errors",
    "ShapeError": "_errors",
    "FloatFormat": "_float",
    "astype": "_ieee",
    "Format": "_format",
    "from_codes": "_from_codes",
    "IntFormat": "_int",
    "ALIASES": "_registry",
    "ENCODINGS": "_registry",
    "ENCODING_ALIASES": "_registry",
    "FORMATS": "_registry",
    "REGISTRY": "_registry",
    "bfloat16": "_registry",
    "float8_e4m3fn": "_registry",
    "float8_e5m2": "_registry",
    "float16": "_registry",
    "float32": "_registry",
    "float64": "_registry",
    "get": "_registry",
    "int1": "_registry",
    "int2": "_registry",
    "int4": "_registry",
    "int8": "_registry",
    "tf32": "_registry",
    "ROUNDING_MODES": "_rounding_modes",
    "check_rounding": "_rounding_modes",
    "SCALE_FORMATS": "_scaling",
    "PerAxis": "_scaling",
    "PerBlock": "_scaling",
    "PerTensor": "_scaling",
    "Scaling": "_scaling",
}

__all__ = [
    "ALIASES",
    "ENCODINGS",
    "ENCODING_ALIASES",
    "FORMATS",
    "REGISTRY",
    "ROUNDING_MODES",
    "SCALE_FORMATS",
    "AsymmetricIntFormat",
    "CodebookFormat",
    "E8M0Format",
    "Encoded",
    "FloatFormat",
    "Format",
    "FormatError",
    "FormatTypeError",
    "IntFormat",
    "NonFiniteError",
    "PerAxis",
    "PerBlock",
    "PerTensor",
    "PrecisionError",
    "PrecisionTypeError",
    "RoundingError",
    "Scaling",
    "ScalingError",
    "ShapeError",
    "astype",
    "bfloat16",
    "check_rounding",
    "computed_once",
    "float8_e4m3fn",
    "float8_e5m2",
    "float16",
    "float32",
    "float64",
    "from_codes",
    "get",
    "int1",
    "int2",
    "int4",
    "int8",
    "is_tracer",
    "tf32",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
