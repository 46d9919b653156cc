"""``npu`` device strings on the CPU: ``device="npu"`` / ``"npu:0"`` / ``torch.device("npu")``.

:func:`patch_torch` names torch's PrivateUse1 backend ``npu`` (``torch.utils.
rename_privateuse1_backend``), so torch parses the strings, and redirects what would allocate on
it: the factory functions (:data:`FACTORIES`, ``device=`` keyword), ``Tensor.new_*``,
``Tensor.to(...)`` (hence ``Module.to("npu")``) create / copy on the CPU and mark the result as on
the emulated NPU (:func:`~ascend_emu.torch_npu.npu.mark_npu`), as ``.npu()`` does.

What differs from a real device: ``tensor.device`` reports ``cpu`` (``tensor.is_npu`` is the
emulator's answer); a torch function not listed here given ``device="npu"`` fails with torch's
PrivateUse1 error; ``torch.Generator(device="npu")`` is not redirected;
``torch.accelerator.is_available()`` answers False (torch would otherwise take the named
PrivateUse1 backend for a real accelerator and ask it for streams, e.g. in ``torch.compile``).
"""

from __future__ import annotations

import functools

import torch

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


def patch_torch() -> None:
    """Name PrivateUse1 ``npu`` and redirect the factories and ``Tensor.to`` (idempotent)."""
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    for name in FACTORIES:
        if hasattr(torch, name):
            setattr(torch, name, _wrap_factory(getattr(torch, name)))
    for name in TENSOR_FACTORIES:
        setattr(torch.Tensor, name, _wrap_factory(getattr(torch.Tensor, name)))
    torch.Tensor.to = _tensor_to
    torch.accelerator.is_available = _no_accelerator


def _no_accelerator() -> bool:
    """``torch.accelerator.is_available``: False, the emulated NPU is host memory (module doc)."""
    return False
