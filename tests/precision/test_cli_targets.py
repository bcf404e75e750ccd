"""What `convert` may write over: never a file that appeared meanwhile, never a FIFO or a
device, and a new output is as private as its input."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading

import numpy as np
import pytest
import safetensors.numpy

import precision
from precision._checkpoint._atomic_file import host_tag
from precision._cli import _convert_command, main

X = {"w": np.linspace(-1, 1, 64 * 32, dtype=np.float32).reshape(64, 32)}


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "in.safetensors"
    safetensors.numpy.save_file(X, str(path))
    return path


@pytest.mark.parametrize("sharded", [False, True], ids=["file", "sharded"])
def test_an_output_that_appears_during_the_conversion_is_kept(
    source, tmp_path, monkeypatch, capsys, sharded
):
    # a second convert (or anyone) creates the output after the start-up check:
    # without --overwrite the commit is exclusive, so theirs stays and this run fails
    out = tmp_path / ("out" if sharded else "out.safetensors")
    checked = _convert_command._check_paths

    def check_then_someone_writes(src, dst, overwrite):
        checked(src, dst, overwrite)
        if sharded:
            os.mkdir(dst)
            (out / "theirs.txt").write_text("keep me")
        else:
            out.write_text("keep me")

    monkeypatch.setattr(_convert_command, "_check_paths", check_then_someone_writes)
    argv = ["convert", str(source), "-o", str(out), "--to", "int8", "-q"]
    if sharded:
        argv += ["--max-shard-size", "1KB"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err
    assert (out / "theirs.txt" if sharded else out).read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.safetensors", out.name])


def test_overwrite_never_replaces_a_fifo(source, tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert main(["convert", str(source), "-o", str(fifo), "--to", "int8", "--overwrite", "-q"]) == 1
    assert "not a regular file (a FIFO)" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(OSError, match="not a regular file"):
        precision.save(fifo, {"a": np.ones(2)}, overwrite=True)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_loading_a_fifo_is_refused_instead_of_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load():
        try:
            precision.load(fifo)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=20)
    if worker.is_alive():  # unblock the reader, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("precision.load(fifo) blocked")
    assert isinstance(outcome[0], precision.CheckpointError)
    assert "not a regular file" in str(outcome[0])
    result = main(["report", str(fifo), str(fifo)])
    assert result == 1


@pytest.mark.parametrize("sharded", [False, True], ids=["file", "sharded"])
def test_a_new_output_takes_the_inputs_permissions(source, tmp_path, sharded):
    os.chmod(source, 0o600)
    out = tmp_path / ("out" if sharded else "out.safetensors")
    argv = ["convert", str(source), "-o", str(out), "--to", "int8", "-q"]
    if sharded:
        argv += ["--max-shard-size", "1KB"]
    assert main(argv) == 0
    files = sorted(out.iterdir()) if sharded else [out]
    shards = [f for f in files if f.name.endswith(".safetensors")]
    assert shards
    for f in shards:
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)  # fmt: skip
    return int(child.stdout)


def _leftover(out, pid: int, role: str):
    return out.parent / f".{out.name}.precision-dir.{host_tag()}.{pid}.abc123.{role}"


@pytest.fixture
def sharded(source, tmp_path):
    out = tmp_path / "model"
    argv = ["convert", str(source), "-o", str(out), "--to", "bf16", "--max-shard-size", "1KB"]
    assert main([*argv, "-q"]) == 0
    return out


def test_a_conversion_killed_between_its_renames_is_recovered_by_the_next(sharded, capsys):
    # the state a SIGKILL between "input aside" and "output in place" leaves (where the
    # atomic exchange is not available): the input only under .old, the output under .tmp
    pid = _dead_pid()
    before = {p.name: p.read_bytes() for p in sharded.iterdir()}
    old, tmp = _leftover(sharded, pid, "old"), _leftover(sharded, pid, "tmp")
    os.rename(sharded, old)
    os.mkdir(tmp)
    (tmp / "partial.safetensors").write_bytes(b"half")
    argv = ["convert", str(sharded), "-o", str(sharded), "--to", "int8", "--overwrite", "-q"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"restored {sharded} from {old.name}" in err
    assert f"removed {tmp.name}" in err
    assert sorted(p.name for p in sharded.parent.iterdir() if p.name.startswith(".")) == []
    loaded = precision.load(next(sharded.glob("*.safetensors")))  # converted from the input
    assert any(t.format.name == "int8" for t in loaded.values())
    assert set(before) == {p.name for p in sharded.iterdir()}


# A child converting in place that SIGKILLs itself inside the commit: after the input is
# renamed aside (the two-rename commit, where the atomic exchange is unavailable), or right
# after the exchange (the old input not yet removed).
KILLED_AT_COMMIT = """
import os, signal, sys
from precision._cli import _temp_directory as commit
real_rename, real_exchange = os.rename, commit.rename_exchange
def die():
    os.kill(os.getpid(), signal.SIGKILL)
def rename(src, dst):
    real_rename(src, dst)
    if os.fspath(dst).endswith(".old"):
        die()
def interrupted(src, dst):
    real_rename(src, dst)
    if os.fspath(dst).endswith(".old"):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C between the two renames
def exchange(a, b):
    real_exchange(a, b) or sys.exit("no renameat2 here")
    die()
if sys.argv[1] in ("aside", "ctrl-c"):
    commit.rename_exchange = lambda a, b: False
    os.rename = rename if sys.argv[1] == "aside" else interrupted
else:
    commit.rename_exchange = exchange
from precision._cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("moment", ["aside", "exchanged"])
def test_a_conversion_killed_inside_its_commit_is_recovered_by_the_next(sharded, moment, capsys):
    before = {p.name: p.read_bytes() for p in sharded.iterdir()}
    argv = ["convert", str(sharded), "-o", str(sharded), "--to", "int8", "--overwrite", "-q"]
    child = subprocess.run(
        [sys.executable, "-c", KILLED_AT_COMMIT, moment, *argv], capture_output=True, text=True
    )
    if "no renameat2" in child.stderr:
        pytest.skip("this kernel has no renameat2(RENAME_EXCHANGE)")
    assert child.returncode == -9, child.stderr  # killed where it meant to be
    hidden = {p.suffix: p for p in sharded.parent.iterdir() if p.name.startswith(".")}
    if moment == "aside":  # the input only under .old, the new output under .tmp
        assert set(hidden) == {".old", ".tmp"}
        assert not sharded.exists()
        assert {p.name: p.read_bytes() for p in hidden[".old"].iterdir()} == before
    else:  # the new output in place, the old input under .tmp
        assert set(hidden) == {".tmp"}
        assert {p.name: p.read_bytes() for p in hidden[".tmp"].iterdir()} == before
        assert {p.name for p in sharded.iterdir()} == set(before)
    assert main(argv[:-1]) == 0  # the next run (in this process: the state is on disk)
    said = capsys.readouterr().err
    if moment == "aside":
        assert f"restored {sharded} from {hidden['.old'].name}" in said
    assert f"removed {hidden['.tmp'].name}" in said
    assert [p for p in sharded.parent.iterdir() if p.name.startswith(".")] == []
    loaded = precision.load(sharded, as_arrays=True)
    np.testing.assert_allclose(loaded["w"], X["w"], atol=1 / 127)  # bf16, then int8
    assert {p.name for p in sharded.iterdir()} == set(before)


def test_ctrl_c_inside_the_commit_of_an_in_place_conversion_lets_it_finish(sharded):
    """An interrupt between the two renames is held until the commit is whole: the
    command finishes (status 0) and leaves the converted output, nothing beside it."""
    before = {p.name for p in sharded.iterdir()}
    argv = ["convert", str(sharded), "-o", str(sharded), "--to", "int8", "--overwrite", "-q"]
    child = subprocess.run(
        [sys.executable, "-c", KILLED_AT_COMMIT, "ctrl-c", *argv], capture_output=True, text=True
    )
    assert child.returncode == 0, child.stderr
    assert "Traceback" not in child.stderr
    assert [p for p in sharded.parent.iterdir() if p.name.startswith(".")] == []
    assert {p.name for p in sharded.iterdir()} == before
    loaded = precision.load(sharded)
    assert loaded["w"].format.name == "int8"


def test_leftovers_of_live_or_other_conversions_are_left_alone(sharded, capsys):
    alive = _leftover(sharded, os.getppid(), "tmp")
    other = sharded.parent / f".other{_leftover(sharded, _dead_pid(), 'tmp').name[6:]}"
    dead = _leftover(sharded, _dead_pid(), "tmp")
    for d in (alive, other, dead):
        os.mkdir(d)
    argv = ["convert", str(sharded), "-o", str(sharded), "--to", "int8", "--overwrite", "-q"]
    assert main(argv) == 0
    assert f"removed {dead.name}" in capsys.readouterr().err
    assert alive.exists()
    assert other.exists()
    assert not dead.exists()


def test_an_in_place_sharded_conversion_leaves_nothing_beside_it(sharded):
    argv = ["convert", str(sharded), "-o", str(sharded), "--to", "int8", "--overwrite", "-q"]
    assert main(argv) == 0
    assert sorted(p.name for p in sharded.parent.iterdir()) == ["in.safetensors", "model"]


def test_load_reads_a_sharded_checkpoint_as_one_tree(source, tmp_path):
    out = tmp_path / "sharded"
    argv = ["convert", str(source), "-o", str(out), "--to", "int8", "--max-shard-size", "1KB"]
    assert main([*argv, "-q"]) == 0
    whole = tmp_path / "whole.safetensors"
    assert main(["convert", str(source), "-o", str(whole), "--to", "int8", "-q"]) == 0
    want = precision.load(whole)
    index = next(out.glob("*.index.json"))
    for given in (out, index):
        got = precision.load(given)
        assert set(got) == set(want)
        for name in want:
            assert got[name].format == want[name].format
            np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))
    arrays = precision.load(out, as_arrays=True)
    np.testing.assert_array_equal(np.asarray(arrays["w"]), np.asarray(want["w"]))


def test_load_of_a_directory_without_an_index_names_what_it_found(tmp_path):
    for name in ("a.safetensors", "b.safetensors"):
        precision.save(tmp_path / name, {"x": np.ones(2, np.float32)})
    with pytest.raises(precision.CheckpointError, match=r"without a .* file and 2 \.safetensors"):
        precision.load(tmp_path)
