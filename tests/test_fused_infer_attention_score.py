"""npu_fused_infer_attention_score / _v2 (MLA subset) against the plain dense-softmax reference in
tests/reference/fused_infer_attention.py: layouts, the three paged cache layouts (NZ included),
sparse modes, padded query rows, empty requests, the D = 128 GQA form; v1 / v2 names, the .out
forms, the torch_npu drop-in and its fake kernels; bad arguments and nothing written on
rejection; the v2 C8 decode (int8 query / NZ cache, the kernel's blocked P quantisation and fp16
staging) against its own plain-loop reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import AscendEmuError, DTypeError, IndexRangeError, ModeError, ShapeError
from tests.reference.fused_infer_attention import reference, reference_c8

BF16 = ml_dtypes.bfloat16
V2_NAMES = {"actual_seq_lengths": "actual_seq_qlen", "actual_seq_lengths_kv": "actual_seq_kvlen",
            "num_heads": "num_query_heads", "scale": "softmax_scale", "softmax_lse_flag": "return_softmax_lse"}


def _cache(logical: np.ndarray, ndim: int) -> np.ndarray:
    """``[nb, KV_N, bs, D]`` values in the layout of ``ndim``: 3 ``[nb, bs, KV_N*D]``, 4 as is,
    5 FRACTAL_NZ ``[nb, KV_N, D/C0, bs, C0]`` (C0 = 16 for 2-byte dtypes)."""
    nb, kv_n, bs, d = logical.shape
    if ndim == 3:
        return np.ascontiguousarray(logical.transpose(0, 2, 1, 3).reshape(nb, bs, kv_n * d))
    if ndim == 4:
        return np.ascontiguousarray(logical)
    return np.ascontiguousarray(logical.reshape(nb, kv_n, bs, d // 16, 16).transpose(0, 1, 3, 2, 4))


def _values(rng, shape, dtype, exact):
    if exact:  # small integers: every product and sum of the op is exact in fp32
        return rng.integers(-1, 2, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def make_case(rng, input_layout, cache_ndim, dtype, *, q_lens=(1, 1), kv_lens=(20, 7), sparse_mode=0, n=4,
              d=512, kv_n=1, block_size=16, s1=None, exact=False, paged=True):
    """``(query, key, value, kwargs)`` of one call: requests with ``q_lens`` query tokens (BSND /
    BNSD: padded to ``s1`` rows, default max) over ``kv_lens`` kv tokens in shuffled blocks."""
    b = len(q_lens)
    per_req = max(1, -(-max(kv_lens) // block_size))
    nb = b * per_req + 2
    q_layout = input_layout.split("_")[0]
    if q_layout == "TND":
        lead = (sum(q_lens), n)
    else:
        s1 = max(q_lens) if s1 is None else s1
        lead = (b, s1, n) if q_layout == "BSND" else (b, n, s1)
    query, query_rope = _values(rng, (*lead, d), dtype, exact), _values(rng, (*lead, 64), dtype, exact)
    key = _values(rng, (nb, kv_n, block_size, d), dtype, exact)
    key_rope = _values(rng, (nb, kv_n, block_size, 64), dtype, exact)
    value = key if d == 512 else _values(rng, (nb, kv_n, block_size, d), dtype, exact)
    table = rng.permutation(nb)[:b * per_req].reshape(b, per_req).astype(np.int32)
    kw = dict(query_rope=query_rope, key_rope=_cache(key_rope, cache_ndim), block_table=table,
              actual_seq_lengths_kv=list(kv_lens), num_heads=n, num_key_value_heads=kv_n,
              scale=0.0625 if exact else float(d + 64) ** -0.5, input_layout=input_layout, sparse_mode=sparse_mode,
              block_size=block_size)
    if q_layout == "TND":
        kw["actual_seq_lengths"] = np.cumsum(q_lens).tolist()
    elif list(q_lens) != [s1] * b:
        kw["actual_seq_lengths"] = list(q_lens)
    if sparse_mode == 3:
        kw["atten_mask"] = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
    if not paged:  # TND key / value / key_rope [T2, KV_N, D]: the first kv_lens[b] rows of each request's blocks
        def rows(c):
            return np.concatenate([c[table[i]].transpose(0, 2, 1, 3).reshape(-1, kv_n, c.shape[-1])[:kv_lens[i]]
                                   for i in range(b)])
        kw.update(block_table=None, block_size=0, actual_seq_lengths_kv=np.cumsum(kv_lens).tolist(),
                  key_rope=rows(key_rope))
        return query, rows(key), rows(value), kw
    k = _cache(key, cache_ndim)
    return query, k, (k if value is key else _cache(value, cache_ndim)), kw


def _ref(query, key, value, kw, **extra):
    r = {k: v for k, v in kw.items() if k not in ("query_rope", "key_rope", "block_size", "atten_mask")}
    return reference(query, key, value, kw["query_rope"], kw["key_rope"], **r, **extra)


def _ulps(dtype) -> float:
    return 2.0 ** -7 if dtype == BF16 else 2.0 ** -10


def _assert_close(got, want, dtype):
    """Within one rounding of the query dtype (the BLAS order of the score sums is the only other
    difference from the reference)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=_ulps(dtype), atol=_ulps(dtype) / 8)


def _assert_lse(got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("input_layout,q_lens", [("BNSD", (1, 1, 1)), ("BSND", (1, 1, 1)), ("BNSD_NBSD", (1, 1, 1)),
                                                 ("BSND_NBSD", (2, 1, 2)), ("TND", (1, 2, 3)), ("TND_NTD", (2, 1, 1))])
@pytest.mark.parametrize("cache_ndim", [3, 4, 5])
def test_matches_reference(rng, input_layout, q_lens, cache_ndim):
    q, k, v, kw = make_case(rng, input_layout, cache_ndim, BF16, q_lens=q_lens, kv_lens=(33, 7, 16))
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    want_out, want_lse = _ref(q, k, v, kw)
    _assert_close(out, want_out, BF16)
    _assert_lse(lse, want_lse)


@pytest.mark.parametrize("dtype", [BF16, np.float16])
@pytest.mark.parametrize("input_layout,sparse_mode", [("BNSD", 0), ("TND", 3)])
def test_exact_inputs_match_bit_for_bit_and_p_is_rounded_unnormalised(rng, dtype, input_layout, sparse_mode):
    """With exactly representable sums the only rounding left is where the kernel rounds: the
    unnormalised exp (incre_flash_attention_preload_mla.h line 2520) and the output."""
    q, k, v, kw = make_case(rng, input_layout, 4, dtype, q_lens=(3, 2, 1) if input_layout == "TND" else (1, 1, 1),
                            kv_lens=(40, 9, 25), sparse_mode=sparse_mode, n=8, exact=True)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    want_out, want_lse = _ref(q, k, v, kw)
    np.testing.assert_array_equal(out.view(np.uint16), want_out.view(np.uint16))
    np.testing.assert_array_equal(lse, want_lse)
    normalised, _ = _ref(q, k, v, kw, p_rounding="normalised")
    assert (normalised.view(np.uint16) != out.view(np.uint16)).any()  # the case tells the two readings apart


def test_causal_mode_3_is_bottom_right_aligned(rng):
    """Query token s of a request with S1 tokens sees kv positions j <= L - S1 + s."""
    q, k, v, kw = make_case(rng, "TND", 4, BF16, q_lens=(3, 2), kv_lens=(5, 2), sparse_mode=3)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    want_out, want_lse = _ref(q, k, v, kw)
    _assert_close(out, want_out, BF16)
    _assert_lse(lse, want_lse)
    # the first token of request 0 sees 3 of 5 positions: not the mode 0 result
    full, _ = _ref(q, k, v, dict(kw, sparse_mode=0))
    assert not np.array_equal(out[0].view(np.uint16), full[0].view(np.uint16))
    np.testing.assert_array_equal(out[2].view(np.uint16), full[2].view(np.uint16))  # the last sees all


def test_more_query_than_kv_tokens_gives_empty_rows(rng):
    q, k, v, kw = make_case(rng, "TND", 4, BF16, q_lens=(3,), kv_lens=(2,), sparse_mode=3)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    assert not out[0].astype(np.float32).any() and np.isposinf(lse[0]).all()  # j <= 2 - 3 + 0 < 0
    assert out[1].astype(np.float32).any() and np.isfinite(lse[1]).all()


def test_empty_request_and_padded_query_rows_are_zero(rng):
    q, k, v, kw = make_case(rng, "BSND", 3, BF16, q_lens=(2, 1, 0, 2), kv_lens=(20, 5, 9, 0), s1=2)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)  # [B, S1, N, D], [B, N, S1, 1]
    want_out, want_lse = _ref(q, k, v, kw)
    _assert_close(out, want_out, BF16)
    _assert_lse(lse, want_lse)
    assert np.abs(out[0].astype(np.float32)).sum(axis=-1).all() and np.isfinite(lse[0]).all()
    assert out[1, 0].astype(np.float32).any() and np.isfinite(lse[1, :, 0]).all()
    assert not out[1, 1].astype(np.float32).any() and np.isposinf(lse[1, :, 1]).all()  # padded query row
    assert not out[2].astype(np.float32).any() and np.isposinf(lse[2]).all()  # no query rows
    assert not out[3].astype(np.float32).any() and np.isposinf(lse[3]).all()  # kv length 0


@pytest.mark.parametrize("cache_ndim", [3, 4, 5])
def test_d128_gqa_form(rng, cache_ndim):
    """D = 128 + 64 rope with KV_N = 2 dividing N = 4 (prefill / chunked-context form)."""
    q, k, v, kw = make_case(rng, "TND", cache_ndim, np.float16, q_lens=(3, 1), kv_lens=(19, 4), sparse_mode=3,
                            d=128, kv_n=2)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    want_out, want_lse = _ref(q, k, v, kw)
    _assert_close(out, want_out, np.float16)
    _assert_lse(lse, want_lse)


@pytest.mark.parametrize("d,kv_n,sparse_mode", [(128, 2, 3), (512, 1, 0)])
def test_non_paged_tnd(rng, d, kv_n, sparse_mode):
    """Without block_table: TND key / value / key_rope [T2, KV_N, D], kv prefix sums."""
    q, k, v, kw = make_case(rng, "TND_NTD", 4, BF16, q_lens=(3, 2, 1), kv_lens=(9, 0, 4), sparse_mode=sparse_mode,
                            d=d, kv_n=kv_n, paged=False)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    want_out, want_lse = _ref(q, k, v, kw)
    _assert_close(out, want_out, BF16)
    _assert_lse(lse, want_lse)
    with pytest.raises(ShapeError, match=r"actual_seq_lengths_kv\[2\].*T=13"):
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, actual_seq_lengths_kv=[9, 9, 12]))
    with pytest.raises(ModeError, match="block_table"):
        ops.npu_fused_infer_attention_score(q[None], k, v, **dict(kw, input_layout="BSND",
                                                                 query_rope=kw["query_rope"][None]))


def test_v2_names_and_out_forms_agree_with_v1(rng):
    q, k, v, kw = make_case(rng, "BNSD", 5, BF16, q_lens=(1, 1), kv_lens=(30, 3))
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    v2 = {V2_NAMES.get(name, name): val for name, val in kw.items()}
    out2, lse2 = ops.npu_fused_infer_attention_score_v2(q, k, v, **v2, return_softmax_lse=True)
    np.testing.assert_array_equal(out2.view(np.uint16), out.view(np.uint16))
    np.testing.assert_array_equal(lse2, lse)
    ao, lo = np.zeros_like(out), np.zeros_like(lse)
    ws = ops._npu_fused_infer_attention_score_v2_get_max_workspace(q, k, v, **v2)
    got = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True, workspace=ws,
                                              attention_out=ao, softmax_lse=lo)
    assert got[0] is ao and got[1] is lo
    np.testing.assert_array_equal(ao.view(np.uint16), out.view(np.uint16))
    np.testing.assert_array_equal(lo, lse)
    no_lse = ops.npu_fused_infer_attention_score(q, k, v, **kw)[1]
    assert no_lse.shape == (0,) and no_lse.dtype == np.float32


@pytest.mark.parametrize("input_layout,sparse_mode", [("BNSD", 0), ("TND", 3)])
@pytest.mark.parametrize("tokens", [(65535, 65535), (0, 0), (-3, 7)])
def test_pre_and_next_tokens_are_ignored_by_the_emulated_modes(rng, input_layout, sparse_mode, tokens):
    """sparse_mode 0 without atten_mask and sparse_mode 3 ignore pre_tokens / next_tokens (op-plugin
    torch_npu-npu_fused_infer_attention_score_v2.md lines 332-334); op-plugin's tests pass 65535."""
    q, k, v, kw = make_case(rng, input_layout, 4, BF16, q_lens=(3, 2) if input_layout == "TND" else (1, 1),
                            kv_lens=(30, 9), sparse_mode=sparse_mode)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, pre_tokens=tokens[0], next_tokens=tokens[1],
                                                   softmax_lse_flag=True)
    want_out, want_lse = _ref(q, k, v, kw)
    _assert_close(out, want_out, BF16)
    _assert_lse(lse, want_lse)
    v2 = {V2_NAMES.get(n, n): val for n, val in kw.items()}
    out2, _ = ops.npu_fused_infer_attention_score_v2(q, k, v, **v2, pre_tokens=tokens[0], next_tokens=tokens[1])
    np.testing.assert_array_equal(out2.view(np.uint16), out.view(np.uint16))


# ---------------------------------------------------------------------- bad arguments
def _base(rng):
    return make_case(rng, "BNSD", 4, BF16, q_lens=(1, 1), kv_lens=(20, 7))


@pytest.mark.parametrize("name,value,exc", [
    ("pse_shift", np.zeros((1,), np.float32), ModeError), ("antiquant_scale", np.ones(1, np.float32), ModeError),
    ("antiquant_mode", 1, ModeError), ("key_antiquant_mode", 1, ModeError), ("quant_scale2", np.ones(1), ModeError),
    ("query_padding_size", np.zeros(1, np.int64), ModeError), ("kv_padding_size", np.zeros(1, np.int64), ModeError),
    ("key_shared_prefix", np.zeros(1), ModeError), ("actual_shared_prefix_len", [1], ModeError),
    ("inner_precise", 1, ModeError), ("sparse_mode", 1, ModeError), ("pre_tokens", 1.5, DTypeError),
    ("next_tokens", None, DTypeError),
    ("input_layout", "BSH", ModeError), ("num_key_value_heads", 2, ShapeError), ("num_heads", 8, ShapeError),
    ("block_size", 32, ShapeError), ("scale", float("nan"), DTypeError), ("query_rope", None, ShapeError),
    ("atten_mask", np.triu(np.ones((2048, 2048), bool), 1), ModeError),
])
def test_rejected_arguments_are_named(rng, name, value, exc):
    q, k, v, kw = _base(rng)
    # Our own error class only: Python's "unexpected keyword argument 'name'" (a TypeError) or a
    # NumPy ValueError quoting the name would match the text but not the contract.
    with pytest.raises(exc, match=name) as info:
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, **{name: value}))
    assert isinstance(info.value, AscendEmuError), info.value
    assert "unexpected keyword" not in str(info.value)


@pytest.mark.parametrize("name,value", [("learnable_sink", np.zeros(4, np.float32)), ("query_quant_mode", 3),
                                        ("dequant_scale_query", np.ones(1, np.float32)), ("out_dtype", 1)])
def test_v2_rejected_arguments_are_named(rng, name, value):
    q, k, v, kw = _base(rng)
    v2 = {V2_NAMES.get(n, n): val for n, val in kw.items()}
    with pytest.raises(ModeError, match=name):
        ops.npu_fused_infer_attention_score_v2(q, k, v, **v2, **{name: value})


def test_index_and_length_errors_name_their_argument_and_write_nothing(rng):
    q, k, v, kw = _base(rng)
    ao, lo = np.full((2, 4, 1, 512), 7, BF16), np.full((2, 4, 1, 1), 7, np.float32)
    out = dict(attention_out=ao, softmax_lse=lo, softmax_lse_flag=True)
    bad_table = kw["block_table"].copy()
    bad_table[1, 0] = k.shape[0]  # needed by request 1 (7 tokens)
    with pytest.raises(IndexRangeError, match=r"block_table\[1, 0\]"):
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, block_table=bad_table), **out)
    cap = kw["block_table"].shape[1] * 16
    with pytest.raises(ShapeError, match=r"actual_seq_lengths_kv\[0\].*\[0, %d\]" % cap):
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, actual_seq_lengths_kv=[cap + 1, 7]), **out)
    with pytest.raises(ShapeError, match="actual_seq_lengths_kv"):
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, actual_seq_lengths_kv=[3]), **out)
    with pytest.raises(ShapeError, match="attention_out"):
        ops.npu_fused_infer_attention_score(q, k, v, **kw, attention_out=ao[:1], softmax_lse=lo, softmax_lse_flag=True)
    assert (ao.astype(np.float32) == 7).all() and (lo == 7).all()
    tq, tk, tv, tkw = make_case(rng, "TND", 4, BF16, q_lens=(2, 1), kv_lens=(5, 5))
    with pytest.raises(ShapeError, match=r"actual_seq_lengths\[1\].*T=3"):
        ops.npu_fused_infer_attention_score(tq, tk, tv, **dict(tkw, actual_seq_lengths=[2, 4]))
    with pytest.raises(ShapeError, match="actual_seq_lengths"):
        ops.npu_fused_infer_attention_score(tq, tk, tv, **dict(tkw, actual_seq_lengths=None))
    with pytest.raises(ModeError, match="atten_mask"):
        ops.npu_fused_infer_attention_score(tq, tk, tv, **dict(tkw, sparse_mode=3,
                                                               atten_mask=np.zeros((2048, 2048), bool)))


# ---------------------------------------------------------------------- v2 C8 decode
def make_c8_case(rng, input_layout, cache_ndim, *, q_lens=(1, 1), kv_lens=(600, 37), n=4, block_size=128,
                 sparse_mode=0):
    """``(query, cache, kwargs)`` of a v2 C8 call as vllm-ascend makes it: int8 query, int8 ckv
    cache passed as key and value (NZ ``[nb, 1, 16, bs, 32]`` for ``cache_ndim`` 5), bf16 rope
    (NZ C0 = 16), fp32 per-token-head query scales, one fp32 per-tensor kv scale."""
    b = len(q_lens)
    per_req = max(1, -(-max(kv_lens) // block_size))
    nb = b * per_req + 2
    q_layout = input_layout.split("_")[0]
    if q_layout == "TND":
        lead = (sum(q_lens), n)
    else:
        s1 = max(q_lens)
        lead = (b, s1, n) if q_layout == "BSND" else (b, n, s1)
    query = rng.integers(-127, 128, (*lead, 512)).astype(np.int8)
    query_rope = (rng.standard_normal((*lead, 64)) * 0.05).astype(BF16)  # pre-divided by qs * ks (the prolog's)
    ckv = rng.integers(-127, 128, (nb, 1, block_size, 512)).astype(np.int8)  # [nb, 1, bs, 512]
    kr = (rng.standard_normal((nb, 1, block_size, 64)) * 0.05).astype(BF16)  # [nb, 1, bs, 64]
    table = rng.permutation(nb)[:b * per_req].reshape(b, per_req).astype(np.int32)

    def lay(x, c0):
        if cache_ndim == 5:
            return np.ascontiguousarray(x.reshape(nb, 1, block_size, x.shape[-1] // c0, c0).transpose(0, 1, 3, 2, 4))
        return _cache(x, cache_ndim)

    kw = dict(query_rope=query_rope, key_rope=lay(kr, 16), block_table=table, actual_seq_kvlen=list(kv_lens),
              num_query_heads=n, num_key_value_heads=1, softmax_scale=576 ** -0.5, input_layout=input_layout,
              sparse_mode=sparse_mode, block_size=block_size, query_quant_mode=3, key_quant_mode=0,
              value_quant_mode=0, dequant_scale_query=(rng.random(lead) * 0.01 + 0.001).astype(np.float32),
              dequant_scale_key=np.array([0.02], np.float32), dequant_scale_value=np.array([0.02], np.float32))
    if q_layout == "TND":
        kw["actual_seq_qlen"] = np.cumsum(q_lens).tolist()
    if sparse_mode == 3:
        kw["atten_mask"] = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
    return query, lay(ckv, 32), kw


def _ref_c8(query, cache, kw, **over):
    kw = dict(kw, **over)
    return reference_c8(query, cache, cache, kw["query_rope"], kw["key_rope"], kw["dequant_scale_query"],
                        kw["dequant_scale_key"], kw["dequant_scale_value"], block_table=kw["block_table"],
                        actual_seq_lengths_kv=kw["actual_seq_kvlen"], num_heads=kw["num_query_heads"],
                        scale=kw["softmax_scale"], input_layout=kw["input_layout"],
                        actual_seq_lengths=kw.get("actual_seq_qlen"), sparse_mode=kw["sparse_mode"])


@pytest.mark.parametrize("input_layout,cache_ndim,q_lens,sparse_mode", [
    ("BSND_NBSD", 5, (1, 1), 0),  # vllm-ascend's A2 / A3 C8 decode: NZ int8 ckv cache
    ("TND_NTD", 5, (2, 1), 3),  # its spec decode: two query tokens of request 0, causal
    ("BNSD", 4, (1, 1), 0), ("BSND", 3, (1, 1), 0)])
def test_c8_matches_reference_bit_for_bit(rng, input_layout, cache_ndim, q_lens, sparse_mode):
    q, cache, kw = make_c8_case(rng, input_layout, cache_ndim, q_lens=q_lens, sparse_mode=sparse_mode)
    out, lse = ops.npu_fused_infer_attention_score_v2(q, cache, cache, **kw, return_softmax_lse=True)
    want_out, want_lse = _ref_c8(q, cache, kw)
    assert out.dtype == BF16 and out.shape == want_out.shape
    np.testing.assert_array_equal(out.view(np.uint16), want_out.view(np.uint16))
    # lse bit for bit: both round a float64 exp (within a few float64 ulps of each other) to fp32,
    # so a tolerance (rtol 1e-6 is ~13 fp32 ulps) would only hide a 1-ulp defect
    np.testing.assert_array_equal(lse.view(np.uint32), want_lse.view(np.uint32))


def _at_1_and_2_threads(monkeypatch, call):
    """``(splits, outputs)``: ``call()`` (returning ``(out, lse)``) at 1 then 2 Numba threads, the
    ``(units, threads)`` each FIA call gave ``side_by_side`` and the output bytes of each."""
    import numba

    from ascend_emu.emu import fused_infer_attention_score as fia

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one Numba thread available")
    splits, got = [], []
    side_by_side = fia.side_by_side

    def recording(fn, items, threads, costs):
        splits.append((len(items), threads))
        side_by_side(fn, items, threads, costs)

    monkeypatch.setattr(fia, "side_by_side", recording)
    before = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            out, lse = call()
            got.append(out.view(np.uint16).tobytes() + lse.tobytes())
    finally:
        numba.set_num_threads(before)
    return splits, got


@pytest.mark.parametrize("cache_ndim", [4, 5])
def test_requests_side_by_side_give_the_bytes_of_one_thread(rng, monkeypatch, cache_ndim):
    """bf16 decode: with 2 Numba threads the (request, kv head) units run side by side in two
    Python threads, each with its own buffers; the bytes of one thread's run."""
    q, k, v, kw = make_case(rng, "TND", cache_ndim, BF16, q_lens=(1, 2, 3), kv_lens=(33, 7, 16))
    splits, got = _at_1_and_2_threads(
        monkeypatch, lambda: ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True))
    units = splits[0][0]
    assert splits == [(units, 1), (units, 2)] and units >= 2
    assert got[0] == got[1]


def test_c8_requests_side_by_side_give_the_bytes_of_one_thread(rng, monkeypatch):
    """With 2 Numba threads the decode's requests (small products) run side by side in two Python
    threads; the outputs are the bytes of one thread's run and of the reference."""
    q, cache, kw = make_c8_case(rng, "BSND_NBSD", 5, q_lens=(1, 1, 1), kv_lens=(600, 37, 300), sparse_mode=0)
    splits, got = _at_1_and_2_threads(
        monkeypatch, lambda: ops.npu_fused_infer_attention_score_v2(q, cache, cache, **kw, return_softmax_lse=True))
    assert splits == [(3, 1), (3, 2)]
    assert got[0] == got[1]
    out = ops.npu_fused_infer_attention_score_v2(q, cache, cache, **kw)[0]
    np.testing.assert_array_equal(out.view(np.uint16), _ref_c8(q, cache, kw)[0].view(np.uint16))


def _c8_scores(q, cache, kw, b, head):
    """Float64 scores of query head ``head`` of request ``b`` (BSND, q_len 1, 4-D cache) over its
    kv positions: the test data's own check, independent of the op and of the reference's rounding."""
    kv_len = kw["actual_seq_kvlen"][b]
    rows = cache[kw["block_table"][b]].reshape(-1, 512)[:kv_len].astype(np.float64)  # [L, 512]
    rope = kw["key_rope"][kw["block_table"][b]].reshape(-1, 64)[:kv_len].astype(np.float64)
    deq = float(kw["dequant_scale_query"][b, 0, head]) * float(kw["dequant_scale_key"][0]) * kw["softmax_scale"]
    return (rows @ q[b, 0, head].astype(np.float64) + rope @ kw["query_rope"][b, 0, head].astype(np.float64)) * deq


def _c8_multi_block_case(rng):
    """A C8 decode over three 512-position blocks (kv lengths 1100 and 37) whose key rows are
    planted so that, per query head of request 0:

    - head 0: the running max rises in block 1 by about 11 (rescale factor ~1e-5, not 1);
    - head 1: it rises in block 1 and again in block 2;
    - head 2: its max (~3000) is in block 0 and blocks 1 and 2 underflow entirely (every
      ``exp(S - m)`` is 0 in fp32: the P quant divides by ``0 + FLOAT_EPS``);
    - head 3: its max is in block 0 and block 2's own max sits ~15 below it (``maxP`` ~3e-7, a
      subnormal in fp16: the block still adds to the output).
    """
    q, cache, kw = make_c8_case(rng, "BSND", 4, q_lens=(1, 1), kv_lens=(1100, 37), n=4)
    table, ks, scale = kw["block_table"], float(kw["dequant_scale_key"][0]), kw["softmax_scale"]

    def put(pos, row):
        cache[table[0, pos // 128], 0, pos % 128] = row

    def partial(head, drop):  # q with its largest entries zeroed until the dot falls by ~drop
        row = q[0, 0, head].copy()
        for i in np.argsort(-np.abs(row.astype(np.int64))):
            if int(q[0, 0, head].astype(np.int64) @ (q[0, 0, head] - row).astype(np.int64)) >= drop:
                break
            row[i] = 0
        return row

    self_dot = [float(q[0, 0, h].astype(np.int64) @ q[0, 0, h].astype(np.int64)) for h in range(4)]
    qs = kw["dequant_scale_query"]
    for head, top in enumerate((12.0, 20.0, 3000.0, 3000.0)):  # the planted max score of each head
        qs[0, 0, head] = np.float32(top / (self_dot[head] * ks * scale))
    put(700, q[0, 0, 0])
    put(600, partial(1, self_dot[1] * 0.4))
    put(1050, q[0, 0, 1])
    put(100, q[0, 0, 2])
    put(50, q[0, 0, 3])
    put(1080, partial(3, 15.0 / (float(qs[0, 0, 3]) * ks * scale)))
    blocks = [slice(0, 512), slice(512, 1024), slice(1024, 1100)]
    s = [_c8_scores(q, cache, kw, 0, h) for h in range(4)]
    peaks = [[float(x[blk].max()) for blk in blocks] for x in s]
    assert peaks[0][0] + 8 < peaks[0][1] > peaks[0][2]
    assert peaks[1][0] < peaks[1][1] < peaks[1][2] and peaks[1][1] - peaks[1][0] > 2
    assert max(peaks[2][1:]) < peaks[2][0] - 110  # exp(-110) is 0 in fp32
    assert 14 < peaks[3][0] - peaks[3][2] < 17 and peaks[3][1] < peaks[3][0] - 110
    return q, cache, kw


def test_c8_online_softmax_across_blocks_is_bit_exact(rng):
    """The running max rising in a later block (the rescale of the running sum and of the fp16
    accumulator), blocks whose exp underflows to 0 (finite output, no exception) and a block of
    tiny maxP: output and lse bit for bit against the reference, lse included (the fp32 exp of
    both is of a float64 exp within a few float64 ulps, so it rounds alike).

    FLOAT_EPS: in a block whose every ``exp(S - m)`` underflows (head 2's blocks 1 and 2),
    ``maxP = 0 + FLOAT_EPS`` keeps the P quant's ``127 / maxP`` finite; without eps it is
    ``0 * inf`` there, and this test fails. Another small eps (1e-12, say) is not told apart by
    any input found: eps moves the fp32 ``maxP`` only where ``exp(local max - m) < 2**24 * eps``,
    so that block's staged ``P @ V`` is scaled by ``fp16(maxP)``, at most a few fp16 subnormal
    steps, while the block holding the max stages with ``maxP >= 1``; a P code that eps flips
    moves the small block's staged value by about ``127 / 1024 * fp16(maxP)``, below the fp16
    spacing of the accumulator it is added to (and ``l``, the sum of the exps, has no eps). Not
    strictly equivalent: a row whose max block stages near 0 (a separate value cache with zero
    rows there) might show it; not constructed here."""
    q, cache, kw = _c8_multi_block_case(rng)
    out, lse = ops.npu_fused_infer_attention_score_v2(q, cache, cache, **kw, return_softmax_lse=True)
    want_out, want_lse = _ref_c8(q, cache, kw)
    assert np.isfinite(out.astype(np.float32)).all() and np.isfinite(lse).all()
    np.testing.assert_array_equal(out.view(np.uint16), want_out.view(np.uint16))
    np.testing.assert_array_equal(lse.view(np.uint32), want_lse.view(np.uint32))


def test_c8_value_and_key_scales_are_bit_exact(rng):
    """The per-tensor scales' fp32 chains: ``fp32(fp32(qs * ks) * scale)`` (not ``qs * (ks *
    scale)``) and ``vs * fp32(1 / 127)`` (not ``vs / 127``). Each order differs from the other by
    one fp32 ulp for some scales only (about 4% of value scales), and a 1-ulp change of the value
    scale shows in a bf16 output only where the product sits next to a bf16 rounding boundary
    (about 2**-16 of them): so two value scales that do differ, 8 requests x 128 heads x 512
    outputs each, and the lse bit for bit (the query scales' order moves every score)."""
    grid = [np.float32(0.0125 + i * 1e-4) for i in range(400)]
    differ = [v for v in grid if np.float32(v / np.float32(127)) != np.float32(v * np.float32(1 / 127))]
    kv_lens = (37, 5, 64, 1, 17, 40, 3, 23)
    q, cache, kw = make_c8_case(rng, "BSND", 4, q_lens=(1,) * 8, kv_lens=kv_lens, n=128, block_size=16)
    for vs in differ[:2]:
        kw["dequant_scale_value"] = np.array([vs], np.float32)
        out, lse = ops.npu_fused_infer_attention_score_v2(q, cache, cache, **kw, return_softmax_lse=True)
        want_out, want_lse = _ref_c8(q, cache, kw)
        np.testing.assert_array_equal(out.view(np.uint16), want_out.view(np.uint16))
        np.testing.assert_array_equal(lse.view(np.uint32), want_lse.view(np.uint32))


def test_c8_is_close_to_the_dequantised_float_attention(rng):
    """The chain's scales are the kernel's: the int8 result stays within ~2% of softmax(dequantised
    scores) @ dequantised values (the P and fp16 staging quantisation is the only loss)."""
    q, cache, kw = make_c8_case(rng, "BSND", 4, q_lens=(1,), kv_lens=(700,), n=2)
    out, _ = ops.npu_fused_infer_attention_score_v2(q, cache, cache, **kw)
    logical = cache[kw["block_table"][0]].reshape(-1, 512)[:700].astype(np.float64)  # [L, 512]
    krope = kw["key_rope"][kw["block_table"][0]].reshape(-1, 64)[:700].astype(np.float64)  # [L, 64]
    ks = float(kw["dequant_scale_key"][0])
    for h in range(2):
        qs = float(kw["dequant_scale_query"][0, 0, h])
        s = (logical @ q[0, 0, h].astype(np.float64) + krope @ kw["query_rope"][0, 0, h].astype(np.float64)) \
            * qs * ks * kw["softmax_scale"]
        p = np.exp(s - s.max())
        want = (p / p.sum()) @ logical * float(kw["dequant_scale_value"][0])
        np.testing.assert_allclose(out[0, 0, h].astype(np.float64), want, atol=0.02 * np.abs(want).max())


def test_c8_errors_name_their_argument_and_write_nothing(rng):
    q, cache, kw = make_c8_case(rng, "BSND_NBSD", 5, kv_lens=(40, 7))
    ao, lo = np.full((4, 2, 1, 512), 7, BF16), np.full((2, 4, 1, 1), 7, np.float32)
    out = dict(attention_out=ao, softmax_lse=lo, return_softmax_lse=True)
    bad = [(dict(query_quant_mode=0), ModeError, "query_quant_mode"),
           (dict(key_quant_mode=1), ModeError, "key_quant_mode"),
           (dict(dequant_scale_key=None), ShapeError, "dequant_scale_key"),
           (dict(dequant_scale_value=np.ones(2, np.float32)), ShapeError, "dequant_scale_value"),
           (dict(dequant_scale_query=kw["dequant_scale_query"][..., None]), ShapeError, "dequant_scale_query"),
           (dict(dequant_scale_query=kw["dequant_scale_query"].astype(np.float16)), DTypeError, "dequant_scale_query"),
           (dict(query_rope=kw["query_rope"].astype(np.float16)), DTypeError, "query_rope"),
           (dict(dequant_offset_key=np.zeros(1, np.float32)), ModeError, "dequant_offset_key"),
           (dict(quant_scale_p=np.ones(1, np.float32)), ModeError, "quant_scale_p"),
           (dict(actual_seq_kvlen=[40, 300]), ShapeError, r"actual_seq_kvlen\[1\]")]
    for over, exc, name in bad:
        with pytest.raises(exc, match=name):
            ops.npu_fused_infer_attention_score_v2(q, cache, cache, **dict(kw, **over), **out)
    with pytest.raises(DTypeError, match="key"):
        ops.npu_fused_infer_attention_score_v2(q, cache.view(np.uint8), cache, **kw, **out)
    with pytest.raises(ShapeError, match="query"):  # C8 is D = 512 only
        ops.npu_fused_infer_attention_score_v2(q[..., :128], cache, cache, **kw, **out)
    with pytest.raises(ModeError, match="query_quant_mode"):  # mode 3 needs an int8 query
        ops.npu_fused_infer_attention_score_v2(q.astype(BF16), cache, cache, **kw, **out)
    assert (ao.astype(np.float32) == 7).all() and (lo == 7).all()


# ---------------------------------------------------------------------- torch_npu drop-in
torch = pytest.importorskip("torch")


def _t(x):
    from ascend_emu.torch_npu import to_torch

    return to_torch(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x


@pytest.mark.parametrize("input_layout,cache_ndim", [("BNSD", 4), ("BSND_NBSD", 5), ("TND_NTD", 3)])
def test_drop_in_matches_ops_and_fake_shapes(rng, input_layout, cache_ndim):
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu import to_numpy

    q, k, v, kw = make_case(rng, input_layout, cache_ndim, BF16, q_lens=(2, 1), kv_lens=(18, 5), sparse_mode=3)
    want_out, want_lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    tkw = {name: _t(val) for name, val in kw.items()}
    tq, tk = _t(q), _t(k)
    out, lse = torch_npu.npu_fused_infer_attention_score(tq, tk, tk, **tkw, softmax_lse_flag=True)
    np.testing.assert_array_equal(to_numpy(out).view(np.uint16), want_out.view(np.uint16))
    np.testing.assert_array_equal(to_numpy(lse), want_lse)
    v2 = {V2_NAMES.get(n, n): val for n, val in tkw.items()}
    out2, _ = torch_npu.npu_fused_infer_attention_score_v2(tq, tk, tk, **v2)
    assert torch.equal(out2, out)
    ws = torch_npu._npu_fused_infer_attention_score_get_max_workspace(tq, tk, tk, **tkw)
    ao, lo = torch.empty_like(out), torch.empty_like(lse)
    got = torch_npu.npu_fused_infer_attention_score.out(tq, tk, tk, **tkw, softmax_lse_flag=True, workspace=ws,
                                                        out=[ao, lo])
    assert got[0] is ao and torch.equal(ao, out) and torch.equal(lo, lse)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fk = {n: mode.from_tensor(val) if isinstance(val, torch.Tensor) else val for n, val in tkw.items()}
        f_out, f_lse = torch.ops.npu.npu_fused_infer_attention_score(mode.from_tensor(tq), mode.from_tensor(tk),
                                                                     mode.from_tensor(tk), **fk, softmax_lse_flag=True)
        f2_out, f2_lse = torch.ops.npu.npu_fused_infer_attention_score_v2(
            mode.from_tensor(tq), mode.from_tensor(tk), mode.from_tensor(tk),
            **{V2_NAMES.get(n, n): val for n, val in fk.items()})
    assert (f_out.shape, f_out.dtype, f_lse.shape, f_lse.dtype) == (out.shape, out.dtype, lse.shape, lse.dtype)
    assert (f2_out.shape, f2_lse.shape) == (out.shape, (0,))


def test_drop_in_rejects_by_name(rng):
    import ascend_emu.torch_npu as torch_npu

    q, k, v, kw = _base(rng)
    tkw = {name: _t(val) for name, val in kw.items()}
    with pytest.raises(ModeError, match="pse_shift"):
        torch_npu.npu_fused_infer_attention_score(_t(q), _t(k), _t(k), **tkw, pse_shift=torch.zeros(1))
    with pytest.raises(ModeError, match="learnable_sink"):
        torch_npu.npu_fused_infer_attention_score_v2(_t(q), _t(k), _t(k), **{V2_NAMES.get(n, n): val for n, val
                                                                            in tkw.items()},
                                                     learnable_sink=torch.zeros(4))


def test_checked_mode_names_an_unwritten_kv_slot_and_allows_empty_rows(rng):
    import ascend_emu
    from ascend_emu import checked_mode
    from ascend_emu.errors import UninitializedReadError

    q, k, v, kw = make_case(rng, "BNSD", 4, BF16, q_lens=(1, 1), kv_lens=(20, 0))
    checked_mode.reset()
    try:
        nb, bs = k.shape[0], 16
        table = kw["block_table"]
        checked_mode.mark_written(k, [table[0, p // bs] * bs + p % bs for p in range(20) if p != 17], nb * bs)
        checked_mode.mark_written(kw["key_rope"], None, nb * bs)
        with ascend_emu.checked(), pytest.raises(UninitializedReadError,
                                                 match=r"key read before written: request 0, kv token 17"):
            ops.npu_fused_infer_attention_score(q, k, v, **kw)
        checked_mode.mark_written(k, None, nb * bs)
        with ascend_emu.checked():  # request 1 (kv length 0): lse +inf is not an error
            out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
        assert np.isposinf(lse[1]).all()
    finally:
        checked_mode.reset()


def test_drop_in_c8_decode_as_vllm_ascend_calls_it(rng):
    """vllm-ascend's A2 / A3 C8 decode call (``mla_v1.py`` ``_forward_decode``, ``fa_quant_layer``):
    BSND_NBSD, int8 NZ ckv cache as key and value, bf16 NZ rope, eager and ``.out`` with the v2
    workspace query, and the fake kernel's bf16 output."""
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu import to_numpy

    q, cache, kw = make_c8_case(rng, "BSND_NBSD", 5, kv_lens=(40, 7))
    want, _ = ops.npu_fused_infer_attention_score_v2(q, cache, cache, **kw)
    tkw = {name: _t(val) for name, val in kw.items()}
    tq, tc = _t(q), _t(cache)
    out, _ = torch_npu.npu_fused_infer_attention_score_v2(tq, tc, tc, **tkw)
    assert out.dtype == torch.bfloat16
    np.testing.assert_array_equal(to_numpy(out).view(np.uint16), want.view(np.uint16))
    ws = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(tq, tc, tc, **tkw)
    ao, lo = torch.empty_like(out), torch.empty(2, dtype=torch.bfloat16)
    torch_npu.npu_fused_infer_attention_score_v2.out(tq, tc, tc, **tkw, workspace=ws, out=[ao, lo])
    assert torch.equal(ao, out)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fk = {n: mode.from_tensor(val) if isinstance(val, torch.Tensor) else val for n, val in tkw.items()}
        f_out, _ = torch.ops.npu.npu_fused_infer_attention_score_v2(mode.from_tensor(tq), mode.from_tensor(tc),
                                                                    mode.from_tensor(tc), **fk)
    assert (f_out.shape, f_out.dtype) == (out.shape, out.dtype)


def test_branch_free_f16_rounding_matches_numpy():
    """The C8 path's vectorizable fp16 rounding against NumPy's astype(float16) (RNE, subnormals,
    overflow, signed zeros, inf / NaN) on random fp32 bit patterns and the edge values."""
    from numba import njit

    from ascend_emu.quant.rounding import f32_round_f16 as _f16

    @njit
    def run(x, out):
        for i in range(x.size):
            out[i] = _f16(x[i])

    rng = np.random.default_rng(5)
    edges = np.array([65504, 65519.996, 65520, 65536, -0.0, 0.0, np.inf, -np.inf, np.nan, 2.0 ** -25, 1.5 * 2.0 ** -24,
                      2.0 ** -14 * (1 - 2.0 ** -12), 1.0009765625, 1.00146484375, -1.00146484375], np.float32)
    x = np.concatenate([rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        (rng.random(50_000) * 2.0 ** -13).astype(np.float32), edges])
    got = np.empty_like(x)
    run(x, got)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_one_rope_argument_alone_names_the_other_and_the_no_rope_tnd_form_is_mha(rng):
    """query_rope without key_rope (or the reverse) names the missing one; without both the call
    is the MHA / GQA form: vllm-ascend's TND prefill with D = 192 (nope and rope concatenated by
    the caller) gives the attention of the rope form."""
    q, k, v, kw = _base(rng)  # BNSD decode over a paged cache
    with pytest.raises(AscendEmuError, match="query_rope"):
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, query_rope=None))
    with pytest.raises(AscendEmuError, match="key_rope"):
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, key_rope=None))
    tq, tk, tv, tkw = make_case(rng, "TND", 4, BF16, d=128, kv_n=4, q_lens=(2, 1), kv_lens=(2, 3), paged=False)
    q192 = np.concatenate([tq, tkw["query_rope"]], axis=-1)  # [T, N, 192]
    k192 = np.concatenate([tk, tkw["key_rope"]], axis=-1)
    no_rope = dict(tkw, query_rope=None, key_rope=None)
    out, _ = ops.npu_fused_infer_attention_score(q192, k192, tv, **no_rope)
    want, _ = ops.npu_fused_infer_attention_score(tq, tk, tv, **tkw)
    assert out.shape == want.shape == (3, 4, 128)
    _assert_close(out, want, BF16)  # the same attention, the rope part concatenated by the caller
    with pytest.raises(ShapeError, match="value"):  # (Q_D, V_D) = (192, 64): not a TND pair
        ops.npu_fused_infer_attention_score(q192, k192, np.ascontiguousarray(tv[..., :64]), **no_rope)


@pytest.mark.parametrize("layout", ["PA_BSH", "PA_BNSD", "PA_NZ"])
def test_contract_describes_the_caches_and_the_blocks_read(rng, layout):
    """The contract describes each paged cache with a CacheLayout (torch_npu's PA_BNSD is head-major)
    and hands the backend the block ids the lengths need; the emu gather reads, through them, the
    rows that plain indexing of the cache by (block, head, row) gives."""
    from ascend_emu.emu.fused_infer_attention_score import _gather
    from ascend_emu.ops._fused_infer_attention_args import _cache_layout

    nb, bs, kv_n, d = 6, 16, 2, 32
    shape = {"PA_BSH": (nb, bs, kv_n * d), "PA_BNSD": (nb, kv_n, bs, d), "PA_NZ": (nb, kv_n, d // 16, bs, 16)}[layout]
    cache = rng.standard_normal(shape).astype(BF16)
    if layout == "PA_BSH":
        plain = cache.reshape(nb, bs, kv_n, d).transpose(2, 0, 1, 3)  # [KV_N, nb, bs, D]
    elif layout == "PA_BNSD":
        plain = cache.transpose(1, 0, 2, 3)
    else:
        plain = cache.transpose(1, 0, 3, 2, 4).reshape(kv_n, nb, bs, d)
    lay = _cache_layout(cache, "key", None, kv_n)
    assert (lay.num_blocks, lay.block_size, lay.heads, lay.dim) == (nb, bs, kv_n, d)
    assert lay.head_major == (layout != "PA_BSH") and lay.mode == {"PA_BSH": "PA_BSND"}.get(layout, layout)

    class Args:  # the one field _gather reads: paged
        kv_blocks = np.zeros((1, 1))

    table = np.array([4, 1, 5])
    for h in range(kv_n):
        want = plain[h, table].reshape(-1, d)[:40]  # 40 kv tokens through 3 blocks
        got = _gather(Args, cache, lay, table, 40, h)
        assert got.dtype == np.float32 and np.array_equal(got, want.astype(np.float32))
        assert np.array_equal(_gather(Args, cache, lay, table, 40, h, widen=False).view(np.uint16),
                              want.view(np.uint16))
