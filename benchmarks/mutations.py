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
    Mutation(
        "float16-truncates",
        "float16's bit rounding truncates instead of rounding to nearest-even",
        "dtypes/_rounding.py",
        "        add = jnp.where(dc > 0, half - U(1) + lsb, zero)\n",
        "        add = jnp.where(dc > 0, half - U(1) + lsb, zero)\n"
        "        add = zero if grid.mantissa_bits == 10 else add\n",
        ("tests/dtypes/test_float_rounding.py", "tests/dtypes/test_oracle_rounding.py"),
    ),
    Mutation(
        "int-codes-truncated",
        "integer codes round toward zero in nearest-even mode",
        "dtypes/_rounding.py",
        "        return jnp.round(y)  # jnp.round rounds halves to even\n",
        "        return jnp.trunc(y)\n",
        ("tests/dtypes/test_int_quantization.py",),
    ),
    Mutation(
        "fp8-not-saturated",
        "scaled float8 encodes skip the clip that saturates at the format's max",
        "dtypes/_float_codec.py",
        "from_float32(jnp.clip(y, -top, top), native)",
        "from_float32(y, native)",
        ("tests/dtypes/test_scaled_encodings.py", "tests/dtypes/test_mx_nvfp4.py"),
    ),
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
        "int-dot-drops-a-scale",
        "the exact integer dot forgets the right operand's scale",
        "precision/_compute/_contractions.py",
        "(acc.astype(jnp.float32) * sa * sb)",
        "(acc.astype(jnp.float32) * sa)",
        ("tests/precision/test_contract.py", "tests/precision/test_int_contraction_scalings.py"),
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


def run(m: Mutation, workers: str) -> tuple[bool, list[str], float]:
    """(caught, failing test ids, seconds) of one mutation."""
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        _copy(tmp)
        path = os.path.join(tmp, m.file)
        with open(path) as f:
            source = f.read()
        if source.count(m.old) != 1:
            raise SystemExit(f"{m.name}: the text to change is not found once in {m.file}")
        with open(path, "w") as f:
            f.write(source.replace(m.old, m.new))
        env = dict(os.environ, PYTHONPATH=tmp, PYTHONDONTWRITEBYTECODE="1")
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
        caught, failed, took = run(m, args.workers)
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
