"""Ctrl-C during `precision convert`: exit 130, nothing written, the input untouched.

A multi-second conversion runs in a child process and receives SIGINT at
moments spread over its run (measured first, uninterrupted), into a new file,
into a sharded directory, and in place with --overwrite. Each run either
stops with exit status 130, one line on stderr, no output and no leftover
temporary file, or (the signal landing after the output was committed)
finishes with status 0 and a complete output; the input is byte-identical
afterwards either way.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

import precision

CLI = [sys.executable, "-m", "precision", "convert"]
FRACTIONS = [0.0, 0.08, 0.16, 0.25, 0.35, 0.45, 0.6]


def digest(path) -> str:
    h = hashlib.sha256()
    paths = sorted(path.rglob("*")) if path.is_dir() else [path]
    for p in paths:
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("interrupt") / "in.safetensors"
    shape = (1024, 1024)
    tensors = {f"layer.{i}.weight": rng.standard_normal(shape, np.float32) for i in range(24)}
    safetensors.numpy.save_file(tensors, str(path))
    return path


def opened(pid: int, path: str) -> bool:
    """Whether process `pid` has `path` open (it opens its input once imported and parsed)."""
    fds = f"/proc/{pid}/fd"
    try:
        return any(os.path.realpath(os.path.join(fds, fd)) == path for fd in os.listdir(fds))
    except OSError:
        return False


def convert(args, delay: float | None, src: str):
    """(exit status, stdout, stderr, seconds from opening the input to the end).

    With `delay`, SIGINT is sent `delay` seconds after the child opened its
    input: timing from there keeps the moments inside the conversion whatever
    the import of JAX costs on a busy machine.
    """
    proc = subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    path = os.path.realpath(src)
    while proc.poll() is None and not opened(proc.pid, path):
        time.sleep(0.002)
    start = time.perf_counter()
    if delay is not None and proc.poll() is None:
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err, time.perf_counter() - start


def leftovers(directory, keep: set[str]) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n not in keep)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["file", "sharded", "in-place"])
def test_sigint_at_many_moments(source, tmp_path, target):
    src = tmp_path / "in.safetensors"
    shutil.copy(source, src)
    before = digest(src)
    out = {"file": tmp_path / "out.safetensors", "sharded": tmp_path / "out", "in-place": src}
    dst = out[target]
    args = [str(src), "-o", str(dst), "--to", "int8", "--keep", "none", "-q", "--overwrite"]
    if target == "sharded":
        args += ["--max-shard-size", "10MB"]
    # an uninterrupted run's length: the shorter of two, as a busy machine makes
    # a first run slow and the moments would then fall after the commit
    durations, outputs = [], []
    for _ in range(2):
        code, _, err, seconds = convert(args, None, str(src))
        assert code == 0, err
        durations.append(seconds)
        outputs.append(digest(dst))
        if target == "in-place":
            shutil.copy(source, src)
    duration = min(durations)
    assert outputs[0] == outputs[1]  # a conversion writes the same bytes every time
    assert precision.load(dst if target != "sharded" else next(dst.glob("*-00001-of-*")))
    if target == "in-place":
        shutil.copy(source, src)
    elif target == "file":
        dst.unlink()
    else:
        shutil.rmtree(dst)
    # Moments spread over the conversion itself, after the package import
    # (an interrupt during start-up: test_sigint_during_startup).
    stopped, seen = 0, []
    for fraction in FRACTIONS:
        delay = fraction * duration
        code, _, err, _ = convert(args, delay, str(src))
        seen.append((round(delay, 2), code))
        assert "Traceback" not in err
        if code == 130:
            stopped += 1
            assert err.strip() == "precision: interrupted; nothing was written"
            assert digest(src) == before  # the input untouched, in place included
            assert leftovers(tmp_path, {"in.safetensors"}) == []  # nothing written, no temp
        else:  # the signal came after the commit: a complete output
            assert code == 0, err
            assert digest(dst) == outputs[0]  # the uninterrupted run's bytes
            if target == "in-place":
                assert precision.load(src)["layer.0.weight"].format.name == "int8"
                shutil.copy(source, src)
            elif target == "file":
                assert precision.load(dst)["layer.23.weight"].format.name == "int8"
                dst.unlink()
            else:
                assert len(list(dst.glob("*.safetensors"))) > 1
                shutil.rmtree(dst)
        assert digest(src) == before
    # most moments stop it (how many depends on the machine's load: at least half)
    assert stopped >= 4, (duration, seen)


def mapped(pid: int, library: str) -> bool:
    """Whether process `pid` has loaded a shared library whose path contains `library`."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return library in f.read()
    except OSError:
        return False


# Moments during start-up, each found by watching the child load a library
# (not by a delay, which a busy machine would move): numpy's core, the first
# thing the convert command imports; JAX's extension modules while they
# initialise (an interrupt there once crashed the interpreter); and moments
# after, while JAX's garbage-collector callback may run (an interrupt there
# was printed and swallowed, and the conversion went on to write its output).
# A bfloat16 cast and int8 (per tensor, per row) are numpy alone (they never load
# JAX); int4 per row loads JAX once the tensors are planned.
STARTUP = [("bf16", "_multiarray_umath", 0.0), ("int8", "_multiarray_umath", 0.0)] + [
    ("int4 --scaling per-axis:0", "jaxlib", d)  # compiled (int8 per row runs in numpy)
    for d in (0.0, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15)
]


@pytest.mark.parametrize(("to", "library", "delay"), STARTUP)
def test_sigint_during_startup(tmp_path, to, library, delay):
    src = tmp_path / "in.safetensors"
    dst = tmp_path / "out.safetensors"
    safetensors.numpy.save_file({"w": np.ones((4, 4), np.float32)}, str(src))
    proc = subprocess.Popen(
        [*CLI, str(src), "-o", str(dst), "--to", *to.split(), "--keep", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while proc.poll() is None and not mapped(proc.pid, library):
        time.sleep(0.0002)
    assert proc.poll() is None, "the command ended before it loaded " + library
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    if library != "jaxlib" or delay == 0.0:
        assert proc.returncode == 130, err  # start-up takes longer than this on any machine
    if proc.returncode == 130:
        assert err.strip() == "precision: interrupted; nothing was written"
        assert leftovers(tmp_path, {"in.safetensors"}) == []
    else:  # the signal came after the commit: a complete output, nothing on stderr
        assert (proc.returncode, err) == (0, "")
        np.testing.assert_array_equal(precision.load(str(dst), as_arrays=True)["w"], 1.0)


_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*\n(?:    (?P<source>[^\n]*))?'
)
_OURS = (Path(precision.__file__).parent, Path(precision.__file__).parents[1] / "_precision_cli.py")


def our_frames(err: str) -> list[str]:
    """The frames of a traceback in this project's source: the package and the entry
    module. The launcher pip writes (`bin/precision`) is not ours, but only its line that
    imports the entry module may appear, or its line 0 (a Ctrl-C before its first line,
    shown with no source line): either came before our first line ran."""
    frames = []
    for m in _FRAME.finditer(err):
        path, source = Path(m["file"]), (m["source"] or "").strip()
        mine = any(path == root or root in path.parents for root in _OURS)
        launcher = path.name == "precision" and path.parent.name == "bin"
        before_ours = m["line"] == "0" or source == "from _precision_cli import main"
        if mine or (launcher and not before_ours):
            frames.append(f"{path}: {source}")
    return frames


def is_site_report(err: str) -> bool:
    """Whether stderr is only site's report of a .pth line that a Ctrl-C interrupted:
    Python prints it and goes on starting, so the command can still finish."""
    return (
        err.startswith("Error processing line ")
        and "KeyboardInterrupt" in err
        and err.rstrip().endswith("Remainder of file ignored")
        and err.count("Error processing line ") == 1
    )


_SWALLOWED = re.compile(
    r"Exception ignored in: <function _get_module_lock\.<locals>\.cb at 0x[0-9a-f]+>\n"
    r"Traceback \(most recent call last\):\n"
    r'(  File "<frozen importlib\._bootstrap>", line \d+, in \w+\n)+'
    r"KeyboardInterrupt: \n?"
)


def is_interpreter_report(err: str) -> bool:
    """Whether stderr is only the interpreter's own report of a Ctrl-C that came before
    our first line and that it swallowed, so the command then ran whole: site's
    report of a .pth line, or a KeyboardInterrupt raised by Python's default handler
    in the garbage collection of an import lock (a weak-reference callback, whose
    exceptions Python prints as "Exception ignored" and drops). From our first line
    the handler records a SIGINT there instead (`_cli/_interrupts.py`); before it,
    nothing of ours runs that could see the swallowed signal."""
    return err == "" or is_site_report(err) or _SWALLOWED.fullmatch(err) is not None


MOMENTS_MS = (
    range(0, 501, 25) if os.environ.get("HYPOTHESIS_PROFILE") != "hunt" else range(0, 501, 5)
)


@pytest.mark.parametrize("entry", ["console-script", "python-m"])
def test_sigint_in_the_first_half_second_never_prints_our_traceback(tmp_path, entry):
    # From its first line the entry point records Ctrl-C; what is left before it is the
    # interpreter's own start (site, an editable install's import hook, and the launcher's
    # import of the entry module), whose traceback has no frame in our source (the
    # launcher's import line aside). Each outcome is pinned to what it leaves:
    # exit 130 prints one line and writes nothing; exit 0 wrote the output an
    # uninterrupted run writes, byte for byte; an interpreter stopped before our first
    # line (killed by the signal, or its own traceback) wrote nothing either.
    script = os.path.join(os.path.dirname(sys.executable), "precision")
    if entry == "console-script" and not os.path.exists(script):
        pytest.skip("no console script next to this interpreter")
    command = [script] if entry == "console-script" else [sys.executable, "-m", "precision"]
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    safetensors.numpy.save_file({"w": np.ones((256, 256), np.float32)}, str(src))
    argv = [*command, "convert", str(src), "-o", str(dst), "--to", "int8"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    uninterrupted = digest(dst)
    np.testing.assert_array_equal(precision.load(str(dst), as_arrays=True)["w"], 1.0)
    dst.unlink()
    outcomes = []
    for ms in [*MOMENTS_MS, None]:  # (None: once numpy's core is loaded, however long)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if ms is None:
            while proc.poll() is None and not mapped(proc.pid, "_multiarray_umath"):
                time.sleep(0.0002)
        else:
            time.sleep(ms / 1000)
        # numpy's core is loaded only after the entry's first line: from then on the
        # command records the signal (observed, not assumed from the moment's delay)
        ours = mapped(proc.pid, "_multiarray_umath")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        code = proc.returncode
        outcomes.append((ms, ours, code))
        assert our_frames(err) == [], (ms, err)
        if code == 130:  # stopped by the command: one line, nothing written
            assert err.strip() == "precision: interrupted; nothing was written", (ms, err)
            assert not dst.exists(), ms
        elif code == 0:  # the signal came after the commit: the complete output
            # (or, before our first line, the interpreter swallowed it and said so:
            # its own report, after which the command ran whole)
            assert is_interpreter_report(err), (ms, err)
            assert digest(dst) == uninterrupted, ms
            dst.unlink()
        else:  # stopped before our first line ran: by the signal, or the interpreter's
            # own KeyboardInterrupt (its traceback, which names none of our files)
            assert code == -signal.SIGINT or "KeyboardInterrupt" in err, (ms, code, err)
            assert out == "", (ms, out)
            assert not dst.exists(), ms
        assert leftovers(tmp_path, {"in.safetensors"}) == [], ms
    # the moments after the entry's first line all reach the command: stopped, or finished
    assert outcomes[-1][1], outcomes  # (the last waited for it)
    assert all(code in (0, 130) for ms, ours, code in outcomes if ours), outcomes


@pytest.fixture
def restored_sigint():
    """The test process's SIGINT handler and the command line's interrupt state, put back."""
    from precision._cli import _interrupts

    old = signal.getsignal(signal.SIGINT)
    state = (_interrupts._interrupted, _interrupts._deferring, _interrupts._from_start)
    try:
        yield _interrupts
    finally:
        signal.signal(signal.SIGINT, old)
        _interrupts._interrupted, _interrupts._deferring, _interrupts._from_start = state


def sigint_now() -> None:
    """Send this process SIGINT and let Python run its handler (at the next bytecodes)."""
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):
        pass


def command(interrupts, body) -> int:
    """The program's command as `precision._cli._main.main` runs it: `body` inside the
    interrupt handler, inside the `try` that turns a KeyboardInterrupt into 130."""
    try:
        with interrupts.interrupt_handler(program=True):
            interrupts.acting_from_here()  # one recorded while the command loaded
            body()
            interrupts.check_interrupt()
            return 0
    except KeyboardInterrupt:
        return 130


def test_sigint_between_the_imports_and_the_commands_try_is_acted_on(restored_sigint):
    # The program records from its first step; the command's modules load; then a SIGINT
    # lands before the command's `try` (the window where one once raised outside it). It
    # must be recorded there, and stop the command inside the `try`: exit 130.
    interrupts = restored_sigint
    interrupts.record_from_start()
    try:
        sigint_now()  # between the imports and the `try`: recorded, not raised
    except KeyboardInterrupt:
        pytest.fail("a SIGINT before the command's try raised outside it (a traceback)")
    ran = []
    assert command(interrupts, lambda: ran.append("body")) == 130
    assert ran == []  # stopped before the command did anything
    # the command is over and its exit status decided: a later Ctrl-C is ignored
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    sigint_now()


def test_sigint_the_entry_point_recorded_is_acted_on(restored_sigint):
    interrupts = restored_sigint
    interrupts.record_from_start(received=[signal.SIGINT])
    assert command(interrupts, lambda: None) == 130


def test_without_a_sigint_the_command_runs_and_inside_it_a_sigint_raises(restored_sigint):
    interrupts = restored_sigint
    interrupts.record_from_start()
    ran = []
    assert command(interrupts, lambda: ran.append("body")) == 0
    assert ran == ["body"]
    interrupts.record_from_start()
    after = []

    def interrupted() -> None:
        sigint_now()  # past the handover the handler raises at once
        after.append("went on")

    assert command(interrupts, interrupted) == 130
    assert after == []


def test_called_as_a_function_the_callers_handler_comes_back(restored_sigint):
    interrupts = restored_sigint
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with interrupts.interrupt_handler(program=False):
        assert signal.getsignal(signal.SIGINT) is interrupts._on_sigint
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigint_as_the_handler_is_entered_is_recorded_until_the_command_acts(
    restored_sigint,
):
    # Entering the handler (the context manager's own frames) comes before the `with`
    # body: a SIGINT raised there would escape the `with`, whose exit then never puts
    # SIGINT to ignored. Until `acting_from_here` it is only recorded.
    interrupts = restored_sigint
    interrupts.record_from_start()
    try:
        with interrupts.interrupt_handler(program=True):
            sigint_now()  # before the command's first line: recorded
            with pytest.raises(KeyboardInterrupt):
                interrupts.acting_from_here()
    except KeyboardInterrupt:
        pytest.fail("a SIGINT before acting_from_here raised")
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_sigint_while_the_callers_handler_is_put_back_reaches_the_caller(
    restored_sigint, monkeypatch
):
    # Called as a function: a SIGINT that lands while `interrupt_handler` restores the
    # caller's handler is neither raised there (the caller's handler would not come
    # back) nor dropped: the caller's own handler receives it.
    interrupts = restored_sigint
    caller: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caller.append(signum))
    install = signal.signal
    calls = []

    def signal_during_restore(signum, handler):
        calls.append(handler)
        if len(calls) == 2:  # the restore, in the handler's `finally`
            sigint_now()
        return install(signum, handler)

    monkeypatch.setattr(interrupts.signal, "signal", signal_during_restore)
    try:
        with interrupts.interrupt_handler(program=False):
            pass
    except KeyboardInterrupt:
        pytest.fail("a SIGINT while the caller's handler was put back raised there")
    finally:
        monkeypatch.undo()
    for _ in range(1000):
        pass
    assert caller == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is not interrupts._on_sigint


def test_a_sigint_recorded_before_a_failure_is_reported_alone(
    restored_sigint, monkeypatch, tmp_path, capsys
):
    # A Ctrl-C recorded where raising was unsafe (a temporary directory being made),
    # then the operation fails: the command stops as interrupted, with one line.
    from precision._cli import _main

    interrupts = restored_sigint

    def fails(args):
        with interrupts.recorded_only():
            sigint_now()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_main, "_run", fails)
    src = tmp_path / "in.safetensors"
    safetensors.numpy.save_file({"w": np.ones((4, 4), np.float32)}, str(src))
    code = _main.main(["convert", str(src), "-o", str(tmp_path / "o.safetensors"), "--to", "int8"])
    err = capsys.readouterr().err
    assert (code, err.strip()) == (130, "precision: interrupted; nothing was written")
