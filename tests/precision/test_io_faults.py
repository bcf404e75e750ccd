"""Checkpoints never lose data and never return wrong numbers.

Failures mid-write (an injected exception, a SIGKILLed `precision convert`)
leave the destination absent or as it was and the input unchanged; damaged
files (truncated at every eighth, hand-made bad headers, random header
corruption driven by hypothesis, flipped data bytes) raise CheckpointError.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib

import jax
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given
from hypothesis import strategies as st

import dtypes
import precision
from precision import CheckpointError, Tensor
from precision._checkpoint import _invariants, _io, _layout, _leaves, _names
from precision._checkpoint._reader import Reader
from precision._cli import _main as _cli
from precision._errors import SaveError

RNG = np.random.default_rng(7)


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def make_tree(n: int = 6) -> dict:
    """Tensors in several formats and scalings, plus a plain integer array."""
    x = RNG.standard_normal((n, 8, 24)).astype(np.float32)
    fmts = [
        (dtypes.int4, dtypes.PerAxis(0)),
        (dtypes.float8_e4m3fn, None),
        (dtypes.int8, dtypes.PerBlock(16)),
        (dtypes.bfloat16, None),
        (dtypes.int1, None),
        (dtypes.FloatFormat(2, 1, finite=True), dtypes.PerBlock(8, power_of_two=True)),
    ]
    tree = {
        f"t{i}": Tensor.from_encoded(fmt.encode(x[i], scaling=scaling))
        for i, (fmt, scaling) in enumerate(fmts[:n])
    }
    tree["steps"] = np.arange(3, dtype=np.int32)
    return tree


def storage(tree) -> dict:
    """Every stored byte of a loaded tree, for exact comparison."""
    out = {}
    for name, leaf in tree.items():
        if isinstance(leaf, Tensor):
            enc = leaf.encoded
            scale = None if enc.scale is None else np.asarray(enc.scale).tobytes()
            out[name] = (enc.format, enc.scaling, enc.shape, np.asarray(enc.data).tobytes(), scale)
        else:
            out[name] = np.asarray(leaf).tobytes()
    return out


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "good.safetensors"
    tree = make_tree()
    precision.save(path, tree)
    return path, storage(precision.load(path))


# --------------------------------------------------------------------------
# failures while writing


class FailingCrc:
    """Stands in for zlib in precision._io: the n-th checksum raises `exc`."""

    def __init__(self, n: int, exc: BaseException):
        self.calls, self.n, self.exc = 0, n, exc

    def crc32(self, data, value=0) -> int:
        self.calls += 1
        if self.calls > self.n:
            raise self.exc
        return zlib.crc32(data, value)


def test_exception_half_way_leaves_no_file(tmp_path, monkeypatch):
    tree = make_tree()
    n = sum(len(spec.arrays()) for spec, _ in _leaves.flatten(tree))
    fake = FailingCrc(n // 2, RuntimeError("injected failure"))
    monkeypatch.setattr(_io, "zlib", fake)
    with pytest.raises(RuntimeError, match="injected failure"):
        precision.save(tmp_path / "new.safetensors", tree)
    assert fake.calls == n // 2 + 1  # it really failed half way through the tensors
    assert os.listdir(tmp_path) == []


def test_exception_half_way_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    precision.save(path, make_tree())
    before = sha256(path)
    tree = make_tree()
    monkeypatch.setattr(_io, "zlib", FailingCrc(3, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        precision.save(path, tree, overwrite=True)
    assert sha256(path) == before
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    monkeypatch.undo()
    precision.load(path)  # still a complete, valid checkpoint


def test_convert_failing_half_way_keeps_output_and_input(tmp_path, monkeypatch, capsys):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    precision.save(
        src, {f"w{i}": RNG.standard_normal((4, 16)).astype(np.float32) for i in range(6)}
    )
    precision.save(dst, {"old": np.ones(2, np.float32)})
    before_in, before_out = sha256(src), sha256(dst)
    fake = FailingCrc(3, OSError(errno.ENOSPC, "No space left on device"))
    monkeypatch.setattr(_io, "zlib", fake)
    rc = _cli.main(["convert", str(src), "-o", str(dst), "--to", "int8", "--overwrite", "-q"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.count("\n") == 1
    assert f"cannot write {dst}: the disk is full; free space on it" in err  # path and fix
    assert "Traceback" not in err
    assert fake.calls == 4
    assert (sha256(src), sha256(dst)) == (before_in, before_out)
    assert sorted(os.listdir(tmp_path)) == ["in.safetensors", "out.safetensors"]


def test_a_full_disk_in_save_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    dst = tmp_path / "model.safetensors"
    precision.save(dst, {"old": np.ones(2, np.float32)})
    before = sha256(dst)
    monkeypatch.setattr(_io, "zlib", FailingCrc(2, OSError(errno.ENOSPC, "No space left")))
    with pytest.raises(OSError, match=f"cannot write {dst}: the disk is full"):
        precision.save(dst, {f"w{i}": np.ones((4, 16), np.float32) for i in range(4)},
                       overwrite=True)  # fmt: skip
    assert sha256(dst) == before
    assert os.listdir(tmp_path) == ["model.safetensors"]


def test_an_nvfp4_block_of_zeros_keeps_its_zero_scale_through_a_file(tmp_path):
    x = np.linspace(-3, 3, 4 * 64, dtype=np.float32).reshape(4, 64)
    x[1, 16:32] = 0.0  # one block of zeros: its e4m3 scale is 0, which the encoder writes
    t = Tensor(x).to_reduced_precision("nvfp4")
    assert float(np.asarray(t.encoded.scale, np.float32)[1, 1]) == 0.0
    precision.save(tmp_path / "nv.safetensors", {"t": t})
    back = precision.load(tmp_path / "nv.safetensors")["t"]
    assert np.array_equal(back.numpy().view(np.uint32), t.numpy().view(np.uint32))
    assert np.all(back.numpy()[1, 16:32] == 0)


def _writing_fd(pid: int, directory: str) -> bool:
    """Whether process `pid` has a non-empty file open in `directory` (its temp output)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith(directory + "/") and "in.safetensors" not in target:
                if os.stat(f"/proc/{pid}/fd/{fd}").st_size > 0:
                    return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize("existing", [False, True], ids=["fresh", "replacing"])
def test_sigkill_during_convert(tmp_path, existing):
    # Distinct shapes: each tensor compiles its own conversion, so the write
    # takes long enough to be caught in the middle.
    arrays = {f"layer{i}": RNG.standard_normal((64 + i, 512)).astype(np.float32) for i in range(24)}
    for attempt in range(5):
        d = tmp_path / f"attempt{attempt}"
        d.mkdir()
        src, dst = d / "in.safetensors", d / "out.safetensors"
        safetensors.numpy.save_file(arrays, str(src))  # an independent writer
        if existing:
            precision.save(dst, {"previous": np.arange(5, dtype=np.float32)})
        before_in = sha256(src)
        before_out = sha256(dst) if existing else None
        listing = sorted(os.listdir(d))
        cmd = [sys.executable, "-m", "precision", "convert", str(src), "-o", str(dst)]
        proc = subprocess.Popen(
            [*cmd, "--to", "int8", "--overwrite", "-q"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        try:
            while not _writing_fd(proc.pid, str(d)):
                assert proc.poll() is None, f"convert ended before it was caught writing: {proc}"
                assert time.monotonic() < deadline, "convert never started writing"
                time.sleep(0.005)
            # Frozen, then checked: a convert that put its output in place between the
            # look and the signal was not caught writing, and is tried again.
            proc.send_signal(signal.SIGSTOP)
            finished = (sha256(dst) != before_out) if existing else dst.exists()
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
            proc.stderr.close()
        if finished:
            continue
        assert proc.returncode == -signal.SIGKILL
        assert sha256(src) == before_in
        if existing:
            assert sha256(dst) == before_out
            precision.load(dst)
        else:
            assert not dst.exists()
        assert sorted(os.listdir(d)) == listing  # no partial file left behind
        return
    pytest.fail("convert was never caught while writing (its output was in place each time)")


def _unwritable_dir() -> str:
    """A directory where creating a file fails even for root (or a chmod'ed one otherwise)."""
    if os.geteuid() != 0:
        d = tempfile.mkdtemp()
        os.chmod(d, 0o555)
        return d
    return "/sys/kernel"  # sysfs: root cannot create files there


def _can_create_files(directory: str) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def test_unwritable_destination_gives_a_clear_error(tmp_path, capsys):
    directory = _unwritable_dir()
    assert not _can_create_files(directory)  # the premise, checked
    dst = os.path.join(directory, "out.safetensors")
    with pytest.raises(OSError, match=rf"cannot write {dst}: no file can be created in"):
        precision.save(dst, {"a": np.ones(3, np.float32)})
    src = tmp_path / "in.safetensors"
    precision.save(src, {"a": np.ones(3, np.float32)})
    assert _cli.main(["convert", str(src), "-o", dst, "--to", "bf16"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"precision: error: [Errno {errno.EACCES}] cannot write {dst}")
    assert err.count("\n") == 1


def test_destination_under_a_file_gives_a_clear_error(tmp_path):
    (tmp_path / "plain").write_text("not a directory")
    dst = tmp_path / "plain" / "out.safetensors"
    with pytest.raises(NotADirectoryError, match=r"cannot write .*plain/out.safetensors"):
        precision.save(dst, {"a": np.ones(3, np.float32)})


# --------------------------------------------------------------------------
# damaged files


@pytest.mark.parametrize("eighth", range(8))
@pytest.mark.parametrize("kind", ["ours", "foreign"])
def test_truncated_files(tmp_path, good_file, eighth, kind):
    if kind == "ours":
        raw = good_file[0].read_bytes()
    else:
        path = tmp_path / "f.safetensors"
        safetensors.numpy.save_file({"a": np.ones((16, 16), np.float32), "b": np.zeros(9)}, path)
        raw = path.read_bytes()
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(raw[: len(raw) * eighth // 8])
    with pytest.raises(CheckpointError, match=str(bad)):
        precision.load(bad)


def raw_file(header: dict | bytes, data: bytes = b"") -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


BAD_FILES = {
    "empty": (b"", "shorter than the 8-byte header length"),
    "huge header": (struct.pack("<Q", 2**40) + b"{}", "exceeds the 104857600-byte limit"),
    "header past the end": (struct.pack("<Q", 100) + b"{}", "truncated: the header claims 100"),
    "not json": (raw_file(b"{hello}"), "not valid JSON"),
    "not an object": (raw_file(b"[1, 2]"), "does not start with '{'"),
    "binary junk": (raw_file(b"\xff\xfe\x00"), "not valid JSON"),
    "duplicate key": (
        raw_file(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{}}', b"x"),
        "duplicate key 'a'",
    ),
    "NaN constant": (raw_file(b'{"a": NaN}'), "NaN is not allowed"),
    "unknown dtype": (raw_file({"a": entry("F4", [2], 0, 1)}, b"x"), "unsupported dtype 'F4'"),
    "negative shape": (raw_file({"a": entry("U8", [-1], 0, 0)}), "is not a list of sizes"),
    "bad offsets": (raw_file({"a": entry("U8", [1], 1, 0)}, b"x"), "is not [begin, end]"),
    "shape vs bytes": (raw_file({"a": entry("F32", [3], 0, 8)}, b"x" * 8), "needs 12 bytes"),
    "absurd shape": (
        raw_file({"a": entry("F64", [2**40, 2**40], 0, 8)}, b"x" * 8),
        "exceeds the limit of 2**48 elements",
    ),
    "dtype a list": (raw_file({"a": entry(["F32"], [1], 0, 4)}, b"x" * 4), "unsupported dtype"),
    "dtype an object": (
        raw_file({"a": entry({"F32": 1}, [1], 0, 4)}, b"x" * 4),  # type: ignore[arg-type]
        "unsupported dtype",
    ),
    "zero-size with a 2**62 dimension": (
        raw_file({"a": entry("U8", [2**62, 0], 0, 0)}),
        "exceeds the limit of 2**48 elements",
    ),
    "rank 65": (raw_file({"a": entry("U8", [1] * 65, 0, 1)}, b"x"), "more than the limit of 32"),
    "rank 33": (raw_file({"a": entry("U8", [1] * 33, 0, 1)}, b"x"), "more than the limit of 32"),
    "name too long": (
        raw_file({"n" * 5000: entry("U8", [1], 0, 1)}, b"x"),
        "5000 characters, more than the limit of 4096",
    ),
    "too many zero-size entries": (
        raw_file({f"t{i}": entry("U8", [0], 0, 0) for i in range(70_000)}),
        "declares 70000 tensors, more than the limit of 65536",
    ),
    "too many JSON values": (
        raw_file(b'{"a": {"dtype": "U8", "shape": [' + b"1," * (1 << 23) + b'1], "x": 1}}'),
        "JSON values, more than the limit of 8388608",
    ),
    "gap": (
        raw_file({"a": entry("U8", [1], 0, 1), "b": entry("U8", [1], 2, 3)}, b"xyz"),
        "leaves a gap",
    ),
    "overlap": (
        raw_file({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}, b"xyz"),
        "overlaps the previous tensor",
    ),
    "trailing bytes": (raw_file({"a": entry("U8", [1], 0, 1)}, b"xy"), "1 bytes after the last"),
    "data missing": (raw_file({"a": entry("U8", [4], 0, 4)}, b"xy"), "truncated: the header"),
    "metadata not strings": (raw_file({"__metadata__": {"a": 1}}), "must map strings to strings"),
    "entry not an object": (raw_file({"a": [1, 2]}), "expected an object with dtype"),
}


@pytest.mark.parametrize(("raw", "message"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_headers(tmp_path, raw, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    with pytest.raises(CheckpointError, match=f"^{path}: .*{__import__('re').escape(message)}"):
        precision.load(path)


def test_a_header_of_many_entries_is_refused_quickly(tmp_path):
    # 1.6M zero-size entries once took minutes and gigabytes; now the bytes
    # are counted before json builds anything.
    one = b'"t%d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},'
    body = b"{" + b"".join(one % i for i in range(1_600_000))[:-1] + b"}"
    path = tmp_path / "many.safetensors"
    path.write_bytes(raw_file(body))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=f"^{path}: .*more than the limit"):
        precision.load(path)
    assert time.perf_counter() - start < 5


def test_a_sparse_file_declaring_more_than_memory_is_refused_before_allocation(tmp_path):
    nbytes = 1 << 40  # a terabyte of holes: more than any test machine's memory
    header = json.dumps({"a": entry("U8", [nbytes], 0, nbytes)}).encode()
    path = tmp_path / "sparse.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + nbytes)
    with pytest.raises(CheckpointError, match=f"^{path}: its tensors need 1024.0 GiB"):
        precision.load(path)
    with Reader(path) as reader, pytest.raises(CheckpointError, match=f"declares {nbytes} bytes"):
        reader.read("a")  # one tensor read alone (convert, report)


def rewrite(src, dst, mutate) -> None:
    """Copy a checkpoint with its header (and precision metadata) changed by `mutate`."""
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    doc = json.loads(head["__metadata__"]["precision"])
    mutate(head, doc)
    # Keep the metadata checksum consistent, as a careless writer would: the
    # checks below must catch the inconsistency itself.
    doc["tensors_crc32"] = _io._tensors_crc(doc["tensors"])
    head["__metadata__"]["precision"] = json.dumps(doc)
    dst.write_bytes(raw_file(head, raw[8 + n :]))


def _leaf(doc, name):
    return next(t for t in doc["tensors"] if t["name"] == name)


BAD_METADATA = {
    "unknown format": (lambda h, d: _leaf(d, "t0").update(format="float7"), "unknown format"),
    "unknown version": (lambda h, d: d.update(version=4), "version 4 is not the version 1"),
    "version 2 marked 1": (lambda h, d: d.update(version=2), "version 2 is not the version 1"),
    "newer version": (
        lambda h, d: (h["__metadata__"].update(precision_version="4"), d.update(version=4)),
        "layout version 4, newer than this library reads (1, 2, 3); upgrade precision",
    ),
    "format vs container": (
        lambda h, d: _leaf(d, "t0").update(format="int8"),
        "is stored as U8[8, 12] but its format int8",
    ),
    "logical shape": (
        lambda h, d: _leaf(d, "t3").update(shape=[8, 25]),
        "needs BF16[8, 25]",
    ),
    "scaling vs scale": (
        lambda h, d: _leaf(d, "t0").update(
            scaling={"type": "per-axis", "axis": 1, "power_of_two": False}
        ),
        "needs F32[1, 24]",
    ),
    "scale dropped": (
        lambda h, d: _leaf(d, "t0").update(scale=None),
        "its scales must be stored as 't0:scale'",
    ),
    "undescribed tensor": (
        lambda h, d: d["tensors"].remove(_leaf(d, "steps")),
        "present but undescribed ['steps']",
    ),
    "bad custom format": (
        lambda h, d: _leaf(d, "t5")["format"].update(exponent_bits=12),
        "is not supported",
    ),
    "bad crc": (lambda h, d: d["crc32"].update(t0="zz"), "crc32 map is malformed"),
    "logical dtype a list": (
        lambda h, d: _leaf(d, "t1").update(dtype=["float32"]),
        "must be strings",
    ),
    "kind an object": (lambda h, d: _leaf(d, "t1").update(kind={"a": 1}), "must be strings"),
    "scaling type a list": (
        lambda h, d: _leaf(d, "t0")["scaling"].update(type=["per-axis"]),
        "unknown scaling type",
    ),
    "per-block size 2**64": (
        lambda h, d: _leaf(d, "t2")["scaling"].update(size=2**64),
        "'size' = 18446744073709551616 is out of range",
    ),
    "per-block padding past the limit": (
        lambda h, d: _leaf(d, "t2")["scaling"].update(size=2**47),
        "pads axis 1 of [8, 24] beyond the limit",
    ),
    "int1 power of two": (
        lambda h, d: _leaf(d, "t4").update(scaling={"type": "per-tensor", "power_of_two": True}),
        "no power-of-two variant",
    ),
    "custom int8 named bfloat16": (
        lambda h, d: _leaf(d, "t2").update(format={"kind": "int", "bits": 8, "name": "bfloat16"}),
        "the name of the built-in",
    ),
    "custom float named int4": (
        lambda h, d: _leaf(d, "t5")["format"].update(name="int4"),
        "the name of the built-in",
    ),
    "scaled bfloat16": (
        lambda h, d: _leaf(d, "t3").update(
            scaling={"type": "per-tensor", "power_of_two": False}, scale="t3:scale"
        ),
        "never scaled",
    ),
    "path too deep": (
        lambda h, d: _leaf(d, "t1").update(path=[["key", "t1"]] * 300),
        "bad key path",
    ),
    "wrong crc": (lambda h, d: d["crc32"].update(t1="00000000"), "do not match the CRC-32"),
    "float64 without x64": (
        lambda h, d: _leaf(d, "t1").update(dtype="float64"),
        "enable 64-bit JAX",
    ),
    "path vs name": (
        lambda h, d: _leaf(d, "t1").update(path=[["key", "t0"], ["key", "x"]]),
        "does not give the name 't1'",
    ),
    "paths not a tree": (
        lambda h, d: (
            h.update({"t0.x": h.pop("t1")}),
            _leaf(d, "t1").update(name="t0.x", path=[["key", "t0"], ["key", "x"]]),
            d["crc32"].update({"t0.x": d["crc32"].pop("t1")}),
        ),
        "do not form a tree",
    ),
    "int without scaling": (
        lambda h, d: (
            _leaf(d, "t4").update(scaling=None, scale=None),
            d["tensors"].append(
                {
                    "name": "t4:scale",
                    "path": [["key", "s"]],
                    "kind": "array",
                    "format": None,
                    "scaling": None,
                    "dtype": "float32",
                    "shape": [8, 1],
                    "scale": None,
                }
            ),
        ),
        "int1 codes need a scaling",
    ),
}


@pytest.mark.parametrize(("mutate", "message"), BAD_METADATA.values(), ids=BAD_METADATA.keys())
def test_inconsistent_metadata(tmp_path, good_file, mutate, message):
    path = tmp_path / "bad.safetensors"
    rewrite(good_file[0], path, mutate)
    with pytest.raises(CheckpointError, match=__import__("re").escape(message)):
        precision.load(path)


@pytest.mark.parametrize("key", ["precision", "precision_version"])
def test_damaged_metadata_key_does_not_pass_as_foreign(tmp_path, good_file, key):
    raw = good_file[0].read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    head["__metadata__"]["pre" + key[3:].upper()] = head["__metadata__"].pop(key)
    bad = tmp_path / "renamed.safetensors"
    bad.write_bytes(raw_file(head, raw[8 + n :]))
    with pytest.raises(CheckpointError, match="the precision metadata is damaged"):
        precision.load(bad)


def test_metadata_edited_without_its_checksum(tmp_path, good_file):
    raw = good_file[0].read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    doc = json.loads(head["__metadata__"]["precision"])
    # PerBlock(16) -> PerBlock(12) keeps the scale shape of a 24-wide tensor:
    # only the checksum of the metadata can tell.
    _leaf(doc, "t2")["scaling"]["size"] = 12
    head["__metadata__"]["precision"] = json.dumps(doc)
    bad = tmp_path / "edited.safetensors"
    bad.write_bytes(raw_file(head, raw[8 + n :]))
    with pytest.raises(CheckpointError, match="does not match its CRC-32"):
        precision.load(bad)


def test_flipped_data_byte_is_caught_by_the_crc(tmp_path, good_file):
    raw = bytearray(good_file[0].read_bytes())
    raw[-40] ^= 0x10
    bad = tmp_path / "flipped.safetensors"
    bad.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="do not match the CRC-32"):
        precision.load(bad)


_SCRATCH = tempfile.mkdtemp(prefix="precision-corrupt-")


@given(data=st.data())
def test_random_header_corruption(good_file, data):
    path, expected = good_file
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    for _ in range(data.draw(st.integers(1, 4), label="bytes corrupted")):
        i = data.draw(st.integers(0, 8 + n - 1), label="position")
        raw[i] = data.draw(st.integers(0, 255).filter(lambda b, i=i: b != raw[i]), label="byte")
    bad = os.path.join(_SCRATCH, "corrupt.safetensors")
    with open(bad, "wb") as f:
        f.write(raw)
    try:
        loaded = precision.load(bad)
    except CheckpointError:
        return
    # A corruption the format cannot see (JSON whitespace, say) must not
    # change a single stored byte.
    assert storage(loaded) == expected


# --------------------------------------------------------------------------
# files consistent with themselves (CRCs re-sealed) holding impossible encodings


def reseal(src, dst, mutate_data=None, mutate=None) -> None:
    """Copy a checkpoint with its data and/or metadata changed and every CRC recomputed.

    `mutate_data(data, where)` edits the data bytes in place (`where[name]` is
    the (begin, end) of each tensor); `mutate(head, doc)` edits the header.
    Every checksum is then made to match again, as a forger would: what
    remains to refuse the file is the check of the encodings' invariants.
    """
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8 : 8 + n])
    data = bytearray(raw[8 + n :])
    doc = json.loads(head["__metadata__"]["precision"])
    where = {k: tuple(v["data_offsets"]) for k, v in head.items() if k != "__metadata__"}
    if mutate_data is not None:
        mutate_data(data, where)
    if mutate is not None:
        mutate(head, doc)
    doc["crc32"] = {k: f"{zlib.crc32(data[b:e]):08x}" for k, (b, e) in where.items()}
    doc["tensors_crc32"] = _io._tensors_crc(doc["tensors"])
    head["__metadata__"]["precision"] = json.dumps(doc)
    dst.write_bytes(raw_file(head, bytes(data)))


def _set(name, offset, value, size=1):
    def mutate(data, where):
        begin = where[name][0]
        data[begin + offset : begin + offset + size] = value.to_bytes(size, "little")

    return mutate


def _set_f32(name, index, value):
    def mutate(data, where):
        begin = where[name][0] + 4 * index
        data[begin : begin + 4] = struct.pack("<f", value)

    return mutate


@pytest.fixture(scope="module")
def invariant_file(tmp_path_factory):
    """One tensor of each kind whose invariants the tests below break, by name."""
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    enc = {
        "i8": dtypes.int8.encode(x),
        "i4": dtypes.int4.encode(x, scaling=dtypes.PerAxis(0)),
        "i2": dtypes.int2.encode(x),
        "i1": dtypes.int1.encode(x),
        "tf": dtypes.tf32.encode(x),
        "f8": dtypes.float8_e4m3fn.encode(x, scaling=dtypes.PerTensor()),
        "e5": dtypes.float8_e5m2.encode(x, scaling=dtypes.PerTensor()),
        "mx": dtypes.int8.encode(x, scaling=dtypes.PerBlock(2, power_of_two=True)),
    }
    tree = {k: Tensor.from_encoded(v) for k, v in enc.items()}
    path = tmp_path_factory.mktemp("inv") / "inv.safetensors"
    precision.save(path, tree)
    return path


FORGED = {
    "int8 code -128": (_set("i8", 3, 0x80), "holds the code -128"),
    "int4 code -8": (_set("i4", 0, 0x08 | 0x10), "holds the code -8"),
    "int2 code -2": (_set("i2", 0, 0b10), "holds the code -2"),
    "int4 padding bits": (_set("i4", 2, 0x50), "nonzero padding bits"),  # 5 codes: bits 4..7 pad
    "int2 padding bits": (_set("i2", 1, 0b0100_0000), "nonzero padding bits"),
    "int1 padding bits": (_set("i1", 0, 0b1010_0000), "nonzero padding bits"),
    "tf32 off its grid": (_set("tf", 0, 0x3F80_0001, 4), "off tf32's grid"),
    "NaN scale": (_set_f32("i8:scale", 0, float("nan")), "infinite or NaN scale"),
    "inf scale": (_set_f32("i8:scale", 0, float("inf")), "infinite or NaN scale"),
    "zero scale": (_set_f32("i8:scale", 0, 0.0), "zero or subnormal scale"),
    "subnormal scale": (_set_f32("i8:scale", 0, 1e-40), "zero or subnormal scale"),
    "negative scale": (_set_f32("i4:scale", 1, -0.5), "negative scale"),
    "negative zero int1 scale": (_set_f32("i1:scale", 0, -0.0), "negative scale"),
    "power of two violated": (_set_f32("mx:scale", 2, 3.0), "not a power of two"),
    "scaled e4m3fn NaN code": (_set("f8", 0, 0x7F), "inf or NaN codes under a scaling"),
    "scaled e5m2 inf code": (_set("e5", 0, 0x7C), "inf or NaN codes under a scaling"),
}


@pytest.mark.parametrize(("mutate_data", "message"), FORGED.values(), ids=FORGED.keys())
def test_impossible_encodings_are_refused(tmp_path, invariant_file, mutate_data, message):
    path = tmp_path / "forged.safetensors"
    reseal(invariant_file, path, mutate_data)
    with pytest.raises(CheckpointError, match=f"^{path}: tensor .*{re.escape(message)}"):
        precision.load(path)


@pytest.fixture(scope="module")
def layered_file(tmp_path_factory):
    """Layout 3: an NVFP4 stack with a tensor scale per layer, beside a plain NVFP4 one."""
    w = RNG.standard_normal((3, 4, 32)).astype(np.float32)
    nv = Tensor(w).to_reduced_precision("nvfp4")
    path = tmp_path_factory.mktemp("v3") / "layered.safetensors"
    precision.save(path, {"one": nv, "per": precision.scales_per_layer(nv)})
    return path


def _ts_shape(name, shape):
    return lambda h, d: _leaf(d, name).update(tensor_scale_shape=shape)


LAYERED = {
    "shape of another rank": (_ts_shape("per", [3]), "does not fit its shape [3, 4, 32]"),
    "shape of another length": (_ts_shape("per", [2, 1, 1]), "does not fit its shape"),
    "shape not a list": (_ts_shape("per", "3,1,1"), "does not fit its shape"),
    "shape of bools": (_ts_shape("per", [3, True, 1]), "does not fit its shape"),
    "no shape for a tensor scale": (_ts_shape("one", None), "needs a tensor_scale_shape"),
    "header disagrees": (_ts_shape("one", [3, 1, 1]), "'one:tensor_scale' is stored as F32[]"),
    "key missing": (lambda h, d: _leaf(d, "per").pop("tensor_scale_shape"), "malformed leaf"),
}


@pytest.mark.parametrize(("mutate", "message"), LAYERED.values(), ids=LAYERED.keys())
def test_a_tensor_scale_shape_that_does_not_fit_is_refused(tmp_path, layered_file, mutate, message):
    path = tmp_path / "bad.safetensors"
    rewrite(layered_file, path, mutate)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        precision.load(path)


def test_each_layer_tensor_scale_is_checked(tmp_path, layered_file):
    back = precision.load(layered_file)
    assert back["per"].encoded.tensor_scale.shape == (3, 1, 1)
    assert back["one"].encoded.tensor_scale.shape == ()
    path = tmp_path / "forged.safetensors"
    reseal(layered_file, path, _set_f32("per:tensor_scale", 2, -1.0))  # the last layer's
    with pytest.raises(CheckpointError, match="negative tensor scale"):
        precision.load(path)


def test_resealing_alone_changes_nothing(tmp_path, invariant_file):
    path = tmp_path / "same.safetensors"
    reseal(invariant_file, path)
    assert storage(precision.load(path)) == storage(precision.load(invariant_file))


def test_an_all_zero_int1_group_keeps_its_zero_scale(tmp_path):
    # int1's scale is mean(|x|): 0 for an all-zero group, a value load accepts.
    t = Tensor(np.zeros((2, 9), np.float32)).to_reduced_precision("int1")
    path = tmp_path / "zeros.safetensors"
    precision.save(path, {"t": t})
    back = precision.load(path, as_arrays=True)["t"]
    np.testing.assert_array_equal(np.asarray(back), np.zeros((2, 9), np.float32))


def test_save_refuses_what_load_would_refuse(tmp_path):
    x = np.float32([[1.0, np.nan, 2.0]])
    # Under jit a NaN input makes its group's scale NaN instead of raising.
    enc = jax.jit(lambda v: dtypes.int8.encode(v))(x)
    with pytest.raises(SaveError, match="infinite or NaN scale") as info:
        precision.save(tmp_path / "nan.safetensors", {"w": Tensor.from_encoded(enc)})
    assert isinstance(info.value, ValueError)
    assert "to_reduced_precision" in str(info.value)
    assert not (tmp_path / "nan.safetensors").exists()
    impostor = dtypes.FloatFormat(5, 2, name="int8")
    with pytest.raises(SaveError, match="'int8', which is the built-in"):
        precision.save(tmp_path / "x.safetensors", {"w": Tensor.from_encoded(impostor.encode(x))})


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"n" * 5000: np.zeros(1)}, "more than the limit of 4096"),
        ({"a": np.zeros((1,) * 33, np.uint8)}, "more than the limit of 32"),
    ],
    ids=["long name", "rank 33"],
)
def test_save_refuses_trees_beyond_the_limits(tmp_path, tree, message):
    with pytest.raises(SaveError, match=message):
        precision.save(tmp_path / "x.safetensors", tree)


# --------------------------------------------------------------------------
# the file itself: mode, exclusive creation, leftovers, the overwrite flag

from precision._checkpoint import _atomic_file  # noqa: E402

PATHS = ["unnamed", "named"]  # O_TMPFILE where the filesystem has it, and the fallback


@pytest.fixture(params=PATHS)
def temp_kind(request, monkeypatch):
    if request.param == "named":
        monkeypatch.setattr(_atomic_file._TempFile, "_open_unnamed", lambda self: None)
    return request.param


def test_an_interrupt_while_probing_unnamed_files_leaves_no_probe(tmp_path, monkeypatch):
    # The first save on a filesystem names an unnamed file once to see if it can; a
    # Ctrl-C right after that link (before its removal) must not leave the name behind.
    if not hasattr(os, "O_TMPFILE"):
        pytest.skip("no unnamed files here")
    monkeypatch.setattr(_atomic_file, "_LINKABLE", {})
    link = _atomic_file._link_fd

    def link_then_interrupt(fd, name):
        link(fd, name)
        raise KeyboardInterrupt

    monkeypatch.setattr(_atomic_file, "_link_fd", link_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        precision.save(tmp_path / "new.safetensors", {"a": np.ones(3)})
    assert os.listdir(tmp_path) == []


def test_replacing_a_file_keeps_its_mode(tmp_path, temp_kind):
    path = tmp_path / "private.safetensors"
    precision.save(path, {"a": np.ones(3)})
    os.chmod(path, 0o600)
    precision.save(path, {"a": np.zeros(3)}, overwrite=True)
    assert os.stat(path).st_mode & 0o7777 == 0o600
    np.testing.assert_array_equal(np.asarray(precision.load(path)["a"]), np.zeros(3))


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o027])
def test_a_new_file_honours_the_umask(tmp_path, temp_kind, umask):
    old = os.umask(umask)
    try:
        precision.save(tmp_path / "new.safetensors", {"a": np.ones(3)})
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "new.safetensors").st_mode & 0o7777 == 0o666 & ~umask


def test_overwrite_false_is_an_exclusive_create(tmp_path, temp_kind, monkeypatch):
    # Another saver creates the file after our existence check and before our
    # commit: ours must fail, and theirs must survive untouched.
    path = tmp_path / "race.safetensors"
    commit = _atomic_file._TempFile.commit

    def racing_commit(self):
        path.write_bytes(b"the other saver's file")
        commit(self)

    monkeypatch.setattr(_atomic_file._TempFile, "commit", racing_commit)
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        precision.save(path, {"a": np.ones(3)})
    assert path.read_bytes() == b"the other saver's file"
    assert sorted(os.listdir(tmp_path)) == ["race.safetensors"]  # no temporary left


@pytest.mark.parametrize("flag", ["no", "yes", 0, 1, None])
def test_overwrite_must_be_a_bool(tmp_path, flag):
    path = tmp_path / "keep.safetensors"
    precision.save(path, {"a": np.ones(3)})
    before = path.read_bytes()
    with pytest.raises((TypeError, FileExistsError)) as info:
        precision.save(path, {"a": np.zeros(3)}, overwrite=flag)
    if isinstance(info.value, TypeError):
        assert isinstance(info.value, precision.PrecisionError)
        assert f"got {type(flag).__name__} {flag!r}" in str(info.value)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["keep.safetensors"]


def _dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(child.stdout)


def test_a_later_save_removes_stale_temporaries_of_dead_processes(tmp_path):
    host = _atomic_file.host_tag()
    stale = tmp_path / f".model.safetensors.precision-tmp.{host}.{_dead_pid()}.0a1b2c"
    alive = tmp_path / f".model.safetensors.precision-tmp.{host}.{os.getppid()}.0a1b2d"
    other_host = tmp_path / f".model.safetensors.precision-tmp.elsewhere.{_dead_pid()}.0a1b2e"
    unrelated = tmp_path / ".model.safetensors.tmp"
    for p in (stale, alive, other_host, unrelated):
        p.write_bytes(b"x" * 100)
    precision.save(tmp_path / "other.safetensors", {"a": np.ones(2)})
    assert not stale.exists()
    assert alive.exists()
    assert other_host.exists()
    assert unrelated.exists()


KILLED_SAVER = """
import sys, time, zlib
import numpy as np
import precision
from precision._checkpoint import _atomic_file, _io

_atomic_file._TempFile._open_unnamed = lambda self: None  # the named fallback

class Slow:
    calls = 0
    def crc32(self, data, value=0):
        Slow.calls += 1
        if Slow.calls == 2:
            print("writing", flush=True)
            time.sleep(600)
        return zlib.crc32(data, value)

_io.zlib = Slow()
precision.save(sys.argv[1], {"a": np.ones((256, 256)), "b": np.ones((256, 256))})
"""


def test_sigkill_leaves_a_named_temporary_that_the_next_save_removes(tmp_path):
    script = tmp_path / "saver.py"
    script.write_text(KILLED_SAVER)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out / "model.safetensors")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
        proc.stdout.close()
    left = os.listdir(out)
    assert len(left) == 1  # what the kill left
    assert ".precision-tmp." in left[0]
    precision.save(out / "next.safetensors", {"a": np.ones(2)})
    assert os.listdir(out) == ["next.safetensors"]


def _header_tokens(path) -> int:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8 : 8 + n]
    return header.count(b",") + header.count(b"[") + header.count(b"{")


@pytest.mark.parametrize("depth", [0, 1, 12])
def test_the_save_side_token_bound_covers_the_real_header(tmp_path, depth):
    x = np.ones((2, 3), np.float32)
    leaf = {
        "a,b[c]{d}": Tensor(x).to_reduced_precision("int4", scaling=dtypes.PerAxis(0)),
        "plain": np.zeros((2, 1, 3), np.int32),
        "bf": Tensor(x).to_reduced_precision("bf16"),
    }
    tree = leaf
    for i in range(depth):
        tree = {f"level{i}": tree, f"list{i}": [leaf]}
    path = tmp_path / "t.safetensors"
    precision.save(path, tree)
    bound = sum(_names._json_tokens_bound(spec) for spec, _ in _leaves.flatten(tree))
    assert _header_tokens(path) <= bound


def test_save_refuses_a_tree_whose_header_would_hold_too_many_json_values():
    deep = tuple(("key", f"k{i}") for i in range(_layout.MAX_PATH_DEPTH))
    leaves = [
        _layout.Leaf(f"leaf{i}", (*deep[:-1], ("key", f"leaf{i}")), "array", np.dtype("u1"), (1,))
        for i in range(10_000)
    ]
    with pytest.raises(SaveError, match=r"JSON values .* deep key paths cost the most"):
        _names.check_limits(leaves)


@pytest.mark.parametrize("bits", [2, 4])
def test_the_word_at_a_time_field_search_agrees_with_a_field_by_field_reference(bits):
    rng = np.random.default_rng(bits)
    value, mask = 1 << (bits - 1), (1 << bits) - 1
    high = 0xAA if bits == 2 else 0x88  # the top bit of every field
    # Mostly bytes without any field's top bit, so the answer is often False.
    quiet = np.array([b for b in range(256) if b & high == 0], np.uint8)
    every = np.arange(256, dtype=np.uint8)
    for n in [1, 7, 8, 9, 15, 16, 17, 64, 1000]:
        for _ in range(200):
            pool = quiet if rng.random() < 0.5 else every
            arr = rng.choice(pool, n).astype(np.uint8)
            if rng.random() < 0.3:
                arr[rng.integers(0, n)] = rng.choice(every)
            reference = any(np.any(((arr >> k) & mask) == value) for k in range(0, 8, bits))
            assert _invariants._has_field(arr, bits, value) == reference, (arr.tolist(), bits)


RACER = """
import sys, time
import numpy as np
import precision

path, me, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
tree = {"who": np.full(100_000, me, np.int32)}
time.sleep(max(0.0, start - time.time()))
try:
    precision.save(path, tree)
    print("created")
except FileExistsError:
    print("exists")
"""


def test_concurrent_savers_without_overwrite_create_the_file_once(tmp_path):
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    path = tmp_path / "shared.safetensors"
    start = time.time() + 5  # about when every process has imported JAX (later is fine too)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(path), str(i), str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outcomes = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(outcomes) == ["created", "exists", "exists", "exists"], outcomes
    winner = outcomes.index("created")
    who = np.asarray(precision.load(path)["who"])
    np.testing.assert_array_equal(who, np.full(100_000, winner, np.int32))
    assert sorted(os.listdir(tmp_path)) == ["racer.py", "shared.safetensors"]


def test_a_write_that_runs_out_of_room_names_the_file(tmp_path):
    # a file-size limit stands in for a full disk: the write fails half way with an
    # errno and no file name; the error names the checkpoint, and nothing is left
    target = tmp_path / "big.safetensors"
    code = textwrap.dedent(f"""
        import resource, signal
        import numpy as np, precision
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        try:
            precision.save({str(target)!r}, {{"w": np.ones(1 << 16, np.float32)}})
        except OSError as exc:
            print(type(exc).__name__, exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert f"cannot write {target}" in out.stdout, (out.stdout, out.stderr)
    assert "size limit" in out.stdout
    assert "raise the limit" in out.stdout
    assert os.listdir(tmp_path) == []


def test_a_sparse_file_larger_than_memory_is_refused_before_reading(tmp_path):
    # two tensors, each smaller than the machine's memory, together larger than what is
    # available: the process was killed; now refused from the header alone
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    each = (memory * 6 // 10) // 4 * 4
    header = {
        name: {"dtype": "F32", "shape": [each // 4], "data_offsets": [i * each, (i + 1) * each]}
        for i, name in enumerate(("a", "b"))
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path = tmp_path / "sparse.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 2 * each)  # a hole: no disk used
    with pytest.raises(precision.CheckpointError, match="GiB in memory together"):
        precision.load(path)
