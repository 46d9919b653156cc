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
  fresh NZArray so no cached widening of the old values is used (:mod:`._convert`).

Where it does not (documented in README): views (``t[0]``, ``t.view(...)``, ``t.T``), results
of torch ops (``t + 0``, ``t.to(dtype)``, ``t.contiguous()`` of a non-contiguous tensor),
``state_dict()`` tensors (detached), ``torch.save`` / ``torch.load``.

Source: the npu_format_cast doc, ops_reference §1.4, torch_npu 2.14's format-cast schemas and
op-plugin's ``test/test_base_ops/test_format_cast.py`` (the format a cast to ND gives).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ModeError, arg_error, describe
from ..layouts import FRACTAL_NZ, ND
from ._convert import _plain_numpy, nz_of, tag_nz, tag_nz_view, to_numpy, to_torch, untag_nz
from .npu import ON_NPU_ATTR, mark_npu

#: Attribute (in a tensor's ``__dict__``) holding a format code kept as a tag only.
FORMAT_ATTR = "_ascend_emu_format"

#: ACL formats torch_npu scripts cast to that the emulator keeps as tags (values unchanged):
#: 0 NCHW, 3 NC1HWC0, 4 FRACTAL_Z, 30 NCDHW, 32 NDC1HWC0, 33 FRACTAL_Z_3D.
KEPT_FORMATS = {0: "NCHW", 3: "NC1HWC0", 4: "FRACTAL_Z", 30: "NCDHW", 32: "NDC1HWC0", 33: "FRACTAL_Z_3D"}

#: Every format ``npu_format_cast`` accepts.
ACCEPTED_FORMATS = {ND: "ND", FRACTAL_NZ: "FRACTAL_NZ", **KEPT_FORMATS}

#: A cast to ND (2) of a 4-D tensor in one of these formats gives NCHW (0), as torch_npu does
#: (their base format is NCHW; op-plugin's test_format_cast expects 3 -> 2 to report 0).
NCHW_BASED = (3, 4)

_TAGS = (FORMAT_ATTR, ON_NPU_ATTR)


def get_npu_format(t) -> int:
    """``torch_npu.get_npu_format``: 29 for a FRACTAL_NZ tensor, a kept format's code, else 2."""
    if nz_of(t) is not None:
        return FRACTAL_NZ
    if isinstance(t, torch.Tensor):
        return t.__dict__.get(FORMAT_ATTR, ND)
    from ..ops import get_npu_format as np_format
    return np_format(t)


def _check_cast_args(acl_format, customize_dtype, input_dtype) -> int:
    for name, value in (("customize_dtype", customize_dtype), ("input_dtype", input_dtype)):
        if value is not None:
            raise arg_error(ModeError, name, "None (not emulated)", describe(value))
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
        self: any tensor (29: bf16 / fp16 / fp32 / int32 / int8).
        acl_format: one of :data:`ACCEPTED_FORMATS`.
        customize_dtype, input_dtype: not emulated; must be None.

    Returns:
        A new tensor on the emulated NPU.

    Raises:
        ModeError: another ``acl_format``, or a ``customize_dtype`` / ``input_dtype``.
        DTypeError: a dtype without an NZ layout (for 29).
    """
    from .. import ops

    acl_format = _check_cast_args(acl_format, customize_dtype, input_dtype)
    target = _target(get_npu_format(self), acl_format, self.dim())
    if target == FRACTAL_NZ:
        cast = ops.npu_format_cast(to_numpy(self, "self"), FRACTAL_NZ)
        return tag_nz(mark_npu(to_torch(cast)), cast)
    out = mark_npu(self.detach().clone(memory_format=torch.contiguous_format))
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
    format tags are dropped first."""
    untag_nz(dst).__dict__.pop(FORMAT_ATTR, None)
    if not isinstance(src, torch.Tensor):
        return dst
    nz = nz_of(src)
    if nz is not None:
        if dst.data_ptr() == src.data_ptr() and dst.shape == src.shape and dst.stride() == src.stride():
            tag_nz(dst, nz)  # same memory: the same NZArray (and the widening cached on it)
        else:
            tag_nz_view(dst)
    for key in _TAGS:
        if key in src.__dict__:
            dst.__dict__[key] = src.__dict__[key]
    return dst


def _has_tags(t) -> bool:
    d = t.__dict__
    return bool(d) and any(k in d for k in (*_TAGS, "_ascend_emu_nz"))


_TORCH_CLONE = getattr(torch.Tensor.clone, "__wrapped__", torch.Tensor.clone)
_TORCH_DATA = torch._C.TensorBase.data
_TORCH_PARAM_NEW = getattr(torch.nn.Parameter.__new__, "__wrapped__", torch.nn.Parameter.__new__)


def _clone(self, *args, **kwargs):
    out = _TORCH_CLONE(self, *args, **kwargs)
    return share_tags(self, out) if _has_tags(self) else out


def _get_data(self):
    out = _TORCH_DATA.__get__(self)
    return share_tags(self, out) if _has_tags(self) else out


def _set_data(self, value):
    _TORCH_DATA.__set__(self, value)
    if _has_tags(self) or (isinstance(value, torch.Tensor) and _has_tags(value)):
        share_tags(value, self)  # the NPU mark of ``self`` stays: the parameter lives where it lived


def _param_new(cls, data=None, requires_grad=True):
    param = _TORCH_PARAM_NEW(cls, data, requires_grad)
    if isinstance(data, torch.Tensor) and _has_tags(data):
        share_tags(data, param)
    return param


_clone.__wrapped__ = _TORCH_CLONE
_param_new.__wrapped__ = _TORCH_PARAM_NEW


def patch_torch() -> None:
    """Make format tags follow ``clone()``, ``nn.Parameter(t)``, ``t.data`` and ``p.data = t``."""
    torch.Tensor.clone = _clone
    torch.Tensor.data = property(_get_data, _set_data, doc=_TORCH_DATA.__doc__)
    torch.nn.Parameter.__new__ = staticmethod(_param_new)
