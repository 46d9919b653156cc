"""Backend selection: which implementation receives the normalised arguments of an op.

The op contract lives in :mod:`ascend_emu.ops`; a backend is a module exposing one function per
op family, taking that op's normalised-argument dataclass. Select with :func:`set_backend`, for a
block of code with ``with backend("hw"): ...`` (per thread / async context; it wins over
:func:`set_backend`), or the ``ASCEND_EMU_BACKEND`` environment variable (default ``emu``).

Backends: ``emu`` (the CPU, :mod:`ascend_emu.emu`) and ``hw`` (the real torch_npu on an Atlas
machine, :mod:`ascend_emu.hw`; without torch_npu or an NPU its ops raise
:class:`~ascend_emu.errors.BackendUnavailable`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
from types import ModuleType
from typing import Iterator

from ..errors import ModeError, arg_error, describe

#: Registered backends: name -> module path.
BACKENDS: dict[str, str] = {"emu": "ascend_emu.emu", "hw": "ascend_emu.hw"}
_ENV = "ASCEND_EMU_BACKEND"
_selected: str | None = None
_scoped: contextvars.ContextVar[str | None] = contextvars.ContextVar("ascend_emu_backend", default=None)


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
    name = _scoped.get() or _selected or os.environ.get(_ENV, "emu")
    if name not in BACKENDS:
        raise arg_error(ModeError, _ENV, f"one of {sorted(BACKENDS)}", describe(name))
    return name


def get_backend() -> ModuleType:
    """The selected backend module."""
    return importlib.import_module(BACKENDS[backend_name()])


@contextlib.contextmanager
def backend(name: str) -> Iterator[str]:
    """Select backend ``name`` for the op calls inside the ``with`` block (this thread / async
    context only; blocks nest), then restore the previous selection.

    >>> from ascend_emu import ops
    >>> with ops.backend("emu"):
    ...     ops.backend_name()
    'emu'

    Raises:
        ModeError: ``name`` is not registered.
    """
    if name not in BACKENDS:
        raise arg_error(ModeError, "backend", f"one of {sorted(BACKENDS)}", repr(name))
    token = _scoped.set(name)
    try:
        yield name
    finally:
        _scoped.reset(token)
