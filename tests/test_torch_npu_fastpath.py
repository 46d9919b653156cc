"""The per-op tables the drop-in precomputes (argument kinds, schema defaults, accepted names)
give the same binding and the same errors as reading the schema on every call."""

import pytest

torch = pytest.importorskip("torch")

import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.errors import DTypeError, ModeError  # noqa: E402
from ascend_emu.torch_npu import _registry  # noqa: E402
from ascend_emu.torch_npu.schemas import SCHEMAS  # noqa: E402


def _schema(spec):
    return torch._C.parse_schema(f"{spec.namespace}::{spec.schema}")


@pytest.mark.parametrize("spec", SCHEMAS, ids=lambda s: s.qualified)
def test_bind_with_precomputed_defaults_matches_schema(spec):
    schema = _schema(spec)
    names = tuple(a.name for a in schema.arguments)
    args = tuple(object() for _ in names[:2])
    kwargs = {names[-1]: "kw"} if len(names) > 2 else {}
    expected = _registry._bind(schema, args, kwargs)
    got = _registry._bind(schema, args, kwargs, _registry._defaults(schema), names)
    assert got == expected
    assert list(got) == list(names)  # every schema argument, in schema order
    assert got[names[0]] is args[0]


@pytest.mark.parametrize("spec", SCHEMAS, ids=lambda s: s.qualified)
def test_kind_table_follows_schema_types(spec):
    schema = _schema(spec)
    table = _registry._kind_table(schema)
    assert [row[0] for row in table] == [a.name for a in schema.arguments]
    for (_, kind, optional), arg in zip(table, schema.arguments, strict=True):
        assert str(arg.type) == (f"Optional[{kind}]" if optional else kind)


def test_kind_errors_name_the_argument_positional_and_keyword():
    fn = torch_npu.npu_kv_rmsnorm_rope_cache
    kv = torch.zeros(1, 1, 1, 576, dtype=torch.bfloat16)
    with pytest.raises(DTypeError, match="kv: expected a torch.Tensor"):
        fn([1.0], kv, kv, kv, kv, kv, kv)
    with pytest.raises(DTypeError, match="epsilon: expected a Python float"):
        fn(kv, kv, kv, kv, kv, kv, kv, epsilon="x")
    with pytest.raises(ModeError, match="cache_mode: expected a str"):
        fn(kv, kv, kv, kv, kv, kv, kv, cache_mode=3)
    with pytest.raises(TypeError, match="takes at most"):
        fn(*([kv] * 40))


def test_accepted_names_are_the_ops_signature():
    import inspect

    from ascend_emu.torch_npu._convert import resolve_op

    fn = resolve_op("npu_kv_rmsnorm_rope_cache")
    assert _registry._accepted(fn) == frozenset(inspect.signature(fn).parameters)
    assert _registry._accepted(fn) is _registry._accepted(fn)  # read once per op


# ---------------------------------------------------------------------- the eager fast path
_CASES = None


def _calls():
    """Every warm-up scenario (:mod:`ascend_emu.warmup`) of a ``torch_npu`` op: each op, each dtype /
    mode family (the V4 ops, registered under ``torch.ops._C_ascend`` / ``custom`` only, are left out)."""
    global _CASES
    if _CASES is None:
        import numpy as np

        from ascend_emu import warmup

        rng = np.random.default_rng(7)
        _CASES = [call for family in warmup.CALLS for call in family(rng) if call.drop_in_op() is not None]
    return _CASES


def _spy(monkeypatch, op_name):
    """Counts the calls that take the eager path of ``torch_npu.<op_name>`` (the dispatcher's
    kernel holds the unpatched body)."""
    seen = []
    for key, binding in _registry._BINDINGS.items():
        if key.split("::")[1].split(".")[0] == op_name:
            body = binding.body

            def counting(params, body=body):
                seen.append(1)
                return body(params)

            monkeypatch.setattr(binding, "body", counting)
    return seen


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _state(t):
    """What a caller can observe of a tensor: dtype, shape, bytes, NPU mark, storage format."""
    from ascend_emu.torch_npu.npu import is_on_npu

    raw = t.detach().contiguous().view(torch.uint8) if t.numel() else t
    return t.dtype, tuple(t.shape), raw.clone(), bool(is_on_npu(t)), torch_npu.get_npu_format(t)


def _assert_same(a, b):
    da, sa, ra, na, fa = _state(a)
    db, sb, rb, nb, fb = _state(b)
    assert (da, sa, na, fa) == (db, sb, nb, fb)
    assert torch.equal(ra, rb)


def _variants(call, p):
    """``(label, partial)`` for every overload the scenario ``call`` can reach through the drop-in,
    on the inputs of ``p`` (one :meth:`~ascend_emu.warmup.Call.through_drop_in` copy)."""
    from functools import partial

    args, kw = p.args, p.keywords
    if call.op == "npu_kv_rmsnorm_rope_cache":
        return [(name, partial(getattr(torch_npu, name), *args, **kw)) for name in
                ("npu_kv_rmsnorm_rope_cache", "npu_kv_rmsnorm_rope_cache_v2",
                 "npu_kv_rmsnorm_rope_cache_v2_functional")]
    if call.op == "npu_mla_prolog_v3":
        out = [("v3", p), ("v3_functional", partial(torch_npu.npu_mla_prolog_v3_functional, *args, **kw))]
        if kw["weight_quant_mode"] == 0:  # v1 / v2 take the non-quant scenario's inputs as they are
            old = (*args[:9], kw["cache_index"], args[9], args[10])
            out += [(name, partial(getattr(torch_npu, name), *old, cache_mode=kw["cache_mode"]))
                    for name in ("npu_mla_prolog", "npu_mla_prolog_v2")]
        return out
    if call.op == "npu_mla_preprocess":
        q0, _, q1, _ = p()  # a throw-away call on this copy gives the out= shapes and dtypes
        outs = dict(q_out0=torch.zeros_like(q0), kv_cache_out0=args[13], q_out1=torch.zeros_like(q1),
                    kv_cache_out1=args[14])
        return [("default", partial(p.func, *args, **kw)), ("out", partial(p.func, *args, **kw, **outs))]
    if call.op == "npu_format_cast":
        w, fmt = args
        dst = torch_npu.npu_format_cast(torch.zeros(32, 64, dtype=w.dtype), 29)
        return [("int", p), ("Tensor", partial(p.func, w, dst)), ("in place", partial(torch_npu.npu_format_cast_, w, fmt)),
                ("in place Tensor", partial(torch_npu.npu_format_cast_, w.clone(), dst)),
                ("get_npu_format", partial(torch_npu.get_npu_format, dst))]
    return [("", p)]


def _cases():
    out = []
    for index, call in enumerate(_calls()):
        out += [(index, label) for label, _ in _variants(call, call.through_drop_in())]
    return out


@pytest.mark.parametrize("index, label", _cases(), ids=lambda v: str(v))
def test_fast_path_is_taken_and_matches_the_dispatcher(monkeypatch, index, label):
    call = _calls()[index]
    fast = dict(_variants(call, call.through_drop_in()))[label]
    slow = dict(_variants(call, call.through_drop_in()))[label]  # an independent copy of the inputs
    seen = _spy(monkeypatch, fast.func.__name__)
    got = fast()
    assert seen == [1], call.name
    want = fast.func.op(*slow.args, **slow.keywords)  # torch.ops.<ns>.<op>: the dispatcher
    assert seen == [1]
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want)
    fast_in = [*fast.args, *fast.keywords.values()]
    slow_in = [*slow.args, *slow.keywords.values()]
    for g, w in zip(got, want, strict=True):
        if isinstance(g, int):
            assert g == w
            continue
        _assert_same(g, w)
        # an output that is a caller's tensor is the same caller's tensor on both paths
        assert [g is x for x in fast_in] == [w is x for x in slow_in]
    for x, y in zip(fast_in, slow_in, strict=True):  # caches written alike, version counters bumped alike
        if isinstance(x, torch.Tensor):
            _assert_same(x, y)
            assert x._version == y._version


def _kv(rng_seed=3, requires_grad=False):
    import numpy as np

    from ascend_emu.torch_npu._convert import to_torch

    rng = np.random.default_rng(rng_seed)

    def bf(*shape):
        return to_torch(rng.standard_normal(shape, dtype=np.float32)).to(torch.bfloat16)

    args = [bf(2, 1, 1, 576), bf(512), bf(2, 1, 1, 64), bf(2, 1, 1, 64), torch.tensor([5, 40]),
            torch.zeros(4, 16, 1, 64, dtype=torch.bfloat16), torch.zeros(4, 16, 1, 512, dtype=torch.bfloat16)]
    if requires_grad:
        args[0].requires_grad_(True)
    return args


def test_in_place_writes_bump_version_counters(monkeypatch):
    seen = _spy(monkeypatch, "npu_kv_rmsnorm_rope_cache_v2")
    args = _kv()
    k_cache, ckv_cache = args[5], args[6]
    before = (k_cache._version, ckv_cache._version, args[0]._version)
    torch_npu.npu_kv_rmsnorm_rope_cache_v2(*args, cache_mode="PA_NZ")
    assert seen == [1]
    assert k_cache._version > before[0] and ckv_cache._version > before[1]
    assert args[0]._version == before[2]  # read-only inputs keep theirs
    # autograd sees the write: a graph that saved the cache refuses to backpropagate through it
    w = torch.ones(4, 16, 1, 64, requires_grad=True)
    loss = (w * k_cache).sum()  # saves k_cache for the gradient of w
    torch_npu.npu_kv_rmsnorm_rope_cache_v2(*args, cache_mode="PA_NZ")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_functional_variant_leaves_caller_versions(monkeypatch):
    args = _kv()
    before = [a._version for a in args]
    torch_npu.npu_kv_rmsnorm_rope_cache_v2_functional(*args, cache_mode="PA_NZ")
    assert [a._version for a in args] == before


def test_fast_path_not_taken_when_an_input_requires_grad(monkeypatch):
    seen = _spy(monkeypatch, "npu_kv_rmsnorm_rope_cache_v2")
    out = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*_kv(requires_grad=True), cache_mode="PA_NZ")
    assert seen == [] and not any(o.requires_grad for o in out)
    with torch.no_grad():  # grad mode off: a tensor requiring grad is just a tensor
        torch_npu.npu_kv_rmsnorm_rope_cache_v2(*_kv(requires_grad=True), cache_mode="PA_NZ")
    assert seen == [1]


def test_fast_path_taken_for_parameters_and_in_inference_mode(monkeypatch):
    seen = _spy(monkeypatch, "npu_kv_rmsnorm_rope_cache_v2")
    args = _kv()
    args[1] = torch.nn.Parameter(args[1], requires_grad=False)
    torch_npu.npu_kv_rmsnorm_rope_cache_v2(*args, cache_mode="PA_NZ")
    with torch.inference_mode():
        torch_npu.npu_kv_rmsnorm_rope_cache_v2(*_kv(), cache_mode="PA_NZ")
    assert seen == [1, 1]


def test_fast_path_not_taken_under_modes(monkeypatch):
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops_seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    seen = _spy(monkeypatch, "npu_kv_rmsnorm_rope_cache_v2")
    ops_seen = []
    plain = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*_kv(), cache_mode="PA_NZ")
    assert seen == [1]
    with Dispatch():
        under_mode = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*_kv(), cache_mode="PA_NZ")
    assert "npu.npu_kv_rmsnorm_rope_cache_v2.default" in ops_seen  # the mode saw the op
    with Function():
        torch_npu.npu_kv_rmsnorm_rope_cache_v2(*_kv(), cache_mode="PA_NZ")
    assert seen == [1]
    for a, b in zip(plain, under_mode, strict=True):
        _assert_same(a, b)


def test_fast_path_not_taken_for_fake_or_meta_tensors(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen = _spy(monkeypatch, "npu_kv_rmsnorm_rope_cache_v2")
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in _kv()]
        out = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*fake, cache_mode="PA_NZ")
    assert [tuple(o.shape) for o in out] == [(2, 1, 1, 64), (2, 1, 1, 512)]
    meta = [t.to("meta") for t in _kv()]
    out = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*meta, cache_mode="PA_NZ")
    assert out[0].device.type == "meta"
    assert seen == []


def test_fast_path_not_taken_when_compiled(monkeypatch):
    seen = _spy(monkeypatch, "npu_kv_rmsnorm_rope_cache_v2_functional")

    def step(*args):
        k_rope, c_kv, kc, ckvc = torch_npu.npu_kv_rmsnorm_rope_cache_v2_functional(*args, cache_mode="PA_NZ")
        return k_rope * 2, c_kv, kc, ckvc

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(*_kv())
    assert seen == []  # traced and run through torch.ops
    want = step(*_kv())
    assert seen == [1]
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_errors_and_rejections_match_the_dispatcher(monkeypatch):
    from ascend_emu.errors import ArgumentError, IndexRangeError

    fn = torch_npu.npu_kv_rmsnorm_rope_cache_v2
    messages = []
    for call in (fn, fn.op):
        args = _kv()
        args[4] = torch.tensor([5, 4096])  # slot out of range
        caches = (args[5].clone(), args[6].clone())
        with pytest.raises(IndexRangeError) as exc:
            call(*args, cache_mode="PA_NZ")
        messages.append(str(exc.value))
        assert torch.equal(args[5], caches[0]) and torch.equal(args[6], caches[1])  # untouched
        assert args[5]._version == 0  # no write, no bump
    assert messages[0] == messages[1]
    with pytest.raises(ModeError, match="k_cache_dtype"):
        fn(*_kv(), cache_mode="PA_NZ", k_cache_dtype=1)
    with pytest.raises(DTypeError, match="epsilon"):  # a kind the schema refuses: the kind check's error
        fn(*_kv(), cache_mode="PA_NZ", epsilon="1e-5")
    with pytest.raises(ArgumentError, match="takes at most 7 positional arguments"):  # the schema's count
        fn(*_kv(), torch.zeros(1))


def test_scalars_reach_the_kernel_as_the_dispatcher_passes_them(monkeypatch):
    binding = _registry._BINDINGS["npu::npu_kv_rmsnorm_rope_cache_v2"]
    params = binding.bind_eager(tuple(_kv()), {"epsilon": 1, "cache_mode": "PA_NZ"}, True)
    assert type(params["epsilon"]) is float and params["epsilon"] == 1.0
    assert params["is_output_kv"] is False and params["k_rope_scale"] is None  # schema defaults
    assert binding.bind_eager(tuple(_kv()), {"epsilon": True}, True) is None  # bool is not a float
    assert binding.bind_eager(tuple(_kv()), {"bogus": 1}, True) is None  # unknown keyword
    assert binding.bind_eager(tuple(_kv()[:5]), {}, True) is None  # a required argument missing
    assert binding.bind_eager(tuple(_kv()), {"kv": None}, True) is None  # given twice
    args = _kv()
    got = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*args, epsilon=1, cache_mode="PA_NZ")
    want = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*_kv(), epsilon=1.0, cache_mode="PA_NZ")
    for a, b in zip(got, want, strict=True):
        _assert_same(a, b)


def test_eager_allowed_reads_the_modes():
    from torch.overrides import TorchFunctionMode

    assert _registry.eager_allowed()
    with TorchFunctionMode():
        assert not _registry.eager_allowed()
    with torch.device("meta"):
        assert not _registry.eager_allowed()
    assert _registry.eager_allowed()


# ---------------------------------------------------------------------- NumPy views reused
def test_numpy_view_is_reused_while_the_tensor_is_unchanged():
    from ascend_emu.torch_npu._convert import to_numpy

    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    a = to_numpy(t)
    assert to_numpy(t) is a
    t[1, 2] = -1.0  # values are shared memory: no new view needed
    assert to_numpy(t) is a and a[1, 2] == -1.0
    b16 = t.to(torch.bfloat16)
    assert to_numpy(b16) is to_numpy(b16)


@pytest.mark.parametrize("change", ["unsqueeze_", "transpose_", "as_strided_", "set_", "data"])
def test_numpy_view_follows_in_place_metadata_changes(change):
    from ascend_emu.torch_npu._convert import to_numpy

    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    old = to_numpy(t)
    if change == "unsqueeze_":
        t.unsqueeze_(0)
    elif change == "transpose_":
        t.transpose_(0, 1)
    elif change == "as_strided_":
        t.as_strided_((3, 4), (1, 3), 2)
    elif change == "set_":
        t.set_(torch.full((3, 5), 7.0))
    else:
        t.data = torch.full((2, 2), 3.0, dtype=torch.float64)
    new = to_numpy(t)
    assert new is not old
    assert new.shape == tuple(t.shape) and new.dtype == t.numpy().dtype
    assert new.__array_interface__["data"][0] == t.data_ptr()
    assert new.strides == tuple(s * t.element_size() for s in t.stride())
    assert torch.equal(torch.from_numpy(new.copy()), t)


def test_numpy_view_entry_leaves_with_the_tensor_without_a_cycle():
    import gc
    import weakref

    from ascend_emu.torch_npu import _convert

    t = torch.zeros(16, 16, dtype=torch.bfloat16)
    u = torch.zeros(16)
    _convert.to_numpy(t), _convert.to_numpy(u)
    keys, refs = (id(t), id(u)), (weakref.ref(t), weakref.ref(u))
    assert all(k in _convert._VIEWS for k in keys)
    gc.disable()
    try:
        del t, u  # no reference cycle: freed at once, with their entries
        assert all(r() is None for r in refs)
        assert not any(k in _convert._VIEWS for k in keys)
    finally:
        gc.enable()
