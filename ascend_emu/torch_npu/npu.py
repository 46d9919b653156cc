"""``torch.npu`` / ``torch_npu.npu``: the device namespace scripts touch, for one emulated NPU.

Importing :mod:`ascend_emu.torch_npu` installs this module as ``torch.npu`` and makes
``Tensor.npu()`` / ``Module.npu()`` return the object itself, as the real ``import torch_npu``
does on an Atlas machine (:func:`patch_torch`). The emulated NPU is the CPU: tensors stay CPU
tensors, every call is synchronous, and there is exactly one device, index 0.

Not emulated: ``device="npu"`` / ``.to("npu")`` strings (torch itself rejects the device type;
use ``.npu()``), memory statistics, multi-device placement.
"""

from __future__ import annotations

import contextlib
import sys
import time
from types import SimpleNamespace

import torch

#: Devices the emulator offers.
DEVICE_COUNT = 1
_DEVICE_NAME = "Ascend NPU (ascend_emu, emulated on the CPU)"
_current = 0

#: ``torch.npu.config``: switches scripts set; the emulator accepts and ignores them (FRACTAL_NZ
#: tagging by ``npu_format_cast`` works whatever ``allow_internal_format`` says).
config = SimpleNamespace(
    allow_internal_format=False,
    matmul=SimpleNamespace(allow_hf32=False),
    conv=SimpleNamespace(allow_hf32=True),
)


def is_available() -> bool:
    """True: the emulated NPU is always there."""
    return True


def is_initialized() -> bool:
    """True."""
    return True


def init() -> None:
    """No-op."""


def device_count() -> int:
    """Number of emulated NPUs (1)."""
    return DEVICE_COUNT


def _index(device) -> int:
    """Device index of ``device``: None (current), an int, ``"npu"`` / ``"npu:0"``, or a
    ``torch.device`` with an index."""
    if device is None:
        return _current
    if isinstance(device, torch.device):
        idx = device.index
    elif isinstance(device, str):
        kind, _, num = device.partition(":")
        if kind != "npu":
            raise ValueError(f"device: expected 'npu' or 'npu:<index>', got {device!r}")
        idx = int(num) if num else None
    else:
        idx = int(device)
    idx = _current if idx is None else idx
    if not 0 <= idx < DEVICE_COUNT:
        raise ValueError(f"device: expected an index in [0, {DEVICE_COUNT}) (the emulator has "
                         f"{DEVICE_COUNT} NPU), got {idx}")
    return idx


def current_device() -> int:
    """Index of the current device (0)."""
    return _current


def set_device(device) -> None:
    """Select the current device (only index 0 exists).

    Raises:
        ValueError: an index other than 0.
    """
    global _current
    _current = _index(device)


def synchronize(device=None) -> None:
    """No-op: emulated calls are synchronous."""
    _index(device)


def get_device_name(device=None) -> str:
    """A name saying the device is emulated."""
    _index(device)
    return _DEVICE_NAME


def manual_seed(seed: int) -> None:
    """Seed torch's (CPU) generator."""
    torch.manual_seed(seed)


manual_seed_all = manual_seed


def empty_cache() -> None:
    """No-op."""


class Stream:
    """A stream of the emulated NPU: work runs at call time, so there is nothing to wait for."""

    def __init__(self, device=None, priority: int = 0):
        self.device = _index(device)
        self.priority = priority

    def synchronize(self) -> None:
        """No-op."""

    def query(self) -> bool:
        """True: all work is done."""
        return True

    def wait_stream(self, stream: "Stream") -> None:
        """No-op."""

    def wait_event(self, event: "Event") -> None:
        """No-op."""

    def record_event(self, event: "Event | None" = None) -> "Event":
        """Record ``event`` (a new one if None) now."""
        event = event or Event()
        event.record(self)
        return event


_default_stream = Stream()


def current_stream(device=None) -> Stream:
    """The one stream."""
    _index(device)
    return _default_stream


default_stream = current_stream


@contextlib.contextmanager
def stream(s: Stream | None):
    """Context manager selecting a stream (no effect)."""
    yield s


class Event:
    """An event; with ``enable_timing=True`` :meth:`elapsed_time` gives host wall time in ms."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        """Take the time now."""
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        """No-op."""

    def wait(self, stream: Stream | None = None) -> None:
        """No-op."""

    def query(self) -> bool:
        """True."""
        return True

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event's record to ``end_event``'s.

        Raises:
            RuntimeError: timing not enabled, or an event not recorded.
        """
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("elapsed_time: both events need enable_timing=True")
        if self._t is None or end_event._t is None:
            raise RuntimeError("elapsed_time: both events must be recorded first")
        return (end_event._t - self._t) * 1e3


def _tensor_npu(self, device=None, non_blocking: bool = False, memory_format=torch.preserve_format):
    """``Tensor.npu()``: the emulated NPU is the CPU, so the tensor itself."""
    _index(device)
    return self


def _module_npu(self, device=None):
    """``Module.npu()``: the module itself (its parameters stay on the CPU)."""
    _index(device)
    return self


def patch_torch() -> None:
    """Do what ``import torch_npu`` does to torch: ``torch.npu``, ``Tensor.npu``, ``Module.npu``."""
    module = sys.modules[__name__]
    torch.npu = module
    sys.modules["torch.npu"] = module
    torch.Tensor.npu = _tensor_npu
    torch.nn.Module.npu = _module_npu
