"""npu_lightning_indexer against the plain-loop reference (tests/reference/lightning_indexer.py).

Two kinds of data:
- ``int``: small integers in query / key / weights, so every fp32 score is exact whatever the
  summation order and equal scores are frequent: indices must equal the reference exactly,
  which checks the lower-index-first tie rule, and values are the exact scores rounded once.
- ``random``: uniform floats; the kernel's fp32 scores differ from the float64 reference in the
  last bits, so indices must match except for swaps between scores closer than the fp32 error
  bound, and values within one ulp of the query dtype.
"""

from __future__ import annotations

import zlib

import numba
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from tests.helpers import BF16, raw
from tests.reference.lightning_indexer import lightning_indexer as indexer_ref

N1, D = 64, 128
LAYOUTS = [("BSND", "BSND"), ("TND", "TND"), ("BSND", "PA_BSND"), ("TND", "PA_BSND")]
DTYPES = [BF16, np.dtype(np.float16)]
SPARSE_MODES = [0, 3]
#: fp32 error bound of a score, relative to sum_h |w_h| * |q_h| . |k| (128 + 64 fp32 additions).
SCORE_RTOL = 2e-5
ULP = {BF16: 2.0 ** -7, np.dtype(np.float16): 2.0 ** -10}


# ---------------------------------------------------------------------- cases
def _values(rng, shape, dtype, data):
    if data == "int":
        return rng.integers(-1, 2, shape).astype(np.float32).astype(dtype)
    return rng.uniform(-1, 1, shape).astype(dtype)


def make_case(rng, layout_q, layout_k, dtype, q_lens, kv_lens, *, s1=None, s2=None, block_size=16, data="random",
              same_keys=False, n1=N1, weights_dtype=None):
    """Inputs and kwargs of one call. BSND pads each batch to s1 / s2 rows; PA_BSND scatters the
    blocks of every batch over a shuffled cache with two spare blocks and -1 past the needed
    table entries. ``n1`` query heads; weights in ``weights_dtype`` (default: the query dtype)."""
    b = len(q_lens)
    w_dtype = dtype if weights_dtype is None else weights_dtype
    kw = dict(layout_query=layout_q, layout_key=layout_k)
    if layout_q == "BSND":
        s1 = s1 or max(q_lens)
        query = _values(rng, (b, s1, n1, D), dtype, data)
        weights = _values(rng, (b, s1, n1), w_dtype, data)
        kw["actual_seq_lengths_query"] = np.array(q_lens, np.int32)
    else:
        t = sum(q_lens)
        query = _values(rng, (t, n1, D), dtype, data)
        weights = _values(rng, (t, n1), w_dtype, data)
        kw["actual_seq_lengths_query"] = np.cumsum(q_lens).astype(np.int32)
    if data == "int":
        weights = rng.choice([-2.0, -1.0, 1.0, 2.0], weights.shape).astype(w_dtype)
    if layout_k == "BSND":
        s2 = s2 or max(kv_lens)
        key = _values(rng, (b, s2, 1, D), dtype, data)
        kw["actual_seq_lengths_key"] = np.array(kv_lens, np.int32)
    elif layout_k == "TND":
        key = _values(rng, (sum(kv_lens), 1, D), dtype, data)
        kw["actual_seq_lengths_key"] = np.cumsum(kv_lens).astype(np.int32)
    else:
        need = [-(-n // block_size) for n in kv_lens]
        blocks = sum(need) + 2
        key = _values(rng, (blocks, block_size, 1, D), dtype, data)
        perm = rng.permutation(blocks)
        table = np.full((b, max(need) + 1), -1, np.int32)
        used = 0
        for i, n in enumerate(need):
            table[i, :n] = perm[used:used + n]
            used += n
        kw["block_table"] = table
        kw["actual_seq_lengths_key"] = np.array(kv_lens, np.int32)
    if same_keys:
        key[...] = key.reshape(-1, D)[0]
    return query, key, weights, kw


def run_both(query, key, weights, kw, sparse_count, sparse_mode):
    out = ops.npu_lightning_indexer(query, key, weights, sparse_count=sparse_count, sparse_mode=sparse_mode,
                                    return_value=True, **kw)
    ref = indexer_ref(query, key, weights, sparse_count=sparse_count, sparse_mode=sparse_mode, **kw)
    return out, ref


def _score_scale(query, weights, key, kw):
    """Per query token, max over all cache keys of sum_h |w_h| * |q_h| . |k| (error scale)."""
    q = np.abs(query.reshape(-1, query.shape[-2], D).astype(np.float64))
    w = np.abs(weights.reshape(-1, query.shape[-2]).astype(np.float64))
    k = np.abs(key.reshape(-1, D).astype(np.float64))
    return (np.einsum("th,thd,pd->tp", w, q, k)).max(axis=1)  # [T]


def check(out, ref, dtype, *, exact, scale=None):
    idx, val = out
    r_idx, r_val, r_scores = ref
    assert idx.dtype == np.int32 and idx.shape == r_idx.shape
    assert val.dtype == dtype and val.shape == r_idx.shape
    k = idx.shape[-1]
    idx, val = idx.reshape(-1, k), val.reshape(-1, k).astype(np.float64)
    r_idx, r_val = r_idx.reshape(-1, k), r_val.reshape(-1, k)
    for t in range(idx.shape[0]):
        where = f"token {t}"
        if r_scores[t] is None:  # skipped row
            assert (idx[t] == -1).all(), where
            assert (val[t] == 0.0).all(), where
            continue
        s = r_scores[t]
        n = min(k, s.size)
        assert (idx[t, n:] == -1).all(), where
        assert np.isneginf(val[t, n:]).all(), where
        got = idx[t, :n]
        if exact:
            np.testing.assert_array_equal(got, r_idx[t, :n], err_msg=where)
            want = s[got].astype(np.float32).astype(dtype).astype(np.float64)
            np.testing.assert_array_equal(val[t, :n], want, err_msg=where)
        else:
            assert ((got >= 0) & (got < s.size)).all() and np.unique(got).size == n, where
            tol = SCORE_RTOL * scale[t]
            np.testing.assert_allclose(s[got], s[r_idx[t, :n]], rtol=0, atol=tol, err_msg=where)
            want = s[got].astype(np.float32).astype(dtype).astype(np.float64)
            np.testing.assert_allclose(val[t, :n], want, rtol=ULP[dtype], atol=tol, err_msg=where)


# ---------------------------------------------------------------------- sweeps
# (q_lens, kv_lens, sparse_count): decode, MTP / short prefill, k larger than every kv length,
# an empty batch, kv shorter than q (causal rows with no visible key).
SHAPES = [
    ([1, 1, 1], [37, 16, 70], 24),
    ([3, 1, 4], [40, 25, 33], 16),
    ([2, 5], [9, 40], 64),
    ([2, 0, 3], [20, 30, 0], 8),
    ([5, 2], [3, 48], 6),
]


@pytest.mark.parametrize("layout_q,layout_k", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sparse_mode", SPARSE_MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"q{s[0]}-kv{s[1]}-k{s[2]}")
def test_integer_scores_match_reference_exactly(layout_q, layout_k, dtype, sparse_mode, shape):
    q_lens, kv_lens, k = shape
    rng = np.random.default_rng(zlib.crc32(repr((layout_q, layout_k, str(dtype), sparse_mode, shape)).encode()))
    s1 = max(q_lens) + (1 if layout_q == "BSND" else 0)  # one padding row past every batch
    query, key, weights, kw = make_case(rng, layout_q, layout_k, dtype, q_lens, kv_lens, s1=s1, data="int")
    out, ref = run_both(query, key, weights, kw, k, sparse_mode)
    check(out, ref, dtype, exact=True)
    # the data really has ties: some row selects two equal scores
    ties = [s for s in ref[2] if s is not None and np.unique(s).size < s.size]
    assert ties


@pytest.mark.parametrize("layout_q,layout_k", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sparse_mode", SPARSE_MODES)
def test_random_scores_match_reference(layout_q, layout_k, dtype, sparse_mode):
    rng = np.random.default_rng(7 + sparse_mode)
    q_lens, kv_lens, k = [3, 1, 2], [50, 17, 41], 20
    query, key, weights, kw = make_case(rng, layout_q, layout_k, dtype, q_lens, kv_lens, block_size=32)
    out, ref = run_both(query, key, weights, kw, k, sparse_mode)
    check(out, ref, dtype, exact=False, scale=_score_scale(query, weights, key, kw))
    # no near ties at this size: every index equal
    got, want = out[0].reshape(-1, k), ref[0].reshape(-1, k)
    assert np.mean(got == want) > 0.99


#: (query heads N1, weights dtype): the current doc / A2 / A3 tiling take N1 <= 64 and fp32 weights.
HEADS_AND_WEIGHTS = [(1, None), (8, np.float32), (20, None), (48, np.float32), (64, np.float32)]


@pytest.mark.parametrize("n1,w_dtype", HEADS_AND_WEIGHTS, ids=lambda v: str(v) if isinstance(v, int) else
                         np.dtype(v).name if v is not None else "qdt")
@pytest.mark.parametrize("layout_q,layout_k", [("BSND", "PA_BSND"), ("TND", "TND")])
def test_fewer_heads_and_fp32_weights_match_reference(n1, w_dtype, layout_q, layout_k):
    """Any N1 in [1, 64] (the head sum's lane order covers partial groups) and fp32 weights,
    integer data (exact) and random data (fp32 error bound) against the reference."""
    rng = np.random.default_rng(zlib.crc32(repr((n1, w_dtype, layout_q)).encode()))
    q_lens, kv_lens = [2, 1], [30, 45]
    for data, exact in (("int", True), ("random", False)):
        query, key, weights, kw = make_case(rng, layout_q, layout_k, BF16, q_lens, kv_lens, data=data, n1=n1,
                                            weights_dtype=w_dtype)
        assert query.shape[-2] == n1 and weights.dtype == (w_dtype or BF16)
        out, ref = run_both(query, key, weights, kw, 12, 0)
        check(out, ref, BF16, exact=exact, scale=None if exact else _score_scale(query, weights, key, kw))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp32_weights_are_not_rounded_to_the_query_dtype(dtype):
    """Key 1 scores w0 = 1 + 2**-12, key 0 scores w1 = 1: with the fp32 weight as given key 1
    ranks first (the reference's order); a weight rounded to bf16 / fp16 (1.0) would tie and put
    key 0 first."""
    query = np.zeros((1, 1, 2, D), dtype)
    query[0, 0, 0, 0] = query[0, 0, 1, 1] = 1  # head 0 reads dim 0, head 1 dim 1
    key = np.zeros((1, 2, 1, D), dtype)
    key[0, 0, 0, 1] = key[0, 1, 0, 0] = 1  # key 0 answers head 1, key 1 head 0
    weights = np.array([[[1 + 2.0 ** -12, 1.0]]], np.float32)
    kw = dict(layout_query="BSND", layout_key="BSND")
    idx, _ = ops.npu_lightning_indexer(query, key, weights, sparse_count=2, sparse_mode=0, **kw)
    r_idx, _, _ = indexer_ref(query, key, weights, sparse_count=2, sparse_mode=0, **kw)
    np.testing.assert_array_equal(r_idx.reshape(-1), [1, 0])
    np.testing.assert_array_equal(idx.reshape(-1), r_idx.reshape(-1))


@pytest.mark.parametrize("sparse_mode", SPARSE_MODES)
def test_equal_scores_keep_lower_index_first(sparse_mode):
    """Every key identical: all scores tie, the output is 0, 1, 2, ... up to the visible length."""
    rng = np.random.default_rng(3)
    q_lens, kv_lens, k = [3], [40], 32
    query, key, weights, kw = make_case(rng, "BSND", "PA_BSND", BF16, q_lens, kv_lens, data="int", same_keys=True)
    idx, val = ops.npu_lightning_indexer(query, key, weights, sparse_count=k, sparse_mode=sparse_mode,
                                         return_value=True, **kw)
    for s in range(3):
        visible = 40 if sparse_mode == 0 else 40 - 3 + s + 1
        want = np.full(k, -1)
        want[:min(k, visible)] = np.arange(min(k, visible))
        np.testing.assert_array_equal(idx[0, s, 0], want)
        assert np.unique(val[0, s, 0, :min(k, visible)].astype(np.float32)).size == 1


def test_causal_limit_and_padding_rows():
    """sparse_mode 3: row s sees act_kv - act_q + s + 1 keys; rows past act_q (BSND) are skipped
    (-1, value 0); a causal row with no visible key is computed (-1, value -inf)."""
    rng = np.random.default_rng(5)
    query, key, weights, kw = make_case(rng, "BSND", "BSND", BF16, [4, 2], [3, 10], s1=5)
    idx, val = ops.npu_lightning_indexer(query, key, weights, sparse_count=16, return_value=True, **kw)
    counts = (idx[..., 0, :] >= 0).sum(axis=-1)  # [B, S1]
    np.testing.assert_array_equal(counts, [[0, 1, 2, 3, 0], [9, 10, 0, 0, 0]])
    assert np.isneginf(val[0, 0, 0].astype(np.float32)).all()  # limit 0: computed, nothing visible
    assert (val[0, 4, 0].astype(np.float32) == 0).all() and (val[1, 2:, 0].astype(np.float32) == 0).all()
    assert idx[1, 0, 0, :9].max() == 8  # limit 9: position 9 is masked


def test_without_return_value_second_output_is_empty():
    rng = np.random.default_rng(1)
    query, key, weights, kw = make_case(rng, "TND", "TND", np.dtype(np.float16), [2, 1], [12, 30])
    idx, val = ops.npu_lightning_indexer(query, key, weights, sparse_count=8, **kw)
    assert idx.shape == (3, 1, 8) and val.shape == (0,) and val.dtype == np.float16
    idx2, _ = ops.npu_lightning_indexer(query, key, weights, sparse_count=8, return_value=True, **kw)
    np.testing.assert_array_equal(idx, idx2)


def test_default_lengths_bsnd():
    """BSND without actual lengths: every query row and kv token is used (defaults = S1, S2)."""
    rng = np.random.default_rng(2)
    query, key, weights, kw = make_case(rng, "BSND", "BSND", BF16, [2, 2], [24, 24], data="int")
    del kw["actual_seq_lengths_query"], kw["actual_seq_lengths_key"]
    out, ref = run_both(query, key, weights, kw, 16, 3)
    check(out, ref, BF16, exact=True)


def test_realistic_decode_shape():
    """DeepSeek-V3.2 decode: 64 heads, 2048 of 4096 (+ a 1000-token batch), block_size 128."""
    rng = np.random.default_rng(11)
    query, key, weights, kw = make_case(rng, "BSND", "PA_BSND", BF16, [1, 1], [4096, 1000], block_size=128)
    out, ref = run_both(query, key, weights, kw, 2048, 3)
    check(out, ref, BF16, exact=False, scale=_score_scale(query, weights, key, kw))


def test_thread_count_does_not_change_bytes(monkeypatch):
    """The parallel kernels (forced on at this small size) give the serial path's bytes with 1 and
    2 Numba threads."""
    import ascend_emu.emu.lightning_indexer as emu_indexer
    rng = np.random.default_rng(4)
    query, key, weights, kw = make_case(rng, "TND", "PA_BSND", BF16, [3, 4, 2, 5], [60, 45, 80, 33])

    def call():
        out = ops.npu_lightning_indexer(query, key, weights, sparse_count=24, return_value=True, **kw)
        return [raw(x).copy() for x in out]

    results = [call()]  # serial
    monkeypatch.setattr(emu_indexer, "PARALLEL_MIN_ROWS", 0)
    monkeypatch.setattr(emu_indexer, "PARALLEL_MIN_SCORES", 0)
    old = numba.get_num_threads()
    try:
        for n in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(n)
            results.append(call())
    finally:
        numba.set_num_threads(old)
    for other in results[1:]:
        for one, two in zip(results[0], other, strict=True):
            assert np.array_equal(one, two)


# ---------------------------------------------------------------------- bad input
def _good():
    rng = np.random.default_rng(9)
    query, key, weights, kw = make_case(rng, "BSND", "PA_BSND", BF16, [2, 1], [20, 40], s1=2)
    return dict(query=query, key=key, weights=weights, **kw)


def _with(**changes):
    args = _good()
    for name, value in changes.items():
        if callable(value):
            value = value(args)
        args[name] = value
    return args


BAD = [
    ("layout_query", ModeError, "layout_query", dict(layout_query="BNSD")),
    ("layout_key", ModeError, "layout_key", dict(layout_key="PA_NZ")),
    ("layout_key_mismatch", ModeError, "layout_key", dict(layout_key="TND")),
    ("sparse_mode", ModeError, "sparse_mode", dict(sparse_mode=1)),
    ("sparse_mode_type", DTypeError, "sparse_mode", dict(sparse_mode=3.0)),
    ("sparse_count_zero", ModeError, "sparse_count", dict(sparse_count=0)),
    ("sparse_count_2049", ModeError, "sparse_count", dict(sparse_count=2049)),
    ("sparse_count_3500", ModeError, "sparse_count", dict(sparse_count=3500)),  # 3072-8192 in steps of 1024 only
    ("sparse_count_bool", DTypeError, "sparse_count", dict(sparse_count=True)),
    ("pre_tokens", ModeError, "pre_tokens", dict(pre_tokens=128)),
    ("next_tokens", ModeError, "next_tokens", dict(next_tokens=0)),
    ("return_value", DTypeError, "return_value", dict(return_value=1)),
    ("query_none", ShapeError, "query", dict(query=None)),
    ("query_dtype", DTypeError, "query", dict(query=lambda a: a["query"].astype(np.float32))),
    ("query_heads_65", ShapeError, r"query: .*N1 .*\[1, 64\]",
     dict(query=lambda a: np.concatenate([a["query"], a["query"][:, :, :1]], axis=2),
          weights=lambda a: np.concatenate([a["weights"], a["weights"][:, :, :1]], axis=2))),
    ("query_dim", ShapeError, "query", dict(query=lambda a: a["query"][..., :64].copy())),
    ("query_strided", ShapeError, "query", dict(query=lambda a: np.repeat(a["query"], 2, axis=1)[:, ::2])),
    ("query_empty", ShapeError, "query", dict(query=lambda a: a["query"][:0])),
    ("key_dtype", DTypeError, "key", dict(key=lambda a: a["key"].astype(np.float16))),
    ("key_heads", ShapeError, "key", dict(key=lambda a: np.repeat(a["key"], 2, axis=2))),
    ("key_block_size", ShapeError, "block_size", dict(key=lambda a: a["key"][:, :8].copy())),
    ("weights_dtype", DTypeError, "weights", dict(weights=lambda a: a["weights"].astype(np.float16))),
    ("weights_fp64", DTypeError, "weights", dict(weights=lambda a: a["weights"].astype(np.float64))),
    ("weights_shape", ShapeError, "weights", dict(weights=lambda a: a["weights"][:, :1].copy())),
    ("act_q_dtype", DTypeError, "actual_seq_lengths_query",
     dict(actual_seq_lengths_query=np.array([2, 1], np.int64))),
    ("act_q_len", ShapeError, "actual_seq_lengths_query", dict(actual_seq_lengths_query=np.array([2], np.int32))),
    ("act_q_range", ShapeError, r"actual_seq_lengths_query\[0\]",
     dict(actual_seq_lengths_query=np.array([3, 1], np.int32))),
    ("act_k_missing", ModeError, "actual_seq_lengths_key", dict(actual_seq_lengths_key=None)),
    ("act_k_negative", ShapeError, r"actual_seq_lengths_key\[1\]",
     dict(actual_seq_lengths_key=np.array([20, -1], np.int32))),
    ("act_k_past_table", ShapeError, "block_table", dict(actual_seq_lengths_key=np.array([20, 500], np.int32))),
    ("block_table_missing", ModeError, "block_table", dict(block_table=None)),
    ("block_table_dtype", DTypeError, "block_table", dict(block_table=lambda a: a["block_table"].astype(np.int64))),
    ("block_table_entry", IndexRangeError, r"block_table\[1, 2\] = 99",
     dict(block_table=lambda a: np.where(np.arange(a["block_table"].shape[1]) == 2, 99,
                                         a["block_table"]).astype(np.int32))),
    ("block_table_negative", IndexRangeError, r"block_table\[0, 0\] = -1",
     dict(block_table=lambda a: np.where(np.arange(a["block_table"].shape[1]) == 0, -1,
                                         a["block_table"]).astype(np.int32))),
]


@pytest.mark.parametrize("name,error,fragment,changes", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument(name, error, fragment, changes):
    with pytest.raises(error, match=fragment):
        ops.npu_lightning_indexer(**_with(**changes))


def _tnd_args():
    rng = np.random.default_rng(10)
    query, key, weights, kw = make_case(rng, "TND", "TND", BF16, [2, 3], [10, 20])
    return dict(query=query, key=key, weights=weights, **kw)


@pytest.mark.parametrize("change,error,fragment", [
    (dict(actual_seq_lengths_query=None), ModeError, "actual_seq_lengths_query"),
    (dict(actual_seq_lengths_query=np.array([3, 2], np.int32)), ShapeError, r"actual_seq_lengths_query\[1\]"),
    (dict(actual_seq_lengths_query=np.array([2, 4], np.int32)), ShapeError, r"actual_seq_lengths_query\[1\]"),
    (dict(actual_seq_lengths_key=None), ModeError, "actual_seq_lengths_key"),
    (dict(actual_seq_lengths_key=np.array([10, 31], np.int32)), ShapeError, r"actual_seq_lengths_key\[1\]"),
    (dict(actual_seq_lengths_key=np.array([10], np.int32)), ShapeError, "actual_seq_lengths_key"),
    (dict(block_table=np.zeros((2, 4), np.int32)), ModeError, "block_table"),
], ids=["act_q_missing", "act_q_decreasing", "act_q_not_T", "act_k_missing", "act_k_not_T2", "act_k_batches",
        "block_table_unpaged"])
def test_bad_tnd_input_names_the_argument(change, error, fragment):
    args = _tnd_args()
    args.update(change)
    with pytest.raises(error, match=fragment):
        ops.npu_lightning_indexer(**args)


def test_bsnd_key_batch_and_length_checked():
    rng = np.random.default_rng(12)
    query, key, weights, kw = make_case(rng, "BSND", "BSND", BF16, [1, 1], [10, 12])
    with pytest.raises(ShapeError, match="key"):
        ops.npu_lightning_indexer(query, key[:1].copy(), weights, **kw)
    kw["actual_seq_lengths_key"] = np.array([10, 13], np.int32)
    with pytest.raises(ShapeError, match=r"actual_seq_lengths_key\[1\]"):
        ops.npu_lightning_indexer(query, key, weights, **kw)


# ---------------------------------------------------------------------- torch_npu drop-in
def test_torch_npu_drop_in_matches_numpy_op():
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    rng = np.random.default_rng(13)
    query, key, weights, kw = make_case(rng, "BSND", "PA_BSND", BF16, [1, 2], [30, 50])
    want_idx, want_val = ops.npu_lightning_indexer(query, key, weights, sparse_count=16, return_value=True, **kw)

    def t(a):
        x = torch.from_numpy(a.view(np.int16) if a.dtype == BF16 else a)
        return (x.view(torch.bfloat16) if a.dtype == BF16 else x).npu()

    idx, val = torch_npu.npu_lightning_indexer(
        t(query), t(key), t(weights), actual_seq_lengths_query=t(kw["actual_seq_lengths_query"]),
        actual_seq_lengths_key=t(kw["actual_seq_lengths_key"]), block_table=t(kw["block_table"]),
        layout_query="BSND", layout_key="PA_BSND", sparse_count=16, sparse_mode=3, return_value=True)
    assert idx.dtype == torch.int32 and val.dtype == torch.bfloat16
    np.testing.assert_array_equal(idx.cpu().numpy(), want_idx)
    np.testing.assert_array_equal(val.cpu().view(torch.int16).numpy(), want_val.view(np.int16))
    _, empty = torch_npu.npu_lightning_indexer(t(query), t(key), t(weights), block_table=t(kw["block_table"]),
                                               actual_seq_lengths_key=t(kw["actual_seq_lengths_key"]),
                                               layout_key="PA_BSND", sparse_count=16)
    assert tuple(empty.shape) == (0,)


def test_query_chunks_do_not_change_bytes(monkeypatch):
    """Long prefills run in chunks of query tokens; a chunk of one token gives the same bytes."""
    import ascend_emu.emu.lightning_indexer as emu_indexer

    rng = np.random.default_rng(14)
    query, key, weights, kw = make_case(rng, "BSND", "BSND", BF16, [6, 3], [40, 25])
    whole = ops.npu_lightning_indexer(query, key, weights, sparse_count=16, return_value=True, **kw)
    monkeypatch.setattr(emu_indexer, "CHUNK_BYTES", 1)
    chunked = ops.npu_lightning_indexer(query, key, weights, sparse_count=16, return_value=True, **kw)
    for one, two in zip(whole, chunked, strict=True):
        assert np.array_equal(raw(one), raw(two))


def test_head_sum_follows_the_kernel_order():
    """Products whose fp32 sum depends on the order: +2**24 (head 0), -2**24 (head 1), 1 (heads
    16, 17). The kernel's lanes give (2**24 + 1) + (-2**24 + 1) = 2**24 - (2**24 - 1) = 1; head
    order or exact arithmetic give 2. Dots are exact (one non-zero dim), so BLAS order is moot."""
    from tests.reference.lightning_indexer import head_sum_kernel_order

    c = np.zeros(N1, np.float32)  # q[h, 0]
    w = np.zeros(N1, np.float32)
    c[[0, 1, 16, 17]] = [2.0 ** 12, 2.0 ** 12, 1, 1]
    w[[0, 1, 16, 17]] = [2.0 ** 12, -2.0 ** 12, 1, 1]
    query = np.zeros((1, 1, N1, D), BF16)
    query[0, 0, :, 0] = c.astype(BF16)
    key = np.zeros((1, 1, 1, D), BF16)
    key[0, 0, 0, 0] = 1
    weights = w.astype(BF16).reshape(1, 1, N1)
    idx, val = ops.npu_lightning_indexer(query, key, weights, sparse_count=1, return_value=True)
    want = head_sum_kernel_order(np.maximum(c, 0) * w)
    assert want == 1.0 and float(np.sum(np.maximum(c, 0).astype(np.float64) * w)) == 2.0
    assert idx[0, 0, 0, 0] == 0 and float(val[0, 0, 0, 0]) == want


def test_large_sparse_count_pads_with_minus_one():
    rng = np.random.default_rng(15)
    query, key, weights, kw = make_case(rng, "TND", "PA_BSND", np.dtype(np.float16), [1, 2], [40, 7], data="int")
    out, ref = run_both(query, key, weights, kw, 3072, 3)
    check(out, ref, np.dtype(np.float16), exact=True)
    assert out[0].shape == (3, 1, 3072) and (out[0][:, :, 40:] == -1).all()


def test_numpy_signature_is_the_schema():
    """torch_npu 2.14: npu_lightning_indexer(Tensor query, Tensor key, Tensor weights, *, ...) (the drop-in
    registers the stored schema itself: tests/test_torch_npu_registry.py)."""
    import inspect

    big = 9223372036854775807
    want = [("query", None), ("key", None), ("weights", None), ("actual_seq_lengths_query", None),
            ("actual_seq_lengths_key", None), ("block_table", None), ("layout_query", "BSND"),
            ("layout_key", "BSND"), ("sparse_count", 2048), ("sparse_mode", 3), ("pre_tokens", big),
            ("next_tokens", big), ("return_value", False)]
    for fn in (ops.npu_lightning_indexer,):
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params] == [n for n, _ in want]
        assert [p.kind for p in params[:3]] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 3
        assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in params[3:])
        assert [p.default for p in params[3:]] == [d for _, d in want[3:]]


#: Bad values that keep the good call's signature: the memoised path checks them on every call.
SAME_SIGNATURE = [b for b in BAD if b[0] in ("act_q_range", "act_k_negative", "act_k_past_table",
                                             "block_table_entry", "block_table_negative")]


@pytest.mark.parametrize("name,error,fragment,changes", SAME_SIGNATURE, ids=[b[0] for b in SAME_SIGNATURE])
def test_memoised_signature_rejects_bad_values_with_the_same_message(name, error, fragment, changes):
    from ascend_emu.ops import lightning_indexer as contract

    contract._VALIDATED.clear()
    with pytest.raises(error, match=fragment) as cold:  # first call: every check in full
        ops.npu_lightning_indexer(**_with(**changes))
    ops.npu_lightning_indexer(**_good())  # memoises the signature
    assert len(contract._VALIDATED) == 1
    with pytest.raises(error) as warm:
        ops.npu_lightning_indexer(**_with(**changes))
    assert str(warm.value) == str(cold.value)
