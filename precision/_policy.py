"""`Policy`: which format parameters are kept in, computed in, and returned in.

A mixed-precision training step keeps float32 *master* parameters, casts them
to a cheaper *compute* format inside the loss, and hands the result back in
an *output* format (usually float32, so the loss and its softmax stay
accurate). A policy names those three formats and casts whole pytrees.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
from dtypes import PrecisionTypeError

from ._errors import FormatError, PolicyError
from ._jax_compat import primitive_names
from ._storage import compute_format, role
from ._tree import is_floating, is_tensor, to_full_precision, to_reduced_precision

__all__ = ["DEFAULT_FLOAT32_OPS", "Policy", "PolicyLike"]

DEFAULT_FLOAT32_OPS: frozenset[str] = frozenset(
    {
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "pow",
        "logistic",
        "erf",
        "erfc",
        "erf_inv",
        "lgamma",
        "digamma",
        "rsqrt",
        "reduce_sum",
        "reduce_prod",
        "cumsum",
        "cumprod",
        "cumlogsumexp",
    }
)
"""Primitives that `apply` computes in float32 under a declared narrower compute format.

The automatic-mixed-precision habit: exponentials, logarithms and powers, whose
relative error grows with their argument, the statistics of softmax and
normalisation layers (sums, reciprocal square roots), and special functions.
Their results stay float32 until an op outside the list brings them back to
the compute format. Replace the list with `Policy(float32_ops=...)`.
"""

_FIELDS = {
    "params": "params",
    "param": "params",
    "p": "params",
    "compute": "compute",
    "c": "compute",
    "output": "output",
    "o": "output",
}

_NAMED = {
    "mixed_bfloat16": ("float32", "bfloat16", "float32"),
    "mixed_float16": ("float32", "float16", "float32"),
}


@dataclasses.dataclass(frozen=True)
class Policy:
    """The formats of parameters, computation and outputs.

    A full-precision format (float32, float64) means plain arrays of that
    dtype; any other format means `precision.Tensor`s stored in it. `compute`
    is a format arithmetic is done in (an unscaled float format: bfloat16,
    float16, tf32, float8, ...); parameters may be kept in any encoding
    (`params="int8"`), which computes in the logical dtype unless `compute`
    says otherwise.

    Args:
        params: format the parameters are kept in (format or name).
        compute: format the forward pass runs in (an unscaled float format);
            defaults to `params`, or float32 when `params` is a storage encoding.
        output: format results are returned in; defaults to `params`.
        float32_ops: primitive names that `precision.apply(f, policy=...)`
            computes in float32 under a narrower compute format (default
            `DEFAULT_FLOAT32_OPS`; pass `()` for every op in `compute`). Names
            are spelled as a jaxpr spells them (`jax.make_jaxpr(f)(x)` shows
            them): `"reduce_sum"`, not `"sum"`; a composite such as softmax is
            several primitives. A name that is no primitive of JAX (or of any
            imported module) is refused, not ignored: a misspelled name would
            silently leave its op in the compute format.

    Raises:
        PolicyError: (a ValueError) a `float32_ops` name that is no known
            primitive; the message suggests the close names.
        PrecisionTypeError: `float32_ops` is not a collection of strings.
        FormatError: an unknown format, or a scale-only format.

    Examples:
        >>> import jax.numpy as jnp
        >>> policy = Policy.parse("mixed_bfloat16")
        >>> policy.params.name, policy.compute.name, policy.output.name
        ('float32', 'bfloat16', 'float32')
        >>> x = policy.cast_to_compute({"w": jnp.ones(3)})
        >>> x["w"].format.name
        'bfloat16'
        >>> policy.cast_to_output(x)["w"].dtype
        dtype('float32')
    """

    params: dtypes.Format = dtypes.float32
    compute: dtypes.Format | None = None
    output: dtypes.Format | None = None
    float32_ops: frozenset[str] = DEFAULT_FLOAT32_OPS

    def __post_init__(self) -> None:
        ops = self.float32_ops
        names = (
            tuple(ops)  # once: a generator checked and then stored would be stored empty
            if isinstance(ops, Iterable) and not isinstance(ops, str | bytes | Mapping)
            else None
        )
        if names is None or not all(isinstance(o, str) for o in names):
            raise PrecisionTypeError(
                f"Policy: float32_ops must be a collection of primitive names such as "
                f'{{"exp", "reduce_sum"}}, got {type(ops).__name__} {ops!r:.80}; pass e.g. '
                'float32_ops={"exp", "log"}, or () to compute every op in the compute format'
            )
        _check_primitive_names(frozenset(names))
        object.__setattr__(self, "float32_ops", frozenset(names))
        params = _policy_format(self.params, "params")
        object.__setattr__(self, "params", params)
        compute: Any = self.compute
        if compute is None:  # storage computes in the logical dtype, as everywhere
            compute = params if role(params, params.default_scaling()) == "compute" else "float32"
        compute = compute_format(_policy_format(compute, "compute"), "Policy")
        object.__setattr__(self, "compute", compute)
        output = params if self.output is None else _policy_format(self.output, "output")
        object.__setattr__(self, "output", output)

    def cast_to_param(self, tree: Any) -> Any:
        """`tree`'s floating leaves in the params format."""
        return _cast(tree, self.params)

    def cast_to_compute(self, tree: Any) -> Any:
        """`tree`'s floating leaves in the compute format."""
        assert self.compute is not None  # set by __post_init__
        return _cast(tree, self.compute)

    def cast_to_output(self, tree: Any) -> Any:
        """`tree`'s floating leaves in the output format."""
        assert self.output is not None  # set by __post_init__
        return _cast(tree, self.output)

    def with_output(self, output: str | dtypes.Format) -> Policy:
        """A copy with another output format."""
        return dataclasses.replace(self, output=_policy_format(output, "output"))

    def __str__(self) -> str:
        assert self.compute is not None  # set by __post_init__
        assert self.output is not None
        return f"params={self.params.name},compute={self.compute.name},output={self.output.name}"

    # The grammar of `parse`:
    #
    #   policy := NAME | field ("," field)*
    #   NAME   := "mixed_bfloat16" | "mixed_float16" | FORMAT
    #   field  := KEY "=" FORMAT
    #   KEY    := "params" | "param" | "p" | "compute" | "c" | "output" | "o"
    #   FORMAT := any name `dtypes.get` accepts: float32, f32, bfloat16, bf16,
    #             float16, fp16, tf32, e4m3, int8, int4, ...
    #
    # Spaces around tokens are ignored and case does not matter. A missing
    # params field is float32; a missing compute or output field is params.
    # A bare FORMAT is all three fields in that format.
    @classmethod
    def parse(cls, text: str) -> Policy:
        """Build a policy from a string (see the grammar in the source above).

        Raises:
            PolicyError: (a ValueError) the text does not follow the grammar;
                the message says what was expected where.

        Examples:
            >>> str(Policy.parse("p=f32,c=bf16"))
            'params=float32,compute=bfloat16,output=float32'
            >>> str(Policy.parse("params=int8, output=float32"))
            'params=int8,compute=float32,output=float32'
            >>> Policy.parse("compute=bf16,compute=fp16")
            Traceback (most recent call last):
            ...
            precision._errors.PolicyError: policy '...': field 'compute' given twice
        """
        if not isinstance(text, str):
            raise PrecisionTypeError(f"Policy.parse expects a string, got {type(text).__name__}")
        source = text
        text = text.strip().lower()
        expected_fields = "params=FORMAT, compute=FORMAT, output=FORMAT (or p=, c=, o=)"
        if not text:
            raise PolicyError(
                f"empty policy; expected a name ({', '.join(_NAMED)}, or a format) or "
                f"comma-separated fields {expected_fields}"
            )
        if "=" not in text:
            if text in _NAMED:
                params, compute, output = (dtypes.get(n) for n in _NAMED[text])
                return cls(params, compute, output)
            try:
                fmt = dtypes.get(text)
            except FormatError as err:
                raise PolicyError(
                    f"policy {source!r}: not a policy name ({', '.join(_NAMED)}), fields "
                    f"{expected_fields}, or a format: {err}"
                ) from None
            return cls(fmt, fmt, fmt)
        fields: dict[str, Any] = {}  # keyword arguments of Policy: formats by field name
        for part in text.split(","):
            part = part.strip()
            if part.count("=") != 1:
                raise PolicyError(
                    f"policy {source!r}: cannot read {part!r}; expected KEY=FORMAT with KEY one "
                    f"of {', '.join(_FIELDS)}"
                )
            key, value = (s.strip() for s in part.split("="))
            if key not in _FIELDS:
                raise PolicyError(
                    f"policy {source!r}: unknown field {key!r}; expected one of "
                    f"{', '.join(_FIELDS)}"
                )
            name = _FIELDS[key]
            if name in fields:
                raise PolicyError(f"policy {source!r}: field {name!r} given twice")
            try:
                fields[name] = dtypes.get(value)
            except FormatError as err:
                raise PolicyError(f"policy {source!r}, field {name}: {err}") from None
        return cls(**fields)


PolicyLike: TypeAlias = Policy | Literal["mixed_bfloat16", "mixed_float16"] | str
"""A policy, as `apply(f, policy=...)` and `explain` take it.

A `Policy`, or its string read by `Policy.parse`: a named policy
(`"mixed_bfloat16"`, `"mixed_float16"`), fields with format names
(`"params=float32,compute=bfloat16,output=float32"`, or `p=`, `c=`, `o=`; a
missing `params` is float32, a missing `compute` or `output` is `params`), or
one format name for all three (`"bfloat16"`).
"""


def _check_primitive_names(names: frozenset[str]) -> None:
    """Refuse `float32_ops` names that no primitive has, each with the close names it may mean.

    Refused rather than warned about: a traced function can only hold
    primitives that exist, and the names read from the loaded modules cover
    every module-level primitive (JAX's, a library's, the user's), so an
    unknown name is a mistake, or a primitive whose module is not imported
    yet, and it would otherwise change nothing, silently.
    """
    if names <= DEFAULT_FLOAT32_OPS:
        return  # the common case, without reading the loaded modules
    known = primitive_names()
    unknown = sorted(names - known)
    if unknown:
        listed = ", ".join(_with_suggestions(name, known) for name in unknown)
        raise PolicyError(
            f"Policy: float32_ops names {listed}, but no primitive of JAX {jax.__version__} or "
            f"of an imported module is called so; name primitives as a jaxpr spells them "
            f"(print(jax.make_jaxpr(f)(x)) lists them, e.g. 'exp', 'reduce_sum'): a composite "
            f"such as softmax or layer norm is several (reduce_max, exp, reduce_sum, div, "
            f"rsqrt), and a primitive of your own counts once its module is imported"
        )


def _with_suggestions(name: str, known: frozenset[str]) -> str:
    """`'name'`, with up to four known names it may have meant: names it is a word of
    (`sum` in `reduce_sum`), then names spelled closely (`reduce_summ`)."""
    words = sorted((k for k in known if name in k.split("_")), key=len)
    close = difflib.get_close_matches(name, sorted(known), n=4, cutoff=0.6)
    suggested = list(dict.fromkeys(words + close))[:4]
    if not suggested:
        return repr(name)
    return f"{name!r} (did you mean {', '.join(map(repr, suggested))}?)"


def _policy_format(fmt: Any, field: str) -> dtypes.Format:
    """A format that can hold a policy field's values (not a scale-only format)."""
    resolved = dtypes.get(fmt)
    if resolved.kind == "scale":
        raise FormatError(
            f"Policy: {field}={resolved.name!r} is a scale format (it holds only the positive "
            f"powers of two that scale other encodings), not a format values can be kept in; "
            f"pass e.g. {field}='bfloat16', or use it as a scaling's scale_format"
        )
    return resolved


def _cast(tree: Any, fmt: dtypes.Format) -> Any:
    """Floating leaves as plain arrays of a full-precision format, or as Tensors in `fmt`."""
    if not fmt.is_full_precision:
        return to_reduced_precision(tree, fmt)
    dtype = fmt.container
    if np.dtype(dtype) == np.float64 and not jax.config.read("jax_enable_x64"):
        raise PrecisionTypeError(
            "Policy: casting to float64 needs 64-bit JAX (it would give float32 arrays with a "
            "warning); set jax.config.update('jax_enable_x64', True) first, or use float32"
        )
    tree = to_full_precision(tree)

    def one(x: Any) -> Any:
        if not is_floating(x) or x.dtype == dtype:
            return x
        return jnp.asarray(x).astype(dtype)

    return jax.tree_util.tree_map(one, tree, is_leaf=is_tensor)
