"""The checks every route into a drop-in op makes before its kernel runs, and that torch would
otherwise make with an error that prints whole tensors or runs after a partial write: the meta
rule (all meta tensors: the fake kernel; meta mixed with real: rejected naming the meta
argument), lazy conjugate / negative views (rejected before anything runs), and the Python kind
of every schema argument (a list where a tensor belongs, an int past int64, a float for a bool).

Also whether a call may take the eager path (:func:`eager_allowed`) and the torch dtypes that
stand for dtype codes (:func:`scalar_type_code`). Used by :mod:`._registry`, which registers
them with each op (docs/torch_npu.md).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..errors import AscendEmuError, DTypeError, ModeError, arg_error, describe

#: The int64 range a schema ``int`` holds (torch's ``int64_t``).
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


#: Dispatch keys of CPU tensors that are not one strided block (sparse COO / compressed, mkldnn,
#: nested, quantized): their kernel is :attr:`_Binding.strided_only`, so such a tensor gets the
#: conversion step's error (:func:`._convert.check_strided`) instead of torch's "Could not run
#: ... with arguments from the 'SparseCPU' backend" page.
NON_STRIDED_KEYS = ("SparseCPU", "SparseCsrCPU", "MkldnnCPU", "NestedTensorCPU", "QuantizedCPU")


#: Dispatch keys of a tensor with a lazy conjugate / negative bit (``x.conj()`` of a complex
#: tensor, its ``.imag``): torch's fallback there resolves the bit into a copy, runs the kernel
#: on the copy and fails after the kernel wrote the other outputs, so every overload takes them
#: with :func:`_math_bits_kernel`, which rejects the call before anything runs.
MATH_BIT_KEYS = ("Conjugate", "Negative")


def _tensors(names: tuple[str, ...], args: tuple, kwargs: dict):
    """``(name, tensor)`` of every tensor argument of a call bound by the schema ``names``."""
    for name, value in (*zip(names, args, strict=False), *kwargs.items()):
        if isinstance(value, torch.Tensor):
            yield name, value


def _math_bits_kernel(names: tuple[str, ...], public: str) -> Callable:
    """The kernel of :data:`MATH_BIT_KEYS` for an overload with argument ``names``: raises
    DTypeError naming the first tensor with a conjugate or negative bit (``.resolve_conj()`` /
    ``.resolve_neg()`` give a plain tensor), so no output is written."""

    def reject(*args, **kwargs):
        for name, value in _tensors(names, args, kwargs):
            if value.is_conj() or value.is_neg():
                bit, fix = ("conjugate", "resolve_conj") if value.is_conj() else ("negative", "resolve_neg")
                raise arg_error(DTypeError, name, f"a tensor without a lazy {bit} bit ({public}; use "
                                f".{fix}() first)", f"a {list(value.shape)} {value.dtype} view with "
                                f"the {bit} bit set")
        raise arg_error(DTypeError, "tensor", f"tensors without a lazy conjugate / negative bit ({public})",
                        "a view with one set")

    return reject


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def meta_rule(fake: Callable, names: tuple[str, ...], public: str) -> Callable:
    """``fake`` (a fake kernel of an overload with argument ``names``) under the drop-in's rule
    for meta tensors: a call whose tensors are all meta (or all fake, under ``FakeTensorMode`` /
    ``torch.compile``) runs ``fake`` (meta outputs of the shapes torch_npu's meta registrations
    give); a call mixing meta and real tensors (the dispatcher picks the Meta kernel for it) is
    rejected before anything runs, naming the meta argument: run as it is, the fake would make
    uninitialised CPU outputs and leave the real caches unwritten.

    Raises:
        DTypeError: a meta tensor beside a real one (naming the meta one and the real one).
    """

    def checked(*args, **kwargs):
        meta = real = None
        for name, value in _tensors(names, args, kwargs):
            if value.is_meta:
                meta = meta or (name, value)
            elif real is None and not _is_fake(value):
                real = (name, value)
        if meta is not None and real is not None:
            name, value = meta
            raise arg_error(DTypeError, name, f"a tensor on {real[1].device} like {real[0]} ({public} runs on "
                            f"meta tensors only when every tensor is meta)",
                            f"a meta {list(value.shape)} {value.dtype} tensor")
        return fake(*args, **kwargs)

    checked.__name__ = getattr(fake, "__name__", "fake")
    return checked


_SEQUENCES = (list, tuple, np.ndarray)


def _has_sequence(args: tuple, kwargs: dict) -> bool:
    """Whether the call passes a list, tuple or NumPy array anywhere: :class:`CheckedPacket`
    then checks the argument kinds before torch's binder, which converts a list element by
    element before it finds that a tensor was expected."""
    return any(type(a) in _SEQUENCES for a in args) or any(type(v) in _SEQUENCES for v in kwargs.values())


#: Python types a schema argument type accepts (checked before dispatch, :func:`public_op`).
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "Tensor": ((torch.Tensor,), "a torch.Tensor"),
    "int": ((int, torch.dtype), "a Python int"),  # a torch dtype passes as its ScalarType code, as in torch
    "float": ((int, float), "a Python float"),
    "str": ((str,), "a str"),
    "bool": ((bool,), "a bool"),
}


def _kind_table(schema: torch._C.FunctionSchema) -> tuple[tuple[str, str, bool], ...]:
    """(name, kind, optional) of every schema argument, in schema order (read once per op)."""
    table = []
    for arg in schema.arguments:
        kind = str(arg.type)
        optional = kind.startswith("Optional[")
        table.append((arg.name, kind[len("Optional["):-1] if optional else kind, optional))
    return tuple(table)


def _wrong_kind(table: tuple[tuple[str, str, bool], ...], args: tuple,
                kwargs: dict) -> tuple[int, AscendEmuError] | None:
    """The first argument whose value torch's schema matching would reject with a RuntimeError
    that can print whole tensors, as ``(schema position, DTypeError / ModeError naming it, the
    value summarised)``, or None. ``table``: the schema's :func:`_kind_table`; ``args`` no
    longer than it."""
    for i, (name, kind, optional) in enumerate(table):
        if i < len(args):
            value = args[i]
        elif name in kwargs:
            value = kwargs[name]
        else:
            continue
        if optional and value is None:
            continue
        if kind == "List[int]":
            problem = _wrong_int_list(value, name, optional)
            if problem is not None:
                return i, problem
            continue
        if kind not in _KINDS:
            continue
        types, text = _KINDS[kind]
        if not isinstance(value, types) or (kind in ("int", "float") and isinstance(value, bool)):
            cls = ModeError if kind == "str" else DTypeError
            return i, arg_error(cls, name, text + (" or None" if optional else ""), describe(value))
        if kind == "int" and isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            return i, arg_error(DTypeError, name, f"an int in int64's range [{INT64_MIN}, {INT64_MAX}]",
                                describe(value))
    return None


def _wrong_int_list(value, name: str, optional: bool) -> AscendEmuError | None:
    """The error of a schema ``int[]`` argument torch's binder would reject (a list / tuple of
    ints in int64's range, or a 1-D integer NumPy array; a bool is not an int here), or None.
    ``value`` is not None unless the slot is required."""
    text = "a list of ints" + (" or None" if optional else "")
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            return arg_error(DTypeError, name, text + " (or a 1-D integer array)", describe(value))
        if value.dtype.kind == "u" and value.size and int(value.max()) > INT64_MAX:
            return arg_error(DTypeError, name, f"ints in int64's range (at most {INT64_MAX})", describe(value))
        return None
    if not isinstance(value, (list, tuple)):
        return arg_error(DTypeError, name, text, describe(value))
    for j, v in enumerate(value):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            return arg_error(DTypeError, f"{name}[{j}]", "an int", describe(v))
        if not INT64_MIN <= int(v) <= INT64_MAX:
            return arg_error(DTypeError, f"{name}[{j}]", f"an int in int64's range [{INT64_MIN}, {INT64_MAX}]",
                             describe(v))
    return None


_compiling = torch.compiler.is_compiling
_function_modes = torch._C._len_torch_function_stack
_dispatch_modes = torch._C._len_torch_dispatch_stack
_jit_tracing = torch._C._get_tracing_state
_functorch_layers = torch._C._functorch.peek_interpreter_stack


def eager_allowed() -> bool:
    """True when nothing is watching the dispatcher: not compiling / exporting
    (``torch.compiler.is_compiling()``), no TorchFunctionMode or TorchDispatchMode (FakeTensor,
    functionalization, proxy tracing, ``with torch.device(...)``) active, no ``torch.jit``
    trace, no functorch transform (vmap, grad, functionalize)."""
    return not (_compiling() or _function_modes() or _dispatch_modes() or _jit_tracing() is not None
                or _functorch_layers() is not None)


#: ``int`` dtype-code arguments that take a torch dtype too, per ``npu`` op: torch's dispatcher
#: passes a torch dtype in an ``int`` slot as its ``c10::ScalarType`` value, which is how
#: ``torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float8_e4m3fn)`` reaches the kernel; the
#: eager path and the argument check convert it the same way (:func:`scalar_type_code`).
DTYPE_CODE_ARGUMENTS = {"npu_dtype_cast": ("dtype", "input_dtype"), "npu_dynamic_mx_quant": ("dst_type",),
                        "npu_dynamic_mx_quant_with_dual_axis": ("dst_type",),
                        "npu_format_cast": ("customize_dtype", "input_dtype")}


def scalar_type_code(value, name: str = "dtype"):
    """``value`` with a torch dtype replaced by its ``c10::ScalarType`` value
    (:data:`ascend_emu.quant.fp8.SCALAR_TYPE_CODES`); anything else unchanged.

    Raises:
        DTypeError: a torch dtype without a code there.
    """
    if not isinstance(value, torch.dtype):
        return value
    from ..quant.fp8 import SCALAR_TYPE_CODES

    code = SCALAR_TYPE_CODES.get(str(value)[len("torch."):])
    if code is None:
        raise arg_error(DTypeError, name, f"a torch dtype among {sorted(SCALAR_TYPE_CODES)} or a dtype code",
                        str(value))
    return code


def _with_codes(names: tuple[str, ...], positions: dict[int, str], args: tuple, kwargs: dict) -> tuple:
    """``(args, kwargs)`` with the torch dtypes of the arguments ``names`` (``positions``: schema
    position -> name, for those that can come by position) replaced by their codes."""
    if any(isinstance(a, torch.dtype) for a in args):
        args = tuple(scalar_type_code(a, positions[i]) if i in positions else a for i, a in enumerate(args))
    for key in names:
        if isinstance(kwargs.get(key), torch.dtype):
            kwargs = {**kwargs, key: scalar_type_code(kwargs[key], key)}
    return args, kwargs
