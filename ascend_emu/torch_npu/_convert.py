"""The one bridge between torch tensors and the NumPy op interface.

Tensors cross without copies where the dtype allows: plain dtypes through ``Tensor.numpy()`` /
``torch.from_numpy``; bf16 and the float8 types through an integer view of the same bytes
(``t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)``), because NumPy has no bf16 of its own.
Non-contiguous tensors become strided NumPy views of the same memory.

A tensor cast with ``npu_format_cast(t, 29)`` carries its :class:`~ascend_emu.layouts.NZArray`
(the NumPy form of a FRACTAL_NZ weight) with the tensor's version counter at tagging time;
:func:`to_numpy` hands back that same object on every call while the tensor is unchanged, so
anything the backend keeps on it (the cached fp32 widening of a weight, see
:mod:`ascend_emu.emu.matmul`) survives from one call to the next. After an in-place write
(``load_state_dict`` copying into an NZ parameter, ``w.copy_(...)``) the version differs and a
fresh NZArray over the same memory replaces it, so no stale widening is ever used.

:func:`call_op` runs a NumPy op on torch arguments: tensors in, tensors out (on the emulated NPU,
:func:`~ascend_emu.torch_npu.npu.mark_npu`), and an output that *is* one of the input arrays (an
in-place cache) comes back as the caller's own tensor object.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import weakref
from typing import Any, Callable, Mapping, Sequence

import ml_dtypes
import numpy as np
import torch

from .. import _deterministic, checked_mode
from ..errors import DTypeError, FormatError, arg_error
from ..layouts import NZArray
from ._npu_tensor import NPUTensor
from .npu import mark_output

#: Attribute of a torch tensor holding its NZArray after ``npu_format_cast(t, 29)``.
NZ_ATTR = "_ascend_emu_nz"

#: torch dtypes NumPy lacks, crossed as an integer view of the same bytes:
#: torch dtype -> (torch view dtype, NumPy view dtype, ml_dtypes dtype).
_VIEWED: dict[torch.dtype, tuple[torch.dtype, np.dtype, np.dtype]] = {
    torch.bfloat16: (torch.int16, np.dtype(np.int16), np.dtype(ml_dtypes.bfloat16)),
}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"):
    if hasattr(torch, _name) and hasattr(ml_dtypes, _name):
        _VIEWED[getattr(torch, _name)] = (torch.uint8, np.dtype(np.uint8), np.dtype(getattr(ml_dtypes, _name)))
#: ml_dtypes dtype -> (NumPy view dtype, torch view dtype, torch dtype).
_VIEWED_BACK = {npd: (npv, tv, td) for td, (tv, npv, npd) in _VIEWED.items()}


def to_numpy(t, name: str = "tensor") -> np.ndarray | None:
    """NumPy view of a CPU torch tensor's memory (no copy).

    Args:
        t: a CPU ``torch.Tensor`` of any strides (``requires_grad`` is dropped: the view is
            detached), or None. A tensor cast with ``npu_format_cast(t, 29)`` gives back the
            same :class:`~ascend_emu.layouts.NZArray` object on every call.
        name: argument name for error messages.

    Returns:
        An ``ndarray`` sharing ``t``'s memory, same shape and strides (bf16 as
        ``ml_dtypes.bfloat16``), or None for None.

    Raises:
        DTypeError: ``t`` is not a tensor, lives off the CPU, or has a dtype with no NumPy form
            (a quantized tensor included).
        FormatError: ``t`` is not strided (sparse, mkldnn, nested; :func:`check_strided`).
    """
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise arg_error(DTypeError, name, "a torch.Tensor", type(t).__name__)
    if type(t) is NPUTensor:  # a tensor on the npu device: its CPU memory
        t = t._elem
    if NZ_ATTR in t.__dict__:
        nz = nz_of(t)
        if nz is not None:
            return nz
    rec = _VIEWS.get(id(t))  # the common case inline: a tensor seen before, unchanged
    if rec is not None and rec[0]() is t and t.is_cpu:
        ptr, dtype, shape, strides = rec[1]
        if ptr == t.data_ptr() and dtype is t.dtype and shape == t.shape and strides == t.stride():
            return rec[2]
    return _plain_numpy(t, name)


#: NumPy views handed out by :func:`_plain_numpy`: ``id(tensor) -> (weak reference to it, its
#: (data_ptr, dtype, shape, strides), the view)``. An entry is used only while the tensor is
#: alive and shows the same memory the same way, and leaves with the tensor; the view holds a
#: detached alias of the tensor (never the tensor itself), so no reference cycle keeps it alive.
_VIEWS: dict[int, tuple] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    rec = _VIEWS.get(key)
    if rec is not None and rec[0] is ref:
        del _VIEWS[key]


def _plain_numpy(t, name: str = "tensor") -> np.ndarray:
    """:func:`to_numpy` without the NZ tag: a plain ndarray view of ``t``'s memory (the same
    array object again while ``t`` shows the same memory with the same dtype, shape and
    strides: a repeated argument, a weight or a cache, costs a lookup)."""
    check_strided(t, name)
    if not t.is_cpu:
        raise arg_error(DTypeError, name, "a CPU tensor (the emulator runs on the CPU)", f"device {t.device}")
    rec = _VIEWS.get(id(t))
    if rec is not None and rec[0]() is t:
        ptr, dtype, shape, strides = rec[1]
        if ptr == t.data_ptr() and dtype is t.dtype and shape == t.shape and strides == t.stride():
            return rec[2]
    viewed = _VIEWED.get(t.dtype)
    try:
        if viewed is not None:
            a = t.detach().view(viewed[0]).numpy().view(viewed[2])
        else:
            a = t.detach().numpy()
    except (TypeError, RuntimeError) as exc:
        raise arg_error(DTypeError, name, "a tensor dtype NumPy can view", f"{t.dtype} ({exc})") from None
    key = id(t)
    ref = weakref.ref(t, lambda r, k=key: _forget(k, r))
    _VIEWS[key] = (ref, (t.data_ptr(), t.dtype, t.shape, t.stride()), a)
    return a


def check_strided(t: torch.Tensor, name: str = "tensor") -> None:
    """Reject a tensor whose memory is not one strided block NumPy can view: the one check of
    layout and kind every tensor argument of the drop-in passes (:func:`to_numpy`; the kernels
    :mod:`._registry` registers for the sparse, mkldnn, nested and quantized dispatch keys).

    Raises:
        FormatError: a sparse (COO / CSR / CSC / BSR / BSC), mkldnn or nested tensor, naming
            ``name``, the expected layout (strided) and the one given with shape and dtype
            (convert with ``.to_dense()`` / ``.to_padded_tensor(0)``).
        DTypeError: a quantized tensor (``.dequantize()`` it).
    """
    layout = t.layout
    if t.is_nested:
        raise arg_error(FormatError, name, "a strided tensor (torch.strided layout)",
                        f"a nested tensor ({layout}) of {t.size(0)} {_dtype_text(t)} tensors; use "
                        f".to_padded_tensor(0)")
    if layout is not torch.strided:
        raise arg_error(FormatError, name, "a strided tensor (torch.strided layout)",
                        f"a {list(t.shape)} {_dtype_text(t)} tensor of layout {layout}; use .to_dense()")
    if t.is_quantized:
        raise arg_error(DTypeError, name, "a tensor dtype NumPy can view",
                        f"a {list(t.shape)} quantized {_dtype_text(t)} tensor; use .dequantize()")


def _dtype_text(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def to_torch(a) -> torch.Tensor | None:
    """torch tensor over a NumPy array's memory (no copy where torch allows).

    Args:
        a: an ``ndarray`` (bf16 / float8 as ml_dtypes types; an :class:`NZArray` gives a plain,
            untagged tensor of its logical values), a torch tensor (returned as is), or None.

    Returns:
        A CPU tensor of the same shape and dtype sharing ``a``'s memory. Arrays torch cannot
        wrap (read-only, negative strides, non-native byte order) are copied first.

    Raises:
        DTypeError: a dtype torch has no counterpart for.
    """
    if a is None or isinstance(a, torch.Tensor):
        return a
    if type(a) is not np.ndarray:
        a = np.asarray(a)  # drops NZArray (and other subclasses) to a plain view; 0-d for scalars
    flags = a.flags
    if not (flags.writeable and a.dtype.isnative and (flags.c_contiguous or not a.ndim or min(a.strides) >= 0)):
        a = np.array(a, dtype=a.dtype.newbyteorder("=") if not a.dtype.isnative else a.dtype)
    back = _VIEWED_BACK.get(a.dtype)
    try:
        if back is not None:
            return torch.from_numpy(a.view(back[0])).view(back[2])
        return torch.from_numpy(a)
    except TypeError as exc:
        raise arg_error(DTypeError, "array", "a dtype torch supports", f"{a.dtype} ({exc})") from None


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return -1


def tag_nz(t: torch.Tensor, nz: NZArray) -> torch.Tensor:
    """Mark ``t`` as FRACTAL_NZ: :func:`to_numpy` will return ``nz`` (which must view ``t``'s
    memory) until ``t`` is written in place; on the npu device the mark is its CPU tensor's)."""
    if type(t) is NPUTensor:
        t._elem.__dict__[NZ_ATTR] = (nz, _version(t._elem), _layout(nz))
        return t
    t.__dict__[NZ_ATTR] = (nz, _version(t), _layout(nz))
    return t


def _layout(a: np.ndarray) -> tuple:
    """(address, shape, strides in elements) of an array's memory, as a tensor's
    ``data_ptr()``, ``shape`` and ``stride()`` give them."""
    size = a.itemsize
    return a.__array_interface__["data"][0], a.shape, tuple(s // size for s in a.strides)


def tag_nz_view(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as FRACTAL_NZ over its own memory (a new NZArray view, no copy)."""
    return tag_nz(t, _plain_numpy(t._elem if type(t) is NPUTensor else t).view(NZArray))


def untag_nz(t: torch.Tensor) -> torch.Tensor:
    """Drop ``t``'s FRACTAL_NZ mark (no-op for an untagged tensor)."""
    (t._elem if type(t) is NPUTensor else t).__dict__.pop(NZ_ATTR, None)
    return t


def nz_of(t) -> NZArray | None:
    """The NZArray of a tensor tagged by ``npu_format_cast(t, 29)``, else None.

    None as well when the tensor no longer shows the tagged memory (its data was replaced by
    torch's own ``.set_()``). A tensor written in place since it was tagged gets a fresh NZArray
    over the same memory (the old one may hold a cached widening of the old values).
    """
    if not isinstance(t, torch.Tensor):
        return None
    if type(t) is NPUTensor:
        t = t._elem
    rec = t.__dict__.get(NZ_ATTR)
    if rec is None:
        return None
    nz, version, (ptr, shape, strides) = rec
    if ptr != t.data_ptr() or shape != t.shape or strides != t.stride():
        return None
    if version != _version(t):
        nz = _plain_numpy(t).view(NZArray)
        tag_nz(t, nz)
    return nz


@functools.lru_cache(maxsize=None)
def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _param_names(fn: Callable) -> tuple[str, ...]:
    sig = _signature(fn)
    return tuple(sig.parameters) if sig is not None else ()


def _down(v, name: str, originals: dict):
    """``v`` for the NumPy op: tensors (also inside lists / tuples) through :func:`to_numpy`;
    each array is recorded in ``originals`` (``id -> (array, tensor)``, which keeps the array
    alive so the id stays unique for the call)."""
    if isinstance(v, torch.Tensor):
        a = to_numpy(v, name)
        originals[id(a)] = (a, v)
        return a
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return type(v)(_down(x, f"{name}[{i}]", originals) for i, x in enumerate(v))
    return v


def _up(r, originals: dict):
    """``r`` back as torch: an argument's own array is the caller's tensor, any other array a
    new NPU-marked tensor over its memory (tuples / lists kept)."""
    if isinstance(r, np.ndarray):
        return _up_array(r, originals)
    if isinstance(r, (tuple, list)):  # an op's outputs: plain arrays converted without the type tests
        return type(r)([_up_array(x, originals) if type(x) is np.ndarray else _up(x, originals) for x in r])
    return r


def _up_array(r: np.ndarray, originals: dict):
    """:func:`_up` of one array."""
    hit = originals.get(id(r))
    return hit[1] if hit is not None and hit[0] is r else mark_output(to_torch(r))


def call_op(fn: Callable, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> Any:
    """Call the NumPy op ``fn`` with torch arguments and return torch results.

    Every tensor argument, positional or keyword, goes through :func:`to_numpy` once (None and
    plain Python values pass through unchanged; lists / tuples are converted element by
    element). Results go through :func:`to_torch` and are marked as NPU tensors (``.npu()``
    returns them as they are, ``.cpu()`` copies them), except that a result array that *is* one
    of the argument arrays (a cache the op updated in place and returned) comes back as the
    caller's original tensor object, so the caller's tensor shows the update without any copy
    back.

    Args:
        fn: a function of :mod:`ascend_emu.ops`.
        args: positional arguments (torch tensors or anything ``fn`` accepts).
        kwargs: keyword arguments.

    Returns:
        ``fn``'s result with every array replaced by a tensor (tuples / lists kept).
    """
    originals: dict[int, tuple[np.ndarray, torch.Tensor]] = {}
    np_args = ()
    if args:
        names = _param_names(fn)  # names only label positional arguments in errors
        np_args = [_down(v, names[i] if i < len(names) else f"args[{i}]", originals) for i, v in enumerate(args)]
    np_kwargs = {k: _down(v, k, originals) for k, v in kwargs.items()} if kwargs else {}
    with _deterministic.scope(torch.are_deterministic_algorithms_enabled()):  # read at every call
        result = fn(*np_args, **np_kwargs)
    return _up(result, originals)


def _is_default(value, default) -> bool:
    if value is default:
        return True
    if isinstance(value, (bool, int, float, str)) and isinstance(default, (bool, int, float, str)):
        return value == default
    return False


_OPS = None


def resolve_op(op_name: str, public_name: str | None = None) -> Callable:
    """The NumPy op ``ascend_emu.ops.<op_name>``, looked up at call time (a replaced or
    removed attribute is seen at once; the module itself is imported once).

    Raises:
        NotImplementedError: this version of ascend_emu has no such op.
    """
    global _OPS
    if _OPS is None:
        _OPS = importlib.import_module("ascend_emu.ops")
    fn = getattr(_OPS, op_name, None)
    if fn is None:
        raise NotImplementedError(f"{public_name or op_name}: not emulated by this version of ascend_emu "
                                  f"(ascend_emu.ops.{op_name} does not exist)")
    return fn


# checked mode sits below the drop-in and sees torch tensors through this view, handed down here.
checked_mode.register_tensor_view(torch.Tensor, to_numpy)
