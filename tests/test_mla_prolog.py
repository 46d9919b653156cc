"""npu_mla_prolog / _v2 / _v3 (non-quant) against tests/reference/mla_prolog.py.

Real DeepSeek dims (He=7168, Hcq=1536, Hckv=512, D=128, Dr=64) with few tokens and heads.
Outputs: ops_reference §2.5's dual 0.005 criterion plus a floor on the bit-identical share.
Caches: poison-filled; bytes outside written rows must be unchanged, written rows are read back
through the reference's own layout code and held to the same criterion.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numba
import numpy as np
import pytest

from ascend_emu.errors import (DTypeError, DuplicateSlotWarning, FormatError, IndexRangeError, ModeError,
                               ShapeError)
from ascend_emu.ops import npu_format_cast, npu_mla_prolog, npu_mla_prolog_v2, npu_mla_prolog_v3
from tests.helpers import assert_same_bytes, bit_identical_share, dual_threshold_ok, poisoned, raw
from tests.reference import mla_prolog as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
HE, HCQ, HCKV, D, DR = 7168, 1536, 512, 128, 64
N_MAX = 4
PREC = 0.005
#: Bit-identical share floors, a little below the shares measured against the reference.
SHARE_FLOOR = {"query": 0.997, "query_rope": 0.996, "query_norm": 0.996, "kv": 0.997, "kr": 0.998}

VERSIONS = (1, 2, 3)
#: (version, cache_mode) pairs of the paged modes each version accepts.
PAGED_CASES = [(v, m) for v in VERSIONS for m in ("PA_BSND", "PA_NZ")] + [(3, "PA_BLK_BSND"), (3, "PA_BLK_NZ")]
BLOCK_SIZES = (16, 128)
RANKS = (2, 3)
#: Tokens of the sweeps: [B, S] for 3-D input, T for 2-D.
BATCH, SEQ = 2, 3
TOKENS = 5


# ---------------------------------------------------------------------- data
def rand(rng, shape) -> np.ndarray:
    """bf16 uniform [0, 1): the official tests' and the seed examples' ``torch.rand`` data."""
    return rng.random(shape, dtype=np.float32).astype(BF16)


#: Tokens in the shared pool; every test uses a prefix of it.
POOL = 80


class Data:
    """Random weights (NZ-cast per head count, float64 copies for the reference) and a token pool
    whose reference results are computed once per head count (the reference is per token)."""

    def __init__(self, rng):
        self.w_dq = rand(rng, (HE, HCQ))  # [He, Hcq]
        self.w_uq_qr = rand(rng, (HCQ, N_MAX * (D + DR)))  # [Hcq, N*(D+Dr)]
        self.w_uk = rand(rng, (N_MAX, D, HCKV))  # [N, D, Hckv]
        self.w_dkv_kr = rand(rng, (HE, HCKV + DR))  # [He, Hckv+Dr]
        self.gamma_cq = rand(rng, (HCQ,))  # [Hcq]
        self.gamma_ckv = rand(rng, (HCKV,))  # [Hckv]
        self.x, self.sin, self.cos = rand(rng, (POOL, HE)), rand(rng, (POOL, DR)), rand(rng, (POOL, DR))
        self.w_dq64 = self.w_dq.astype(np.float64)
        self.w_dkv_kr64 = self.w_dkv_kr.astype(np.float64)
        self.w_dq_nz = npu_format_cast(self.w_dq, 29)
        self.w_dkv_kr_nz = npu_format_cast(self.w_dkv_kr, 29)
        self._per_n = {}
        self._gold = {}

    def heads(self, n: int):
        """(weight_uq_qr NZ, weight_uk, w_uq_qr float64, w_uk float64) for the first n heads."""
        if n not in self._per_n:
            w_uq_qr = np.ascontiguousarray(self.w_uq_qr[:, : n * (D + DR)])
            w_uk = np.ascontiguousarray(self.w_uk[:n])
            self._per_n[n] = (npu_format_cast(w_uq_qr, 29), w_uk, w_uq_qr.astype(np.float64),
                              w_uk.astype(np.float64))
        return self._per_n[n]

    def reference(self, n: int, t: int, **kw) -> dict:
        """Reference results for the first t pool tokens (default arguments cached per n)."""
        if kw or n not in self._gold:
            _, _, w_uq_qr64, w_uk64 = self.heads(n)
            m = t if kw else POOL
            gold = ref.mla_prolog(self.x[:m], self.w_dq64, w_uq_qr64, w_uk64, self.w_dkv_kr64, self.gamma_cq,
                                  self.gamma_ckv, self.sin[:m], self.cos[:m], **kw)
            if kw:
                return gold
            self._gold[n] = gold
        return {k: v[:t] for k, v in self._gold[n].items()}


@pytest.fixture(scope="module")
def data():
    return Data(np.random.default_rng(7))


def make_tokens(data, batch_shape):
    """token_x, rope_sin, rope_cos: copies of the first prod(batch_shape) pool tokens."""
    t = int(np.prod(batch_shape))
    return tuple(a[:t].reshape(batch_shape + (a.shape[1],)).copy() for a in (data.x, data.sin, data.cos))


def call(version, data, n, x, sin, cos, kv_cache, kr_cache, cache_index, *, cache_mode="PA_BSND", **kw):
    """Call one entry point with the positional layout of its signature."""
    w_uq_qr, w_uk, _, _ = data.heads(n)
    args = (x, data.w_dq_nz, w_uq_qr, w_uk, data.w_dkv_kr_nz, data.gamma_cq, data.gamma_ckv, sin, cos)
    if version == 3:
        return npu_mla_prolog_v3(*args, kv_cache, kr_cache, cache_index=cache_index, cache_mode=cache_mode, **kw)
    fn = npu_mla_prolog if version == 1 else npu_mla_prolog_v2
    return fn(*args, cache_index, kv_cache, kr_cache, cache_mode=cache_mode, **kw)


def paged_caches(block_num, block_size):
    return (poisoned((block_num, block_size, 1, HCKV), BF16),  # [BlockNum, BlockSize, 1, Hckv]
            poisoned((block_num, block_size, 1, DR), BF16))  # [BlockNum, BlockSize, 1, Dr]


# ---------------------------------------------------------------------- checks
def assert_close(actual, golden, what):
    assert actual.dtype == golden.dtype and actual.shape == golden.shape, \
        f"{what}: {actual.dtype}{list(actual.shape)} vs {golden.dtype}{list(golden.shape)}"
    assert dual_threshold_ok(actual, golden, PREC), f"{what}: fails the dual {PREC} criterion"
    share = bit_identical_share(actual, golden)
    assert share >= SHARE_FLOOR[what], f"{what}: bit-identical share {share:.4f} < {SHARE_FLOOR[what]}"


def assert_queries(out, gold, batch_shape, n):
    query, query_rope = out[0], out[1]
    assert query.shape == batch_shape + (n, HCKV) and query_rope.shape == batch_shape + (n, DR)
    assert_close(query.reshape(-1, n, HCKV), gold["query"], "query")
    assert_close(query_rope.reshape(-1, n, DR), gold["query_rope"], "query_rope")


def assert_cache(actual, before, rows, slots, *, nz, block_size, what):
    """Untouched bytes exact; written rows (last writer per slot) within the criterion."""
    expected = before.copy()
    ref.write_rows(expected, rows, slots, nz=nz, block_size=block_size)
    marker = np.dtype(f"u{actual.dtype.itemsize}")  # same itemsize, so the same NZ C0
    mask = np.zeros(actual.shape, dtype=marker)
    ref.write_rows(mask, np.ones((len(slots), actual.shape[-1]), dtype=marker), slots, nz=nz, block_size=block_size)
    byte_mask = np.repeat(mask.reshape(-1) != 0, actual.dtype.itemsize)
    assert_same_bytes(raw(actual)[~byte_mask], raw(before)[~byte_mask], f"{what} outside the written rows")
    live = sorted({s for s in slots if s >= 0})
    assert len(live) * actual.shape[-1] == int(mask.sum())
    got = ref.read_rows(actual, live, nz=nz, block_size=block_size)
    want = ref.read_rows(expected, live, nz=nz, block_size=block_size)
    assert_close(got, want, what)


def assert_caches(kv_cache, kr_cache, kv_before, kr_before, gold, slots, *, nz, block_size):
    assert_cache(kv_cache, kv_before, gold["kv"], slots, nz=nz, block_size=block_size, what="kv")
    assert_cache(kr_cache, kr_before, gold["kr"], slots, nz=nz, block_size=block_size, what="kr")


def batch_shape_for(rank):
    return (BATCH, SEQ) if rank == 3 else (TOKENS,)


# ---------------------------------------------------------------------- sweeps
@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("version, cache_mode", PAGED_CASES)
def test_paged_modes(data, rng, version, cache_mode, block_size, rank):
    n = 2
    batch_shape = batch_shape_for(rank)
    t = int(np.prod(batch_shape))
    x, sin, cos = make_tokens(data, batch_shape)
    block_num = 6
    kw = {}
    if cache_mode.startswith("PA_BLK"):
        if rank == 3:
            seq_lens = [SEQ] * BATCH
            cache_index = rng.permutation(block_num)[:BATCH].reshape(BATCH, 1).astype(np.int64)  # [B, ceil(S/bs)]
        else:
            seq_lens = [2, 3]
            cache_index = rng.permutation(block_num)[:2].astype(np.int64)  # [sum ceil(S_b/bs)]
            kw["actual_seq_len"] = np.cumsum(seq_lens).astype(np.int32)  # [B] prefix sums
        slots = ref.slots_blocks(cache_index, seq_lens, block_size)
    else:
        flat = rng.permutation(block_num * block_size)[:t].astype(np.int64)
        flat[1] = -1  # skipped token
        cache_index = flat.reshape(batch_shape)  # [T] / [B, S]
        slots = ref.slots_paged(cache_index)
    kv_cache, kr_cache = paged_caches(block_num, block_size)
    kv_before, kr_before = kv_cache.copy(), kr_cache.copy()

    out = call(version, data, n, x, sin, cos, kv_cache, kr_cache, cache_index, cache_mode=cache_mode, **kw)

    gold = data.reference(n, x.size // HE)
    assert len(out) == {1: 4, 2: 5, 3: 5}[version]
    assert_queries(out, gold, batch_shape, n)
    if version != 3:
        assert out[2] is kv_cache and out[3] is kr_cache
    assert_caches(kv_cache, kr_cache, kv_before, kr_before, gold, slots, nz=cache_mode.endswith("NZ"),
                  block_size=block_size)


@pytest.mark.parametrize("cache_mode", ["BSND", "TND"])
def test_own_position_modes(data, rng, cache_mode):
    n = 2
    batch_shape = (BATCH, SEQ) if cache_mode == "BSND" else (TOKENS,)
    x, sin, cos = make_tokens(data, batch_shape)
    kv_cache = poisoned(batch_shape + (1, HCKV), BF16)  # [B, S, 1, Hckv] / [T, 1, Hckv]
    kr_cache = poisoned(batch_shape + (1, DR), BF16)  # [B, S, 1, Dr] / [T, 1, Dr]
    kv_before, kr_before = kv_cache.copy(), kr_cache.copy()
    out = call(3, data, n, x, sin, cos, kv_cache, kr_cache, None, cache_mode=cache_mode)
    gold = data.reference(n, x.size // HE)
    assert_queries(out, gold, batch_shape, n)
    slots = list(range(int(np.prod(batch_shape))))
    assert_caches(kv_cache, kr_cache, kv_before, kr_before, gold, slots, nz=False, block_size=1)


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("rank", RANKS)
def test_v3_scales_and_query_norm(data, rng, n, rank):
    batch_shape = batch_shape_for(rank)
    t = int(np.prod(batch_shape))
    x, sin, cos = make_tokens(data, batch_shape)
    kv_cache, kr_cache = paged_caches(2, 16)
    kv_before, kr_before = kv_cache.copy(), kr_cache.copy()
    cache_index = rng.permutation(32)[:t].astype(np.int64).reshape(batch_shape)
    kw = dict(qc_qr_scale=0.25, kc_scale=4.0, rmsnorm_epsilon_cq=1e-6, rmsnorm_epsilon_ckv=1e-3)
    out = call(3, data, n, x, sin, cos, kv_cache, kr_cache, cache_index, query_norm_flag=True, **kw)
    gold = data.reference(n, x.size // HE, eps_cq=1e-6, eps_ckv=1e-3, qc_qr_scale=0.25, kc_scale=4.0)
    assert_queries(out, gold, batch_shape, n)
    _, _, dq_nope, query_norm, dq_norm = out
    assert query_norm.shape == batch_shape + (HCQ,)
    assert_close(query_norm.reshape(t, HCQ), gold["query_norm"], "query_norm")
    for o in (dq_nope, dq_norm):
        assert o.shape == (0,) and o.dtype == np.float32
    assert_caches(kv_cache, kr_cache, kv_before, kr_before, gold, ref.slots_paged(cache_index), nz=False,
                  block_size=16)


def test_unused_outputs(data, rng):
    x, sin, cos = make_tokens(data, (2,))
    ci = np.array([0, 1], dtype=np.int64)
    out = call(3, data, 1, x, sin, cos, *paged_caches(1, 16), ci)
    assert [(o.shape, o.dtype) for o in out[2:]] == [((0,), np.float32), ((0,), BF16), ((0,), np.float32)]
    out = call(2, data, 1, x, sin, cos, *paged_caches(1, 16), ci)
    assert out[4].shape == (1,) and out[4].dtype == np.float32


@pytest.mark.parametrize("cache_mode", ["PA_BLK_BSND", "PA_BLK_NZ"])
@pytest.mark.parametrize("merged", [False, True])
def test_pa_blk_several_blocks(data, rng, cache_mode, merged):
    """S > BlockSize: a batch's tokens fill its listed blocks from row 0; a -1 block is skipped."""
    n, bs, block_num = 1, 16, 12
    if merged:
        seq_lens = [20, 5, 33]  # blocks 2 + 1 + 3
        batch_shape = (sum(seq_lens),)
        cache_index = rng.permutation(block_num)[:6].astype(np.int64)  # [sum ceil(S_b/bs)]
        cache_index[4] = -1
        kw = dict(actual_seq_len=np.cumsum(seq_lens).astype(np.int32))
    else:
        seq_lens = [40, 40]  # 3 blocks each
        batch_shape = (2, 40)
        cache_index = rng.permutation(block_num)[:6].reshape(2, 3).astype(np.int64)  # [B, ceil(S/bs)]
        cache_index[1, 1] = -1
        kw = {}
    x, sin, cos = make_tokens(data, batch_shape)
    kv_cache, kr_cache = paged_caches(block_num, bs)
    kv_before, kr_before = kv_cache.copy(), kr_cache.copy()
    out = call(3, data, n, x, sin, cos, kv_cache, kr_cache, cache_index, cache_mode=cache_mode, **kw)
    gold = data.reference(n, x.size // HE)
    assert_queries(out, gold, batch_shape, n)
    slots = ref.slots_blocks(cache_index, seq_lens, bs)
    assert slots.count(-1) == 16
    assert_caches(kv_cache, kr_cache, kv_before, kr_before, gold, slots, nz=cache_mode.endswith("NZ"), block_size=bs)


def test_duplicate_slots_warn_last_wins(data, rng):
    x, sin, cos = make_tokens(data, (4,))
    kv_cache, kr_cache = paged_caches(1, 16)
    kv_before, kr_before = kv_cache.copy(), kr_cache.copy()
    cache_index = np.array([3, 5, 3, 3], dtype=np.int64)
    with pytest.warns(DuplicateSlotWarning, match=r"slot 3 <- tokens \[0, 2, 3\]"):
        out = call(1, data, 1, x, sin, cos, kv_cache, kr_cache, cache_index)
    gold = data.reference(1, x.size // HE)
    assert_queries(out, gold, (4,), 1)
    assert_caches(kv_cache, kr_cache, kv_before, kr_before, gold, list(cache_index), nz=False, block_size=16)


def test_non_contiguous_token_x(data, rng):
    x, sin, cos = make_tokens(data, (3,))
    wide = np.zeros((3, 2 * HE), dtype=BF16)
    wide[:, ::2] = x
    strided = wide[:, ::2]  # [T, He], stride 2 elements
    assert not strided.flags.c_contiguous
    ci = np.array([0, 7, 2], dtype=np.int64)
    caches_a, caches_b = paged_caches(1, 16), paged_caches(1, 16)
    out_a = call(3, data, 2, x, sin, cos, *caches_a, ci)
    out_b = call(3, data, 2, strided, sin, cos, *caches_b, ci)
    for a, b in zip(out_a[:2] + caches_a, out_b[:2] + caches_b):
        assert_same_bytes(b, a, "strided token_x result")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("batch_shape", [(0,), (0, 3), (2, 0)])
def test_empty_tokens(data, rng, version, batch_shape):
    x, sin, cos = make_tokens(data, batch_shape)
    kv_cache, kr_cache = paged_caches(2, 16)
    kv_before, kr_before = kv_cache.copy(), kr_cache.copy()
    ci = np.zeros(batch_shape, dtype=np.int64)
    out = call(version, data, 2, x, sin, cos, kv_cache, kr_cache, ci)
    assert out[0].shape == batch_shape + (2, HCKV) and out[1].shape == batch_shape + (2, DR)
    assert out[0].dtype == BF16 and out[1].dtype == BF16
    assert_same_bytes(kv_cache, kv_before, "kv_cache")
    assert_same_bytes(kr_cache, kr_before, "kr_cache")


def test_empty_cache_still_computes_queries(data, rng):
    """Skv = 0 (BlockNum = 0): queries are computed, the caches are not written."""
    x, sin, cos = make_tokens(data, (2, 2))
    kv_cache, kr_cache = paged_caches(0, 16)
    out = call(3, data, 2, x, sin, cos, kv_cache, kr_cache, np.zeros((2, 2), dtype=np.int64))
    assert_queries(out, data.reference(2, x.size // HE), (2, 2), 2)


def test_thread_count_does_not_change_results(data, rng):
    x, sin, cos = make_tokens(data, (6,))
    ci = np.array([9, 1, 30, 4, -1, 17], dtype=np.int64)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            kv_cache, kr_cache = paged_caches(2, 16)
            out = call(3, data, 4, x, sin, cos, kv_cache, kr_cache, ci, cache_mode="PA_NZ", query_norm_flag=True)
            results.append([out[0], out[1], out[3], kv_cache, kr_cache])
    finally:
        numba.set_num_threads(before)
    for a, b in zip(*results):
        assert_same_bytes(b, a, "2-thread vs 1-thread result")


# ---------------------------------------------------------------------- bad inputs
def _case(**over):
    """A mutation of the valid v3 call below: keyword overrides of its arguments."""
    return over


def _nd(w):
    return np.asarray(w).view(np.ndarray).copy()


BAD_V3 = [
    ("ND weight_dq", lambda w: _case(weight_dq=_nd(w.w_dq)), FormatError, r"npu_format_cast\(weight_dq, 29\)"),
    ("NZ weight_uk", lambda w: _case(weight_uk=npu_format_cast(w.heads(2)[1], 29)), FormatError, "weight_uk"),
    ("fp16 token_x", lambda w: _case(token_x=np.zeros((3, HE), np.float16)), DTypeError, "token_x"),
    ("He 4096", lambda w: _case(token_x=np.zeros((3, 4096), BF16)), ShapeError, "He"),
    ("rope_sin rank", lambda w: _case(rope_sin=np.zeros((1, 3, DR), BF16)), ShapeError, "rope_sin"),
    ("gamma shape", lambda w: _case(rmsnorm_gamma_ckv=np.ones(256, BF16)), ShapeError, "rmsnorm_gamma_ckv"),
    ("N = 3", lambda w: _case(weight_uk=np.zeros((3, D, HCKV), BF16)), ShapeError, "N ="),
    ("int32 cache_index", lambda w: _case(cache_index=np.array([0, 1, 2], np.int32)), DTypeError, "cache_index"),
    ("cache_index shape", lambda w: _case(cache_index=np.array([0, 1], np.int64)), ShapeError, "cache_index"),
    ("cache_index range", lambda w: _case(cache_index=np.array([0, 32, 2], np.int64)), IndexRangeError,
     r"cache_index\[1\] = 32"),
    ("cache_index -2", lambda w: _case(cache_index=np.array([0, -2, 2], np.int64)), IndexRangeError, r"\[1\] = -2"),
    ("unknown cache_mode", lambda w: _case(cache_mode="PA"), ModeError, "cache_mode"),
    ("BlockSize 24", lambda w: _case(kv_cache=poisoned((2, 24, 1, HCKV), BF16),
                                     kr_cache=poisoned((2, 24, 1, DR), BF16)), ShapeError, "BlockSize"),
    ("kr_cache blocks", lambda w: _case(kr_cache=poisoned((3, 16, 1, DR), BF16)), ShapeError, "kr_cache"),
    ("kv_cache Nkv 2", lambda w: _case(kv_cache=poisoned((2, 16, 2, HCKV), BF16)), ShapeError, "kv_cache"),
    ("int8 kv_cache", lambda w: _case(kv_cache=poisoned((2, 16, 1, HCKV), np.int8)), DTypeError, "kv_cache"),
    ("BSND with 2-D token_x", lambda w: _case(cache_mode="BSND", cache_index=None), ShapeError, "BSND"),
    ("PA_BLK merged without actual_seq_len", lambda w: _case(cache_mode="PA_BLK_BSND",
                                                             cache_index=np.array([0], np.int64)),
     ShapeError, "actual_seq_len"),
    ("PA_BLK block id range", lambda w: _case(cache_mode="PA_BLK_BSND", cache_index=np.array([2], np.int64),
                                              actual_seq_len=np.array([3], np.int32)), IndexRangeError, "block id"),
    ("actual_seq_len total", lambda w: _case(cache_mode="PA_BLK_BSND", cache_index=np.array([0], np.int64),
                                             actual_seq_len=np.array([2], np.int32)), ShapeError, "actual_seq_len"),
    ("actual_seq_len outside PA_BLK", lambda w: _case(actual_seq_len=np.array([3], np.int32)), ShapeError,
     "actual_seq_len"),
    ("scale in non-quant", lambda w: _case(quant_scale_ckv=np.ones(1, np.float32)), ModeError, "quant_scale_ckv"),
    ("illegal mode combination", lambda w: _case(kv_cache_quant_mode=1), ModeError, "legal mode combination"),
    ("mode out of range", lambda w: _case(weight_quant_mode=3), ModeError, "weight_quant_mode"),
    ("repo mode", lambda w: _case(ckvkr_repo_mode=1), ModeError, "ckvkr_repo_mode"),
    ("tile_size", lambda w: _case(tile_size=64), ModeError, "tile_size"),
    ("hifloat8 tag", lambda w: _case(token_x_dtype=1), ModeError, "token_x_dtype"),
    ("partial quant without its scale", lambda w: _case(weight_quant_mode=1), ShapeError,
     "dequant_scale_w_uq_qr: expected a tensor in the partial quant"),
    ("full quant per-tensor without scales", lambda w: _case(weight_quant_mode=2, kv_cache_quant_mode=1,
                                                             query_quant_mode=1), ShapeError, "dequant_scale_x"),
    ("per-tile without scales", lambda w: _case(weight_quant_mode=1, kv_cache_quant_mode=3, ckvkr_repo_mode=1,
                                                quant_scale_repo_mode=1), ShapeError, "per-tile"),
    ("non-contiguous cache", lambda w: _case(kv_cache=poisoned((2, 16, 1, 2 * HCKV), BF16)[..., ::2]), ShapeError,
     "C-contiguous"),
]


@pytest.mark.parametrize("name, mutate, error, match", BAD_V3, ids=[c[0] for c in BAD_V3])
def test_bad_v3_inputs_raise_and_leave_caches(data, rng, name, mutate, error, match):
    w_uq_qr, w_uk, _, _ = data.heads(2)
    x, sin, cos = make_tokens(data, (3,))
    kwargs = dict(token_x=x, weight_dq=data.w_dq_nz, weight_uq_qr=w_uq_qr, weight_uk=w_uk,
                  weight_dkv_kr=data.w_dkv_kr_nz, rmsnorm_gamma_cq=data.gamma_cq,
                  rmsnorm_gamma_ckv=data.gamma_ckv, rope_sin=sin, rope_cos=cos,
                  kv_cache=poisoned((2, 16, 1, HCKV), BF16), kr_cache=poisoned((2, 16, 1, DR), BF16),
                  cache_index=np.array([0, 1, 2], np.int64))
    kwargs.update(mutate(data))
    caches = [kwargs["kv_cache"], kwargs["kr_cache"]]
    before = [c.copy() for c in caches]
    with pytest.raises(error, match=match):
        npu_mla_prolog_v3(**kwargs)
    for c, b in zip(caches, before):
        assert_same_bytes(c, b, "cache after a rejected call")


BAD_LEGACY = [
    ("int8 weight_uq_qr without its scale", dict(weight_uq_qr="int8"), ShapeError, "dequant_scale_w_uq_qr"),
    ("dequant_scale_w_uq_qr with a bf16 weight", dict(dequant_scale_w_uq_qr=True), DTypeError,
     "weight_uq_qr: expected dtype int8"),
    ("int8 caches + int8 weight without scales", dict(weight_uq_qr="int8", caches="int8"), ShapeError,
     "per-channel"),
    ("int8 caches, bf16 weights", dict(caches="int8"), ModeError, "legal mode combination"),
    ("PA_BLK_BSND", dict(cache_mode="PA_BLK_BSND"), ModeError, "cache_mode"),
    ("BlockSize 48", dict(block_size=48), ShapeError, "BlockSize"),
    ("S = 17", dict(seq=17), ShapeError, "at most 16"),
]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("name, change, error, match", BAD_LEGACY, ids=[c[0] for c in BAD_LEGACY])
def test_bad_legacy_inputs_raise_and_leave_caches(data, rng, version, name, change, error, match):
    w_uq_qr, w_uk, _, _ = data.heads(1)
    seq = change.get("seq", 2)
    x, sin, cos = make_tokens(data, (1, seq))
    if change.get("weight_uq_qr") == "int8":
        w_uq_qr = npu_format_cast(np.ones(w_uq_qr.shape, np.int8), 29)
    bs = change.get("block_size", 16)
    dtype = np.int8 if change.get("caches") == "int8" else BF16
    kv_cache, kr_cache = poisoned((2, bs, 1, HCKV), dtype), poisoned((2, bs, 1, DR), dtype)
    before = [kv_cache.copy(), kr_cache.copy()]
    kw = dict(cache_mode=change.get("cache_mode", "PA_BSND"))
    if change.get("dequant_scale_w_uq_qr"):
        kw["dequant_scale_w_uq_qr"] = np.ones((1, D + DR), np.float32)
    fn = npu_mla_prolog if version == 1 else npu_mla_prolog_v2
    with pytest.raises(error, match=match):
        fn(x, data.w_dq_nz, w_uq_qr, w_uk, data.w_dkv_kr_nz, data.gamma_cq, data.gamma_ckv, sin, cos,
           np.arange(seq, dtype=np.int64).reshape(1, seq), kv_cache, kr_cache, **kw)
    for c, b in zip((kv_cache, kr_cache), before):
        assert_same_bytes(c, b, "cache after a rejected call")


def test_v1_keyword_only_boundary(data, rng):
    x, sin, cos = make_tokens(data, (1,))
    w_uq_qr, w_uk, _, _ = data.heads(1)
    with pytest.raises(TypeError):
        npu_mla_prolog(x, data.w_dq_nz, w_uq_qr, w_uk, data.w_dkv_kr_nz, data.gamma_cq, data.gamma_ckv,
                       sin, cos, np.zeros(1, np.int64), *paged_caches(1, 16), None)
    with pytest.raises(TypeError):
        npu_mla_prolog_v3(x, data.w_dq_nz, w_uq_qr, w_uk, data.w_dkv_kr_nz, data.gamma_cq,
                          data.gamma_ckv, sin, cos, *paged_caches(1, 16), np.zeros(1, np.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        npu_mla_prolog_v3(x, data.w_dq_nz, w_uq_qr, w_uk, data.w_dkv_kr_nz, data.gamma_cq,
                          data.gamma_ckv, sin, cos, *paged_caches(1, 16), cache_index=np.zeros(1, np.int64))
