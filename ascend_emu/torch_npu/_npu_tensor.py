"""A real ``npu`` device for the emulated NPU (the default device model): :class:`NPUTensor`, a
tensor on ``npu:0`` over CPU memory.

An :class:`NPUTensor` is a wrapper subclass (``torch.Tensor._make_wrapper_subclass``) whose
``device`` is ``npu:0`` (torch's PrivateUse1 backend, named ``npu`` by
:func:`ascend_emu.torch_npu._device.patch_torch`) and whose values live in a plain CPU tensor,
its ``elem``. Every torch op on it goes through :meth:`NPUTensor.__torch_dispatch__`: the op runs
on the ``elem`` tensors (the CPU kernels, the same memory: views alias, in-place ops write
through) and every tensor it returns is wrapped again, so ``x + 1``, ``abs``, a dtype change,
views and the emulated ops (``torch.ops.npu.*``, read and written in place without copies) give
``npu`` tensors. A call that mixes NPU tensors with CPU tensors of one or more dimensions raises
torch's device-mismatch ``RuntimeError`` (for the emulated ops a
:func:`~ascend_emu.errors.runtime_error_class` ``DTypeError`` naming the argument), as on the
NPU; 0-dim CPU tensors count as scalars, as torch lets them. ``copy_`` between the devices is the
host/device copy. ``torch.save`` writes the values (torch's path for a PrivateUse1 tensor
without storage: a host copy) and ``torch.load`` puts them back with ``.to("npu")``; under
``torch.compile`` the subclass is traced through ``__tensor_flatten__``.

:func:`register_device` registers the Python device guard and hooks torch needs for a
PrivateUse1 tensor (indexing, device guards; ``torch.utils.backend_registration``): called once
when the drop-in installs, never when the real torch_npu is loaded. It also registers ``npu``
kernels for ``empty.memory_format``, ``empty_strided``, ``_copy_from`` and
``_copy_from_and_resize``: what torch's C++ side calls for the device of a call's tensors (the
0-dim tensor of a Python scalar in ``x[0] = 1.0``, ``Tensor.new_tensor``), giving NPU tensors
over CPU memory and the host / device copy.

Why a wrapper subclass rather than a CPU-backed PrivateUse1 allocator plus a fallback kernel:
the allocator needs a C++ extension built against the exact torch (a compiler at install time),
and a Python fallback kernel costs about what ``__torch_dispatch__`` costs; the subclass is
pure Python and keeps the CPU memory the ops read (docs/torch_npu.md#the-npu-device gives the
measured cost).
"""

from __future__ import annotations

import collections
import copy

import torch

from ..errors import DTypeError, arg_error, as_runtime_error

#: The one emulated device.
NPU_DEVICE = torch.device("npu", 0) if torch._C._get_privateuse1_backend_name() == "npu" else None
#: Namespaces of the emulated ops (their mixed-device errors name the argument).
EMULATED_NAMESPACES = frozenset({"npu", "atb", "_C_ascend", "custom"})
_TO_COPY = torch.ops.aten._to_copy.default
_COPY = frozenset({torch.ops.aten.copy_.default, torch.ops.aten._copy_from.default,
                   torch.ops.aten._copy_from_and_resize.default})
_Tensor = torch.Tensor
_strided = torch.strided
_MAKE_WRAPPER = torch.Tensor._make_wrapper_subclass
_registered = False


#: The drop-in's ``share_tags`` (:mod:`._format`, which sits above this module and registers it
#: when imported): how a host copy takes the format and NPU tags of the tensor it copies.
_TAG_SHARING: list = []


def register_tag_sharing(share_tags) -> None:
    """Called once by :mod:`._format` with its ``share_tags(src, dst)``."""
    _TAG_SHARING[:] = [share_tags]


def _fake_mode_active() -> bool:
    """Whether a FakeTensorMode is active (it converts tensors through their storage-less form)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


class NPUTensor(torch.Tensor):
    """A tensor on the emulated ``npu:0`` whose values are the CPU tensor ``elem`` (module doc).

    Args:
        elem: a strided CPU tensor; the NPU tensor shares its memory (no copy).
    """

    _elem: torch.Tensor
    #: no ``__torch_function__`` layer: torch functions reach ``__torch_dispatch__`` directly
    #: (and ``torch.compile`` traces the subclass through ``__tensor_flatten__``)
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        if elem.layout is _strided and not elem.requires_grad and not elem.storage_offset():
            return _wrap_new(elem)
        out = _MAKE_WRAPPER(cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
                            dtype=elem.dtype, layout=elem.layout, device=NPU_DEVICE,
                            requires_grad=elem.requires_grad)
        out._elem = elem
        return out

    def __repr__(self, *, tensor_contents=None) -> str:
        text = repr(self._elem)
        return text if "device=" in text else f"{text[:-1]}, device='{NPU_DEVICE}')"

    def __reduce_ex__(self, proto):
        # torch's own form for a PrivateUse1 tensor without storage: the values as a host tensor
        # and ``.to("npu:0")`` on load (loadable with weights_only=True, and by the real torch_npu);
        # a Parameter (``Parameter(npu_tensor)`` is this class flagged ``_is_param``) in torch's
        # Parameter form around that
        if getattr(self, "_is_param", False):
            return (torch._utils._rebuild_parameter,
                    (NPUTensor(self._elem), self.requires_grad, collections.OrderedDict()))
        host = torch.Tensor.cpu(self)
        if self._elem.__dict__ and _TAG_SHARING:  # the format travels as the host copy's tags (torch_npu's metadata)
            _TAG_SHARING[0](self._elem, host)
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (host, self.dtype, str(self.device), self.requires_grad))

    def __deepcopy__(self, memo):
        # torch's Tensor.__deepcopy__ would copy a storage this wrapper does not have: copy the
        # values (and their format tags) instead, keeping requires_grad and the Parameter flag
        if id(self) in memo:
            return memo[id(self)]
        out = NPUTensor(copy.deepcopy(self._elem, memo))
        if getattr(self, "_is_param", False):
            out = torch.nn.Parameter(out, self.requires_grad)
        elif self.requires_grad:
            out.requires_grad_(True)
        memo[id(self)] = out
        return out

    def tolist(self):
        """The values as nested Python lists (torch_npu copies them to the host first)."""
        return self._elem.tolist()

    def numpy(self, *, force: bool = False):
        """Refused as torch refuses it for a device tensor (``.cpu().numpy()`` is the way)."""
        raise TypeError(f"can't convert {NPU_DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the "
                        "tensor to host memory first.")

    def untyped_storage(self):
        """The storage of the values (the CPU tensor's; its ``device`` says ``cpu``): what tools
        that read a tensor's storage (msprobe's dump, ``data_ptr`` checks) need; torch's own
        (storage-less) answer inside a ``torch.compile`` session or an active FakeTensorMode, whose
        fake tensors need it."""
        if getattr(torch.compiler, "_is_compiling_flag", False) or _fake_mode_active():
            return _Tensor.untyped_storage(self)
        return self._elem.untyped_storage()

    def data_ptr(self) -> int:
        """The address of the values (the CPU tensor's memory), as a device pointer would be."""
        return self._elem.data_ptr()

    def __tensor_flatten__(self):
        return ["_elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return NPUTensor(inner["_elem"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _TO_COPY:
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cpu":  # device -> host: a plain copy
                return func(_unwrap(args[0]), **kwargs)
        if "device" in kwargs and kwargs["device"] is not None and torch.device(kwargs["device"]).type == "npu":
            kwargs = {**kwargs, "device": "cpu"}
        if func not in _COPY:
            _check_devices(func, args, kwargs)
        out = func(*[_unwrap_any(a) for a in args], **{k: _unwrap_any(v) for k, v in kwargs.items()})
        mutable = _MUTABLE.get(func)
        if mutable is None:
            mutable = _MUTABLE[func] = func._schema.is_mutable
        if mutable:
            _bump_versions(args, kwargs)
        return _wrap_any(out)


#: op -> whether its schema writes an argument (cached).
_MUTABLE: dict = {}


def _bump_versions(args, kwargs) -> None:
    """After an op that writes its arguments: bump the version counters of the NPU tensors'
    CPU tensors too (torch bumps the wrappers' only), so what is cached on the memory (the
    FRACTAL_NZ view and its widening, :func:`~ascend_emu.torch_npu._convert.nz_of`) sees the write."""
    for value in (*args, *kwargs.values()):
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if type(item) is NPUTensor:
                try:
                    torch.autograd.graph.increment_version(item._elem)
                except RuntimeError:  # inference tensors have no version counter
                    pass


def _unwrap(t):
    return t._elem if type(t) is NPUTensor else t


def _unwrap_any(value):
    if type(value) is NPUTensor:
        return value._elem
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap_any(v) for v in value)
    return value


def _wrap_any(value):
    if isinstance(value, _Tensor) and type(value) is not NPUTensor:  # FakeTensors too, under torch.compile
        return NPUTensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_wrap_any(v) for v in value)
    return value


def _host_tensor(value) -> bool:
    return type(value) is not NPUTensor and isinstance(value, _Tensor) and value.dim() > 0 \
        and value.device.type == "cpu"


#: Indexing ops whose index tensors may be on the CPU, as torch lets them for a device tensor.
_HOST_INDICES = frozenset(getattr(torch.ops.aten, op).default if "." not in op else
                          getattr(getattr(torch.ops.aten, op.split(".")[0]), op.split(".")[1])
                          for op in ("index.Tensor", "index_put", "index_put_", "_index_put_impl_",
                                     "_unsafe_index.Tensor", "_unsafe_index_put"))


def _check_devices(func, args, kwargs) -> None:
    """Reject a CPU tensor of one or more dimensions among NPU tensors (module doc); the indices
    of an indexing op may be on the CPU."""
    if func in _HOST_INDICES:
        args = (args[0], *args[2:])
        kwargs = {k: v for k, v in kwargs.items() if k != "indices"}
    flat = [*args, *kwargs.values()]
    for value in flat:
        if isinstance(value, (list, tuple)):
            flat.extend(value)
    if not any(_host_tensor(v) for v in flat):
        return
    schema = func._schema
    if func.namespace in EMULATED_NAMESPACES:
        names = [a.name for a in schema.arguments]
        named = {**dict(zip(names, args, strict=False)), **kwargs}  # positional args are the leading ones
        for name, value in named.items():
            items = value if isinstance(value, (list, tuple)) else (value,)
            for item in items:
                if _host_tensor(item):
                    raise _mixed(name, item, f"{func.namespace}::{func._schema.name.split('::')[-1]}")
    raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                       f"{NPU_DEVICE} and cpu!")


def check_same_device(on_npu: dict, params: dict, public: str, names=None) -> None:
    """The eager path's device check of an emulated op called with NPU tensors (``on_npu``: name
    -> NPUTensor, replaced in ``params`` by their CPU tensors): another tensor argument of one
    or more dimensions is on the CPU, a cpu / npu mix, rejected naming it (as :func:`_check_devices`).
    ``names``: the op's tensor arguments (the only ones that can hold a tensor on the eager
    path), else every entry of ``params`` is looked at.

    Raises:
        DTypeError (a ``RuntimeError`` too): the first such argument.
    """
    for name in params if names is None else names:
        value = params[name]
        if type(value) is _Tensor and name not in on_npu and value.dim() > 0:
            raise _mixed(name, value, public)


def _mixed(name: str, value: torch.Tensor, public: str):
    return as_runtime_error(arg_error(
        DTypeError, name, f"a tensor on {NPU_DEVICE} like the call's other tensors ({public}: Expected all "
        f"tensors to be on the same device, but found at least two devices, {NPU_DEVICE} and cpu)",
        f"a tensor on cpu: {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"))


def _wrap_new(elem: torch.Tensor) -> NPUTensor:
    """A new :class:`NPUTensor` over ``elem``, a strided CPU tensor at storage offset 0 that does
    not require grad (what an op kernel returns), with the fewest keywords
    ``_make_wrapper_subclass`` takes for it: the most of a new output's cost."""
    out = _MAKE_WRAPPER(NPUTensor, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=NPU_DEVICE)
    out._elem = elem
    return out


def _wrap_output(value, on_npu: dict):
    """One output of an emulated op on the NPU (:func:`wrap_outputs`)."""
    if type(value) is _Tensor:
        for t in on_npu.values():
            if t._elem is value:
                return t
        if value.layout is _strided and not value.requires_grad and not value.storage_offset():
            return _wrap_new(value)
        return NPUTensor(value)
    if isinstance(value, _Tensor):
        return value if type(value) is NPUTensor else NPUTensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_wrap_output(v, on_npu) for v in value)
    return value


def wrap_outputs(out, on_npu: dict):
    """An emulated op's outputs from a call on NPU tensors, on the NPU: an output that is an
    argument's CPU tensor is that argument (in-place ops return their argument), any other a
    new NPUTensor over its memory."""
    if type(out) is tuple:  # several outputs: the arguments' memory looked up by identity, built once
        by_elem = None
        wrapped = []
        for value in out:
            if type(value) is _Tensor:
                if by_elem is None:
                    by_elem = {id(t._elem): t for t in on_npu.values()}
                same = by_elem.get(id(value))
                if same is None:
                    same = _wrap_new(value) if (value.layout is _strided and not value.requires_grad
                                                and not value.storage_offset()) else NPUTensor(value)
                wrapped.append(same)
            else:
                wrapped.append(_wrap_output(value, on_npu))
        return tuple(wrapped)
    return _wrap_output(out, on_npu)


def to_npu(t: torch.Tensor) -> NPUTensor:
    """``t`` (a CPU tensor) as an :class:`NPUTensor` over the same memory; an NPU tensor as is."""
    return t if type(t) is NPUTensor else NPUTensor(t)


def register_device() -> None:
    """Register the device guard and hooks torch needs for tensors on ``npu`` (idempotent)."""
    global _registered, NPU_DEVICE
    if _registered:
        return
    from torch.utils import backend_registration

    NPU_DEVICE = torch.device("npu", 0)
    torch._C._acc.register_python_privateuseone_hook(backend_registration._DummyPrivateUse1Hook())
    torch._C._acc.register_python_privateuseone_device_guard(backend_registration._DummyDeviceGuard())
    # what torch's C++ side allocates on the device of a call's tensors (the 0-dim tensor of a
    # Python scalar in ``x[0] = 1.0``, ``torch.where(c, x, 0.0)``): NPU tensors over CPU memory
    _ALLOCATORS.impl("empty.memory_format", _empty, "PrivateUse1")
    _ALLOCATORS.impl("empty_strided", _empty_strided, "PrivateUse1")
    _ALLOCATORS.impl("_copy_from", _copy_from, "PrivateUse1")
    _ALLOCATORS.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    _registered = True


#: ``aten`` kernels registered for the npu (PrivateUse1) device by :func:`register_device`.
_ALLOCATORS = torch.library.Library("aten", "IMPL")


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return NPUTensor(torch.empty(size, dtype=dtype, layout=layout, device="cpu", memory_format=memory_format))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return NPUTensor(torch.empty_strided(size, stride, dtype=dtype, layout=layout, device="cpu"))


def _copy_from(self, dst, non_blocking=False):
    """The host <-> device copy torch's ``copy_`` asks the device for (into ``dst``)."""
    _unwrap(dst).copy_(_unwrap(self))
    return dst


def _copy_from_and_resize(self, dst):
    _unwrap(dst).resize_(self.shape).copy_(_unwrap(self))
    return dst
