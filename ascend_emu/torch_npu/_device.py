"""``npu`` device strings on the CPU: ``device="npu"`` / ``"npu:0"`` / ``torch.device("npu")``.

:func:`patch_torch` names torch's PrivateUse1 backend ``npu`` (``torch.utils.
rename_privateuse1_backend``), so torch parses the strings, and redirects what would allocate on
it: the factory functions (:data:`FACTORIES`, ``device=`` keyword), ``Tensor.new_*``,
``Tensor.to(...)`` (hence ``Module.to("npu")``) create / copy on the CPU and mark the result as on
the emulated NPU (:func:`~ascend_emu.torch_npu.npu.mark_npu`), as ``.npu()`` does.

``tensor.device`` is ``npu:0`` for a marked tensor: ``.npu()``, ``.to("npu")``,
``device="npu"`` factories, ``Module.to("npu")`` / ``.npu()`` parameters and buffers, outputs of
the ``torch_npu`` ops and ``npu_format_cast``, ``copy.deepcopy`` / ``torch.load`` of those. It
is ``cpu`` for everything else, in particular (the mark does not follow them; following would take
a ``__torch_function__`` hook on every torch call, or an NPU tensor subclass that changes
``type(x)`` and what ``torch.compile`` sees): results of torch
ops (``x.npu() + 1``, ``torch.empty_like(x)``), views (``x[0]``, ``x.view(...)``, ``x.T``),
``x.detach()`` and so ``state_dict()`` tensors, gradients (``torch.testing.assert_close`` of an
NPU tensor against one of those reports a device mismatch). Inside a ``torch.compile`` /
``torch.export`` session every tensor reports its real device (``cpu``), so the fake tensors
and generated code are CPU ones and ``x.device`` read in compiled code is ``cpu``. The C++ side
(``is_cpu``, ``get_device()``, device checks of torch ops) always sees the CPU, so mixing
marked and unmarked tensors in one op never fails. The ``.device`` lookup is a Python property
on ``torch.Tensor`` (about 0.1 us for an unmarked tensor, against 0.05 us for torch's own).

``torch.Generator(device="npu")`` is a CPU generator reporting ``npu:0`` (:class:`Generator`;
``isinstance(g, torch.Generator)`` holds for every torch generator).

By default (:data:`~ascend_emu.torch_npu.npu.REAL_DEVICE`, ``ASCEND_EMU_NPU_DEVICE`` unset or
``tensor``) the tensors put on the NPU are :class:`~ascend_emu.torch_npu._npu_tensor.NPUTensor`
objects, on a real ``npu`` device (docs/torch_npu.md#the-npu-device), and :func:`patch_torch`
registers its device guard; what this doc says of marks is the ``mark`` model
(``ASCEND_EMU_NPU_DEVICE=mark``).

What differs from a real device in the ``mark`` model: a torch function not listed here given ``device="npu"`` fails
with torch's PrivateUse1 error; ``torch.accelerator.is_available()`` answers False (torch would
otherwise take the named PrivateUse1 backend for a real accelerator and ask it for streams, e.g.
in ``torch.compile``).
"""

from __future__ import annotations

import functools

import torch
import torch.compiler

from . import npu as _npu

#: ``torch.<name>`` functions whose ``device=`` keyword is redirected.
FACTORIES = ("empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange",
             "linspace", "logspace", "eye", "tensor", "as_tensor", "empty_like", "zeros_like", "ones_like",
             "full_like", "rand_like", "randn_like", "randint_like", "normal", "scalar_tensor", "tril_indices",
             "triu_indices")
#: ``Tensor.<name>`` methods whose ``device=`` keyword is redirected.
TENSOR_FACTORIES = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided")


def is_npu_device(device) -> bool:
    """True for ``"npu"``, ``"npu:N"``, ``torch.device("npu[:N]")`` (validating the index)."""
    if isinstance(device, str):
        if device.split(":")[0] != "npu":
            return False
    elif isinstance(device, torch.device):
        if device.type != "npu":
            return False
    else:
        return False
    _npu._index(device if isinstance(device, str) else device.index)
    return True


def _wrap_factory(fn):
    if getattr(fn, "_ascend_emu_redirect", False):
        return fn

    @functools.wraps(fn)
    def factory(*args, **kwargs):
        if is_npu_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
            return _npu.mark_npu(fn(*args, **kwargs))
        return fn(*args, **kwargs)

    factory._ascend_emu_redirect = True
    return factory


_TORCH_TO = getattr(torch.Tensor.to, "__wrapped__", torch.Tensor.to)
_TORCH_CLONE = _npu._TORCH_CLONE


def _tensor_to(self, *args, **kwargs):
    """``Tensor.to``: an ``npu`` device becomes the CPU, and the result is on the NPU (a copy for
    a host tensor, as a host-to-device copy is)."""
    args = list(args)
    if type(self) is _npu.NPUTensor:  # the real device: torch's own .to, npu:0 being a device it knows
        if args and isinstance(args[0], (str, torch.device)) and is_npu_device(args[0]):
            args[0] = NPU_DEVICE
        elif is_npu_device(kwargs.get("device")):
            kwargs["device"] = NPU_DEVICE
        return _TORCH_TO(self, *args, **kwargs)
    target = None
    if args and (isinstance(args[0], (str, torch.device))):
        if is_npu_device(args[0]):
            target, args[0] = args[0], "cpu"
    elif is_npu_device(kwargs.get("device")):
        target, kwargs["device"] = kwargs["device"], "cpu"
    if target is None:
        out = _TORCH_TO(self, *args, **kwargs)
        if not _npu.is_on_npu(self):
            return out
        if _targets_cpu(args, kwargs):
            return _TORCH_CLONE(self) if out is self else out  # device -> host: a copy, unmarked
        return out if out is self else _npu.mark_npu(out)  # a dtype change stays on the NPU
    out = _TORCH_TO(self, *args, **kwargs)
    if _npu.is_on_npu(self) and out is self:
        return self
    if out is self:
        out = _TORCH_CLONE(self)  # host -> device is a copy
        if kwargs.get("memory_format") is not None:
            out = out.contiguous(memory_format=kwargs["memory_format"])
    if self.__dict__ and out.dtype == self.dtype:
        from ._format import share_tags

        share_tags(self, out)
    return _npu.mark_npu(out)


def _targets_cpu(args, kwargs) -> bool:
    dev = args[0] if args and isinstance(args[0], (str, torch.device)) else kwargs.get("device")
    return dev is not None and torch.device(dev).type == "cpu"


_tensor_to.__wrapped__ = _TORCH_TO


#: torch's own ``Tensor.device`` (the C getter of ``TensorBase``) and ``torch.Generator``.
_TORCH_DEVICE = torch._C.TensorBase.device
_TORCH_DEVICE_GET = _TORCH_DEVICE.__get__
_TORCH_GENERATOR = torch._C.Generator
#: What ``.device`` reports for a tensor on the emulated NPU (the one device, index 0; set by
#: :func:`patch_torch`, once torch knows the name ``npu``).
NPU_DEVICE: torch.device | None = None
_ON_NPU = _npu.ON_NPU_ATTR


if hasattr(torch.compiler, "_is_compiling_flag"):  # torch >= 2.6: set for a whole compile / export session
    def _compiling() -> bool:
        return torch.compiler._is_compiling_flag
else:  # pragma: no cover - older torch: only inside Dynamo-traced frames
    _compiling = getattr(torch.compiler, "is_compiling", lambda: False)


def _tensor_device(self) -> torch.device:
    """``Tensor.device``: ``npu:0`` for a tensor marked as on the emulated NPU, outside a
    ``torch.compile`` / ``torch.export`` session; torch's own answer otherwise (module doc)."""
    if _ON_NPU in self.__dict__ and not _compiling():
        return NPU_DEVICE
    return _TORCH_DEVICE_GET(self)


class _GeneratorMeta(type(_TORCH_GENERATOR)):
    """``isinstance(g, torch.Generator)`` stays True for every torch generator."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _TORCH_GENERATOR)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _TORCH_GENERATOR)


class Generator(_TORCH_GENERATOR, metaclass=_GeneratorMeta):
    """``torch.Generator(device="npu")``: a CPU generator (the emulated NPU draws from the CPU)
    whose ``device`` reports ``npu:0``; any other device gives torch's own generator.

    Args:
        device: ``"npu"`` / ``"npu:0"`` / ``torch.device("npu")``, or what torch accepts.

    Raises:
        ValueError: an NPU index other than 0.
    """

    def __new__(cls, device=None, *args, **kwargs):
        if is_npu_device(device):
            return _TORCH_GENERATOR.__new__(cls, "cpu")
        return _TORCH_GENERATOR(*(() if device is None else (device,)), *args, **kwargs)

    def __init__(self, device=None, *args, **kwargs):
        pass

    @property
    def device(self) -> torch.device:
        """``npu:0``."""
        return NPU_DEVICE

    def __reduce__(self):
        return (Generator, ("npu",), self.get_state())

    def __setstate__(self, state):
        self.set_state(state)


def patch_torch() -> None:
    """Name PrivateUse1 ``npu``, redirect the factories, ``Tensor.to`` and
    ``torch.Generator``, and make ``Tensor.device`` report the NPU mark (idempotent)."""
    global NPU_DEVICE
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    NPU_DEVICE = torch.device("npu", 0)
    if _npu.REAL_DEVICE:
        from ._npu_tensor import register_device

        register_device()
    for name in FACTORIES:
        if hasattr(torch, name):
            setattr(torch, name, _wrap_factory(getattr(torch, name)))
    for name in TENSOR_FACTORIES:
        setattr(torch.Tensor, name, _wrap_factory(getattr(torch.Tensor, name)))
    torch.Tensor.to = _tensor_to
    torch.Tensor.device = property(_tensor_device, doc=_TORCH_DEVICE.__doc__)
    torch.Generator = Generator
    torch.accelerator.is_available = _no_accelerator


def _no_accelerator() -> bool:
    """``torch.accelerator.is_available``: False, the emulated NPU is host memory (module doc)."""
    return False
