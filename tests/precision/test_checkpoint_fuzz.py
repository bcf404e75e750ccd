"""A seeded, time-bounded fuzzer of checkpoints: no damaged file loads as other numbers.

Each round takes a checkpoint holding every kind of leaf and damages it one
way: bytes of the header flipped, one JSON field of the header or of the
precision metadata replaced, deleted or added, data bytes changed, the file
cut or extended. After a JSON or data mutation every CRC is recomputed (as a
forger would, most rounds), so what must refuse the file is the validation
of the header and of the encodings' invariants, not the checksums.

The property: `load` raises `CheckpointError` (whose message starts with the
file's path; any other exception fails the test), or it returns

* the original values, bit for bit, when the checksums were not re-sealed;
* when they were, exactly the file's bytes (located by the header's
  offsets) as encodings that a numpy reference finds valid: integer codes
  in their symmetric range, zero padding bits, positive finite normal
  scales (E8M0, e4m3, bfloat16 and float16 ones widened as the layout
  says), a positive normal NVFP4 tensor scale, zero points and code-book
  codes in range, finite scaled values, tf32 on its grid. (A re-sealed file may
  mean other numbers and be consistent: `PerBlock(4)` edited to
  `PerBlock(3)` over 6 columns keeps the scale shape. Only the checksums
  that were not re-sealed can tell; what `load` promises then is never an
  encoding that no encoder writes.)

Budget: a few seconds in `dev`; in `ci` a fixed seed and a fixed number of
rounds (the same 2,000 rounds on every machine, however fast: each of the four
kinds of damage some 300 times or more, in about 10 s); 10 minutes with a random
seed under `HYPOTHESIS_PROFILE=hunt`, the long search. A failure
prints the seed and round to replay (`FUZZ_SEED=... FUZZ_ROUNDS=...`).
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib

import ml_dtypes
import numpy as np
import pytest

import dtypes
import precision
from precision import CheckpointError, Tensor

PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"
)
SECONDS = float(os.environ.get("FUZZ_SECONDS") or {"dev": 8, "ci": 1e9, "hunt": 600}[PROFILE])
ROUNDS = int(os.environ.get("FUZZ_ROUNDS") or (2000 if PROFILE == "ci" else 10**9))
SEED = int(
    os.environ.get("FUZZ_SEED")
    or (int.from_bytes(os.urandom(4), "little") if PROFILE == "hunt" else 20261124)
)


E8M0 = {"power_of_two": True, "scale_format": "float8_e8m0fnu"}


def _tree() -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    encodings = {
        "i8": dtypes.int8.encode(x),
        "i4": dtypes.int4.encode(x[:, :5], scaling=dtypes.PerAxis(0)),
        "i2": dtypes.int2.encode(x, scaling=dtypes.PerBlock(4)),
        "i1": dtypes.int1.encode(x[:, :3]),
        "tf": dtypes.tf32.encode(x),
        "f8": dtypes.float8_e4m3fn.encode(x, scaling=dtypes.PerTensor()),
        "e5": dtypes.float8_e5m2.encode(x),
        "bf": dtypes.bfloat16.encode(x),
        "fp4": dtypes.FloatFormat(2, 1, finite=True).encode(
            x, scaling=dtypes.PerBlock(4, power_of_two=True)
        ),
        "s8": dtypes.int8.encode(np.float32(1.5)),
        # layout version 2: scale formats, tensor scales, zero points, code books
        "mx": dtypes.get("mxfp4").encode(x, scaling=dtypes.PerBlock(4, **E8M0)),
        "mi": dtypes.get("mxint8").encode(x),
        "nv": dtypes.get("nvfp4").encode(x, scaling=dtypes.PerBlock(2, scale_format="e4m3")),
        "u4": dtypes.get("uint4").encode(x[:, :5], scaling=dtypes.PerAxis(0)),
        "u8": dtypes.get("uint8").encode(x, scaling=dtypes.PerBlock(3, scale_format="bf16")),
        "nf": dtypes.get("nf4").encode(x[:, :5]),
        "cb": dtypes.CodebookFormat([-1.0, 0.0, 1.0], name="tiny").encode(x),
        "h8": dtypes.int8.encode(
            x, scaling=dtypes.PerTensor(power_of_two=True, scale_format="f16")
        ),
        "e0": dtypes.ENCODINGS["float8_e8m0fnu"].encode(np.abs(x) + 0.5),
    }
    tree: dict = {k: Tensor.from_encoded(v) for k, v in encodings.items()}
    tree["nested"] = {"list": [np.arange(5, dtype=np.int32), np.float32([0.5, -2.0])]}
    return tree


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "original.safetensors"
    precision.save(path, _tree())
    return path.read_bytes(), _values(precision.load(path, as_arrays=True))


def _values(tree) -> dict:
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tobytes() == b.tobytes()


# -- the file as parts ---------------------------------------------------------------


def _split(raw: bytes):
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    return head, json.loads(head["__metadata__"]["precision"]), bytearray(raw[8 + n :])


def _join(head, doc, data, *, reseal: bool) -> bytes:
    if reseal:
        where = {
            k: v["data_offsets"]
            for k, v in head.items()
            if k != "__metadata__" and isinstance(v, dict) and _offsets_ok(v.get("data_offsets"))
        }
        if isinstance(doc, dict):
            doc["crc32"] = {k: f"{zlib.crc32(data[b:e]):08x}" for k, (b, e) in where.items()}
            if isinstance(doc.get("tensors"), list):
                text = json.dumps(doc["tensors"], separators=(",", ":")).encode()
                doc["tensors_crc32"] = f"{zlib.crc32(text):08x}"
    if isinstance(head.get("__metadata__"), dict):
        head["__metadata__"]["precision"] = json.dumps(doc)
    text = json.dumps(head).encode()
    return struct.pack("<Q", len(text)) + text + bytes(data)


def _offsets_ok(o) -> bool:
    return isinstance(o, list) and len(o) == 2 and all(type(v) is int and v >= 0 for v in o)


# -- mutations ---------------------------------------------------------------------

HOT_INTS = [0, 1, -1, 2, 7, 8, 31, 32, 33, 64, 65, 127, 128, 255, 2**31, 2**32, 2**62, 2**64]
HOT_STRINGS = [
    "",
    "int8",
    "int4",
    "bfloat16",
    "float32",
    "float64",
    "tf32",
    "per-block",
    "per-axis",
    "tensor",
    "array",
    "F32",
    "U8",
    "I8",
    "BF16",
    "key",
    "index",
    "t0",
    "float8_e8m0fnu",
    "float8_e4m3fn",
    "float16",
    "uint",
    "codebook",
    "minmax",
    "nf4",
    "mxfp4",
    "x:scale",
    "x:zero_point",
]


def _random_json(rng, depth=0):
    kind = rng.integers(0, 8 if depth < 2 else 5)
    if kind == 0:
        return int(rng.choice(HOT_INTS)) * int(rng.choice([1, -1]))
    if kind == 1:
        return str(rng.choice(HOT_STRINGS))
    if kind == 2:
        return [None, True, False][int(rng.integers(0, 3))]
    if kind == 3:
        return float(rng.choice([0.5, -1.0, 1e308, 3.0]))
    if kind == 4:
        return int(rng.integers(-3, 40))
    if kind == 5:
        return [_random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    if kind == 6:
        return {str(rng.choice(HOT_STRINGS)): _random_json(rng, depth + 1)}
    return [int(rng.integers(0, 9)) for _ in range(int(rng.integers(0, 70)))]


def _nodes(value, path=()):
    """Every (container, key) in a JSON value, for picking one to mutate."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((value, k))
            out.extend(_nodes(v, (*path, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((value, i))
            out.extend(_nodes(v, (*path, i)))
    return out


def mutate_json(raw: bytes, rng) -> tuple[bytes, bool]:
    head, doc, data = _split(raw)
    root = [head, doc][int(rng.integers(0, 2))]
    nodes = _nodes(root)
    container, key = nodes[int(rng.integers(0, len(nodes)))]
    action = rng.integers(0, 5)
    if action == 0 and isinstance(container, dict):
        del container[key]
    elif action == 1 and isinstance(container, dict):
        container[str(rng.choice(HOT_STRINGS)) + "x"] = _random_json(rng)
    elif (
        action == 2
        and isinstance(container[key], int | float)
        and not isinstance(container[key], bool)
    ):
        container[key] = container[key] + int(rng.choice([-1, 1, 2**32, 2**62]))
    else:
        container[key] = _random_json(rng)
    resealed = rng.random() < 0.85
    return _join(head, doc, data, reseal=resealed), resealed


def mutate_header_bytes(raw: bytes, rng) -> tuple[bytes, bool]:
    (n,) = struct.unpack("<Q", raw[:8])
    out = bytearray(raw)
    for _ in range(int(rng.integers(1, 5))):
        i = int(rng.integers(0, 8 + n)) if rng.random() < 0.97 else int(rng.integers(0, 8))
        out[i] = (out[i] + int(rng.integers(1, 256))) % 256
    return bytes(out), False


def mutate_data(raw: bytes, rng) -> tuple[bytes, bool]:
    head, doc, data = _split(raw)
    for _ in range(int(rng.integers(1, 5))):
        i = int(rng.integers(0, len(data)))
        if rng.random() < 0.5:
            data[i] = int(rng.choice([0x00, 0x08, 0x80, 0x7F, 0xFF, 0x7C, 0x88, 0xAA, 0x02]))
        else:
            data[i] ^= 1 << int(rng.integers(0, 8))
    resealed = rng.random() < 0.9
    return _join(head, doc, data, reseal=resealed), resealed


def mutate_length(raw: bytes, rng) -> tuple[bytes, bool]:
    if rng.random() < 0.5:
        return raw[: int(rng.integers(0, len(raw)))], False
    return raw + bytes(rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8)), False


MUTATIONS = [mutate_json, mutate_json, mutate_header_bytes, mutate_data, mutate_data, mutate_length]


# -- the reference check of a loaded tree whose data changed --------------------------------


SCALE_TYPES = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}
F32_MAX = float(np.finfo(np.float32).max)


def _top(fmt) -> float:
    return float(fmt.qmax if fmt.kind in ("int", "uint") else fmt.max)


def _reference_scales(name: str, enc, stored: dict[str, bytes]) -> None:
    """Scales as the documented layout reads them: positive finite normals (after widening),
    powers of two under power_of_two, the largest code times them finite."""
    fmt, scaling = enc.format, enc.scaling
    scale_format = scaling.scale_format
    raw = np.frombuffer(stored[name + ":scale"], SCALE_TYPES[scale_format])
    assert raw.tobytes() == np.asarray(enc.scale).tobytes(), f"{name}: scales differ"
    scale = raw.astype(np.float64)
    if scale_format == "float8_e8m0fnu" and fmt.kind == "int":
        scale = scale / 64.0  # MXINT8's elements are code / 64
    if scale_format == "float8_e4m3fn":  # two-level: block scales times the tensor scale
        ts = np.frombuffer(stored[name + ":tensor_scale"], np.float32)
        assert ts.tobytes() == np.asarray(enc.tensor_scale).tobytes()
        assert ts[0] >= 2.0**-126, f"{name}: tensor scale {ts} loaded"
        assert ts[0] * 448 * _top(fmt) <= F32_MAX, f"{name}: tensor scale {ts} loaded"
        assert np.all(np.isfinite(scale)), f"{name}: NaN block scale loaded"
        assert not np.any(np.signbit(raw.astype(np.float32))), f"{name}: negative block scale"
        return
    zero_ok = fmt.kind == "int" and fmt.bits == 1
    ok = np.isfinite(scale) & ((scale >= 2.0**-126) | (zero_ok & (scale == 0)))
    ok &= ~np.signbit(scale)
    # An asymmetric group may span -3.4e38 .. 3.4e38: its scale may reach twice float32's
    # largest value over qmax, the end codes decoding clamped (the encoder writes these).
    ok &= scale * _top(fmt) <= F32_MAX * (2 if fmt.kind == "uint" else 1)
    assert ok.all(), f"{name}: scales {scale[~ok][:4]} loaded"
    if scaling.power_of_two:
        mant, _ = np.frexp(scale)
        clamped = scale == float(ml_dtypes.finfo(SCALE_TYPES[scale_format]).max)
        assert np.all((mant == 0.5) | clamped), f"{name}: non power-of-two scales loaded"


def _fields(data: np.ndarray, bits: int, n: int, name: str) -> np.ndarray:
    all_bits = np.unpackbits(data.view(np.uint8), axis=-1, bitorder="little")
    assert not all_bits[..., n * bits :].any(), f"{name}: padding bits loaded"
    fields = all_bits[..., : n * bits].reshape((*all_bits.shape[:-1], n, bits))
    return (fields.astype(np.int64) << np.arange(bits)).sum(-1)


def _reference_valid(name: str, t: Tensor, stored: dict[str, bytes]) -> None:
    enc = t.encoded
    fmt = enc.format
    data = np.asarray(enc.data)
    file_data = stored[name]
    assert data.tobytes() == file_data, f"{name}: loaded bytes differ from the file's"
    if enc.scale is not None:
        _reference_scales(name, enc, stored)
    if enc.zero_point is not None:
        zp = np.frombuffer(stored[name + ":zero_point"], np.uint8)
        assert zp.tobytes() == np.asarray(enc.zero_point).tobytes()
        assert np.all(zp <= fmt.qmax), f"{name}: zero point past {fmt.qmax} loaded"
    n = enc.shape[-1] if enc.shape else 1
    if fmt.kind == "int" and fmt.bits < 8:
        b = fmt.bits
        codes = _fields(data, b, n, name)
        if b > 1:
            codes = np.where(codes >= 2 ** (b - 1), codes - 2**b, codes)
            assert np.all(np.abs(codes) <= fmt.qmax), f"{name}: code out of range loaded"
    elif fmt.kind == "int":
        assert np.all(data.astype(np.int16) >= -127), f"{name}: int8 code -128 loaded"
    elif fmt.kind in ("uint", "codebook") and fmt.bits < 8:
        codes = _fields(data, fmt.bits, n, name)
        if fmt.kind == "codebook":
            assert np.all(codes < len(fmt.values)), f"{name}: code past the table loaded"
    elif fmt.name == "tf32":
        # NaN payloads are kept: tf32's nearest_even encode passes them through.
        off = (data.view(np.uint32) & 0x1FFF).astype(bool) & ~np.isnan(data)
        assert not np.any(off), f"{name}: tf32 off grid loaded"
    if enc.scale is not None and fmt.kind != "int":
        decoded = np.asarray(enc.decode(np.float32))
        assert np.all(np.isfinite(decoded)), f"{name}: scaled encoding decodes to inf/NaN"


def _stored_bytes(raw: bytes) -> dict[str, bytes]:
    """Each tensor's bytes, read from the layout itself (the reference reader)."""
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    start = 8 + n
    return {
        k: raw[start + v["data_offsets"][0] : start + v["data_offsets"][1]]
        for k, v in head.items()
        if k != "__metadata__"
    }


def _foreign(raw: bytes) -> bool:
    """Whether no trace of our metadata is left (the file reads as another writer's)."""
    (n,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8 : 8 + n]).get("__metadata__", {})
    return not any(k.startswith("precision") or v.startswith("{") for k, v in meta.items())


def _check(path, raw, resealed, expected) -> str:
    path.write_bytes(raw)
    try:
        loaded = precision.load(path, as_arrays=not resealed)
    except CheckpointError as exc:
        message = str(exc)
        loaded = None
    if loaded is None:
        assert message.startswith(f"{path}: "), f"message without the path: {message}"
        return "refused"
    if _foreign(raw):
        return "foreign"  # metadata removed whole: any safetensors file may say anything
    if not resealed:
        got = _values(loaded)
        assert got.keys() == expected.keys(), (sorted(got), sorted(expected))
        for k in got:
            assert _same(got[k], expected[k]), f"{k}: other values loaded"
        return "same"
    stored = _stored_bytes(raw)
    import jax

    pairs = jax.tree_util.tree_flatten_with_path(loaded, is_leaf=lambda x: isinstance(x, Tensor))
    for keys, leaf in pairs[0]:
        if isinstance(leaf, Tensor):
            name = ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in keys)
            _reference_valid(name or "tensor", leaf, stored)
    return "valid"


def test_no_damaged_checkpoint_loads_as_other_numbers(tmp_path, original):
    raw, expected = original
    rng = np.random.default_rng(SEED)
    path = tmp_path / "fuzzed.safetensors"
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + SECONDS
    rounds = 0
    while time.monotonic() < deadline and rounds < ROUNDS:
        rounds += 1
        mutation = MUTATIONS[int(rng.integers(0, len(MUTATIONS)))]
        state = rng.bit_generator.state
        mutated, resealed = mutation(raw, rng)
        try:
            outcome = _check(path, mutated, resealed, expected)
        except Exception as exc:
            raise AssertionError(
                f"round {rounds} ({mutation.__name__}, FUZZ_SEED={SEED}, rng state "
                f"{state['state']['state']}): {type(exc).__name__}: {exc}"
            ) from exc
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # The fuzzer must really exercise both sides in the time it had.
    assert rounds >= 20
    assert outcomes.get("refused", 0) > rounds // 4, outcomes
