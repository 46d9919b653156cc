"""Progress of work whose first calls compile Numba kernels: what is compiling, on a terminal or in a log.

The emu backend's kernels are compiled by Numba the first time each is called with new argument
types and cached on disk (next to the sources, or ``NUMBA_CACHE_DIR``); later processes load them
from the cache in milliseconds. A cold first run therefore spends minutes compiling inside calls
that later take milliseconds. :class:`CompileWatch` sees each kernel as Numba starts compiling it
(Numba's ``numba:compile`` event, which fires for a compilation, not for a load from the cache)
and adds up the compile time; :class:`Progress` shows steps and those kernels as they happen: on a
terminal as one live status line, otherwise (piped into a log) as plain lines, each flushed at once.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from numba.core import event

#: Said once, with the first kernel compiled.
FIRST_RUN_NOTE = "compiling Numba kernels: first run only, they are cached on disk and later runs load them"


def kernel_name(dispatcher) -> str:
    """``emu.mla_prolog._cq_norm_rows``: a Numba dispatcher's function, without the package prefix."""
    fn = getattr(dispatcher, "py_func", None)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(dispatcher))}"
    return name.removeprefix("ascend_emu.")


class CompileWatch(event.Listener):
    """Counts the Numba kernels compiled while it is entered, and their compile time.

    A kernel's compilation compiles the jitted helpers it calls (nested events); those are part
    of it, not counted on their own.

    Attributes:
        kernels: kernels compiled so far.
        seconds: wall time spent compiling them.
    """

    def __init__(self, on_compile: Callable[[str], None] | None = None):
        """``on_compile`` is called with each kernel's name (:func:`kernel_name`) as it starts compiling."""
        self.kernels = 0
        self.seconds = 0.0
        self._on_compile = on_compile
        self._depth = 0
        self._start = 0.0

    def on_start(self, ev) -> None:
        self._depth += 1
        if self._depth == 1:
            self.kernels += 1
            self._start = time.perf_counter()
            if self._on_compile is not None:
                self._on_compile(kernel_name(ev.data.get("dispatcher")))

    def on_end(self, ev) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> "CompileWatch":
        event.register("numba:compile", self)
        return self

    def __exit__(self, *exc) -> None:
        event.unregister("numba:compile", self)


class Progress:
    """Steps and the kernels each compiles, shown as they happen.

    On a terminal: one live status line (rich), replaced by each step and kernel. Otherwise (a
    pipe, a log file): each step as a plain line when ``show_steps``, and under the step a line per
    kernel compiled, every line flushed at once; the :data:`FIRST_RUN_NOTE` precedes the first kernel.
    Use it as a context manager; :meth:`watch` counts the compiles.
    """

    def __init__(self, stream: TextIO | None = None, *, show_steps: bool = True, quiet: bool = False):
        """``stream``: where to write (default ``sys.stdout``); ``quiet``: show nothing."""
        from rich.console import Console

        self.stream = stream if stream is not None else sys.stdout
        self.console = Console(file=self.stream, highlight=False)
        self.live = self.console.is_terminal and not quiet
        self.quiet = quiet
        self.show_steps = show_steps
        self.watch = CompileWatch(self.compiling)
        self._step = ""
        self._status = None
        self._noted = False  # FIRST_RUN_NOTE shown
        self._named = False  # the step's name shown (plain lines)

    def __enter__(self) -> "Progress":
        if self.live:
            self._status = self.console.status("starting")
            self._status.__enter__()
        self.watch.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.watch.__exit__(*exc)
        if self._status is not None:
            self._status.__exit__(*exc)
            self._status = None

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def step(self, text: str) -> None:
        """A step starts."""
        self._step, self._named = text, self.show_steps
        if self.quiet:
            return
        if self._status is not None:
            self._status.update(text)
        elif self.show_steps:
            self._line(text)

    def compiling(self, kernel: str) -> None:
        """A kernel starts compiling (the :class:`CompileWatch` callback)."""
        if self.quiet:
            return
        n = self.watch.kernels
        if self._status is not None:
            if not self._noted:
                self.console.print(f"[dim]{FIRST_RUN_NOTE}[/dim]")
            self._status.update(f"{self._step}   [dim]compiling Numba kernel {n}: {kernel} "
                                "(first run only)[/dim]")
        else:
            if not self._noted:
                self._line(FIRST_RUN_NOTE)
            if not self._named and self._step:  # name the step once, above its kernels
                self._line(f"  {self._step}:")
                self._named = True
            self._line(f"    compiling Numba kernel {n}: {kernel}")
        self._noted = True


#: Seconds of work after which :func:`busy` says what is going on.
BUSY_AFTER = 1.0


class busy:
    """``with busy("drawing grid.png"):``: if the block runs longer than ``after`` seconds
    (:data:`BUSY_AFTER`), one line on ``stream`` (default ``sys.stderr``) says what it is doing,
    and one more when it ends, with the time taken; quicker work prints nothing. A timer thread
    writes the first line, so it shows while the work runs."""

    def __init__(self, what: str, *, after: float = BUSY_AFTER, stream: TextIO | None = None):
        import threading

        self.what, self.after = what, after
        self.stream = stream if stream is not None else sys.stderr
        self.shown = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(after, self._show)
        self._timer.daemon = True

    def _show(self) -> None:
        with self._lock:
            if self._start is not None:
                self.shown = True
                print(f"{self.what} ... (over {self.after:g} s)", file=self.stream, flush=True)

    def __enter__(self) -> "busy":
        self._start = time.perf_counter()
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        with self._lock:
            took = time.perf_counter() - self._start
            self._start = None
            if self.shown:
                print(f"{self.what}: done in {took:.1f} s", file=self.stream, flush=True)
