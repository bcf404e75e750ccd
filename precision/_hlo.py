"""The contractions of a compiled program, read from its optimized HLO text.

The optimized HLO is the truth about which dot XLA chose: its operand and
result types, how much it computes and how many bytes it touches. `explain`
reads it to name each row's compiled dot and to predict time
(`_roofline.py`). Only text is parsed; nothing here runs.
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = ["Dot", "dots", "kernels", "output_bytes"]

#: Bytes per element of HLO element types (s4/u4: half a byte).
_BYTES = {
    "pred": 1.0,
    "s2": 0.25,
    "u2": 0.25,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1.0,
    "u8": 1.0,
    "s16": 2.0,
    "u16": 2.0,
    "s32": 4.0,
    "u32": 4.0,
    "s64": 8.0,
    "u64": 8.0,
    "bf16": 2.0,
    "f16": 2.0,
    "f32": 4.0,
    "f64": 8.0,
}


@dataclasses.dataclass(frozen=True)
class Dot:
    """One dot or convolution XLA emitted.

    Attributes:
        scope: the `explain` row it belongs to (its name scope), or None.
        text: `operand x operand -> result` types, layouts dropped.
        operand_types: the operands' element types (`s8`, `bf16`, `f8e4m3fn`, ...).
        flops: two per multiply-add.
        bytes: bytes of the operands read and the result written.
        m, n, k: rows, columns and summed length of one product of the batch (a
            convolution as the product it computes: batch x output positions,
            output features, input features x window).
        batch: how many such products (a dot's batch dimensions).
        convolution: whether XLA runs it as a convolution.
        out_elements: how many values the result holds.
        times: how many times one call of the program runs it (a dot in the body of
            a loop of known trip count runs once per iteration); `flops` and `bytes`
            count every run.

    """

    scope: int | None
    text: str
    operand_types: tuple[str, ...]
    flops: int
    bytes: int
    m: int
    n: int
    k: int
    batch: int = 1
    convolution: bool = False
    out_elements: int = 0
    times: int = 1


_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w\-]+)\((.*)$")
_TYPE = re.compile(r"^([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]")
_GEMM = re.compile(r"matmul|conv|gemm", re.IGNORECASE)


def dots(hlo: str, scope_prefix: str | None = None) -> list[Dot]:
    """Every dot and convolution (or library GEMM call) of optimized HLO text.

    `scope_prefix` (`precision_explain_`): the number after it in an
    instruction's metadata is its `Dot.scope`.
    """
    out: list[Dot] = []
    types: dict[str, str] = {}
    times = _runs_per_call(hlo)
    here = 1
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            types = {}  # a new computation: its own instruction names
            here = times.get(header[1], 1)
            continue
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, kind, opcode, rest = m.groups()
        kind = re.sub(r"\{[^}]*\}", "", kind)
        types[name] = kind
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        library = opcode == "custom-call" and target is not None and _GEMM.search(target[1])
        if opcode not in ("dot", "convolution") and not library:
            continue
        args = rest.split(")", 1)[0]
        operands = [types.get(a, "?") for a in re.findall(r"%([\w.\-]+)", args)][:2]
        scope = None
        if scope_prefix is not None:
            found = re.search(rf"{scope_prefix}(\d+)", rest)
            scope = int(found[1]) if found else None
        dot = _dot(scope, operands, kind, opcode, rest)
        if here != 1:
            dot = dataclasses.replace(
                dot, flops=dot.flops * here, bytes=dot.bytes * here, times=here
            )
        out.append(dot)
    return out


_CALLEE = re.compile(
    r"\b(body|condition|calls|to_apply|branch_computations)=\{?([^,}\s]+(?:, ?%[\w.\-]+)*)"
)
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _runs_per_call(hlo: str) -> dict[str, int]:
    """How many times one call of the program runs each computation: a loop body of
    known trip count `n` runs `n` times per run of its caller (`scan` compiles to
    such a loop), everything else once per run of its caller."""
    calls: dict[str, list[tuple[str, int]]] = {}
    entry, current = None, None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = header[1]
            if line.startswith("ENTRY"):
                entry = current
            continue
        if current is None or "=" not in line:
            continue
        trips = _TRIPS.search(line)
        for key, names in _CALLEE.findall(line):
            n = int(trips[1]) if key == "body" and trips else 1
            for name in re.findall(r"%?([\w.\-]+)", names):
                calls.setdefault(current, []).append((name, n))
    runs: dict[str, int] = {}

    def visit(name: str, count: int, depth: int) -> None:
        if depth > 64:
            return  # (a malformed text: no computation nests this deep)
        runs[name] = runs.get(name, 0) + count
        for callee, n in calls.get(name, []):
            visit(callee, count * n, depth + 1)

    if entry is not None:
        visit(entry, 1, 0)
    return runs


#: Instructions of the entry computation that launch no work of their own.
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all"}


def kernels(hlo: str) -> int:
    """How many operations the entry computation launches (fusions, dots, library
    calls, copies...): each costs a fixed time however small. A loop counts once."""
    count, inside = 0, False
    for line in hlo.splitlines():
        if line.startswith("ENTRY"):
            inside = True
            continue
        if inside:
            if line.startswith("}"):
                break
            m = _INSTRUCTION.match(line)
            if m is not None and m[3] not in _FREE:
                count += 1
    return count


def output_bytes(hlo: str) -> int:
    """Bytes of the program's results: fresh memory every call."""
    for line in hlo.splitlines():
        if line.startswith("ENTRY"):
            results = line.split("->", 1)[1] if "->" in line else ""
            return sum(_nbytes(f"{t}[{d}]") for t, d in re.findall(r"(\w+)\[([\d,]*)\]", results))
    return 0


def _shape(kind: str) -> tuple[str, tuple[int, ...]] | None:
    """(element type, dims) of an HLO array type; None for tuples and unknowns."""
    m = _TYPE.match(kind)
    if m is None:
        return None
    return m[1], tuple(int(d) for d in m[2].split(",") if d)


def _nbytes(kind: str) -> int:
    parsed = _shape(kind)
    if parsed is None:  # a library call's result tuple: its first array
        inner = re.search(r"\(([^,)]+)", kind)
        parsed = _shape(inner[1]) if inner else None
    if parsed is None:
        return 0
    element, dims = parsed
    size = _BYTES.get(element, 1.0 if element.startswith("f8") else 4.0)
    return math.ceil(size * math.prod(dims))


def _size(kind: str) -> int:
    parsed = _shape(kind)
    return 0 if parsed is None else math.prod(parsed[1])


def _dims(rest: str, key: str) -> tuple[int, ...]:
    m = re.search(rf"{key}=\{{([\d,]*)\}}", rest)
    return tuple(int(d) for d in m[1].split(",") if d) if m else ()


def _dot(scope: int | None, operands: list[str], result: str, opcode: str, rest: str) -> Dot:
    text = f"{' x '.join(operands)} -> {result}"
    element_types = tuple((_shape(t) or ("?", ()))[0] for t in operands)
    moved = sum(_nbytes(t) for t in operands) + _nbytes(result)
    shapes = [_shape(t) for t in operands]
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
        return Dot(scope, text, element_types, 0, moved, 0, 0, 0)
    lhs, rhs = shapes[0][1], shapes[1][1]
    if opcode == "convolution":
        m, n, k = _conv_mnk(rhs, result, rest)
        flops = 2 * m * n * k
        return Dot(scope, text, element_types, flops, moved, m, n, k, 1, True, _size(result))
    m, n, k = _dot_mnk(lhs, rhs, rest)
    batch = math.prod(lhs[d] for d in _dims(rest, "lhs_batch_dims"))
    flops = 2 * batch * m * n * k
    return Dot(scope, text, element_types, flops, moved, m, n, k, batch, False, _size(result))


def _dot_mnk(lhs: tuple[int, ...], rhs: tuple[int, ...], rest: str) -> tuple[int, int, int]:
    lc, lb = _dims(rest, "lhs_contracting_dims"), _dims(rest, "lhs_batch_dims")
    rc, rb = _dims(rest, "rhs_contracting_dims"), _dims(rest, "rhs_batch_dims")
    k = math.prod(lhs[d] for d in lc)
    m = math.prod(s for d, s in enumerate(lhs) if d not in lc and d not in lb)
    n = math.prod(s for d, s in enumerate(rhs) if d not in rc and d not in rb)
    return m, n, k


def _conv_mnk(rhs: tuple[int, ...], result: str, rest: str) -> tuple[int, int, int]:
    """A convolution as a product: (batch x output positions, output features,
    input features per group x window); the kernel's shape already holds the
    input features of one group."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", rest)
    out = _shape(result)
    if labels is None or out is None:
        return 0, 0, 0
    kernel, out_labels = labels[2], labels[3]
    n = out[1][out_labels.index("f")]
    return math.prod(out[1]) // max(n, 1), n, math.prod(rhs) // max(rhs[kernel.index("o")], 1)
