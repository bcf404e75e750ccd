"""`Encoded`: the storage of one tensor in one format (a pytree)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from ._errors import FormatTypeError, PrecisionTypeError
from ._format import Format
from ._scaling import Scaling

__all__ = ["Encoded", "format_of"]


@jax.tree_util.register_pytree_node_class
class Encoded:
    """Storage arrays of a tensor encoded in `format`.

    A pytree whose children are the arrays actually held (`data`, and `scale`
    when the encoding is scaled) and whose static part is the format, the
    scaling and, for packed formats, the logical length of the last axis.
    The logical shape is derived from `data`, so `vmap` adds batch dimensions
    correctly.

    Attributes:
        data: codes in the format's container (packed bytes for int4/int2/int1).
        scale: float32 scales, shaped like `scaling.scale_shape(shape)`, or None.
        format: the `Format` the codes are in.
        scaling: the `Scaling` used, or None for an unscaled float encoding.
        tensor_scale: the float32 per-tensor scale of a two-level encoding
            (NVFP4: e4m3 block scales times this), else None. Shape `()`; or,
            for a stack encoded one layer at a time, one per layer, shaped to
            broadcast over the scales (`(layers, 1, 1)`).
        zero_point: per-group zero points of an asymmetric integer encoding
            (uint8, shaped like `scale`), else None.
    """

    __slots__ = ("_last", "data", "format", "scale", "scaling", "tensor_scale", "zero_point")

    def __init__(
        self,
        data: jax.Array,
        scale: jax.Array | None,
        format: Format,
        scaling: Scaling | None,
        last: int | None = None,
        *,
        tensor_scale: jax.Array | None = None,
        zero_point: jax.Array | None = None,
    ):
        self.data = data
        self.scale = scale
        self.format = format
        self.scaling = scaling
        self._last = last
        self.tensor_scale = tensor_scale
        self.zero_point = zero_point

    def tree_flatten(
        self,
    ) -> tuple[
        tuple[jax.Array, jax.Array | None, jax.Array | None, jax.Array | None],
        tuple[Format, Scaling | None, int | None],
    ]:
        children = (self.data, self.scale, self.tensor_scale, self.zero_point)
        return children, (self.format, self.scaling, self._last)

    @classmethod
    def tree_unflatten(
        cls, aux: tuple[Format, Scaling | None, int | None], children: tuple[Any, ...]
    ) -> Encoded:
        data, scale, tensor_scale, zero_point = children
        fmt, scaling, last = aux
        if scaling is not None:  # (this runs for every result of every operation)
            scaling = cls.fitted_scaling(fmt, scaling, last, data, scale)
        if tensor_scale is not None:
            tensor_scale = cls.fitted_tensor_scale(tensor_scale, scale)
        return cls(
            data, scale, fmt, scaling, last, tensor_scale=tensor_scale, zero_point=zero_point
        )

    @staticmethod
    def fitted_scaling(
        fmt: Format, scaling: Scaling | None, last: int | None, data: Any, scale: Any
    ) -> Scaling | None:
        """`scaling` as it fits `data` and `scale` when a pytree is rebuilt from them.

        `vmap`/`scan` take axes from (or add axes to) the arrays without telling
        the scaling: one layer of a `PerAxis(0)` stack is `PerTensor`
        (`Scaling.refit`). Leaves without shapes (JAX's placeholders) leave it as is.
        """
        shape, groups = getattr(data, "shape", None), getattr(scale, "shape", None)
        try:
            return _fitted(fmt, scaling, last, shape, groups)
        except Exception:  # (a key that cannot be hashed or compared: worked out each time)
            return _fitted.__wrapped__(fmt, scaling, last, shape, groups)

    @staticmethod
    def fitted_tensor_scale(tensor_scale: Any, scale: Any) -> Any:
        """A two-level tensor scale as it fits `scale` when a pytree is rebuilt.

        Encoding each layer under `jax.vmap` gives one tensor scale per layer,
        batched as `(layers,)`; it is held as `(layers, 1, 1)` so that it
        broadcasts over the block scales (`tensor_scale_fits`).
        """
        ts, groups = getattr(tensor_scale, "shape", None), getattr(scale, "shape", None)
        if not isinstance(ts, tuple) or not isinstance(groups, tuple):
            return tensor_scale
        if 0 < len(ts) < len(groups) and ts == groups[: len(ts)]:
            return tensor_scale.reshape(ts + (1,) * (len(groups) - len(ts)))
        return tensor_scale

    @property
    def packed_last(self) -> int | None:
        """The logical length of the last axis of packed codes (None when not packed,
        or for a packed scalar): `data` holds it rounded up to whole bytes."""
        return self._last

    @property
    def packed(self) -> bool:
        """Whether `data` holds several codes per byte."""
        return self.format.packed

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape of the encoded tensor."""
        shape = tuple(self.data.shape)
        if not self.packed:
            return shape
        if self._last is None:
            return shape[:-1]  # a scalar, stored as one byte
        return (*shape[:-1], self._last)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays actually held: data plus scales."""
        n = 0
        for a in (self.data, self.scale, self.tensor_scale, self.zero_point):
            if a is not None:
                n += int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize
        return n

    def group_scales(self) -> jax.Array | None:
        """float32 multiplier of the codes of each scaling group, or None if unscaled.

        Shaped like `scaling.scale_shape(shape)`: the stored scales widened
        exactly (E8M0 bytes built from bits, the implicit element scale of
        MXINT8 folded in, a two-level encoding's tensor scale multiplied in),
        so `codes * broadcast(group_scales())` is what `decode` computes.
        Asymmetric encodings also subtract their zero point.
        """
        if self.scale is None or self.scaling is None:
            return None
        from ._scale_storage import widen  # JAX, on first use: `import dtypes` stays light

        offset = getattr(self.format, "top_exponent", 0)
        scales: jax.Array = widen(self.scale, self.tensor_scale, self.scaling, offset)
        return scales

    def decode(self, dtype: Any = np.float32) -> jax.Array:
        """Logical values (see `Format.decode`)."""
        return format_of(self).decode(self, dtype)

    def __repr__(self) -> str:
        scaling = f", scaling={self.scaling}" if self.scaling is not None else ""
        name = getattr(self.format, "name", self.format)
        try:
            held = f"shape={self.shape}, format={name}{scaling}, nbytes={self.nbytes}"
        except (AttributeError, TypeError, ValueError):  # hand-built, holding non-arrays
            held = f"data={type(self.data).__name__}, format={name!r:.60}{scaling}"
        return f"Encoded({held})"


@functools.lru_cache(maxsize=4096)
def _fitted(
    fmt: Format, scaling: Scaling | None, last: int | None, shape: Any, groups: Any
) -> Scaling | None:
    """`Encoded.fitted_scaling` of the arrays' shapes, worked out once per combination:
    an unflatten runs for every result of every jitted call."""
    if not isinstance(fmt, Format) or not isinstance(scaling, Scaling | None):
        raise PrecisionTypeError(
            f"Encoded.fitted_scaling takes a Format and a Scaling (or None), got "
            f"{type(fmt).__name__} and {type(scaling).__name__}"
        )
    if scaling is None or not isinstance(shape, tuple) or not isinstance(groups, tuple):
        return scaling
    if fmt.packed and shape:
        shape = shape[:-1] if last is None else (*shape[:-1], last)
    return scaling._refit(shape, groups)  # unchecked: an unflatten must never raise


def format_of(enc: Encoded) -> Format:
    """`enc.format`, or a `FormatTypeError` where a hand-built encoding holds no `Format`."""
    if not isinstance(enc.format, Format):
        raise FormatTypeError(
            f"an Encoded's format is a dtypes Format, got {type(enc.format).__name__} "
            f"{enc.format!r:.60}; pass e.g. dtypes.get('int8'), or build it with fmt.encode(x)"
        )
    return enc.format
