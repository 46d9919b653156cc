"""Registers torch_npu 2.14's schemas (:mod:`.schemas`) as ``torch.ops.npu.*`` / ``torch.ops.atb.*``,
and the serving frameworks' (:mod:`.namespaces`: ``torch.ops._C_ascend.*``, ``torch.ops.custom.*``)
as bindings to the same ops (:func:`register_spec`; only defaults and outputs differ).

For every overload, with ``torch.library``:

- ``define``: the stored schema string, alias annotations included;
- a ``CPU`` kernel that binds the arguments by the schema and runs the op contract in
  :mod:`ascend_emu.ops` (resolved at call time: an op this version lacks raises
  NotImplementedError naming ``ascend_emu.ops.<name>``) through :func:`._convert.call_op`, so
  in-place caches land in the caller's tensors, FRACTAL_NZ weights are read through their tag
  and outputs come back as torch tensors on the emulated NPU;
- a fake (meta) kernel from :mod:`._fake` (``torch.compile``, meta tensors);
- an ``Autograd`` kernel: ``npu_format_cast`` passes gradients through (the values are
  unchanged), ``npu_dtype_cast`` casts them back to the input's dtype (:func:`_dtype_cast_autograd`);
  every other op runs below autograd, so its outputs and the caller's caches never
  join a graph (the emulated ops have no backward).

A schema argument :mod:`ascend_emu.ops` does not take is accepted at the schema's default and
rejected (ModeError naming it) otherwise, so a setting the emulator cannot honour is never
ignored silently.

Errors are ascend_emu's on every route in: ``torch_npu.<op>`` checks the call against the
schemas first (:func:`check_call`); ``torch.ops.<ns>.<op>`` (a :class:`CheckedPacket`) explains
a call torch rejects with the same check; a sparse, mkldnn, nested or quantized tensor reaches
the kernel of :data:`NON_STRIDED_KEYS`, which names it (:func:`._convert.check_strided`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

from .. import _deterministic, checked_mode
from ..errors import ArgumentError, AscendEmuError, DTypeError, ModeError, arg_error, as_runtime_error, describe
from . import _fake, _format
from ._guards import (DTYPE_CODE_ARGUMENTS, INT64_MAX, INT64_MIN, MATH_BIT_KEYS, NON_STRIDED_KEYS, _has_sequence,  # noqa: F401
                      _kind_table, _math_bits_kernel, _with_codes, _wrong_kind, eager_allowed, meta_rule,
                      scalar_type_code)  # (re-exported: the drop-in's modules and tests read them here)
from ._npu_tensor import NPUTensor, check_same_device, wrap_outputs
from .npu import is_on_npu
from ._convert import _is_default, _param_names, _signature, _up, check_strided, resolve_op, to_numpy
from .schemas import SCHEMAS, TORCH_NPU_VERSION, WRITES_UNANNOTATED, OpSchema

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
    params.update(zip(names, args, strict=False))  # args: the schema's leading arguments
    params.update(kwargs)
    return params


@functools.lru_cache(maxsize=None)
def _accepted(fn: Callable) -> frozenset[str]:
    """Parameter names of the NumPy op ``fn`` (its signature, read once per op)."""
    return frozenset(_param_names(fn))


def _split(fn: Callable, table: tuple[tuple[str, str, bool], ...]) -> tuple:
    """The schema arguments (``table``: :func:`_kind_table`) split for ``fn``, each in schema
    order: the tensors it takes as ``(name, whether a None is passed)`` (a None is left out where
    ``fn``'s own default is None), the other values it takes as ``(name, fn's own default or
    _REFUSED)`` (an argument that *is* its default object is left out of the call: the same
    call, with fewer keywords to bind; 5-8 us of the MLA prolog's 38), and the arguments it
    does not take. Each tensor also says whether its slot is optional (``Tensor?``)."""
    accepted = _accepted(fn)
    sig = _signature(fn)
    own = {n: p.default for n, p in sig.parameters.items() if p.default is not p.empty} if sig else {}
    return (tuple((n, own.get(n, _REFUSED) is not None, optional) for n, kind, optional in table
                  if n in accepted and kind == "Tensor"),
            tuple((n, own.get(n, _REFUSED)) for n, kind, _ in table if n in accepted and kind != "Tensor"),
            tuple(n for n, _, _ in table if n not in accepted))


def emulate(op_name: str, params: dict[str, Any], defaults: dict[str, Any], public_name: str,
            table: tuple[tuple[str, str, bool], ...], splits: dict, outputs: tuple = ()) -> Any:
    """Run ``ascend_emu.ops.<op_name>`` with the schema arguments ``params`` (all by keyword;
    ``table``: the schema's :func:`_kind_table`), each tensor converted once. ``splits``: the
    caller's memo of :func:`_split` per op function. ``outputs``: a framework namespace's output
    mapping (:attr:`.namespaces.NamespaceSchema.outputs`: an int picks the op's output, a
    :class:`.namespaces.Placeholder` is an empty ``[0]`` array of its dtype), applied before the
    results become tensors; empty: the op's outputs as they are.

    Raises:
        NotImplementedError: the op does not exist in this version.
        ModeError: a non-default value for an argument the op does not take.
        DTypeError: None for a tensor the schema requires (``Tensor``, not ``Tensor?``).
    """
    fn = resolve_op(op_name, public_name)
    split = splits.get(fn)
    if split is None:
        split = splits[fn] = _split(fn, table)
    tensors, values, others = split
    for key in others:
        default = defaults.get(key)
        value = params.get(key, default)
        if value is not default and not _is_default(value, default):
            raise arg_error(ModeError, key, f"the default {default!r} ({public_name} in ascend_emu does "
                            f"not support this argument)", describe(value))
    kwargs = {key: value for key, own in values if (value := params[key]) is not own}
    originals: dict = {}  # id(array) -> (array, tensor), as :func:`._convert.call_op` keeps it
    for key, pass_none, optional in tensors:  # a schema Tensor slot holds a tensor or None, never a list
        value = params[key]
        if value is None:
            if not optional:  # torch's binder passes None for a required Tensor (an undefined tensor)
                raise arg_error(DTypeError, key, f"a torch.Tensor (required by {public_name}'s schema)", "None")
            if pass_none:
                kwargs[key] = None
            continue
        kwargs[key] = array = to_numpy(value, key)
        originals[id(array)] = (array, value)
    with _deterministic.scope(torch.are_deterministic_algorithms_enabled()):  # read at every call
        result = fn(**kwargs)
    if outputs:
        result = _map_outputs(result, outputs)
    return _up(result, originals)


def _map_outputs(result: Any, outputs: tuple) -> Any:
    """The op's ``result`` (one array or a tuple) rearranged by a namespace's output mapping."""
    got = result if isinstance(result, (tuple, list)) else (result,)
    mapped = tuple(got[entry] if isinstance(entry, int) else np.empty((0,), dtype=np.dtype(entry.dtype))
                   for entry in outputs)
    return mapped[0] if len(mapped) == 1 else mapped


def _reject_ascend950(params: dict[str, Any], public_name: str) -> None:
    for tag in _ASCEND950_TAGS:
        value = params.pop(tag, None)
        if value is not None:
            raise arg_error(ModeError, tag, f"None ({public_name}: cache dtype tags are for Ascend 950 caches, "
                            f"not emulated)", describe(value))


def _functional(op_name: str, params: dict[str, Any], names: tuple[str, ...], run: Callable[[], Any]):
    """``run()`` (an :func:`emulate` of the in-place op ``op_name`` on ``params``) writing copies
    of the caches ``names`` instead of the caller's (the ``_functional`` variants): the op's
    contract runs on the caller's caches, then :func:`ascend_emu.ops._check.copying_caches`
    copies them (``clone``, contiguous, format tags kept), so a rejected call copies nothing and
    raises what the in-place variant raises. Returns ``(run()'s result, the copies)``."""
    from ..ops._check import copying_caches  # ascend_emu.ops loads at the first op call

    copies: dict[str, torch.Tensor] = {}

    def copy(name: str, array) -> Any:
        copies[name] = clone = params[name].detach().clone(memory_format=torch.contiguous_format)
        return to_numpy(clone, name)

    with copying_caches(copy):
        out = run()
    missing = [name for name in names if name not in copies]
    if missing:
        raise RuntimeError(f"ascend_emu.ops.{op_name} did not take the copies of {missing}")
    return out, tuple(copies[name] for name in names)


def _writes(spec: OpSchema, schema: torch._C.FunctionSchema) -> tuple[str, ...]:
    """Arguments whose memory the op writes: the schema's ``(a!)`` ones and, for the ops torch_npu
    declares without annotations, :data:`.schemas.WRITES_UNANNOTATED`."""
    annotated = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    return annotated + (WRITES_UNANNOTATED.get(spec.qualified, ()) if spec.namespace == "npu" else ())


def _kernel_body(spec: OpSchema, schema: torch._C.FunctionSchema) -> Callable[[dict], Any]:
    """The CPU kernel of one overload on its arguments bound by schema name (all of them, in
    schema order): emulates the op, checks the output count against the schema and bumps the
    version counter of every tensor the op wrote in place (:func:`_writes`), so autograd and
    the FRACTAL_NZ tags (:func:`._convert.nz_of`) see the write."""
    defaults = _defaults(schema)
    qualified, name = spec.qualified, spec.name
    public = public_name(spec.namespace, name)
    writes = _writes(spec, schema)
    table = _kind_table(schema)
    splits: dict = {}
    declared = f"torch_npu {TORCH_NPU_VERSION}'s schema"
    op = getattr(spec, "op", "")

    def run(params: dict[str, Any]) -> Any:
        if qualified == "npu_mla_prolog_v3_functional":
            out, caches = _functional("npu_mla_prolog_v3", params, ("kv_cache", "kr_cache"), lambda: emulate(
                "npu_mla_prolog_v3", params, defaults, public, table, splits))
            return (*out, *caches)
        if qualified == "npu_kv_rmsnorm_rope_cache_v2":
            _reject_ascend950(params, public)
            return tuple(emulate("npu_kv_rmsnorm_rope_cache", params, defaults, public, table, splits)[2:])
        if qualified == "npu_kv_rmsnorm_rope_cache_v2_functional":
            _reject_ascend950(params, public)
            out, caches = _functional("npu_kv_rmsnorm_rope_cache", params, ("k_cache", "ckv_cache"), lambda: emulate(
                "npu_kv_rmsnorm_rope_cache", params, defaults, public, table, splits))
            return (*out[2:], *caches)
        if qualified in ("npu_scatter_pa_kv_cache_functional", "npu_gather_pa_kv_cache_functional"):
            op = name[: -len("_functional")]
            written = ("key_cache", "value_cache") if op == "npu_scatter_pa_kv_cache" else ("key", "value")
            return _functional(op, params, written, lambda: emulate(op, params, defaults, public, table, splits))[1]
        return emulate(name, params, defaults, public, table, splits)

    if op:  # a framework namespace's binding (:mod:`.namespaces`)
        run, declared = _namespace_run(spec, defaults, public, table), f"the schema of {spec.source}"

    returns = len(schema.returns)

    def body(params: dict[str, Any]) -> Any:
        written = [params[name] for name in writes if params.get(name) is not None]
        out = run(params)
        if written:
            torch.autograd.graph.increment_version(written)
        got = len(out) if isinstance(out, (tuple, list)) else (0 if out is None else 1)
        if got != returns:
            raise RuntimeError(f"{public}: the emulation returned {got} output(s); {declared} returns {returns}")
        return tuple(out) if returns > 1 else (out[0] if isinstance(out, (tuple, list)) else out)

    return body


def _namespace_run(spec, defaults: dict[str, Any], public: str,
                   table: tuple[tuple[str, str, bool], ...]) -> Callable[[dict], Any]:
    """The kernel of a framework-namespace overload (:class:`.namespaces.NamespaceSchema`) on
    its arguments bound by name: ``ascend_emu.ops.<spec.op>`` through :func:`emulate` with the
    namespace's defaults, ``spec.fixed`` for the arguments its schema lacks, ``spec.outputs``
    as the output mapping and, for a ``_functional`` variant, the caches copied
    (:func:`_functional`) and returned after the outputs."""
    op, outputs, functional, fixed = spec.op, spec.outputs, spec.functional, dict(spec.fixed)
    if fixed:  # arguments the namespace's schema lacks, at the values its kernel call implies
        table += tuple((name, type(value).__name__, False) for name, value in fixed.items())
        defaults = {**defaults, **fixed}
    splits: dict = {}

    untagged = spec.untagged_uint8
    public_name = f"torch.ops.{spec.namespace}.{spec.name}"

    def run(params: dict[str, Any]) -> Any:
        for name in untagged:  # 8-bit data the op tells apart by *_dtype tags this schema lacks
            value = params.get(name)
            if isinstance(value, torch.Tensor) and value.dtype == torch.uint8:
                raise arg_error(DTypeError, name, f"a dtype other than uint8 ({public_name} has no {name}_dtype "
                                "argument, so uint8 data (HiFloat8 on the Ascend 950) cannot be told apart; call "
                                f"torch_npu.{spec.op} with {name}_dtype=torch_npu.hifloat8)", "uint8")
        if fixed:
            params.update(fixed)
        if functional:
            out, caches = _functional(op, params, functional, lambda: emulate(
                op, params, defaults, public, table, splits, outputs))
            return (*out, *caches)
        return emulate(op, params, defaults, public, table, splits, outputs)

    return run


_FORMAT_KERNELS = {
    "get_npu_format": lambda self: _format.get_npu_format(self),
    "npu_format_cast": _format.npu_format_cast,
    "npu_format_cast.Tensor": _format.npu_format_cast_tensor,
    "npu_format_cast_": _format.npu_format_cast_src_,
    "npu_format_cast_.acl_format": _format.npu_format_cast_,
}


class _Binding:
    """One overload's CPU kernel and the tables binding its arguments by schema name, computed
    once per overload.

    ``body(params)`` is the kernel on arguments bound by name (:func:`_kernel_body`, or the
    format kernel of :data:`_FORMAT_KERNELS` called by keyword); ``kernel(*args, **kwargs)``
    is what the dispatcher calls; :meth:`bind_eager` binds a call for :func:`public_op`'s eager
    path, or says it must go through the dispatcher.
    """

    def __init__(self, spec: OpSchema, schema: torch._C.FunctionSchema):
        self.defaults = _defaults(schema)
        self.names = tuple(a.name for a in schema.arguments)
        fmt = _FORMAT_KERNELS.get(spec.qualified)
        self.body = (lambda params: fmt(**params)) if fmt is not None else _kernel_body(spec, schema)
        #: name -> (schema position, kind, optional); kind as in :func:`_kind_table`.
        self.slots = {name: (i, kind, optional) for i, (name, kind, optional) in enumerate(_kind_table(schema))}
        self.positional = sum(not a.kwarg_only for a in schema.arguments)
        required = [(i, a.name) for i, a in enumerate(schema.arguments) if not a.has_default_value()]
        #: For n positional arguments given: the required names that must come by keyword.
        self.by_keyword = tuple(tuple(name for i, name in required if i >= n) for n in range(self.positional + 1))
        self.table = _kind_table(schema)
        #: The schema's ``Tensor`` / ``Tensor?`` arguments (the only ones the eager path binds a tensor to).
        self.tensor_names = tuple(name for name, kind, _ in self.table if kind == "Tensor")
        defaults, names, body = self.defaults, self.names, self.body

        def kernel(*args, **kwargs):
            return body(_bind(schema, args, kwargs, defaults, names))

        def strided_only(*args, **kwargs):
            # a sparse / mkldnn / nested / quantized tensor among the arguments: the dispatcher
            # picked that tensor's key; the conversion step's check names it
            for name, value in zip(names, args, strict=False):  # args: the leading arguments
                if isinstance(value, torch.Tensor):
                    check_strided(value, name)
            for name, value in kwargs.items():
                if isinstance(value, torch.Tensor):
                    check_strided(value, name)
            return kernel(*args, **kwargs)

        kernel.__name__ = f"{spec.namespace}_{spec.qualified.replace('.', '_')}_cpu"
        strided_only.__name__ = f"{spec.namespace}_{spec.qualified.replace('.', '_')}_non_strided"
        self.kernel = kernel
        #: The kernel of :data:`NON_STRIDED_KEYS`: rejects the non-strided tensor (FormatError /
        #: DTypeError naming it), else runs :attr:`kernel`.
        self.strided_only = strided_only

    def mismatch(self, args: tuple, kwargs: dict, public: str) -> tuple[int, AscendEmuError] | None:
        """The first thing this overload's schema rejects in the call ``(args, kwargs)``, as
        ``(rank, error)``, or None when the call fits it; :func:`check_call` reports the best
        ranked overload. ``rank``: -1 when the call is not shaped for this overload (too many
        positional arguments, a keyword it does not have, an argument given twice); else the
        schema position of the first argument of the wrong kind (:func:`_wrong_kind`), or the
        argument count for a required argument missing (every kind fits). Errors name the
        argument and summarise the value, never print a tensor."""
        n = len(args)
        if n > self.positional:
            return -1, ArgumentError(f"{public}: takes at most {self.positional} positional arguments, got {n}")
        for name in kwargs:
            slot = self.slots.get(name)
            if slot is None:
                return -1, arg_error(ArgumentError, name, f"an argument of {public}'s schema", "an unknown keyword")
            if slot[0] < n:
                return -1, arg_error(ArgumentError, name, "one value", "it by position and by keyword")
        wrong = _wrong_kind(self.table, args, kwargs)
        if wrong is not None:
            return wrong
        for name in self.by_keyword[n]:
            if name not in kwargs:
                return len(self.table), arg_error(ArgumentError, name, f"a value (required by {public})", "nothing")
        return None

    def bind_eager(self, args: tuple, kwargs: dict, grad: bool) -> dict[str, Any] | None:
        """The call's arguments by name (defaults filled in, Python scalars as the dispatcher
        passes them), or None when the dispatcher must take it: arguments the schema does not
        match (the dispatcher path raises its error), or a tensor that is not a plain strided
        CPU ``torch.Tensor`` / ``nn.Parameter``, or one that requires grad while ``grad``."""
        n = len(args)
        if n > self.positional:
            return None
        params = self.defaults.copy()
        slots = self.slots
        on_npu = None
        for name, value in zip(self.names, args, strict=False):  # args: the leading arguments
            cls = type(value)
            if cls is _Tensor:  # the common case inline
                if not (slots[name][1] == "Tensor" and value.is_cpu and value.layout is _strided
                        and not (grad and value.requires_grad)):
                    return None  # _admit refuses it too
            elif cls is NPUTensor:  # the npu device: its CPU memory
                elem = value._elem
                if not (slots[name][1] == "Tensor" and not (grad and value.requires_grad) and type(elem) is _Tensor
                        and elem.layout is _strided):
                    return None
                if on_npu is None:
                    on_npu = params[ON_NPU_KEY] = {}
                on_npu[name] = value
                value = elem
            else:
                value = _admit(value, slots[name], grad)
                if value is _REFUSED:
                    return None
            params[name] = value
        for name, value in kwargs.items():
            slot = slots.get(name)
            if slot is None or slot[0] < n:
                return None
            kind = slot[1]
            cls = type(value)
            if cls is _Tensor:  # the common cases inline
                if not (kind == "Tensor" and value.is_cpu and value.layout is _strided
                        and not (grad and value.requires_grad)):
                    return None
            elif cls is NPUTensor:
                elem = value._elem
                if not (kind == "Tensor" and not (grad and value.requires_grad) and type(elem) is _Tensor
                        and elem.layout is _strided):
                    return None
                if on_npu is None:
                    on_npu = params[ON_NPU_KEY] = {}
                on_npu[name] = value
                value = elem
            elif not ((_SCALARS.get(kind) is cls and (kind != "int" or INT64_MIN <= value <= INT64_MAX))
                      or (value is None and slot[2])):
                value = _admit(value, slot, grad)
                if value is _REFUSED:
                    return None
            params[name] = value
        for name in self.by_keyword[n]:
            if name not in kwargs:
                return None
        return params


_REFUSED = object()
#: Key of :meth:`_Binding.bind_eager`'s result saying an argument was an NPUTensor.
ON_NPU_KEY = "\0on_npu"


_Tensor, _strided = torch.Tensor, torch.strided
_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def _admit(value, slot: tuple[int, str, bool], grad: bool):
    """``value`` as the dispatcher would hand it to the kernel for a schema slot, or
    :data:`_REFUSED` (see :meth:`_Binding.bind_eager`)."""
    kind = slot[1]
    if value is None:
        return value if slot[2] else _REFUSED
    if kind == "Tensor":
        cls = type(value)
        if (cls is torch.Tensor or cls is torch.nn.Parameter) and value.is_cpu and value.layout is torch.strided \
                and not (grad and value.requires_grad):
            return value
        return _REFUSED  # an NPUTensor: bound by _Binding.bind_eager itself
    if kind == "List[int]":  # int[] (FIA's actual_seq_lengths): a list of Python ints, as the dispatcher passes it
        if isinstance(value, (list, tuple)) and all(type(v) is int and INT64_MIN <= v <= INT64_MAX for v in value):
            return list(value)
        return _REFUSED
    scalar = _SCALARS.get(kind)
    if scalar is None or isinstance(value, bool) is not (scalar is bool):
        return _REFUSED
    if scalar is int and isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return _REFUSED  # the dispatcher path's check names it
    if type(value) is scalar:
        return value
    if isinstance(value, scalar) or (scalar is float and isinstance(value, int)):
        return scalar(value)
    return _REFUSED


#: The CPU kernel binding of every registered overload, by ``namespace::name[.overload]``.
_BINDINGS: dict[str, _Binding] = {}


def _below_autograd(overload) -> Callable:
    def kernel(*args, **kwargs):
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args, **kwargs)

    return kernel


def _format_cast_backward(ctx, grad):
    return grad, None


def _format_cast_tensor_backward(ctx, grad):
    return grad, None


def _dtype_cast_autograd(overload) -> Callable:
    """The Autograd kernel of ``npu_dtype_cast``, as torch_npu registers it: the output joins the
    graph (``grad_fn`` ``NpuDtypeCastBackward``) and the backward casts the gradient back to
    ``self``'s dtype with ``npu_dtype_cast`` itself, so a ``create_graph=True`` gradient is
    differentiable again. A non-floating output never requires grad (torch's rule)."""

    class NpuDtypeCast(torch.autograd.Function):
        @staticmethod
        def forward(ctx, self, dtype, input_dtype):
            ctx.src = self.dtype
            with torch._C._AutoDispatchBelowAutograd():
                return overload(self, dtype, input_dtype)

        @staticmethod
        def backward(ctx, grad):
            if torch.is_grad_enabled() and not grad.requires_grad and grad.is_floating_point():
                # create_graph=True: the gradient is itself an npu_dtype_cast output with a
                # grad_fn, as torch_npu's (whose backward op has its own derivative)
                grad = grad.detach().requires_grad_()
            return torch.ops.npu.npu_dtype_cast(grad, scalar_type_code(ctx.src, "self")), None, None

    def kernel(self, dtype, input_dtype=None):
        return NpuDtypeCast.apply(self, dtype, input_dtype)

    return kernel


def register() -> None:
    """Define and implement every op of :data:`.schemas.SCHEMAS` (once per process)."""
    global _DONE
    if _DONE:
        return
    for spec in SCHEMAS:
        register_spec(spec)
    check_packets(dict.fromkeys((s.namespace, s.name) for s in SCHEMAS))
    _DONE = True


#: Every overload registered, torch_npu's (:data:`.schemas.SCHEMAS`) and the framework
#: namespaces' (:data:`.namespaces.NAMESPACE_SCHEMAS`), in registration order.
_REGISTERED: list[OpSchema] = []


def register_spec(spec: OpSchema) -> None:
    """Define one overload with ``torch.library`` and implement it: the schema string, the CPU
    kernel of its :class:`_Binding` (also for :data:`NON_STRIDED_KEYS`), the kernel of
    :data:`MATH_BIT_KEYS` (rejects a conjugated / negated view), the fake kernel
    (:data:`._fake.FAKES`; a :class:`.namespaces.NamespaceSchema` gets :func:`namespace_fake`
    of its op's) under :func:`meta_rule`, and the Autograd kernel. The packet's argument check comes from
    :func:`check_packets`."""
    lib = _LIBS.get(spec.namespace)
    if lib is None:
        lib = _LIBS[spec.namespace] = torch.library.Library(spec.namespace, "FRAGMENT")
    lib.define(spec.schema)
    schema = torch._C.parse_schema(f"{spec.namespace}::{spec.schema}")
    key = f"{spec.namespace}::{spec.qualified}"
    binding = _BINDINGS[key] = _Binding(spec, schema)
    _REGISTERED.append(spec)
    lib.impl(spec.qualified, binding.kernel, "CPU")
    for dispatch_key in NON_STRIDED_KEYS:
        lib.impl(spec.qualified, binding.strided_only, dispatch_key)
    public = public_name(spec.namespace, spec.name)
    math_bits = _math_bits_kernel(binding.names, public)
    for dispatch_key in MATH_BIT_KEYS:
        lib.impl(spec.qualified, math_bits, dispatch_key)
    fake = _fake.FAKES.get(key) if not getattr(spec, "op", "") else namespace_fake(spec, schema)
    if fake is not None:
        torch.library.register_fake(key, meta_rule(fake, binding.names, public), lib=lib)
    packet = getattr(getattr(torch.ops, spec.namespace), spec.name)
    overload = getattr(packet, spec.qualified.split(".")[1] if "." in spec.qualified else "default")
    if key == "npu::npu_format_cast":
        torch.library.register_autograd(key, _format_cast_backward, lib=lib)
    elif key == "npu::npu_format_cast.Tensor":
        torch.library.register_autograd(key, _format_cast_tensor_backward, lib=lib)
    elif key == "npu::npu_dtype_cast":
        lib.impl(spec.qualified, _dtype_cast_autograd(overload), "Autograd")
    else:
        lib.impl(spec.qualified, _below_autograd(overload), "Autograd")


def check_packets(ops) -> None:
    """Give each ``torch.ops.<namespace>.<name>`` of ``ops`` (``(namespace, name)`` pairs, all
    registered by :func:`register_spec`) the argument check of :class:`CheckedPacket`."""
    for namespace, name in ops:
        packet = getattr(getattr(torch.ops, namespace), name)
        _CHECKS[packet._qualified_op_name] = check_call(namespace, name)
        packet.__class__ = CheckedPacket


def namespace_fake(spec, schema: torch._C.FunctionSchema) -> Callable | None:
    """The fake kernel of a framework-namespace overload (:class:`.namespaces.NamespaceSchema`):
    the fake of the torch_npu op it binds (``npu::<op>`` in :data:`._fake.FAKES`; an op torch_npu
    does not have: :data:`._fake.NAMESPACE_FAKES`), called with
    the arguments by name, then the binding's output mapping (a placeholder is an empty ``[0]``
    tensor of its dtype) and, for a ``_functional`` variant, the caches' likes. None when
    :data:`._fake.FAKES` has no fake of the op."""
    base = _fake.FAKES.get(f"npu::{spec.op}") or _fake.NAMESPACE_FAKES.get(spec.op)
    if base is None:
        return None
    defaults, names = _defaults(schema), tuple(a.name for a in schema.arguments)
    outputs, functional = spec.outputs, spec.functional

    def fake(*args, **kwargs):
        params = _bind(schema, args, kwargs, defaults, names)
        out = base(**params)
        if outputs:
            got = out if isinstance(out, (tuple, list)) else (out,)
            like = next(v for v in params.values() if isinstance(v, torch.Tensor))
            out = tuple(got[e] if isinstance(e, int) else
                        torch.empty([0], dtype=getattr(torch, e.dtype), device=like.device) for e in outputs)
            out = out[0] if len(out) == 1 else out
        if functional:
            out = (*out, *(torch.empty_like(params[name]) for name in functional))
        return out

    fake.__name__ = f"{spec.namespace}_{spec.qualified}_fake"
    return fake













#: :func:`check_call`'s check of every registered op, by ``namespace::name``.
_CHECKS: dict[str, Callable[[tuple, dict], "_Binding"]] = {}


class CheckedPacket(torch._ops.OpOverloadPacket):
    """``torch.ops.npu.<op>`` / ``torch.ops.atb.<op>`` of the emulated ops (the class of the
    packet torch created, swapped in by :func:`register`: same object, same overloads): a call
    torch rejects before any kernel runs (no schema matches, a tensor of a layout or subclass
    with no kernel) is explained by :func:`check_call`, an ascend_emu error naming the argument
    with a short summary of its value, instead of torch's message that prints the value (a
    whole tensor) and every schema. A call passing a list, tuple or array is checked first
    (:func:`_has_sequence`); any other call torch accepts costs nothing more; an error whose
    cause the check does not find is torch's, unchanged."""

    def __call__(self, /, *args, **kwargs):
        if _has_sequence(args, kwargs):  # torch's binder takes seconds on a long list given for a tensor
            error = _explain(self._qualified_op_name, args, kwargs)
            if error is not None:
                raise as_runtime_error(error)
        try:
            return self._op(*args, **kwargs)
        except AscendEmuError as emu_error:  # torch_npu rejects with a RuntimeError
            error = as_runtime_error(emu_error)
            error.__context__ = emu_error.__context__
            explained = False
        except Exception:  # noqa: BLE001  (re-raised unless the check finds the cause)
            error = _explain(self._qualified_op_name, args, kwargs)
            if error is None:
                raise
            explained = True
        if explained:
            raise as_runtime_error(error) from None
        raise error  # outside the handler: no chained context






def _explain(qualified: str, args: tuple, kwargs: dict) -> AscendEmuError | None:
    """The ascend_emu error that explains why torch rejected a call of ``qualified``, or None:
    :func:`check_call`'s, else :func:`._convert.check_strided`'s for a tensor argument (a nested
    tensor subclass has no kernel to reach)."""
    check = _CHECKS.get(qualified)
    if check is None:
        return None
    try:
        binding = check(args, kwargs)
        for name, value in (*zip(binding.names, args, strict=False), *kwargs.items()):  # args: the leading ones
            if isinstance(value, torch.Tensor):
                check_strided(value, name)
    except AscendEmuError as error:
        return error
    return None


def check_call(namespace: str, name: str) -> Callable[[tuple, dict], "_Binding"]:
    """The argument check of ``torch_npu.<name>`` / ``torch.ops.<namespace>.<name>``, every
    overload at once: ``check(args, kwargs)`` returns the binding of the first overload whose
    schema the call fits, else raises the error of the overload that fits it best
    (:meth:`_Binding.mismatch`: of the overloads the call is shaped for, the one whose first
    wrong argument comes latest; with none, the first overload's; torch's own message would
    print the value, a tensor in full, and every schema). The format casts check a non-tensor
    format first (:func:`._format._check_cast_args`: ModeError listing the accepted formats).

    Raises:
        DTypeError / ModeError: an argument of the wrong kind (ModeError for a str argument).
        ArgumentError: too many positional arguments, an unknown keyword, an argument given
            twice, a required argument missing.
    """
    bindings = tuple(_BINDINGS[f"{namespace}::{s.qualified}"] for s in _REGISTERED
                     if s.namespace == namespace and s.name == name)
    public = public_name(namespace, name)
    cast = namespace == "npu" and name.startswith("npu_format_cast")

    def check(args: tuple, kwargs: dict) -> _Binding:
        if cast and len(args) > 1 and not isinstance(args[1], torch.Tensor):
            _format._check_cast_args(args[1], kwargs.get("customize_dtype"), kwargs.get("input_dtype"),
                                     customizable=name == "npu_format_cast")
        problems = []
        for binding in bindings:
            problem = binding.mismatch(args, kwargs, public)
            if problem is None:
                return binding
            problems.append(problem)
        raise max(problems, key=lambda p: p[0])[1]  # the first of the best ranked

    return check












def public_name(namespace: str, name: str) -> str:
    """How errors name an op: ``torch_npu.<name>`` / ``torch_npu.atb.<name>`` for torch_npu's
    namespaces, ``torch.ops.<namespace>.<name>`` for a framework's (:mod:`.namespaces`)."""
    if namespace in ("npu", "atb"):
        return f"torch_npu.{'atb.' if namespace == 'atb' else ''}{name}"
    return f"torch.ops.{namespace}.{name}"


_checked_enabled = checked_mode.enabled
_grad_enabled = torch.is_grad_enabled


def _flag_host_call(public: str, params: dict) -> None:
    """Checked mode: report an eager call whose tensors are all on the CPU (none on the NPU)."""
    tensors = [v for v in params.values() if isinstance(v, torch.Tensor)]
    if tensors and not any(is_on_npu(t) for t in tensors):
        checked_mode.host_call(public)


def public_op(namespace: str, name: str) -> Callable:
    """``torch_npu.<name>``: a thin callable of ``torch.ops.<namespace>.<name>`` (its ``op``
    attribute) that checks the arguments against the schemas first (:func:`check_call`:
    ascend_emu errors naming the argument, never a printed tensor).

    Eager fast path: a plain eager call (:func:`eager_allowed`, every tensor a plain strided
    CPU tensor, none requiring grad while grad mode is on; :meth:`_Binding.bind_eager`) runs
    the overload's CPU kernel directly, the same function the dispatcher would call, so
    outputs, NPU marks, format tags, version-counter bumps and errors are the same; it skips
    the dispatcher's ~15 us. Every other call goes through ``torch.ops``.

    Overloaded ops (``npu_format_cast``, ``npu_format_cast_``, ``atb.npu_mla_preprocess``): the
    eager path takes the one overload whose schema the call matches; on the dispatcher path
    :func:`check_call` checks the call against every overload, and a call one of them fits is
    resolved by torch.
    """
    packet = getattr(getattr(torch.ops, namespace), name)
    specs = [s for s in SCHEMAS if s.namespace == namespace and s.name == name]
    public = f"torch_npu.{'atb.' if namespace == 'atb' else ''}{name}"
    bindings = tuple(_BINDINGS[f"{namespace}::{s.qualified}"] for s in specs)
    check = _CHECKS[packet._qualified_op_name]
    coded = DTYPE_CODE_ARGUMENTS.get(name, ()) if namespace == "npu" else ()
    coded_at = {i: a for i, a in enumerate(bindings[0].names) if a in coded}

    def call(*args, **kwargs):
        try:
            if coded:
                args, kwargs = _with_codes(coded, coded_at, args, kwargs)
            if eager_allowed():
                grad = _grad_enabled()
                for binding in bindings:
                    params = binding.bind_eager(args, kwargs, grad)
                    if params is not None:
                        if ON_NPU_KEY in params:  # NPUTensors: run on their memory, outputs on the NPU
                            on_npu = params.pop(ON_NPU_KEY)
                            check_same_device(on_npu, params, public, binding.tensor_names)
                            return wrap_outputs(binding.body(params), on_npu)
                        if _checked_enabled():
                            _flag_host_call(public, params)
                        return binding.body(params)
            check(args, kwargs)
            return packet(*args, **kwargs)
        except AscendEmuError as error:  # torch_npu rejects with a RuntimeError
            converted = as_runtime_error(error)
        raise converted  # outside the handler: no chained context

    call.__name__ = call.__qualname__ = name
    call.__module__ = "torch_npu" + (".atb" if namespace == "atb" else "")
    call.__doc__ = (f"``{public}``: ``torch.ops.{namespace}.{name}`` (torch_npu {TORCH_NPU_VERSION} schema"
                    f"{'s' if len(specs) > 1 else ''}, :mod:`ascend_emu.torch_npu.schemas`).\n\n"
                    + "\n".join(f"    {namespace}::{s.schema}" for s in specs))
    call.op = packet
    out_specs = [s for s in specs if s.qualified == f"{name}.out"]
    if out_specs:
        call.out = _out_form(packet, out_specs[0], public)
    return call


def _out_form(packet, spec: OpSchema, public: str) -> Callable:
    """``torch_npu.<name>.out``: the ``.out`` overload called as torch_npu's Python binding takes it,
    the written tensors as one ``out=[...]`` list in schema order (``npu_fused_infer_attention_score
    .out(..., workspace=ws, out=[attention_out, softmax_lse])``, vllm-ascend's graph capture), or by
    their schema names. The arguments are checked against the ``.out`` schema first, as
    :func:`public_op` checks them (an ascend_emu error naming the argument)."""
    schema = packet.out._schema
    names = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    binding = _BINDINGS[f"{spec.namespace}::{spec.qualified}"]

    def out_call(*args, out=None, **kwargs):
        if out is not None:
            if not isinstance(out, (list, tuple)) or len(out) != len(names):
                raise arg_error(ArgumentError, "out", f"a list of {len(names)} tensors ({', '.join(names)})",
                                describe(out))
            kwargs.update(zip(names, out, strict=True))
        problem = binding.mismatch(args, kwargs, f"{public}.out")  # the argument check torch_npu.<op> makes
        if problem is not None:
            raise as_runtime_error(problem[1])
        return packet.out(*args, **kwargs)

    out_call.__name__ = out_call.__qualname__ = f"{spec.name}.out"
    out_call.__doc__ = f"``{public}.out``: ``torch.ops.npu.{spec.qualified}``, ``out=[{', '.join(names)}]``."
    return out_call


def registered_schema(spec: OpSchema) -> str:
    """The schema torch holds for ``spec`` (as ``str(FunctionSchema)``)."""
    packet = getattr(getattr(torch.ops, spec.namespace), spec.name)
    overload = getattr(packet, spec.qualified.split(".")[1] if "." in spec.qualified else "default")
    return str(overload._schema)
