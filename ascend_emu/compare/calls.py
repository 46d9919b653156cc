"""One recorded op call, its replay on the emulator and the comparison of the two.

A :class:`Call` holds host copies of everything a torch_npu op call saw and produced: the
positional and keyword arguments (tensors as NumPy arrays with their ACL format, plain values as
they were), the in-place arguments (caches, out= tensors) before and after the call, and the
outputs. :func:`replay` runs it again through :mod:`ascend_emu.ops` on the ``emu`` backend (by
op name; ``torch_npu.atb.npu_mla_preprocess`` is ``ops.npu_mla_preprocess``) and
:func:`compare_call` puts the two side by side (:mod:`.metrics`).
"""

from __future__ import annotations

import inspect as _pyinspect
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import checked_mode
from ..errors import BackendUnavailable
from ..layouts import FRACTAL_NZ, CacheLayout
from ..layouts.paged import PAGED_KV_LAYOUT_MODES
from ..quant import TORCH_NPU_DTYPE_CODES
from .metrics import TensorComparison, compare_tensor


@dataclass(frozen=True)
class OpInfo:
    """What the comparison needs to know about one emulated torch_npu op.

    Attributes:
        name: name in :mod:`ascend_emu.ops` (and msprobe's API name).
        api: the torch_npu attribute path (``atb.npu_mla_preprocess``).
        inplace: arguments the op writes in place (caches, out= tensors).
        outputs: names of the returned tuple's elements.
        cache_mode: how to read the cache mode of the in-place arguments: ``(argument name,
            default, {value: inspect cache mode})``; None when there is no cache. The default
            stands for an absent or None argument unless the table maps None itself.
        replays_fully: msprobe dumps hold everything it needs (no FRACTAL_NZ weight, every
            in-place result returned).
        runs: the :mod:`ascend_emu.ops` function that emulates it (default ``name``; the v2 and
            functional forms of an op run the op itself).
        returns: which elements of that function's result the op returns, in order (None: all),
            before the ``functional`` copies.
        functional: caches the op does not write but returns updated copies of (a
            ``_functional`` form, ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``):
            appended to the outputs, in this order; only their written slots are defined (unless
            ``clones``).
        undefined_unless: ``(flag, default, outputs)``: ``outputs`` hold undefined memory
            unless the argument ``flag`` (default ``default``) is true; they are not compared.
        clones: the ``functional`` copies are clones of the inputs the op then writes (every
            byte defined, e.g. op-plugin ``ScatterPaKvCacheNpuOpApi.cpp``): compared whole and
            exactly, the written slots listed as expected.
        exact: outputs / in-place arguments compared bit-exactly although their names do not
            say cache (pure data movement: a gathered ``key`` / ``value``).
        hifloat8: ``(argument, outputs)`` pairs: ``outputs`` are HiFloat8 codes (uint8, as
            torch_npu carries them) when ``argument`` is torch_npu's hifloat8 code (290), so
            they are compared as HiF8 values, in HiF8 ulps.
    """

    name: str
    api: str
    inplace: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    cache_mode: tuple[str, str, dict] | None = None
    replays_fully: bool = False
    runs: str = ""
    returns: tuple[int, ...] | None = None
    functional: tuple[str, ...] = ()
    undefined_unless: tuple[str, bool, tuple[str, ...]] | None = None
    clones: bool = False
    exact: tuple[str, ...] = ()
    hifloat8: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def function(self) -> str:
        """The :mod:`ascend_emu.ops` function name that runs the op."""
        return self.runs or self.name


_PROLOG_IN = ("kv_cache", "kr_cache")
_PROLOG_MODE = ("cache_mode", "PA_BSND", {})
_PROLOG_OUT = ("query", "query_rope")
_MLAPP_MODE = ("cache_mode", "krope_ctkv", {"krope_ctkv": "PA_BSND",
                                            "nzcache": "PA_NZ", "int8_nzcache": "PA_NZ"})
_KV_CACHES = ("k_cache", "ckv_cache")
_KV_MODE = ("cache_mode", "Norm", {})
#: npu_kv_rmsnorm_rope_cache* with is_output_kv=False: torch_npu allocates k_embed_out / y_out
#: (the meta function always does, op_plugin/meta/_meta_registrations.py) and the kernel never
#: writes them (ops.kv_rmsnorm_rope_cache.UNWRITTEN_OUTPUT_FILL).
_KV_UNDEFINED = ("is_output_kv", False, ("k_embed_out", "y_out"))
_PA_CACHES = ("key_cache", "value_cache")
_PA_MODE = ("cache_mode", "PA_NZ", PAGED_KV_LAYOUT_MODES)  # torch_npu's default; None is Norm
_GATHERED = ("key", "value")

#: Every op the comparison knows, by ``ascend_emu.ops`` name. Ops missing from :mod:`ascend_emu.ops`
#: in this version are still recorded; their replay is reported as not possible.
OPS: dict[str, OpInfo] = {op.name: op for op in (
    OpInfo("npu_mla_prolog", "npu_mla_prolog", _PROLOG_IN, _PROLOG_OUT + _PROLOG_IN, _PROLOG_MODE),
    OpInfo("npu_mla_prolog_v2", "npu_mla_prolog_v2", _PROLOG_IN,
           _PROLOG_OUT + _PROLOG_IN + ("dequant_scale_q_nope",), _PROLOG_MODE),
    OpInfo("npu_mla_prolog_v3", "npu_mla_prolog_v3", _PROLOG_IN,
           _PROLOG_OUT + ("dequant_scale_q_nope", "query_norm", "dequant_scale_q_norm"), _PROLOG_MODE,
           hifloat8=(("weight_uq_qr_dtype", ("query_norm",)),)),
    OpInfo("npu_kv_rmsnorm_rope_cache", "npu_kv_rmsnorm_rope_cache", _KV_CACHES,
           ("k_cache", "ckv_cache", "k_embed_out", "y_out"), _KV_MODE, replays_fully=True,
           undefined_unless=_KV_UNDEFINED),
    OpInfo("npu_kv_rmsnorm_rope_cache_v2", "npu_kv_rmsnorm_rope_cache_v2", _KV_CACHES, ("k_embed_out", "y_out"),
           _KV_MODE, runs="npu_kv_rmsnorm_rope_cache", returns=(2, 3), undefined_unless=_KV_UNDEFINED),
    OpInfo("npu_kv_rmsnorm_rope_cache_v2_functional", "npu_kv_rmsnorm_rope_cache_v2_functional", (),
           ("k_embed_out", "y_out", "k_cache", "ckv_cache"), _KV_MODE, replays_fully=True,
           runs="npu_kv_rmsnorm_rope_cache", returns=(2, 3), functional=_KV_CACHES, undefined_unless=_KV_UNDEFINED),
    OpInfo("npu_mla_preprocess", "atb.npu_mla_preprocess",
           ("kv_cache", "kv_cache_rope", "q_out0", "kv_cache_out0", "q_out1", "kv_cache_out1"),
           ("q_out0", "kv_cache_out0", "q_out1", "kv_cache_out1"), _MLAPP_MODE),
    OpInfo("npu_sparse_flash_attention", "npu_sparse_flash_attention", replays_fully=True),
    OpInfo("npu_kv_quant_sparse_flash_attention", "npu_kv_quant_sparse_flash_attention", replays_fully=True),
    OpInfo("npu_lightning_indexer", "npu_lightning_indexer", replays_fully=True),
    OpInfo("npu_quant_lightning_indexer", "npu_quant_lightning_indexer", replays_fully=True),
    OpInfo("npu_fused_infer_attention_score", "npu_fused_infer_attention_score", replays_fully=True),
    OpInfo("npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score_v2", replays_fully=True),
    OpInfo("npu_interleave_rope", "npu_interleave_rope", outputs=("y",), replays_fully=True),
    OpInfo("npu_rotary_mul", "npu_rotary_mul", outputs=("y",), replays_fully=True),
    OpInfo("npu_dynamic_quant", "npu_dynamic_quant", outputs=("y", "scale"), replays_fully=True),
    OpInfo("npu_dynamic_quant_asymmetric", "npu_dynamic_quant_asymmetric", outputs=("y", "scale", "offset"),
           replays_fully=True),
    OpInfo("npu_dtype_cast", "npu_dtype_cast", outputs=("y",), replays_fully=True, hifloat8=(("dtype", ("y",)),)),
    OpInfo("npu_dynamic_mx_quant", "npu_dynamic_mx_quant", outputs=("y", "mxscale"), replays_fully=True),
    OpInfo("npu_dynamic_mx_quant_with_dual_axis", "npu_dynamic_mx_quant_with_dual_axis",
           outputs=("y1", "mxscale1", "y2", "mxscale2"), replays_fully=True),
    OpInfo("npu_scatter_pa_kv_cache", "npu_scatter_pa_kv_cache", _PA_CACHES, cache_mode=_PA_MODE),
    OpInfo("npu_scatter_pa_kv_cache_functional", "npu_scatter_pa_kv_cache_functional", (), _PA_CACHES, _PA_MODE,
           replays_fully=True, runs="npu_scatter_pa_kv_cache", returns=(), functional=_PA_CACHES, clones=True),
    OpInfo("npu_gather_pa_kv_cache", "npu_gather_pa_kv_cache", _GATHERED, exact=_GATHERED),
    OpInfo("npu_gather_pa_kv_cache_functional", "npu_gather_pa_kv_cache_functional", (), _GATHERED,
           replays_fully=True, runs="npu_gather_pa_kv_cache", returns=(), functional=_GATHERED, clones=True),
)}


@dataclass
class TensorValue:
    """A host copy of a tensor argument / result.

    Attributes:
        array: NumPy array (bf16 as ``ml_dtypes.bfloat16``) of the logical ND values, or None
            when the data is not available (e.g. an NZ tensor msprobe did not save).
        npu_format: ACL format the tensor had on the device (29 = FRACTAL_NZ, 2 = ND).
        dtype, shape: as recorded (kept when ``array`` is None).
    """

    array: np.ndarray | None
    npu_format: int = 2
    dtype: str | None = None
    shape: list | None = None

    def __post_init__(self):
        if self.array is not None:
            self.dtype = self.dtype or self.array.dtype.name
            self.shape = list(self.array.shape) if self.shape is None else self.shape


@dataclass
class Call:
    """One op call as the device ran it.

    Attributes:
        index: position in the recording (0-based).
        op: :data:`OPS` key (``ascend_emu.ops`` name).
        api: name as called (``torch_npu.npu_mla_prolog_v3``).
        args: positional arguments (:class:`TensorValue`, plain values, lists of them).
        kwargs: keyword arguments, as given.
        arg_names: names of the positional parameters (from the op's signature).
        after: in-place arguments after the call, by name.
        outputs: the returned values, in order (an element that *is* an in-place argument is
            the string ``"=<name>"``).
        error: the device's exception (``Type: message``) if the call raised.
        unavailable: why the call cannot be replayed, if that is already known (e.g. msprobe
            did not save an NZ weight).
    """

    index: int
    op: str
    api: str
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    arg_names: list = field(default_factory=list)
    after: dict = field(default_factory=dict)
    outputs: list = field(default_factory=list)
    error: str | None = None
    unavailable: str | None = None

    def named(self) -> dict[str, Any]:
        """Every argument by name (positional ones through :attr:`arg_names`)."""
        out = {(self.arg_names[i] if i < len(self.arg_names) else f"args[{i}]"): v for i, v in enumerate(self.args)}
        out.update(self.kwargs)
        return out


@dataclass
class CallReport:
    """The comparison of one call: ``status`` is ``identical``, ``pass``, ``fail``,
    ``not replayable`` (``reason`` says why), ``emu error`` or ``device error``; a dump replay
    adds ``timeout`` and ``deduplicated`` (not replayed, ``--dedup``).
    ``not_compared`` lists outputs the device leaves undefined (name -> why), which do not
    count in ``status``; ``where`` locates a call of a dump (``step``, ``rank``, ``call`` index
    in the rank's dump, ``layer``), None elsewhere; ``weights`` names where each FRACTAL_NZ
    weight a dump did not hold came from (argument -> source, or why it could not be rebuilt;
    :mod:`.nz_weights`)."""

    index: int
    op: str
    api: str
    status: str
    reason: str | None = None
    tensors: list[TensorComparison] = field(default_factory=list)
    not_compared: dict = field(default_factory=dict)
    where: dict | None = None
    weights: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain data (``not_compared`` / ``where`` / ``weights`` only when set)."""
        out = {"index": self.index, "op": self.op, "api": self.api, "status": self.status, "reason": self.reason,
               "tensors": [t.to_dict() for t in self.tensors]}
        if self.not_compared:
            out["not_compared"] = dict(self.not_compared)
        if self.where is not None:
            out["where"] = dict(self.where)
        if self.weights:
            out["weights"] = dict(self.weights)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "CallReport":
        """The inverse of :meth:`to_dict`."""
        return cls(d["index"], d["op"], d["api"], d["status"], d.get("reason"),
                   [TensorComparison(**t) for t in d.get("tensors", [])], dict(d.get("not_compared") or {}),
                   d.get("where"), dict(d.get("weights") or {}))


def arg_names(op: str) -> list[str]:
    """Parameter names of ``ascend_emu.ops.<op>`` in order ([] when the op is not emulated)."""
    from .. import ops

    fn = getattr(ops, OPS[op].function if op in OPS else op, None)
    if fn is None:
        return []
    return [p.name for p in _pyinspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def hifloat8_outputs(call: Call) -> frozenset[str]:
    """The outputs of ``call`` that hold HiFloat8 codes (:attr:`OpInfo.hifloat8`)."""
    info = OPS.get(call.op)
    if info is None or not info.hifloat8:
        return frozenset()
    named = call.named()
    code = TORCH_NPU_DTYPE_CODES["hifloat8"]
    return frozenset(out for arg, outs in info.hifloat8 if named.get(arg) == code for out in outs)


def cache_mode_of(call: Call) -> str | None:
    """The inspect cache mode of ``call``'s in-place caches (None when the op has none)."""
    info = OPS.get(call.op)
    if info is None or info.cache_mode is None:
        return None
    key, default, table = info.cache_mode
    value = call.named().get(key, default)
    value = default if value is None and None not in table else value
    return table.get(value, value)


# ---------------------------------------------------------------------------------- replay
@dataclass
class EmuResult:
    """What the emulator produced for a call: outputs (same convention as :attr:`Call.outputs`),
    in-place arguments after the call, or the reason it could not run.

    ``layouts``: argument name -> the :class:`~ascend_emu.layouts.CacheLayout` the op's contract
    describes that cache with, for every cache it read (its ``cache_reads()``) or wrote (its
    writer hook), the same object for both (:func:`ascend_emu.checked_mode.observe`). ``reads``:
    argument name -> the emulator's copy of each cache the op read, after the call (a reader
    leaves it byte-identical)."""

    outputs: list = field(default_factory=list)
    after: dict = field(default_factory=dict)
    error: str | None = None
    unavailable: str | None = None
    written: dict = field(default_factory=dict)
    layouts: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)


def _missing(v, path: str) -> str | None:
    if isinstance(v, TensorValue):
        if v.array is None:
            fmt = " (FRACTAL_NZ tensors are not saved by msprobe)" if v.npu_format == FRACTAL_NZ else ""
            return f"{path}: tensor data missing{fmt}"
        return None
    if isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            why = _missing(x, f"{path}[{i}]")
            if why:
                return why
    if isinstance(v, dict) and "unsupported" in v:
        return f"{path}: value of type {v['unsupported']} was not recorded"
    return None


def _to_emu(v, copies: dict, name: str):
    """A recorded value as ``ascend_emu.ops`` takes it (NZ tensors cast with npu_format_cast)."""
    from .. import ops

    if isinstance(v, TensorValue):
        a = np.array(v.array, copy=True)  # the op may write it in place
        if v.npu_format == FRACTAL_NZ:
            a = ops.npu_format_cast(a, FRACTAL_NZ)
        copies[name] = a
        return a
    if isinstance(v, list):
        return [_to_emu(x, copies, f"{name}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, dict) and "dtype" in v:
        return v["dtype"]
    return v


def replay(call: Call, backend: str = "emu") -> EmuResult:
    """Run ``call`` again on ``backend`` (default ``emu``; ``hw`` runs it on the NPU through the
    same op contract), from the recorded inputs (caches as they were before the call).

    Returns:
        An :class:`EmuResult`; ``unavailable`` says why nothing ran (op not emulated, data
        missing, an argument the emulator does not take), ``error`` holds the emulator's
        exception (its validation rejected the call).
    """
    from .. import ops

    info = OPS.get(call.op)
    function = info.function if info else call.op
    fn = getattr(ops, function, None)
    if fn is None:
        return EmuResult(unavailable=f"ascend_emu.ops.{function} does not exist in this version")
    if call.unavailable:
        return EmuResult(unavailable=call.unavailable)
    for name, v in call.named().items():
        why = _missing(v, name)
        if why:
            return EmuResult(unavailable=why)
    copies: dict[str, np.ndarray] = {}
    names = call.arg_names or arg_names(call.op)
    args = [_to_emu(v, copies, names[i] if i < len(names) else f"args[{i}]") for i, v in enumerate(call.args)]
    kwargs = {k: _to_emu(v, copies, k) for k, v in call.kwargs.items()}
    params = _pyinspect.signature(fn).parameters
    for k in [k for k in kwargs if k not in params and kwargs[k] is None]:
        del kwargs[k]  # torch_npu-only arguments at their default None (e.g. v3's *_dtype)
    extra = [k for k in kwargs if k not in params]
    if extra:
        return EmuResult(unavailable=f"argument(s) {extra} not taken by ascend_emu.ops.{function}")
    try:
        with ops.backend(backend), warnings.catch_warnings(), checked_mode.observe() as uses:
            warnings.simplefilter("ignore")
            result = fn(*args, **kwargs)
    except BackendUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001  (reported per call)
        return EmuResult(error=f"{type(exc).__name__}: {exc}")
    layouts, read_names = _cache_layouts(uses, copies)
    inplace = info.inplace if info else ()
    ids = {id(a): n for n, a in copies.items() if n in inplace}
    results = result if isinstance(result, (tuple, list)) else [result]
    if info is not None and info.returns is not None:
        results = [results[i] for i in info.returns]
    outputs = []
    for r in results:
        if isinstance(r, np.ndarray) and id(r) in ids:
            outputs.append(f"={ids[id(r)]}")
        else:
            outputs.append(None if r is None else TensorValue(np.asarray(r)) if isinstance(r, np.ndarray) else r)
    written = {}
    for name in info.functional if info else ():
        outputs.append(TensorValue(np.asarray(copies[name])))  # the op wrote this copy: the new cache
        if function in _WRITTEN_SLOTS:
            written[name] = _WRITTEN_SLOTS[function](args, kwargs)
    return EmuResult(outputs=outputs, after={n: np.asarray(copies[n]) for n in inplace if n in copies},
                     written=written, layouts=layouts, reads={n: np.asarray(copies[n]) for n in read_names})


def _memory(a) -> tuple[int, int] | None:
    """(data pointer, nbytes) of an array, None for anything else."""
    return (int(a.__array_interface__["data"][0]), int(a.nbytes)) if isinstance(a, np.ndarray) else None


def _cache_layouts(uses, copies: dict) -> tuple[dict[str, CacheLayout], tuple[str, ...]]:
    """The layouts the op's contract gave the caches it read and wrote (``uses``: the
    :class:`~ascend_emu.checked_mode.CacheUse` list of one call), by argument name (matched by
    memory with the replay's arrays ``copies``; a functional form's copy by the array it copies),
    and the names of the caches it read."""
    by_memory = {_memory(a): n for n, a in copies.items() if isinstance(a, np.ndarray)}
    layouts: dict[str, CacheLayout] = {}
    reads: list[str] = []
    for use in uses:
        for _name, cache, layout, *source in use.caches:
            if cache is None or layout is None:
                continue
            arg = by_memory.get(_memory(source[0] if source and source[0] is not None else cache))
            if arg is None or np.asarray(copies[arg]).nbytes != layout.nbytes:
                continue
            layouts.setdefault(arg, layout)
            if use.kind == "read" and arg not in reads:
                reads.append(arg)
    return layouts, tuple(reads)


def _kv_rmsnorm_written(args, kwargs) -> list[int]:
    from ..ops.kv_rmsnorm_rope_cache import written_slots

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate slots: the replay itself warned (and was silenced)
        return [int(s) for s in written_slots(*args, **kwargs) if s >= 0]


def _scatter_written(args, kwargs) -> list[int]:
    from .. import ops

    bound = _pyinspect.signature(ops.npu_scatter_pa_kv_cache).bind(*args, **kwargs)
    return [int(s) for s in np.asarray(bound.arguments["slot_mapping"]).reshape(-1) if s >= 0]  # -1: skipped


#: ``ascend_emu.ops`` function -> ``f(args, kwargs)``: the cache slots a call writes (for the
#: :attr:`OpInfo.functional` copies: their other rows are undefined on the device, unless
#: :attr:`OpInfo.clones`, where they only say which slots the op was expected to change).
_WRITTEN_SLOTS = {"npu_kv_rmsnorm_rope_cache": _kv_rmsnorm_written, "npu_scatter_pa_kv_cache": _scatter_written}


def _array(v):
    return v.array if isinstance(v, TensorValue) else v


def compare_call(call: Call, emu: EmuResult | None = None) -> CallReport:
    """Replay ``call`` (unless ``emu`` is given) and compare every output and in-place argument.

    Outputs that alias an in-place argument are compared once, as that argument. Caches are
    compared exactly, with mismatches in logical coordinates, each described by the
    :class:`~ascend_emu.layouts.CacheLayout` its op's contract gives it (:attr:`EmuResult.layouts`;
    the op's cache mode where the contract names none). A cache the op only read is listed (role
    ``read cache``) only when the emulator's copy after the call differs from the recorded input.
    """
    rep = CallReport(call.index, call.op, call.api, "identical")
    if call.error:
        rep.status, rep.reason = "device error", call.error
        return rep
    emu = replay(call) if emu is None else emu
    if emu.unavailable:
        rep.status, rep.reason = "not replayable", emu.unavailable
        return rep
    if emu.error:
        rep.status, rep.reason = "emu error", emu.error
        return rep
    info = OPS.get(call.op)
    mode = cache_mode_of(call)
    rep.not_compared = undefined_outputs(call)
    exact = info.exact if info else ()
    hif8_outputs = hifloat8_outputs(call)
    for name, dev in call.after.items():
        if dev is None:
            continue
        cache = _is_cache_name(name)
        rep.tensors.append(compare_tensor(name, emu.after.get(name), _array(dev),
                                          role="cache" if cache or name in exact else "output",
                                          cache_mode=emu.layouts.get(name, mode) if cache else None))
    named = call.named()
    for name, mine in emu.reads.items():  # a reader leaves its caches as they were: listed only if not
        before = _array(named.get(name))
        if name in call.after or not isinstance(before, np.ndarray) or (
                mine.dtype == before.dtype and mine.shape == before.shape
                and np.array_equal(np.ascontiguousarray(mine).view(np.uint8),
                                   np.ascontiguousarray(before).view(np.uint8))):
            continue
        t = compare_tensor(name, mine, before, role="cache", cache_mode=emu.layouts[name])
        t.role = "read cache"
        rep.tensors.append(t)
    out_names = info.outputs if info else ()
    for i, dev in enumerate(call.outputs):
        name = out_names[i] if i < len(out_names) else f"out[{i}]"
        mine = emu.outputs[i] if i < len(emu.outputs) else None
        if isinstance(dev, str) and dev.startswith("="):
            continue  # the in-place argument itself, compared above
        if isinstance(mine, str) and mine.startswith("="):
            mine = emu.after.get(mine[1:])
        if dev is None and mine is None:
            continue
        if name in rep.not_compared:
            continue
        if not isinstance(dev, TensorValue) and not isinstance(mine, TensorValue) and dev is not None:
            same = dev == mine
            rep.tensors.append(TensorComparison(name, "output", type(dev).__name__, [],
                                                "identical" if same else "fail", "equal values",
                                                note=None if same else f"device {dev!r}, emulator {mine!r}"))
            continue
        if info is not None and info.clones and name in info.functional:  # a clone the op wrote: all defined
            cache = _is_cache_name(name)
            rep.tensors.append(compare_tensor(name, _array(mine), _array(dev), role="cache",
                                              cache_mode=emu.layouts.get(name, mode) if cache else None,
                                              expect_slots=emu.written.get(name) if cache else None))
            continue
        written = emu.written[name] if name in emu.written else _written_slots(call, name)
        if written is not None:  # a new cache copy: only the written rows are defined on the device
            rep.tensors.append(compare_tensor(name, _array(mine), _array(dev), role="cache",
                                              cache_mode=emu.layouts.get(name, mode), expect_slots=written,
                                              judge_expected_only=True))
            continue
        mine, dev = _array(mine), _array(dev)
        hif8 = name in hif8_outputs and all(isinstance(a, np.ndarray) and a.dtype == np.uint8 for a in (mine, dev))
        rep.tensors.append(compare_tensor(name, mine, dev, role="output", element="hifloat8" if hif8 else None))
    order = {"identical": 0, "pass": 1, "fail": 2, "missing": 2}
    worst = max((order[t.status] for t in rep.tensors), default=0)
    rep.status = ("identical", "pass", "fail")[worst]
    return rep


def undefined_outputs(call: Call) -> dict[str, str]:
    """Outputs of ``call`` that the device returns without defining them (name -> why), from
    :attr:`OpInfo.undefined_unless`: they are not compared."""
    info = OPS.get(call.op)
    if info is None or info.undefined_unless is None:
        return {}
    flag, default, names = info.undefined_unless
    value = call.named().get(flag, default)
    value = default if value is None else value
    if not isinstance(value, (bool, int)) or value:
        return {}
    why = (f"{flag}={value!r}: {call.op} returns it uninitialised on the device (undefined content): "
           "not compared")
    return {n: why for n in names}


def _is_cache_name(name: str) -> bool:
    return "cache" in name


def _written_slots(call: Call, output: str):
    """The slots a functional ``npu_mla_preprocess`` wrote into its returned cache copies (the rest
    of those copies is uninitialised on the device), else None."""
    if call.op != "npu_mla_preprocess" or output not in ("kv_cache_out0", "kv_cache_out1"):
        return None
    sm = call.named().get("slotmapping")
    if not isinstance(sm, TensorValue) or sm.array is None:
        return None
    return [int(s) for s in np.asarray(sm.array).reshape(-1) if s >= 0]
