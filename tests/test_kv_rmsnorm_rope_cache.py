"""npu_kv_rmsnorm_rope_cache (emu backend) against tests/reference/kv_rmsnorm_rope_cache.py.

Layout is checked byte for byte: the op's own rows (``is_output_kv=True``) are scattered with the
reference's independent layout code into a poisoned cache and compared with the op's cache.
Values are checked against the reference's fp32 golden (summing the RmsNorm squares in the
kernel's tree order) with the official criterion (docs/sources.md#npu_kv_rmsnorm_rope_cache: dual threshold 0.04 for bf16,
0.01 for fp16) and must be bit-identical to it; int8 caches must equal the reference.
"""

from __future__ import annotations

import importlib
import warnings

import numba
import numpy as np
import pytest
from numba import njit

from ascend_emu.emu.kv_rmsnorm_rope_cache import TOKENS_PER_PART
from ascend_emu.errors import DTypeError, DuplicateSlotWarning, IndexRangeError, ModeError, ShapeError
from ascend_emu.ops import npu_kv_rmsnorm_rope_cache
from ascend_emu.quant.rounding import f16_bits_to_f32, f32_bits_to_f16_bits
from tests.helpers import (BF16, assert_same_bytes, bit_identical_share, dual_threshold_ok, poisoned, raw)
from tests.reference.kv_rmsnorm_rope_cache import kv_rmsnorm_rope_cache_ref, scatter

PA_MODES = ["PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ"]
BLK_MODES = ["PA_BLK_BNSD", "PA_BLK_NZ"]
DTYPES = [BF16, np.dtype(np.float16)]
QUANT = [False, True]
BLOCK_SIZES = [16, 32, 128]
SHAPES = [(4, 1), (2, 37), (1, 129)]  # (B, S): decode; several pages per batch; S > 128
NORM_SHAPES = [(4, 1), (3, 7), (1, 40)]
#: docs/sources.md#npu_kv_rmsnorm_rope_cache: assertRtolEqual prec for bf16 / fp16 outputs and caches.
PREC = {BF16: 0.04, np.dtype(np.float16): 0.01}
#: Bit-identical share floors vs the reference: RoPE uses the same fp32 products and sums (no FMA)
#: and RmsNorm the kernel's summation order, so every element is identical (measured 1.0).
MIN_IDENTICAL_K = 1.0
MIN_IDENTICAL_Y = 1.0


# ---------------------------------------------------------------------- builders
def make_inputs(rng, b, s, dtype):
    """Inputs scaled as the official test does (docs/sources.md#npu_kv_rmsnorm_rope_cache)."""
    kv = (8 * rng.standard_normal((b, 1, s, 576)) - 10).astype(dtype)  # [B, 1, S, 576]
    gamma = (990 * rng.standard_normal(512) - 1000).astype(dtype)  # [512]
    cos = rng.standard_normal((b, 1, s, 64)).astype(dtype)  # [B, 1, S, 64]
    sin = (0.02 * rng.standard_normal((b, 1, s, 64)) - 0.01).astype(dtype)  # [B, 1, S, 64]
    return kv, gamma, cos, sin


def make_scales(rng):
    """Multipliers that put most values inside int8 and saturate some."""
    k_rope_scale = rng.uniform(1.0, 8.0, 64).astype(np.float32)  # [64]
    c_kv_scale = rng.uniform(0.005, 0.08, 512).astype(np.float32)  # [512]
    return k_rope_scale, c_kv_scale


def make_index(rng, mode, b, s, block_size, block_num, cache_length, skip_last=True):
    """A shuffled valid index for ``mode`` (distinct slots / pages), last entry -1 if several."""
    if mode == "Norm":
        index = np.stack([rng.permutation(cache_length)[:s] for _ in range(b)]).astype(np.int64)  # [B, S]
    elif mode in BLK_MODES:
        pages = -(-s // block_size)
        index = rng.permutation(block_num)[:b * pages].astype(np.int64) * block_size  # [B*pages]
    else:
        index = rng.permutation(block_num * block_size)[:b * s].astype(np.int64)  # [B*S]
    if skip_last and index.size > 1:
        index.reshape(-1)[-1] = -1
    return index


def cache_shapes(mode, b, block_num, block_size, cache_length):
    if mode == "Norm":
        return (b, 1, cache_length, 64), (b, 1, cache_length, 512)
    return (block_num, block_size, 1, 64), (block_num, block_size, 1, 512)


def call(inputs, index, k_cache, ckv_cache, scales=(None, None), **kw):
    kv, gamma, cos, sin = inputs
    return npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                     k_rope_scale=scales[0], c_kv_scale=scales[1], **kw)


def op_rows(inputs, scales=(None, None)):
    """The op's own k_embed_out / y_out rows [T, 64] / [T, 512], via a throw-away PA_BNSD call."""
    b, _, s, _ = inputs[0].shape
    t = b * s
    dtype = np.dtype(np.int8) if scales[0] is not None else inputs[0].dtype
    bs = 32
    nb = -(-s // bs) * b + -(-t // bs)  # enough for the seed's block_num >= ceil(S/bs)*B
    out = call(inputs, np.arange(t, dtype=np.int64), np.zeros((nb, bs, 1, 64), dtype),
               np.zeros((nb, bs, 1, 512), dtype), scales, cache_mode="PA_BNSD", is_output_kv=True)
    return out[2].reshape(t, 64), out[3].reshape(t, 512)


def check_values(actual, golden, dtype, min_identical=MIN_IDENTICAL_Y):
    assert actual.dtype == golden.dtype and actual.shape == golden.shape
    assert dual_threshold_ok(actual, golden, PREC[dtype])
    assert bit_identical_share(actual, golden) >= min_identical


def check_int8_cache(actual, ref, what):
    """int8 cache == reference, byte for byte (same fp32 products, same rounding)."""
    diff = actual.astype(np.int16) - ref.astype(np.int16)
    assert not diff.any(), f"{what}: {int(np.count_nonzero(diff))} int8 values differ"


# ---------------------------------------------------------------------- sweeps
@pytest.mark.parametrize("b,s", SHAPES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("quant", QUANT)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", PA_MODES)
def test_paged_modes(rng, mode, dtype, quant, block_size, b, s):
    inputs = make_inputs(rng, b, s, dtype)
    scales = make_scales(rng) if quant else (None, None)
    cache_dtype = np.dtype(np.int8) if quant else dtype
    block_num = -(-s // block_size) * b + 2
    index = make_index(rng, mode, b, s, block_size, block_num, None)
    k_shape, ckv_shape = cache_shapes(mode, b, block_num, block_size, None)
    k_cache, ckv_cache = poisoned(k_shape, cache_dtype), poisoned(ckv_shape, cache_dtype)

    if quant and block_size % 32:  # int8 caches need 32-row (32-byte) aligned blocks
        before = raw(k_cache).copy(), raw(ckv_cache).copy()
        with pytest.raises(ShapeError, match="block_size"):
            call(inputs, index, k_cache, ckv_cache, scales, cache_mode=mode, is_output_kv=True)
        assert_same_bytes(k_cache, before[0])
        assert_same_bytes(ckv_cache, before[1])
        return

    ref = kv_rmsnorm_rope_cache_ref(*inputs, index, k_cache, ckv_cache, k_rope_scale=scales[0],
                                    c_kv_scale=scales[1], cache_mode=mode)
    out = call(inputs, index, k_cache, ckv_cache, scales, cache_mode=mode, is_output_kv=True)
    assert out[0] is k_cache and out[1] is ckv_cache
    k_out, y_out = out[2], out[3]
    check_values(k_out, ref.k_embed_out, dtype, MIN_IDENTICAL_K)
    check_values(y_out, ref.y_out, dtype)
    if quant:
        check_int8_cache(k_cache, ref.k_cache, "k_cache")
        check_int8_cache(ckv_cache, ref.ckv_cache, "ckv_cache")
    else:
        # byte-exact layout: the op's own rows placed by the reference's layout code
        fresh_k, fresh_ckv = poisoned(k_shape, dtype), poisoned(ckv_shape, dtype)
        assert_same_bytes(k_cache, scatter(fresh_k, k_out.reshape(-1, 64), ref.slots, mode, block_size), "k_cache")
        assert_same_bytes(ckv_cache, scatter(fresh_ckv, y_out.reshape(-1, 512), ref.slots, mode, block_size),
                          "ckv_cache")
        check_values(k_cache, ref.k_cache, dtype, MIN_IDENTICAL_K)
        check_values(ckv_cache, ref.ckv_cache, dtype)


@pytest.mark.parametrize("extra", [0, 5])
@pytest.mark.parametrize("b,s", NORM_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_mode(rng, dtype, b, s, extra):
    inputs = make_inputs(rng, b, s, dtype)
    cache_length = s + extra
    index = make_index(rng, "Norm", b, s, None, None, cache_length)
    k_shape, ckv_shape = cache_shapes("Norm", b, None, None, cache_length)
    k_cache, ckv_cache = poisoned(k_shape, dtype), poisoned(ckv_shape, dtype)
    ref = kv_rmsnorm_rope_cache_ref(*inputs, index, k_cache, ckv_cache, cache_mode="Norm")

    out = call(inputs, index, k_cache, ckv_cache, cache_mode="Norm")
    assert out[0] is k_cache and out[1] is ckv_cache
    assert out[2].shape == (b, 1, s, 64) and out[3].shape == (b, 1, s, 512)
    assert out[2].dtype == dtype and out[3].dtype == dtype
    assert not np.any(out[2].astype(np.float32)) and not np.any(out[3].astype(np.float32))  # zero-filled

    k_rows, y_rows = op_rows(inputs)
    assert_same_bytes(k_cache, scatter(poisoned(k_shape, dtype), k_rows, ref.slots, "Norm", None), "k_cache")
    assert_same_bytes(ckv_cache, scatter(poisoned(ckv_shape, dtype), y_rows, ref.slots, "Norm", None), "ckv_cache")
    check_values(k_cache, ref.k_cache, dtype, MIN_IDENTICAL_K)
    check_values(ckv_cache, ref.ckv_cache, dtype)


# ---------------------------------------------------------------------- outputs, skips, scales
@pytest.mark.parametrize("quant", QUANT)
@pytest.mark.parametrize("mode", PA_MODES)
def test_is_output_kv_false_gives_zeros_and_same_caches(rng, mode, quant):
    b, s, bs = 2, 5, 32
    inputs = make_inputs(rng, b, s, BF16)
    scales = make_scales(rng) if quant else (None, None)
    dtype = np.dtype(np.int8) if quant else BF16
    index = make_index(rng, mode, b, s, bs, 4, None)
    shapes = cache_shapes(mode, b, 4, bs, None)
    with_kv = [poisoned(sh, dtype) for sh in shapes]
    without = [poisoned(sh, dtype) for sh in shapes]
    on = call(inputs, index, *with_kv, scales, cache_mode=mode, is_output_kv=True)
    off = call(inputs, index, *without, scales, cache_mode=mode)
    assert_same_bytes(without[0], with_kv[0])
    assert_same_bytes(without[1], with_kv[1])
    for o_on, o_off in zip(on[2:], off[2:], strict=True):
        assert o_off.shape == o_on.shape and o_off.dtype == o_on.dtype == BF16
        assert not np.any(o_off.astype(np.float32))
        assert np.any(o_on.astype(np.float32))


@pytest.mark.parametrize("mode", ["Norm"] + PA_MODES)
def test_all_skipped_leaves_caches_untouched(rng, mode):
    b, s, bs = 2, 20, 16
    inputs = make_inputs(rng, b, s, BF16)
    index = make_index(rng, mode, b, s, bs, 6, 24, skip_last=False)
    index[...] = -1
    k_cache, ckv_cache = (poisoned(sh, BF16) for sh in cache_shapes(mode, b, 6, bs, 24))
    kw = {} if mode == "Norm" else {"is_output_kv": True}
    out = call(inputs, index, k_cache, ckv_cache, cache_mode=mode, **kw)
    assert_same_bytes(k_cache, poisoned(k_cache.shape, BF16))
    assert_same_bytes(ckv_cache, poisoned(ckv_cache.shape, BF16))
    if mode != "Norm":  # outputs are still produced for skipped tokens
        ref = kv_rmsnorm_rope_cache_ref(*inputs, index, k_cache, ckv_cache, cache_mode=mode)
        check_values(out[2], ref.k_embed_out, BF16, MIN_IDENTICAL_K)


def test_skipped_page_only_skips_its_tokens(rng):
    b, s, bs, nb = 2, 40, 16, 8  # 3 pages per batch
    inputs = make_inputs(rng, b, s, BF16)
    index = np.array([0, 3, 5, 1, -1, 7], dtype=np.int64) * bs
    index[index < 0] = -1
    k_cache, ckv_cache = poisoned((nb, bs, 1, 64), BF16), poisoned((nb, bs, 1, 512), BF16)
    out = call(inputs, index, k_cache, ckv_cache, cache_mode="PA_BLK_NZ", is_output_kv=True)
    rows = out[2].reshape(-1, 64)
    untouched = {2, 4, 6}  # blocks no page points to
    for blk in range(nb):
        same = raw(k_cache[blk]).tolist() == raw(poisoned((bs, 1, 64), BF16)).tolist()
        assert same == (blk in untouched)
    # token 37 of batch 1 is in its 3rd page (block 7), row 5: NZ [blk, d//16, row, d%16]
    nz = k_cache.reshape(nb, 4, bs, 16)
    assert_same_bytes(nz[7, :, 37 % bs, :].reshape(-1), rows[s + 37])


@pytest.mark.parametrize("shape_of", ["vector", "row", "scalar"])
def test_scale_shapes(rng, shape_of):
    b, s, bs = 3, 4, 32
    inputs = make_inputs(rng, b, s, BF16)
    k_scale, c_scale = make_scales(rng)
    if shape_of == "scalar":
        k_scale, c_scale = k_scale[:1], c_scale[:1]
    full = (np.broadcast_to(k_scale, (64,)).copy(), np.broadcast_to(c_scale, (512,)).copy())
    given = {"vector": (k_scale, c_scale), "row": (k_scale[None], c_scale[None]),
             "scalar": (k_scale, c_scale)}[shape_of]
    index = make_index(rng, "PA_NZ", b, s, bs, 3, None)
    a = [poisoned((3, bs, 1, 64), np.int8), poisoned((3, bs, 1, 512), np.int8)]
    e = [poisoned((3, bs, 1, 64), np.int8), poisoned((3, bs, 1, 512), np.int8)]
    call(inputs, index, *a, given, cache_mode="PA_NZ")
    call(inputs, index, *e, full, cache_mode="PA_NZ")
    assert_same_bytes(a[0], e[0])
    assert_same_bytes(a[1], e[1])


def test_quant_saturates_and_rounds_half_even():
    """Exact ties and saturation: kv rows chosen so that y and k_embed are exact in fp32."""
    b, s, bs = 1, 2, 32
    rms = np.ones((b, 1, s, 512), np.float32)  # rms = sqrt(1 + eps): use eps = 0 -> y = gamma
    rope = np.zeros((b, 1, s, 64), np.float32)
    rope[..., 0::2] = np.arange(32, dtype=np.float32)  # de-interleaved k = [0..31, 0...]
    kv = np.concatenate([rms, rope], axis=-1).astype(BF16)
    # the last four at the int8 bounds: 127.5 ties to 128 (even) and saturates; 128, -128, -129 (bf16-exact)
    gamma = np.resize(np.array([0.5, 1.5, 2.5, -0.5, -2.5, 300.0, -300.0, 3.0, 127.5, 128.0, -128.0, -129.0],
                               np.float32), 512).astype(BF16)
    cos = np.ones((b, 1, s, 64), BF16)
    sin = np.zeros((b, 1, s, 64), BF16)
    k_cache, ckv_cache = poisoned((1, bs, 1, 64), np.int8), poisoned((1, bs, 1, 512), np.int8)
    call((kv, gamma, cos, sin), np.array([3, 9], np.int64), k_cache, ckv_cache,
         (np.full(64, 0.5, np.float32), np.ones(1, np.float32)), epsilon=0.0, cache_mode="PA_BNSD")
    y_row = ckv_cache.reshape(bs, 512)[9]
    assert y_row[:12].tolist() == [0, 2, 2, 0, -2, 127, -128, 3, 127, 127, -128, -128]  # half-even ties, saturation
    k_row = k_cache.reshape(bs, 64)[3]
    assert k_row[:8].tolist() == [0, 0, 1, 2, 2, 2, 3, 4]  # 0.5*[0..7] half-even: 0,.5,1,1.5,2,2.5,3,3.5


def test_epsilon_is_used(rng):
    b, s = 2, 3
    kv, gamma, cos, sin = make_inputs(rng, b, s, np.float16)
    kv = (kv.astype(np.float32) * 1e-2).astype(np.float16)  # mean(x^2) ~ 1e-2, comparable to eps
    index = np.arange(b * s, dtype=np.int64)
    for eps in (1e-5, 0.05):
        k_cache, ckv_cache = poisoned((2, 16, 1, 64), np.float16), poisoned((2, 16, 1, 512), np.float16)
        out = call((kv, gamma, cos, sin), index, k_cache, ckv_cache, epsilon=eps, cache_mode="PA", is_output_kv=True)
        ref = kv_rmsnorm_rope_cache_ref(kv, gamma, cos, sin, index, k_cache, ckv_cache, epsilon=eps, cache_mode="PA")
        check_values(out[3], ref.y_out, np.dtype(np.float16))


# ---------------------------------------------------------------------- duplicates, strides, threads
@pytest.mark.parametrize("mode", ["Norm", "PA_NZ", "PA_BLK_BNSD"])
def test_duplicate_slots_warn_last_wins(rng, mode):
    b, s, bs = 2, 3, 16
    inputs = make_inputs(rng, b, s, BF16)
    if mode == "Norm":
        index = np.array([[4, 1, 4], [0, 2, 3]], np.int64)
    elif mode == "PA_NZ":
        index = np.array([7, 20, 3, 20, 9, 11], np.int64)
    else:
        index = np.array([2, 2], np.int64) * bs  # both batches' pages -> block 2
    k_cache, ckv_cache = (poisoned(sh, BF16) for sh in cache_shapes(mode, b, 4, bs, 6))
    with pytest.warns(DuplicateSlotWarning, match="index"):
        call(inputs, index, k_cache, ckv_cache, cache_mode=mode)
    k_rows, y_rows = op_rows(inputs)
    ref = kv_rmsnorm_rope_cache_ref(*inputs, index, k_cache, ckv_cache, cache_mode=mode)
    fresh = poisoned(k_cache.shape, BF16), poisoned(ckv_cache.shape, BF16)
    assert_same_bytes(k_cache, scatter(fresh[0], k_rows, ref.slots, mode, bs))  # last token wins
    assert_same_bytes(ckv_cache, scatter(fresh[1], y_rows, ref.slots, mode, bs))


@pytest.mark.parametrize("mode", ["Norm", "PA_NZ"])
def test_non_contiguous_inputs(rng, mode):
    b, s, bs = 3, 5, 16
    kv, gamma, cos, sin = make_inputs(rng, b, s, BF16)
    wide_kv = np.zeros((b, 1, 2 * s, 576), BF16)
    wide_kv[:, :, ::2] = kv
    wide_cs = np.zeros((b, 1, s, 2, 64), BF16)
    wide_cs[:, :, :, 0], wide_cs[:, :, :, 1] = cos, sin
    gamma_wide = np.repeat(gamma, 2)
    strided = (wide_kv[:, :, ::2], gamma_wide[::2], wide_cs[:, :, :, 0], wide_cs[:, :, :, 1])
    assert not any(x.flags.c_contiguous for x in strided)
    index = make_index(rng, mode, b, s, bs, 2 * b, 8)
    index_strided = np.repeat(index, 2, axis=-1)[..., ::2]
    a = [poisoned(sh, BF16) for sh in cache_shapes(mode, b, 2 * b, bs, 8)]
    e = [poisoned(sh, BF16) for sh in cache_shapes(mode, b, 2 * b, bs, 8)]
    call(strided, index_strided, *a, cache_mode=mode)
    call((kv, gamma, cos, sin), index, *e, cache_mode=mode)
    assert_same_bytes(a[0], e[0])
    assert_same_bytes(a[1], e[1])


@pytest.mark.parametrize("quant", QUANT)
def test_one_vs_two_threads_identical(rng, quant):
    """The threaded kernel path (no sweep shape reaches it): identical with 1 and 2 threads, and
    right against the reference."""
    b, s, bs, mode = 16, 37, 32, "PA_BLK_NZ"
    assert b * s >= 2 * TOKENS_PER_PART  # two parallel ranges with two threads
    inputs = make_inputs(rng, b, s, BF16)
    scales = make_scales(rng) if quant else (None, None)
    dtype = np.dtype(np.int8) if quant else BF16
    index = make_index(rng, mode, b, s, bs, 40, None)
    results = []
    old = numba.get_num_threads()
    try:
        for n in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(n)
            caches = [poisoned(sh, dtype) for sh in cache_shapes(mode, b, 40, bs, None)]
            out = call(inputs, index, *caches, scales, cache_mode=mode, is_output_kv=True)
            results.append([raw(x).copy() for x in out])
    finally:
        numba.set_num_threads(old)
    for one, two in zip(*results, strict=True):
        assert np.array_equal(one, two)

    k_cache, ckv_cache, k_out, y_out = out
    ref = kv_rmsnorm_rope_cache_ref(*inputs, index, poisoned(k_cache.shape, dtype), poisoned(ckv_cache.shape, dtype),
                                    k_rope_scale=scales[0], c_kv_scale=scales[1], cache_mode=mode)
    check_values(k_out, ref.k_embed_out, BF16, MIN_IDENTICAL_K)
    check_values(y_out, ref.y_out, BF16)
    if quant:
        check_int8_cache(k_cache, ref.k_cache, "k_cache")
        check_int8_cache(ckv_cache, ref.ckv_cache, "ckv_cache")
    else:
        check_values(k_cache, ref.k_cache, BF16, MIN_IDENTICAL_K)
        check_values(ckv_cache, ref.ckv_cache, BF16)


@pytest.mark.parametrize("mode", ["PA_NZ", "PA_BNSD", "Norm", "PA_BLK_NZ"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_small_call_path_writes_what_the_general_path_writes(rng, mode, dtype, monkeypatch):
    """A small non-quant call runs rows and both scatters in one launch: the same caches and
    outputs, byte for byte, as the general path (fused pass, then two scatters), duplicate
    slots (the last token wins) and skipped tokens included; the warm-up's lowered thresholds
    (to compile the threaded kernels) leave the one-launch path."""
    emu_kv = importlib.import_module("ascend_emu.emu.kv_rmsnorm_rope_cache")
    b, s, bs, nb, cache_length = 3, 5, 16, 8, 12
    inputs = make_inputs(rng, b, s, dtype)
    index = make_index(rng, mode, b, s, bs, nb, cache_length)
    if mode in ("PA_NZ", "PA_BNSD"):
        index[1] = index[4]  # a duplicate slot: the later token wins
    results, taken = [], []
    real = emu_kv._small_call
    monkeypatch.setattr(emu_kv, "_small_call", lambda *a: (taken.append(True), real(*a))[1])  # type: ignore[func-returns-value]
    for small in (True, False):
        if not small:
            monkeypatch.setattr(emu_kv, "_small", lambda tokens, row_bytes: False)
        caches = [poisoned(sh, dtype) for sh in cache_shapes(mode, b, nb, bs, cache_length)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DuplicateSlotWarning)
            out = call(inputs, index, *caches, cache_mode=mode, is_output_kv=mode != "Norm")
        results.append([raw(x).copy() for x in out])
        assert taken == [True]  # the first call took the one-launch path, the second did not
    for small, general in zip(*results, strict=True):
        assert np.array_equal(small, general)
    monkeypatch.undo()
    warmup = importlib.import_module("ascend_emu.warmup")
    with warmup.split_every_kernel():
        assert not emu_kv._small(b * s, 1024)
    assert emu_kv._small(b * s, 1024) and not emu_kv._small(2 * TOKENS_PER_PART, 1024)


# ---------------------------------------------------------------------- bad inputs
def _base(mode="PA_NZ", quant=False, b=2, s=3, bs=16, nb=4, cache_length=6, dtype=BF16):
    rng = np.random.default_rng(7)
    kv, gamma, cos, sin = make_inputs(rng, b, s, dtype)
    scales = make_scales(rng) if quant else (None, None)
    cdtype = np.dtype(np.int8) if quant else dtype
    k_shape, ckv_shape = cache_shapes(mode, b, nb, bs, cache_length)
    return dict(kv=kv, gamma=gamma, cos=cos, sin=sin,
                index=make_index(rng, mode, b, s, bs, nb, cache_length, skip_last=False),
                k_cache=poisoned(k_shape, cdtype), ckv_cache=poisoned(ckv_shape, cdtype),
                k_rope_scale=scales[0], c_kv_scale=scales[1], cache_mode=mode)


def _set(**changes):
    return lambda a: {**a, **{k: (v(a) if callable(v) else v) for k, v in changes.items()}}


BAD_INPUTS = [
    # (id, base kwargs, mutation, error, message fragment)
    ("kv_last_dim", {}, _set(kv=lambda a: a["kv"][..., :575]), ShapeError, "kv"),
    ("kv_3d", {}, _set(kv=lambda a: a["kv"][:, 0]), ShapeError, "kv"),
    ("kv_n2", {}, _set(kv=lambda a: np.concatenate([a["kv"]] * 2, axis=1)), ShapeError, "kv"),
    ("kv_fp32", {}, _set(kv=lambda a: a["kv"].astype(np.float32)), DTypeError, "kv"),
    ("gamma_shape", {}, _set(gamma=lambda a: a["gamma"][:511]), ShapeError, "gamma"),
    ("gamma_dtype", {}, _set(gamma=lambda a: a["gamma"].astype(np.float16)), DTypeError, "gamma"),
    ("cos_dim", {}, _set(cos=lambda a: a["cos"][..., :32]), ShapeError, "cos"),
    ("cos_broadcast_seq", {}, _set(cos=lambda a: a["cos"][:, :, :1]), ShapeError, "cos"),
    ("sin_dtype", {}, _set(sin=lambda a: a["sin"].astype(np.float16)), DTypeError, "sin"),
    ("index_int32", {}, _set(index=lambda a: a["index"].astype(np.int32)), DTypeError, "index"),
    ("index_len", {}, _set(index=lambda a: np.append(a["index"], 1)), ShapeError, "index"),
    ("index_2d_pa", {}, _set(index=lambda a: a["index"].reshape(2, 3)), ShapeError, "index"),
    ("index_1d_norm", {"mode": "Norm"}, _set(index=lambda a: a["index"].reshape(-1)), ShapeError, "index"),
    ("index_pages_len", {"mode": "PA_BLK_BNSD"}, _set(index=lambda a: np.append(a["index"], 0)), ShapeError,
     "index"),
    ("mode_unknown", {}, _set(cache_mode="PA_BSND"), ModeError, "cache_mode"),
    ("mode_lower", {}, _set(cache_mode="pa_nz"), ModeError, "cache_mode"),
    ("k_rope_offset", {"quant": True, "bs": 32}, _set(k_rope_offset=np.zeros(64, np.float32)), ModeError,
     "k_rope_offset"),
    ("c_kv_offset", {"quant": True, "bs": 32}, _set(c_kv_offset=np.zeros(512, np.float32)), ModeError,
     "c_kv_offset"),
    ("one_scale", {"quant": True, "bs": 32}, _set(c_kv_scale=None), ModeError, "c_kv_scale"),
    ("quant_bf16_caches", {"quant": False}, _set(k_rope_scale=np.ones(64, np.float32),
                                                 c_kv_scale=np.ones(512, np.float32)), DTypeError, "int8"),
    ("int8_caches_no_scale", {"quant": True, "bs": 32}, _set(k_rope_scale=None, c_kv_scale=None), ModeError,
     "k_rope_scale, c_kv_scale: expected fp32 multiplier tensors"),
    ("quant_norm", {"mode": "Norm"}, _set(k_rope_scale=np.ones(64, np.float32),
                                          c_kv_scale=np.ones(512, np.float32)), ModeError, "Norm"),
    ("output_kv_norm", {"mode": "Norm"}, _set(is_output_kv=True), ModeError, "is_output_kv"),
    ("output_kv_not_bool", {}, _set(is_output_kv="yes"), DTypeError, "is_output_kv"),
    ("scale_len", {"quant": True, "bs": 32}, _set(k_rope_scale=np.ones(63, np.float32)), ShapeError,
     "k_rope_scale"),
    ("scale_2x", {"quant": True, "bs": 32}, _set(c_kv_scale=np.ones((2, 512), np.float32)), ShapeError,
     "c_kv_scale"),
    ("scale_fp16", {"quant": True, "bs": 32}, _set(c_kv_scale=np.ones(512, np.float16)), DTypeError, "c_kv_scale"),
    ("k_cache_dim", {}, _set(k_cache=lambda a: poisoned((4, 16, 1, 32), BF16)), ShapeError, "k_cache"),
    ("k_cache_heads", {}, _set(k_cache=lambda a: poisoned((4, 16, 2, 64), BF16)), ShapeError, "k_cache"),
    ("ckv_cache_dtype", {}, _set(ckv_cache=lambda a: poisoned((4, 16, 1, 512), np.float16)), DTypeError,
     "ckv_cache"),
    ("block_size_8", {"bs": 8, "nb": 8}, None, ShapeError, "block_size"),
    ("int8_block_size_16", {"quant": True, "bs": 16}, None, ShapeError, "block_size"),
    ("block_num_small", {"nb": 1}, None, ShapeError, "block_num"),
    ("blk_block_num_small", {"mode": "PA_BLK_NZ", "s": 20, "nb": 3}, None, ShapeError, "block_num"),
    ("cache_blocks_differ", {}, _set(ckv_cache=lambda a: poisoned((5, 16, 1, 512), BF16)), ShapeError,
     "ckv_cache"),
    ("norm_cache_short", {"mode": "Norm", "cache_length": 2}, _set(index=np.zeros((2, 3), np.int64)),
     ShapeError, "cache_length"),
    ("norm_cache_batch", {"mode": "Norm"}, _set(k_cache=lambda a: poisoned((3, 1, 6, 64), BF16)), ShapeError,
     "k_cache"),
    ("cache_not_contiguous", {}, _set(k_cache=lambda a: poisoned((8, 16, 1, 64), BF16)[::2]), ShapeError,
     "contiguous"),
    ("cache_read_only", {}, _set(k_cache=lambda a: _read_only(a["k_cache"])), ShapeError, "writable"),
    ("caches_overlap", {}, _set(k_cache=lambda a: a["ckv_cache"].reshape(-1)[:4 * 16 * 64].reshape(4, 16, 1, 64)),
     ShapeError, "ckv_cache"),
    ("index_too_big", {}, _set(index=lambda a: _put(a["index"], 1, 4 * 16)), IndexRangeError, r"index\[1\] = 64"),
    ("index_minus_two", {}, _set(index=lambda a: _put(a["index"], 0, -2)), IndexRangeError, "index"),
    ("norm_index_too_big", {"mode": "Norm"}, _set(index=lambda a: _put(a["index"], (1, 2), 6)), IndexRangeError,
     r"index\[1, 2\] = 6"),
    ("blk_misaligned", {"mode": "PA_BLK_NZ"}, _set(index=lambda a: _put(a["index"], 1, 17)), IndexRangeError,
     "multiple of block_size"),
    ("blk_out_of_range", {"mode": "PA_BLK_BNSD"}, _set(index=lambda a: _put(a["index"], 0, 4 * 16)),
     IndexRangeError, "index"),
    ("epsilon_text", {}, _set(epsilon="small"), DTypeError, "epsilon"),
    ("epsilon_nan", {}, _set(epsilon=float("nan")), DTypeError, "epsilon"),
    ("epsilon_negative", {}, _set(epsilon=-1e-5), DTypeError, "epsilon"),
]


def _read_only(x):
    x = x.copy()
    x.flags.writeable = False
    return x


def _put(index, pos, value):
    index = index.copy()
    index[pos] = value
    return index


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_raise_and_leave_caches_untouched(case):
    _, base, mutate, error, fragment = case
    kw = _base(**base)
    if mutate is not None:
        kw = mutate(kw)
    before = [raw(kw[n]).copy() for n in ("k_cache", "ckv_cache")]
    with pytest.raises(error, match=fragment):
        npu_kv_rmsnorm_rope_cache(**kw)
    assert_same_bytes(kw["k_cache"], before[0], "k_cache")
    assert_same_bytes(kw["ckv_cache"], before[1], "ckv_cache")


# ---------------------------------------------------------------------- fp16 bit helpers
@njit
def _f16_to_f32_all(h, out):
    for i in range(h.size):
        out[i] = f16_bits_to_f32(h[i])


@njit
def _f32_to_f16_all(u, out):
    for i in range(u.size):
        out[i] = f32_bits_to_f16_bits(u[i])


def test_fp16_bit_helpers_match_numpy(rng):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every fp16 pattern
    wide = np.empty(h.size, np.float32)
    _f16_to_f32_all(h, wide)
    assert np.array_equal(wide.view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))

    near = rng.integers(0x32000000, 0x48000000, 1 << 18, dtype=np.uint64)  # fp16's range incl. subnormals
    u = np.concatenate([rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64), near, near | (1 << 31),
                        [0x477FEFFF, 0x477FF000, 0x477FF001, 0x33000000, 0x33000001, 0x387FE000, 0x387FF000,
                         0x7F800000, 0xFF800000, 0x7FC00000, 0, 1 << 31]]).astype(np.uint32)
    narrow = np.empty(u.size, np.uint16)
    _f32_to_f16_all(u, narrow)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = u.view(np.float32).astype(np.float16)
    nan = np.isnan(expected)
    assert np.array_equal(narrow[~nan], expected.view(np.uint16)[~nan])
    assert np.isnan(narrow.view(np.float16)[nan]).all()
