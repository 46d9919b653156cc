"""What the per-call fast paths cache, and that caching never changes what a call accepts or writes.

- Op contracts memoise their static checks per call signature (``ops._check.signature``): a
  repeated signature skips them, but index values (cache slots, sparse indices), cache / out=
  overlap, int64 descale bits and ``k_nope_clip_alpha`` are still checked on every call, and a
  rejected call leaves the caches byte-identical.
- The parallel kernels split work by ``kernels.parallel_parts``; forcing the parallel path gives
  the same bytes as the serial one.
"""

from __future__ import annotations

import importlib

import ml_dtypes
import numba
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import FormatError, IndexRangeError, ModeError, ShapeError
from ascend_emu.ops._check import ValidatedSignatures, signature

from .helpers import assert_same_bytes, poisoned

BF16 = np.dtype(ml_dtypes.bfloat16)
kv_contract = importlib.import_module("ascend_emu.ops.kv_rmsnorm_rope_cache")
prolog_contract = importlib.import_module("ascend_emu.ops.mla_prolog")
pre_contract = importlib.import_module("ascend_emu.ops.mla_preprocess")
sfa_contract = importlib.import_module("ascend_emu.ops.sparse_flash_attention")
kernels = importlib.import_module("ascend_emu.emu.kernels")
matmul = importlib.import_module("ascend_emu.emu.matmul")


def _bf16(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(BF16)


# ---------------------------------------------------------------------- signatures
def test_signature_tells_apart_what_the_checks_read():
    a = np.zeros((2, 3), np.float16)
    same = signature(a, 1e-5, "PA_NZ", None)
    assert same == signature(np.ones((2, 3), np.float16), 1e-5, "PA_NZ", None)  # values are not read
    others = [signature(a.astype(">f2"), 1e-5, "PA_NZ", None),  # byte order
              signature(a.T.copy(), 1e-5, "PA_NZ", None),  # shape
              signature(a[:, ::2], 1e-5, "PA_NZ", None),  # shape and contiguity
              signature(ops.npu_format_cast(a, 29), 1e-5, "PA_NZ", None),  # NZ tag
              signature(a, np.float32(1e-5), "PA_NZ", None),  # scalar type
              signature(a, 1e-5, "PA", None), signature(a, 1e-5, "PA_NZ", a)]
    read_only = a.copy()
    read_only.flags.writeable = False
    others.append(signature(read_only, 1e-5, "PA_NZ", None))
    assert all(o != same for o in others)
    assert signature([1, 2], 1e-5) is None  # not an array: always checked in full
    # equal values that the checks and kernels tell apart: the sign of a zero
    assert signature(a, 0.0) != signature(a, -0.0)
    assert signature(a, np.float32(0.0)) != signature(a, np.float32(-0.0))
    assert signature(a, 1, 1.0) != signature(a, 1.0, 1)  # int 1 and float 1.0


def test_validated_signatures_drop_least_recent():
    memo = ValidatedSignatures(maxsize=2)
    memo.put(("a",), 1)
    memo.put(("b",), 2)
    assert memo.get(("a",)) == 1  # a is now the most recent
    memo.put(("c",), 3)
    assert memo.get(("b",)) is None and memo.get(("a",)) == 1 and memo.get(("c",)) == 3
    memo.put(None, 4)
    assert memo.get(None) is None and len(memo) == 2


# ---------------------------------------------------------------------- npu_kv_rmsnorm_rope_cache
def _kv_case(rng, b=2):
    return dict(kv=_bf16(rng, b, 1, 1, 576), gamma=_bf16(rng, 512), cos=_bf16(rng, b, 1, 1, 64),
                sin=_bf16(rng, b, 1, 1, 64), index=np.array([5, 40], np.int64)[:b],
                k_cache=poisoned((4, 16, 1, 64), BF16), ckv_cache=poisoned((4, 16, 1, 512), BF16))


def _kv_call(c, **kw):
    return ops.npu_kv_rmsnorm_rope_cache(c["kv"], c["gamma"], c["cos"], c["sin"], c["index"], c["k_cache"],
                                         c["ckv_cache"], cache_mode="PA_NZ", **kw)


def test_kv_repeated_signature_is_checked_once_and_writes_the_same(rng):
    kv_contract._VALIDATED.clear()
    first, second = _kv_case(rng), None
    second = {k: v.copy() for k, v in first.items()}
    _kv_call(first)
    assert len(kv_contract._VALIDATED) == 1
    _kv_call(second)  # the memoised path
    assert len(kv_contract._VALIDATED) == 1
    assert_same_bytes(second["k_cache"], first["k_cache"], "k_cache")
    assert_same_bytes(second["ckv_cache"], first["ckv_cache"], "ckv_cache")


def test_kv_memoised_signature_still_checks_index_values(rng):
    c = _kv_case(rng)
    _kv_call(c)
    before = [c["k_cache"].copy(), c["ckv_cache"].copy()]
    c["index"] = np.array([5, 64], np.int64)  # 64 = 4 blocks * 16 rows: out of range
    with pytest.raises(IndexRangeError, match=r"index\[1\] = 64"):
        _kv_call(c)
    assert_same_bytes(c["k_cache"], before[0], "k_cache")
    assert_same_bytes(c["ckv_cache"], before[1], "ckv_cache")


def test_kv_memoised_signature_still_checks_overlap(rng):
    c = _kv_case(rng)
    _kv_call(c)  # separate caches: the signature is memoised
    memory = poisoned(4 * 16 * 512, BF16)
    c["ckv_cache"] = memory.reshape(4, 16, 1, 512)
    c["k_cache"] = memory[:4 * 16 * 64].reshape(4, 16, 1, 64)  # same signature, overlapping memory
    with pytest.raises(ShapeError, match="ckv_cache: expected memory separate from k_cache"):
        _kv_call(c)
    assert np.all(memory.view(np.uint16) == 0xA5A5)


def test_kv_read_only_cache_rejected_after_a_writable_one(rng):
    c = _kv_case(rng)
    _kv_call(c)
    c["k_cache"].flags.writeable = False
    with pytest.raises(ShapeError, match="writable"):
        _kv_call(c)


# ---------------------------------------------------------------------- npu_mla_prolog_v3
def _prolog_case(rng, t=3, n=1):
    he, hcq = 7168, 1536
    return dict(
        token_x=_bf16(rng, t, he), weight_dq=ops.npu_format_cast(_bf16(rng, he, hcq, scale=he ** -0.5), 29),
        weight_uq_qr=ops.npu_format_cast(_bf16(rng, hcq, n * 192, scale=hcq ** -0.5), 29),
        weight_uk=_bf16(rng, n, 128, 512, scale=128 ** -0.5),
        weight_dkv_kr=ops.npu_format_cast(_bf16(rng, he, 576, scale=he ** -0.5), 29),
        rmsnorm_gamma_cq=_bf16(rng, hcq), rmsnorm_gamma_ckv=_bf16(rng, 512), rope_sin=_bf16(rng, t, 64),
        rope_cos=_bf16(rng, t, 64), kv_cache=poisoned((2, 16, 1, 512), BF16), kr_cache=poisoned((2, 16, 1, 64), BF16),
        cache_index=np.array([3, 17, 30][:t], np.int64))


def _prolog_call(c, **kw):
    c = dict(c)
    args = [c.pop(k) for k in ("token_x", "weight_dq", "weight_uq_qr", "weight_uk", "weight_dkv_kr",
                                "rmsnorm_gamma_cq", "rmsnorm_gamma_ckv", "rope_sin", "rope_cos", "kv_cache",
                                "kr_cache")]
    return ops.npu_mla_prolog_v3(*args, **{"cache_mode": "PA_NZ", **c, **kw})


def test_prolog_memoised_signature_same_outputs_and_still_checks_values(rng):
    prolog_contract._VALIDATED.clear()
    c = _prolog_case(rng)
    fresh = {k: v.copy() if k.endswith("cache") else v for k, v in c.items()}
    q1, r1, *_ = _prolog_call(c)
    assert len(prolog_contract._VALIDATED) == 1
    q2, r2, *_ = _prolog_call(fresh)  # the memoised path
    assert len(prolog_contract._VALIDATED) == 1
    for a, b, what in ((q1, q2, "query"), (r1, r2, "query_rope"), (c["kv_cache"], fresh["kv_cache"], "kv_cache"),
                       (c["kr_cache"], fresh["kr_cache"], "kr_cache")):
        assert_same_bytes(b, a, what)
    before = [c["kv_cache"].copy(), c["kr_cache"].copy()]
    c["cache_index"] = np.array([3, -2, 30], np.int64)
    with pytest.raises(IndexRangeError, match=r"cache_index\[1\] = -2"):
        _prolog_call(c)
    assert_same_bytes(c["kv_cache"], before[0], "kv_cache")
    assert_same_bytes(c["kr_cache"], before[1], "kr_cache")
    c["cache_index"] = np.array([3, 17, 30], np.int64)
    memory = poisoned(2 * 16 * 512, BF16)
    c["kv_cache"] = memory.reshape(2, 16, 1, 512)
    c["kr_cache"] = memory[:2 * 16 * 64].reshape(2, 16, 1, 64)  # same signature, overlapping memory
    with pytest.raises(ShapeError, match="kr_cache: expected memory separate from kv_cache"):
        _prolog_call(c)
    assert np.all(memory.view(np.uint16) == 0xA5A5)


def test_prolog_memoised_signature_keeps_the_sign_of_a_zero_scale(rng):
    """kc_scale -0.0 after 0.0 (equal values): the kv_cache gets the zeros a fresh check gives."""
    c = _prolog_case(rng, t=1)

    def kv(scale, clear):
        if clear:
            prolog_contract._VALIDATED.clear()
        case = {k: v.copy() if k.endswith("cache") else v for k, v in c.items()}
        _prolog_call(case, kc_scale=scale)
        return case["kv_cache"].view(np.uint16)

    want = kv(-0.0, clear=True)
    assert np.any(want == 0x8000)  # -0.0 in the cache row
    kv(0.0, clear=True)
    assert np.array_equal(kv(-0.0, clear=False), want)


def test_prolog_memoised_signature_still_checks_read_tensors_against_the_caches(rng):
    prolog_contract._VALIDATED.clear()
    c = _prolog_case(rng)
    _prolog_call(c)
    assert len(prolog_contract._VALIDATED) == 1
    for name, cache in (("rope_sin", "kr_cache"), ("rmsnorm_gamma_ckv", "kv_cache")):
        bad = dict(c)
        shape = c[name].shape
        bad[name] = c[cache].reshape(-1)[:c[name].size].reshape(shape)  # same signature, inside the cache
        before = [c["kv_cache"].copy(), c["kr_cache"].copy()]
        with pytest.raises(ShapeError, match=f"{name}: expected memory separate from {cache}"):
            _prolog_call(bad)
        assert len(prolog_contract._VALIDATED) == 1  # the memoised path rejected it
        assert_same_bytes(c["kv_cache"], before[0], "kv_cache")
        assert_same_bytes(c["kr_cache"], before[1], "kr_cache")


def test_prolog_memoised_per_tile_signature_still_checks_clip_alpha(rng):
    t, n = 2, 1
    he, hcq = 7168, 1536
    c = _prolog_case(rng, t=t, n=n)
    c.update(weight_uq_qr=ops.npu_format_cast(rng.integers(-127, 128, (hcq, n * 192)).astype(np.int8), 29),
             kv_cache=poisoned((2, 16, 1, 656), np.int8), kr_cache=np.zeros((0,), BF16),
             cache_index=np.array([3, 17], np.int64))
    kw = dict(weight_quant_mode=1, kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1,
              dequant_scale_w_uq_qr=np.full((1, n * 192), 1e-3, np.float32))
    _prolog_call(c, k_nope_clip_alpha=np.ones(1, np.float32), cache_mode="PA_BSND", **kw)
    before = c["kv_cache"].copy()
    with pytest.raises(ModeError, match="k_nope_clip_alpha"):
        _prolog_call(c, k_nope_clip_alpha=np.zeros(1, np.float32), cache_mode="PA_BSND", **kw)
    assert_same_bytes(c["kv_cache"], before, "kv_cache")
    assert he == c["token_x"].shape[1]


# ---------------------------------------------------------------------- npu_mla_preprocess
def _pre_call(case, **kw):
    return ops.npu_mla_preprocess(*case["args"].values(), **{**case["kwargs"], **kw})


def test_preprocess_memoised_signature_same_outputs_and_still_checks_values(rng):
    from tests.test_mla_preprocess import make_case

    pre_contract._VALIDATED.clear()
    c = make_case(rng, "float16", "krope_ctkv", "per_tensor_quant_asymm")
    fresh = {"args": {k: v.copy() if k.startswith("kv_cache") else v for k, v in c["args"].items()},
             "kwargs": c["kwargs"]}
    first = _pre_call(c)
    assert len(pre_contract._VALIDATED) == 1
    second = _pre_call(fresh)  # the memoised path
    assert len(pre_contract._VALIDATED) == 1
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert_same_bytes(b, a, f"output {i}")
    out = dict(q_out0=np.zeros_like(first[0]), q_out1=np.zeros_like(first[2]),
               kv_cache_out0=c["args"]["kv_cache"], kv_cache_out1=c["args"]["kv_cache_rope"])
    _pre_call(c, **out)  # out= form: memoised as its own signature
    before = [c["args"][k].copy() for k in ("kv_cache", "kv_cache_rope")]
    bad = dict(c, args=dict(c["args"], slotmapping=np.array([1, 10 ** 6, 2, 3][:c["args"]["input"].shape[0]],
                                                              np.int32)))
    with pytest.raises(IndexRangeError, match=r"slotmapping\[1\] = 1000000"):
        _pre_call(bad, **out)
    descale = c["args"]["descale0"].copy()
    descale[7] |= np.int64(1) << 40  # not an fp32's bits: high word neither 0 nor a sign extension
    with pytest.raises(FormatError, match=r"descale0\[7\]"):
        _pre_call(dict(c, args=dict(c["args"], descale0=descale)), **out)
    with pytest.raises(ShapeError, match="q_out1: expected memory separate from q_out0"):
        _pre_call(c, **dict(out, q_out1=out["q_out0"].reshape(-1)[:out["q_out1"].size].reshape(out["q_out1"].shape)))
    for k, b in zip(("kv_cache", "kv_cache_rope"), before, strict=True):
        assert_same_bytes(c["args"][k], b, k)


# ---------------------------------------------------------------------- sparse attention
def test_sparse_attention_memoised_signature_still_checks_indices(rng):
    from tests.test_sparse_flash_attention import SCALE, make_case

    sfa_contract._VALIDATED.clear()
    case = make_case(rng, quant=False, layout_query="BSND", layout_kv="PA_BSND", dtype="bfloat16", sbs=1)
    kw = dict(case["kw"], query_rope=case["query_rope"], key_rope=case["key_rope"], attention_mode=2)

    def call(idx):
        return ops.npu_sparse_flash_attention(case["query"], case["key"], case["value"], idx, SCALE, **kw)

    first = call(case["sparse_indices"])
    assert len(sfa_contract._VALIDATED) == 1
    again = call(case["sparse_indices"].copy())  # the memoised path
    assert len(sfa_contract._VALIDATED) == 1
    assert_same_bytes(again[0], first[0], "attention_out")
    bad = case["sparse_indices"].copy()
    bad.reshape(-1)[0] = 1 << 20
    with pytest.raises(IndexRangeError, match="expected a sparse block id"):
        call(bad)
    bad = case["sparse_indices"].copy()
    bad.reshape(-1)[0] = -5
    with pytest.raises(IndexRangeError, match="= -5"):
        call(bad)


# ---------------------------------------------------------------------- parallel split
def test_parallel_parts_thresholds(monkeypatch):
    monkeypatch.setattr(numba, "get_num_threads", lambda: 16)
    per = kernels.ELEMENTS_PER_PART
    assert kernels.parallel_parts(1, 576) == 1  # decode: serial
    assert kernels.parallel_parts(2, per - 1) == 1  # under two parts of work
    assert kernels.parallel_parts(3, per) == 3
    assert kernels.parallel_parts(100, per) == 16  # one per thread at most
    assert kernels.parallel_parts(4, 100 * per) == 4  # never more parts than rows


def test_prolog_parallel_split_gives_the_serial_bytes(rng, monkeypatch):
    case = _prolog_case(rng, t=3, n=2)
    serial = {k: v.copy() if k.endswith("cache") else v for k, v in case.items()}
    outs = [_prolog_call(serial, query_norm_flag=True)]
    saved = numba.get_num_threads()
    monkeypatch.setattr(kernels, "ELEMENTS_PER_PART", 1)  # every kernel split, one token per part
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        outs.append(_prolog_call(case, query_norm_flag=True))
    finally:
        numba.set_num_threads(saved)
    for a, b in zip(*outs, strict=True):
        assert_same_bytes(b, a, "parallel vs serial")
    assert_same_bytes(case["kv_cache"], serial["kv_cache"], "kv_cache")
    assert_same_bytes(case["kr_cache"], serial["kr_cache"], "kr_cache")
