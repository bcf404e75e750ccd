"""Checkpoints carry every encoding: scale formats, tensor scales, zero points, code books.

Each encoding of `dtypes.ENCODINGS`, and each scale format under int4, int8
and fp8 elements, is saved and loaded; the loaded Tensor must hold the very
arrays saved and decode to the saved Tensor's values bit for bit. An
independent decoder written here from the documented layout (docs/cli.md,
"File layout": json, struct, numpy and ml_dtypes only) must agree with
`precision`'s decode on every one of them. Damaged files — each new part
forged, the checksums recomputed — are refused with a `CheckpointError`
naming the entry. The example of docs/cli.md that decodes MXFP4 and NVFP4
with numpy and ml_dtypes runs here.
"""

from __future__ import annotations

import json
import math
import pathlib
import struct
import zlib

import ml_dtypes
import numpy as np
import pytest

import dtypes
import precision
from precision import CheckpointError, Tensor

RNG = np.random.default_rng(5)
X = RNG.standard_normal((4, 64)).astype(np.float32)
ODD = (RNG.standard_normal((3, 41)) * 3).astype(np.float32)  # partial blocks, padded rows


# -- an independent reader and decoder, from the documented layout ------------------

FILE_DTYPES = {
    "U8": np.uint8,
    "I8": np.int8,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F32": np.float32,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
}
# (exponent bits, mantissa bits, finite) -> the ml_dtypes type of that bit layout
FLOAT_LAYOUTS = {
    (2, 1, True): ml_dtypes.float4_e2m1fn,
    (2, 3, True): ml_dtypes.float6_e2m3fn,
    (3, 2, True): ml_dtypes.float6_e3m2fn,
    (4, 3, True): ml_dtypes.float8_e4m3fn,
    (5, 2, False): ml_dtypes.float8_e5m2,
    (4, 3, False): ml_dtypes.float8_e4m3,
    (3, 4, False): ml_dtypes.float8_e3m4,
}
NAMED = {  # the names of `precision formats` this file uses, and their layouts
    "int8": ("int", 8),
    "int4": ("int", 4),
    "float8_e4m3fn": ("float", (4, 3, True)),
    "float8_e5m2": ("float", (5, 2, False)),
    "float8_e8m0fnu": ("e8m0", None),
}


def read_file(path) -> tuple[dict[str, np.ndarray], dict]:
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    doc = json.loads(header.pop("__metadata__")["precision"])
    arrays = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        data = np.frombuffer(raw[8 + n + begin : 8 + n + end], FILE_DTYPES[entry["dtype"]])
        arrays[name] = data.reshape(entry["shape"])
    return arrays, doc


def _unpack(data: np.ndarray, width: int, n: int) -> np.ndarray:
    """Fields of `width` bits, low bits first, `n` per row of the last axis."""
    bits = np.unpackbits(data.view(np.uint8), axis=-1, bitorder="little")[..., : n * width]
    bits = bits.reshape((*data.shape[:-1], n, width)).astype(np.int64)
    return (bits << np.arange(width)).sum(axis=-1)


def _broadcast(group: np.ndarray, scaling: dict, shape: tuple[int, ...]) -> np.ndarray:
    if scaling["type"] == "per-block":
        axis = scaling["axis"] % len(shape)
        group = np.repeat(group, scaling["size"], axis=axis)
        group = np.take(group, np.arange(shape[axis]), axis=axis)
    return np.broadcast_to(group, shape)


def decode_leaf(leaf: dict, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """float32 values of one leaf, by the four documented steps."""
    shape = tuple(leaf["shape"])
    spec = leaf["format"]
    kind, layout = NAMED[spec] if isinstance(spec, str) else (spec["kind"], None)
    data = arrays[leaf["name"]]
    # 1. codes; 2. elements
    if kind == "e8m0":
        return data.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    if kind == "float":
        layout = layout or (spec["exponent_bits"], spec["mantissa_bits"], spec["finite"])
        width = 1 + layout[0] + layout[1]
        if width < 8:
            data = _unpack(data, width, shape[-1]).astype(np.uint8)
        elements = data.view(FLOAT_LAYOUTS[layout]).astype(np.float32)
    elif kind == "int":
        bits = layout or spec["bits"]
        codes = data.astype(np.int64) if bits == 8 else _unpack(data, bits, shape[-1])
        elements = np.where(codes >= 2 ** (bits - 1), codes - 2**bits, codes).astype(np.float32)
    else:
        bits = spec["bits"] if kind == "uint" else math.ceil(math.log2(len(spec["values"])))
        codes = data.astype(np.int64) if bits == 8 else _unpack(data, bits, shape[-1])
        if kind == "codebook":
            elements = np.asarray(spec["values"], np.float32)[codes]
        else:
            elements = (codes - arrays[leaf["zero_point"]].astype(np.int64)).astype(np.float32)
    elements = elements.reshape(shape)
    scaling = leaf["scaling"]
    if scaling is None:
        return elements
    # 3. scales
    stored = arrays[leaf["scale"]]
    scale_format = scaling["scale_format"]
    if scale_format == "float8_e8m0fnu":
        offset = 0
        if kind == "int":  # the element's implicit scale: code / 2**floor(log2(qmax))
            offset = math.floor(math.log2(2 ** (bits - 1) - 1))
        scale = np.ldexp(1.0, stored.astype(np.int64) - 127 - offset).astype(np.float32)
    else:
        scale = stored.astype(np.float32)
    if leaf["tensor_scale"] is not None:
        scale = scale * arrays[leaf["tensor_scale"]]
    # 4. values
    return elements * _broadcast(scale, scaling, shape)


# -- what is saved ------------------------------------------------------------------


def _cases() -> dict[str, tuple[dtypes.Format, dtypes.Scaling | None, np.ndarray]]:
    cases: dict[str, tuple] = {}
    for name, fmt in dtypes.ENCODINGS.items():
        x = np.abs(X) + 0.01 if name == "float8_e8m0fnu" else X  # E8M0 holds 2**k only
        cases[name] = (fmt, None, x)
    cases["mxfp4-odd"] = (dtypes.get("mxfp4"), None, ODD)
    cases["nvfp4-odd"] = (dtypes.get("nvfp4"), None, ODD)
    cases["nf4-odd"] = (dtypes.get("nf4"), dtypes.PerBlock(16), ODD)
    cases["uint4-odd"] = (dtypes.get("uint4"), dtypes.PerAxis(0), ODD)
    cases["uint8-scalar"] = (dtypes.get("uint8"), None, np.float32(-2.5))
    for scale_format in dtypes.SCALE_FORMATS:
        pow2 = scale_format == "float8_e8m0fnu"
        block = dtypes.PerBlock(32, power_of_two=pow2, scale_format=scale_format)
        elements = ["float8_e4m3fn"]
        if scale_format != "float8_e4m3fn":  # two-level scales are for float elements
            elements += ["int4", "int8"]
        for element in elements:
            cases[f"{element}-{scale_format}"] = (dtypes.get(element), block, X)
    cases["int8-float16-per-tensor-pow2"] = (
        dtypes.int8,
        dtypes.PerTensor(power_of_two=True, scale_format="float16"),
        X * 1e9,  # 2**23 is past float16: the scale is float16's largest value
    )
    cases["int4-bfloat16-per-axis"] = (dtypes.int4, dtypes.PerAxis(0, scale_format="bf16"), ODD)
    cases["e5m2-e4m3-per-tensor"] = (
        dtypes.float8_e5m2,
        dtypes.PerTensor(scale_format="float8_e4m3fn"),
        ODD,
    )
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tree = {
        name: Tensor.from_encoded(fmt.encode(x, scaling=scaling))
        for name, (fmt, scaling, x) in CASES.items()
    }
    path = tmp_path_factory.mktemp("enc") / "all.safetensors"
    precision.save(path, tree)
    return path, tree


def test_cases_cover_every_named_encoding_and_scale_format():
    assert set(dtypes.ENCODINGS) <= set(CASES)
    formats = {s.scale_format for _, s, _ in CASES.values() if s is not None}
    formats |= {
        f.default_scaling().scale_format
        for f, s, _ in CASES.values()
        if s is None and f.default_scaling() is not None
    }
    assert formats == set(dtypes.SCALE_FORMATS)


@pytest.fixture(scope="module")
def loads(saved):
    """The file loaded once as Tensors and once as arrays (each load reads and, as arrays,
    decodes every tensor of the file: once per module, not once per case)."""
    path, _ = saved
    return precision.load(path), precision.load(path, as_arrays=True)


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip_is_bit_exact(saved, loads, name):
    _, tree = saved
    loaded, arrays = loads
    original, back = tree[name].encoded, loaded[name].encoded
    assert (back.format, back.scaling, back.shape) == (
        original.format,
        original.scaling,
        original.shape,
    )
    for part in ("data", "scale", "tensor_scale", "zero_point"):
        a, b = getattr(original, part), getattr(back, part)
        assert (a is None) == (b is None), part
        if a is not None:
            a, b = np.asarray(a), np.asarray(b)
            assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), part
    expected = np.asarray(tree[name].to_full_precision().numpy())
    assert np.asarray(loaded[name].to_full_precision().numpy()).tobytes() == expected.tobytes()
    assert np.asarray(arrays[name]).tobytes() == expected.tobytes()


def test_the_independent_decoder_agrees_on_every_tensor(saved):
    path, tree = saved
    arrays, doc = read_file(path)
    assert doc["version"] == 2
    for leaf in doc["tensors"]:
        values = decode_leaf(leaf, arrays)
        expected = np.asarray(tree[leaf["name"]].numpy(), np.float32)
        np.testing.assert_array_equal(values, expected, err_msg=leaf["name"], strict=True)


def test_named_encodings_are_self_describing(saved):
    arrays, doc = read_file(saved[0])
    leaves = {leaf["name"]: leaf for leaf in doc["tensors"]}
    nf4 = leaves["nf4"]["format"]
    assert nf4["kind"] == "codebook"
    assert nf4["values"] == [float(v) for v in dtypes.get("nf4").values]
    mx = leaves["mxfp4"]
    assert mx["format"]["scaling"]["scale_format"] == "float8_e8m0fnu"
    assert arrays["mxfp4:scale"].dtype == np.uint8  # E8M0 bytes
    assert arrays["nvfp4:scale"].dtype == ml_dtypes.float8_e4m3fn
    assert arrays["nvfp4:tensor_scale"].shape == ()
    assert arrays["uint4:zero_point"].dtype == np.uint8


def test_a_file_of_first_layout_tensors_stays_version_1(tmp_path):
    path = tmp_path / "v1.safetensors"
    precision.save(path, {"w": Tensor(X).to_reduced_precision("int4"), "b": X[0]})
    _, doc = read_file(path)
    assert doc["version"] == 1
    assert set(doc["tensors"][1]) == {
        "name",
        "path",
        "kind",
        "format",
        "scaling",
        "dtype",
        "shape",
        "scale",
    }


def test_a_format_differing_only_in_its_default_scaling_keeps_its_name(tmp_path):
    fmt = dtypes.AsymmetricIntFormat(4, scaling=dtypes.PerBlock(16))
    t = Tensor(X).to_reduced_precision(fmt)
    path = tmp_path / "u.safetensors"
    precision.save(path, {"u": t})
    back = precision.load(path)["u"]
    assert back.format == fmt
    assert back.format.name == "uint4"
    assert back.numpy().tobytes() == t.numpy().tobytes()


def test_docs_example_decodes_mxfp4_and_nvfp4_with_numpy(tmp_path, monkeypatch):
    text = (pathlib.Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    after = text.split("<!-- decode-example -->", 1)[1]
    code = after.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/cli.md", "exec"), {"__name__": "docs_example"})
    assert (tmp_path / "fp4.safetensors").exists()


# -- damaged files ----------------------------------------------------------------------


def _parts(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    doc = json.loads(head["__metadata__"]["precision"])
    return head, doc, bytearray(raw[8 + n :])


def _forge(path, out, mutate):
    """Copy a checkpoint changed by `mutate(head, doc, data)`, every checksum re-sealed."""
    head, doc, data = _parts(path)
    mutate(head, doc, data)
    doc["crc32"] = {
        k: f"{zlib.crc32(data[v['data_offsets'][0] : v['data_offsets'][1]]):08x}"
        for k, v in head.items()
        if k != "__metadata__"
    }
    text = json.dumps(doc["tensors"], separators=(",", ":")).encode()
    doc["tensors_crc32"] = f"{zlib.crc32(text):08x}"
    head["__metadata__"]["precision"] = json.dumps(doc)
    header = json.dumps(head).encode()
    out.write_bytes(struct.pack("<Q", len(header)) + header + bytes(data))


def _set(name, index, value):
    """Set byte `index` of array `name` (negative: from its end)."""

    def mutate(head, doc, data):
        begin, end = head[name]["data_offsets"]
        data[(begin if index >= 0 else end) + index] = value

    return mutate


def _set_f32(name, value):
    def mutate(head, doc, data):
        begin, _ = head[name]["data_offsets"]
        data[begin : begin + 4] = np.float32(value).tobytes()

    return mutate


def _leaf(doc, name):
    return next(t for t in doc["tensors"] if t["name"] == name)


def _edit(name, **changes):
    def mutate(head, doc, data):
        _leaf(doc, name).update(changes)

    return mutate


def _edit_format(name, **changes):
    def mutate(head, doc, data):
        _leaf(doc, name)["format"].update(changes)

    return mutate


def _edit_scaling(name, **changes):
    def mutate(head, doc, data):
        _leaf(doc, name)["scaling"].update(changes)

    return mutate


TINY_BOOK = dtypes.CodebookFormat([-1.0, 0.0, 1.0], name="tiny")  # 2-bit codes, 3 entries

DAMAGED = {
    "e8m0 NaN byte": (_set("mxfp4:scale", 0, 0xFF), "'mxfp4:scale'", "NaN scale (E8M0 byte 0xFF"),
    "e8m0 zero byte": (_set("mxfp4:scale", 0, 0x00), "'mxfp4:scale'", "zero or subnormal scale"),
    "e8m0 overflow": (_set("mxfp4:scale", 0, 0xFE), "'mxfp4:scale'", "overflows float32"),
    "mxint8 subnormal": (_set("mxint8:scale", 0, 0x06), "'mxint8:scale'", "zero or subnormal"),
    "e4m3 NaN scale": (_set("nvfp4:scale", 0, 0x7F), "'nvfp4:scale'", "NaN scale"),
    "e4m3 negative scale": (_set("nvfp4:scale", 0, 0xB8), "'nvfp4:scale'", "negative scale"),
    "tensor scale NaN": (
        _set_f32("nvfp4:tensor_scale", np.nan),
        "'nvfp4:tensor_scale'",
        "infinite or NaN tensor scale",
    ),
    "tensor scale zero": (
        _set_f32("nvfp4:tensor_scale", 0.0),
        "'nvfp4:tensor_scale'",
        "zero or subnormal tensor scale",
    ),
    "tensor scale negative": (
        _set_f32("nvfp4:tensor_scale", -1.0),
        "'nvfp4:tensor_scale'",
        "negative tensor scale",
    ),
    "tensor scale huge": (
        _set_f32("nvfp4:tensor_scale", 1e37),
        "'nvfp4:tensor_scale'",
        "overflow float32",
    ),
    "bf16 scale NaN": (
        lambda h, d, data: [
            _set("int8-bfloat16:scale", i, b)(h, d, data) for i, b in [(0, 0xC0), (1, 0x7F)]
        ],
        "'int8-bfloat16:scale'",
        "infinite or NaN scale",
    ),
    "bf16 scale negative": (
        _set("int8-bfloat16:scale", 1, 0xBF),
        "'int8-bfloat16:scale'",
        "negative scale",
    ),
    "f16 scale zero": (
        lambda h, d, data: [_set("int4-float16:scale", i, 0)(h, d, data) for i in (0, 1)],
        "'int4-float16:scale'",
        "zero or subnormal scale",
    ),
    "f16 pow2 scale off": (
        _set("int8-float16-per-tensor-pow2:scale", 0, 0x01),
        "'int8-float16-per-tensor-pow2:scale'",
        "not a power of two",
    ),
    "zero point past qmax": (
        _set("uint4:zero_point", 0, 16),
        "'uint4:zero_point'",
        "zero point past the largest code, 15",
    ),
    "uint4 padding bits": (_set("uint4-odd", -1, 0xF0), "'uint4-odd'", "padding bits"),
    "code past the table": (_set("tiny", 0, 0xFF), "'tiny'", "codes past the last of its 3"),
    "nf4 padding bits": (_set("nf4-odd", -1, 0xFF), "'nf4-odd'", "padding bits"),
}

BAD_METADATA = {
    "unsorted table": (
        lambda h, d, data: _leaf(d, "tiny")["format"].update(values=[0.0, -1.0, 1.0]),
        "sorted",
    ),
    "integer in table": (
        lambda h, d, data: _leaf(d, "tiny")["format"].update(values=[-1.0, 0, 1.0]),
        "written with a point",
    ),
    "table not float32": (
        lambda h, d, data: _leaf(d, "tiny")["format"].update(values=[-1.0, 0.0, 0.1]),
        "finite float32",
    ),
    "table of one": (
        lambda h, d, data: _leaf(d, "tiny")["format"].update(values=[1.0]),
        "2 to 65536",
    ),
    "table of the wrong length": (
        lambda h, d, data: _leaf(d, "tiny")["format"].update(values=[-2.0, -1.0, 0.0, 1.0, 2.0]),
        "is stored as U8",
    ),
    "nf4 table changed": (
        lambda h, d, data: _leaf(d, "nf4")["format"]["values"].__setitem__(0, -1.5),
        "name of the built-in",
    ),
    "composition element changed": (_edit_format("mxfp4", saturate=True), "name of the built-in"),
    "unknown scale format": (_edit_scaling("mxfp4", scale_format="float7"), "scale_format"),
    "e8m0 without pow2": (_edit_scaling("mxfp4", power_of_two=False), "power_of_two=True"),
    "scale format vs array": (_edit_scaling("int8-float32", scale_format="bfloat16"), "BF16"),
    "tensor scale missing": (_edit("nvfp4", tensor_scale=None), "tensor scale must be stored"),
    "zero point renamed": (_edit("uint4", zero_point="uint4:zp"), "zero points must be stored"),
    "zero point invented": (
        _edit("int8-float32", zero_point="int8-float32:zero_point"),
        "zero points must be absent",
    ),
    "e4m3 scales on ints": (
        _edit_scaling("int8-float32", scale_format="float8_e4m3fn"),
        "two-level",
    ),
    "e8m0 on a code book": (
        lambda h, d, data: _leaf(d, "tiny")["scaling"].update(
            scale_format="float8_e8m0fnu", power_of_two=True
        ),
        "keeps exact group scales",
    ),
    "bad calibration": (_edit_format("uint4", calibration="median"), "calibration"),
    "uint format in version 1": (
        lambda h, d, data: (
            h["__metadata__"].update(precision_version="1"),
            d.update(version=1),
        ),
        "malformed leaf",
    ),
    "version 2 marked 1": (
        lambda h, d, data: h["__metadata__"].update(precision_version="1"),
        "is not the version 1",
    ),
}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small version 2 file holding each new part once."""
    path = tmp_path_factory.mktemp("damaged") / "good.safetensors"
    names = [
        "mxfp4",
        "mxint8",
        "nvfp4",
        "uint4",
        "uint4-odd",
        "nf4",
        "nf4-odd",
        "int8-float32",
        "int8-bfloat16",
        "int4-float16",
        "int8-float16-per-tensor-pow2",
    ]
    tree = {
        n: Tensor.from_encoded(CASES[n][0].encode(CASES[n][2], scaling=CASES[n][1])) for n in names
    }
    tree["tiny"] = Tensor.from_encoded(TINY_BOOK.encode(X[:, :6]))
    precision.save(path, tree)
    return path


def test_the_good_file_loads(small):
    assert len(precision.load(small)) == 12


@pytest.mark.parametrize(("mutate", "entry", "message"), DAMAGED.values(), ids=DAMAGED.keys())
def test_damaged_parts_are_refused(small, tmp_path, mutate, entry, message):
    bad = tmp_path / "bad.safetensors"
    _forge(small, bad, mutate)
    with pytest.raises(CheckpointError) as info:
        precision.load(bad)
    text = str(info.value)
    assert text.startswith(f"{bad}: tensor {entry}"), text
    assert message in text, text


@pytest.mark.parametrize(("mutate", "message"), BAD_METADATA.values(), ids=BAD_METADATA.keys())
def test_damaged_descriptions_are_refused(small, tmp_path, mutate, message):
    bad = tmp_path / "bad.safetensors"
    _forge(small, bad, mutate)
    with pytest.raises(CheckpointError, match=__import__("re").escape(message)) as info:
        precision.load(bad)
    assert str(info.value).startswith(f"{bad}: "), info.value


def test_save_refuses_what_load_would(tmp_path):
    enc = dtypes.get("nvfp4").encode(X)
    forged = dtypes.Encoded(
        enc.data, enc.scale, enc.format, enc.scaling, 64, tensor_scale=np.float32(-1.0)
    )
    with pytest.raises(precision.SaveError, match="negative tensor scale"):
        precision.save(tmp_path / "x.safetensors", {"w": Tensor.from_encoded(forged)})
    assert not (tmp_path / "x.safetensors").exists()
