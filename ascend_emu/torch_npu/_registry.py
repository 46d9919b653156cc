"""Registers torch_npu 2.14's schemas (:mod:`.schemas`) as ``torch.ops.npu.*`` / ``torch.ops.atb.*``.

For every overload, with ``torch.library``:

- ``define``: the stored schema string, alias annotations included;
- a ``CPU`` kernel that binds the arguments by the schema and runs the op contract in
  :mod:`ascend_emu.ops` (resolved at call time: an op this version lacks raises
  NotImplementedError naming ``ascend_emu.ops.<name>``) through :func:`._convert.call_op`, so
  in-place caches land in the caller's tensors, FRACTAL_NZ weights are read through their tag
  and outputs come back as torch tensors on the emulated NPU;
- a fake (meta) kernel from :mod:`._fake` (``torch.compile``, meta tensors);
- an ``Autograd`` kernel: ``npu_format_cast`` passes gradients through (the values are
  unchanged); every other op runs below autograd, so its outputs and the caller's caches never
  join a graph (the emulated ops have no backward).

A schema argument :mod:`ascend_emu.ops` does not take is accepted at the schema's default and
rejected (ModeError naming it) otherwise, so a setting the emulator cannot honour is never
ignored silently.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ..errors import DTypeError, ModeError, arg_error, describe
from . import _fake, _format
from ._convert import _is_default, _param_names, call_op, resolve_op
from .schemas import SCHEMAS, TORCH_NPU_VERSION, OpSchema

_LIBS: dict[str, torch.library.Library] = {}
_DONE = False

#: ``*_dtype`` tags of the 2.14 additions that exist for Ascend 950's hifloat8 / fp8 caches only.
_ASCEND950_TAGS = ("k_cache_dtype", "ckv_cache_dtype")


def _defaults(schema: torch._C.FunctionSchema) -> dict[str, Any]:
    return {a.name: (a.default_value if a.has_default_value() else None) for a in schema.arguments}


def _bind(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict,
          defaults: dict[str, Any] | None = None, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Arguments by schema name (defaults filled in). ``defaults`` / ``names``: the schema's
    :func:`_defaults` and argument names, precomputed per op (read from ``schema`` otherwise)."""
    params = dict(defaults) if defaults is not None else _defaults(schema)
    if names is None:
        names = tuple(a.name for a in schema.arguments)
    params.update(zip(names, args))
    params.update(kwargs)
    return params


@functools.lru_cache(maxsize=None)
def _accepted(fn: Callable) -> frozenset[str]:
    """Parameter names of the NumPy op ``fn`` (its signature, read once per op)."""
    return frozenset(_param_names(fn))


def emulate(op_name: str, params: dict[str, Any], defaults: dict[str, Any], public_name: str) -> Any:
    """Run ``ascend_emu.ops.<op_name>`` with the schema arguments ``params`` (all by keyword).

    Raises:
        NotImplementedError: the op does not exist in this version.
        ModeError: a non-default value for an argument the op does not take.
    """
    fn = resolve_op(op_name, public_name)
    accepted = _accepted(fn)
    kwargs = {}
    for key, value in params.items():
        if key in accepted:
            kwargs[key] = value
        elif not _is_default(value, defaults.get(key)):
            raise arg_error(ModeError, key, f"the default {defaults.get(key)!r} ({public_name} in ascend_emu does "
                            f"not support this argument)", describe(value))
    return call_op(fn, (), kwargs)


def _reject_ascend950(params: dict[str, Any], public_name: str) -> None:
    for tag in _ASCEND950_TAGS:
        value = params.pop(tag, None)
        if value is not None:
            raise arg_error(ModeError, tag, f"None ({public_name}: cache dtype tags are for Ascend 950 caches, "
                            f"not emulated)", describe(value))


def _copy_caches(params: dict[str, Any], names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
    """Replace the caches in ``params`` by copies (the ``_functional`` variants leave theirs)."""
    copies = []
    for name in names:
        params[name] = params[name].detach().clone(memory_format=torch.contiguous_format)
        copies.append(params[name])
    return tuple(copies)


def _kernel(spec: OpSchema, schema: torch._C.FunctionSchema) -> Callable:
    """The CPU kernel of one overload."""
    defaults = _defaults(schema)
    qualified = spec.qualified
    public = f"torch_npu.{'atb.' if spec.namespace == 'atb' else ''}{spec.name}"

    def run(params: dict[str, Any]) -> Any:
        if qualified == "npu_mla_prolog_v3_functional":
            caches = _copy_caches(params, ("kv_cache", "kr_cache"))
            return (*emulate("npu_mla_prolog_v3", params, defaults, public), *caches)
        if qualified == "npu_kv_rmsnorm_rope_cache_v2":
            _reject_ascend950(params, public)
            return tuple(emulate("npu_kv_rmsnorm_rope_cache", params, defaults, public)[2:])
        if qualified == "npu_kv_rmsnorm_rope_cache_v2_functional":
            _reject_ascend950(params, public)
            caches = _copy_caches(params, ("k_cache", "ckv_cache"))
            return (*emulate("npu_kv_rmsnorm_rope_cache", params, defaults, public)[2:], *caches)
        if spec.name == "npu_mla_preprocess":
            return emulate("npu_mla_preprocess", params, defaults, public)
        return emulate(spec.name, params, defaults, public)

    returns = len(schema.returns)
    names = tuple(a.name for a in schema.arguments)

    def kernel(*args, **kwargs):
        out = run(_bind(schema, args, kwargs, defaults, names))
        got = len(out) if isinstance(out, (tuple, list)) else 1
        if got != returns:
            raise RuntimeError(f"{public}: the emulation returned {got} output(s); torch_npu {TORCH_NPU_VERSION}'s "
                               f"schema returns {returns}")
        return tuple(out) if returns > 1 else (out[0] if isinstance(out, (tuple, list)) else out)

    kernel.__name__ = f"{spec.namespace}_{qualified.replace('.', '_')}_cpu"
    return kernel


_FORMAT_KERNELS = {
    "get_npu_format": lambda self: _format.get_npu_format(self),
    "npu_format_cast": _format.npu_format_cast,
    "npu_format_cast.Tensor": _format.npu_format_cast_tensor,
    "npu_format_cast_": _format.npu_format_cast_src_,
    "npu_format_cast_.acl_format": _format.npu_format_cast_,
}


def _below_autograd(overload) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args, **kwargs)

    return kernel


def _format_cast_backward(ctx, grad):
    return grad, None


def _format_cast_tensor_backward(ctx, grad):
    return grad, None


def register() -> None:
    """Define and implement every op of :data:`.schemas.SCHEMAS` (once per process)."""
    global _DONE
    if _DONE:
        return
    for spec in SCHEMAS:
        lib = _LIBS.get(spec.namespace)
        if lib is None:
            lib = _LIBS[spec.namespace] = torch.library.Library(spec.namespace, "FRAGMENT")
        lib.define(spec.schema)
        schema = torch._C.parse_schema(f"{spec.namespace}::{spec.schema}")
        kernel = _FORMAT_KERNELS.get(spec.qualified) or _kernel(spec, schema)
        lib.impl(spec.qualified, kernel, "CPU")
        key = f"{spec.namespace}::{spec.qualified}"
        if key in _fake.FAKES:
            torch.library.register_fake(key, _fake.FAKES[key], lib=lib)
        packet = getattr(getattr(torch.ops, spec.namespace), spec.name)
        overload = getattr(packet, spec.qualified.split(".")[1] if "." in spec.qualified else "default")
        if spec.qualified == "npu_format_cast":
            torch.library.register_autograd(key, _format_cast_backward, lib=lib)
        elif spec.qualified == "npu_format_cast.Tensor":
            torch.library.register_autograd(key, _format_cast_tensor_backward, lib=lib)
        else:
            lib.impl(spec.qualified, _below_autograd(overload), "Autograd")
    _DONE = True


#: Python types a schema argument type accepts (checked before dispatch, :func:`public_op`).
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "Tensor": ((torch.Tensor,), "a torch.Tensor"),
    "int": ((int,), "a Python int"),
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


def _check_kinds(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict, public: str,
                 table: tuple[tuple[str, str, bool], ...] | None = None) -> None:
    """DTypeError / ModeError (naming the argument, value summarised) for a value torch's schema
    matching would reject with a RuntimeError that can print whole tensors. ``table``: the
    schema's :func:`_kind_table` (computed here when not given)."""
    if table is None:
        table = _kind_table(schema)
    if len(args) > len(table):
        raise TypeError(f"{public}: takes at most {len(table)} arguments, got {len(args)}")
    for i, (name, kind, optional) in enumerate(table):
        if i < len(args):
            value = args[i]
        elif name in kwargs:
            value = kwargs[name]
        else:
            continue
        if (optional and value is None) or kind not in _KINDS:
            continue
        types, text = _KINDS[kind]
        if not isinstance(value, types) or (kind in ("int", "float") and isinstance(value, bool)):
            cls = ModeError if kind == "str" else DTypeError
            raise arg_error(cls, name, text + (" or None" if optional else ""), describe(value))


def public_op(namespace: str, name: str) -> Callable:
    """``torch_npu.<name>``: a thin callable of ``torch.ops.<namespace>.<name>`` (its ``op``
    attribute) that checks argument kinds first (ascend_emu errors, never a printed tensor).

    Overloaded ops (``npu_format_cast``, ``npu_format_cast_``, ``atb.npu_mla_preprocess``) leave
    overload resolution to torch; the format casts check a non-tensor format argument first.
    """
    packet = getattr(getattr(torch.ops, namespace), name)
    specs = [s for s in SCHEMAS if s.namespace == namespace and s.name == name]
    schema = torch._C.parse_schema(f"{namespace}::{specs[0].schema}") if len(specs) == 1 else None
    public = f"torch_npu.{'atb.' if namespace == 'atb' else ''}{name}"
    table = _kind_table(schema) if schema is not None else None

    def call(*args, **kwargs):
        if schema is not None:
            _check_kinds(schema, args, kwargs, public, table)
        elif name.startswith("npu_format_cast") and len(args) > 1 and not isinstance(args[1], torch.Tensor):
            _format._check_cast_args(args[1], kwargs.get("customize_dtype"), kwargs.get("input_dtype"))
        return packet(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = "torch_npu" + (".atb" if namespace == "atb" else "")
    call.__doc__ = (f"``{public}``: ``torch.ops.{namespace}.{name}`` (torch_npu {TORCH_NPU_VERSION} schema"
                    f"{'s' if len(specs) > 1 else ''}, :mod:`ascend_emu.torch_npu.schemas`).\n\n"
                    + "\n".join(f"    {namespace}::{s.schema}" for s in specs))
    call.op = packet
    return call


def registered_schema(spec: OpSchema) -> str:
    """The schema torch holds for ``spec`` (as ``str(FunctionSchema)``)."""
    packet = getattr(getattr(torch.ops, spec.namespace), spec.name)
    overload = getattr(packet, spec.qualified.split(".")[1] if "." in spec.qualified else "default")
    return str(overload._schema)
