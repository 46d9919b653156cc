"""The MLA call forms of vllm-ascend and sglang's NPU backend through the torch_npu drop-in,
each against the plain-loop reference (tests/reference/fused_infer_attention.py) with torch_npu's
``assertRtolEqual`` criterion (bf16: allclose, rtol = atol = 1e-3).

Sources (the argument sets below copy their shapes, layouts and argument kinds):
- vllm-ascend ``vllm_ascend/attention/mla_v1.py`` (snapshot 182b75ea): ``_forward_decode``
  (v2 BNSD_NBSD over ``[nb, 1, bs, 512]``, BSND_NBSD over the NZ view, TND_NTD with sparse_mode 3
  and the 2048 mask for spec decode, the kv lengths padded with zeros; the ``.out`` form with the
  v2 workspace query and a ``[num_tokens]`` softmax_lse), ``_forward_prefill`` (v1 TND without
  block_table, KV_N = N, D = 128 + 64, sparse_mode 3, antiquant_mode 0 / antiquant_scale None,
  the lse flag) and ``_compute_prefill_context`` (the same without mask, other kv lengths), and
  both with ``head_padding > 0`` (no rope arguments, D = 192 concatenated, value D = 128);
- sglang ``python/sglang/srt/hardware_backend/npu/attention/ascend_backend.py`` (snapshot
  009c6808): ``forward_extend`` (v1 TND, q / k split views, lengths as NumPy cumsums,
  next_tokens 0), ``forward_mtp`` (v1 ``.out`` TND over the paged / NZ ckv cache, lengths as
  ``np.arange``, a ``[1]`` softmax_lse), ``forward_decode_graph`` (v1 ``.out`` BSND over
  ``[nb, bs, 512]``) and ``forward_decode`` (BSND, kv lengths an int32 CPU tensor).
Inputs are small integers, so emulator and reference agree bit for bit (the criterion holds with
room to spare); the C8 decode's call is in test_fused_infer_attention_score.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.reference.fused_infer_attention import reference
from tests.test_fused_infer_attention_score import make_case

torch = pytest.importorskip("torch")
BF16 = ml_dtypes.bfloat16
MASK = np.triu(np.ones((2048, 2048), dtype=bool), k=1)  # sglang's generate_mask_flag, vllm-ascend's mask


@pytest.fixture(scope="module")
def tnpu():
    import ascend_emu.torch_npu as torch_npu

    return torch_npu


def _t(x):
    from ascend_emu.torch_npu import to_torch

    return to_torch(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x


def _check(got, q, k, v, kw, **extra):
    """got (a torch bf16 tensor) against the reference of the numpy case ``(q, k, v, kw)``."""
    from ascend_emu.torch_npu import to_numpy
    from ascend_emu.torch_npu.testing.testcase import TestCase

    r = {n: x for n, x in kw.items() if n not in ("query_rope", "key_rope", "block_size", "atten_mask")}
    want, _ = reference(q, k, v, kw["query_rope"], kw["key_rope"], **r, **extra)
    TestCase().assertRtolEqual(got, _t(want))
    np.testing.assert_array_equal(to_numpy(got).view(np.uint16), want.view(np.uint16))


def _case(rng, layout, cache_ndim, **kw):
    return make_case(rng, layout, cache_ndim, BF16, exact=True, n=8, **kw)


def test_vllm_ascend_decode_forms(rng, tnpu):
    """``_forward_decode``: v2 BNSD_NBSD (ND cache), BSND_NBSD (NZ cache), eager."""
    for layout, ndim in (("BNSD_NBSD", 4), ("BSND_NBSD", 5)):
        q, k, v, kw = _case(rng, layout, ndim, q_lens=(1, 1, 1), kv_lens=(40, 3, 17))
        out, _ = tnpu.npu_fused_infer_attention_score_v2(
            _t(q), _t(k), _t(k), query_rope=_t(kw["query_rope"]), key_rope=_t(kw["key_rope"]),
            num_query_heads=8, num_key_value_heads=1, input_layout=layout, atten_mask=None, sparse_mode=0,
            softmax_scale=kw["scale"], block_table=_t(kw["block_table"]), block_size=16, actual_seq_qlen=None,
            actual_seq_kvlen=kw["actual_seq_lengths_kv"])
        _check(out, q, k, v, kw)


def test_vllm_ascend_spec_decode_graph_out_form(rng, tnpu):
    """``_forward_decode`` under speculative decoding: TND_NTD, sparse_mode 3 with the 2048 mask,
    two query tokens per request, one padded request (kv length 0), the ``.out`` form with the
    v2 workspace query and a ``[num_tokens]`` softmax_lse (not written without the lse flag)."""
    q, k, v, kw = _case(rng, "TND_NTD", 5, q_lens=(2, 2, 2), kv_lens=(33, 9, 0), sparse_mode=3)
    args = dict(query_rope=_t(kw["query_rope"]), key_rope=_t(kw["key_rope"]), num_query_heads=8,
                num_key_value_heads=1, input_layout="TND_NTD", atten_mask=_t(MASK), sparse_mode=3,
                softmax_scale=kw["scale"], block_table=_t(kw["block_table"]), block_size=16,
                actual_seq_qlen=kw["actual_seq_lengths"], actual_seq_kvlen=kw["actual_seq_lengths_kv"])
    tq, tk = _t(q), _t(k)
    workspace = tnpu._npu_fused_infer_attention_score_v2_get_max_workspace(tq, tk, tk, **args)
    attn_output = torch.empty((8, 6, 512), dtype=torch.bfloat16)
    softmax_lse = torch.full((6,), 7.0, dtype=torch.bfloat16)
    tnpu.npu_fused_infer_attention_score_v2.out(tq, tk, tk, **args, workspace=workspace,
                                                out=[attn_output, softmax_lse])
    _check(attn_output, q, k, v, kw)
    assert (softmax_lse == 7).all()


def test_vllm_ascend_prefill_and_chunked_context(rng, tnpu):
    """``_forward_prefill`` (TND without block_table, KV_N = N, sparse_mode 3, the lse) and
    ``_compute_prefill_context`` (sparse_mode 0, kv lengths of the context chunk)."""
    for sparse_mode, q_lens, kv_lens in ((3, (5, 3), (5, 3)), (0, (5, 3), (12, 2))):
        q, k, v, kw = _case(rng, "TND", 4, d=128, kv_n=8, q_lens=q_lens, kv_lens=kv_lens, sparse_mode=sparse_mode,
                            paged=False)
        out, lse = tnpu.npu_fused_infer_attention_score(
            _t(q), _t(k), _t(v), num_heads=8, num_key_value_heads=8, input_layout="TND",
            atten_mask=_t(MASK) if sparse_mode == 3 else None, sparse_mode=sparse_mode, scale=kw["scale"],
            antiquant_mode=0, antiquant_scale=None, block_table=None, block_size=0, softmax_lse_flag=True,
            actual_seq_lengths=kw["actual_seq_lengths"], actual_seq_lengths_kv=kw["actual_seq_lengths_kv"],
            query_rope=_t(kw["query_rope"]), key_rope=_t(kw["key_rope"]))
        _check(out, q, k, v, kw)
        assert tuple(lse.shape) == (sum(q_lens), 8, 1)


def test_vllm_ascend_prefill_with_head_padding(rng, tnpu):
    """``_forward_prefill`` / ``_compute_prefill_context`` when ``head_padding > 0`` (N not a power
    of 2): no rope arguments, query = cat(q_nope, q_pe) and key = cat(k_nope, k_pe) (D = 192),
    value D = 128, TND without block_table."""
    n, q_lens, kv_lens = 12, (3, 4), (3, 6)
    t, t2 = sum(q_lens), sum(kv_lens)
    q = rng.integers(-1, 2, (t, n, 192)).astype(BF16)  # [T, N, 128 + 64]
    k = rng.integers(-1, 2, (t2, n, 192)).astype(BF16)  # [T2, N, 192]
    v = rng.integers(-1, 2, (t2, n, 128)).astype(BF16)  # [T2, N, 128]
    kw = dict(num_heads=n, num_key_value_heads=n, scale=0.0625, input_layout="TND", block_table=None,
              actual_seq_lengths=np.cumsum(q_lens).tolist(), actual_seq_lengths_kv=np.cumsum(kv_lens).tolist())
    for sparse_mode in (0, 3):
        out, lse = tnpu.npu_fused_infer_attention_score(
            _t(q), _t(k), _t(v), **kw, atten_mask=_t(MASK) if sparse_mode == 3 else None, sparse_mode=sparse_mode,
            antiquant_mode=0, antiquant_scale=None, block_size=0, softmax_lse_flag=True)
        assert tuple(out.shape) == (t, n, 128) and tuple(lse.shape) == (t, n, 1)
        _check(out, q, k, v, dict(kw, query_rope=None, key_rope=None, sparse_mode=sparse_mode))


def test_sglang_extend_without_prefix(rng, tnpu):
    """``forward_extend``: q / k split out of ``[T, N, 192]`` (non-contiguous views), lengths as
    NumPy cumsums, num_key_value_heads left at 0 (= N), next_tokens 0."""
    q, k, v, kw = _case(rng, "TND", 4, d=128, kv_n=8, q_lens=(4, 2), kv_lens=(4, 2), sparse_mode=3, paged=False)
    tq = torch.cat([_t(q), _t(kw["query_rope"])], dim=-1)  # [T, N, 192]
    tk = torch.cat([_t(k), _t(kw["key_rope"])], dim=-1)
    q_nope, q_rope = tq.split([128, 64], dim=-1)
    k_nope, k_rope = tk.split([128, 64], dim=-1)
    cumsum = np.cumsum([4, 2])
    out, _ = tnpu.npu_fused_infer_attention_score(
        q_nope, k_nope, _t(v), query_rope=q_rope, key_rope=k_rope, num_heads=8, input_layout="TND",
        atten_mask=_t(MASK), sparse_mode=3, actual_seq_lengths=cumsum, actual_seq_lengths_kv=cumsum,
        scale=kw["scale"], next_tokens=0)
    _check(out, q, k, v, kw)


@pytest.mark.parametrize("cache_ndim", [4, 5])
def test_sglang_mtp_out_form(rng, tnpu, cache_ndim):
    """``forward_mtp`` (MLA): v1 ``.out`` TND over the ckv cache (``[nb, 1, bs, 512]`` or the NZ
    view), ``actual_seq_lengths`` an ``np.arange``, softmax_lse ``[1]``."""
    q, k, v, kw = _case(rng, "TND", cache_ndim, q_lens=(2, 2), kv_lens=(20, 5), sparse_mode=3)
    args = dict(query_rope=_t(kw["query_rope"]), key_rope=_t(kw["key_rope"]), num_heads=8, num_key_value_heads=1,
                input_layout="TND", scale=kw["scale"], antiquant_mode=0, antiquant_scale=None,
                block_table=_t(kw["block_table"]), block_size=16, sparse_mode=3, atten_mask=_t(MASK),
                actual_seq_lengths=np.arange(2, 2 + 4, 2), actual_seq_lengths_kv=kw["actual_seq_lengths_kv"])
    tq, tk = _t(q), _t(k)
    workspace = tnpu._npu_fused_infer_attention_score_get_max_workspace(tq, tk, tk, **args)
    attn_output = torch.empty_like(tq)
    softmax_lse = torch.empty(1, dtype=torch.bfloat16)
    tnpu.npu_fused_infer_attention_score.out(tq, tk, tk, **args, workspace=workspace, out=[attn_output, softmax_lse])
    _check(attn_output, q, k, v, kw)


def test_sglang_decode_graph_and_eager(rng, tnpu):
    """``forward_decode_graph`` (v1 ``.out`` BSND over ``[nb, bs, 512]``) and ``forward_decode``
    (BSND, actual_seq_lengths_kv an int32 CPU tensor)."""
    q, k, v, kw = _case(rng, "BSND", 3, q_lens=(1, 1, 1), kv_lens=(23, 1, 16))
    args = dict(query_rope=_t(kw["query_rope"]), key_rope=_t(kw["key_rope"]), num_heads=8, num_key_value_heads=1,
                block_table=_t(kw["block_table"]), block_size=16, input_layout="BSND", scale=kw["scale"],
                actual_seq_lengths_kv=kw["actual_seq_lengths_kv"], antiquant_mode=0, antiquant_scale=None,
                sparse_mode=0)
    tq, tk = _t(q), _t(k)
    workspace = tnpu._npu_fused_infer_attention_score_get_max_workspace(tq, tk, tk, **args)
    output = torch.empty_like(tq)
    softmax_lse = torch.empty(1, dtype=torch.bfloat16)
    tnpu.npu_fused_infer_attention_score.out(tq, tk, tk, **args, workspace=workspace, out=[output, softmax_lse])
    _check(output, q, k, v, kw)
    eager, _ = torch.ops.npu.npu_fused_infer_attention_score(
        tq, tk, tk, **dict(args, actual_seq_lengths_kv=torch.tensor(kw["actual_seq_lengths_kv"], dtype=torch.int32),
                           atten_mask=None))
    assert torch.equal(eager, output)
