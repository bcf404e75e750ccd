"""`import dtypes` and describing formats load no JAX; the first encode does.

Each check runs in a fresh interpreter (this one has JAX loaded already).
The command line relies on it: `precision convert --to bf16` is a numpy and
ml_dtypes cast, and importing JAX would be a third of its run time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np

import dtypes


def _run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _third_party(before: set[str], after: set[str]) -> set[str]:
    tops = {m.split(".")[0] for m in after - before}
    return {m for m in tops if m not in sys.stdlib_module_names and not m.startswith("_")}


def test_import_dtypes_alone_loads_only_numpy_and_ml_dtypes():
    out = _run(
        """
        import json, sys
        before = set(sys.modules)
        import dtypes
        print(json.dumps(sorted(set(sys.modules) - before)))
        """
    )
    assert _third_party(set(), set(out)) <= {"dtypes", "numpy", "ml_dtypes"}, out
    assert not [m for m in out if m.split(".")[0] in ("jax", "jaxlib")]


def test_describing_formats_loads_no_jax():
    out = _run(
        """
        import json, sys
        before = set(sys.modules)
        import dtypes
        f = dtypes.get("bf16")
        described = [f.name, f.bits, str(f.container), str(f.native_dtype), f.max, f.kind]
        tables = [len(dtypes.FORMATS), len(dtypes.ALIASES), len(dtypes.ENCODINGS)]
        scalings = [str(dtypes.PerBlock(32)), str(dtypes.PerAxis(0)), list(dtypes.SCALE_FORMATS)]
        dtypes.check_rounding("nearest_even", None)
        more = [dtypes.get("nf4").bits, dtypes.get("uint4").nbytes((3, 5)),
                dtypes.get("mxfp4").nbytes((2, 64)), dtypes.int4.data_shape((3, 5)),
                str(dtypes.float16.result_dtype("float32")), dtypes.get("e8m0").max,
                dtypes.ROUNDING_MODES[0], str(dtypes.get("float6_e3m2fn_sat"))]
        print(json.dumps({
            "described": described, "tables": tables, "scalings": scalings, "more": more,
            "new": sorted(set(sys.modules) - before),
        }))
        """
    )
    assert not [m for m in out["new"] if m.split(".")[0] in ("jax", "jaxlib")], out["new"]
    assert _third_party(set(), set(out["new"])) <= {"dtypes", "numpy", "ml_dtypes"}
    # the same answers as in this process (where everything is loaded)
    f = dtypes.get("bf16")
    assert out["described"] == [
        f.name,
        f.bits,
        str(f.container),
        str(f.native_dtype),
        f.max,
        f.kind,
    ]
    assert out["tables"] == [len(dtypes.FORMATS), len(dtypes.ALIASES), len(dtypes.ENCODINGS)]
    assert out["scalings"] == [
        str(dtypes.PerBlock(32)),
        str(dtypes.PerAxis(0)),
        list(dtypes.SCALE_FORMATS),
    ]
    assert out["more"] == [
        dtypes.get("nf4").bits,
        dtypes.get("uint4").nbytes((3, 5)),
        dtypes.get("mxfp4").nbytes((2, 64)),
        list(dtypes.int4.data_shape((3, 5))),
        str(dtypes.float16.result_dtype("float32")),
        dtypes.get("e8m0").max,
        dtypes.ROUNDING_MODES[0],
        str(dtypes.get("float6_e3m2fn_sat")),
    ]


def test_first_encode_loads_jax_and_every_public_name_resolves():
    out = _run(
        """
        import json, sys
        import numpy as np
        import dtypes
        before = "jax" in sys.modules
        enc = dtypes.int4.encode(np.array([1.0, -2.0, 3.0], np.float32))
        after = "jax" in sys.modules
        missing = [n for n in dtypes.__all__ if not hasattr(dtypes, n)]
        unlisted = [n for n in dtypes.__all__ if n not in dir(dtypes)]
        print(json.dumps({"before": before, "after": after, "missing": missing,
                          "unlisted": unlisted, "decoded": enc.decode().tolist()}))
        """
    )
    assert (out["before"], out["after"]) == (False, True)
    assert out["missing"] == []
    assert out["unlisted"] == []
    x = np.array([1.0, -2.0, 3.0], np.float32)
    assert out["decoded"] == dtypes.int4.encode(x).decode().tolist()


def test_public_names_are_the_same_objects_as_in_their_modules():
    import importlib

    for name in dtypes.__all__:
        obj = getattr(dtypes, name)
        home = importlib.import_module(f"dtypes.{dtypes._HOME[name]}")
        assert getattr(home, name) is obj, name
    assert set(dtypes._HOME) == set(dtypes.__all__)
