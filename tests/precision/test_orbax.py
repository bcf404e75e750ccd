"""A tree of Tensors saved and restored with Orbax, sharded over 8 host devices.

Runs in a child process with `XLA_FLAGS=--xla_force_host_platform_device_count=8`
(the device count is fixed when JAX starts). int4 (packed), int8 and bfloat16
Tensors are split over a 4 x 2 mesh with `precision.storage_shardings`, saved
with `orbax.checkpoint.StandardCheckpointer`, and restored into an abstract
tree (`jax.ShapeDtypeStruct`s with the shardings): the codes and scales come
back bit for bit, with the same formats, scalings and shardings.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("orbax.checkpoint")

CHILD = textwrap.dedent(
    """
    import sys
    import jax, numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import dtypes, precision

    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    tree = {
        "w4": precision.Tensor(rng.standard_normal((64, 128), np.float32)).to_reduced_precision(
            "int4", scaling=dtypes.PerBlock(32)),
        "w8": precision.Tensor(rng.standard_normal((32, 64), np.float32)).to_reduced_precision(
            "int8", scaling=dtypes.PerAxis(0)),
        "b": precision.Tensor(rng.standard_normal((16,), np.float32)).to_reduced_precision("bf16"),
        "step": np.array(7, np.int32),
    }
    logical = {
        "w4": NamedSharding(mesh, P("data", "model")),
        "w8": NamedSharding(mesh, P("data", None)),
        "b": NamedSharding(mesh, P("model")),
        "step": NamedSharding(mesh, P()),
    }
    sharded = precision.device_put(tree, logical)
    assert len(sharded["w4"].encoded.data.sharding.device_set) == 8

    path = sys.argv[1]
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path, sharded)
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), sharded
    )
    with ocp.StandardCheckpointer() as ckpt:
        restored = ckpt.restore(path, abstract)

    for name in ["w4", "w8", "b"]:
        a, b = sharded[name], restored[name]
        assert type(b) is precision.Tensor, type(b)
        assert (b.format, b.encoded.scaling, b.shape) == (a.format, a.encoded.scaling, a.shape)
        for x, y in [(a.encoded.data, b.encoded.data), (a.encoded.scale, b.encoded.scale)]:
            if x is None:
                assert y is None
                continue
            assert y.sharding == x.sharding, (name, y.sharding, x.sharding)
            np.testing.assert_array_equal(
                np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8)
            )
    assert int(restored["step"]) == 7
    print("ok")
    """
)


def test_orbax_round_trip_on_8_devices(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["JAX_PLATFORMS"] = "cpu"
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
