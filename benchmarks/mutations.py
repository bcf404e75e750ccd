"""Break the library on purpose and see which tests notice: a mutation check.

Usage:
    python benchmarks/mutations.py                 # every mutation (tens of minutes)
    python benchmarks/mutations.py --only int-codes-truncated,add-not-rounded
    python benchmarks/mutations.py --list

Each mutation is one small change to the source (a rounding flipped to truncation,
a re-rounding dropped, a scale forgotten). For each, the checkout is copied to a
temporary folder (the working tree is never touched), the change is applied there,
and the tests that guard that code run against the copy (the committed tree:
`git archive HEAD`, so uncommitted work does not move the verdict). A mutation is *caught*
when at least one test fails; the report names the failing tests. A mutation no
test catches is a hole in the suite: the script exits 1.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Mutation(NamedTuple):
    name: str
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = (
    # -- a format's rounding flipped to truncation ----------------------------------------
    Mutation(
        "float16-truncates",
        "float16's bit rounding (dtypes) truncates instead of rounding to nearest-even",
        "dtypes/_bit_rounding.py",
        "    add = _increment(rounding, src, dc, low, half, lsb, negative, zero, bits)\n",
        "    add = _increment(rounding, src, dc, low, half, lsb, negative, zero, bits)\n"
        "    add = zero if (grid.mantissa_bits, grid.emin) == (10, -14) else add\n",
        (
            "tests/dtypes/test_float_rounding.py",
            "tests/dtypes/test_oracle_rounding.py",
            "tests/precision/test_mixing.py",
        ),
    ),
    Mutation(
        "int-codes-truncated",
        "integer codes round toward zero in nearest-even mode",
        "dtypes/_bit_rounding.py",
        "        return jnp.round(y)  # jnp.round rounds halves to even\n",
        "        return jnp.trunc(y)\n",
        ("tests/dtypes/test_int_quantization.py",),
    ),
    Mutation(
        "bfloat16-ops-truncate",
        "`apply` rounds op results onto bfloat16 and tf32 by truncation (reduce_precision)",
        "precision/_storage.py",
        "    return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=mantissa_bits)\n",
        "    low = jnp.uint32((1 << (23 - mantissa_bits)) - 1)\n"
        "    bits = jax.lax.bitcast_convert_type(x, jnp.uint32) & ~low\n"
        "    return jax.lax.bitcast_convert_type(bits, jnp.float32)\n",
        ("tests/precision/test_apply.py", "tests/precision/test_autodiff.py"),
    ),
    Mutation(
        "fp8-not-saturated",
        "scaled float8 encodes skip the clip that saturates at the format's max",
        "dtypes/_float_codec.py",
        "        if clipped:\n            y = jnp.clip(y, -top, top)\n",
        "        if clipped:\n            pass\n",
        ("tests/dtypes/test_scaled_encodings.py", "tests/dtypes/test_mx_nvfp4.py"),
    ),
    Mutation(
        "fp8-nan-codes-kept",
        "the CPU form of the scaled fp8 codes leaves e4m3fn's NaN code (0x7F) where +0 belongs",
        "dtypes/_float_codec.py",
        "special = (codes & jnp.uint8(0x7F)) >= jnp.uint8(above)",
        "special = (codes & jnp.uint8(0x7F)) > jnp.uint8(above)",
        ("tests/dtypes/test_backend_forms.py", "tests/dtypes/test_backend_bits.py"),
    ),
    # -- an op's re-rounding dropped -------------------------------------------------------
    Mutation(
        "add-not-rounded",
        "`apply`'s rule leaves the result of `add` off the compute format's grid",
        "precision/_compute/_rules.py",
        "            result.append((round_nearest(state.format, o), state))\n",
        "            kept = o if op == 'add' else round_nearest(state.format, o)\n"
        "            result.append((kept, state))\n",
        ("tests/precision/test_apply.py", "tests/precision/test_compute_rules.py"),
    ),
    Mutation(
        "dot-not-rounded",
        "a float contraction's float32 sums are not rounded onto the compute format",
        "precision/_compute/_contractions.py",
        "        return rounded_outputs(op, [out], state)\n",
        "        return [(out, state)]\n",
        ("tests/precision/test_apply.py",),
    ),
    Mutation(
        "reduce-sum-not-rounded",
        "`reduce_sum` keeps its float32 sum, as if it only moved elements",
        "precision/_compute/_rules.py",
        "        elif op in MOVES or (op in GRID_PRESERVING",
        "        elif op in MOVES or op == 'reduce_sum' or (op in GRID_PRESERVING",
        ("tests/precision/test_autodiff.py", "tests/precision/test_apply.py"),
    ),
    Mutation(
        "inputs-not-brought-to-format",
        "decoded storage and raw values meet a compute format unrounded (declared compute)",
        "precision/_compute/_rules.py",
        "            out.append(round_nearest(fmt, jnp.asarray(v)))\n",
        "            out.append(jnp.asarray(v))\n",
        ("tests/precision/test_mixing.py",),
    ),
    Mutation(
        "int-dot-drops-a-scale",
        "the exact integer dot forgets the right operand's scale",
        "precision/_compute/_contractions.py",
        "(acc.astype(jnp.float32) * sa * sb)",
        "(acc.astype(jnp.float32) * sa)",
        ("tests/precision/test_contract.py", "tests/precision/test_int_contraction_scalings.py"),
    ),
    # -- refusals, the command line --------------------------------------------------------
    Mutation(
        "non-finite-accepted",
        "eager encodes into scaled formats take NaN and inf (check and encode alike)",
        "dtypes/_argument_checks.py",
        "    if np.isfinite(values).all():\n        return\n",
        "    return\n",
        ("tests/dtypes/test_check.py",),
    ),
    Mutation(
        "nvfp4-subnormal-scales-floored",
        "NVFP4's e4m3 block scales below e4m3's normals are floored, not rounded",
        "dtypes/_scale_storage.py",
        "    k = jnp.round(q * np.float32(2.0**9))\n",
        "    k = jnp.floor(q * np.float32(2.0**9))\n",
        ("tests/dtypes/test_mx_nvfp4.py",),
    ),
    Mutation(
        "nvfp4-reciprocal-table-shifted",
        "NVFP4's table of block reciprocals divides by the next mantissa's value",
        "dtypes/_scale_storage.py",
        "np.arange(8, 16, dtype=np.float32)",
        "np.arange(9, 17, dtype=np.float32)",
        ("tests/dtypes/test_backend_forms.py", "tests/dtypes/test_mx_nvfp4.py"),
    ),
    Mutation(
        "block-absmax-takes-the-min",
        "the block absmax's select keeps the smaller value",
        "dtypes/_per_group.py",
        "    return jnp.where(a > b, a, b)\n",
        "    return jnp.where(a > b, b, a)\n",
        ("tests/dtypes/test_backend_forms.py", "tests/dtypes/test_group_reductions.py"),
    ),
    Mutation(
        "float16-cotangent-unrounded",
        "a float16 contraction's cotangent and gradients are not rounded to float16",
        "precision/_compute/_contractions.py",
        "        rounded = _transposed_as_itself(fmt.round, t)\n",
        "        rounded = t\n",
        (
            "tests/precision/test_compute_rules.py"
            "::test_narrow_contraction_gradients_are_those_of_the_formats_dot",
        ),
    ),
    Mutation(
        "int2-prescale-read-late",
        "int2's prescale, read from the scale, starts at 2**120 instead of 2**100",
        "dtypes/_scale_rules.py",
        "        big = scale > np.float32(2.0**100)",
        "        big = scale > np.float32(2.0**120)",
        (
            "tests/dtypes/test_int_quantization.py"
            "::test_int2_codes_of_groups_near_float32s_top_match_numpy",
        ),
    ),
    Mutation(
        "gptq-clip-unweighted",
        "GPTQ's clip search weighs every weight's error alike, not by its input's energy",
        "precision/_calibrate/_gptq.py",
        "            now = [(err * err) @ energy, stored, unit, zero]",
        "            now = [(err * err).sum(axis=1), stored, unit, zero]",
        (
            "tests/precision/test_calibrate.py"
            "::test_gptq_on_one_layer_equals_the_published_algorithm_code_for_code",
        ),
    ),
    Mutation(
        "awq-gptq-unscaled-hessian",
        "a scaled weight is rounded against the Hessian of x, not of the x / s it meets",
        "precision/_calibrate/_weight_conversion.py",
        'h = np.asarray(site.stats["h"], np.float64) / np.outer(scale, scale)',
        'h = np.asarray(site.stats["h"], np.float64)',
        (
            "tests/precision/test_calibrate.py"
            "::test_awq_gptq_rounds_the_scaled_weight_by_gptq_against_the_scaled_inputs",
        ),
    ),
    Mutation(
        "per-group-values-fused",
        "per-group scales and reciprocals are left for XLA:CPU to fuse into every element",
        "dtypes/_per_group.py",
        "    return computed_once(make, *inputs)\n\n\ndef computed_once",
        "    return make(*inputs)\n\n\ndef computed_once",
        (
            "tests/dtypes/test_group_reductions.py"
            "::test_the_elementwise_pass_reads_per_group_values_made_once",
        ),
    ),
    Mutation(
        "absmax-finished-apart",
        "the staged absmax is finished in kernels of its own, outside the scales' conditional",
        "dtypes/_per_group.py",
        "        return computed_once(made, computed_once(stages, x))\n",
        "        done = _materialized(computed_once(stages, x))\n"
        "        return per_group(make, _absmax_of(_max_bits_cpu(done, rest).reshape(shape)))\n",
        (
            "tests/dtypes/test_group_reductions.py"
            "::test_the_stages_read_an_activation_once_and_the_scales_their_result",
        ),
    ),
    Mutation(
        "absmax-stages-fused",
        "the absmax's stages read the array where XLA:CPU fuses its making into them",
        "dtypes/_per_group.py",
        "        return computed_once(made, computed_once(stages, x))\n",
        "        return computed_once(made, stages(x))\n",
        (
            "tests/dtypes/test_group_reductions.py"
            "::test_the_stages_read_an_activation_once_and_the_scales_their_result",
        ),
    ),
    Mutation(
        "forward-quantizes-fused",
        "a contraction's forward quantizes an operand where XLA:CPU fuses its making twice",
        "precision/_compute/_quantized.py",
        "        if once and codes is None and own is None:",
        "        if False:",
        ("tests/precision/test_contract.py::test_a_forward_makes_a_computed_activation_once",),
    ),
    Mutation(
        "plot-best-first",
        "`report --plot` draws the best SQNR on top instead of the worst",
        "precision/_cli/_report.py",
        'worst = sorted(changed, key=lambda r: r["sqnr_db"])',
        'worst = sorted(changed, key=lambda r: -r["sqnr_db"])',
        ("tests/precision/test_cli.py::test_report_table_and_plot",),
    ),
    Mutation(
        "interrupt-exits-0",
        "Ctrl-C stops `convert` with its message but exit status 0",
        "precision/_cli/_main.py",
        "            os._exit(130)\n",
        "            os._exit(0)\n",
        (
            "tests/precision/test_cli_interrupt.py"
            "::test_sigint_in_the_first_half_second_never_prints_our_traceback",
        ),
    ),
)


def _copy(dst: str) -> None:
    """The committed tree (`git archive HEAD`), else the folder's sources as they are."""
    if os.path.isdir(os.path.join(ROOT, ".git")):
        archive = subprocess.run(
            ["git", "-C", ROOT, "archive", "HEAD"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", dst], input=archive, check=True)
        return
    for name in ("dtypes", "precision", "tests", "docs", "examples", "benchmarks"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(dst, name), dirs_exist_ok=True)
    for name in os.listdir(ROOT):
        if name.endswith((".py", ".toml", ".md", ".yml")):
            shutil.copy2(os.path.join(ROOT, name), dst)


class StaleMutation(Exception):
    """The code a mutation changes has moved: update the mutation, it tested nothing."""


def run(m: Mutation, workers: str) -> tuple[bool, list[str], float]:
    """(caught, failing test ids, seconds) of one mutation."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        _copy(tmp)
        path = os.path.join(tmp, m.file)
        with open(path) as f:
            source = f.read()
        if source.count(m.old) != 1:
            raise StaleMutation(f"the text to change is not found once in {m.file}")
        with open(path, "w") as f:
            f.write(source.replace(m.old, m.new))
        # Bytecode is written into the copy (deleted afterwards): without it every command
        # a CLI test starts compiles the package again, which widens the moments before
        # the entry point's first line that the interrupt tests measure.
        env = dict(os.environ, PYTHONPATH=tmp)
        cmd = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
               "--maxfail=25", "-n", workers, *m.tests]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - start
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
    if proc.returncode not in (0, 1):  # collection errors, usage errors
        failed = failed or [f"(pytest exit {proc.returncode}: {proc.stdout.strip()[-200:]})"]
    return bool(failed), failed, took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument("--list", action="store_true", help="print the mutations and stop")
    parser.add_argument("--workers", default="0", help="pytest-xdist workers (default: none)")
    args = parser.parse_args(argv)
    chosen = MUTATIONS
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {m.name for m in MUTATIONS})
        if unknown:
            parser.error(f"unknown mutation(s) {unknown}; --list shows them")
        chosen = tuple(m for m in MUTATIONS if m.name in names)
    if args.list:
        for m in chosen:
            print(f"{m.name:24} {m.what}\n{'':24} tests: {' '.join(m.tests)}")
        return 0
    survived = 0
    for m in chosen:
        try:
            caught, failed, took = run(m, args.workers)
        except StaleMutation as exc:  # the others still run; the exit status says 1
            survived += 1
            print(f"{m.name}: NOT APPLIED, {exc} — {m.what}", flush=True)
            continue
        survived += not caught
        verdict = f"caught by {len(failed)} test(s)" if caught else "SURVIVED (no test failed)"
        print(f"{m.name}: {verdict} in {took:.0f} s — {m.what}", flush=True)
        for test in failed[:8]:
            print(f"    {test}")
        if len(failed) > 8:
            print(f"    ... and {len(failed) - 8} more")
    print(f"\n{len(chosen) - survived} of {len(chosen)} mutations caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
