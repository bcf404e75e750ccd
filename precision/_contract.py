"""`Contract`: a declared quantization of contractions (W8A8, fp8 recipes).

A `Contract` says how the operands of every `dot_general` and
`conv_general_dilated` inside `precision.apply(f, contract=...)` are
quantized *at the contraction*: the forward format of both operands, the
format of the cotangents in the backward pass (None keeps them in the
compute format), and how scales are chosen. It is a frozen value object,
validated when it is made, so a wrong name fails at the declaration and
never deep inside a trace.

Scaling is current ("dynamic"): each scale is the absmax of the values being
quantized, at the moment they are quantized. Delayed scaling (a history of
absmax values carried as state between steps) is deliberately absent; see
docs/training.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypeAlias

import dtypes

from ._context import FormatLike
from ._errors import FormatError, PrecisionTypeError

__all__ = ["BACKWARD_OPERANDS", "SCALINGS", "Contract", "ContractLike", "Scaling", "as_contract"]

Scaling = Literal["tensorwise", "rowwise", "mx"]
SCALINGS: tuple[str, ...] = ("tensorwise", "rowwise", "mx")
"""How a `Contract` chooses scales: one per tensor, one per row (the
operand's non-contracting index: a token, an output channel), or OCP MX
blocks of 32 along the contracted axis with power-of-two E8M0 scales."""

BACKWARD_OPERANDS: tuple[str, ...] = ("quantized", "original")
"""What the cotangent of a contraction is contracted with in the backward pass: the
operands as the forward pass quantized them (the derivative of the quantized product,
straight through the rounding) or as they were given (Qwix's QAT rule: no decode of
the codes, but the float operands are kept for the backward pass)."""


def _operand_format(value: Any, what: str) -> dtypes.Format:
    """A format that an operand of a contraction can be quantized to, or raise."""
    fmt = dtypes.get(value)
    if getattr(fmt, "scaling", None) is not None:  # a named composition (mxfp4, nvfp4, …)
        raise FormatError(
            f"Contract {what}={fmt.name!r} carries its own scaling; give the element format and "
            f'choose the scaling with `scaling=`, e.g. Contract("float8_e4m3fn", scaling="mx")'
        )
    ok_int = isinstance(fmt, dtypes.IntFormat) and not fmt.binary and fmt.bits <= 8
    ok_float = isinstance(fmt, dtypes.FloatFormat) and fmt.bits <= 8 and fmt.emax < 127
    if not (ok_int or ok_float):
        raise FormatError(
            f"Contract {what}={fmt.name!r}: a contraction is quantized to a symmetric integer "
            "format of 2 to 8 bits (int8, int4) or a float format of at most 8 bits "
            "(float8_e4m3fn, float8_e5m2); for arithmetic in a wider format declare "
            f'compute= instead, e.g. precision.apply(f, compute="{fmt.name}")'
        )
    return fmt


@dataclasses.dataclass(frozen=True)
class Contract:
    """How contractions are quantized inside `precision.apply(f, contract=...)`.

    Both operands of each `dot_general` / `conv_general_dilated` are
    quantized to `forward` with absmax scales chosen by `scaling`; an integer
    storage operand whose scales factor out of the sum uses its own codes.
    With tensorwise or rowwise scales the narrow codes themselves go to the
    dot (`s8 x s8 -> s32`, `f8 x f8 -> f32`) and the scales multiply its
    result; MX blocks are dequantized from their bits and contract in
    float32. The result is then rounded onto the compute format. Gradients are straight-through the
    quantization; with `backward` set the cotangent of each contraction is
    quantized to it (the same scaling rule) before the two backward
    contractions.

    Attributes:
        forward: format of both operands in the forward pass: a symmetric
            integer format (int8, int4) or a float format of at most 8 bits
            (float8_e4m3fn, float8_e5m2), by name or object.
        backward: format of the cotangents of each contraction, or None to
            keep them in the compute format (int8 QAT does; the fp8 HYBRID
            recipe uses "float8_e5m2").
        scaling: "tensorwise", "rowwise" (one scale per non-contracting
            index of an operand: per token for activations, per output
            channel for weights) or "mx" (blocks of 32 along the contracted
            axis, E8M0 scales). None: "rowwise" for integer formats,
            "tensorwise" for float8.
        fast_accumulation: whether the forward fp8 dots may use the GPU's
            fast fp8 accumulation (cuBLASLt's, which XLA enables for an fp8
            dot of DEFAULT precision; what Flax's and Transformer Engine's fp8
            recipes use forward). Each forward fp8 dot states its precision,
            so a `jax.default_matmul_precision("highest")` around the call
            does not turn it off; False asks for HIGHEST instead. XLA:CPU
            accumulates exactly in float32 either way. The gradient dots never
            use the fast mode: per tensor with an fp8 `backward` they are fp8 dots
            at HIGHEST, otherwise float32 (see docs/training.md).
        backward_operands: "quantized" (the default): the backward pass
            contracts the cotangent with the operands as the forward pass
            quantized them, the derivative of the product it computed. "original":
            with the operands as they were given, as Qwix's QAT does; it skips
            decoding the codes for the backward dots (on a CPU a transformer
            block's W8A8 step took about 15% less), keeps the float operands
            instead of their codes until the backward pass, and its gradients are
            those of the unquantized product at the quantized point.

    Raises:
        FormatError: a format that is not a narrow integer or float format,
            or an unknown scaling (both `ValueError`s).

    Examples:
        >>> import precision
        >>> c = precision.Contract("float8_e4m3fn", backward="float8_e5m2")
        >>> c.forward.name, c.backward.name, c.scaling
        ('float8_e4m3fn', 'float8_e5m2', 'tensorwise')
        >>> precision.Contract("int8").scaling
        'rowwise'
    """

    forward: Any
    backward: Any = None
    scaling: Scaling | None = None
    fast_accumulation: bool = True
    backward_operands: Literal["quantized", "original"] = "quantized"

    def __post_init__(self) -> None:
        if not isinstance(self.fast_accumulation, bool):
            raise PrecisionTypeError(
                f"Contract fast_accumulation must be True or False, got "
                f"{type(self.fast_accumulation).__name__} {self.fast_accumulation!r}"
            )
        if self.backward_operands not in BACKWARD_OPERANDS:
            raise FormatError(
                f"Contract backward_operands={self.backward_operands!r} is not one of "
                f"{', '.join(map(repr, BACKWARD_OPERANDS))}; pass e.g. "
                'Contract("int8", backward_operands="original")'
            )
        fwd = _operand_format(self.forward, "forward")
        bwd = None if self.backward is None else _operand_format(self.backward, "backward")
        scaling = self.scaling
        if scaling is None:
            scaling = "rowwise" if fwd.kind == "int" else "tensorwise"
        if not isinstance(scaling, str) or scaling not in SCALINGS:
            raise FormatError(
                f"Contract scaling={scaling!r} is not one of {', '.join(SCALINGS)}; pass e.g. "
                'Contract("int8", scaling="rowwise")'
            )
        object.__setattr__(self, "forward", fwd)
        object.__setattr__(self, "backward", bwd)
        object.__setattr__(self, "scaling", scaling)

    def describe(self) -> str:
        """One line: forward / backward formats and the scaling.

        Examples:
            >>> import precision
            >>> precision.Contract("int8").describe()
            'int8 forward, rowwise scales'
        """
        back = f", {self.backward.name} backward" if self.backward is not None else ""
        orig = ", original operands backward" if self.backward_operands == "original" else ""
        return f"{self.forward.name} forward{back}, {self.scaling} scales{orig}"


ContractLike: TypeAlias = Contract | FormatLike
"""A quantization of contractions, as `apply(f, contract=...)` and `explain` take it.

A `Contract`, or the format both operands of every contraction are quantized
to (a name or a `dtypes.Format`), which means `Contract(format)`: `"int8"`
(W8A8: rowwise scales, int32 accumulation), `"int4"`, `"float8_e4m3fn"`,
`"float8_e5m2"` (tensorwise scales).
"""


def as_contract(value: Any) -> Contract | None:
    """A `Contract` from `contract=`: None, a format name or object, or a `Contract`.

    Raises:
        PrecisionTypeError: any other type (a `TypeError`).
        FormatError: an unknown or unsuitable format name.
    """
    if value is None or isinstance(value, Contract):
        return value
    if isinstance(value, str | dtypes.Format):
        return Contract(value)
    raise PrecisionTypeError(
        f"apply: `contract` must be a format name such as 'int8' or 'float8_e4m3fn', or a "
        f"precision.Contract, got {type(value).__name__} {value!r}; pass e.g. "
        'precision.apply(f, contract=precision.Contract("float8_e4m3fn", backward="float8_e5m2"))'
    )
