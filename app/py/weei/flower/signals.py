"""Keep the process's fatal-signal handlers across a Flower simulation.

wasmtime turns a WebAssembly trap into SIGILL (or SIGSEGV, SIGBUS, SIGFPE)
and its handler makes it a ``Trap``; Ray, which ``run_simulation`` starts in
this process, resets those handlers to the default when it shuts down, so
the next trap of any module killed the whole process ("Illegal
instruction"; seen as a CI run dying in the tests after the simulation).
The handlers are C-level, invisible to :mod:`signal`, so they are saved and
restored with ``sigaction`` itself (Linux; elsewhere nothing is done).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["keep_fatal_signal_handlers"]

_FATAL = (4, 7, 8, 11)  # SIGILL, SIGBUS, SIGFPE, SIGSEGV on Linux


class _SigAction(ctypes.Structure):
    # glibc's struct sigaction: handler, a 1024-bit mask, flags, restorer.
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


@contextmanager
def keep_fatal_signal_handlers() -> Iterator[None]:
    """Whatever runs inside, the fatal-signal handlers are the same afterwards."""
    if not sys.platform.startswith("linux"):
        yield
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    saved = {}
    for signum in _FATAL:
        action = _SigAction()
        if libc.sigaction(signum, None, ctypes.byref(action)) == 0:
            saved[signum] = action
    try:
        yield
    finally:
        for signum, action in saved.items():
            libc.sigaction(signum, ctypes.byref(action), None)
