"""The ``hw`` backend: selection, BackendUnavailable, and its conversions (host -> device,
FRACTAL_NZ casts, index / descale rebuilding, in-place write-back) through the test stand-in
torch_npu, whose ops run the emulator: every op and mode must give the emu backend's bytes."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import compare, hw, ops
from ascend_emu.errors import BackendUnavailable, ModeError

BF16 = ml_dtypes.bfloat16
REAL_TORCH_NPU = importlib.util.find_spec("torch_npu") is not None


# ----------------------------------------------------------------------------- selection
def test_backend_context_manager_nests_and_restores(monkeypatch):
    monkeypatch.delenv("ASCEND_EMU_BACKEND", raising=False)
    assert ops.backend_name() == "emu"
    with ops.backend("hw"):
        assert ops.backend_name() == "hw"
        with ops.backend("emu"):
            assert ops.backend_name() == "emu"
        assert ops.backend_name() == "hw"
    assert ops.backend_name() == "emu"
    with pytest.raises(ModeError, match="backend: expected one of \\['emu', 'hw'\\]"):
        with ops.backend("gpu"):
            pass
    monkeypatch.setenv("ASCEND_EMU_BACKEND", "hw")
    assert ops.backend_name() == "hw" and ops.get_backend() is hw.BACKEND


# ----------------------------------------------------------------------------- the backend interface
FAMILIES = ("mla_prolog", "mla_preprocess", "kv_rmsnorm_rope_cache", "sparse_flash_attention", "lightning_indexer", "rope",
            "paged_cache", "quant", "quant_lightning_indexer", "fused_infer_attention_score", "quant_950")
#: Families whose ``ops`` module has another name.
OPS_MODULES = {"quant": "dynamic_quant"}


def _outputs_type(family: str):
    """The family's ``...Outputs`` NamedTuple, from its ``ops`` module (its one definition)."""
    mod = importlib.import_module(f"ascend_emu.ops.{OPS_MODULES.get(family, family)}")
    (cls,) = [v for k, v in vars(mod).items() if k.endswith("Outputs") and isinstance(v, type)]
    return cls


@pytest.mark.parametrize("family", FAMILIES)
def test_emu_submodule_names_are_modules(family):
    """``import ascend_emu.emu.<family>`` gives the module, not a function rebound over it."""
    import types

    mod = importlib.import_module(f"ascend_emu.emu.{family}")
    assert isinstance(mod, types.ModuleType) and mod.__name__ == f"ascend_emu.emu.{family}"
    emu = importlib.import_module("ascend_emu.emu")
    assert getattr(emu, family) is mod
    assert callable(getattr(mod, family))  # the family's function lives in its module


def test_both_backends_implement_the_interface():
    from ascend_emu import emu
    from ascend_emu.ops._backend import Backend

    for impl, name in ((emu.BACKEND, "emu"), (hw.BACKEND, "hw")):
        assert isinstance(impl, Backend) and impl.name == name
        for family in FAMILIES:
            assert callable(getattr(impl, family)), (name, family)
    with ops.backend("emu"):
        assert ops.get_backend() is emu.BACKEND


#: Outputs each family writes in place: field -> the argument object's attribute holding the array.
IN_PLACE = {"kv_rmsnorm_rope_cache": {"k_cache": "k_cache", "ckv_cache": "ckv_cache"},
            "mla_preprocess": {f: f for f in ("q_out0", "kv_cache_out0", "q_out1", "kv_cache_out1")}}


@contextlib.contextmanager
def convention_checked(seen: list):
    """Wrap every family method of both backends: each must return its family's ``...Outputs``
    (all fields arrays, or None where the prolog's scenario has no such output) and, for in-place
    outputs, the very arrays the argument object holds. Appends ``(backend, family)`` per call."""
    from ascend_emu import emu

    mp = pytest.MonkeyPatch()
    for impl in (emu.BACKEND, hw.BACKEND):
        for family in FAMILIES:
            def wrapped(args, _real=getattr(impl, family), _family=family, _name=impl.name):  # noqa: B008
                result = _real(args)
                assert type(result) is _outputs_type(_family), (_name, _family, type(result))
                for field, value in zip(result._fields, result, strict=True):
                    assert isinstance(value, np.ndarray) or (value is None and _family in ("mla_prolog", "quant_950", "quant")), (
                        _name, _family, field)
                if _family == "paged_cache":  # the caches (scatter) or key / value (gather)
                    assert result.k is args.written[0] and result.v is args.written[1], (_name, _family)
                for field, attr in IN_PLACE.get(_family, {}).items():
                    assert getattr(result, field) is getattr(args, attr), (_name, _family, field)
                seen.append((_name, _family))
                return result

            mp.setattr(impl, family, wrapped)
    try:
        yield
    finally:
        mp.undo()


def test_unimplemented_op_named():
    with pytest.raises(NotImplementedError, match="hw backend: no implementation of 'flash_attention_v9'"):
        hw.flash_attention_v9  # noqa: B018


def _kv_call(rng, mode="PA_NZ", b=2, s=3, quant=False):
    """Arguments of a small npu_kv_rmsnorm_rope_cache call in ``mode``; caches poisoned with 0x5A."""
    kv = rng.standard_normal((b, 1, s, 576)).astype(BF16)
    gamma = rng.uniform(0.5, 1.5, 512).astype(BF16)
    cos = rng.uniform(-1, 1, (b, 1, s, 64)).astype(BF16)
    sin = rng.uniform(-1, 1, (b, 1, s, 64)).astype(BF16)
    dt = np.int8 if quant else BF16
    bs, nb = 32, 6
    if mode == "Norm":
        shape_k, shape_c = (b, 1, 8, 64), (b, 1, 8, 512)
        index = np.array([[0, 5, -1], [7, 1, 2]], np.int64)
    else:
        shape_k, shape_c = (nb, bs, 1, 64), (nb, bs, 1, 512)
        if mode.startswith("PA_BLK"):
            index = np.array([2 * bs, -1], np.int64)  # page-start offsets, one page per batch; batch 1 skipped
        else:
            index = np.array([3, 70, -1, 191, 32, 100], np.int64)
    k = np.full(shape_k, 0x5A, np.uint8).view(dt) if quant else np.full(shape_k, 0x5A5A, np.uint16).view(BF16)
    c = np.full(shape_c, 0x5A, np.uint8).view(dt) if quant else np.full(shape_c, 0x5A5A, np.uint16).view(BF16)
    kw = dict(cache_mode=mode, is_output_kv=mode != "Norm")
    if quant:
        kw.update(k_rope_scale=rng.uniform(10, 20, 64).astype(np.float32),
                  c_kv_scale=rng.uniform(10, 20, 512).astype(np.float32))
    return ops.npu_kv_rmsnorm_rope_cache, [kv, gamma, cos, sin, index, k, c], kw


def test_unavailable_without_torch_npu(rng, monkeypatch):
    if REAL_TORCH_NPU:
        pytest.skip("a torch_npu is installed here")
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    fn, args, kw = _kv_call(rng)
    before = args[5].copy()
    with ops.backend("hw"), pytest.raises(BackendUnavailable, match="torch_npu is not installed.*pip install"):
        fn(*args, **kw)
    assert np.array_equal(args[5].view(np.uint8), before.view(np.uint8))  # nothing written


def test_refuses_the_drop_in(monkeypatch):
    pytest.importorskip("torch")
    import ascend_emu.torch_npu as drop_in

    monkeypatch.setitem(sys.modules, "torch_npu", drop_in)
    with pytest.raises(BackendUnavailable, match="drop-in"):
        hw.runtime()


@pytest.mark.skipif(not REAL_TORCH_NPU, reason="needs the real torch_npu and an Atlas NPU (not on this machine)")
def test_real_npu_kv_rmsnorm_rope_cache_within_criterion(rng):
    """On an Atlas machine: the real kernel against the emulator, by the official criterion."""
    fn, args, kw = _kv_call(rng)
    res = {}
    for be in ("emu", "hw"):
        a = [x.copy() for x in args]
        with ops.backend(be):
            res[be] = (fn(*a, **kw), a)
    for name, x, y in (("k_cache", res["hw"][1][5], res["emu"][1][5]), ("k_embed_out", res["hw"][0][2], res["emu"][0][2])):
        assert compare.compare_tensor(name, y, x).status in ("identical", "pass")


# ----------------------------------------------------------------------------- loopback through the stand-in
@pytest.fixture(scope="module")
def standin():
    pytest.importorskip("torch")
    from tests.standin_torch_npu import standin as ctx

    with ctx() as mod:
        yield mod


def _copy(v):
    return v.copy() if isinstance(v, np.ndarray) else v


def assert_backends_agree(fn, args, kwargs):
    """Run ``fn`` on copies of the arguments with each backend; both must return the family's
    outputs by the interface's convention (:func:`convention_checked`), and every output and every
    array argument (caches, out= tensors) must hold the same bytes (NaN-aware)."""
    got, seen = {}, []
    for be in ("emu", "hw"):
        a = [_copy(v) for v in args]
        kw = {k: _copy(v) for k, v in kwargs.items()}
        with ops.backend(be), convention_checked(seen):
            out = fn(*a, **kw)
        got[be] = (list(out) if isinstance(out, (tuple, list)) else [out], a, kw)
    # one family; emu, then hw (whose stand-in device runs emu inside)
    assert seen[0][0] == "emu" and seen[-1][0] == "hw" and len({f for _, f in seen}) == 1, seen
    (oe, ae, ke), (oh, ah, kh) = got["emu"], got["hw"]
    pairs = [(f"out[{i}]", x, y) for i, (x, y) in enumerate(zip(oe, oh, strict=True))]
    pairs += [(f"args[{i}]", x, y) for i, (x, y) in enumerate(zip(ae, ah, strict=True))]
    pairs += [(k, ke[k], kh[k]) for k in ke]
    checked = 0
    for name, x, y in pairs:
        if isinstance(x, np.ndarray):
            r = compare.compare_tensor(name, np.asarray(y), np.asarray(x))
            assert r.status == "identical", (name, r.to_dict())
            checked += 1
    assert checked


KV_MODES = ["Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ"]


@pytest.mark.parametrize("mode", KV_MODES)
def test_hw_kv_rmsnorm_rope_cache(standin, rng, mode):
    assert_backends_agree(*_kv_call(rng, mode))


@pytest.mark.parametrize("mode", ["PA_NZ", "PA_BLK_BNSD"])
def test_hw_kv_rmsnorm_rope_cache_int8(standin, rng, mode):
    assert_backends_agree(*_kv_call(rng, mode, quant=True))


@pytest.fixture(scope="module")
def prolog_data():
    from tests.test_mla_prolog import Data, QuantData

    return Data(np.random.default_rng(7)), QuantData(np.random.default_rng(11))


PROLOG_BF16 = [(1, "PA_BSND"), (2, "PA_NZ"), (3, "PA_BLK_NZ"), (3, "TND")]


@pytest.mark.parametrize("version, cache_mode", PROLOG_BF16)
def test_hw_mla_prolog_bf16(standin, prolog_data, version, cache_mode):
    from tests.test_mla_prolog import BF16 as B, DR, HCKV

    data, _ = prolog_data
    n, t = 2, 4
    w_uq_qr, w_uk, _, _ = data.heads(n)
    x, sin, cos = data.x[:t].copy(), data.sin[:t].copy(), data.cos[:t].copy()
    if cache_mode == "TND":
        kv, kr, index = np.zeros((t, 1, HCKV), B), np.zeros((t, 1, DR), B), None
    else:
        kv, kr = np.zeros((3, 16, 1, HCKV), B), np.zeros((3, 16, 1, DR), B)
        index = np.array([0, 2], np.int64) if cache_mode == "PA_BLK_NZ" else np.array([5, 17, -1, 40], np.int64)
    head = [x, data.w_dq_nz, w_uq_qr, w_uk, data.w_dkv_kr_nz, data.gamma_cq, data.gamma_ckv, sin, cos]
    if version == 3:
        kw = dict(cache_index=index, cache_mode=cache_mode, query_norm_flag=True)
        if cache_mode == "PA_BLK_NZ":
            kw["actual_seq_len"] = np.array([2, 4], np.int32)  # two sequences of 2 tokens, one block each
        assert_backends_agree(ops.npu_mla_prolog_v3, head + [kv, kr], kw)
    else:
        fn = ops.npu_mla_prolog if version == 1 else ops.npu_mla_prolog_v2
        assert_backends_agree(fn, head + [index, kv, kr], dict(cache_mode=cache_mode))


def _scenarios():
    from tests.test_mla_prolog import SEED_SCENARIOS

    return list(SEED_SCENARIOS)


@pytest.mark.parametrize("modes", _scenarios(), ids=str)
def test_hw_mla_prolog_v3_quant_scenarios(standin, prolog_data, modes):
    _, q = prolog_data
    t = 4
    w_dq, w_uq_qr, w_dkv_kr = q.weights(modes)
    x = q.x["int8" if modes[0] == 2 else "bfloat16"][:t].copy()
    kv, kr = q.caches(modes, (3, 16))
    kw = dict(cache_index=np.array([5, 17, -1, 40], np.int64), cache_mode="PA_BSND", query_norm_flag=True,
              **q.mode_kwargs(modes), **q.scale_kwargs(modes, t))
    assert_backends_agree(ops.npu_mla_prolog_v3, [x, w_dq, w_uq_qr, q.w_uk, w_dkv_kr, q.gamma_cq, q.gamma_ckv,
                                                  q.sin[:t].copy(), q.cos[:t].copy(), kv, kr], kw)


MLAPP = [("bfloat16", c, qm) for c in ("krope_ctkv", "int8_nzcache", "nzcache")
         for qm in ("per_tensor_quant_asymm", "per_token_quant_symm")] + [
    ("float16", "krope_ctkv", "per_tensor_quant_asymm"), ("float16", "int8_nzcache", "per_tensor_quant_asymm")]
# float16 with per_token_quant_symm is rejected by the op (tests/test_mla_preprocess.py), so not listed


@pytest.mark.filterwarnings("ignore::ascend_emu.errors.DuplicateSlotWarning")
@pytest.mark.parametrize("dtype_name, cache_mode, quant_mode", MLAPP)
def test_hw_mla_preprocess(standin, rng, dtype_name, cache_mode, quant_mode):
    from tests.test_mla_preprocess import make_case

    case = make_case(rng, dtype_name, cache_mode, quant_mode)
    assert_backends_agree(ops.npu_mla_preprocess, list(case["args"].values()), case["kwargs"])


@pytest.mark.parametrize("wuk_form", ["nd", "nz_storage"])
def test_hw_mla_preprocess_storage_shaped_weights(standin, rng, wuk_form):
    """Weights in the torch_npu doc example's form (their FRACTAL_NZ storage as a tensor, itself
    cast) reach the device as the caller gave them; the emu backend reads them back."""
    from tests.test_mla_preprocess import _storage_form, make_case

    case = make_case(rng, "bfloat16", "krope_ctkv", "per_tensor_quant_asymm")
    a = dict(case["args"])
    for name in ("wdqkv", "wuq") + (("wuk",) if wuk_form == "nz_storage" else ()):
        a[name] = _storage_form(np.asarray(a[name]))
    assert_backends_agree(ops.npu_mla_preprocess, list(a.values()), case["kwargs"])


def test_hw_mla_preprocess_out_form_in_place(standin, rng):
    """out= form with the caches themselves: written in place on both backends alike."""
    from tests.test_mla_preprocess import make_case

    case = make_case(rng, "bfloat16", "nzcache", "per_tensor_quant_asymm")
    a = case["args"]
    t, n = a["input"].shape[0], a["wuk"].shape[0]
    kw = dict(case["kwargs"], q_out0=np.zeros((t, n, 512), BF16), q_out1=np.zeros((t, n, 64), BF16))
    args = list(a.values())

    def fn(*args, **kw):
        return ops.npu_mla_preprocess(*args, kv_cache_out0=args[13], kv_cache_out1=args[14], **kw)

    assert_backends_agree(fn, args, kw)


def test_hw_skipped_nz_cast_caught(standin, prolog_data):
    """A device path that skips npu_format_cast: most query elements off, reported as a failure."""
    from tests.test_mla_prolog import BF16 as B, DR, HCKV

    data, _ = prolog_data
    w_uq_qr, w_uk, _, _ = data.heads(2)
    args = [data.x[:4].copy(), data.w_dq_nz, w_uq_qr, w_uk, data.w_dkv_kr_nz, data.gamma_cq, data.gamma_ckv,
            data.sin[:4].copy(), data.cos[:4].copy(), np.zeros((3, 16, 1, HCKV), B), np.zeros((3, 16, 1, DR), B)]
    kw = dict(cache_index=np.array([5, 17, -1, 40], np.int64), cache_mode="PA_NZ")
    with ops.backend("emu"):
        good = ops.npu_mla_prolog_v3(*[_copy(v) for v in args], **kw)
    standin.FAULT = "skip_nz"
    try:
        with ops.backend("hw"):
            bad = ops.npu_mla_prolog_v3(*[_copy(v) for v in args], **kw)
    finally:
        standin.FAULT = ""
    r = compare.compare_tensor("query", bad[0], good[0])
    assert r.status == "fail" and r.mismatched > r.size // 10


# ----------------------------------------------------------------------------- sparse attention family
SFA_MODES = [(quant, *m) for quant in (False, True) for m in [
    ("BSND", "BSND", "bfloat16", 1), ("TND", "TND", "float16", 4), ("BSND", "PA_BSND", "bfloat16", 16),
    ("TND", "PA_BSND", "float16", 2)]]


@pytest.mark.parametrize("quant, layout_query, layout_kv, dtype, sbs", SFA_MODES)
@pytest.mark.parametrize("sparse_mode", [3, 0])
def test_hw_sparse_flash_attention(standin, quant, layout_query, layout_kv, dtype, sbs, sparse_mode):
    """Both sparse attention ops (KV-quant: per-tile scaled 656-byte rows), every layout, both dtypes."""
    from tests.test_sparse_flash_attention import SCALE, make_case

    case = make_case(np.random.default_rng(sbs + 31 * quant), quant=quant, layout_query=layout_query,
                     layout_kv=layout_kv, dtype=dtype, sbs=sbs)
    kw = dict(case["kw"], sparse_mode=sparse_mode, attention_mode=2)
    if quant:
        def fn(query, key, sparse_indices, **kw):  # value: the key tensor itself
            return ops.npu_kv_quant_sparse_flash_attention(query, key, key, sparse_indices, SCALE, 2, 2, **kw)

        assert_backends_agree(fn, [case["query"], case["key"], case["sparse_indices"]], kw)
    else:
        kw.update(query_rope=case["query_rope"], key_rope=case["key_rope"],
                  return_softmax_lse=layout_kv != "PA_BSND")
        assert_backends_agree(ops.npu_sparse_flash_attention,
                              [case["query"], case["key"], case["value"], case["sparse_indices"], SCALE], kw)


def test_hw_kv_quant_sfa_over_prolog_v3_cache(standin):
    """KV-quant attention over a per-tile cache that npu_mla_prolog_v3 wrote."""
    from tests.test_sparse_flash_attention import test_kv_quant_over_cache_written_by_mla_prolog_v3 as build

    calls = []
    real = ops.npu_kv_quant_sparse_flash_attention

    def spy(*a, **kw):
        calls.append(([_copy(v) for v in a], {k: _copy(v) for k, v in kw.items()}))
        return real(*a, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(ops, "npu_kv_quant_sparse_flash_attention", spy)
    try:
        build()
    finally:
        mp.undo()
    assert calls
    (query, key, _, idx, scale, kq, vq), kw = calls[0]

    def fn(query, key, idx, **kw):  # value: the key tensor itself
        return real(query, key, key, idx, scale, kq, vq, **kw)

    assert_backends_agree(fn, [query, key, idx], kw)


LI_MODES = [("BSND", "BSND", "bfloat16"), ("TND", "TND", "float16"), ("BSND", "PA_BSND", "float16"),
            ("TND", "PA_BSND", "bfloat16")]


@pytest.mark.parametrize("layout_q, layout_k, dtype_name", LI_MODES)
@pytest.mark.parametrize("return_value", [True, False])
def test_hw_lightning_indexer(standin, layout_q, layout_k, dtype_name, return_value):
    from tests.test_lightning_indexer import make_case

    dt = BF16 if dtype_name == "bfloat16" else np.float16
    query, key, weights, kw = make_case(np.random.default_rng(5), layout_q, layout_k, dt, (3, 2), (40, 17))
    assert_backends_agree(ops.npu_lightning_indexer, [query, key, weights],
                          dict(kw, sparse_count=8, sparse_mode=3, return_value=return_value))


@pytest.mark.parametrize("layout_q, layout_k", [("BSND", "BSND"), ("TND", "TND"), ("BSND", "PA_BSND"),
                                                ("TND", "PA_BSND")])
def test_hw_quant_lightning_indexer(standin, layout_q, layout_k):
    from tests.test_quant_lightning_indexer import make_case

    inputs, kw = make_case(np.random.default_rng(5), layout_q, layout_k, (3, 2), (40, 17))
    assert_backends_agree(ops.npu_quant_lightning_indexer, [*inputs, 0, 0], dict(kw, sparse_count=8, sparse_mode=3))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_hw_rope(standin, rng, dtype):
    x = rng.standard_normal((2, 3, 4, 64)).astype(dtype)
    cos, sin = (rng.standard_normal((2, 1, 4, 64)).astype(dtype) for _ in range(2))
    assert_backends_agree(ops.npu_interleave_rope, (x, cos, sin), {})
    r1, r2 = (rng.standard_normal((1, 1, 4, 64)).astype(dtype) for _ in range(2))
    for mode in ("half", "interleave"):
        assert_backends_agree(ops.npu_rotary_mul, (x, r1, r2), {"rotary_mode": mode})
    rotate = rng.standard_normal((64, 64)).astype(dtype)
    assert_backends_agree(ops.npu_rotary_mul, (x, r1, r2), {"rotary_mode": "half", "rotate": rotate})
    rt = rng.standard_normal((2, 1, 64)).astype(dtype)  # TND x [2, 3, 64] with T1D r1 / r2
    assert_backends_agree(ops.npu_rotary_mul, (x[:, :, 0].copy(), rt, rt.copy()), {})


@pytest.mark.parametrize("mode", ["Norm", "PA_NZ"])
def test_hw_paged_cache(standin, rng, mode):
    from ascend_emu.layouts import NZArray

    c0 = 16
    key, value = (rng.standard_normal((5, 2, d)).astype(ml_dtypes.bfloat16) for d in (32, 16))
    shapes = ((3, 16, 2, 32), (3, 16, 2, 16)) if mode == "Norm" else ((3, 4, 16, c0), (3, 2, 16, c0))
    kc, vc = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in shapes)
    slots = np.array([3, -1, 40, 17, 0], np.int64)
    assert_backends_agree(ops.npu_scatter_pa_kv_cache, (key, value, kc, vc, slots), {"cache_mode": mode})
    if mode == "PA_NZ":
        kc = kc.view(NZArray)
    table, lens = np.array([[2, 0], [1, 2]], np.int32), np.array([0, 3, 20], np.int32)
    out = [np.zeros((20, 2, d), ml_dtypes.bfloat16) for d in (32, 16)]
    assert_backends_agree(ops.npu_gather_pa_kv_cache, (kc, vc, table, lens, *out),
                          {"seq_offset": np.array([16, 0], np.int32), "is_seq_lens_cumsum": True})


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_hw_dynamic_quant(standin, rng, dtype):
    x = (rng.standard_normal((2, 3, 16)) * 3).astype(dtype)
    smooth = rng.uniform(0.5, 2.0, (16,)).astype(dtype)
    assert_backends_agree(ops.npu_dynamic_quant, (x,), {"smooth_scales": smooth})
    assert_backends_agree(ops.npu_dynamic_quant, (x,), {"dst_type": 16})
    groups = rng.uniform(0.5, 2.0, (2, 16)).astype(dtype)
    assert_backends_agree(ops.npu_dynamic_quant, (x,), {"smooth_scales": groups,
                                                        "group_index": np.array([2, 6], np.int32)})
    assert_backends_agree(ops.npu_dynamic_quant_asymmetric, (x,), {"smooth_scales": smooth})
    assert_backends_agree(ops.npu_dynamic_quant_asymmetric, (x,), {"dst_type": 16})


@pytest.mark.parametrize("op,lse", [("npu_fused_infer_attention_score", "softmax_lse_flag"),
                                    ("npu_fused_infer_attention_score_v2", "return_softmax_lse")])
def test_hw_fused_infer_attention_score(standin, rng, op, lse):
    from tests.test_fused_infer_attention_score import make_case

    q, key, value, kw = make_case(rng, "TND", 4, ml_dtypes.bfloat16, q_lens=(2, 1), kv_lens=(20, 7), sparse_mode=3)
    if op.endswith("_v2"):
        kw = {"actual_seq_qlen" if k == "actual_seq_lengths" else "actual_seq_kvlen" if k == "actual_seq_lengths_kv"
              else "num_query_heads" if k == "num_heads" else "softmax_scale" if k == "scale" else k: v
              for k, v in kw.items()}
    assert_backends_agree(getattr(ops, op), (q, key, value), dict(kw, **{lse: True}))


def test_hw_fused_infer_attention_score_mha_forms(standin, rng):
    """The MHA / GQA form through the hw backend: an explicit mask with its pre / next tokens, kv
    antiquant by the v1 names, and v2's learnable_sink on TND."""
    from tests.test_fused_infer_attention_mha import make_dense

    q, k, v, kw = make_dense(rng, "BNSD", s1=3, s2=8, dtype=ml_dtypes.bfloat16)
    mask = np.zeros((3, 8), bool)
    mask[:, 5:] = True
    assert_backends_agree(ops.npu_fused_infer_attention_score, (q, k, v),
                          dict(kw, atten_mask=mask, pre_tokens=100, next_tokens=100, softmax_lse_flag=True))
    ki = rng.integers(-128, 128, (2, 2, 8, 32)).astype(np.int8)
    scale = np.full((2, 1, 32), 0.02, ml_dtypes.bfloat16)
    assert_backends_agree(ops.npu_fused_infer_attention_score, (q, ki, ki),
                          dict(kw, key_antiquant_scale=scale, value_antiquant_scale=scale))
    q, k, v, kw = make_dense(rng, "TND", d=128, dtype=ml_dtypes.bfloat16, q_lens=[2, 1], kv_lens=[3, 5])
    v2 = {"actual_seq_qlen" if a == "actual_seq_lengths" else "actual_seq_kvlen" if a == "actual_seq_lengths_kv"
          else "num_query_heads" if a == "num_heads" else "softmax_scale" if a == "scale" else a: x
          for a, x in kw.items()}
    assert_backends_agree(ops.npu_fused_infer_attention_score_v2, (q, k, v),
                          dict(v2, learnable_sink=np.ones(4, ml_dtypes.bfloat16)))


def test_hw_fused_infer_attention_score_c8(standin, rng):
    from tests.test_fused_infer_attention_score import make_c8_case

    q, cache, kw = make_c8_case(rng, "BSND_NBSD", 5, kv_lens=(40, 7))
    assert_backends_agree(ops.npu_fused_infer_attention_score_v2, (q, cache, cache), dict(kw, return_softmax_lse=True))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_hw_quant_950(standin, rng, monkeypatch, dtype):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    x = (rng.standard_normal((3, 70)) * 4).astype(dtype)
    for code in (290, 291, 292):
        assert_backends_agree(ops.npu_dtype_cast, (x, code), {})
    codes = ops.npu_dtype_cast(x, 290)
    assert_backends_agree(ops.npu_dtype_cast, (codes, 15), {"input_dtype": 290})
    fp8 = ops.npu_dtype_cast(x, 292)
    assert_backends_agree(ops.npu_dtype_cast, (fp8, 6), {})
    if dtype is not np.float32:
        for axis, alg in ((-1, 0), (0, 1)):
            assert_backends_agree(ops.npu_dynamic_mx_quant, (x,), {"dst_type": 291, "axis": axis, "scale_alg": alg})
        assert_backends_agree(ops.npu_dynamic_mx_quant_with_dual_axis, (x,), {"dst_type": 292})
        assert_backends_agree(ops.npu_dynamic_quant, (x,), {"quant_mode": "perchannel"})
        assert_backends_agree(ops.npu_dynamic_quant_asymmetric, (x,), {"quant_mode": "perchannel"})
    assert_backends_agree(ops.npu_dtype_cast, (x, 5), {})  # the general cast
    assert_backends_agree(ops.npu_dtype_cast, (np.arange(-8, 8, dtype=np.int32).reshape(2, 8), 285), {})
