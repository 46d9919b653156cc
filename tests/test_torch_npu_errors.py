"""The drop-in's errors are ascend_emu's on every route into an op (``torch_npu.<op>``, its eager
fast path, ``torch.ops.<ns>.<op>`` and, for tensor layouts, ``torch.ops.<ns>.<op>.<overload>``):
they name the argument, state the expectation, summarise the value in one short line and never
print a tensor, where torch would answer with its dispatcher page ("Could not run ... with
arguments from the 'SparseCPU' backend", ~6 KB) or its overload-resolution failure (every schema
and the value printed).

Covers tensors that are not one strided block (sparse COO / CSR, mkldnn, nested, quantized),
arguments of the wrong kind for the overloaded ops (``npu_format_cast``, ``npu_format_cast_``,
``atb.npu_mla_preprocess``) and calls that do not fit a schema (unknown keyword, missing or
doubled argument, too many positional arguments).
"""

from __future__ import annotations

import re
import warnings

import pytest

torch = pytest.importorskip("torch")

import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.errors import (ArgumentError, AscendEmuError, DTypeError, FormatError,  # noqa: E402
                               ModeError)
from ascend_emu.torch_npu import _convert, _registry  # noqa: E402
from ascend_emu.torch_npu.schemas import SCHEMAS  # noqa: E402

#: The longest message a drop-in argument error may have.
MAX_CHARS = 500

BF16 = torch.bfloat16


def assert_short(exc: BaseException, name: str) -> str:
    """``exc`` is an ascend_emu error naming ``name`` first, one short line, no tensor repr."""
    msg = str(exc)
    assert isinstance(exc, AscendEmuError) and isinstance(exc, (TypeError, ValueError)), (type(exc), msg[:300])
    assert msg.startswith(f"{name}: expected "), msg[:300]
    assert len(msg) < MAX_CHARS and "\n" not in msg and not re.search(r"\btensor\(", msg), msg[:600]
    return msg


def _indexer_args():
    q = torch.zeros(1, 1, 64, 128, dtype=BF16)
    key = torch.zeros(1, 4, 1, 128, dtype=BF16)
    w = torch.zeros(1, 1, 64, dtype=BF16)
    return q, key, w


def _non_strided(kind: str, dense: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():  # beta / prototype / deprecation notices of these layouts
        warnings.simplefilter("ignore")
        f32 = dense.float()
        if kind == "sparse_coo":
            return f32.to_sparse()
        if kind == "sparse_csr":
            return f32.reshape(-1, f32.shape[-1]).to_sparse_csr()
        if kind == "mkldnn":
            return f32.to_mkldnn()
        if kind == "nested":
            return torch.nested.nested_tensor([f32[0, 0], f32[0, 0, :1]])
        if kind == "jagged":
            return torch.nested.nested_tensor([f32[0, 0], f32[0, 0, :1]], layout=torch.jagged)
        if kind == "quantized":
            return torch.quantize_per_tensor(f32, 0.5, 0, torch.qint8)
    raise AssertionError(kind)


#: kind -> (error class, text naming what was given)
NON_STRIDED = {
    "sparse_coo": (FormatError, "layout torch.sparse_coo"),
    "sparse_csr": (FormatError, "layout torch.sparse_csr"),
    "mkldnn": (FormatError, "layout torch._mkldnn"),
    "nested": (FormatError, "nested tensor"),
    "jagged": (FormatError, "nested tensor (torch.jagged)"),
    "quantized": (DTypeError, "quantized qint8"),
}

ROUTES = {
    "torch_npu": lambda *a, **k: torch_npu.npu_lightning_indexer(*a, **k),
    "torch.ops": lambda *a, **k: torch.ops.npu.npu_lightning_indexer(*a, **k),
    "overload": lambda *a, **k: torch.ops.npu.npu_lightning_indexer.default(*a, **k),
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("kind", NON_STRIDED)
def test_non_strided_tensor_is_named_with_its_layout(kind, route, request):
    if kind == "jagged" and route == "overload":  # known gap, kept visible: it fails until it is closed
        request.node.add_marker(pytest.mark.xfail(
            strict=True, reason="a jagged tensor's own __torch_dispatch__ answers an OpOverload call before any check"))
    q, key, w = _indexer_args()
    bad = _non_strided(kind, key)
    error, given = NON_STRIDED[kind]
    with pytest.raises(error) as exc:
        ROUTES[route](q, bad, w, sparse_count=4)
    msg = assert_short(exc.value, "key")
    assert given in msg, msg
    if error is FormatError:
        assert "a strided tensor" in msg, msg


def test_sparse_index_leaves_the_caches_untouched():
    kv = torch.zeros(2, 1, 1, 576, dtype=BF16)
    gamma, cs = torch.ones(512, dtype=BF16), torch.zeros(2, 1, 1, 64, dtype=BF16)
    k_cache, ckv_cache = torch.full((2, 16, 1, 64), 3.0, dtype=BF16), torch.full((2, 16, 1, 512), 3.0, dtype=BF16)
    index = torch.tensor([1, 2]).to_sparse()
    for fn in (torch_npu.npu_kv_rmsnorm_rope_cache_v2, torch.ops.npu.npu_kv_rmsnorm_rope_cache_v2):
        with pytest.raises(FormatError) as exc:
            fn(kv, gamma, cs, cs, index, k_cache, ckv_cache, cache_mode="PA_BNSD")
        assert "[2] int64 tensor of layout torch.sparse_coo" in assert_short(exc.value, "index")
    assert (k_cache == 3).all() and (ckv_cache == 3).all() and k_cache._version == 0


def _required_call(spec):
    """A call of ``spec``'s overload with only its required arguments: tensors ``zeros(2)``,
    scalars a value of their kind; returns (positional, keyword, names of the tensor slots)."""
    binding = _registry._BINDINGS[f"{spec.namespace}::{spec.qualified}"]
    values = {"Tensor": torch.zeros(2), "int": 2, "float": 1.0, "str": "PA", "bool": False}
    args, kwargs, tensors = [], {}, []
    for i, (name, kind, _) in enumerate(binding.table):
        if binding.defaults[name] is not None or name not in binding.by_keyword[0]:
            continue
        value = values[kind]
        (args.append(value) if i < binding.positional else kwargs.__setitem__(name, value))
        if kind == "Tensor":
            tensors.append(name)
    return args, kwargs, tensors, binding


@pytest.mark.parametrize("spec", SCHEMAS, ids=lambda s: f"{s.namespace}.{s.qualified}")
def test_every_overload_rejects_a_sparse_tensor_before_anything_else(spec):
    """The layout check runs for every registered overload, whatever the other arguments (here
    all invalid but the sparse one comes last): called through its OpOverload, and, where the
    call picks that overload, through torch.ops and torch_npu."""
    args, kwargs, tensors, binding = _required_call(spec)
    last = tensors[-1]
    sparse = torch.zeros(2).to_sparse()
    if last in kwargs:
        kwargs[last] = sparse
    else:
        args[binding.names.index(last)] = sparse
    packet = getattr(getattr(torch.ops, spec.namespace), spec.name)
    overload = getattr(packet, spec.qualified.split(".")[1] if "." in spec.qualified else "default")
    public = getattr(torch_npu.atb if spec.namespace == "atb" else torch_npu, spec.name)
    for call in (overload, packet, public):
        with pytest.raises(FormatError) as exc:
            call(*args, **kwargs)
        assert "layout torch.sparse_coo" in assert_short(exc.value, last)


def test_to_numpy_rejects_non_strided_tensors():
    """The conversion step itself (``call_op`` and the ops reach tensors through it)."""
    key = _indexer_args()[1]
    for kind, (error, given) in NON_STRIDED.items():
        with pytest.raises(error) as exc:
            _convert.to_numpy(_non_strided(kind, key), "key")
        assert given in assert_short(exc.value, "key")


BIG = torch.zeros(300, 300)  # 90,000 values: torch's repr spans lines; never in a message

#: (call, error, argument named, text in the message): wrong kinds for the overloaded ops.
OVERLOADED = {
    "cast self str": (lambda f: f.npu_format_cast("x", 29), DTypeError, "self", "got 'x'"),
    "cast self list": (lambda f: f.npu_format_cast([BIG, BIG, BIG], 29), DTypeError, "self",
                       "got a list of 3: [a [300, 300] float32 tensor"),
    "cast format list": (lambda f: f.npu_format_cast(BIG, [29]), ModeError, "acl_format", "got [29]"),
    "cast format str": (lambda f: f.npu_format_cast(BIG, "29"), ModeError, "acl_format", "got '29'"),
    "cast dst kind": (lambda f: f.npu_format_cast(BIG, BIG, customize_dtype="a"), DTypeError, "customize_dtype",
                      "a Python int or None, got 'a'"),
    "cast_ src tensor kwarg": (lambda f: f.npu_format_cast_(BIG, BIG, input_dtype=[BIG]), DTypeError,
                               "input_dtype", "a list of 1: [a [300, 300] float32 tensor"),
    "preprocess str": (lambda f: f.atb.npu_mla_preprocess(BIG, "x"), DTypeError, "gamma0", "got 'x'"),
    "preprocess list": (lambda f: f.atb.npu_mla_preprocess(*[BIG] * 16, cache_mode=[BIG]), ModeError, "cache_mode",
                        "a str or None, got a list of 1"),
    "preprocess tensor for str": (lambda f: f.atb.npu_mla_preprocess(*[BIG] * 16, quant_mode=BIG), ModeError,
                                  "quant_mode", "got a [300, 300] float32 tensor"),
    "preprocess out list": (lambda f: f.atb.npu_mla_preprocess(*[BIG] * 16, q_out0=[BIG], kv_cache_out0=BIG,
                                                               q_out1=BIG, kv_cache_out1=BIG), DTypeError, "q_out0",
                            "a torch.Tensor, got a list of 1"),
}


class _Ops:
    """``torch.ops.npu`` with ``atb`` as an attribute, so a call written for torch_npu runs on
    the registered packets."""

    def __getattr__(self, name):
        return torch.ops.atb if name == "atb" else getattr(torch.ops.npu, name)


@pytest.mark.parametrize("route", ["torch_npu", "torch.ops"])
@pytest.mark.parametrize("case", OVERLOADED)
def test_overloaded_ops_name_the_argument_of_the_wrong_kind(case, route):
    call, error, name, text = OVERLOADED[case]
    with pytest.raises(error) as exc:
        call(torch_npu if route == "torch_npu" else _Ops())
    assert text in assert_short(exc.value, name)


#: (call, argument named, text): calls that fit no schema.
UNFIT = {
    "unknown keyword": (lambda f: f.npu_lightning_indexer(*_indexer_args(), sparse_cunt=3), "sparse_cunt",
                        "unknown keyword"),
    "missing": (lambda f: f.npu_lightning_indexer(*_indexer_args()[:2]), "weights", "required by"),
    "twice": (lambda f: f.npu_lightning_indexer(*_indexer_args(), key=BIG), "key", "by position and by keyword"),
    "preprocess missing": (lambda f: f.atb.npu_mla_preprocess(BIG, BIG, BIG), "wdqkv", "required by"),
    "preprocess incomplete out=": (lambda f: f.atb.npu_mla_preprocess(*[BIG] * 16, q_out0=BIG), "kv_cache_out0",
                                   "required by"),
    "cast unknown keyword": (lambda f: f.npu_format_cast(BIG, 29, format=2), "format", "unknown keyword"),
}


@pytest.mark.parametrize("route", ["torch_npu", "torch.ops"])
@pytest.mark.parametrize("case", UNFIT)
def test_calls_fitting_no_schema_name_the_argument(case, route):
    call, name, text = UNFIT[case]
    with pytest.raises(ArgumentError) as exc:
        call(torch_npu if route == "torch_npu" else _Ops())
    assert text in assert_short(exc.value, name)


@pytest.mark.parametrize("route", ["torch_npu", "torch.ops"])
def test_too_many_positional_arguments(route):
    ops = torch_npu if route == "torch_npu" else _Ops()
    with pytest.raises(ArgumentError, match=r"npu_mla_preprocess: takes at most 16 positional arguments, got 30"):
        ops.atb.npu_mla_preprocess(*[BIG] * 30)


def test_packets_are_the_registered_objects_and_keep_working():
    """The checked packets are torch's own packet objects (same identity, overloads, fake
    kernels); a valid call runs, and an error raised inside a kernel passes unchanged."""
    packet = torch.ops.npu.npu_format_cast
    assert isinstance(packet, torch._ops.OpOverloadPacket) and torch_npu.npu_format_cast.op is packet
    assert sorted(packet.overloads()) == ["Tensor", "default"]
    out = packet(torch.zeros(16, 16), 29)
    assert torch_npu.get_npu_format(out) == 29
    meta = packet(torch.zeros(16, 16, device="meta"), 29)
    assert meta.device.type == "meta" and meta.shape == (16, 16)
    with pytest.raises(ModeError, match="acl_format: expected the int 29") as exc:
        packet(torch.zeros(4), 7)  # the kernel's own rejection
    assert exc.value.__context__ is None


# ------------------------------------------------------------------ _functional: validate first
def _count_clones(monkeypatch) -> list:
    """Record every ``Tensor.clone`` call from here on (the caches' copies are clones)."""
    calls = []
    clone = torch.Tensor.clone

    def counting(self, *args, **kwargs):
        calls.append(tuple(self.shape))
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", counting)
    return calls


def _kv_call():
    kv = torch.randn(2, 1, 3, 576, generator=torch.Generator().manual_seed(5)).to(BF16)
    gamma, angle = torch.ones(512, dtype=BF16), torch.linspace(0, 3, 2 * 3 * 64).reshape(2, 1, 3, 64)
    index = torch.tensor([5, 17, 2, 30, 9, 21])
    caches = (torch.full((2, 16, 1, 64), 7.0, dtype=BF16), torch.full((2, 16, 1, 512), 7.0, dtype=BF16))
    return [kv, gamma, angle.cos().to(BF16), angle.sin().to(BF16), index, *caches]


@pytest.mark.parametrize("route", ["torch_npu", "torch.ops"])
def test_rejected_kv_functional_call_copies_nothing_and_raises_the_in_place_error(monkeypatch, route):
    from ascend_emu.errors import IndexRangeError

    ns = torch_npu if route == "torch_npu" else torch.ops.npu
    args = _kv_call()
    args[4] = torch.tensor([5, 17, 2, 30, 9, 4096])  # a slot past the 32-slot caches
    with pytest.raises(IndexRangeError) as in_place:
        ns.npu_kv_rmsnorm_rope_cache_v2(*args, cache_mode="PA_BNSD")
    clones = _count_clones(monkeypatch)
    with pytest.raises(IndexRangeError) as functional:
        ns.npu_kv_rmsnorm_rope_cache_v2_functional(*args, cache_mode="PA_BNSD")
    assert clones == []  # validated before any copy
    assert str(functional.value) == str(in_place.value)
    assert (args[5] == 7).all() and (args[6] == 7).all()
    # a valid call copies each cache once, after the checks, and writes only the copies
    args = _kv_call()
    k_rope, c_kv, k_out, ckv_out = ns.npu_kv_rmsnorm_rope_cache_v2_functional(*args, cache_mode="PA_BNSD")
    assert sorted(clones) == [(2, 16, 1, 64), (2, 16, 1, 512)]
    assert (args[5] == 7).all() and (args[6] == 7).all() and (k_out != 7).any()
    # the copy hook is gone after the call: the in-place op writes the caller's caches again
    ns.npu_kv_rmsnorm_rope_cache_v2(*args, cache_mode="PA_BNSD")
    assert torch.equal(args[5].view(torch.int16), k_out.view(torch.int16))
    assert torch.equal(args[6].view(torch.int16), ckv_out.view(torch.int16))


def test_rejected_prolog_v3_functional_call_copies_nothing_and_raises_the_in_place_error(monkeypatch):
    from ascend_emu.errors import IndexRangeError

    gen = torch.Generator().manual_seed(11)

    def bf(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(BF16)

    w = [torch_npu.npu_format_cast(bf(*s, scale=s[0] ** -0.5), 29) for s in ((7168, 1536), (1536, 192))]
    args = (bf(2, 7168), w[0], w[1], bf(1, 128, 512, scale=0.1),
            torch_npu.npu_format_cast(bf(7168, 576, scale=7168 ** -0.5), 29), bf(1536) + 1, bf(512) + 1, bf(2, 64),
            bf(2, 64))
    kv, kr = torch.full((2, 16, 1, 512), 7.0, dtype=BF16), torch.full((2, 16, 1, 64), 7.0, dtype=BF16)
    bad = torch.tensor([3, 32])  # row 32 is past the 32-row caches
    with pytest.raises(IndexRangeError) as in_place:
        torch_npu.npu_mla_prolog_v3(*args, kv, kr, cache_index=bad)
    clones = _count_clones(monkeypatch)
    for fn in (torch_npu.npu_mla_prolog_v3_functional, torch.ops.npu.npu_mla_prolog_v3_functional):
        with pytest.raises(IndexRangeError) as functional:
            fn(*args, kv, kr, cache_index=bad)
        assert clones == [] and str(functional.value) == str(in_place.value)
    assert (kv == 7).all() and (kr == 7).all()
    outs = torch_npu.npu_mla_prolog_v3_functional(*args, kv, kr, cache_index=torch.tensor([3, 20]))
    assert sorted(clones) == [(2, 16, 1, 64), (2, 16, 1, 512)]
    assert (kv == 7).all() and (outs[5][1, 4] != 7).any() and (outs[5][0, 0] == 7).all()


# ------------------------------------------------------------------ RuntimeError, as torch_npu
def test_drop_in_rejections_are_runtime_errors_and_keep_their_class():
    """torch_npu rejects with a RuntimeError: the drop-in's error is one, and still the
    ascend_emu class (a ValueError handler keeps working); the NumPy API's stays as it was."""
    import pickle
    import unittest

    import numpy as np

    from ascend_emu import ops
    from ascend_emu.errors import ModeError, runtime_error_class

    calls = (lambda: torch_npu.npu_format_cast(torch.zeros(4, 4), 7),       # eager fast path
             lambda: torch.ops.npu.npu_format_cast(torch.zeros(4, 4), 7),   # the dispatcher
             lambda: torch_npu.npu_format_cast(torch.zeros(4, 4), "29"))    # the argument-kind check
    for call in calls:
        with pytest.raises(AscendEmuError) as exc:
            call()
        assert isinstance(exc.value, RuntimeError) and isinstance(exc.value, (ValueError, TypeError))
        assert type(exc.value) is runtime_error_class(type(exc.value).__mro__[1])
        assert exc.value.__context__ is None
        again = pickle.loads(pickle.dumps(exc.value))
        assert type(again) is type(exc.value) and again.args == exc.value.args
    case = unittest.TestCase()
    with case.assertRaisesRegex(RuntimeError, "acl_format: expected"):
        calls[0]()
    with pytest.raises(ModeError) as exc:
        ops.npu_format_cast(np.zeros((4, 4), np.float32), 7)
    assert not isinstance(exc.value, RuntimeError)
