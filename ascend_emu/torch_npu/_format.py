"""Storage-format tags of torch tensors: ``npu_format_cast`` / ``npu_format_cast_`` /
``get_npu_format`` kernels, and the patches that make the tags follow a tensor the way
torch_npu users expect.

Only FRACTAL_NZ (29) has an emulated layout (:class:`~ascend_emu.layouts.NZArray`, the bytes the
NPU would hold); the other formats torch_npu scripts cast to (:data:`KEPT_FORMATS`) are kept as
a tag that :func:`get_npu_format` reports, the values untouched. ND (2) carries no tag.

Where a tag follows (:func:`patch_torch`):

- ``t.clone()`` (a new NZArray over the clone's memory), ``nn.Parameter(t)`` and
  ``t.data`` (the same NZArray: same memory), ``param.data = t`` (the parameter takes ``t``'s
  tag, or loses its own when ``t`` has none), hence ``copy.deepcopy`` of a module and
  ``Module.to("npu")``;
- in-place writes (``load_state_dict`` into an NZ parameter, ``copy_``): the tag stays, with a
  fresh NZArray so no cached widening of the old values is used (:mod:`._convert`);
- ``copy.deepcopy`` and ``torch.save`` / ``torch.load``, as torch_npu 2.14 does it: the file
  holds the ND values (torch_npu's device-to-host copy of an NZ tensor converts to ND) and the
  format as metadata (torch_npu's ``npu_info_serialization`` writes ``npu_format_``; here the
  pickled tensor state, :data:`SAVED_ATTR`); a load that puts the tensor back on the NPU
  re-applies the format over the loaded ND values (torch_npu: ``npu_format_cast_``), a load
  mapped to the CPU (``map_location="cpu"``) gives a plain host tensor. The NZ byte order is
  never written, so it can never be read back as ND data. A file loads in plain torch too (the
  extra state becomes an unused attribute).

Where it does not (documented in docs/torch_npu.md): views (``t[0]``, ``t.view(...)``, ``t.T``), results
of torch ops (``t + 0``, ``t.to(dtype)``, ``t.contiguous()`` of a non-contiguous tensor),
``state_dict()`` tensors (detached; ``load_state_dict`` into an NZ parameter keeps its tag).

Source: the npu_format_cast doc, docs/sources.md#fractal_nz, torch_npu 2.14's format-cast schemas and
op-plugin's ``test/test_base_ops/test_format_cast.py`` (the format a cast to ND gives);
save / load: torch_npu 2.14's ``utils/serialization.py`` and ``utils/storage.py`` (host copy of
the storage), Ascend/pytorch's ``NPUSerialization.cpp`` / ``StorageDescHelper.cpp`` (format
metadata and its re-application) and ``test/npu/test_serialization.py``.
"""

from __future__ import annotations

import enum
import functools
import threading

import numpy as np
import torch

from ..errors import ModeError, arg_error, describe
from ..layouts import FRACTAL_NZ, ND
from ._convert import NZ_ATTR, _plain_numpy, nz_of, tag_nz, tag_nz_view, to_numpy, to_torch, untag_nz
from . import _npu_tensor
from .npu import ON_NPU_ATTR, REAL_DEVICE, mark_npu, mark_output

#: Attribute (in a tensor's ``__dict__``) holding a format code kept as a tag only.
FORMAT_ATTR = "_ascend_emu_format"

#: ACL formats torch_npu scripts cast to that the emulator keeps as tags (values unchanged):
#: 0 NCHW, 3 NC1HWC0, 4 FRACTAL_Z, 30 NCDHW, 32 NDC1HWC0, 33 FRACTAL_Z_3D.
KEPT_FORMATS = {0: "NCHW", 3: "NC1HWC0", 4: "FRACTAL_Z", 30: "NCDHW", 32: "NDC1HWC0", 33: "FRACTAL_Z_3D"}

#: Every format ``npu_format_cast`` accepts.
ACCEPTED_FORMATS = {ND: "ND", FRACTAL_NZ: "FRACTAL_NZ", **KEPT_FORMATS}

class Format(enum.IntEnum):
    """``torch_npu.Format``: the ACL storage-format codes (CANN ``acl_base.h`` ``aclFormat``), ints
    that ``npu_format_cast`` and ``get_npu_format`` take and give. Callers write
    ``npu_format_cast(w, torch_npu.Format.FRACTAL_NZ)`` (vllm-ascend, cann-recipes-infer) and
    msprobe's dump compares ``get_npu_format(t) == torch_npu.Format.FRACTAL_NZ``. Only the codes of
    :data:`ACCEPTED_FORMATS` are emulated; the others name what the enum holds."""

    UNDEFINED = -1
    NCHW = 0
    NHWC = 1
    ND = 2
    NC1HWC0 = 3
    FRACTAL_Z = 4
    NC1HWC0_C04 = 12
    HWCN = 16
    NDHWC = 27
    FRACTAL_NZ = 29
    NCDHW = 30
    NDC1HWC0 = 32
    FRACTAL_Z_3D = 33
    NC = 35
    NCL = 47


#: A cast to ND (2) of a 4-D tensor in one of these formats gives NCHW (0), as torch_npu does
#: (their base format is NCHW; op-plugin's test_format_cast expects 3 -> 2 to report 0).
NCHW_BASED = (3, 4)

_TAGS = (FORMAT_ATTR, ON_NPU_ATTR)


def get_npu_format(t) -> int:
    """``torch_npu.get_npu_format``: 29 for a FRACTAL_NZ tensor, a kept format's code, else 2."""
    if nz_of(t) is not None:
        return FRACTAL_NZ
    if isinstance(t, torch.Tensor):
        return (t._elem if type(t) is _npu_tensor.NPUTensor else t).__dict__.get(FORMAT_ATTR, ND)
    from ..ops import get_npu_format as np_format
    return np_format(t)


def _check_cast_args(acl_format, customize_dtype, input_dtype, customizable: bool = False) -> int:
    """``acl_format`` checked; ``customize_dtype`` / ``input_dtype`` must be None unless
    ``customizable`` (``npu_format_cast``: the op contract checks them, Ascend 950 rows)."""
    for name, value in (("customize_dtype", customize_dtype), ("input_dtype", input_dtype)):
        if value is not None and not customizable:
            raise arg_error(ModeError, name, "None (not emulated for this overload; npu_format_cast(self, 29, "
                            "customize_dtype=...) takes the Ascend 950 rows)", describe(value))
    if isinstance(acl_format, bool) or not isinstance(acl_format, int) or acl_format not in ACCEPTED_FORMATS:
        kept = ", ".join(f"{k} ({v})" for k, v in KEPT_FORMATS.items())
        raise arg_error(ModeError, "acl_format", f"the int {FRACTAL_NZ} (FRACTAL_NZ) or {ND} (ND), or a format kept "
                        f"as a tag: {kept}", describe(acl_format))
    return acl_format


def _target(src_format: int, acl_format: int, ndim: int) -> int:
    if acl_format == ND and src_format in NCHW_BASED and ndim == 4:
        return 0
    return acl_format


def _check_nz_dtype(t: torch.Tensor) -> None:
    """Raise the NumPy op's DTypeError for a dtype without a FRACTAL_NZ layout."""
    from .. import ops

    ops.npu_format_cast(np.empty((0,), dtype=_plain_numpy(t[:0].reshape(0), "self").dtype), FRACTAL_NZ)


def npu_format_cast(self: torch.Tensor, acl_format: int, *, customize_dtype=None, input_dtype=None) -> torch.Tensor:
    """``torch_npu.npu_format_cast(self, acl_format)``: a new tensor in ``acl_format``.

    The result shows the logical ND values (``.shape``, indexing, ``.cpu()``), as torch_npu's
    does. 29 (FRACTAL_NZ): a copy whose NumPy form is an NZArray (ops accept it as an NZ
    weight). :data:`KEPT_FORMATS`: a copy tagged with the code. 2 (ND): an untagged copy (NCHW
    for a 4-D tensor in an NCHW-based format, :data:`NCHW_BASED`).

    Args:
        self: any tensor (29: bf16 / fp16 / fp32 / int32 / int8; with ``customize_dtype``, the
            Ascend 950's float8_e4m3fn or uint8 hifloat8 / fp8 bytes).
        acl_format: one of :data:`ACCEPTED_FORMATS`.
        customize_dtype, input_dtype: None, or dtype codes (torch dtypes become their codes in
            ``torch_npu.npu_format_cast``) of the Ascend 950 rows
            :func:`ascend_emu.ops.npu_format_cast` takes (C0 = 32 for the 8-bit types).

    Returns:
        A new tensor on the emulated NPU.

    Raises:
        ModeError: another ``acl_format``, or a ``customize_dtype`` / ``input_dtype`` outside the
            Ascend 950 rows or on another SoC.
        DTypeError: a dtype without an NZ layout (for 29).
    """
    from .. import ops

    acl_format = _check_cast_args(acl_format, customize_dtype, input_dtype, customizable=True)
    if customize_dtype is not None or input_dtype is not None:
        cast = ops.npu_format_cast(to_numpy(self, "self"), acl_format, customize_dtype, input_dtype)
        return tag_nz(mark_output(to_torch(cast)), cast)
    target = _target(get_npu_format(self), acl_format, self.dim())
    if target == FRACTAL_NZ:
        cast = ops.npu_format_cast(to_numpy(self, "self"), FRACTAL_NZ)
        return tag_nz(mark_output(to_torch(cast)), cast)
    out = mark_output(self.detach().clone(memory_format=torch.contiguous_format))
    untag_nz(out).__dict__.pop(FORMAT_ATTR, None)
    if target != ND:
        out.__dict__[FORMAT_ATTR] = target
    return out


def npu_format_cast_tensor(self: torch.Tensor, dst: torch.Tensor, *, customize_dtype=None,
                           input_dtype=None) -> torch.Tensor:
    """``npu_format_cast(self, dst)``: :func:`npu_format_cast` to ``dst``'s format."""
    return npu_format_cast(self, get_npu_format(dst), customize_dtype=customize_dtype, input_dtype=input_dtype)


def npu_format_cast_(self: torch.Tensor, acl_format: int, *, customize_dtype=None, input_dtype=None) -> torch.Tensor:
    """``torch_npu.npu_format_cast_(self, acl_format)``: retag ``self`` in place, values and
    memory unchanged (29: an NZArray over ``self``'s own memory); returns ``self``.

    Raises:
        As :func:`npu_format_cast`; a rejected call leaves the tag as it was.
    """
    acl_format = _check_cast_args(acl_format, customize_dtype, input_dtype)
    target = _target(get_npu_format(self), acl_format, self.dim())
    if target == FRACTAL_NZ:
        _check_nz_dtype(self)
    self.__dict__.pop(FORMAT_ATTR, None)
    untag_nz(self)
    if target == FRACTAL_NZ:
        tag_nz_view(self)
    elif target != ND:
        self.__dict__[FORMAT_ATTR] = target
    return self


def npu_format_cast_src_(self: torch.Tensor, src: torch.Tensor, *, customize_dtype=None,
                         input_dtype=None) -> torch.Tensor:
    """``npu_format_cast_(self, src)``: :func:`npu_format_cast_` to ``src``'s format."""
    return npu_format_cast_(self, get_npu_format(src), customize_dtype=customize_dtype, input_dtype=input_dtype)


# ----------------------------------------------------------------------------- tags that follow
def share_tags(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Give ``dst`` (which shows ``src``'s memory) ``src``'s format and NPU tags; ``dst``'s own
    format tags are dropped first. Tensors on the npu device keep their tags on their CPU
    tensor (:class:`~ascend_emu.torch_npu._npu_tensor.NPUTensor`)."""
    out = dst
    if type(dst) is _npu_tensor.NPUTensor:
        dst = dst._elem
    untag_nz(dst).__dict__.pop(FORMAT_ATTR, None)
    if not isinstance(src, torch.Tensor):
        return out
    if type(src) is _npu_tensor.NPUTensor:
        src = src._elem
    nz = nz_of(src)
    if nz is not None:
        if dst.data_ptr() == src.data_ptr() and dst.shape == src.shape and dst.stride() == src.stride():
            tag_nz(dst, nz)  # same memory: the same NZArray (and the widening cached on it)
        else:
            tag_nz_view(dst)
    for key in _TAGS:
        if key in src.__dict__:
            dst.__dict__[key] = src.__dict__[key]
    return out


def _has_tags(t) -> bool:
    d = (t._elem if type(t) is _npu_tensor.NPUTensor else t).__dict__
    return bool(d) and any(k in d for k in (*_TAGS, NZ_ATTR))


_TORCH_CLONE = getattr(torch.Tensor.clone, "__wrapped__", torch.Tensor.clone)
_TORCH_DATA = torch._C.TensorBase.data
_TORCH_PARAM_NEW = getattr(torch.nn.Parameter.__new__, "__wrapped__", torch.nn.Parameter.__new__)
_TORCH_DEEPCOPY = getattr(torch.Tensor.__deepcopy__, "__wrapped__", torch.Tensor.__deepcopy__)


def _clone(self, *args, **kwargs):
    out = _TORCH_CLONE(self, *args, **kwargs)
    return share_tags(self, out) if _has_tags(self) else out


def _get_data(self):
    out = _TORCH_DATA.__get__(self)
    return share_tags(self, out) if _has_tags(self) else out


def _set_data(self, value):
    if type(self) is _npu_tensor.NPUTensor:  # the real device: the wrapper's values follow (its CPU tensor)
        if type(value) is not _npu_tensor.NPUTensor:
            raise RuntimeError("Attempted to call `variable.set_data(tensor)`, but `variable` and `tensor` have "
                               f"incompatible tensor type: `variable` is on {self.device}, `tensor` a "
                               f"{type(value).__name__} on {getattr(value, 'device', None)} (move it with .npu())")
        _TORCH_DATA.__set__(self, value)
        self._elem = value._elem
        return
    _TORCH_DATA.__set__(self, value)
    if _has_tags(self) or (isinstance(value, torch.Tensor) and _has_tags(value)):
        share_tags(value, self)  # the NPU mark of ``self`` stays: the parameter lives where it lived


def _param_new(cls, data=None, requires_grad=True):
    param = _TORCH_PARAM_NEW(cls, data, requires_grad)
    if isinstance(data, torch.Tensor) and _has_tags(data):
        share_tags(data, param)
    return param


def _deepcopy(self, memo):
    out = _TORCH_DEEPCOPY(self, memo)
    return share_tags(self, out) if _has_tags(self) and isinstance(out, torch.Tensor) else out


_clone.__wrapped__ = _TORCH_CLONE
_param_new.__wrapped__ = _TORCH_PARAM_NEW
_deepcopy.__wrapped__ = _TORCH_DEEPCOPY


# ----------------------------------------------------------------------------- torch.save / torch.load
#: Attribute name under which a saved tensor's pickled state carries ``(on_npu, format)``; a
#: property of ``torch.Tensor`` (:func:`_restore_saved`) applies it when the tensor is loaded.
SAVED_ATTR = "_ascend_emu_saved"
_SAVED_DROPS = (*_TAGS, NZ_ATTR)
_OBJECT_GETSTATE = object.__getstate__
_TORCH_LOAD = getattr(torch.load, "__wrapped__", torch.load)
_load_state = threading.local()  # .to_npu: whether the running torch.load maps NPU tensors to the NPU


def _getstate(self):
    """``Tensor.__getstate__`` (pickled by ``torch.save``, ``copy.copy``): a tagged tensor's state
    carries ``(on_npu, format)`` instead of its tags, the values being the ND values in its
    memory, as torch_npu saves an NPU tensor (its storage copied to the host in ND order, the
    format kept as metadata)."""
    state = _OBJECT_GETSTATE(self)
    if not _has_tags(self):
        return state
    slots = None
    if isinstance(state, tuple):
        state, slots = state
    saved = {k: v for k, v in state.items() if k not in _SAVED_DROPS}
    saved[SAVED_ATTR] = (bool(self.__dict__.get(ON_NPU_ATTR, False)), get_npu_format(self))
    return saved if slots is None else (saved, slots)


def _restore_saved(self, value) -> None:
    """Setter of :data:`SAVED_ATTR` (``torch.load`` sets the pickled state attribute by
    attribute): back on the NPU with its format (29: an NZ tag over the loaded ND values),
    unless the load maps NPU tensors to the host, where it comes back as a plain CPU tensor."""
    on_npu, fmt = value
    if not getattr(_load_state, "to_npu", True):
        return
    if on_npu or fmt != ND:
        mark_npu(self)
    if fmt == FRACTAL_NZ:
        tag_nz_view(self)
    elif fmt in KEPT_FORMATS:
        self.__dict__[FORMAT_ATTR] = fmt


def _maps_npu_to_npu(map_location) -> bool:
    """Whether ``torch.load(map_location=...)`` would put a tensor saved from NPU memory (saved
    location ``npu:0``) back on the NPU: None, an ``npu`` device, a dict without an entry for it
    or mapping it to an ``npu`` device, a callable returning None (torch's default restore)."""
    if map_location is None:
        return True
    if callable(map_location) and not isinstance(map_location, (str, torch.device, dict)):
        try:  # asked about an empty host storage; one it cannot handle goes to the host
            return map_location(torch.UntypedStorage(0), "npu:0") is None
        except Exception:
            return False
    if isinstance(map_location, dict):
        map_location = map_location.get("npu:0", map_location.get("npu", "npu:0"))
    return torch.device(map_location).type == "npu"


def _host_location(map_location):
    """``map_location`` with every ``npu`` target replaced by ``"cpu"`` (the emulated NPU's
    memory), so torch restores the storages on the host."""
    if isinstance(map_location, dict):
        return {k: ("cpu" if _device_is_npu(v) else v) for k, v in map_location.items()}
    return "cpu" if _device_is_npu(map_location) else map_location


def _device_is_npu(value) -> bool:
    return isinstance(value, (str, torch.device)) and torch.device(value).type == "npu"


def _mark_loaded(obj):
    """Put every tensor of a loaded container (dict / list / tuple / set values, modules'
    parameters and buffers) on the emulated NPU, as ``torch.load(map_location="npu")`` restores
    every storage there: dicts and lists in place, tuples and sets rebuilt, a tensor as
    :func:`~ascend_emu.torch_npu.npu.mark_npu` gives it (a Parameter stays one)."""
    if isinstance(obj, torch.Tensor):
        if type(obj) is torch.nn.Parameter and REAL_DEVICE:
            return torch.nn.Parameter(mark_npu(obj.detach()), obj.requires_grad)
        return mark_npu(obj)
    if isinstance(obj, torch.nn.Module):
        return obj.npu()
    if isinstance(obj, dict):
        for key, value in obj.items():
            obj[key] = _mark_loaded(value)
    elif isinstance(obj, list):
        obj[:] = [_mark_loaded(value) for value in obj]
    elif type(obj) in (tuple, set):
        return type(obj)(_mark_loaded(value) for value in obj)
    return obj


@functools.wraps(_TORCH_LOAD)
def _load(f, map_location=None, *args, **kwargs):
    """``torch.load``: NPU tensors come back on the NPU with their format unless
    ``map_location`` sends them to the host; ``map_location="npu"`` (a str or device) puts every
    loaded tensor on the NPU, as torch_npu does (the storages are restored in host memory)."""
    previous = getattr(_load_state, "to_npu", True)
    _load_state.to_npu = _maps_npu_to_npu(map_location)
    try:
        out = _TORCH_LOAD(f, _host_location(map_location), *args, **kwargs)
    finally:
        _load_state.to_npu = previous
    return _mark_loaded(out) if _device_is_npu(map_location) else out


def patch_torch() -> None:
    """Make format tags follow ``clone()``, ``copy.deepcopy``, ``nn.Parameter(t)``, ``t.data``,
    ``p.data = t`` and ``torch.save`` / ``torch.load``."""
    torch.Tensor.clone = _clone
    torch.Tensor.__deepcopy__ = _deepcopy
    torch.Tensor.data = property(_get_data, _set_data, doc=_TORCH_DATA.__doc__)
    torch.nn.Parameter.__new__ = staticmethod(_param_new)
    torch.Tensor.__getstate__ = _getstate
    setattr(torch.Tensor, SAVED_ATTR, property(lambda self: None, _restore_saved))
    torch.load = _load


_npu_tensor.register_tag_sharing(share_tags)
