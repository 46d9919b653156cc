"""Backend selection: which implementation receives the normalised arguments of an op.

The op contract lives in :mod:`ascend_emu.ops`; a backend is a module exposing one function per
op family, taking that op's normalised-argument dataclass. Select with :func:`set_backend` or
the ``ASCEND_EMU_BACKEND`` environment variable (default ``emu``).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from ..errors import ModeError, arg_error, describe

#: Registered backends: name -> module path.
BACKENDS: dict[str, str] = {"emu": "ascend_emu.emu"}
_ENV = "ASCEND_EMU_BACKEND"
_selected: str | None = None


def set_backend(name: str) -> None:
    """Select the backend for every following op call.

    Raises:
        ModeError: ``name`` is not registered.
    """
    global _selected
    if name not in BACKENDS:
        raise arg_error(ModeError, "backend", f"one of {sorted(BACKENDS)}", describe(name))
    _selected = name


def backend_name() -> str:
    """Name of the selected backend."""
    name = _selected or os.environ.get(_ENV, "emu")
    if name not in BACKENDS:
        raise arg_error(ModeError, _ENV, f"one of {sorted(BACKENDS)}", describe(name))
    return name


def get_backend() -> ModuleType:
    """The selected backend module."""
    return importlib.import_module(BACKENDS[backend_name()])
