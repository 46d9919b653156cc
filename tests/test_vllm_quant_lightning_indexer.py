"""``_C_ascend.npu_vllm_quant_lightning_indexer`` (+ ``_metadata``), A2 / A3 int8 path, with
``cmp_ratio``: against tests/reference/vllm_quant_lightning_indexer.py (exact: integer dots, the
fp16 / fp32 staging of the quant indexer), every argument honoured or rejected by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ascend_emu import ops
from ascend_emu.errors import BackendUnavailable, DTypeError, IndexRangeError, ModeError, ShapeError
from ascend_emu.ops import vllm_quant_lightning_indexer as vq
from tests.reference import vllm_quant_lightning_indexer as ref

N1, D, BS = 64, 128, 16


def _case(q_lens, kv_lens, ratio, *, seed=0, k=8, layout="TND", sparse_mode=3, perm_seed=1):
    rng = np.random.default_rng(seed)
    t = sum(q_lens)
    q = rng.integers(-128, 128, (t, N1, D), dtype=np.int8)
    w = rng.uniform(0, 0.01, (t, N1)).astype(np.float16)
    qs = rng.uniform(0, 10, (t, N1)).astype(np.float16)
    keys = [rng.integers(-128, 128, (s // ratio, D), dtype=np.int8) for s in kv_lens]
    kscales = [rng.uniform(0, 10, s // ratio).astype(np.float16) for s in kv_lens]
    need = [max(1, -(-len(kr) // BS)) for kr in keys]
    total = sum(need) + 1
    perm = np.random.default_rng(perm_seed).permutation(total)
    key = rng.integers(-128, 128, (total, BS, 1, D), dtype=np.int8)
    kscale = rng.uniform(0, 10, (total, BS, 1)).astype(np.float16)
    table = np.zeros((len(kv_lens), max(need)), np.int32)
    j = 0
    for b, (kr, ksr) in enumerate(zip(keys, kscales, strict=True)):
        for c in range(need[b]):
            blk = int(perm[j])
            j += 1
            table[b, c] = blk
            part = slice(c * BS, (c + 1) * BS)
            key[blk, :len(kr[part]), 0] = kr[part]
            kscale[blk, :len(ksr[part]), 0] = ksr[part]
    act_k = np.array(kv_lens, np.int32)
    if layout == "TND":
        act_q = np.cumsum(q_lens).astype(np.int32)
        qq, ww, qqs = q, w, qs
    else:
        act_q = None
        s = q_lens[0]
        qq, ww, qqs = (a.reshape(len(q_lens), s, *a.shape[1:]) for a in (q, w, qs))
    meta = ops.npu_vllm_quant_lightning_indexer_metadata(
        N1, 1, D, 0, 0, actual_seq_lengths_query=act_q, actual_seq_lengths_key=act_k, batch_size=len(kv_lens),
        max_seqlen_q=max(q_lens), max_seqlen_k=max(kv_lens), layout_query=layout, layout_key="PA_BSND",
        sparse_count=k, sparse_mode=sparse_mode, cmp_ratio=ratio)
    args = (qq, key, ww, qqs, kscale)
    kw = dict(query_quant_mode=0, key_quant_mode=0, actual_seq_lengths_query=act_q, actual_seq_lengths_key=act_k,
              block_table=table, metadata=meta, layout_query=layout, layout_key="PA_BSND", sparse_count=k,
              sparse_mode=sparse_mode, cmp_ratio=ratio)
    gold = ref.vllm_quant_lightning_indexer(q, w, qs, keys, kscales, q_lens, kv_lens, ratio, k, sparse_mode)
    return args, kw, gold


@pytest.mark.parametrize("q_lens,kv_lens,ratio,layout,mode", [
    ([3, 1], [70, 33], 4, "TND", 3),          # CSA: several blocks; request 1 sees 8 rows
    ([2, 2], [300, 129], 128, "BSND", 3),     # HCA-like: 2 and 1 rows (query at 127 sees 0)
    ([2], [50], 2, "TND", 0),
    ([4], [9], 4, "TND", 3),                  # early queries see no row: all -1
])
def test_matches_the_reference_exactly(q_lens, kv_lens, ratio, layout, mode):
    args, kw, gold = _case(q_lens, kv_lens, ratio, layout=layout, sparse_mode=mode)
    idx, values = ops.npu_vllm_quant_lightning_indexer(*args, **kw)
    assert values.shape == (0,) and values.dtype == np.float32
    assert idx.dtype == np.int32
    np.testing.assert_array_equal(idx.reshape(gold.shape), gold)


def test_causal_bound_uses_original_positions():
    """S2 = 9, S1 = 4, ratio 4: queries at 5..8 see (p + 1) // 4 = 1, 1, 2, 2 rows (a causal bound in
    compressed units, S3 - S1 + i + 1 = 0, 0, 1, 2, would differ)."""
    args, kw, _ = _case([4], [9], 4, k=4)
    idx, _ = ops.npu_vllm_quant_lightning_indexer(*args, **kw)
    assert [int((r >= 0).sum()) for r in idx.reshape(4, 4)] == [1, 1, 2, 2]


def test_block_order_does_not_matter():
    a, kw_a, _ = _case([3, 1], [70, 33], 4, perm_seed=1)
    b, kw_b, _ = _case([3, 1], [70, 33], 4, perm_seed=7)
    assert not np.array_equal(kw_a["block_table"], kw_b["block_table"])
    np.testing.assert_array_equal(ops.npu_vllm_quant_lightning_indexer(*a, **kw_a)[0],
                                  ops.npu_vllm_quant_lightning_indexer(*b, **kw_b)[0])


def _set(**changes):
    return lambda args, kw: (args, {**kw, **changes})


REJECTIONS = [
    (_set(cmp_ratio=3), ModeError, r"^cmp_ratio: expected one of \[1, 2, 4"),
    (_set(return_value=True), ModeError, "^return_value: expected False"),
    (_set(layout_key="BSND"), ModeError, "^layout_key: expected 'PA_BSND'"),
    (_set(query_quant_mode=1), ModeError, "^query_quant_mode"),
    (_set(sparse_mode=1), ModeError, "^sparse_mode"),
    (_set(sparse_count=4096), ModeError, "^sparse_count"),
    (_set(pre_tokens=5), ModeError, "^pre_tokens"),
    (_set(metadata=None), ShapeError, "^metadata: expected the int32"),
    (_set(metadata=np.zeros(1024, np.int32)), ModeError, "^metadata: expected a plan made by"),
    (_set(sparse_count=4), ModeError, "^metadata: expected a plan built for this call.s sparse_count = 4"),
    (_set(actual_seq_lengths_key=np.array([70, 34], np.int32)), ModeError,
     "^metadata: expected a plan built for this call.s crc"),
    (_set(actual_seq_lengths_key=None), ShapeError, "^actual_seq_lengths_key: expected a tensor"),
    (_set(actual_seq_lengths_query=np.array([3, 2], np.int32)), ShapeError, r"^actual_seq_lengths_query\[1\]"),
    (_set(block_table=np.full((2, 3), 99, np.int32)), IndexRangeError, r"^block_table\[0, 0\]"),
    (lambda a, kw: ((a[0].astype(np.float32), *a[1:]), kw), DTypeError, "^query: expected dtype int8"),
    (lambda a, kw: ((a[0][:, :32].copy(), *a[1:]), kw), ShapeError, "^query: expected N1 = 64"),
    (lambda a, kw: ((*a[:4], a[4].astype(np.float32)), kw), DTypeError, "^key_dequant_scale: expected dtype float16"),
]


@pytest.mark.parametrize("change,exc,match", REJECTIONS, ids=[m[:32] for _, _, m in REJECTIONS])
def test_every_argument_is_honoured_or_rejected_by_name(change, exc, match):
    args, kw, _ = _case([3, 1], [70, 33], 4)
    args, kw = change(args, kw)
    with pytest.raises(exc, match=match):
        ops.npu_vllm_quant_lightning_indexer(*args, **kw)


@pytest.mark.parametrize("kw,match", [
    (dict(num_heads_q=32), "^num_heads_q"), (dict(head_dim=64), "^head_dim"),
    (dict(cmp_ratio=256), "^cmp_ratio"), (dict(batch_size=3), "^batch_size"),
    (dict(max_seqlen_k=10), "^max_seqlen_k"), (dict(layout_key="BSND"), "^layout_key"),
])
def test_metadata_rejects_by_name(kw, match):
    base = dict(num_heads_q=64, num_heads_k=1, head_dim=128, query_quant_mode=0, key_quant_mode=0,
                actual_seq_lengths_query=np.array([3, 4], np.int32),
                actual_seq_lengths_key=np.array([70, 33], np.int32),
                batch_size=2, max_seqlen_q=3, max_seqlen_k=70, layout_query="TND", layout_key="PA_BSND",
                sparse_count=8, cmp_ratio=4)
    with pytest.raises(ModeError, match=match):
        ops.npu_vllm_quant_lightning_indexer_metadata(**{**base, **kw})


def test_hw_backend_says_it_is_not_a_torch_npu_op():
    args, kw, _ = _case([3, 1], [70, 33], 4)
    with ops.backend("hw"), pytest.raises(BackendUnavailable, match="not a torch_npu op"):
        ops.npu_vllm_quant_lightning_indexer(*args, **kw)


def test_c_ascend_binding_and_fakes():
    import ascend_emu.torch_npu  # noqa: F401  (registers the namespaces)

    args, kw, gold = _case([3, 1], [70, 33], 4)
    t = lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a  # noqa: E731
    tk = {k: t(v) for k, v in kw.items()}
    tk["metadata"] = torch.ops._C_ascend.npu_vllm_quant_lightning_indexer_metadata(
        64, 1, 128, 0, 0, actual_seq_lengths_query=tk["actual_seq_lengths_query"],
        actual_seq_lengths_key=tk["actual_seq_lengths_key"], batch_size=2, max_seqlen_q=3, max_seqlen_k=70,
        layout_query="TND", layout_key="PA_BSND", sparse_count=8, cmp_ratio=4)
    idx, vals = torch.ops._C_ascend.npu_vllm_quant_lightning_indexer(*(t(a) for a in args), **tk)
    np.testing.assert_array_equal(idx.numpy().reshape(gold.shape), gold)
    assert tuple(vals.shape) == (0,)
    m = torch.empty((4, 64, 128), dtype=torch.int8, device="meta")
    fi, fv = torch.ops._C_ascend.npu_vllm_quant_lightning_indexer(
        m, m, m, m, m, sparse_count=512, layout_query="TND", layout_key="PA_BSND", cmp_ratio=4)
    assert tuple(fi.shape) == (4, 1, 512) and fi.dtype == torch.int32 and tuple(fv.shape) == (0,)
    assert vq.PLAN_FIELDS[0] == "magic"


# --------------------------------------- the recipes' custom.npu_quant_lightning_indexer, cmp_ratio > 1
@pytest.mark.parametrize("q_lens,kv_lens,ratio,layout,with_plan", [
    ([3, 1], [70, 33], 4, "TND", True),
    ([2, 2], [300, 129], 128, "BSND", False),   # the doc makes metadata optional
    ([2], [50], 2, "TND", False),
])
def test_custom_op_with_cmp_ratio_is_the_compressed_key_indexer(q_lens, kv_lens, ratio, layout, with_plan):
    args, kw, gold = _case(q_lens, kv_lens, ratio, layout=layout)
    qm, km = kw.pop("query_quant_mode"), kw.pop("key_quant_mode")
    if not with_plan:
        kw["metadata"] = None
    idx, values = ops.custom_npu_quant_lightning_indexer(*args, qm, km, **kw)
    np.testing.assert_array_equal(idx.reshape(gold.shape), gold)
    assert values.shape == (0,) and values.dtype == np.float32


def test_custom_op_apart_from_torch_npus():
    """cmp_ratio 1 without a plan is torch_npu's op (the same bytes); a plan given is checked;
    query_dtype with cmp_ratio > 1 is rejected by name; a zero plan fails."""
    args, kw, gold = _case([3, 1], [70, 33], 1)
    kw.pop("query_quant_mode"), kw.pop("key_quant_mode")
    plan = kw.pop("metadata")
    kw.pop("cmp_ratio")
    want = ops.npu_quant_lightning_indexer(*args, 0, 0, **kw)
    got, _ = ops.custom_npu_quant_lightning_indexer(*args, 0, 0, **kw)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ops.custom_npu_quant_lightning_indexer(*args, 0, 0, metadata=plan, **kw)[0]
                                  .reshape(gold.shape), gold)
    with pytest.raises(ModeError, match="^metadata: expected a plan made by"):
        ops.custom_npu_quant_lightning_indexer(*args, 0, 0, metadata=np.zeros(1024, np.int32), **kw)
    with pytest.raises(ModeError, match="^query_dtype: expected None with cmp_ratio 4"):
        ops.custom_npu_quant_lightning_indexer(*args, 0, 0, cmp_ratio=4, query_dtype=290, **kw)
    with pytest.raises(ModeError, match=r"^cmp_ratio: expected one of \[1, 2, 4"):
        ops.custom_npu_quant_lightning_indexer(*args, 0, 0, cmp_ratio=256, **kw)


def test_custom_binding_and_its_metadata_op():
    import ascend_emu.torch_npu  # noqa: F401  (registers the namespaces)

    args, kw, gold = _case([3, 1], [70, 33], 4)
    t = lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a  # noqa: E731
    tk = {k: t(v) for k, v in kw.items() if k not in ("query_quant_mode", "key_quant_mode")}
    tk["metadata"] = torch.ops.custom.npu_quant_lightning_indexer_metadata(
        64, 1, 128, 0, 0, actual_seq_lengths_query=tk["actual_seq_lengths_query"],
        actual_seq_lengths_key=tk["actual_seq_lengths_key"], batch_size=2, max_seqlen_q=3, max_seqlen_k=70,
        layout_query="TND", layout_key="PA_BSND", sparse_count=8, cmp_ratio=4)
    idx, vals = torch.ops.custom.npu_quant_lightning_indexer(*(t(a) for a in args), 0, 0, **tk)
    np.testing.assert_array_equal(idx.numpy().reshape(gold.shape), gold)
    assert tuple(vals.shape) == (0,) and vals.dtype == torch.float32


# ------------------------------------------------------------------ the Ascend 950: FP8 keys, fp32 scales
def _case950(q_lens, kv_lens, ratio, *, seed=3):
    """FP8 query / keys of small dyadic values (every dot exact in fp32), fp32 weights and scales."""
    import ml_dtypes

    fp8 = ml_dtypes.float8_e4m3fn
    rng = np.random.default_rng(seed)
    t = sum(q_lens)
    q = (rng.integers(-8, 9, (t, N1, D)) / 4).astype(fp8)
    w = rng.uniform(0, 0.5, (t, N1)).astype(np.float32)
    qs = rng.uniform(0, 2, (t, N1)).astype(np.float32)
    keys = [(rng.integers(-8, 9, (s // ratio, D)) / 4).astype(fp8) for s in kv_lens]
    kscales = [rng.uniform(0, 2, s // ratio).astype(np.float32) for s in kv_lens]
    need = [max(1, -(-len(kr) // BS)) for kr in keys]
    key = np.zeros((sum(need), BS, 1, D), fp8)
    kscale = np.zeros((sum(need), BS, 1), np.float32)
    table = np.zeros((len(kv_lens), max(need)), np.int32)
    blk = 0
    for b, (kr, ksr) in enumerate(zip(keys, kscales, strict=True)):
        for c in range(need[b]):
            table[b, c] = blk
            part = slice(c * BS, (c + 1) * BS)
            key[blk, :len(kr[part]), 0] = kr[part]
            kscale[blk, :len(ksr[part]), 0] = ksr[part]
            blk += 1
    act_q, act_k = np.cumsum(q_lens).astype(np.int32), np.array(kv_lens, np.int32)
    meta = ops.npu_vllm_quant_lightning_indexer_metadata(
        N1, 1, D, 0, 0, actual_seq_lengths_query=act_q, actual_seq_lengths_key=act_k, batch_size=len(kv_lens),
        max_seqlen_q=max(q_lens), max_seqlen_k=max(kv_lens), layout_query="TND", layout_key="PA_BSND",
        sparse_count=512, cmp_ratio=ratio)
    kw = dict(actual_seq_lengths_query=act_q, actual_seq_lengths_key=act_k, block_table=table, metadata=meta,
              layout_query="TND", layout_key="PA_BSND", sparse_count=512, sparse_mode=3, cmp_ratio=ratio)
    gold = ref.vllm_quant_lightning_indexer(q, w, qs, keys, kscales, q_lens, kv_lens, ratio, 512, 3,
                                            element="float8_e4m3fn")
    return (q, key, w, qs, kscale), kw, gold


def test_ascend950_fp8_path(monkeypatch):
    """FP8 keys with fp32 weights and scales on an emulated Ascend 950: request 0 sees 525 rows
    (the top 512 by score), request 1 sees 15 (listed in row order, as the 950 kernel does);
    int8 / sparse_count other than 512 / cmp_ratio 2 rejected there; FP8 rejected on A2."""
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    args, kw, gold = _case950([1, 2], [2100, 60], 4)
    idx, _ = ops.npu_vllm_quant_lightning_indexer(*args, **kw)
    np.testing.assert_array_equal(idx.reshape(gold.shape), gold)
    assert list(gold[1, :16]) == list(range(14)) + [-1, -1]  # position 58 sees 59 // 4 = 14 rows
    with pytest.raises(ModeError, match="^sparse_count: expected one of \\[512\\]"):
        ops.npu_vllm_quant_lightning_indexer(*args, **{**kw, "sparse_count": 256})
    with pytest.raises(ModeError, match="^cmp_ratio: expected one of \\[1, 4, 128\\]"):
        ops.npu_vllm_quant_lightning_indexer(*args, **{**kw, "cmp_ratio": 2})
    with pytest.raises(DTypeError, match="^query: expected dtype float8_e4m3fn"):
        ops.npu_vllm_quant_lightning_indexer(args[0].view(np.int8), *args[1:], **kw)
    with pytest.raises(DTypeError, match="^query_dequant_scale: expected dtype float32"):
        ops.npu_vllm_quant_lightning_indexer(*args[:3], args[3].astype(np.float16), args[4], **kw)
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend910B2")
    with pytest.raises(DTypeError, match="^query: expected dtype int8 .*Ascend910B2"):
        ops.npu_vllm_quant_lightning_indexer(*args, **{**kw, "sparse_count": 8})
