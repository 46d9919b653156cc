"""``torch.npu`` / ``torch_npu.npu``: the device namespace scripts touch, for one emulated NPU.

Importing :mod:`ascend_emu.torch_npu` installs this module as ``torch.npu`` and patches
``Tensor.npu()``, ``Tensor.cpu()`` and ``Module.npu()`` (:func:`patch_torch`), as the real
``import torch_npu`` does on an Atlas machine. The emulated NPU is the CPU: every tensor is a CPU
tensor, every call is synchronous, and there is exactly one device, index 0.

Host and device memory stay separate, as on hardware: ``t.npu()`` of a host tensor is a copy
on the NPU (an :class:`~ascend_emu.torch_npu._npu_tensor.NPUTensor` on the ``npu`` device,
docs/torch_npu.md#the-npu-device; with ``ASCEND_EMU_NPU_DEVICE=mark``, a CPU tensor marked as
living on the NPU), and ``.cpu()`` of such a tensor is a copy back. So an op that updates
a cache in place (``k_cache_npu = k_cache.npu()``) leaves the host ``k_cache`` as it was, and a
script comparing ``k_cache_npu.cpu()`` with a golden computed from ``k_cache`` compares two
different tensors, as it does on an Atlas machine. Tensors the ops and ``npu_format_cast`` return
are on the NPU too; ``.npu()`` of an NPU tensor returns it unchanged.

Device strings: ``device="npu"`` / ``"npu:0"`` in factory functions, ``.to("npu")`` and
``Module.to("npu")`` work (:mod:`ascend_emu.torch_npu._device`): the tensor is created on the
CPU and put on the NPU, and ``tensor.device`` reports ``npu:0`` for it (``tensor.is_npu``
is True).

Not emulated: memory statistics, multi-device placement; in the ``mark`` model, the NPU mark
does not follow views and results of torch ops (they report ``cpu``).

The SoC name (:func:`get_device_name`) is ``Ascend910B2`` (Atlas A2) unless the environment
variable ``ASCEND_EMU_SOC_NAME`` names another (``Ascend910_9391`` for Atlas A3,
``Ascend950PR_9599`` for an Ascend 950; :mod:`ascend_emu.soc`, the one setting
:mod:`ascend_emu.ops` reads too): test suites gate on it (``SupportedDevices(['Ascend910B'])``),
and the Ascend 950 ops run only on an Ascend 950 name. It changes no numerics.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from types import SimpleNamespace

import torch

from ...soc import DEFAULT_SOC_NAME, SOC_NAME_ENV, soc_name  # noqa: F401  (the one SoC setting)
from .._npu_tensor import NPUTensor, to_npu

#: Devices the emulator offers.
DEVICE_COUNT = 1
#: Attribute (in a tensor's ``__dict__``) marking it as living on the emulated NPU.
ON_NPU_ATTR = "_ascend_emu_on_npu"
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
    """The emulated SoC's name (:func:`ascend_emu.soc.soc_name`: ``$ASCEND_EMU_SOC_NAME`` or
    ``Ascend910B2``); e.g. ``Ascend910_9391`` for an Atlas A3, ``Ascend950PR_9599`` for an
    Ascend 950."""
    _index(device)
    return soc_name()


def get_device_properties(device=None) -> SimpleNamespace:
    """The emulated device's properties, as far as the emulator knows them: ``name`` (the SoC,
    :func:`get_device_name`; op-plugin's tests branch on ``"Ascend950" in ...name``). Memory
    sizes and core counts are not emulated (no such attribute)."""
    return SimpleNamespace(name=get_device_name(device))


def manual_seed(seed: int) -> None:
    """Seed torch's (CPU) generator, the one the emulated NPU draws from.

    Not through ``torch.manual_seed``: that calls back into ``torch.npu.manual_seed_all`` (the
    PrivateUse1 backend is named ``npu``), which must not recurse.
    """
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    """Seed torch's (CPU) generator non-deterministically."""
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    """torch's (CPU) generator's initial seed."""
    return torch.default_generator.initial_seed()


def _is_in_bad_fork() -> bool:
    """False: the emulated device survives fork (``torch.manual_seed`` asks)."""
    return False


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


#: Environment variable selecting the device model: unset or ``tensor`` (the default), NPU tensors
#: are on a real ``npu`` device (:class:`~ascend_emu.torch_npu._npu_tensor.NPUTensor`); ``mark``,
#: they are CPU tensors marked as on the NPU (this module's doc). Read once, when the drop-in is
#: imported.
DEVICE_MODEL_ENV = "ASCEND_EMU_NPU_DEVICE"
#: True when NPU tensors are :class:`~ascend_emu.torch_npu._npu_tensor.NPUTensor` (``tensor`` model).
REAL_DEVICE = os.environ.get(DEVICE_MODEL_ENV, "tensor") == "tensor"
if os.environ.get(DEVICE_MODEL_ENV, "tensor") not in ("mark", "tensor"):
    raise ValueError(f"{DEVICE_MODEL_ENV}: expected 'mark' or 'tensor', got {os.environ[DEVICE_MODEL_ENV]!r}")


def is_on_npu(t) -> bool:
    """True for a tensor on the emulated NPU (from ``.npu()``, an op or ``npu_format_cast``)."""
    return isinstance(t, torch.Tensor) and (type(t) is NPUTensor or t.__dict__.get(ON_NPU_ATTR, False))


def mark_npu(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the emulated NPU: an :class:`NPUTensor` over its memory with the real device
    (:data:`REAL_DEVICE`), else ``t`` itself, marked in place."""
    if REAL_DEVICE:
        return to_npu(t)
    t.__dict__[ON_NPU_ATTR] = True
    return t


def mark_output(t: torch.Tensor) -> torch.Tensor:
    """An op kernel's new output: marked as on the NPU in the ``mark`` model; as is with the real
    device, where ``NPUTensor.__torch_dispatch__`` puts it on the device of the call's tensors
    (an all-CPU call gives CPU outputs)."""
    if not REAL_DEVICE:
        t.__dict__[ON_NPU_ATTR] = True
    return t


#: torch's own ``Tensor.cpu`` / ``Tensor.clone`` (kept once, so that patching twice does not wrap
#: the patch; the clone patch of :mod:`.._format` copies tags, which a host copy must not).
_TORCH_CPU = getattr(torch.Tensor.cpu, "__wrapped__", torch.Tensor.cpu)
_TORCH_CLONE = getattr(torch.Tensor.clone, "__wrapped__", torch.Tensor.clone)


def _tensor_npu(self, device=None, non_blocking: bool = False, memory_format=torch.preserve_format):
    """``Tensor.npu()``: an NPU tensor as is; a host tensor copied to the NPU (a new tensor, like
    the host-to-device copy of torch_npu; autograd sees it as a copy)."""
    _index(device)
    if is_on_npu(self):
        return self
    return mark_npu(_TORCH_CLONE(self, memory_format=memory_format))


def _tensor_cpu(self, memory_format=torch.preserve_format):
    """``Tensor.cpu()``: a copy back to the host for an NPU tensor; torch's own behaviour (the
    tensor itself) for a host tensor."""
    if type(self) is not NPUTensor and is_on_npu(self):
        return _TORCH_CLONE(self, memory_format=memory_format)
    return _TORCH_CPU(self, memory_format=memory_format)  # an NPUTensor: the device-to-host copy


_tensor_cpu.__wrapped__ = _TORCH_CPU


def _module_npu(self, device=None):
    """``Module.npu()``: the module itself, its parameters and buffers moved to the NPU in place
    (the same objects, as torch_npu keeps the Parameter objects)."""
    _index(device)
    if REAL_DEVICE:  # new Parameter objects over NPU tensors (their types differ)
        return self._apply(lambda t: t if type(t) is NPUTensor else to_npu(t.detach().clone()))
    for t in (*self.parameters(), *self.buffers()):
        mark_npu(t)
    return self


def patch_torch() -> None:
    """Do what ``import torch_npu`` does to torch: ``torch.npu``, ``Tensor.npu``, ``Tensor.cpu``,
    ``Module.npu``."""
    module = sys.modules[__name__]
    torch.npu = module
    sys.modules["torch.npu"] = module
    torch.Tensor.npu = _tensor_npu
    torch.Tensor.cpu = _tensor_cpu
    torch.Tensor.is_npu = property(is_on_npu)
    torch.nn.Module.npu = _module_npu


#: ``torch_npu.npu.utils`` (imported last: it uses this module's device functions).
utils = importlib.import_module(f"{__name__}.utils")
