"""Ctrl-C in the command line: every SIGINT stops a command that has not committed.

Python turns SIGINT into a KeyboardInterrupt at the next bytecode, which is
not always safe or even seen:

- raised while the garbage collector runs a callback (JAX registers one),
  it is printed as "Exception ignored" and swallowed;
- raised while a module is being imported (JAX's extension modules, which
  the commands import lazily, the first time a tensor needs them), it can
  leave the interpreter inconsistent: a crash instead of exit 130.

So `main` installs `interrupt_handler` before it does anything else. The
handler records every SIGINT in a flag; it raises at once except inside a
garbage-collector callback, inside any import, and inside `deferring()`,
where the flag alone carries it to the next `check_interrupt` — between
tensors and blocks, at the end of `deferring()`, before the output is
committed (`deferred_interrupts`) and when the command returns. An interrupt
therefore always stops a command that has not committed its output, with
exit status 130 and one line on stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Sized
from typing import Any

_interrupted = False
_deferring = False
_from_start = False  # recording since `record_from_start`, until `acting_from_here`
_IMPORTLIB = "<frozen importlib._bootstrap"  # the frames of every import in progress


def _on_sigint(signum: int, frame: Any) -> None:
    global _interrupted
    _interrupted = True
    if _deferring:
        return
    depth = 0
    while frame is not None and depth < 64:
        code = frame.f_code
        if code.co_name.endswith("gc_callback") or code.co_filename.startswith(_IMPORTLIB):
            return
        frame, depth = frame.f_back, depth + 1
    raise KeyboardInterrupt


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def interrupt_handler(program: bool) -> Iterator[None]:
    """Record SIGINTs (see `check_interrupt`) while the block runs; restore the handler after.

    In a `program` (the `precision` process itself) the block is the whole
    command, entered inside the caller's `try` that turns a KeyboardInterrupt
    into exit status 130: once it ends the exit status is decided, so SIGINT
    is ignored until the process exits (a second Ctrl-C while the first is
    reported, or one after an error, would print a traceback). Called as a
    function, the caller's handler always comes back.
    """
    global _deferring, _interrupted
    if not _is_main_thread():
        yield
        return
    if not _from_start:  # (the program keeps what `record_from_start` recorded)
        _interrupted = False
    old = signal.signal(signal.SIGINT, _on_sigint)
    ended = False
    try:
        yield
        ended = True
    finally:
        # Only recorded while the handler is put back: raised here, the caller's handler
        # would not come back (and the program's report could meet a second Ctrl-C).
        outer, _deferring = _deferring, True
        _interrupted = False
        signal.signal(signal.SIGINT, signal.SIG_IGN if program else old)
        late, _interrupted, _deferring = _interrupted, False, outer
        if late and ended and not program:  # it came as the call returned: the caller's
            signal.raise_signal(signal.SIGINT)


def acting_from_here() -> None:
    """The program's command, first thing inside its `try`: a SIGINT recorded since
    `record_from_start` stops it now, and from here one raises at once (inside that
    `try`, which turns it into exit status 130). Elsewhere only the check."""
    global _deferring, _from_start
    if _from_start:
        _deferring = _from_start = False
    check_interrupt()


def record_from_start(*, received: Sized = ()) -> None:
    """The program's first step, before the command's own modules load: from here on a
    SIGINT is recorded, never raised, until `acting_from_here` takes over inside the
    command's `try` and acts on it (a KeyboardInterrupt raised in the middle of those
    imports printed a traceback; one between them and that `try` would too).
    `received`: what the entry point's own handler recorded from its first line (read
    after this handler replaces it, so a SIGINT in between is not lost)."""
    global _deferring, _from_start, _interrupted
    if not _is_main_thread():
        return
    # Recording only before the handler that can raise is in place: a SIGINT between the
    # two raised a KeyboardInterrupt here, a traceback (1 of 21 moments in one CI run).
    _deferring = _from_start = True
    signal.signal(signal.SIGINT, _on_sigint)
    if len(received) > 0:  # (only ever set: a SIGINT between a read and a write is kept)
        _interrupted = True


@contextlib.contextmanager
def recorded_only() -> Iterator[None]:
    """While the block runs, the handler records a SIGINT and raises nothing; the next
    `check_interrupt` raises it. For a block that makes what its caller must clean up
    (a temporary directory): raised there, it would land before the caller's `try`."""
    global _deferring
    outer = _deferring
    _deferring = True
    try:
        yield
    finally:
        _deferring = outer


@contextlib.contextmanager
def deferring() -> Iterator[None]:
    """Only record SIGINTs while the block runs (module imports); stop after it if one came."""
    with recorded_only():
        yield
    check_interrupt()


def import_jax() -> None:
    """Import JAX (once) with interrupts deferred: commands import it only when a tensor needs it.

    A numpy cast (`convert --to bf16`) never does, and starts in a fraction of
    the time; an encode or decode does, and its first one pays for the import.
    """
    with deferring():
        import jax
        import jax.numpy  # noqa: F401


def check_interrupt() -> None:
    """Raise KeyboardInterrupt if a SIGINT arrived (even one swallowed on the way)."""
    if _interrupted:
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Commit an output: an interrupt recorded before stops it; one during it is ignored
    once the block has committed (and stops the command if the block fails); none after.

    Used around the final rename of an output. SIGINT and SIGTERM arriving
    while the block runs are only recorded (masking them would not do: the
    kernel may deliver a signal to any of XLA's threads). Once the block has
    run the job is committed and an interrupt can no longer undo it, so
    SIGINT is ignored from then on (the process exits 0 with its output
    complete, never 130 with output written); a SIGTERM that came during the
    block is delivered again after it.
    """
    global _deferring, _interrupted
    check_interrupt()
    if not _is_main_thread():
        yield
        return
    terminated: list[int] = []
    outer = _deferring
    _deferring = True
    old_term = signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    try:
        check_interrupt()
        yield
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _interrupted = False
    finally:
        _deferring = outer
        signal.signal(signal.SIGTERM, old_term)
        if terminated:
            os.kill(os.getpid(), signal.SIGTERM)
