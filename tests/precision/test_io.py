"""precision.save / precision.load: bit-exact round trips and safetensors compatibility.

The file format is checked against an independent implementation (the
`safetensors` package) in both directions, and the header is parsed here by
hand with `struct` and `json` to pin the documented metadata layout.
"""

from __future__ import annotations

import json
import os
import struct

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

import dtypes
import precision
from precision import CheckpointError, Tensor
from precision.testing._plugin import selected_formats

RNG = np.random.default_rng(20261122)
X = RNG.standard_normal((6, 40)).astype(np.float32) * 3

# Every entry of dtypes.REGISTRY, element formats and named encodings alike (float64
# only with 64-bit JAX, as the `fmt` fixture chooses), plus custom layouts: the MXFP4
# element type (packed 4-bit codes), an IEEE-style e4m3 (ml_dtypes' float8_e4m3, which
# has no safetensors dtype), a 6-bit layout and a saturating bfloat16 (stored by
# parameters, not by name).
REGISTERED = selected_formats()
FORMATS = [
    *REGISTERED,
    dtypes.FloatFormat(2, 1, finite=True),
    dtypes.FloatFormat(4, 3),
    dtypes.FloatFormat(3, 2, finite=True),
    dtypes.FloatFormat(8, 7, saturate=True),
]
SCALINGS = {
    "default": None,
    "per-tensor": dtypes.PerTensor(),
    "per-axis-0": dtypes.PerAxis(0),
    "per-axis-1-pow2": dtypes.PerAxis(1, power_of_two=True),
    "per-block-16": dtypes.PerBlock(16),
    "per-block-32-pow2": dtypes.PerBlock(32, power_of_two=True),
}


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(f"u{a.dtype.itemsize}")


def assert_same_storage(a: Tensor, b: Tensor) -> None:
    ea, eb = a.encoded, b.encoded
    assert (ea.format, ea.scaling, ea.shape, a.dtype) == (eb.format, eb.scaling, eb.shape, b.dtype)
    assert ea.format.name == eb.format.name
    assert np.asarray(ea.data).dtype == np.asarray(eb.data).dtype
    np.testing.assert_array_equal(_bits(ea.data), _bits(eb.data))
    assert (ea.scale is None) == (eb.scale is None)
    if ea.scale is not None:
        np.testing.assert_array_equal(_bits(ea.scale), _bits(eb.scale))


def header(path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), n


def takes_scalings(fmt: dtypes.Format) -> bool:
    """Whether a format takes a scaling of the caller's: not a scale format (E8M0 is
    itself the scales), not a float with float32's exponent range (scales cannot help)."""
    return fmt.kind != "scale" and not (fmt.kind == "float" and fmt.emax >= 127)


def values_for(fmt: dtypes.Format, x: np.ndarray) -> np.ndarray:
    """`x`, or its magnitudes for a scale format (E8M0 holds positive powers of two only)."""
    return np.abs(x) + 2.0**-8 if fmt.kind == "scale" else x


# Each format with its default scaling (a named encoding's own, MX blocks, NVFP4's two
# levels, zero points, code books), and each element format and custom layout that
# takes scalings with one of them, in turn, so every format and every scaling is
# covered without the full product (each case compiles an encode; the custom layouts
# are also the element grids of the float4, float6 and e4m3 encodings). Where the
# turn's scaling is one the format refuses (`Format.check` says so: int1 takes no
# power-of-two scales), the next one it takes.
_SCALED = list(SCALINGS.items())[1:]


def _scaled_case(i: int, fmt: dtypes.Format):
    for j in range(len(_SCALED)):
        label, scaling = _SCALED[(i + j) % len(_SCALED)]
        try:
            fmt.check(values_for(fmt, X), scaling=scaling)
        except dtypes.ScalingError:
            continue
        return pytest.param(fmt, scaling, id=f"{fmt.name}-{label}")
    raise AssertionError(f"{fmt.name} takes none of the scalings {list(SCALINGS)[1:]}")


def encoded_tensor(x, fmt, scaling=None, **kw) -> Tensor:
    """A Tensor over the storage `dtypes` itself produces (the library's own encode)."""
    return Tensor.from_encoded(fmt.encode(x, scaling=scaling, **kw))


_RESCALED = [f for f in FORMATS if takes_scalings(f) and f.name not in dtypes.ENCODINGS]
CASES = [pytest.param(f, None, id=f"{f.name}-default") for f in FORMATS] + [
    _scaled_case(i, f) for i, f in enumerate(_RESCALED)
]


def test_cases_cover_the_registry():
    """Every registry entry (bar float64 without x64) round-trips with its default
    scaling, every element format that takes scalings with one of them, and every
    scaling is met."""
    x64 = jax.config.read("jax_enable_x64")
    every = {n for n, f in dtypes.REGISTRY.items() if x64 or f.bits <= 32}
    assert {f"{n}-default" for n in every} <= {p.id for p in CASES}
    scaled = {p.values[0].name for p in CASES if p.values[1] is not None}
    assert scaled >= {n for n in every & set(dtypes.FORMATS) if takes_scalings(dtypes.get(n))}
    met = {p.values[1] for p in CASES}
    assert all(s in met for s in SCALINGS.values())


@pytest.mark.parametrize(
    "fmt", [f for f in REGISTERED if not takes_scalings(f)], ids=lambda f: f.name
)
def test_formats_that_take_no_scaling_refuse_one_by_name(fmt):
    for scaling in SCALINGS.values():
        if scaling is not None:
            with pytest.raises(dtypes.ScalingError, match=fmt.name):
                fmt.check(values_for(fmt, X), scaling=scaling)


@pytest.mark.parametrize(("fmt", "scaling"), CASES)
def test_round_trip_is_bit_exact(tmp_path, fmt, scaling):
    t = encoded_tensor(values_for(fmt, X), fmt, scaling)
    path = tmp_path / "t.safetensors"
    precision.save(path, {"w": t})
    loaded = precision.load(path)["w"]
    assert isinstance(loaded, Tensor)
    assert_same_storage(t, loaded)
    logical = precision.load(path, as_arrays=True)["w"]
    expected = np.asarray(fmt.decode(t.encoded))
    np.testing.assert_array_equal(np.asarray(logical), expected)
    np.testing.assert_array_equal(np.asarray(loaded), expected)


def test_loaded_custom_float_tensor_values(tmp_path):
    fmt = dtypes.FloatFormat(3, 2, finite=True)
    precision.save(tmp_path / "t.safetensors", encoded_tensor(X, fmt))
    expected = np.asarray(fmt.decode(fmt.encode(X)))
    np.testing.assert_array_equal(np.asarray(precision.load(tmp_path / "t.safetensors")), expected)


SHAPES = [(), (1,), (7,), (3, 9), (2, 3, 17), (0, 5)]
HUNT = os.environ.get("HYPOTHESIS_PROFILE") == "hunt"


def _shapes(i: int) -> list[tuple[int, ...]]:
    """Every shape under the hunt profile; else one in turn (each encode compiles once per
    shape; each shape still meets four formats or more, of several kinds)."""
    return SHAPES if HUNT else [SHAPES[i % len(SHAPES)]]


@pytest.mark.parametrize(
    ("fmt", "shapes"),
    [pytest.param(f, _shapes(i), id=f.name) for i, f in enumerate(REGISTERED)],
)
def test_round_trip_shapes(tmp_path, fmt, shapes):
    # a scalar, partial packed bytes and blocks, an empty tensor: in one file
    tensors = [
        encoded_tensor(values_for(fmt, RNG.standard_normal(shape).astype(np.float32)), fmt)
        for shape in shapes
    ]
    precision.save(tmp_path / "s.safetensors", tensors)
    loaded = precision.load(tmp_path / "s.safetensors")
    for shape, t, back in zip(shapes, tensors, loaded, strict=True):
        assert back.shape == shape
        assert_same_storage(t, back)


def test_stochastic_rounding_round_trip(tmp_path):
    t = encoded_tensor(
        X, dtypes.int2, dtypes.PerAxis(0), rounding="stochastic", key=jax.random.key(3)
    )
    precision.save(tmp_path / "s.safetensors", [t])
    assert_same_storage(t, precision.load(tmp_path / "s.safetensors")[0])


def test_tree_structure_and_plain_arrays(tmp_path):
    tree = {
        "params": {
            "dense": {"kernel": Tensor(X).to_reduced_precision("int8"), "bias": Tensor(X[0])},
            "layers": [Tensor(X).to_reduced_precision("bf16"), np.arange(4, dtype=np.int32)],
        },
        "step": np.int64(7),
        "by_id": {3: jax.numpy.ones((2,), jax.numpy.bfloat16)},
    }
    path = tmp_path / "tree.safetensors"
    precision.save(path, tree)
    out = precision.load(path)
    assert set(out) == {"params", "step", "by_id"}
    assert_same_storage(out["params"]["dense"]["kernel"], tree["params"]["dense"]["kernel"])
    assert_same_storage(out["params"]["dense"]["bias"], tree["params"]["dense"]["bias"])
    assert isinstance(out["params"]["layers"], list)
    assert_same_storage(out["params"]["layers"][0], tree["params"]["layers"][0])
    np.testing.assert_array_equal(out["params"]["layers"][1], np.arange(4))
    assert out["params"]["layers"][1].dtype == np.int32
    assert out["step"].dtype == np.int64
    assert int(out["step"]) == 7
    assert out["by_id"][3].dtype == ml_dtypes.bfloat16
    names = set(header(path)[0]) - {"__metadata__"}
    assert names == {
        "params.dense.kernel",
        "params.dense.kernel:scale",
        "params.dense.bias",
        "params.layers.0",
        "params.layers.1",
        "step",
        "by_id.3",
    }


def test_tuples_and_custom_nodes_come_back_as_lists_and_dicts(tmp_path):
    Point = __import__("collections").namedtuple("Point", "x y")
    tree = (Point(np.float32(1), np.float32(2)), [np.float32(3)])
    precision.save(tmp_path / "t.safetensors", tree)
    out = precision.load(tmp_path / "t.safetensors", as_arrays=True)
    assert out == [{"x": 1.0, "y": 2.0}, [3.0]] or out == [[1.0, 2.0], [3.0]]


def test_metadata_layout_is_as_documented(tmp_path):
    t = Tensor(X).to_reduced_precision("int4", scaling=dtypes.PerBlock(16))
    custom = encoded_tensor(X, dtypes.FloatFormat(3, 2, finite=True))
    path = tmp_path / "m.safetensors"
    precision.save(path, {"a": {"w": t}, "c": custom, "n": np.zeros(3, np.float16)})
    head, n = header(path)
    assert (8 + n) % 8 == 0
    assert head["a.w"] == {"dtype": "U8", "shape": [6, 20], "data_offsets": [0, 120]}
    assert head["a.w:scale"]["dtype"] == "F32"
    assert head["a.w:scale"]["shape"] == [6, 3]
    assert set(head["__metadata__"]) == {"precision", "precision_version"}
    assert head["__metadata__"]["precision_version"] == "1"
    doc = json.loads(head["__metadata__"]["precision"])
    assert doc["version"] == 1
    by_name = {leaf["name"]: leaf for leaf in doc["tensors"]}
    assert by_name["a.w"] == {
        "name": "a.w",
        "path": [["key", "a"], ["key", "w"]],
        "kind": "tensor",
        "format": "int4",
        "scaling": {"type": "per-block", "size": 16, "axis": -1, "power_of_two": False},
        "dtype": "float32",
        "shape": [6, 40],
        "scale": "a.w:scale",
    }
    assert by_name["c"]["format"] == {
        "kind": "float",
        "exponent_bits": 3,
        "mantissa_bits": 2,
        "finite": True,
        "nan": False,
        "saturate": False,
        "name": "float6_e3m2fn",
    }
    assert by_name["n"]["kind"] == "array"
    assert by_name["n"]["format"] is None
    import zlib

    with open(path, "rb") as f:
        raw = f.read()
    for name, info in head.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        assert int(doc["crc32"][name], 16) == zlib.crc32(raw[8 + n + begin : 8 + n + end])


def test_independent_reader_sees_our_arrays(tmp_path):
    t = Tensor(X).to_reduced_precision("float8_e5m2")
    q = Tensor(X).to_reduced_precision("int8", scaling=dtypes.PerAxis(0))
    path = tmp_path / "ours.safetensors"
    precision.save(path, {"f8": t, "q": q, "bf": np.asarray(X, ml_dtypes.bfloat16)})
    with safe_open(path, framework="numpy") as f:
        assert set(f.keys()) == {"f8", "q", "q:scale", "bf"}
        assert "precision" in f.metadata()
        np.testing.assert_array_equal(f.get_tensor("q"), np.asarray(q.encoded.data))
        np.testing.assert_array_equal(f.get_tensor("q:scale"), np.asarray(q.encoded.scale))
        np.testing.assert_array_equal(
            _bits(f.get_tensor("bf")), _bits(X.astype(ml_dtypes.bfloat16))
        )
    # ml_dtypes is the reference for what the fp8 codes are.
    head, n = header(path)
    begin, end = head["f8"]["data_offsets"]
    raw = np.fromfile(path, np.uint8, count=end - begin, offset=8 + n + begin)
    np.testing.assert_array_equal(raw.reshape(X.shape), _bits(X.astype(ml_dtypes.float8_e5m2)))


def test_foreign_file_loads_as_tensors_keyed_by_name(tmp_path):
    arrays = {
        "model.embed.weight": X,
        "model.norm.weight": X[0].astype(np.float16),
        "lm_head.weight": X.astype(ml_dtypes.bfloat16),
        "position_ids": np.arange(5, dtype=np.int64),
        "mask": np.array([True, False]),
    }
    path = tmp_path / "foreign.safetensors"
    safetensors.numpy.save_file(arrays, str(path), metadata={"format": "np"})
    out = precision.load(path)
    assert set(out) == set(arrays)
    embed = out["model.embed.weight"]
    assert isinstance(embed, Tensor)
    assert embed.format == dtypes.float32
    assert not embed.is_reduced_precision
    np.testing.assert_array_equal(np.asarray(embed), X)
    # Narrow foreign floats are full-precision float32 Tensors, widened exactly.
    for name in ("model.norm.weight", "lm_head.weight"):
        t = out[name]
        assert t.format == dtypes.float32
        assert t.dtype == np.float32
        assert not t.is_reduced_precision
        np.testing.assert_array_equal(_bits(np.asarray(t)), _bits(arrays[name].astype(np.float32)))
    np.testing.assert_array_equal(out["position_ids"], np.arange(5))
    np.testing.assert_array_equal(out["mask"], [True, False])
    logical = precision.load(path, as_arrays=True)
    assert logical["lm_head.weight"].dtype == np.float32
    np.testing.assert_array_equal(
        np.asarray(logical["lm_head.weight"]),
        arrays["lm_head.weight"].astype(np.float32),
    )


def test_save_refuses_to_replace_without_overwrite(tmp_path):
    path = tmp_path / "x.safetensors"
    precision.save(path, {"a": X})
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match=r"already exists; pass overwrite=True"):
        precision.save(path, {"a": X[:1]})
    assert path.read_bytes() == before
    precision.save(path, {"a": X[:1]}, overwrite=True)
    np.testing.assert_array_equal(precision.load(path, as_arrays=True)["a"], X[:1])
    assert sorted(os.listdir(tmp_path)) == ["x.safetensors"]


@pytest.mark.parametrize(
    ("tree", "error", "match"),
    [
        ({"a.b": X, "a": {"b": X}}, ValueError, r"two leaves would be stored under the name 'a.b'"),
        ({"w": Tensor(X).to_reduced_precision("int8"), "w:scale": X}, ValueError, r"'w:scale'"),
        ({"s": "text"}, TypeError, r"cannot save leaf 's'"),
        ({"c": np.ones(2, np.complex64)}, TypeError, r"dtype complex64"),
        ({(1, 2): X}, TypeError, r"dict key \(1, 2\)"),
    ],
    ids=["dotted-collision", "scale-collision", "string", "complex", "tuple-key"],
)
def test_save_refuses_unstorable_trees(tmp_path, tree, error, match):
    with pytest.raises(error, match=match):
        precision.save(tmp_path / "bad.safetensors", tree)
    assert os.listdir(tmp_path) == []


def test_save_through_a_symlink_replaces_its_target(tmp_path):
    target = tmp_path / "real.safetensors"
    precision.save(target, {"a": X})
    (tmp_path / "link.safetensors").symlink_to(target)
    precision.save(tmp_path / "link.safetensors", {"a": X[:2]}, overwrite=True)
    assert (tmp_path / "link.safetensors").is_symlink()
    np.testing.assert_array_equal(precision.load(target, as_arrays=True)["a"], X[:2])


def test_save_onto_a_directory_is_refused(tmp_path):
    with pytest.raises(IsADirectoryError, match="it is a directory"):
        precision.save(tmp_path, {"a": X}, overwrite=True)


def test_load_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        precision.load(tmp_path / "absent.safetensors")


def test_checkpoint_error_is_a_value_error():
    assert issubclass(CheckpointError, ValueError)
    assert issubclass(CheckpointError, precision.PrecisionError)


def test_many_small_tensors_load_in_a_few_transfers(tmp_path, monkeypatch):
    # one transfer per leaf cost ~0.4 ms each: 65,536 tiny tensors took 28-117 s
    import jax

    path = tmp_path / "many.safetensors"
    tree = {f"t{i}": np.full(3, i, np.float32) for i in range(5000)}
    tree["q"] = precision.Tensor(np.ones((4, 64), np.float32)).to_reduced_precision("int4")
    precision.save(path, tree)
    calls = []
    real = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda *a, **k: calls.append(1) or real(*a, **k))
    loaded = precision.load(path)
    assert len(calls) <= 3, len(calls)
    assert np.asarray(loaded["t4321"]).tolist() == [4321.0] * 3
    np.testing.assert_array_equal(np.asarray(loaded["q"]), np.asarray(tree["q"]))
    assert loaded["q"].format.name == "int4"
