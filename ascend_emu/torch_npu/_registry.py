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

from typing import Any, Callable

import torch

from ..errors import ModeError, arg_error, describe
from . import _fake, _format
from ._convert import _is_default, _param_names, call_op, resolve_op
from .schemas import SCHEMAS, OpSchema

_LIBS: dict[str, torch.library.Library] = {}
_DONE = False

#: ``*_dtype`` tags of the 2.14 additions that exist for Ascend 950's hifloat8 / fp8 caches only.
_ASCEND950_TAGS = ("k_cache_dtype", "ckv_cache_dtype")


def _defaults(schema: torch._C.FunctionSchema) -> dict[str, Any]:
    return {a.name: (a.default_value if a.has_default_value() else None) for a in schema.arguments}


def _bind(schema: torch._C.FunctionSchema, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Arguments by schema name (defaults filled in)."""
    params = _defaults(schema)
    for arg, value in zip(schema.arguments, args):
        params[arg.name] = value
    params.update(kwargs)
    return params


def emulate(op_name: str, params: dict[str, Any], defaults: dict[str, Any], public_name: str) -> Any:
    """Run ``ascend_emu.ops.<op_name>`` with the schema arguments ``params`` (all by keyword).

    Raises:
        NotImplementedError: the op does not exist in this version.
        ModeError: a non-default value for an argument the op does not take.
    """
    fn = resolve_op(op_name, public_name)
    accepted = _param_names(fn)
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

    def kernel(*args, **kwargs):
        return run(_bind(schema, args, kwargs))

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


def registered_schema(spec: OpSchema) -> str:
    """The schema torch holds for ``spec`` (as ``str(FunctionSchema)``)."""
    packet = getattr(getattr(torch.ops, spec.namespace), spec.name)
    overload = getattr(packet, spec.qualified.split(".")[1] if "." in spec.qualified else "default")
    return str(overload._schema)
