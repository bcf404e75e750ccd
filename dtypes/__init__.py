"""Storage formats for reduced-precision numbers: pure numerics, no Tensor.

Each format encodes float values into the bytes it really needs (scaled and
packed where it is an integer format), decodes them back, and rounds onto its
grid in six rounding modes, bit-exactly and under `jit`, `vmap` and `grad`.
"""

from ._asymmetric import AsymmetricIntFormat as AsymmetricIntFormat
from ._codebook import CodebookFormat as CodebookFormat
from ._e8m0 import E8M0Format as E8M0Format
from ._encoded import Encoded as Encoded
from ._errors import FormatError as FormatError
from ._errors import NonFiniteError as NonFiniteError
from ._errors import PrecisionError as PrecisionError
from ._errors import PrecisionTypeError as PrecisionTypeError
from ._errors import RoundingError as RoundingError
from ._errors import ScalingError as ScalingError
from ._errors import ShapeError as ShapeError
from ._formats import FloatFormat as FloatFormat
from ._formats import Format as Format
from ._formats import IntFormat as IntFormat
from ._named import ENCODINGS as ENCODINGS
from ._registry import ALIASES as ALIASES
from ._registry import FORMATS as FORMATS
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
from ._rounding import ROUNDING_MODES as ROUNDING_MODES
from ._rounding import check_rounding as check_rounding
from ._scaling import SCALE_FORMATS as SCALE_FORMATS
from ._scaling import PerAxis as PerAxis
from ._scaling import PerBlock as PerBlock
from ._scaling import PerTensor as PerTensor
from ._scaling import Scaling as Scaling

__all__ = [
    "ALIASES",
    "ENCODINGS",
    "FORMATS",
    "ROUNDING_MODES",
    "SCALE_FORMATS",
    "AsymmetricIntFormat",
    "CodebookFormat",
    "E8M0Format",
    "Encoded",
    "FloatFormat",
    "Format",
    "FormatError",
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
    "bfloat16",
    "check_rounding",
    "float8_e4m3fn",
    "float8_e5m2",
    "float16",
    "float32",
    "float64",
    "get",
    "int1",
    "int2",
    "int4",
    "int8",
    "tf32",
]
