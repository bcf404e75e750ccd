"""`Tensor`: logical values of a floating dtype, stored in any `dtypes` format."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
from dtypes import PrecisionTypeError, ShapeError

from . import _codes_layout as codes_layout
from . import _operators
from ._codes_layout import Layout
from ._context import get_default_format, resolve_format
from ._errors import PrecisionMismatchError, TensorIndexError
from ._jax_compat import is_tracer
from ._storage import (
    carries_gradient,
    check_placement,
    decoder,
    encoder,
    full_format,
    guarded_encoder,
    needs_straight_through,
    replicated,
    role,
    scale_sharding,
    straight_through,
)
from ._tensor_checks import (
    as_array,
    astype_dtype,
    check_new_shape,
    check_static_index,
    logical_dtype,
    refuse_float32_overflow,
)

__all__ = ["Tensor", "logical_values"]


# Each distinct signature once: equal signatures are one object, so the operators' cache
# keys on identities (two ints to hash, not two nested tuples of formats and shapes).
# Signatures are small and few (one per format, scaling and shape in use).
_SIGNATURES: dict[tuple[Any, ...], tuple[Any, ...]] = {}


@jax.tree_util.register_pytree_with_keys_class
class Tensor:
    """Logical values of a float dtype stored in a (possibly reduced) format.

    A Tensor is an immutable pytree: its children are the storage arrays (the
    codes and, for scaled formats, the float32 scales); the format, scaling,
    logical dtype and packed length are static. `jit`, `grad`, `vmap`,
    `device_put` and `tree_map` therefore see the real storage, and a jitted
    function retraces when a format changes, never when values do.

    Args:
        x: numbers (numpy or jax array, tracer, list, scalar). Integer and bool
            input becomes float32; bfloat16/float16/float8 input keeps its
            format as storage (the values are exact) with logical float32.
        dtype: logical dtype, float32 (default) or float64 (needs x64).

    Raises:
        TypeError: complex, string or object input, or a non-float `dtype`.

    Examples:
        >>> import numpy as np
        >>> from precision import Tensor
        >>> t = Tensor(np.array([1.0, 2.5, 3.14159]))
        >>> r = t.to_reduced_precision()
        >>> r.dtype, r.format.name, r.is_reduced_precision
        (dtype('float32'), 'bfloat16', True)
        >>> np.asarray(r).tolist()
        [1.0, 2.5, 3.140625]
        >>> r.nbytes, t.nbytes
        (6, 12)
    """

    __slots__ = ("_dtype", "_encoded", "_layout", "_signature", "_straight_through")
    _dtype: np.dtype[Any]
    _encoded: dtypes.Encoded
    _layout: Layout
    _signature: tuple[Any, ...] | None
    _straight_through: jax.Array | None

    def __init__(self, x: Any, dtype: Any = None) -> None:
        if isinstance(x, Tensor):
            logical = x._dtype if dtype is None else logical_dtype(dtype, x._dtype)
            if logical != x._dtype and not x.is_reduced_precision:
                self._set(_unscaled(x._encoded.data.astype(logical), full_format(logical)), logical)
            else:
                self._set(x._encoded, logical, x._straight_through, x._layout)
            return
        arr, given = as_array(x)
        logical = logical_dtype(dtype, given)
        if (given.kind == "f" and given.itemsize < 4) or given.name == "bfloat16":
            fmt = full_format(given)  # a narrow float array is exact storage as it is
            self._set(_unscaled(jnp.asarray(arr), fmt), logical)
            return
        if given == np.float64 and logical == np.float32 and not is_tracer(arr):
            refuse_float32_overflow(np.asarray(arr))
        if not isinstance(arr, jax.Array) and not is_tracer(arr):
            arr = np.asarray(arr, logical)
        self._set(_unscaled(jnp.asarray(arr, logical), full_format(logical)), logical)

    def _set(
        self, encoded: dtypes.Encoded, dtype: np.dtype[Any], st: Any = None, layout: Layout = None
    ) -> None:
        # Immutability is by interface: public attributes are read-only
        # properties and __slots__ forbids new ones; plain stores keep the
        # constructor fast (it runs for every result of every operation).
        self._encoded = encoded
        self._dtype = dtype
        self._signature = None
        # Straight-through logical values: set only on Tensors converted from
        # traced values into storage that cannot carry a gradient (integer
        # codes, scaled or coded floats). Equal to the decoded storage, with
        # derivative 1 (0 where an encoding clipped) towards the source.
        self._straight_through = st
        self._layout = layout  # codes held with the last two axes swapped (`_layout.py`)

    @classmethod
    def _make(
        cls, encoded: dtypes.Encoded, dtype: np.dtype[Any], st: Any = None, layout: Layout = None
    ) -> Tensor:
        """The Tensor over `encoded` with logical `dtype`, unchecked: the library's one
        constructor from storage (pytree unflattening, conversions, the interpreter)."""
        t = object.__new__(cls)
        t._set(encoded, dtype, st, layout)
        return t

    @classmethod
    def from_encoded(cls, enc: dtypes.Encoded, dtype: Any = jnp.float32) -> Tensor:
        """A Tensor over existing storage (no re-encoding).

        Examples:
            >>> import dtypes
            >>> enc = dtypes.int8.encode([0.5, -1.0])
            >>> Tensor.from_encoded(enc).format.name
            'int8'
        """
        if not isinstance(enc, dtypes.Encoded):
            raise PrecisionTypeError(
                f"from_encoded expects a dtypes.Encoded, got {type(enc).__name__}"
            )
        return cls._make(enc, logical_dtype(dtype, None))

    def signature(self) -> tuple[Any, ...]:
        """Static description keying compiled evaluators (cached per Tensor)."""
        sig = self._signature
        if sig is None:
            children, aux = self._encoded.tree_flatten()
            shapes = tuple(None if a is None else a.shape for a in children)
            sig = (aux, self._dtype, shapes, self._straight_through is not None, self._layout)
            sig = self._signature = _SIGNATURES.setdefault(sig, sig)
        return sig

    # -- pytree: the Encoded's arrays, then the straight-through view ------------
    def tree_flatten_with_keys(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        children, aux = self.tree_flatten()
        return tuple(zip(_CHILD_KEYS, children, strict=True)), aux

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        children, aux = self._encoded.tree_flatten()
        return (*children, self._straight_through), (aux, self._dtype, self._layout)

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> Tensor:
        encoded_aux, dtype, layout = aux
        st = children[4]
        # one layer of a stack under vmap/scan, or a batch of encodings made under vmap:
        # the Encoded refits its scaling to the arrays it is given
        encoded = dtypes.Encoded.tree_unflatten(encoded_aux, children[:4])
        if isinstance(st, jax.Array | np.ndarray) and not is_tracer(st):
            # A straight-through copy carries a gradient only while it is traced; out of
            # `grad` (an aux output, a jitted step's result) it would be a float32 copy
            # that `nbytes` does not count, so it is dropped.
            st = None
        return cls._make(encoded, dtype, st, layout)

    # -- properties ---------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        """The logical dtype (float32 or float64), whatever the storage."""
        return self._dtype

    @property
    def format(self) -> dtypes.Format:
        """The storage format; the logical dtype's own format when full precision."""
        return self._encoded.format

    @property
    def scaling(self) -> dtypes.Scaling | None:
        """The scaling of the storage, or None for an unscaled float format (its axes
        those of the logical values, whatever the `layout`)."""
        if self._layout is None:
            return self._encoded.scaling
        return codes_layout.held_scaling(self._encoded.scaling, len(self._encoded.shape))

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape (derived from the storage, so batching stays correct)."""
        if self._layout is None:
            return self._encoded.shape
        return codes_layout.held_shape(self._encoded.shape)

    @property
    def layout(self) -> Layout:
        """How the codes are held: None (as the values lie) or `"transposed"` (the last two
        axes swapped, as GPU GEMMs read `w` of `x @ w`: see `to_reduced_precision`)."""
        return self._layout

    @property
    def ndim(self) -> int:
        """Number of logical dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of logical elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self.shape:
            raise PrecisionTypeError("len() of a 0-d Tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        # Without this, Python would iterate through __getitem__ until an
        # IndexError that clamped JAX indexing never raises.
        for i in range(len(self)):
            yield self[i]

    @property
    def device(self) -> Any:
        """The device holding the storage; its sharding when spread over several."""
        data = self._encoded.data
        if is_tracer(data):
            return None
        devs = data.sharding.device_set
        return next(iter(devs)) if len(devs) == 1 else data.sharding

    @property
    def sharding(self) -> Any:
        """The sharding of the data array (None while traced)."""
        data = self._encoded.data
        return None if is_tracer(data) else data.sharding

    @property
    def nbytes(self) -> int:
        """Bytes of storage really held: codes plus scales (and any zero points)."""
        self.check_holds_arrays("nbytes")
        return self._encoded.nbytes

    def check_holds_arrays(self, what: str) -> None:
        """Refuse to count or store a Tensor whose leaves are not arrays: one made by a
        `jax.tree.map` that put other things in (shapes, `ShapeDtypeStruct`s, None)."""
        enc = self._encoded
        for part in (enc.data, enc.scale, enc.tensor_scale, enc.zero_point):
            if part is not None and not (hasattr(part, "shape") and hasattr(part, "dtype")):
                raise PrecisionTypeError(
                    f"{what}: this Tensor holds {type(part).__name__} {part!r:.40} where its "
                    "arrays go (a tree made by jax.tree.map(f, params) holds what f returned); "
                    "use it on the Tensors themselves, not on a tree derived from them"
                )

    @property
    def is_reduced_precision(self) -> bool:
        """Whether the storage format differs from the logical dtype's own format."""
        return self._encoded.format != full_format(self._dtype)

    isReducedPrecision = is_reduced_precision

    @property
    def encoded(self) -> dtypes.Encoded:
        """The storage as a `dtypes.Encoded` (scale None when unscaled), as held: under
        `layout="transposed"` its arrays have the last two axes swapped."""
        return self._encoded

    # -- values ---------------------------------------------------------------
    def _values(self) -> jax.Array:
        if self._straight_through is not None:
            return self._straight_through
        if self._layout is not None:
            return decoder(self._dtype)(self._encoded).swapaxes(-1, -2)
        enc = self._encoded
        data, fmt = enc.data, enc.format
        if enc.scale is None and fmt.kind == "float" and not fmt.packed:
            if enc.tensor_scale is None and enc.zero_point is None and data.dtype != np.uint8:
                return data if data.dtype == self._dtype else data.astype(self._dtype)
        return decoder(self._dtype)(enc)

    def numpy(self) -> np.ndarray:
        """Logical values as a numpy array."""
        return np.asarray(self._values())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self._values())
        return out if dtype is None else out.astype(dtype)

    def __jax_array__(self) -> jax.Array:
        """The logical values, where JAX asks for an array.

        JAX asks the same way, with nothing said of who asks, for `jnp.asarray(t)`,
        any jnp function, an operator of a JAX array (`x + t`) and a library's
        conversion (Flax's `promote_dtype`), so the answer depends on the Tensor
        alone (docs/design.md §4): a compute format narrower than the logical dtype
        (bfloat16, float16, tf32, unscaled fp8) refuses, since JAX would compute on
        the wider values and drop the format without a word; float32 Tensors and
        storage encodings decode exactly into what the rules compute in, so they
        convert anywhere."""
        fmt = self._encoded.format
        if role(fmt, self._encoded.scaling) == "compute" and fmt != full_format(self._dtype):
            raise PrecisionMismatchError(
                f"a {fmt.name} Tensor of shape {self.shape} does not become a JAX array "
                "implicitly: jnp.asarray(t), jnp functions, operators of JAX arrays (x + t) "
                "and libraries all ask for it the same way, and each would compute in "
                f"{self._dtype.name} and drop the {fmt.name} format without a word. Compute "
                "under the rules (the Tensor's operators and methods, or precision.apply(f)(...) "
                "with the Tensors as arguments, not closed over), or convert explicitly: "
                f"t.to_full_precision() (a {self._dtype.name} Tensor, which converts anywhere), "
                "precision.to_full_precision(t) (a jax.Array, also under jit and grad), "
                "t.numpy() or np.asarray(t)"
            )
        return self._values()

    def item(self) -> float:
        """The single logical value as a Python float."""
        self._one_value("item()")
        return float(self.numpy().item())

    def __float__(self) -> float:
        self._one_value("float()")
        return float(self.numpy().reshape(()))

    def __bool__(self) -> bool:
        self._one_value("bool()")
        return bool(self.numpy())

    def _one_value(self, what: str) -> None:
        if math.prod(self.shape) != 1:
            raise ShapeError(
                f"{what} needs a Tensor of one value, got shape {self.shape}; take one with "
                "t[i] first, or reduce it (t.sum(), t.max())"
            )

    # -- conversions ------------------------------------------------------------
    def to_reduced_precision(
        self,
        format: str | dtypes.Format | None = None,
        *,
        scaling: dtypes.Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
        layout: Layout = None,
    ) -> Tensor:
        """Re-encode the logical values in `format` (default: bfloat16 or the context's).

        Converting a reduced Tensor re-encodes from its logical values. The
        conversion is straight-through for gradients in unscaled float formats.

        Args:
            format: a format name or `dtypes.Format`; None uses
                `precision.get_default_format()`.
            scaling: `dtypes.PerTensor()`, `PerAxis(axis)`, `PerBlock(size)`; integer
                formats default to per-tensor.
            rounding: one of `dtypes.ROUNDING_MODES`.
            key: a `jax.random` key, required for `rounding="stochastic"`.
            layout: `"transposed"` holds int8/fp8 codes (per tensor or axis) with the last
                two axes swapped, as GPU GEMMs read `w` of `x @ w` (a Flax `(in, out)`
                kernel). In the same format and scaling, only the codes move (both ways).

        Raises:
            FormatError: an unknown format name.
            ValueError: a bad rounding mode, a missing key, or non-finite values
                given to a scaled format.

        Examples:
            >>> import dtypes
            >>> t = Tensor([0.1, -2.0, 3.0]).to_reduced_precision("int8")
            >>> t.format.name, t.scaling.describe()
            ('int8', 'per-tensor')
        """
        fmt = get_default_format() if format is None else resolve_format(format)
        x = self._values()
        if fmt == full_format(self._dtype) and scaling is None and layout is None:
            return Tensor._make(_unscaled(x, fmt), self._dtype)
        dtypes.check_rounding(rounding, key)
        if scaling is None:
            scaling = fmt.default_scaling()
        at_rest, conversion = self._straight_through is None, (rounding, key)
        laid = codes_layout.laid_out(
            self._encoded, self._layout, at_rest, x, fmt, scaling, conversion, layout
        )
        if laid is not None:  # a layout: held codes moved, or encoded transposed
            return Tensor._make(laid[0], self._dtype, None, laid[1])
        fmt.check(x, scaling=scaling)
        if needs_straight_through(x, fmt, scaling):
            # Differentiated: the codes carry no gradient, so the Tensor keeps
            # the straight-through view of its source while it is traced.
            enc = encoder(fmt, scaling, rounding)(jax.lax.stop_gradient(x), key)
            return Tensor._make(enc, self._dtype, straight_through(self._dtype, x, enc))
        if is_tracer(x) and not carries_gradient(fmt, scaling):
            enc = guarded_encoder(fmt, scaling, rounding)(x, key)
        else:
            enc = encoder(fmt, scaling, rounding)(x, key)
        return Tensor._make(enc, self._dtype)

    def to_full_precision(self) -> Tensor:
        """The same logical values stored in the logical dtype's own format."""
        if not self.is_reduced_precision:
            return self
        return Tensor._make(_unscaled(self._values(), full_format(self._dtype)), self._dtype)

    toReducedPrecision = to_reduced_precision
    toFullPrecision = to_full_precision

    def astype(self, dtype: Any) -> Tensor:
        """The same values with another *logical* dtype (float32 or float64), as numpy's.

        The storage format is kept. To change how values are stored, call
        `to_reduced_precision(format)`; a format name given here is refused
        with that advice.

        Raises:
            TypeError: `dtype` is not float32 or float64 (e.g. a format name).
        """
        logical = astype_dtype(dtype)
        return Tensor(self, dtype=logical)

    def to_device(self, device_or_sharding: Any) -> Tensor:
        """The Tensor with its storage placed on a device or sharding.

        Scales follow the data: under a `NamedSharding` each scale dimension is
        split like the data dimension it belongs to when it is as long as it,
        and replicated otherwise.
        """
        check_placement(device_or_sharding, "to_device")
        if self._layout is not None:
            device_or_sharding = codes_layout.held_placement(device_or_sharding, self.shape)
        enc = self._encoded
        data = jax.device_put(enc.data, device_or_sharding)
        put = functools.partial(_placed_like_data, device_or_sharding, enc.data)
        # a tensor scale is one number: replicated; zero points follow the data like scales
        tensor_scale = enc.tensor_scale
        if tensor_scale is not None:
            tensor_scale = jax.device_put(tensor_scale, replicated(device_or_sharding))
        placed = dtypes.Encoded(
            data,
            put(enc.scale),
            enc.format,
            enc.scaling,
            enc.packed_last,
            tensor_scale=tensor_scale,
            zero_point=put(enc.zero_point),
        )
        st = self._straight_through
        if st is not None:
            st = jax.device_put(st, device_or_sharding)
        return Tensor._make(placed, self._dtype, st, self._layout)

    # -- display ------------------------------------------------------------------
    def __repr__(self) -> str:
        enc = self._encoded
        fmt = enc.format.name
        if enc.scaling is not None:
            fmt += f", scaling={self.scaling.describe()}"  # type: ignore[union-attr]
        if self._layout is not None:
            fmt += f", layout={self._layout}"
        if not isinstance(enc.data, jax.Array | np.ndarray) and not is_tracer(enc.data):
            # A tree_map put other leaves in the storage's place (shapes, None, a
            # ShapeDtypeStruct for a restore target): show them, as JAX shows any pytree.
            leaves = f"data={enc.data!r}"
            if enc.scale is not None:
                leaves += f", scale={enc.scale!r}"
            return f"Tensor(dtype={self._dtype.name}, format={fmt}, {leaves})"
        head = f"shape={self.shape}, dtype={self._dtype.name}, format={fmt}"
        if is_tracer(enc.data):
            return f"Tensor({head}, traced)"
        values = np.array2string(
            self.numpy(), threshold=8, edgeitems=2, precision=4, separator=", "
        ).replace("\n", "\n       ")
        return f"Tensor({head}, device={self.device},\n       {values})"

    # comparisons are elementwise, as for arrays (typeshed's object.__hash__ admits no None)
    __hash__: ClassVar[None] = None  # type: ignore[assignment]

    # -- operators and methods: slots that `_applied_operators` fills with `precision.apply` calls
    __array_priority__ = 100
    __add__, __radd__ = _operators.binary("add"), _operators.reflected("add")
    __sub__, __rsub__ = _operators.binary("sub"), _operators.reflected("sub")
    __mul__, __rmul__ = _operators.binary("mul"), _operators.reflected("mul")
    __truediv__, __rtruediv__ = _operators.binary("truediv"), _operators.reflected("truediv")
    __floordiv__ = _operators.binary("floordiv")
    __rfloordiv__ = _operators.reflected("floordiv")
    __mod__, __rmod__ = _operators.binary("mod"), _operators.reflected("mod")
    __pow__, __rpow__ = _operators.binary("pow"), _operators.reflected("pow")
    __matmul__, __rmatmul__ = _operators.binary("matmul"), _operators.reflected("matmul")
    __lt__, __le__ = _operators.binary("lt"), _operators.binary("le")
    __gt__, __ge__ = _operators.binary("gt"), _operators.binary("ge")
    __eq__, __ne__ = _operators.binary("eq"), _operators.binary("ne")
    __neg__, __pos__, __abs__ = (
        _operators.unary("neg"),
        _operators.unary("pos"),
        _operators.unary("abs"),
    )

    def __getitem__(self, key: Any) -> Any:
        """Indexing as JAX does it, except that a static integer index out of range
        raises `IndexError` (as numpy does) instead of being clamped."""
        check_static_index(key, self.shape)
        try:
            return _getitem(self, key)
        except IndexError as err:
            raise TensorIndexError(f"cannot index a Tensor of shape {self.shape}: {err}") from None
        except TypeError as err:
            if isinstance(err, PrecisionTypeError | PrecisionMismatchError):
                raise
            raise PrecisionTypeError(
                f"cannot index a Tensor of shape {self.shape} with {key!r}: {err}"
            ) from None

    sum = _operators.reduction("sum")
    mean = _operators.reduction("mean")
    max = _operators.reduction("max")
    min = _operators.reduction("min")
    argmax = _operators.reduction("argmax")
    argmin = _operators.reduction("argmin")

    def reshape(self, *shape: Any) -> Tensor:
        """The Tensor with a new logical shape (storage codes move where the scaling allows)."""
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        check_new_shape(shape, self.shape)
        out: Tensor = _operators.method("reshape")(self, tuple(shape))
        return out

    def transpose(self, *axes: Any) -> Tensor:
        """Axes permuted (reversed when none are given)."""
        given = len(axes) == 1 and isinstance(axes[0], tuple | list)
        axes = () if axes == (None,) else tuple(axes[0]) if given else axes
        if axes or given:  # every axis once (numpy refuses anything else; JAX may not)
            n = self.ndim
            ints = all(isinstance(a, int | np.integer) and not isinstance(a, bool) for a in axes)
            if not ints or sorted(int(a) % n if -n <= a < n else -1 for a in axes) != [*range(n)]:
                raise ShapeError(
                    f"Tensor.transpose: {axes!r:.60} is not a permutation of the {n} axes of a "
                    f"Tensor of shape {self.shape}; pass each once, e.g. {tuple(range(n))[::-1]}"
                )
        if self._layout is not None and codes_layout.swaps_last_two(axes, self.ndim):
            return Tensor._make(self._encoded, self._dtype)  # the codes as held
        out: Tensor = _operators.method("transpose")(self, tuple(axes) if axes else None)
        return out

    @property
    def T(self) -> Tensor:
        """Axes reversed."""
        return self.transpose()


_getitem = _operators.method("getitem")

_CHILD_KEYS = tuple(
    jax.tree_util.GetAttrKey(name)
    for name in ("data", "scale", "tensor_scale", "zero_point", "straight")
)


def _unscaled(values: Any, fmt: dtypes.Format) -> dtypes.Encoded:
    """Storage of `values` held as they are in the unscaled float format `fmt`."""
    return dtypes.Encoded(values, None, fmt, None)


def _placed_like_data(target: Any, data: jax.Array, scales: jax.Array | None) -> jax.Array | None:
    """Scales (or zero points) placed like the `data` they belong to on `target`."""
    if scales is None:
        return None
    placed: jax.Array = jax.device_put(scales, scale_sharding(target, data, scales))
    return placed


def logical_values(t: Any) -> jax.Array:
    """A Tensor's logical values as an array, an array as itself (the library's own
    explicit conversion: `__jax_array__` refuses a narrow compute format)."""
    return t._values() if isinstance(t, Tensor) else jnp.asarray(t)
