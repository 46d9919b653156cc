"""Errors and warnings raised by ascend_emu.

Every error names the argument, what was expected and what was given, so a rejected call can be
fixed from the message alone. All errors subclass ``ValueError`` or ``TypeError`` (DESIGN.md,
"Errors and safety"), so callers that already catch those keep working.
"""

from __future__ import annotations


class AscendEmuError(Exception):
    """Base class of every error this package raises on purpose."""


class ShapeError(AscendEmuError, ValueError):
    """An argument has the wrong shape, or two shapes disagree."""


class DTypeError(AscendEmuError, TypeError):
    """An argument has a dtype the op does not accept in the selected mode."""


class ModeError(AscendEmuError, ValueError):
    """An unknown mode string, or an illegal combination of modes."""


class IndexRangeError(AscendEmuError, ValueError):
    """An index (cache_index, block id, slot) lies outside the cache it addresses."""


class FormatError(AscendEmuError, ValueError):
    """A tensor is not in the storage format the op requires (e.g. FRACTAL_NZ)."""


class BackendUnavailable(AscendEmuError, RuntimeError):
    """The selected backend cannot run here (e.g. ``hw`` without the real torch_npu or an NPU
    device); the message names what is missing and how to get it."""


class DuplicateSlotWarning(UserWarning):
    """Two tokens write the same cache slot; on hardware the result is undefined."""


class HardwareDivergenceWarning(UserWarning):
    """The emulator runs a call that torch_npu / CANN on Atlas A2 / A3 is known to reject.

    The emulator is otherwise never looser than the hardware; it accepts these few calls only
    because the project's specification asks for them, and says so each time: a script relying on
    one may fail on an Atlas machine. The message names the evidence.
    """


def arg_error(cls: type[AscendEmuError], name: str, expected: str, got: object) -> AscendEmuError:
    """Build ``cls`` with the house message format: ``name: expected ..., got ...``."""
    return cls(f"{name}: expected {expected}, got {got}")
