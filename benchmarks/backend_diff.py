"""Where an accelerator and the host CPU disagree, element by element.

    python benchmarks/backend_diff.py OUT_DIR [--quick] [--parts 1234]

`tests/dtypes/backend_bits.py` says *which* cases differ between two backends;
this script says *where*, so a difference can be understood and then pinned by
a test that runs on a CPU:

1. asymmetric codes (`uint4`, `uint8`) under every scaling and a narrow scale
   format: codes, scales, zero points and decoded values on the accelerator
   and on the host CPU, and the accelerator's decode of the CPU's encoding;
   the first differing elements, as bits;
2. integer contractions: plain JAX `s8 x s8 -> s32` `dot_general`s against
   int64 sums (contracted lengths that are and are not multiples of 4, batched
   or not, either layout), and the library's W8A8 contraction of an attention
   `p @ v` with 7 summed elements, with its padding of the codes and without;
3. the optimized programs of the encodes the speed rows name (written to
   OUT_DIR), with the number of fusions each runs;
4. where an encode's time goes: its steps timed alone, as ratios to a
   bfloat16 cast.

Run it on the accelerator machine with the checkout on PYTHONPATH. On a CPU it
compares the CPU with itself (every count is zero): `--quick` checks the script.
Found this way on an H100 (jax 0.11.2): bfloat16/float16 NaN scales written
0x7FFF (now written as bits); the `s8` GEMM's doubled sums for contracted
lengths that are not a multiple of 4 (now padded, `_compute/_int_operands`).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import dtypes
import precision

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "dtypes"))
from backend_bits import adversarial


def _bits(a: Any) -> np.ndarray:
    """An array's bit patterns (floats as unsigned integers of their width)."""
    arr = np.asarray(a)
    if arr.dtype.kind in "iub":
        return arr
    return arr.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[arr.dtype.itemsize])


def _encode_everything(fmt: Any, scaling: Any, mode: str, x: Any) -> dict[str, Any]:
    enc = jax.jit(lambda v: fmt.encode(v, scaling=scaling, rounding=mode))(x)
    return {
        "enc": enc,
        "data": enc.data,
        "scale": enc.scale,
        "zero_point": enc.zero_point,
        "decoded": jax.jit(lambda e: e.decode())(enc),
        "rounded": jax.jit(lambda v: fmt.round(v, scaling=scaling, rounding=mode))(x),
    }


def _asymmetric(out: pathlib.Path, size: int, accel: Any, cpu: Any) -> list[str]:
    lines = ["## 1. asymmetric codes, accelerator vs host CPU\n"]
    x = adversarial(size)
    scalings = [
        dtypes.PerTensor(),
        dtypes.PerAxis(0),
        dtypes.PerBlock(32),
        dtypes.PerAxis(0, scale_format="bfloat16"),
        dtypes.PerBlock(32, scale_format="float16"),
    ]
    cases = [("uint4", scalings, ("toward_zero", "down")), ("uint8", scalings[1:3], ("down",))]
    for name, chosen, modes in cases:
        fmt = dtypes.get(name)
        for scaling in chosen:
            for mode in modes:
                acc = _encode_everything(fmt, scaling, mode, jax.device_put(x, accel))
                ref = _encode_everything(fmt, scaling, mode, jax.device_put(x, cpu))
                # the accelerator decoding the CPU's encoding: tells decode from encode
                cross = jax.jit(lambda e: e.decode())(jax.device_put(ref["enc"], accel))
                crossed = int(np.sum(_bits(cross) != _bits(ref["decoded"])))
                diffs = {}
                for key in ("data", "scale", "zero_point", "decoded", "rounded"):
                    if acc[key] is not None:
                        d = _bits(acc[key]) != _bits(ref[key])
                        if d.any():
                            diffs[key] = d
                summary = ", ".join(f"{k} {int(d.sum())}" for k, d in diffs.items())
                lines.append(
                    f"- {name} {scaling} {mode}: {summary or 'identical'}; the accelerator's "
                    f"decode of the CPU's codes differs in {crossed}"
                )
                for key, d in list(diffs.items())[:3]:
                    for idx in np.argwhere(d)[:3]:
                        i = tuple(int(j) for j in idx)
                        got, want = _bits(acc[key])[i], _bits(ref[key])[i]
                        lines.append(f"    {key}{list(i)}: {hex(int(got))} here, {hex(int(want))}")
                        if np.shape(acc[key]) == x.shape:
                            xi = np.float32(x[i])
                            lines.append(
                                f"      x = {float(xi)!r} ({hex(int(xi.view(np.uint32)))})"
                            )
    (out / "asymmetric.txt").write_text("\n".join(lines) + "\n")
    return lines


def _int8_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row int8 codes and float32 scales, as `dtypes.int8` with `PerAxis(0)`."""
    enc = dtypes.int8.encode(jnp.asarray(x, jnp.float32), scaling=dtypes.PerAxis(0))
    return np.asarray(enc.data).astype(np.int64), np.asarray(enc.scale, np.float32)


def _raw_dot(dims: Any) -> Callable[..., jax.Array]:
    return jax.jit(lambda p, q: lax.dot_general(p, q, dims, preferred_element_type=jnp.int32))


def _contractions(out: pathlib.Path) -> list[str]:
    from precision._compute import _int_operands

    lines = ["\n## 2. integer contractions vs int64 sums\n"]
    rng = np.random.default_rng(5)
    for k in (7, 8, 16, 30):
        for rhs_k_last in (False, True):
            for batch in ((2,), ()):
                nb = len(batch)
                a = rng.integers(-127, 128, (*batch, 6, k)).astype(np.int8)
                shape = (*batch, 8, k) if rhs_k_last else (*batch, k, 8)
                w = rng.integers(-127, 128, shape).astype(np.int8)
                rc = nb + 1 if rhs_k_last else nb
                dims = (((nb + 1,), (rc,)), (tuple(range(nb)),) * 2)
                spec = "mk," + ("nk" if rhs_k_last else "kn") + "->mn"
                spec = "b" + spec.replace(",", ",b").replace(">", ">b") if nb else spec
                want = np.einsum(spec, a.astype(np.int64), w.astype(np.int64))
                padded = jax.jit(
                    lambda p, q, dims=dims: lax.dot_general(
                        *_int_operands.dot_operands(p, q, dims),
                        dims,
                        preferred_element_type=jnp.int32,
                    )
                )
                verdict = []
                for name, fn in (("plain", _raw_dot(dims)), ("padded", padded)):
                    got = np.asarray(fn(a, w)).astype(np.int64)
                    if np.array_equal(got, want):
                        verdict.append(f"{name} exact")
                        continue
                    nz = want != 0
                    verdict.append(
                        f"{name} WRONG (median ratio {np.median(got[nz] / want[nz]):.3g})"
                    )
                    tag = f"k{k}_{'nk' if rhs_k_last else 'kn'}_{'batched' if nb else 'plain'}"
                    (out / f"s8_dot_{tag}.hlo.txt").write_text(fn.lower(a, w).compile().as_text())
                layout = "(n, k)" if rhs_k_last else "(k, n)"
                lines.append(
                    f"- K={k}, rhs {layout}, {'batched' if nb else 'unbatched'}: "
                    + "; ".join(verdict)
                )

    # the library's W8A8 attention p @ v (7 summed elements), with and without padding
    p = np.abs(rng.standard_normal((2, 6, 7))).astype(np.float32)
    v = rng.standard_normal((2, 7, 8)).astype(np.float32)
    cp, sp = _int8_rows(p.reshape(12, 7))
    cv, sv = _int8_rows(v.transpose(0, 2, 1).reshape(16, 7))
    acc = np.einsum("bqk,bdk->bqd", cp.reshape(2, 6, 7), cv.reshape(2, 8, 7))
    ref = (acc.astype(np.float32) * sp.reshape(2, 6, 1)) * sv.reshape(2, 1, 8)
    original = _int_operands.dot_operands
    for padding in (True, False):
        if not padding:
            _int_operands.dot_operands = lambda a, b, dims: (a, b)  # type: ignore[assignment]
        try:
            f = jax.jit(
                precision.apply(lambda p, v: jnp.einsum("bqk,bkd->bqd", p, v), contract="int8")
            )
            got = np.asarray(f(p, v))
        finally:
            _int_operands.dot_operands = original
        lines.append(
            f"- W8A8 p @ v, 7 summed, {'padded' if padding else 'not padded'}: exact "
            f"{np.array_equal(got, ref)}, median ratio to the reference {np.median(got / ref):.4g}"
        )
    (out / "contractions.txt").write_text("\n".join(lines) + "\n")
    return lines


def _fusions(text: str) -> int:
    entry = text[text.index("ENTRY") :]
    return len(re.findall(r"\b(?:fusion|custom-call)\(", entry))


def _encodes(out: pathlib.Path, n: int) -> list[str]:
    lines = ["\n## 3. encode programs\n"]
    x = jnp.asarray(np.random.default_rng(1).standard_normal(n, np.float32))
    cases: dict[str, Callable[[Any], Any]] = {
        "astype_bfloat16": lambda v: v.astype(jnp.bfloat16),
        "int8_per_tensor": lambda v: dtypes.int8.encode(v),
        "float6_e3m2fn": lambda v: dtypes.get("float6_e3m2fn").encode(v),
        "float4_e2m1fn": lambda v: dtypes.get("float4_e2m1fn").encode(v),
    }
    for name, fn in cases.items():
        text = jax.jit(fn).lower(x).compile().as_text()
        (out / f"encode_{name}.hlo.txt").write_text(text)
        lines.append(f"- {name}: {_fusions(text)} fusions in the entry computation")
    return lines


def _time(fn: Callable[..., Any], *args: Any) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(5):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / 5)
    return best


def _steps(n: int) -> list[str]:
    from dtypes import _custom_float_bits, _packing, _per_group

    lines = [f"\n## 4. encode steps, {n:,} values, time / astype(bfloat16)\n"]
    x = jnp.asarray(np.random.default_rng(1).standard_normal(n, np.float32))
    fp4, fp6 = dtypes.get("float4_e2m1fn"), dtypes.get("float6_e3m2fn")
    codes4 = jax.jit(lambda v: _custom_float_bits.nearest_codes(fp4, v))(x)
    magnitude = jnp.uint32(0x7FFFFFFF)
    steps: dict[str, tuple[Callable[..., Any], Any]] = {
        "astype(bfloat16)": (lambda v: v.astype(jnp.bfloat16), x),
        "read once: sum": (jnp.sum, x),
        "float max + any(~isfinite)": (
            lambda v: (jnp.max(jnp.abs(v)), jnp.any(~jnp.isfinite(v))),
            x,
        ),
        "integer max of magnitude bits": (
            lambda v: jnp.max(lax.bitcast_convert_type(v, jnp.uint32) & magnitude),
            x,
        ),
        "group_absmax per tensor": (
            lambda v: _per_group.group_absmax(v, dtypes.PerTensor()),
            x,
        ),
        "textbook int8: round(x * c) to s8": (
            lambda v: jnp.clip(jnp.round(v * jnp.float32(0.37)), -127, 127).astype(jnp.int8),
            x,
        ),
        "int8 per tensor encode (jit)": (lambda v: dtypes.int8.encode(v), x),
        "fp4 codes (unpacked)": (lambda v: _custom_float_bits.nearest_codes(fp4, v), x),
        "fp4 pack of codes": (lambda c: _packing.pack(c, 4), codes4),
        "fp4 encode (jit)": (lambda v: fp4.encode(v), x),
        "fp6 encode (jit)": (lambda v: fp6.encode(v), x),
    }
    base = None
    for name, (fn, arg) in steps.items():
        t = _time(jax.jit(fn), arg)
        base = base or t
        lines.append(f"- {name}: {t * 1e3:.3f} ms, {t / base:.2f}")
    for name, fmt in (("int8 per tensor", dtypes.int8), ("fp4", fp4), ("fp6", fp6)):
        t = _time(fmt.encode, x)  # as a user calls it: its eager checks included
        assert base is not None
        lines.append(f"- {name} encode (eager): {t * 1e3:.3f} ms, {t / base:.2f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script")
    parser.add_argument("--parts", default="1234", help="which parts to run (e.g. 2)")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    accel, cpu = jax.devices()[0], jax.devices("cpu")[0]
    size = 65536 if args.quick else 1 << 20
    print(f"accelerator {accel.platform} ({accel.device_kind}), jax {jax.__version__}")
    parts: dict[str, Callable[[], list[str]]] = {
        "1": lambda: _asymmetric(out, size, accel, cpu),
        "2": lambda: _contractions(out),
        "3": lambda: _encodes(out, 1 << (20 if args.quick else 26)),
        "4": lambda: _steps(1 << (20 if args.quick else 28)),
    }
    for key, part in parts.items():
        if key not in args.parts:
            continue
        try:
            print("\n".join(part()), flush=True)
        except Exception as err:  # one part failing must not hide the others
            print(f"part {key} failed: {type(err).__name__}: {err}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
