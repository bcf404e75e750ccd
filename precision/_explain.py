"""`precision.explain`: what every contraction of `apply(f, ...)` does, before it runs.

The rules write down, for each `dot_general` and convolution, its operands'
storage and the path they take to the dot (`_compute/_notes.py`). The
compiled program is the truth about what XLA then emitted: each row's
operations carry a name scope into the optimized HLO, where the dot (or
convolution) found under it gives the operand and result types. A declared
narrow path that did not happen is the row's `fallback`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ._apply import apply
from ._compute._notes import SCOPE, Note, recording
from ._tensor import Tensor

__all__ = ["Explanation", "Row", "explain"]


@dataclasses.dataclass(frozen=True)
class Row:
    """One contraction: where it is, what reaches it and what XLA compiled.

    Attributes:
        where: the user's file, line and function.
        op: `dot_general` or `conv_general_dilated`.
        shapes: the operands' logical shapes; `out_shape` the result's.
        operands: each operand's storage (format, scaling) or compute format.
        stored_bytes: bytes each operand holds as stored (0 for a computed value).
        path: how the operands reach the dot, in words.
        compiled: the dots XLA emitted for it, as `operand x operand -> result`
            types (`s8[4,16] x s8[16,8] -> s32[4,8]`); empty if XLA folded it away.
        fallback: a declared narrow path that did not happen, and why; else None.
        flops: multiply-adds times two.
    """

    where: str
    op: str
    shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    operands: tuple[str, ...]
    stored_bytes: tuple[int, ...]
    path: str
    compiled: tuple[str, ...]
    fallback: str | None
    flops: int


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What `precision.apply(f, ...)` does with given arguments (`precision.explain`).

    `rows` holds one `Row` per contraction; `str()` is a table; `to_json()` the
    same as JSON. Parameter totals count the arguments: bytes held (Tensors:
    codes plus scales), and the same values as float32 and as bfloat16.
    """

    backend: str
    rows: tuple[Row, ...]
    held_bytes: int
    float32_bytes: int
    bfloat16_bytes: int

    @property
    def fallbacks(self) -> tuple[Row, ...]:
        """The rows whose declared narrow path did not happen."""
        return tuple(r for r in self.rows if r.fallback is not None)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def __str__(self) -> str:
        lines = [f"precision.explain on {self.backend}: {len(self.rows)} contraction(s)"]
        for i, r in enumerate(self.rows, 1):
            shapes = " x ".join(str(s) for s in r.shapes)
            lines.append(f"{i:>3}  {r.where}")
            lines.append(f"     {r.op} {shapes} -> {r.out_shape}, {r.flops:,} FLOPs")
            held = [
                f"{d} ({b:,} B)" if b else d
                for d, b in zip(r.operands, r.stored_bytes, strict=True)
            ]
            lines.append(f"     operands  {'; '.join(held)}")
            lines.append(f"     path      {r.path}")
            lines.append(f"     compiled  {'; '.join(r.compiled) or 'no dot left (folded by XLA)'}")
            if r.fallback is not None:
                lines.append(f"     FALLBACK  {r.fallback}")
        flops = sum(r.flops for r in self.rows)
        lines.append(
            f"parameters: {self.held_bytes:,} B held (as float32 {self.float32_bytes:,} B, "
            f"as bfloat16 {self.bfloat16_bytes:,} B); {flops:,} FLOPs in contractions"
        )
        if self.fallbacks:
            lines.append(f"{len(self.fallbacks)} declared narrow contraction(s) fell back")
        return "\n".join(lines)


def explain(
    f: Callable[..., Any],
    *args: Any,
    compute: Any = None,
    policy: Any = None,
    contract: Any = None,
    **kwargs: Any,
) -> Explanation:
    """What `precision.apply(f, compute=..., policy=..., contract=...)(*args, **kwargs)` does.

    `f` is traced and compiled for these arguments (nothing runs): each
    contraction becomes a `Row` with its source line, operands, the path the
    precision rules chose and the dot XLA compiled for it.

    Examples:
        >>> import jax.numpy as jnp, numpy as np, precision
        >>> w = precision.Tensor(np.ones((16, 8), np.float32)).to_reduced_precision("int8")
        >>> report = precision.explain(lambda x, w: x @ w, jnp.ones((4, 16)), w,
        ...                            contract="int8")
        >>> report.rows[0].compiled
        ('s8[4,16] x s8[16,8] -> s32[4,8]',)
    """
    run = apply(f, compute=compute, policy=policy, contract=contract)  # a fresh cache
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=_is_tensor)
    # arrays and Tensors are traced; anything else (an activation function, a flag) is
    # static, as `apply` and Equinox's filters treat them
    traced = [i for i, x in enumerate(leaves) if _is_tensor(x) or isinstance(x, _ARRAYS)]

    def program(*dynamic: Any) -> Any:
        given = list(leaves)
        for i, x in zip(traced, dynamic, strict=True):
            given[i] = x
        a, k = jax.tree_util.tree_unflatten(treedef, given)
        return run(*a, **k)

    with recording() as notes:
        lowered = jax.jit(program).lower(*(leaves[i] for i in traced))
    found = _dots(lowered.compile().as_text() or "")
    rows = tuple(_row(n, found.get(n.index, [])) for n in notes)
    held = f32 = bf16 = 0
    for leaf in leaves:
        if isinstance(leaf, Tensor):
            held += leaf.nbytes
            f32, bf16 = f32 + 4 * leaf.size, bf16 + 2 * leaf.size
        elif isinstance(leaf, _ARRAYS):
            size = math.prod(np.shape(leaf))
            held += size * np.dtype(leaf.dtype).itemsize
            floating = np.issubdtype(np.dtype(leaf.dtype), np.floating)
            f32 += size * (4 if floating else np.dtype(leaf.dtype).itemsize)
            bf16 += size * (2 if floating else np.dtype(leaf.dtype).itemsize)
    return Explanation(jax.default_backend(), rows, held, f32, bf16)


_ARRAYS = (jax.Array, np.ndarray)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _row(n: Note, compiled: list[str]) -> Row:
    return Row(
        n.where,
        n.op,
        n.shapes,
        n.out_shape,
        n.operands,
        n.stored_bytes,
        n.path,
        tuple(compiled),
        n.fallback,
        n.flops,
    )


_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w\-]+)\((.*)$")
_CONTRACTIONS = ("dot", "convolution")


def _dots(hlo: str) -> dict[int, list[str]]:
    """The dots and convolutions of optimized HLO text under each row's name scope:
    row index -> `operand x operand -> result` types (layouts dropped)."""
    out: dict[int, list[str]] = {}
    types: dict[str, str] = {}
    for line in hlo.splitlines():
        if _HEADER.match(line) and not line.startswith(" "):
            types = {}  # a new computation: its own instruction names
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, kind, opcode, rest = m.groups()
        kind = re.sub(r"\{[^}]*\}", "", kind)
        types[name] = kind
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        is_custom = opcode == "custom-call" and target is not None
        if opcode not in _CONTRACTIONS and not (
            is_custom and re.search(r"matmul|conv|gemm", target.group(1) if target else "")
        ):
            continue
        scope = re.search(rf"{SCOPE}(\d+)", rest)
        if scope is None:
            continue
        args = rest.split(")", 1)[0]
        operands = [types.get(a, "?") for a in re.findall(r"%([\w.\-]+)", args)]
        out.setdefault(int(scope.group(1)), []).append(f"{' x '.join(operands)} -> {kind}")
    return out
