"""Each public path used eagerly, then under every transformation, and the other
way round, each order in a fresh process.

State computed on first use (a type found while tracing, a cached signature)
is invisible to a suite that runs in one warm process: whichever test first
touched an operator decided what later tests saw. Here every order starts
cold. The crash this caught: `a @ a` eagerly, then `jax.jit(lambda p, q: p @ q)`
raised `AttributeError: 'sharding'` on a traced array.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import dtypes, precision
    from precision import Tensor

    order = sys.argv[1].split(",")
    x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(4, 4)
    bf = Tensor(x).to_reduced_precision("bfloat16")
    i8 = Tensor(x).to_reduced_precision("int8", scaling=dtypes.PerAxis(1))
    f32 = Tensor(x)

    def logical(t):
        return np.asarray(t.numpy() if isinstance(t, Tensor) else t)

    paths = {
        "matmul": lambda p: p @ p,
        "add": lambda p: p + p,
        "neg": lambda p: -p,
        "sum": lambda p: p.sum(),
        "index": lambda p: p[1],
        "reshape": lambda p: p.reshape(16),
        "apply": lambda p: precision.apply(lambda a: jnp.tanh(a) * 2.0)(p),
        "reduce": lambda p: p.to_reduced_precision("float16") if p.format.name == "float32"
        else p.to_full_precision(),
        "tree": lambda p: precision.to_full_precision({"w": p})["w"],
    }

    def run(how, fn, t):
        if how == "eager":
            return fn(t)
        if how == "jit":
            return jax.jit(fn)(t)
        if how == "jit2":  # a second, different jitted function over the same path
            return jax.jit(lambda q: fn(q))(t)
        if how == "vmap":
            stacked = jax.tree.map(lambda a: jnp.stack([a, a]), t)
            return jax.tree.map(lambda a: a[0], jax.vmap(fn)(stacked))
        if how == "scan":
            def body(c, _):
                return c, fn(t)
            _, ys = jax.lax.scan(body, 0.0, None, length=2)
            return jax.tree.map(lambda a: a[0], ys)
        if how == "grad":
            if t.format.name != "float32":
                return fn(t)  # gradients are taken of float32 parameters
            def loss(a):
                out = fn(Tensor(a))
                out = out.to_full_precision() if isinstance(out, Tensor) else out
                return jnp.sum(jnp.asarray(out))
            jax.grad(loss)(jnp.asarray(x))
            return fn(t)
        raise ValueError(how)

    failures = []
    for name, fn in paths.items():
        for t in (bf, i8, f32):
            expected = None
            for how in order:
                try:
                    got = logical(run(how, fn, t))
                except Exception as e:  # report every failure, not the first
                    failures.append(f"{name} {t.format.name} {how}: {type(e).__name__}: {e}")
                    continue
                if expected is None:
                    expected = got
                elif not np.array_equal(expected, got, equal_nan=True):
                    failures.append(f"{name} {t.format.name} {how}: {got} != {expected}")
    print("\\n".join(failures) if failures else "ok")
    sys.exit(1 if failures else 0)
    """
)

ORDERS = [
    "eager,jit,jit2,grad,vmap,scan",
    "jit,eager,jit2,vmap,eager,scan,grad",
]
if os.environ.get("HYPOTHESIS_PROFILE") == "hunt":  # more orders when hunting
    ORDERS += ["vmap,scan,jit,eager,grad,jit2", "grad,jit,eager,jit2", "scan,grad,eager,vmap,jit"]


@pytest.mark.parametrize("order", ORDERS)
def test_paths_in_any_order_in_a_fresh_process(order, tmp_path):
    script = tmp_path / "order.py"
    script.write_text(_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), order], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


# Tensor's operators are attached by `precision._applied_operators`, which the package loads
# before handing out any name that computes. A process whose first Tensor comes
# from another public path than `precision.Tensor` must still have them.
_ENTRIES = {
    "tree conversion": (
        "from precision import to_reduced_precision\n"
        "t = to_reduced_precision({'w': np.ones((2, 2), np.float32)}, 'bfloat16')['w']\n"
    ),
    "load": ("from precision import load\nt = load(sys.argv[1])['w']\n"),
    "testing strategies": (
        "from hypothesis import find\n"
        "from precision.testing import tensors\n"
        "t = find(tensors('bfloat16', shape=(2, 2)), lambda t: True)\n"
    ),
}


@pytest.mark.parametrize("entry", sorted(_ENTRIES))
def test_operators_are_attached_whatever_the_first_public_name(entry, tmp_path):
    path = tmp_path / "w.safetensors"
    subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
            import numpy as np, precision
            w = precision.Tensor(np.ones((2, 2), np.float32)).to_reduced_precision('bfloat16')
            precision.save({str(path)!r}, {{'w': w}})
            """
            ),
        ],
        check=True,
    )
    script = (
        "import sys\nimport numpy as np\n"
        + _ENTRIES[entry]
        + (
            "out = (t + t) @ t\n"
            "assert out.format.name == 'bfloat16', out\n"
            "assert out.reshape(4).shape == (4,) and t.T.shape == (2, 2) and t.sum().shape == ()\n"
            "print('ok')\n"
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_a_private_import_alone_says_how_to_get_the_operators():
    script = (
        "import numpy as np\n"
        "from precision._tensor import Tensor\n"
        "t = Tensor(np.ones(2, np.float32))\n"
        "try:\n"
        "    t + t\n"
        "except Exception as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.startswith("PrecisionError Tensor operator 'add' is not attached"), (
        done.stdout + done.stderr[-2000:]
    )


def test_names_that_compute_nothing_load_no_jax():
    # `precision load`, `convert --help` and friends start fast: these names are handed
    # out without JAX (load attaches the operators itself when it makes Tensors).
    names = ["load", "save", "Contract", "default_format", "KEEP", "PrecisionError"]
    script = (
        "import sys, precision\n"
        f"for name in {names!r}:\n"
        "    getattr(precision, name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
