"""Devices and sharding over 8 forced host devices (each check in a fresh process).

`--xla_force_host_platform_device_count` only takes effect before JAX starts,
and the rest of the suite has imported JAX already, so every scenario runs as
a script in a subprocess with `XLA_FLAGS` set.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

PRELUDE = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import dtypes, precision
from precision import Tensor
assert len(jax.devices()) == 8, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
"""


def run_script(body: str) -> str:
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT)
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_tensors_on_different_devices_raise_and_nothing_moves():
    out = run_script(
        """
        d0, d1 = jax.devices()[:2]
        a = Tensor(np.ones(4, np.float32)).to_reduced_precision().to_device(d0)
        b = Tensor(np.ones(4, np.float32)).to_reduced_precision().to_device(d1)
        try:
            a + b
        except precision.DeviceMismatchError as err:
            assert isinstance(err, ValueError)
            print("raised:", err)
        else:
            raise SystemExit("no error")
        try:
            precision.apply(lambda x, y: x @ y)(a, b)
        except precision.DeviceMismatchError:
            print("raised in apply")
        assert a.device == d0 and b.device == d1
        # the suggested fix works
        c = a + b.to_device(a.device)
        assert c.device == d0
        print("ok")
        """
    )
    assert "raised: tensors on different devices: cpu:0 and cpu:1" in out
    assert "to_device" in out
    assert "raised in apply" in out
    assert out.strip().endswith("ok")


def test_sharded_tensor_keeps_data_and_scales_consistent():
    out = run_script(
        """
        x = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
        rows = NamedSharding(mesh, P("data", None))
        t = Tensor(x).to_reduced_precision("int8", scaling=dtypes.PerAxis(0)).to_device(rows)
        assert t.encoded.data.sharding.spec == P("data", None), t.encoded.data.sharding
        assert t.encoded.scale.shape == (16, 1)
        assert t.encoded.scale.sharding.spec == P("data", None), t.encoded.scale.sharding
        # each device holds the scales of exactly its own rows
        for shard, sshard in zip(t.encoded.data.addressable_shards,
                                 t.encoded.scale.addressable_shards):
            assert shard.index[0] == sshard.index[0] and shard.device == sshard.device
        cols = NamedSharding(mesh, P(None, "data"))
        u = Tensor(x).to_reduced_precision("int8", scaling=dtypes.PerAxis(0)).to_device(cols)
        # per-row scales are not split along columns: replicated
        assert u.encoded.scale.sharding.spec in (P(None, None), P()), u.encoded.scale.sharding
        blocks = Tensor(x).to_reduced_precision("int4", scaling=dtypes.PerBlock(1, axis=0))
        blocks = blocks.to_device(rows)
        assert blocks.encoded.scale.sharding.spec == P("data", None)
        np.testing.assert_array_equal(np.asarray(t), np.asarray(
            Tensor(x).to_reduced_precision("int8", scaling=dtypes.PerAxis(0))))
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_apply_preserves_sharding():
    out = run_script(
        """
        x = np.arange(64, dtype=np.float32).reshape(16, 4) / 10
        rows = NamedSharding(mesh, P("data", None))
        t = Tensor(x).to_reduced_precision().to_device(rows)
        y = precision.apply(lambda a: jnp.tanh(a) * 2.0 + a)(t)
        assert y.format == dtypes.bfloat16
        assert y.sharding.is_equivalent_to(rows, 2), y.sharding
        tree = precision.device_put({"w": Tensor(x).to_reduced_precision(), "n": 1}, rows)
        assert tree["w"].sharding.is_equivalent_to(rows, 2)
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_jitted_data_parallel_step_runs():
    out = run_script(
        """
        key = jax.random.key(0)
        w = jax.random.normal(key, (8, 4)) / 3
        x = jax.random.normal(jax.random.fold_in(key, 1), (32, 8))
        y = jax.random.normal(jax.random.fold_in(key, 2), (32, 4))
        batch = NamedSharding(mesh, P("data", None))
        replicated = NamedSharding(mesh, P())
        x, y = jax.device_put(x, batch), jax.device_put(y, batch)
        w = jax.device_put(w, replicated)

        def loss(w, x, y):
            wt = Tensor(w).to_reduced_precision()
            pred = precision.apply(lambda a, b: jnp.tanh(a @ b))(
                Tensor(x).to_reduced_precision(), wt)
            return jnp.mean((precision.to_full_precision(pred) - y) ** 2)

        @jax.jit
        def step(w, x, y):
            value, g = jax.value_and_grad(loss)(w, x, y)
            return w - 0.1 * g, value

        losses = []
        for _ in range(5):
            w, value = step(w, x, y)
            losses.append(float(value))
        assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
        assert w.sharding.is_equivalent_to(replicated, 2)
        print("ok", losses[0], losses[-1])
        """
    )
    assert out.startswith("ok")


@pytest.mark.parametrize("scaling", ["PerTensor()", "PerBlock(4)"])
def test_sharded_encode_under_jit(scaling):
    out = run_script(
        f"""
        x = np.random.default_rng(1).normal(size=(8, 16)).astype(np.float32)
        rows = NamedSharding(mesh, P("data", None))
        xs = jax.device_put(x, rows)
        enc = jax.jit(lambda v: Tensor(v).to_reduced_precision(
            "int8", scaling=dtypes.{scaling}))(xs)
        ref = Tensor(x).to_reduced_precision("int8", scaling=dtypes.{scaling})
        np.testing.assert_allclose(np.asarray(enc), np.asarray(ref), rtol=1e-6)
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_storage_shardings_and_device_put_of_a_tree_of_placements():
    out = run_script(
        """
        w = np.arange(8 * 64, dtype=np.float32).reshape(8, 64) / 100
        params = {
            "w8": Tensor(w).to_reduced_precision("int8", scaling=dtypes.PerAxis(0)),
            "w4": Tensor(w).to_reduced_precision("int4", scaling=dtypes.PerBlock(8)),
            "b": jnp.ones(64),
            "key": jax.random.key(0),
            "step": np.int64(1200),  # a numpy scalar is placed too (Orbax needs its sharding)
        }
        rows = NamedSharding(mesh, P("data", None))
        cols = NamedSharding(mesh, P(None, "data"))
        repl = NamedSharding(mesh, P())
        logical = {"w8": rows, "w4": rows, "b": repl, "key": repl, "step": repl}
        storage = precision.storage_shardings(params, logical)
        assert storage["w8"].encoded.data == rows
        assert storage["w8"].encoded.scale.spec == P("data", None)  # per-row scales follow rows
        placed = precision.device_put(params, logical)
        assert placed["w8"].encoded.scale.sharding.spec == P("data", None)
        assert len(placed["w4"].encoded.data.sharding.device_set) == 8
        np.testing.assert_array_equal(np.asarray(placed["w4"]), np.asarray(params["w4"]))
        assert jax.random.key_data(placed["key"]).tolist() == [0, 0]
        assert placed["step"].sharding == repl
        assert int(placed["step"]) == 1200
        # a jitted function takes the storage shardings as in_shardings
        f = jax.jit(precision.apply(lambda p, x: x @ p["w8"].T + 1.0), in_shardings=(storage, repl))
        y = f(placed, jnp.ones((2, 64)))
        ref = np.ones((2, 64)) @ np.asarray(params["w8"]).T + 1
        np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-6)
        # int4 packs 64 values into 32 bytes: 8 devices split it; 12 values (6 bytes) cannot be
        odd = {"w": Tensor(np.ones((8, 12), np.float32)).to_reduced_precision("int4")}
        try:
            precision.storage_shardings(odd, {"w": cols})
        except precision.DeviceMismatchError as err:
            print("refused:", err)
        print("ok")
        """
    )
    assert (
        "refused: ['w']: the last axis of this int4 Tensor of shape (8, 12) is packed into 6 bytes"
        in out
    )
    assert out.strip().endswith("ok")


def test_a_tensor_held_transposed_is_placed_along_its_logical_axes():
    out = run_script(
        """
        w = np.arange(64 * 16, dtype=np.float32).reshape(64, 16) / 100  # (in, out)
        held = Tensor(w).to_reduced_precision(
            "int8", scaling=dtypes.PerAxis(-1), layout="transposed"
        )
        rows = NamedSharding(mesh, P("data", None))  # split the logical `in` axis
        placed = held.to_device(rows)
        assert placed.layout == "transposed"
        assert placed.encoded.data.sharding.spec == P(None, "data"), placed.encoded.data.sharding
        np.testing.assert_array_equal(np.asarray(placed), np.asarray(held))
        tree = {"w": held}
        storage = precision.storage_shardings(tree, {"w": rows})
        assert storage["w"].encoded.data.spec == P(None, "data")
        put = precision.device_put(tree, {"w": rows})
        x = jnp.ones((4, 64))
        f = jax.jit(precision.apply(lambda p, x: x @ p["w"], contract="int8"),
                    in_shardings=(storage, NamedSharding(mesh, P())))
        g = precision.apply(lambda p, x: x @ p["w"], contract="int8")
        np.testing.assert_array_equal(np.asarray(f(put, x)), np.asarray(g(tree, x)))
        print("ok")
        """
    )
    assert out.strip().endswith("ok")
