"""The arguments of `precision convert` resolved against the registry.

`--to` names a format, `--scaling` a scaling in the command line's spelling
(`per-block:32:pow2:e8m0`), `--preset` both at once; each is checked against
the format itself before anything is read. A refusal is said with the rule the
error carries (`PrecisionError.rule`) and a fix in the same spelling, found by
asking the format which nearby `--scaling` it takes, so a hint can be typed
back as it is printed.
"""

from __future__ import annotations

import ast
import dataclasses
import re

import numpy as np

import dtypes

from .._errors import UsageError
from ._presets import PRESETS


def resolve_preset(
    preset: str | None, to: str | None, scaling: str | None
) -> tuple[str, str | None]:
    """(`--to`, `--scaling`) once `--preset` is applied; a usage error when both are given."""
    if preset is None:
        if to is None:
            raise UsageError(
                "the following arguments are required: --to (or --preset: "
                + ", ".join(PRESETS)
                + ")"
            )
        return to, scaling
    chosen = PRESETS[preset]
    for flag, given in (("--to", to), ("--scaling", scaling)):
        if given is not None:
            raise UsageError(
                f"--preset {preset} already sets --to {chosen.to}"
                + ("" if chosen.scaling is None else f" --scaling {chosen.scaling}")
                + "; "
                f"drop {flag} {given}, or drop --preset and write both flags"
            )
    return chosen.to, chosen.scaling


def _format(text: str) -> dtypes.Format:
    try:
        fmt = dtypes.get(text)
    except dtypes.FormatError as exc:
        # the rule, and the command line's way to name a format no list holds
        raise UsageError(
            f"--to: {exc.rule or exc}, or name any float layout as floatBITS_eEmM (e.g. "
            "float6_e3m2fn; see 'precision formats')"
        ) from None
    if fmt.bits > 32:
        raise UsageError(
            f"--to {text}: {fmt.name} is wider than the float32 values a checkpoint holds, so "
            "converting to it gains nothing; choose float32 or a narrower format (see "
            "'precision formats')"
        )
    return fmt


# The short names `--scaling` suggests for each scale format (any name that
# dtypes.get resolves to one of dtypes.SCALE_FORMATS is accepted).
_SCALE_SHORT = {
    "float32": "f32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float8_e4m3fn": "e4m3",
    "float8_e8m0fnu": "e8m0",
}
_SCALE_ORDER = ("bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e8m0fnu")


@dataclasses.dataclass(frozen=True)
class _ScalingText:
    """The fields of a `--scaling` text (already checked against the grammar)."""

    kind: str  # "none", "per-tensor", "per-axis" or "per-block"
    number: int | None  # the axis of per-axis, the size of per-block
    pow2: bool
    scales: str | None  # the scale format as typed, or None

    @classmethod
    def parse(cls, text: str) -> _ScalingText:
        parts = text.split(":")
        kind, rest = parts[0], parts[1:]
        number = int(rest.pop(0)) if kind in ("per-axis", "per-block") else None
        pow2 = bool(rest) and rest[0] == "pow2"
        if pow2:
            rest.pop(0)
        return cls(kind, number, pow2, rest[0] if rest else None)

    def __str__(self) -> str:
        fields = [self.kind]
        fields += [] if self.number is None else [str(self.number)]
        fields += ["pow2"] if self.pow2 else []
        fields += [] if self.scales is None else [self.scales]
        return ":".join(fields)

    def build(self, scale_format: str) -> dtypes.Scaling | None:
        """The dtypes scaling; raises what dtypes raises for a refused combination."""
        if self.kind == "none":
            return None
        if self.kind == "per-tensor":
            return dtypes.PerTensor(power_of_two=self.pow2, scale_format=scale_format)
        assert self.number is not None
        if self.kind == "per-axis":
            return dtypes.PerAxis(self.number, power_of_two=self.pow2, scale_format=scale_format)
        return dtypes.PerBlock(self.number, power_of_two=self.pow2, scale_format=scale_format)


_MAX_DIMS = 64  # numpy's limit on an array's axes


def _scale_format(word: str, text: str) -> str:
    """The scale format `word` names (a name or alias of one of dtypes.SCALE_FORMATS)."""
    try:
        name: str | None = dtypes.get(word).name
    except dtypes.FormatError:
        name = None
    if name not in dtypes.SCALE_FORMATS:
        what = "is not a format" if name is None else f"names {name}, which is not a scale format"
        choices = ", ".join(f"{full} ({short})" for full, short in _SCALE_SHORT.items())
        raise UsageError(
            f"--scaling {text}: {word!r} {what}; end --scaling with a scale format: {choices}"
        )
    return name


def _scaling(text: str | None, fmt: dtypes.Format) -> dtypes.Scaling | None:
    """The scaling of `--scaling` (already checked against the grammar), or the preset.

    A named composition keeps the scale format of its own scaling unless the
    text names one (`--to mxfp4 --scaling per-block:64:pow2` stores E8M0
    scales per 64 values); anything else stores float32 scales unless told.

    Examples:
        >>> print(_scaling("per-block:128:bf16", dtypes.get("int4")))
        per-block 128 on axis -1, bfloat16 scales
        >>> print(_scaling("per-block:64:pow2", dtypes.get("mxfp4")))
        per-block 64 on axis -1, power of two, float8_e8m0fnu scales
    """
    default = fmt.default_scaling()
    if text is None:
        integer = fmt.kind in ("int", "uint")
        if integer and not isinstance(default, dtypes.PerBlock):
            # Per tensor, one outlier takes the whole range of every value:
            # narrow integers need small groups (int4 on GPT-2's wte: 12 dB
            # vs 20 dB), int8 a scale per output channel.
            return dtypes.PerBlock(32) if fmt.bits <= 4 else dtypes.PerAxis(0)
        return default
    spec = _ScalingText.parse(text)
    if spec.kind == "per-axis" and not -_MAX_DIMS <= (spec.number or 0) < _MAX_DIMS:
        raise UsageError(
            f"--scaling {text}: axis {spec.number} is past every tensor's axes (an array has "
            f"at most {_MAX_DIMS}); give an axis of the tensors, e.g. per-axis:0 or per-axis:-1"
        )
    if spec.scales is not None:
        scale_format = _scale_format(spec.scales, text)
    else:
        scale_format = "float32" if default is None else default.scale_format
    try:
        return spec.build(scale_format)
    except (ValueError, TypeError) as exc:
        where = f"--scaling {text} with --to {fmt.name}"
        fix = _working_scaling(fmt, spec, scale_format)
        raise UsageError(f"{where}: {_reason(exc, bool(fix))}{fix}") from None


def _probe(scaling: dtypes.Scaling) -> np.ndarray:
    """Ones of the smallest shape `scaling` fits: one block, or one index per axis."""
    axis = int(getattr(scaling, "axis", 0))
    ndim = axis + 1 if axis >= 0 else -axis
    shape = [1] * ndim
    if isinstance(scaling, dtypes.PerBlock):
        shape[axis] = int(scaling.size)
    return np.ones(shape, np.float32)


def _refusal(fmt: dtypes.Format, scaling: dtypes.Scaling | None) -> BaseException | None:
    """Why `fmt` refuses `scaling` (asked of the format with a one-block probe), or None."""
    if scaling is None:
        return None
    probe = _probe(scaling)
    check = getattr(fmt, "check", None)
    try:
        if check is not None:
            check(probe, scaling=scaling)
        else:  # pragma: no cover - before Format.check existed
            fmt.encode(probe, scaling=scaling)
    except (ValueError, TypeError) as exc:
        return exc
    return None


def _working_scaling(fmt: dtypes.Format, spec: _ScalingText, scale_format: str) -> str:
    """`; write --scaling X instead` for the nearest text `fmt` takes, or "" if none.

    Nearest: the same text with :pow2 toggled, then each other scale format
    (16-bit ones first) with the same :pow2, then with it toggled. The
    formats themselves decide, not a copy of their rules.
    """
    others = [s for s in _SCALE_ORDER if s != scale_format]
    candidates = [(not spec.pow2, scale_format)]
    candidates += [(p, s) for p in (spec.pow2, not spec.pow2) for s in others]
    for pow2, scales in candidates:
        named = spec.scales is not None or scales != scale_format
        short = _SCALE_SHORT[scales] if named else None
        other = dataclasses.replace(spec, pow2=pow2, scales=short)
        try:
            scaling = other.build(scales)
        except (ValueError, TypeError):
            continue
        if _refusal(fmt, scaling) is None:
            return f"; write --scaling {other} instead"
    return ""


def _check_pair(
    fmt: dtypes.Format, scaling: dtypes.Scaling | None, text: str | None, rounding: str
) -> None:
    """Usage error unless `fmt` takes `scaling` and `rounding` (asked of the format itself)."""
    if fmt.kind in ("int", "uint", "codebook") and scaling is None:
        raise UsageError(
            f"--to {fmt.name} --scaling none: {fmt.name} always needs a scaling; use --scaling "
            "per-tensor, per-axis:AXIS or per-block:SIZE"
        )
    if scaling is None:
        return
    refused = _refusal(fmt, scaling)
    if refused is not None:
        spelled = text or cli_text(scaling)
        where = f"--scaling {text}" if text else f"the default scaling ({spelled or scaling})"
        fix = ""
        if spelled is not None:  # typed, or spelled by cli_text: the --scaling grammar
            fix = _working_scaling(fmt, _ScalingText.parse(spelled), scaling.scale_format)
        raise UsageError(f"--to {fmt.name} with {where}: {_reason(refused, bool(fix))}{fix}")
    if fmt.kind not in ("float", "int"):
        # Code books, asymmetric integers and E8M0 round in fewer modes: ask the
        # format with one value, so a refused mode is a usage error up front.
        import jax

        key = jax.random.key(0) if rounding == "stochastic" else None
        try:
            fmt.encode(_probe(scaling), scaling=scaling, rounding=rounding, key=key)
        except (ValueError, TypeError) as exc:
            raise UsageError(
                f"--to {fmt.name} with --rounding {rounding}: {_reason(exc, False)}"
            ) from None


def cli_text(scaling: dtypes.Scaling | None) -> str | None:
    """`scaling` as `--scaling` spells it, or None where the command line has no spelling.

    Examples:
        >>> cli_text(dtypes.PerBlock(32, power_of_two=True, scale_format="float8_e8m0fnu"))
        'per-block:32:pow2:e8m0'
        >>> cli_text(dtypes.PerAxis(0)), cli_text(dtypes.PerBlock(32, axis=0))
        ('per-axis:0', None)
    """
    if scaling is None:
        return "none"
    if isinstance(scaling, dtypes.PerTensor):
        fields = ["per-tensor"]
    elif isinstance(scaling, dtypes.PerAxis) and len(scaling.axes) == 1:
        fields = ["per-axis", str(scaling.axes[0])]
    elif isinstance(scaling, dtypes.PerBlock) and scaling.axis == -1:
        fields = ["per-block", str(scaling.size)]
    else:
        return None  # several axes, or blocks along another axis
    if scaling.power_of_two:
        fields.append("pow2")
    if scaling.scale_format != "float32":
        fields.append(_SCALE_SHORT[scaling.scale_format])
    return ":".join(fields)


def _reason(exc: BaseException, fixed: bool) -> str:
    """Why a format refused, as the command line says it: the rule the error carries
    (`PrecisionError.rule`), which spells no Python, or else its message in the
    command line's words (`_in_cli_words`; `fixed`: the caller prints a fix of its own).

    The errors the codecs raise (`dtypes/_codec.py`'s absmax-only scalings and
    rounding modes, `_float_codec.py`'s scaled wide floats) carry no rule yet; they
    are the ones still translated.
    """
    rule = getattr(exc, "rule", "")
    return rule if rule else _in_cli_words(exc, fixed)


# a scaling written as Python in a message: PerBlock(32, power_of_two=True, ...)
_PYTHON_SCALING = re.compile(r"(?:dtypes\.)?(PerTensor|PerAxis|PerBlock)\(([^()]*)\)")
# a clause of advice in Python: "; pass PerTensor(...)", "; use scaling=dtypes.PerAxis(0)"
_PYTHON_ADVICE = re.compile(r";\s*(?:pass|use)\b[^;]*?(?:\(|=)[^;]*")


def _spelled(match: re.Match[str]) -> str:
    """`--scaling TEXT` for one Python scaling of a message, or the Python as it was
    (arguments that are not literals, or a scaling the command line cannot spell)."""
    try:
        call = ast.parse(f"f({match.group(2)})", mode="eval").body
        if not isinstance(call, ast.Call) or any(k.arg is None for k in call.keywords):
            return match.group(0)
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {str(k.arg): ast.literal_eval(k.value) for k in call.keywords}
    except (SyntaxError, ValueError):  # `...` or a name among the arguments
        return match.group(0)
    kind = {"PerTensor": "per-tensor", "PerAxis": "per-axis", "PerBlock": "per-block"}
    fields = [kind[match.group(1)]]
    if match.group(1) == "PerAxis":
        args = args or [kwargs.pop("axis", "AXIS")]
    elif match.group(1) == "PerBlock":
        args = args or [kwargs.pop("size", "SIZE")]  # a message that leaves it out
        if kwargs.pop("axis", -1) != -1:
            return match.group(0)  # the command line blocks the last axis only
    fields += [str(a) for a in args]
    if kwargs.pop("power_of_two", False) is True:
        fields.append("pow2")
    scales = kwargs.pop("scale_format", "float32")
    if scales != "float32":
        fields.append(_SCALE_SHORT.get(str(scales), str(scales)))
    if kwargs or not all(isinstance(a, int | str) for a in args) or len(args) > 1:
        return match.group(0)
    return "--scaling " + ":".join(fields)


def _in_cli_words(exc: BaseException, drop_advice: bool) -> str:
    """A format's refusal in the command line's words: its scalings as `--scaling`
    texts, and (where the caller prints a fix of its own) its advice in Python dropped.

    Examples:
        >>> refusal = ValueError("PerTensor(scale_format='float8_e8m0fnu') needs "
        ...     "power_of_two=True: E8M0 holds only powers of two; pass PerTensor(..., "
        ...     "power_of_two=True, scale_format='float8_e8m0fnu')")
        >>> _in_cli_words(refusal, drop_advice=True)
        '--scaling per-tensor:e8m0 needs :pow2: E8M0 holds only powers of two'
    """
    text = " ".join(str(exc).split())
    if drop_advice:
        text = _PYTHON_ADVICE.sub("", text)
    text = _PYTHON_SCALING.sub(_spelled, text)
    return text.replace("power_of_two=True", ":pow2").replace("power_of_two", ":pow2")
