"""npu_fused_infer_attention_score / _v2, the MHA / GQA form (no rope), against the plain-loop
reference ``reference_mha`` in tests/reference/fused_infer_attention.py: every input_layout,
prefill and decode, GQA, dense and paged key / value, softmax_lse, the sparse modes and explicit
masks, ``actual_seq_lengths`` rules, v2 ``learnable_sink``, the ``.out`` / workspace forms and the
torch_npu drop-in (calls shaped as op-plugin's FIA tests make them); rejected calls name the
argument and write nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import AscendEmuError, IndexRangeError, InputContractWarning, ModeError, ShapeError
from tests.reference.fused_infer_attention import reference_mha

BF16 = ml_dtypes.bfloat16
V2 = {"actual_seq_lengths": "actual_seq_qlen", "actual_seq_lengths_kv": "actual_seq_kvlen",
      "num_heads": "num_query_heads", "scale": "softmax_scale", "softmax_lse_flag": "return_softmax_lse"}


def _vals(rng, shape, dtype, exact):
    if exact:  # small integers: every product and sum is exact in fp32, the BLAS order cannot matter
        return rng.integers(-1, 2, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _lay(x, layout):
    """Logical ``[B, S, N, D]`` -> the layout's array (BSH, BSND, BNSD, NSD: B = 1)."""
    if layout == "BSH":
        return np.ascontiguousarray(x.reshape(x.shape[0], x.shape[1], -1))
    if layout == "BNSD":
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    if layout == "NSD":
        return np.ascontiguousarray(x[0].transpose(1, 0, 2))
    return np.ascontiguousarray(x)


def make_dense(rng, input_layout, *, b=2, s1=3, s2=9, n=4, kv_n=2, d=32, dv=None, dtype=np.float16, exact=False,
               q_lens=None, kv_lens=None):
    """``(query, key, value, kwargs)``: B-first layouts padded to S1 / S2 (lengths optional);
    TND / NTD packed by the lengths (default S1 / S2 each)."""
    dv = d if dv is None else dv
    q_layout = input_layout.split("_")[0]
    scale = 0.125 if exact else d ** -0.5
    kw = dict(num_heads=n, num_key_value_heads=kv_n, scale=scale, input_layout=input_layout)
    if q_layout in ("TND", "NTD"):
        q_lens = q_lens or [s1] * b
        kv_lens = kv_lens or [s2] * b
        q = _vals(rng, (sum(q_lens), n, d), dtype, exact)
        k = _vals(rng, (sum(kv_lens), kv_n, d), dtype, exact)
        v = _vals(rng, (sum(kv_lens), kv_n, dv), dtype, exact)
        if q_layout == "NTD":
            q, k, v = (np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (q, k, v))
        kw.update(actual_seq_lengths=np.cumsum(q_lens).tolist(), actual_seq_lengths_kv=np.cumsum(kv_lens).tolist())
        return q, k, v, kw
    q = _vals(rng, (b, s1, n, d), dtype, exact)
    k = _vals(rng, (b, s2, kv_n, d), dtype, exact)
    v = _vals(rng, (b, s2, kv_n, dv), dtype, exact)
    if q_lens is not None:
        kw["actual_seq_lengths"] = list(q_lens)
    if kv_lens is not None:
        kw["actual_seq_lengths_kv"] = list(kv_lens)
    return _lay(q, q_layout), _lay(k, q_layout), _lay(v, q_layout), kw


def _ref(q, k, v, kw, **extra):
    return reference_mha(q, k, v, **{**kw, **extra})


def _close(got, want, dtype, exact=False):
    assert got.shape == want.shape and got.dtype == want.dtype
    if exact:
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
        return
    ulp = 2.0 ** -7 if dtype == BF16 else 2.0 ** -10
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=ulp, atol=ulp / 8)


def _close_lse(got, want):
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-6, atol=1e-6)


LAYOUTS = ["BSH", "BSND", "BNSD", "BNSD_BSND", "BSH_BNSD", "BSND_BNSD", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD"]


@pytest.mark.parametrize("input_layout", LAYOUTS)
@pytest.mark.parametrize("s1", [1, 4])
def test_b_first_layouts_match_the_reference_bit_for_bit(rng, input_layout, s1):
    """Exact inputs: prefill (S1 = 4) and decode (S1 = 1), GQA (N = 4 over KV_N = 2), lse. BNSD_BSND
    and BNSD_NBSD take Q_S > 1 only on A2 / A3 (the layout table)."""
    q, k, v, kw = make_dense(rng, input_layout, s1=s1, exact=True)
    if s1 == 1 and input_layout in ("BNSD_BSND", "BNSD_NBSD"):
        with pytest.raises(ShapeError, match="query"):
            ops.npu_fused_infer_attention_score(q, k, v, **kw)
        return
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    want, want_lse = _ref(q, k, v, kw)
    _close(out, want, np.float16, exact=True)
    _close_lse(lse, want_lse)


@pytest.mark.parametrize("input_layout", ["TND", "NTD", "TND_NTD", "NTD_TND"])
@pytest.mark.parametrize("dims", [(128, 128), (192, 128)])
def test_packed_layouts_match_the_reference(rng, input_layout, dims):
    d, dv = dims
    q, k, v, kw = make_dense(rng, input_layout, d=d, dv=dv, dtype=BF16, q_lens=[3, 1, 2], kv_lens=[5, 9, 2], b=3)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, sparse_mode=3, softmax_lse_flag=True)
    want, want_lse = _ref(q, k, v, kw, sparse_mode=3)
    _close(out, want, BF16)
    _close_lse(lse, want_lse)
    assert lse.shape == (6, 4, 1)


def test_random_values_within_one_rounding_and_the_p_rounding_is_the_kernels(rng):
    """Random inputs agree within one query-dtype rounding; with exact inputs the output is the
    unnormalised-P chain's, not op-plugin's golden (normalised before rounding)."""
    q, k, v, kw = make_dense(rng, "BNSD", s1=5, s2=40, n=8, kv_n=8, d=64, dtype=BF16)
    out, _ = ops.npu_fused_infer_attention_score(q, k, v, **kw)
    _close(out, _ref(q, k, v, kw)[0], BF16)
    q, k, v, kw = make_dense(rng, "BSND", s1=2, s2=7, exact=True)
    out, _ = ops.npu_fused_infer_attention_score(q, k, v, **kw)
    want = _ref(q, k, v, kw)[0]
    other = _ref(q, k, v, kw, p_rounding="normalised")[0]
    _close(out, want, np.float16, exact=True)
    assert not np.array_equal(want.view(np.uint16), other.view(np.uint16))


def test_lengths_padding_rows_and_the_one_value_rule(rng):
    """BSND query / kv lengths per request: padded query rows are 0 with lse +inf; a kv length of
    0 empties a request; one value applies to every request (the doc's rule)."""
    q, k, v, kw = make_dense(rng, "BSND", b=3, s1=4, s2=9, q_lens=[4, 2, 0], kv_lens=[9, 3, 5], exact=True)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    want, want_lse = _ref(q, k, v, kw)
    _close(out, want, np.float16, exact=True)
    _close_lse(lse, want_lse)
    assert not out[1, 2:].any() and np.isinf(lse[1, :, 2:]).all() and not out[2].any()
    kw1 = dict(kw, actual_seq_lengths=[3], actual_seq_lengths_kv=[6])
    kwb = dict(kw, actual_seq_lengths=[3, 3, 3], actual_seq_lengths_kv=[6, 6, 6, 99])  # >= B: the first B
    a = ops.npu_fused_infer_attention_score(q, k, v, **kw1)[0]
    assert np.array_equal(a.view(np.uint16), ops.npu_fused_infer_attention_score(q, k, v, **kwb)[0].view(np.uint16))
    with pytest.raises(ShapeError, match=r"actual_seq_lengths_kv\[1\]"):
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, actual_seq_lengths_kv=[1, 10, 1]))
    with pytest.raises(ShapeError, match="actual_seq_lengths"):
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, actual_seq_lengths=[1, 1]))


@pytest.mark.parametrize("sparse_mode", [2, 3])
def test_causal_modes_and_decode_ignores_them(rng, sparse_mode):
    """2: j <= s (top-left), 3: j <= kv - q + s (bottom-right), with the optimised mask or without;
    a decode (Q_S = 1) sees every kv token under both (the doc: no effect without rope)."""
    mask = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
    q, k, v, kw = make_dense(rng, "BNSD", s1=4, s2=9, kv_lens=[9, 6], exact=True)
    for m in (mask, None):
        out, _ = ops.npu_fused_infer_attention_score(q, k, v, **kw, sparse_mode=sparse_mode, atten_mask=m)
        _close(out, _ref(q, k, v, kw, sparse_mode=sparse_mode)[0], np.float16, exact=True)
    full = ops.npu_fused_infer_attention_score(q, k, v, **kw)[0]
    assert not np.array_equal(out, full)
    q, k, v, kw = make_dense(rng, "BNSD", s1=1, s2=9, exact=True)
    dec = ops.npu_fused_infer_attention_score(q, k, v, **kw, sparse_mode=sparse_mode, atten_mask=mask)[0]
    assert np.array_equal(dec.view(np.uint16), ops.npu_fused_infer_attention_score(q, k, v, **kw)[0].view(np.uint16))


@pytest.mark.parametrize("input_layout", ["BNSD", "BSH", "TND"])
@pytest.mark.parametrize("tokens", [(2, 1), (0, 0), (3, -1), (-2, 4), (100, 100)])
def test_band_mode_4(rng, input_layout, tokens):
    """sparse_mode 4: row ``s`` of a request sees ``kv - q + s - pre_tokens <= j <= kv - q + s +
    next_tokens`` (bottom-right aligned); rows the band misses are empty (output 0, lse +inf); a
    decode ignores the band."""
    pre, nxt = tokens
    mask = np.triu(np.ones((2048, 2048), dtype=bool), k=1)
    q, k, v, kw = make_dense(rng, input_layout, s1=5, s2=9, q_lens=[5, 3], kv_lens=[9, 4], exact=True)
    if input_layout == "TND":  # TND takes D 128 / 192
        q, k, v, kw = make_dense(rng, input_layout, s1=5, s2=9, d=128, q_lens=[5, 3], kv_lens=[9, 4], exact=True)
    for m in (mask, None):
        out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, sparse_mode=4, atten_mask=m, pre_tokens=pre,
                                                       next_tokens=nxt, softmax_lse_flag=True)
        want, want_lse = _ref(q, k, v, kw, sparse_mode=4, pre_tokens=pre, next_tokens=nxt)
        _close(out, want, np.float16, exact=True)
        _close_lse(lse, want_lse)
    if tokens == (100, 100):
        np.testing.assert_array_equal(out, ops.npu_fused_infer_attention_score(q, k, v, **kw)[0])
    if tokens == (0, 0):  # the diagonal only: every row with a position sees exactly one
        assert np.isfinite(lse).any() and not np.array_equal(out, ops.npu_fused_infer_attention_score(q, k, v, **kw)[0])
    if input_layout == "BNSD":
        q, k, v, kw = make_dense(rng, "BNSD", s1=1, s2=9, exact=True)
        dec = ops.npu_fused_infer_attention_score(q, k, v, **kw, sparse_mode=4, pre_tokens=0, next_tokens=0)[0]
        np.testing.assert_array_equal(dec.view(np.uint16), ops.npu_fused_infer_attention_score(q, k, v, **kw)[0]
                                      .view(np.uint16))


@pytest.mark.parametrize("shape", ["SK", "1SK", "11SK", "B1SK"])
@pytest.mark.parametrize("sparse_mode", [0, 1])
def test_explicit_masks(rng, shape, sparse_mode):
    """sparse_mode 0 / 1 with a mask (1 masks out) in each accepted shape; mode 0 takes it only
    with pre_tokens / next_tokens covering the matrix."""
    b, s1, s2 = 2, 3, 8
    q, k, v, kw = make_dense(rng, "BSH", b=b, s1=s1, s2=s2, exact=True)
    m = rng.random((b, 1, s1, s2)) < 0.4
    m[..., 0] = False  # every row keeps a position
    if shape != "B1SK":
        m = m[:1]
    arr = {"SK": m[0, 0], "1SK": m[:, 0], "11SK": m, "B1SK": m}[shape].astype(np.uint8)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, atten_mask=arr, sparse_mode=sparse_mode,
                                                   pre_tokens=65535, next_tokens=65535, softmax_lse_flag=True)
    want, want_lse = _ref(q, k, v, kw, atten_mask=arr, sparse_mode=sparse_mode)
    _close(out, want, np.float16, exact=True)
    _close_lse(lse, want_lse)
    assert not np.array_equal(out, ops.npu_fused_infer_attention_score(q, k, v, **kw)[0])


def test_decode_mask_b_by_kv(rng):
    q, k, v, kw = make_dense(rng, "BNSD", b=3, s1=1, s2=6, exact=True)
    m = np.zeros((3, 6), bool)
    m[0, 2:] = True
    m[2, :3] = True
    out, _ = ops.npu_fused_infer_attention_score(q, k, v, **kw, atten_mask=m)
    _close(out, _ref(q, k, v, kw, atten_mask=m)[0], np.float16, exact=True)


def _paged(rng, kv_logical, bs, ndim):
    """Logical ``[B, S2, KV_N, D]`` -> (cache in ``ndim`` layout, block_table) with shuffled blocks."""
    b, s2, kv_n, d = kv_logical.shape
    per = -(-s2 // bs)
    nb = b * per + 3
    table = rng.permutation(nb)[:b * per].reshape(b, per).astype(np.int32)
    cache = np.zeros((nb, bs, kv_n, d), kv_logical.dtype)
    padded = np.zeros((b, per * bs, kv_n, d), kv_logical.dtype)
    padded[:, :s2] = kv_logical
    for i in range(b):
        cache[table[i]] = padded[i].reshape(per, bs, kv_n, d)
    if ndim == 3:
        return np.ascontiguousarray(cache.reshape(nb, bs, kv_n * d)), table
    return np.ascontiguousarray(cache.transpose(0, 2, 1, 3)), table


@pytest.mark.parametrize("input_layout,ndim", [("BNSD", 3), ("BNSD", 4), ("BSH", 3), ("BSND", 3), ("TND", 4)])
@pytest.mark.parametrize("s1", [1, 3])
def test_paged_caches(rng, input_layout, ndim, s1):
    """PageAttention: [nb, bs, KV_N*D] or (BNSD / TND queries) [nb, KV_N, bs, D] key and value
    through a shuffled block_table; the same output as the dense call."""
    b, s2, n, kv_n = 2, 150, 4, 2
    d = 128 if input_layout == "TND" else 32  # the TND constraints' head dims
    bs = 128 if s1 > 1 and input_layout != "TND" else 16
    k_log = _vals(rng, (b, s2, kv_n, d), np.float16, True)
    v_log = _vals(rng, (b, s2, kv_n, d), np.float16, True)
    kv_lens = [150, 77]
    kc, table = _paged(rng, k_log, bs, ndim)
    vc = _relayout_like(v_log, table, kc.shape, bs, ndim)
    if input_layout == "TND":
        q = _vals(rng, (b * s1, n, d), np.float16, True)
        kw = dict(actual_seq_lengths=[s1, 2 * s1])
    else:
        q = _lay(_vals(rng, (b, s1, n, d), np.float16, True), input_layout)
        kw = {}
    kw.update(num_heads=n, num_key_value_heads=kv_n, scale=0.125, input_layout=input_layout, block_table=table,
              block_size=bs, actual_seq_lengths_kv=kv_lens)
    out, lse = ops.npu_fused_infer_attention_score(q, kc, vc, **kw, softmax_lse_flag=True)
    want, want_lse = reference_mha(q, kc, vc, **{x: y for x, y in kw.items() if x != "block_size"})
    _close(out, want, np.float16, exact=True)
    _close_lse(lse, want_lse)


def _relayout_like(v_log, table, shape, bs, ndim):
    b, s2, kv_n, d = v_log.shape
    per = table.shape[1]
    nb = shape[0]
    cache = np.zeros((nb, bs, kv_n, d), v_log.dtype)
    padded = np.zeros((b, per * bs, kv_n, d), v_log.dtype)
    padded[:, :s2] = v_log
    for i in range(b):
        cache[table[i]] = padded[i].reshape(per, bs, kv_n, d)
    if ndim == 3:
        return np.ascontiguousarray(cache.reshape(nb, bs, kv_n * d))
    return np.ascontiguousarray(cache.transpose(0, 2, 1, 3))


def test_learnable_sink(rng):
    """v2 learnable_sink (TND / NTD_TND, bf16 [N]): one more softmax entry per head."""
    q, k, v, kw = make_dense(rng, "TND", b=2, n=4, kv_n=4, d=128, dtype=BF16, q_lens=[2, 3], kv_lens=[4, 6])
    sink = (rng.standard_normal(4) * 4).astype(BF16)
    v2 = {V2.get(a, a): b for a, b in kw.items()}
    out, lse = ops.npu_fused_infer_attention_score_v2(q, k, v, **v2, learnable_sink=sink, return_softmax_lse=True)
    want, want_lse = _ref(q, k, v, kw, learnable_sink=sink)
    _close(out, want, BF16)
    _close_lse(lse, want_lse)
    plain = ops.npu_fused_infer_attention_score_v2(q, k, v, **v2)[0]
    assert not np.array_equal(out, plain)
    with pytest.raises(ModeError, match="learnable_sink"):
        q, k, v, kw = make_dense(rng, "BNSD", n=4, kv_n=4, d=128, dtype=BF16)
        ops.npu_fused_infer_attention_score_v2(q, k, v, **{V2.get(a, a): b for a, b in kw.items()},
                                               learnable_sink=sink)


def test_out_and_workspace_forms_and_v2_names(rng):
    q, k, v, kw = make_dense(rng, "BNSD", s1=1, s2=33, n=4, kv_n=1, d=64)
    want, want_lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    ws = ops._npu_fused_infer_attention_score_get_max_workspace(q, k, v, **kw, softmax_lse_flag=True)
    out, lse = np.empty_like(want), np.empty_like(want_lse)
    got = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True, workspace=ws,
                                              attention_out=out, softmax_lse=lse)
    assert got[0] is out and got[1] is lse
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16)) and np.array_equal(lse, want_lse)
    v2 = {V2.get(a, a): b for a, b in kw.items()}
    o2, l2 = ops.npu_fused_infer_attention_score_v2(q, k, v, **v2, return_softmax_lse=True)
    assert np.array_equal(o2.view(np.uint16), want.view(np.uint16)) and np.array_equal(l2, want_lse)


def test_rejections_name_the_argument_and_write_nothing(rng, monkeypatch):
    q, k, v, kw = make_dense(rng, "BNSD", s1=3, s2=8)
    out = np.full((2, 4, 3, 32), 7, np.float16)
    lse = np.full((1,), 7, np.float32)

    def call(**over):
        with pytest.raises(AscendEmuError) as e:
            ops.npu_fused_infer_attention_score(**{"query": q, "key": k, "value": v, **kw, **over},
                                                attention_out=out, softmax_lse=lse)
        assert (out == 7).all() and (lse == 7).all()
        return str(e.value)

    monkeypatch.delenv("ASCEND_EMU_SOC_NAME", raising=False)
    assert "input_layout" in call(input_layout="NSD", query=q[0], key=k[0], value=v[0])
    assert "input_layout" in call(input_layout="BSHX")
    assert "sparse_mode" in call(sparse_mode=5)
    assert "num_key_value_heads" in call(num_key_value_heads=3)
    assert "value" in call(value=np.ascontiguousarray(v[..., :16]))  # V_D != Q_D off the 950
    full = np.zeros((3, 8), bool)
    full[1] = True  # query row 1 masked over every kv position
    assert "atten_mask" in call(atten_mask=full, pre_tokens=100, next_tokens=100)
    assert "pre_tokens" in call(atten_mask=np.zeros((3, 8), bool), pre_tokens=2)
    assert "atten_mask" in call(sparse_mode=1)
    assert "atten_mask" in call(atten_mask=np.zeros((3, 7), bool), pre_tokens=100, next_tokens=100)
    assert "key" in call(key=np.ascontiguousarray(k[:, :1]))
    assert "actual_seq_lengths_kv" in call(actual_seq_lengths_kv=[9, 1])
    table = np.zeros((2, 1), np.int32)
    kc = np.zeros((4, 16, 2 * 32), np.float16)
    assert "block_size" in call(key=kc, value=kc, block_table=table, block_size=16, actual_seq_lengths_kv=[3, 3])
    kc = np.zeros((4, 128, 2 * 32), np.float16)
    with pytest.raises(IndexRangeError, match="block_table"):
        ops.npu_fused_infer_attention_score(q, kc, kc, **kw, block_table=np.full((2, 1), 4, np.int32),
                                            block_size=128, actual_seq_lengths_kv=[3, 3])
    k4 = np.zeros((4, 2, 128, 32), np.float16)
    qs = np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(2, 3, 128))
    with pytest.raises(ShapeError, match="key"):  # a BSH query reads only [nb, bs, KV_N*D]
        ops.npu_fused_infer_attention_score(qs, k4, k4, **dict(kw, input_layout="BSH"), block_table=table,
                                            block_size=128, actual_seq_lengths_kv=[3, 3])


def test_950_layouts_and_head_dims(rng, monkeypatch):
    """On the Ascend 950: NSD, and Q_D = K_D = 192 with V_D = 128 in B-first layouts (op-plugin's
    950 tests' shapes, all-ones inputs: the output is all ones)."""
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    q = np.ones((8, 1, 192), np.float16)
    k = np.ones((8, 64, 192), np.float16)
    v = np.ones((8, 64, 128), np.float16)
    out, _ = ops.npu_fused_infer_attention_score(q, k, v, num_heads=8, input_layout="NSD", scale=128.0,
                                                 pre_tokens=65535, next_tokens=65535)
    assert out.shape == (8, 1, 128) and (out == 1).all()
    q, k, v, kw = make_dense(rng, "NSD", b=1, s1=3, s2=7, n=4, kv_n=2, d=192, dv=128, exact=True)
    got, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, softmax_lse_flag=True)
    want, want_lse = _ref(q, k, v, kw)
    _close(got, want, np.float16, exact=True)
    _close_lse(lse, want_lse)
    q, k, v, kw = make_dense(rng, "BNSD_BSND", s1=2, s2=7, d=192, dv=128, exact=True)
    got = ops.npu_fused_infer_attention_score(q, k, v, **kw)[0]
    _close(got, _ref(q, k, v, kw)[0], np.float16, exact=True)


def test_drop_in_as_op_plugin_calls_it(rng):
    """torch_npu drop-in calls in op-plugin's test shapes (smaller S): BNSD prefill with the lse
    against their golden's formula (float64 softmax), the .out form after the workspace query, the
    NTD_TND all-ones call, a paged BNSD call with one length for both requests."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    q = torch.randn(1, 4, 16, 32, dtype=torch.float16)
    k = torch.randn(1, 4, 40, 32, dtype=torch.float16)
    v = torch.randn(1, 4, 40, 32, dtype=torch.float16)
    out, lse = torch_npu.npu_fused_infer_attention_score(q, k, v, num_heads=4, input_layout="BNSD", scale=0.125,
                                                         pre_tokens=65535, next_tokens=65535, softmax_lse_flag=True)
    s = q.double() @ k.double().transpose(2, 3) * 0.125
    golden = torch.softmax(s, -1) @ v.double()
    assert out.shape == (1, 4, 16, 32) and lse.shape == (1, 4, 16, 1)
    torch.testing.assert_close(out.double(), golden, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1, keepdim=True), rtol=1e-5, atol=1e-5)
    ws = torch_npu._npu_fused_infer_attention_score_get_max_workspace(q, k, v, num_heads=4, input_layout="BNSD",
                                                                      scale=0.125, softmax_lse_flag=True)
    a, b = torch.empty_like(out), torch.empty_like(lse)
    torch_npu.npu_fused_infer_attention_score.out(q, k, v, workspace=ws, num_heads=4, input_layout="BNSD",
                                                  scale=0.125, softmax_lse_flag=True, out=[a, b])
    assert torch.equal(a, out) and torch.equal(b, lse)
    ones = torch.ones(2, 32, 192, dtype=torch.bfloat16)
    o = torch_npu.npu_fused_infer_attention_score(ones, ones, torch.ones(2, 32, 128, dtype=torch.bfloat16),
                                                  num_heads=2, input_layout="NTD_TND", scale=128.0,
                                                  actual_seq_lengths=[32], actual_seq_lengths_kv=[32])[0]
    assert o.shape == (32, 2, 128) and bool((o == 1).all())
    qp = torch.ones(2, 1, 256, 128, dtype=torch.float16)
    kc = torch.ones(4, 1, 128, 128, dtype=torch.float16)
    with pytest.warns(InputContractWarning, match="block_table"):  # both requests read block 1, as upstream's
        o = torch_npu.npu_fused_infer_attention_score(qp, kc, kc, num_heads=1, input_layout="BNSD",
                                                      block_table=torch.ones(2, 4, dtype=torch.int32),
                                                      block_size=128, actual_seq_lengths=[256],
                                                      actual_seq_lengths_kv=[256], scale=128.0)[0]
    assert o.shape == (2, 1, 256, 128) and bool((o == 1).all())


def test_infer_output_forms_give_the_out_arrays_of_the_out_call(rng):
    """``_npu_fused_infer_attention_score(_v2)_infer_output(query, value, ...)``: zero-filled arrays
    of the shapes and dtypes the .out call then fills (op-plugin's workspace-test flow)."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    q = torch.randn(1, 4, 1, 32, dtype=torch.float16)
    k = torch.randn(1, 4, 40, 32, dtype=torch.float16)
    for v2 in (False, True):
        names = dict(num_query_heads=4, return_softmax_lse=True) if v2 else dict(num_heads=4, softmax_lse_flag=True)
        infer = torch_npu._npu_fused_infer_attention_score_v2_infer_output if v2 else \
            torch_npu._npu_fused_infer_attention_score_infer_output
        out, lse = infer(q, k, input_layout="BNSD", **names)
        assert (out.shape, out.dtype, lse.shape, lse.dtype) == ((1, 4, 1, 32), torch.float16, (1, 4, 1, 1),
                                                                torch.float32)
        op = torch_npu.npu_fused_infer_attention_score_v2 if v2 else torch_npu.npu_fused_infer_attention_score
        scale = dict(softmax_scale=0.125) if v2 else dict(scale=0.125)
        got = op.out(q, k, k, input_layout="BNSD", **names, **scale, out=[out, lse])
        want = op(q, k, k, input_layout="BNSD", **names, **scale)
        assert got[0] is out and torch.equal(out, want[0]) and torch.equal(lse, want[1])
    bsh, _ = ops._npu_fused_infer_attention_score_infer_output(np.zeros((2, 3, 64), np.float16),
                                                               np.zeros((2, 9, 2 * 16), np.float16),
                                                               input_layout="BSH_NBSD", num_heads=4,
                                                               num_key_value_heads=2)
    assert bsh.shape == (4, 2, 3, 16) and _.shape == (0,)
    with pytest.raises(ModeError, match="input_layout"):
        ops._npu_fused_infer_attention_score_infer_output(np.zeros((2, 3, 64), np.float16),
                                                          np.zeros((2, 9, 32), np.float16), input_layout="BNSD")
    with pytest.raises(ModeError, match="out_dtype"):
        ops._npu_fused_infer_attention_score_v2_infer_output(np.zeros((2, 3, 64), np.float16),
                                                             np.zeros((2, 9, 32), np.float16), out_dtype=1)


def test_checked_mode_reads_paged_caches_not_dense_key_value(rng):
    """Checked mode: a paged MHA cache row never written names ``key``; dense key / value (the
    form's activations, in any layout) are not caches and pass."""
    from ascend_emu import checked_mode
    from ascend_emu.errors import UninitializedReadError

    q, k, v, kw = make_dense(rng, "BNSD", s1=1, s2=9)
    qt, kt, vt, kwt = make_dense(rng, "NTD_TND", d=128)
    with checked_mode.checked():
        ops.npu_fused_infer_attention_score(q, k, v, **kw)
        ops.npu_fused_infer_attention_score(qt, kt, vt, **kwt)
        kc = np.zeros((4, 16, 2 * 32), np.float16)
        with pytest.raises(UninitializedReadError, match="key"):
            ops.npu_fused_infer_attention_score(q, kc, kc, **kw, block_table=np.array([[0], [1]], np.int32),
                                                block_size=16, actual_seq_lengths_kv=[3, 3])


@pytest.mark.parametrize("input_layout", ["BSH", "BNSD", "BSND_NBSD"])
@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("kv_dtype", ["int8", "int32"])
def test_kv_antiquant_matches_the_reference(rng, input_layout, dtype, kv_dtype):
    """Separated kv antiquant (v1 key / value_antiquant_scale and _offset, per channel; v2
    dequant_scale_key / _value, per tensor): int8 or int4 packed 8 to an int32."""
    from ascend_emu.quant import pack_int4_to_int32

    b, s1, s2, n, kv_n, d = 2, 3, 7, 4, 2, 128
    q_layout = input_layout.split("_")[0]
    q = _lay(rng.standard_normal((b, s1, n, d)).astype(dtype), q_layout)
    lo, hi = (-8, 8) if kv_dtype == "int32" else (-128, 128)
    ki, vi = (rng.integers(lo, hi, (b, s2, kv_n, d)).astype(np.int8) for _ in range(2))
    if kv_dtype == "int32":
        ki, vi = pack_int4_to_int32(ki), pack_int4_to_int32(vi)
    k, v = _lay(ki, q_layout), _lay(vi, q_layout)
    ks, vs = ((rng.random((kv_n, 1, d)) * 0.05 + 0.01).astype(dtype) for _ in range(2))
    ko, vo = (rng.integers(-3, 4, (kv_n, 1, d)).astype(dtype) for _ in range(2))
    kw = dict(num_heads=n, num_key_value_heads=kv_n, scale=d ** -0.5, input_layout=input_layout)
    out, lse = ops.npu_fused_infer_attention_score(q, k, v, **kw, key_antiquant_scale=ks, key_antiquant_offset=ko,
                                                   value_antiquant_scale=vs, value_antiquant_offset=vo,
                                                   softmax_lse_flag=True)
    want, want_lse = _ref(q, k, v, kw, key_antiquant=(ks, ko), value_antiquant=(vs, vo))
    _close(out, want, dtype)
    _close_lse(lse, want_lse)
    one = np.array([0.03], dtype)
    v2 = {V2.get(a, a): y for a, y in kw.items()}
    out2 = ops.npu_fused_infer_attention_score_v2(q, k, v, **v2, dequant_scale_key=one, dequant_scale_value=one)[0]
    _close(out2, _ref(q, k, v, kw, key_antiquant=(one, None), value_antiquant=(one, None))[0], dtype)


def test_kv_antiquant_as_op_plugin_calls_it_and_its_rejections(rng):
    """op-plugin's 950 int32 antiquant call (int4 ones / 0x11111111 values, unit scales: output
    ones), and the rejected forms, each naming its argument."""
    q = np.ones((2, 1, 1, 128), np.float16)
    k = np.ones((2, 1, 256, 16), np.int32)
    v = np.full((2, 1, 256, 16), 286331153, np.int32)
    s = np.ones((1, 128), np.float16)
    kw = dict(num_heads=1, input_layout="BNSD", scale=128.0, pre_tokens=65535, next_tokens=65535)
    out, _ = ops.npu_fused_infer_attention_score(q, k, v, **kw, key_antiquant_scale=s, value_antiquant_scale=s,
                                                 antiquant_mode=0)
    assert out.shape == (2, 1, 1, 128) and (out == 1).all()
    aq = dict(key_antiquant_scale=s, value_antiquant_scale=s)
    with pytest.raises(ModeError, match="value_antiquant_scale"):
        ops.npu_fused_infer_attention_score(q, k, v, **kw, key_antiquant_scale=s)
    with pytest.raises(ModeError, match="key_antiquant_mode"):
        ops.npu_fused_infer_attention_score(q, k, v, **kw, **aq, key_antiquant_mode=1)
    with pytest.raises(ShapeError, match="key_antiquant_scale"):
        ops.npu_fused_infer_attention_score(q, k, v, **kw, **dict(aq, key_antiquant_scale=np.ones(64, np.float16)))
    with pytest.raises(AscendEmuError, match="key_antiquant_scale"):
        ops.npu_fused_infer_attention_score(q, k, v, **kw, **dict(aq, key_antiquant_scale=s.astype(np.float32)))
    with pytest.raises(ModeError, match="key_antiquant_scale"):
        qf = np.ones((2, 1, 1, 128), np.float16)
        ops.npu_fused_infer_attention_score(qf, qf, qf, **kw, key_antiquant_scale=s)
    with pytest.raises(ModeError, match="key_antiquant_scale"):  # paged: not emulated
        kc = np.ones((4, 128, 16), np.int32)
        ops.npu_fused_infer_attention_score(q, kc, kc, **kw, **aq, block_table=np.zeros((2, 1), np.int32),
                                            block_size=128, actual_seq_lengths_kv=[5, 5])
    with pytest.raises(ModeError, match="dequant_offset_key"):  # with rope: the MLA subset takes none
        ops.npu_fused_infer_attention_score_v2(q, q, q, query_rope=q[..., :64], key_rope=q[..., :64],
                                               input_layout="BNSD", dequant_offset_key=s)


@pytest.mark.parametrize("ndim", [3, 4])
@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_kv_antiquant_of_paged_int8_caches_in_decode(rng, ndim, dtype):
    """int8 paged caches read with antiquant (decode, the doc's PageAttention table): each block
    dequantised as the dense form (per channel with offsets; v2 per tensor); prefill, int4 and a
    block_size off 32 rejected by name."""
    b, n, kv_n, d, bs, nb = 2, 4, 2, 64, 32, 5
    q = rng.standard_normal((b, n, 1, d)).astype(dtype)  # BNSD decode
    shape = (nb, bs, kv_n * d) if ndim == 3 else (nb, kv_n, bs, d)
    kc, vc = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(2))
    table = np.array([[3, 0, 4], [1, 2, -1]], np.int32)
    ks, vs = ((rng.random((kv_n, d)) * 0.05 + 0.01).astype(dtype) for _ in range(2))
    ko, vo = (rng.integers(-3, 4, (kv_n, d)).astype(dtype) for _ in range(2))
    kw = dict(num_heads=n, num_key_value_heads=kv_n, scale=d ** -0.5, input_layout="BNSD", block_table=table,
              block_size=bs, actual_seq_lengths_kv=[70, 40])
    out, lse = ops.npu_fused_infer_attention_score(q, kc, vc, **kw, key_antiquant_scale=ks, key_antiquant_offset=ko,
                                                   value_antiquant_scale=vs, value_antiquant_offset=vo,
                                                   softmax_lse_flag=True)
    rkw = {x: y for x, y in kw.items() if x != "block_size"}
    want, want_lse = _ref(q, kc, vc, rkw, key_antiquant=(ks, ko), value_antiquant=(vs, vo))
    _close(out, want, dtype)
    _close_lse(lse, want_lse)
    one = np.array([0.02], dtype)
    v2 = {V2.get(a, a): y for a, y in kw.items()}
    same = ops.npu_fused_infer_attention_score_v2(q, kc, kc, **v2, dequant_scale_key=one, dequant_scale_value=one * 2)[0]
    _close(same, _ref(q, kc, kc, rkw, key_antiquant=(one, None), value_antiquant=(one * 2, None))[0], dtype)
    aq = dict(key_antiquant_scale=ks, value_antiquant_scale=vs)
    with pytest.raises(ModeError, match="key_antiquant_scale"):  # prefill: the table's Q_S > 1 column
        ops.npu_fused_infer_attention_score(np.repeat(q, 2, axis=2), kc, vc, **dict(kw, block_size=128), **aq)
    with pytest.raises(ShapeError, match="block_size"):
        kc16 = np.zeros((nb, 16, kv_n * d) if ndim == 3 else (nb, kv_n, 16, d), np.int8)
        ops.npu_fused_infer_attention_score(q, kc16, kc16, **dict(kw, block_size=16, actual_seq_lengths_kv=[16, 16]),
                                            **aq)
