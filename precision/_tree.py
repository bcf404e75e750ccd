"""Whole pytrees at once: convert, restore, inspect and measure models and optimizer states.

A model's parameters, an Equinox module or an Optax state is a pytree whose
floating leaves are arrays (or Tensors already). These functions walk such a
tree with `jax.tree_util`, treating each `Tensor` as one leaf, and leave every
other leaf (step counters, integer labels, static fields) untouched.

Selecting leaves: `where` is either a predicate `where(path, leaf) -> bool`
or a regular expression searched in the leaf's key-path string, as
`jax.tree_util.keystr` writes it (`"['params']['Dense_0']['kernel']"` for
a Flax tree, `".layers[0].weight"` for an Equinox module). `exclude` is a
regular expression whose matches are skipped. So "everything but norms and
biases" is `exclude="bias|norm|scale"`, and "only matrices" is
`where=lambda path, leaf: leaf.ndim > 1`.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
from dtypes import PrecisionTypeError

from ._codes_layout import Layout
from ._context import get_default_format
from ._errors import SelectionError, SelectionWarning
from ._kept_in_float32 import KEEP
from ._tensor import Tensor, logical_values

__all__ = [
    "Where",
    "is_floating",
    "is_reduced_precision",
    "is_tensor",
    "quantize",
    "to_full_precision",
    "to_reduced_precision",
    "tree_nbytes",
]

Where = Callable[[tuple[Any, ...], Any], bool] | str | None


def is_tensor(x: Any) -> bool:
    """Whether `x` is a `precision.Tensor` (the `is_leaf` for tree walks)."""
    return isinstance(x, Tensor)


def is_floating(leaf: Any) -> bool:
    """Whether `leaf` is a Tensor or an array (numpy/jax, traced or not) of a float dtype."""
    if isinstance(leaf, Tensor):
        return True
    dtype = getattr(leaf, "dtype", None)
    if dtype is None or not hasattr(leaf, "shape"):
        return False
    # jax.dtypes.issubdtype also answers for extended dtypes (PRNG keys), which
    # numpy cannot interpret: a key is not a floating leaf and passes untouched.
    return bool(jax.dtypes.issubdtype(dtype, jnp.floating))


def _path_str(path: tuple[Any, ...]) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def _selector(where: Where, exclude: str | None) -> Callable[[tuple[Any, ...], Any], bool]:
    """One predicate from `where` (callable or regex) and `exclude` (regex)."""
    include: Callable[[tuple[Any, ...], Any], Any]
    if where is None:
        include = lambda path, leaf: True
    elif isinstance(where, str):
        pattern = _compile(where, "where")
        include = lambda path, leaf: pattern.search(jax.tree_util.keystr(path)) is not None
    elif callable(where):
        include = where
    else:
        raise PrecisionTypeError(
            f"`where` must be a predicate (path, leaf) -> bool or a regex string, got "
            f"{type(where).__name__} {where!r}"
        )
    if exclude is None:
        return include
    if not isinstance(exclude, str):
        raise PrecisionTypeError(f"`exclude` must be a regex string, got {type(exclude).__name__}")
    skip = _compile(exclude, "exclude")
    return lambda path, leaf: (
        skip.search(jax.tree_util.keystr(path)) is None and bool(include(path, leaf))
    )


def _warn_nothing_selected(flat: list[tuple[Any, Any]], where: Where, exclude: str | None) -> None:
    """A selection that converts nothing is almost always a typo: say so, with the paths."""
    floating = [_path_str(path) for path, leaf in flat if is_floating(leaf)]
    if not floating:
        return
    given = ", ".join(
        f"{name}={value!r}" for name, value in (("where", where), ("exclude", exclude)) if value
    )
    examples = ", ".join(floating[:3]) + (", ..." if len(floating) > 3 else "")
    warnings.warn(
        f"to_reduced_precision: {given} selected none of the {len(floating)} floating leaves "
        f"({examples}); nothing was converted. A regex is searched in each path as printed "
        "here, e.g. where='kernel'",
        SelectionWarning,
        stacklevel=3,
    )


def _warn_nothing_excluded(
    flat: list[tuple[Any, Any]], chosen: list[int], where: Where, exclude: str
) -> None:
    """An `exclude` that keeps nothing out of the selection is a typo too (`'kernal'`)."""
    selected = _selector(where, None)
    if sum(1 for path, leaf in flat if is_floating(leaf) and selected(path, leaf)) > len(chosen):
        return
    examples = ", ".join(_path_str(flat[i][0]) for i in chosen[:3]) + (
        ", ..." if len(chosen) > 3 else ""
    )
    warnings.warn(
        f"to_reduced_precision: exclude={exclude!r} matched none of the {len(chosen)} "
        f"selected floating leaves ({examples}); all of them were converted. A regex is "
        "searched in each path as printed here, e.g. exclude='bias'",
        SelectionWarning,
        stacklevel=3,
    )


def _compile(pattern: str, name: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise SelectionError(
            f"`{name}` is not a valid regular expression: {pattern!r} ({err})"
        ) from None


def _raise_collected(errors: list[tuple[str, Exception]], action: str) -> None:
    """Raise one error naming every offending leaf (of the first error's type)."""
    if not errors:
        return
    first = errors[0][1]
    lines = "\n".join(f"  {path}: {err}" for path, err in errors)
    noun = "leaf" if len(errors) == 1 else "leaves"
    message = f"{len(errors)} {noun} could not be {action}:\n{lines}"
    kind = type(first) if isinstance(first, TypeError | ValueError) else ValueError
    try:
        err = kind(message)
    except Exception:  # an exception class with a different constructor
        err = (TypeError if isinstance(first, TypeError) else ValueError)(message)
    raise err from first


def to_reduced_precision(
    tree: Any,
    format: str | dtypes.Format | None = None,
    *,
    scaling: dtypes.Scaling | Callable[[tuple[Any, ...], Any], dtypes.Scaling | None] | None = None,
    rounding: str = "nearest_even",
    key: jax.Array | None = None,
    where: Where = None,
    exclude: str | None = None,
    layout: Layout = None,
) -> Any:
    """Convert the floating leaves of any pytree into reduced-precision Tensors.

    Each selected leaf, array or Tensor, becomes
    `Tensor(leaf).to_reduced_precision(format, scaling=..., rounding=..., key=...)`.
    Leaves that are not floating (integer counters, labels, strings, static
    fields) and leaves the filters reject come back unchanged.

    Args:
        tree: any pytree: a dict of arrays, Flax params, an Equinox module,
            an Optax state.
        format: target format (name or `dtypes.Format`); None uses
            `precision.get_default_format()` (bfloat16 unless changed).
        scaling: scaling for every converted leaf (e.g. `dtypes.PerAxis(-1)`), or a
            callable `scaling(path, leaf) -> Scaling | None` choosing one per leaf
            (per-rank or per-layout choices in one call: e.g. `PerAxis(0)` for
            Equinox conv kernels `(O, I, kh, kw)`, None for 1-D biases).
        rounding: one of `dtypes.ROUNDING_MODES`.
        key: `jax.random` key for `rounding="stochastic"`; it is split so
            each converted leaf draws its own bits.
        where: a predicate `where(path, leaf) -> bool` or a regex searched in
            `jax.tree_util.keystr(path)`; only matching leaves are converted.
        exclude: a regex; leaves whose key path matches are left alone.
        layout: `"transposed"` holds each converted leaf's codes with its last two
            axes swapped, as GPU GEMMs read the weight of `x @ w` (Flax and Haiku
            `(in, out)` kernels; see `Tensor.to_reduced_precision`).

    Returns:
        A tree of the same structure.

    Raises:
        FormatError: an unknown format name.
        ValueError, TypeError: a leaf cannot be converted (e.g. a scaling that
            does not fit its shape); one error names every offending path.

    Examples:
        >>> import jax.numpy as jnp
        >>> import precision
        >>> params = {"dense": {"kernel": jnp.ones((4, 3)), "bias": jnp.zeros(3)},
        ...           "step": jnp.int32(7)}
        >>> small = precision.to_reduced_precision(params, "int8", exclude="bias")
        >>> small["dense"]["kernel"].format.name, type(small["dense"]["bias"]).__name__
        ('int8', 'ArrayImpl')
        >>> int(small["step"])
        7
        >>> matrices = precision.to_reduced_precision(params, where=lambda p, x: x.ndim > 1)
        >>> matrices["dense"]["kernel"].format.name
        'bfloat16'
    """
    fmt = get_default_format() if format is None else dtypes.get(format)
    dtypes.check_rounding(rounding, key)
    select = _selector(where, exclude)
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_tensor)
    chosen = [i for i, (path, leaf) in enumerate(flat) if is_floating(leaf) and select(path, leaf)]
    if not chosen and (where is not None or exclude is not None):
        _warn_nothing_selected(flat, where, exclude)
    elif exclude is not None:
        _warn_nothing_excluded(flat, chosen, where, exclude)
    keys = (
        list(jax.random.split(key, len(chosen)))
        if key is not None and chosen
        else [None] * len(chosen)
    )
    out = [leaf for _, leaf in flat]
    errors: list[tuple[str, Exception]] = []
    for i, k in zip(chosen, keys, strict=True):
        path, leaf = flat[i]
        try:
            t = leaf if isinstance(leaf, Tensor) else Tensor(leaf)
            chosen_scaling = scaling(path, leaf) if callable(scaling) else scaling
            out[i] = t.to_reduced_precision(
                fmt, scaling=chosen_scaling, rounding=rounding, key=k, layout=layout
            )
        except (TypeError, ValueError) as err:
            errors.append((_path_str(path), err))
    _raise_collected(errors, f"converted to {fmt.name}")
    return jax.tree_util.tree_unflatten(treedef, out)


def to_full_precision(tree: Any) -> Any:
    """Every Tensor leaf of `tree` as a plain `jax.Array` of its logical values.

    The result is an ordinary tree again, ready for code that knows nothing of
    Tensors (a Flax `apply`, an Optax optimizer, a checkpoint writer). The
    values are the rounded ones: converting to reduced precision and back
    loses what the format could not hold. Other leaves are unchanged.

    Examples:
        >>> import jax.numpy as jnp
        >>> import precision
        >>> small = precision.to_reduced_precision({"w": jnp.array([1.0, 1.001])})
        >>> precision.to_full_precision(small)["w"].tolist()
        [1.0, 1.0]
    """
    return jax.tree_util.tree_map(
        lambda x: logical_values(x) if isinstance(x, Tensor) else x,
        tree,
        is_leaf=is_tensor,
    )


def is_reduced_precision(tree: Any) -> bool:
    """Whether any leaf of `tree` is a Tensor stored in a reduced format.

    "Any" makes the common checks one call: after a filtered conversion
    (norms and biases kept in float32) the tree *is* reduced, and after
    `to_full_precision` it is not. To ask whether every floating leaf is
    reduced, map `lambda x: isinstance(x, Tensor) and x.is_reduced_precision`
    over the tree instead.

    Examples:
        >>> import jax.numpy as jnp
        >>> import precision
        >>> params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
        >>> precision.is_reduced_precision(params)
        False
        >>> precision.is_reduced_precision(precision.to_reduced_precision(params, where="w"))
        True
    """
    return any(
        isinstance(leaf, Tensor) and leaf.is_reduced_precision
        for leaf in jax.tree_util.tree_leaves(tree, is_leaf=is_tensor)
    )


def tree_nbytes(tree: Any) -> int:
    """Bytes of storage held by the array and Tensor leaves of `tree`.

    A Tensor counts its codes and scales (`Tensor.nbytes`: a packed int4
    tensor counts half a byte a value plus its scales); an array counts
    `size * itemsize`. Python numbers and static fields count nothing.

    Examples:
        >>> import jax.numpy as jnp
        >>> import precision
        >>> params = {"w": jnp.ones((256, 256)), "b": jnp.zeros(256)}
        >>> precision.tree_nbytes(params)
        263168
        >>> precision.tree_nbytes(precision.to_reduced_precision(params, "int4", where="w"))
        33796
    """
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree, is_leaf=is_tensor):
        if isinstance(leaf, Tensor):
            total += leaf.nbytes
        elif hasattr(leaf, "dtype") and hasattr(leaf, "shape"):
            total += _array_nbytes(leaf)
    return total


def _array_nbytes(leaf: Any) -> int:
    """Bytes of an array or shape-dtype leaf, with Python integers (no overflow)."""
    size = 1
    for n in leaf.shape:
        size *= int(n)
    dtype = leaf.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        # a typed key holds its key data: e.g. two uint32 words for threefry
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct((), dtype))
        return size * int(np.prod(data.shape, dtype=np.int64)) * int(np.dtype(data.dtype).itemsize)
    return size * int(np.dtype(dtype).itemsize)


def quantize(
    tree: Any,
    format: str | dtypes.Format = "int8",
    *,
    block: int = 32,
    out_axis: int = -1,
    keep: str | None = KEEP,
) -> Any:
    """Quantize a model's weights in one call: the matrices, with scales chosen by shape.

    The common case of `to_reduced_precision`, with its choices made: every
    floating leaf of two or more dimensions whose key path does not match
    `keep` (norms, biases, embeddings) becomes a Tensor of `format`; the rest
    stays as it is. The result is what `precision.apply(model)` runs.

    Scales, for a weight whose output channels lie along `out_axis` (-1: Flax,
    Haiku and `x @ w` kernels, `(..., in, out)`; 0: Equinox and PyTorch,
    `(out, in, ...)`):

    - 8-bit formats (int8, uint8, `float8_*`): one scale per output channel;
    - narrower ones (int4, int2, int1, uint4, fp6, fp4): one scale per block of
      `block` inputs of each output channel (blocks along the input axis, the
      last one shorter where the axis is not a multiple), the layout
      GPTQ-style checkpoints use;
    - named encodings with a scaling of their own (mxfp4, nvfp4, nf4...): that;
    - bfloat16, float16, tf32: none.

    Args:
        tree: any pytree of parameters (Flax `variables`, an Equinox module...).
        format: the target format (name or `dtypes.Format`), int8 by default.
        block: the block length of the narrow integer formats.
        out_axis: the output-channel axis of the weights: -1 or 0.
        keep: a regex of key paths left unconverted (default `precision.KEEP`:
            norms, biases, embeddings); None converts every matrix.

    Returns:
        A tree of the same structure.

    Raises:
        FormatError: an unknown format name.
        ScalingError: `block` is not a positive int, or `out_axis` is neither -1 nor 0.
        PrecisionTypeError: `keep` is not a regex string or None.

    Examples:
        >>> import jax.numpy as jnp
        >>> import precision
        >>> params = {"Dense_0": {"kernel": jnp.ones((64, 8)), "bias": jnp.zeros(8)},
        ...           "LayerNorm_0": {"scale": jnp.ones((4, 8))}}
        >>> q = precision.quantize(params, "int4")
        >>> q["Dense_0"]["kernel"].format.name, str(q["Dense_0"]["kernel"].scaling)
        ('int4', 'per-block 32 on axis -2')
        >>> type(q["Dense_0"]["bias"]).__name__, type(q["LayerNorm_0"]["scale"]).__name__
        ('ArrayImpl', 'ArrayImpl')
    """
    fmt = dtypes.get(format)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise dtypes.ScalingError(
            f"quantize: block must be a positive int (the inputs sharing one scale), got "
            f"{type(block).__name__} {block!r}; pass e.g. block=32 or block=128"
        )
    if isinstance(out_axis, bool) or out_axis not in (-1, 0):
        raise dtypes.ScalingError(
            f"quantize: out_axis must be -1 (Flax, Haiku: kernels (..., in, out)) or 0 "
            f"(Equinox, PyTorch: weights (out, in, ...)), got {out_axis!r}"
        )
    if keep is not None and not isinstance(keep, str):
        raise PrecisionTypeError(
            f"quantize: keep must be a regex string or None, got {type(keep).__name__} "
            f"{keep!r:.80}; pass e.g. keep='norm|bias|embed'"
        )
    kept = None if keep is None else re.compile(keep, re.IGNORECASE)
    in_axis = -2 if out_axis == -1 else 1

    def where(path: tuple[Any, ...], leaf: Any) -> bool:
        return bool(leaf.ndim >= 2 and (kept is None or not kept.search(_path_str(path))))

    def scaling(path: tuple[Any, ...], leaf: Any) -> dtypes.Scaling | None:
        if getattr(fmt, "scaling", None) is not None or (fmt.kind == "float" and fmt.bits > 8):
            return None  # a named encoding's own scaling, or an unscaled wide float
        if fmt.bits < 8:
            return dtypes.PerBlock(block, axis=in_axis)
        return dtypes.PerAxis(out_axis)

    return to_reduced_precision(tree, fmt, scaling=scaling, where=where)
