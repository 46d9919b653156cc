"""Which traceback frames are the emulator's own, and the one hint for seeing them.

A user's call of an op with a wrong argument fails several frames deep inside ascend_emu (the
contract's checks); those frames are noise to the caller. ``ascend-emu run`` and the pytest
plugin stop a traceback at the caller's last frame before the first emulator frame and say, in
one line (:func:`hidden_frames_hint`), how many were hidden and how to see them: env
:data:`ENV_TRACEBACK` = ``1``, or each front end's own switch.
"""

from __future__ import annotations

import os

#: Environment variable: ``1`` shows the emulator's own frames in tracebacks (``ascend-emu run``,
#: the pytest plugin).
ENV_TRACEBACK = "ASCEND_EMU_TRACEBACK"
#: The package's directory: frames of files under it are the emulator's own.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def full_traceback_wanted() -> bool:
    """Env :data:`ENV_TRACEBACK` is ``1``."""
    return os.environ.get(ENV_TRACEBACK, "") == "1"


def is_emulator_file(filename: str) -> bool:
    """``filename`` (a frame's ``co_filename``) is a file of the ascend_emu package."""
    return os.path.abspath(str(filename)).startswith(PACKAGE_DIR)


def hidden_frames_hint(count: int, switch: str) -> str:
    """The line saying ``count`` emulator frames were hidden and that ``switch`` (a front end's
    option, e.g. ``ascend-emu run --traceback``) or env :data:`ENV_TRACEBACK` = ``1`` shows them."""
    return f"{count} frame(s) inside ascend_emu hidden; `{switch}` (or {ENV_TRACEBACK}=1) shows them"
