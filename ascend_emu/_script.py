"""Running a user's script as ``__main__``, and showing its uncaught exception as Python would.

Used by ``ascend-emu run`` (:mod:`ascend_emu.cli`, against the drop-in) and by ``ascend-emu
record | compare SCRIPT`` (:mod:`ascend_emu.compare.cli`, against the real torch_npu): a small
shared module on the package's bottom floor, so neither command reaches up into the other
(``docs/architecture.md``). Standard library only.
"""

from __future__ import annotations

import importlib.machinery
import io
import sys
import types

from .tracebacks import full_traceback_wanted, hidden_frames_hint, is_emulator_file


def show_script_exception(script: str, exc: BaseException, *, full: bool | None = None) -> None:
    """Report ``exc`` as Python reports an uncaught exception of a script: traceback from the
    script's first frame on (the launcher's frames dropped), through ``sys.excepthook``.

    Unless ``full`` (default: env ``ASCEND_EMU_TRACEBACK`` = ``1``, :mod:`.tracebacks`), the traceback stops at the
    last frame before the first one inside ``ascend_emu`` (the user's call of an op; the
    emulator's validation frames below it are noise to the script's author), and one line on
    stderr after it says how many frames were hidden and how to see them. The user's frames and
    the exception line are Python's own."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    hidden = 0
    if not (full_traceback_wanted() if full is None else full):
        last, cur = None, tb
        while cur is not None and not is_emulator_file(cur.tb_frame.f_code.co_filename):
            last, cur = cur, cur.tb_next
        if last is not None and cur is not None:
            while cur is not None:
                hidden, cur = hidden + 1, cur.tb_next
            last.tb_next = None
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    if hidden:
        print(f"ascend-emu: {hidden_frames_hint(hidden, 'ascend-emu run --traceback')}", file=sys.stderr)


def run_as_main(path: str) -> None:
    """Execute the script at absolute ``path`` as ``__main__``, as ``python path`` does (its own
    ``__main__`` module in ``sys.modules`` while it runs; no ``__future__`` flags of this file)."""
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        sys.modules["__main__"] = saved
