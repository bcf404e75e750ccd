"""`Tensor`: logical values of a floating dtype, stored in any `dtypes` format."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import dtypes
from dtypes import PrecisionTypeError

from . import _operators
from ._context import get_default_format, resolve_format
from ._errors import PrecisionMismatchError, TensorIndexError
from ._implicit import implicit_caller
from ._jax_compat import is_tracer
from ._storage import (
    carries_gradient,
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
    LOGICAL_DTYPES,
    as_array,
    check_new_shape,
    check_static_index,
    logical_dtype,
    refuse_float32_overflow,
)

__all__ = ["Tensor", "logical_values"]


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

    __slots__ = (
        "_data",
        "_dtype",
        "_extra",
        "_format",
        "_packed_last",
        "_scale",
        "_scaling",
        "_signature",
        "_straight",
    )
    _data: jax.Array
    _dtype: np.dtype[Any]
    _extra: tuple[jax.Array | None, jax.Array | None] | None
    _format: dtypes.Format
    _packed_last: int | None
    _scale: jax.Array | None
    _scaling: dtypes.Scaling | None
    _signature: tuple[Any, ...] | None
    _straight: jax.Array | None

    def __init__(self, x: Any, dtype: Any = None) -> None:
        if isinstance(x, Tensor):
            logical = x._dtype if dtype is None else logical_dtype(dtype, x._dtype)
            self._set(
                x._data,
                x._scale,
                x._format,
                x._scaling,
                logical,
                x._packed_last,
                x._straight,
                x._extra,
            )
            if logical != x._dtype and not x.is_reduced_precision:
                self._set(x._data.astype(logical), None, full_format(logical), None, logical, None)
            return
        arr, given = as_array(x)
        logical = logical_dtype(dtype, given)
        if (given.kind == "f" and given.itemsize < 4) or given.name == "bfloat16":
            fmt = full_format(given)  # a narrow float array is exact storage as it is
            self._set(jnp.asarray(arr), None, fmt, None, logical, None)
            return
        if given == np.float64 and logical == np.float32 and not is_tracer(arr):
            refuse_float32_overflow(np.asarray(arr))
        if not isinstance(arr, jax.Array) and not is_tracer(arr):
            arr = np.asarray(arr, logical)
        self._set(jnp.asarray(arr, logical), None, full_format(logical), None, logical, None)

    def _set(
        self,
        data: Any,
        scale: Any,
        fmt: dtypes.Format,
        scaling: dtypes.Scaling | None,
        dtype: np.dtype[Any],
        last: int | None,
        st: Any = None,
        extra: Any = None,
    ) -> None:
        # Immutability is by interface: public attributes are read-only
        # properties and __slots__ forbids new ones; plain stores keep the
        # constructor fast (it runs for every result of every operation).
        self._data = data
        self._scale = scale
        self._format = fmt
        self._scaling = scaling
        self._dtype = dtype
        self._packed_last = last
        self._signature = None
        # Straight-through logical values: set only on Tensors converted from
        # traced values into storage that cannot carry a gradient (integer
        # codes, scaled or coded floats). Equal to the decoded storage, with
        # derivative 1 (0 where an encoding clipped) towards the source.
        self._straight = st
        # Further storage arrays of some encodings: (tensor scale, zero points),
        # e.g. NVFP4's float32 per-tensor scale, asymmetric integers' zero points.
        self._extra = extra

    @classmethod
    def _make(
        cls,
        data: Any,
        scale: Any,
        fmt: dtypes.Format,
        scaling: dtypes.Scaling | None,
        dtype: np.dtype[Any],
        last: int | None,
        st: Any = None,
        extra: Any = None,
    ) -> Tensor:
        """A Tensor from storage, unchecked (pytree unflattening and the interpreter)."""
        t = object.__new__(cls)
        t._set(data, scale, fmt, scaling, dtype, last, st, extra)
        return t

    @classmethod
    def _of(cls, enc: dtypes.Encoded, dtype: Any, st: Any = None) -> Tensor:
        """A Tensor holding every array of `enc` (unchecked)."""
        last = enc.shape[-1] if (enc.format.packed and enc.shape) else None
        extra = None
        if enc.tensor_scale is not None or enc.zero_point is not None:
            extra = (enc.tensor_scale, enc.zero_point)
        return cls._make(enc.data, enc.scale, enc.format, enc.scaling, dtype, last, st, extra)

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
        return cls._of(enc, logical_dtype(dtype, None))

    def signature(self) -> tuple[Any, ...]:
        """Static description keying compiled evaluators (cached per Tensor)."""
        sig = self._signature
        if sig is None:
            scale = self._scale
            sig = self._signature = (
                self._format,
                self._scaling,
                self._dtype,
                self._packed_last,
                self._data.shape,
                None if scale is None else scale.shape,
                self._straight is not None,
                None
                if self._extra is None
                else tuple(None if a is None else a.shape for a in self._extra),
            )
        return sig

    # -- pytree -------------------------------------------------------------
    def tree_flatten_with_keys(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        keys = jax.tree_util.GetAttrKey
        tensor_scale, zero_point = self._extra or (None, None)
        children = (
            (keys("data"), self._data),
            (keys("scale"), self._scale),
            (keys("tensor_scale"), tensor_scale),
            (keys("zero_point"), zero_point),
            (keys("straight"), self._straight),
        )
        return children, (self._format, self._scaling, self._dtype, self._packed_last)

    def tree_flatten(self) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        tensor_scale, zero_point = self._extra or (None, None)
        return (self._data, self._scale, tensor_scale, zero_point, self._straight), (
            self._format,
            self._scaling,
            self._dtype,
            self._packed_last,
        )

    @classmethod
    def tree_unflatten(cls, aux: tuple[Any, ...], children: tuple[Any, ...]) -> Tensor:
        fmt, scaling, dtype, last = aux
        data, scale, tensor_scale, zero_point, st = children
        # one layer of a stack under vmap/scan, or a batch of encodings made under vmap
        scaling = dtypes.Encoded.fitted_scaling(fmt, scaling, last, data, scale)
        if isinstance(st, jax.Array | np.ndarray) and not is_tracer(st):
            # A straight-through copy carries a gradient only while it is traced; out of
            # `grad` (an aux output, a jitted step's result) it would be a float32 copy
            # that `nbytes` does not count, so it is dropped.
            st = None
        extra = None
        if tensor_scale is not None or zero_point is not None:
            extra = (tensor_scale, zero_point)
        return cls._make(data, scale, fmt, scaling, dtype, last, st, extra)

    # -- properties ---------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        """The logical dtype (float32 or float64), whatever the storage."""
        return self._dtype

    @property
    def format(self) -> dtypes.Format:
        """The storage format; the logical dtype's own format when full precision."""
        return self._format

    @property
    def scaling(self) -> dtypes.Scaling | None:
        """The scaling of the storage, or None for an unscaled float format."""
        return self._scaling

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape (derived from the storage, so batching stays correct)."""
        shape = tuple(self._data.shape)
        if not self._format.packed:
            return shape
        if self._packed_last is None:
            return shape[:-1]
        return (*shape[:-1], self._packed_last)

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
        if is_tracer(self._data):
            return None
        devs = self._data.sharding.device_set
        return next(iter(devs)) if len(devs) == 1 else self._data.sharding

    @property
    def sharding(self) -> Any:
        """The sharding of the data array (None while traced)."""
        return None if is_tracer(self._data) else self._data.sharding

    @property
    def nbytes(self) -> int:
        """Bytes of storage really held: codes plus scales (and any zero points)."""
        n = 0
        for a in (self._data, self._scale, *(self._extra or ())):
            if a is not None:
                n += int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize
        return n

    @property
    def is_reduced_precision(self) -> bool:
        """Whether the storage format differs from the logical dtype's own format."""
        return self._format != full_format(self._dtype)

    isReducedPrecision = is_reduced_precision

    @property
    def encoded(self) -> dtypes.Encoded:
        """The storage as a `dtypes.Encoded` (scale None when unscaled)."""
        tensor_scale, zero_point = self._extra or (None, None)
        return dtypes.Encoded(
            self._data,
            self._scale,
            self._format,
            self._scaling,
            self._packed_last,
            tensor_scale=tensor_scale,
            zero_point=zero_point,
        )

    # -- values ---------------------------------------------------------------
    def _values(self) -> jax.Array:
        if self._straight is not None:
            return self._straight
        data, fmt = self._data, self._format
        if self._scale is None and self._extra is None and fmt.kind == "float":
            if not fmt.packed and data.dtype != np.uint8:
                return data if data.dtype == self._dtype else data.astype(self._dtype)
        return decoder(self._dtype)(self.encoded)

    def numpy(self) -> np.ndarray:
        """Logical values as a numpy array."""
        return np.asarray(self._values())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.asarray(self._values())
        return out if dtype is None else out.astype(dtype)

    def __jax_array__(self) -> jax.Array:
        """The logical values, where JAX asks for an array.

        A Tensor in a compute format (an unscaled narrow float: bfloat16, float16,
        float8, ...) gives them only to `jnp.asarray(t)` / `jnp.array(t)` written by
        the user: a jnp function, an operator of a JAX array or a library's
        `jnp.asarray` would compute on float32 values and drop the format silently,
        so they are refused. Storage encodings decode exactly into the logical dtype,
        which is what the rules compute in, so they convert anywhere."""
        fmt = self._format
        narrow = role(fmt, self._scaling) == "compute" and fmt != full_format(self._dtype)
        caller = implicit_caller() if narrow else None
        if caller is not None:
            raise PrecisionMismatchError(
                f"a {fmt.name} Tensor reached {caller}, outside precision's rules: "
                "JAX would compute on its float32 values and the format would be lost without "
                "a word. Run the function under the rules with precision.apply(f)(...), "
                "passing the Tensors as its arguments (not closed over), or convert "
                "explicitly first: t.to_full_precision(), jnp.asarray(t) or np.asarray(t)"
            )
        return self._values()

    def item(self) -> float:
        """The single logical value as a Python float."""
        return float(self.numpy().item())

    def __float__(self) -> float:
        return float(self.numpy())

    def __bool__(self) -> bool:
        return bool(self.numpy())

    # -- conversions ------------------------------------------------------------
    def to_reduced_precision(
        self,
        format: str | dtypes.Format | None = None,
        *,
        scaling: dtypes.Scaling | None = None,
        rounding: str = "nearest_even",
        key: jax.Array | None = None,
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
        if fmt == full_format(self._dtype) and scaling is None:
            return Tensor._make(x, None, fmt, None, self._dtype, None)
        dtypes.check_rounding(rounding, key)
        if scaling is None:
            scaling = fmt.default_scaling()
        fmt.check(x, scaling=scaling)
        if needs_straight_through(x, fmt, scaling):
            # Differentiated: the codes carry no gradient, so the Tensor keeps
            # the straight-through view of its source while it is traced.
            enc = encoder(fmt, scaling, rounding)(jax.lax.stop_gradient(x), key)
            return Tensor._of(enc, self._dtype, straight_through(self._dtype, x, enc))
        if is_tracer(x) and not carries_gradient(fmt, scaling):
            enc = guarded_encoder(fmt, scaling, rounding)(x, key)
        else:
            enc = encoder(fmt, scaling, rounding)(x, key)
        return Tensor._of(enc, self._dtype)

    def to_full_precision(self) -> Tensor:
        """The same logical values stored in the logical dtype's own format."""
        if not self.is_reduced_precision:
            return self
        return Tensor._make(self._values(), None, full_format(self._dtype), None, self._dtype, None)

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
        try:
            logical = np.dtype(dtype)
        except TypeError:
            logical = None
        if logical is None or logical not in LOGICAL_DTYPES:
            raise PrecisionTypeError(
                f"Tensor.astype changes the logical dtype (float32 or float64), got {dtype!r}; "
                f"to store the values in a format, call t.to_reduced_precision({str(dtype)!r})"
            )
        return Tensor(self, dtype=logical)

    def to_device(self, device_or_sharding: Any) -> Tensor:
        """The Tensor with its storage placed on a device or sharding.

        Scales follow the data: under a `NamedSharding` each scale dimension is
        split like the data dimension it belongs to when it is as long as it,
        and replicated otherwise.
        """
        target = device_or_sharding
        data = jax.device_put(self._data, target)
        scale = self._scale
        if scale is not None:
            scale = jax.device_put(scale, scale_sharding(target, self._data, scale))
        st = None if self._straight is None else jax.device_put(self._straight, target)
        extra = self._extra
        if extra is not None:
            # a tensor scale is one number: replicated; zero points follow the data like scales
            ts, zp = extra
            if ts is not None:
                ts = jax.device_put(ts, replicated(target))
            if zp is not None:
                zp = jax.device_put(zp, scale_sharding(target, self._data, zp))
            extra = (ts, zp)
        return Tensor._make(
            data, scale, self._format, self._scaling, self._dtype, self._packed_last, st, extra
        )

    # -- display ------------------------------------------------------------------
    def __repr__(self) -> str:
        fmt = self._format.name
        if self._scaling is not None:
            fmt += f", scaling={self._scaling.describe()}"
        if not isinstance(self._data, jax.Array | np.ndarray) and not is_tracer(self._data):
            # A tree_map put other leaves in the storage's place (shapes, None, a
            # ShapeDtypeStruct for a restore target): show them, as JAX shows any pytree.
            leaves = f"data={self._data!r}"
            if self._scale is not None:
                leaves += f", scale={self._scale!r}"
            return f"Tensor(dtype={self._dtype.name}, format={fmt}, {leaves})"
        head = f"shape={self.shape}, dtype={self._dtype.name}, format={fmt}"
        if is_tracer(self._data):
            return f"Tensor({head}, traced)"
        values = np.array2string(
            self.numpy(), threshold=8, edgeitems=2, precision=4, separator=", "
        ).replace("\n", "\n       ")
        return f"Tensor({head}, device={self.device},\n       {values})"

    # comparisons are elementwise, as for arrays (typeshed's object.__hash__ admits no None)
    __hash__: ClassVar[None] = None  # type: ignore[assignment]

    # -- operators and methods: thin calls of `precision.apply` ------------------
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
        if len(axes) == 1 and isinstance(axes[0], tuple | list):
            axes = tuple(axes[0])
        out: Tensor = _operators.method("transpose")(self, tuple(axes) if axes else None)
        return out

    @property
    def T(self) -> Tensor:
        """Axes reversed."""
        out: Tensor = _operators.method("transpose")(self, None)
        return out


_getitem = _operators.method("getitem")


def logical_values(t: Any) -> jax.Array:
    """A Tensor's logical values as an array, an array as itself (the library's own
    explicit conversion: `__jax_array__` refuses calls from library code)."""
    return t._values() if isinstance(t, Tensor) else jnp.asarray(t)
