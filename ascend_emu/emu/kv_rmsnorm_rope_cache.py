"""emu backend of ``npu_kv_rmsnorm_rope_cache``: one fused Numba pass per token, then two scatters
(a small non-quant call, on one thread with both scatters in token order, runs the same three
kernels in one Numba launch: :func:`_small_call`).

Numerics (docs/sources.md#rope, docs/sources.md#quant_rounding, docs/sources.md#rms_norm, docs/sources.md#npu_kv_rmsnorm_rope_cache; kernel ``kv_rms_norm_rope_cache_b16_pa_nz_quant.h``):

- bf16 / fp16 inputs (kept as ``uint16`` bits) widened exactly to fp32, gamma already fp32.
- RmsNorm in fp32 in the kernel's order (:data:`~ascend_emu.emu.kernels.KV_CACHE_RMS`, sources
  there): the 512 squares added as a tree (the eight 64-element blocks pairwise, then the 64 lanes
  pairwise, ``WholeReduceSum``), times fp32(1/512), plus eps, sqrt, divide, times gamma.
- Duplicate slots: the last token wins (deterministic for any thread count).
- RoPE in fp32 (:func:`~ascend_emu.emu.kernels.rope_row` with de-interleave): the same products
  and sums as the kernel's ``y0 = (real, imag) * cos``, ``y1 = (-imag, real) * sin``, ``y0 + y1``.
- Rows for the outputs and the non-quant caches: one RNE rounding fp32 -> bf16 (``CAST_RINT``)
  or fp32 -> fp16 (``CAST_NONE``, also RNE).
- int8 caches: fp32 row times the fp32 scale, then ``RoundFloat2Int8`` (fp32 -> int32 RINT ->
  half -> int8): round-half-even, saturated to [-128, 127]; NaN becomes 0 (as
  :func:`~ascend_emu.quant.saturate_int8`).
- K/V-split mode (``v`` given; ``RmsNormV2`` / ``RopeKV2`` of the ops-nn kernels, sources in
  :mod:`ascend_emu.ops.kv_rmsnorm_rope_cache`): the same pass over 192-wide rows, the RoPE input
  being the fp32 normed ``y[:64]`` and the k row ``[rope | y[64:]]``; v goes to ckv_cache as is
  (non-quant) or as ``RoundFloat2Int8(v * c_kv_scale)``. The summation order is the kernel's:
  :data:`~ascend_emu.emu.kernels.KV_CACHE_BLK_NZ_RMS` for non-quant PA_BLK_NZ,
  :data:`~ascend_emu.emu.kernels.KV_CACHE_RMS` elsewhere (:func:`rms_order`; the two agree on
  512-wide rows).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ..layouts import CacheLayout
from . import kernels as _kernels
from ..ops.kv_rmsnorm_rope_cache import (RMS_SIZE, ROPE_SIZE, UNWRITTEN_OUTPUT_FILL, V_SPLIT_K_SIZE,
                                         KvRmsNormRopeCacheArgs, KvRmsNormRopeCacheOutputs)
from ..quant import BF16, to_f32
from .kernels import (_WORDS, KV_CACHE_BLK_NZ_RMS, KV_CACHE_RMS, LANES, LANES_IN_ORDER, LANES_PAIRWISE,
                      LANES_PAIRWISE_EIGHTHS, SCATTER_BYTES_PER_THREAD, RmsNormOrder, _scatter_in_order, _word_size,
                      kernel_input, last_writer, narrow_row, rms_norm_row, rope_row, round_to_int8, scatter_rows,
                      widen_row)
#: Fewest tokens per parallel range: a range must outlast the wake-up of its thread (tens of
#: microseconds; a token takes about 0.2 us), so small batches run on one thread.
TOKENS_PER_PART = 256
_NO_SCALE = np.empty(0, dtype=np.float32)
_NO_ROWS = np.empty((0, 0), dtype=np.uint16)
_NO_K_INT8 = np.empty((0, ROPE_SIZE), dtype=np.int8)
_NO_C_INT8 = np.empty((0, RMS_SIZE), dtype=np.int8)


@njit(cache=True)
def _kv_rmsnorm_rope_range(lo, hi, kv, split, gamma, cos, sin, v, eps, is_bf16, lanes_order, quant, k_scale,
                           c_scale, k_rows, c_rows, k_int8, c_int8):
    """:func:`_token_rows` with ``h`` (from ``split``), ``split`` and ``lanes_order`` passed on as compile-time
    constants (the cases the contract allows): with run-time widths and order the compiler cannot
    vectorise the RmsNorm sums (4x slower)."""
    if split:
        if lanes_order == LANES_PAIRWISE_EIGHTHS:
            _token_rows(lo, hi, kv, V_SPLIT_K_SIZE, True, gamma, cos, sin, v, eps, is_bf16, LANES_PAIRWISE_EIGHTHS,
                        quant, k_scale, c_scale, k_rows, c_rows, k_int8, c_int8)
        else:
            _token_rows(lo, hi, kv, V_SPLIT_K_SIZE, True, gamma, cos, sin, v, eps, is_bf16, LANES_PAIRWISE, quant,
                        k_scale, c_scale, k_rows, c_rows, k_int8, c_int8)
    else:  # 512 = 8 x 64 lanes: both pairwise orders are the same sum
        _token_rows(lo, hi, kv, RMS_SIZE, False, gamma, cos, sin, v, eps, is_bf16, LANES_PAIRWISE, quant, k_scale,
                    c_scale, k_rows, c_rows, k_int8, c_int8)


@njit(cache=True, inline="always")
def _token_rows(lo, hi, kv, h, split, gamma, cos, sin, v, eps, is_bf16, lanes_order, quant, k_scale, c_scale, k_rows,
                c_rows, k_int8, c_int8):
    """Tokens ``[lo, hi)``: RmsNorm of ``kv[:h]``, RoPE, rounding and quant.

    Args:
        lo, hi: token range.
        kv: uint16 ``[T, 576]`` (split: ``[T, 192]``) bf16 / fp16 bits.
        h: RmsNorm width, 512 (split: 192).
        split: K/V-split mode: RoPE of the normed ``y[:64]``, k row ``[rope | y[64:]]``, c row = v.
            Else RoPE of ``kv[512:]``, k row = rope, c row = ``y``.
        gamma: fp32 ``[h]``.
        cos, sin: uint16 ``[T, 64]``.
        v: uint16 ``[T, 128]`` bits (split and quant only; ``[0, 0]`` otherwise).
        eps: fp32.
        is_bf16: bits are bf16 (else fp16).
        lanes_order: the ``lanes`` of the kernel's :class:`~ascend_emu.emu.kernels.RmsNormOrder`
            (``prescale`` and ``reciprocal`` are False in every kv_rmsnorm_rope_cache kernel).
        quant: also write ``k_int8`` / ``c_int8``.
        k_scale, c_scale: fp32 multipliers of the k / c rows' widths (unused without ``quant``).
        k_rows, c_rows: out, uint16 kv-dtype bits ``[T, 64]`` / ``[T, 512]`` (split: ``[T, 192]`` /
            ``[0, 0]``, v being the c row).
        k_int8, c_int8: out, int8 of the k / c rows' widths (``[0, .]`` without ``quant``).
    """
    one = np.float32(1.0)
    x = np.empty(h, dtype=np.float32)  # [h] widened rms input
    y = np.empty(h, dtype=np.float32)  # [h] normed row (split: becomes the k row)
    sq = np.empty(h, dtype=np.float32)  # [h] squares, halved in place
    lanes = np.empty(LANES, dtype=np.float32)  # [64]
    r = np.empty(ROPE_SIZE, dtype=np.float32)  # [64]
    c = np.empty(ROPE_SIZE, dtype=np.float32)  # [64]
    s = np.empty(ROPE_SIZE, dtype=np.float32)  # [64]
    k = np.empty(ROPE_SIZE, dtype=np.float32)  # [64]
    vrow = np.empty(v.shape[1], dtype=np.float32)  # [128] (split + quant)
    for t in range(lo, hi):
        widen_row(kv[t, :h], x, is_bf16)
        rms_norm_row(x, gamma, eps, one, lanes_order, False, False, sq, lanes, y)
        if split:
            for i in range(ROPE_SIZE):
                r[i] = y[i]
        else:
            widen_row(kv[t, h:], r, is_bf16)
        widen_row(cos[t], c, is_bf16)
        widen_row(sin[t], s, is_bf16)
        rope_row(r, c, s, True, k)
        if split:
            for i in range(ROPE_SIZE):
                y[i] = k[i]
            narrow_row(y, k_rows[t], is_bf16)
            if quant:
                for i in range(h):
                    k_int8[t, i] = round_to_int8(y[i] * k_scale[i])
                widen_row(v[t], vrow, is_bf16)
                for i in range(vrow.shape[0]):
                    c_int8[t, i] = round_to_int8(vrow[i] * c_scale[i])
        else:
            narrow_row(y, c_rows[t], is_bf16)
            narrow_row(k, k_rows[t], is_bf16)
            if quant:
                for i in range(h):
                    c_int8[t, i] = round_to_int8(y[i] * c_scale[i])
                for i in range(ROPE_SIZE):
                    k_int8[t, i] = round_to_int8(k[i] * k_scale[i])


@njit(cache=True, parallel=True)
def _kv_rmsnorm_rope_parallel(parts, kv, split, gamma, cos, sin, v, eps, is_bf16, lanes_order, quant, k_scale,
                              c_scale, k_rows, c_rows, k_int8, c_int8):
    """:func:`_kv_rmsnorm_rope_range` over ``parts`` contiguous token ranges in parallel. Every token
    is computed alone, so the result does not depend on ``parts`` or the thread count."""
    n = kv.shape[0]
    for p in prange(parts):
        _kv_rmsnorm_rope_range(p * n // parts, (p + 1) * n // parts, kv, split, gamma, cos, sin, v, eps, is_bf16,
                               lanes_order, quant, k_scale, c_scale, k_rows, c_rows, k_int8, c_int8)


@njit(cache=True)
def _small_call(kv, gamma, cos, sin, eps, is_bf16, no_rows, no_scale, no_k_int8, no_c_int8, k_rows, c_rows, slots,
                k_cache, k_src, k_nz, k_block_size, k_row_words, k_chunk,
                c_cache, c_src, c_nz, c_block_size, c_row_words, c_chunk):
    """A small non-quant call in one launch: :func:`_kv_rmsnorm_rope_range` over every token, then
    :func:`~ascend_emu.emu.kernels._scatter_in_order` of the k rows and of the c rows (``k_src`` /
    ``c_src``: the rows' memory as the scatter's words): the calls, arguments and order of
    :func:`fused_rows` and two :func:`~ascend_emu.emu.kernels.scatter_rows`, so the same bytes."""
    _kv_rmsnorm_rope_range(0, kv.shape[0], kv, False, gamma, cos, sin, no_rows, eps, is_bf16, LANES_PAIRWISE, False,
                           no_scale, no_scale, k_rows, c_rows, no_k_int8, no_c_int8)
    _scatter_in_order(k_cache, k_src, slots, k_nz, k_block_size, k_row_words, k_chunk)
    _scatter_in_order(c_cache, c_src, slots, c_nz, c_block_size, c_row_words, c_chunk)


def _small_rows_and_scatter(args: KvRmsNormRopeCacheArgs, kv: np.ndarray, cos: np.ndarray,
                            sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fused_rows` and the two in-order scatters of a small non-quant call (:func:`_small`)
    in one Numba launch (:func:`_small_call`).

    Args:
        args: the validated arguments.
        kv: uint16 ``[T, 576]``, cos / sin: uint16 ``[T, 64]`` bits, C-contiguous.

    Returns:
        ``(k_rows, c_rows)``: uint16 kv-dtype bits ``[T, 64]`` / ``[T, 512]``.
    """
    t = kv.shape[0]
    k_rows = np.empty((t, ROPE_SIZE), dtype=np.uint16)  # [T, 64] kv-dtype bits
    c_rows = np.empty((t, RMS_SIZE), dtype=np.uint16)  # [T, 512] kv-dtype bits
    geometry = []
    for cache, rows, layout in ((args.k_cache, k_rows, args.k_layout), (args.ckv_cache, c_rows, args.ckv_layout)):
        row_bytes, chunk = rows.nbytes // t, layout.chunk_bytes
        w = _word_size(cache.nbytes, chunk, row_bytes)
        word = _WORDS[w]
        geometry += [cache.reshape(-1).view(word), rows.view(word), layout.nz, layout.block_size, row_bytes // w,
                     chunk // w]
    _small_call(kv, kernel_input(to_f32(args.gamma)), cos, sin, np.float32(args.epsilon), args.kv_dtype == BF16,
                _NO_ROWS, _NO_SCALE, _NO_K_INT8, _NO_C_INT8, k_rows, c_rows, np.asarray(args.slots).reshape(-1),
                *geometry)
    return k_rows, c_rows


def _small(tokens: int, row_bytes: int) -> bool:
    """Whether a non-quant call takes the one-launch path (:func:`_small_rows_and_scatter`): its
    rows run on one thread (:func:`_parts`) and both scatters copy in token order
    (:func:`~ascend_emu.emu.kernels.scatter_rows`), by the thresholds in force now (the warm-up
    lowers them to compile the threaded kernels, and then this path is not taken)."""
    return tokens < 2 * TOKENS_PER_PART and tokens * row_bytes < 2 * _kernels.SCATTER_BYTES_PER_THREAD


def _filled(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An array of :data:`UNWRITTEN_OUTPUT_FILL` (``np.zeros`` when it is 0: ten times faster than
    ``np.full`` for bf16)."""
    out = np.zeros(shape, dtype=dtype)
    if UNWRITTEN_OUTPUT_FILL:
        out.fill(UNWRITTEN_OUTPUT_FILL)
    return out


def _parts(tokens: int) -> int:
    """Token ranges to run in parallel: one per thread, each at least :data:`TOKENS_PER_PART`
    tokens (1 = run serially), so adding threads never makes a call slower."""
    if tokens < 2 * TOKENS_PER_PART:  # one part whatever the thread count (skips asking Numba)
        return 1
    return max(1, min(numba.get_num_threads(), tokens // TOKENS_PER_PART))


def rms_order(layout: CacheLayout, quant: bool) -> RmsNormOrder:
    """The kernel's RmsNorm order for a cache layout: :data:`~ascend_emu.emu.kernels.KV_CACHE_BLK_NZ_RMS`
    for the non-quant PA_BLK_NZ kernel (tiling key 4000: an NZ cache written by whole pages),
    :data:`~ascend_emu.emu.kernels.KV_CACHE_RMS` for the others (identical on 512-wide rows; they
    differ on the K/V-split mode's 192)."""
    return KV_CACHE_BLK_NZ_RMS if layout.nz and layout.page_indexed and not quant else KV_CACHE_RMS


def fused_rows(kv: np.ndarray, gamma: np.ndarray, cos: np.ndarray, sin: np.ndarray, eps: np.float32,
               is_bf16: bool, k_scale: np.ndarray | None = None, c_scale: np.ndarray | None = None, *,
               v: np.ndarray | None = None, order: RmsNormOrder = KV_CACHE_RMS):
    """The fused per-token pass (module doc) over all tokens, threaded above :data:`TOKENS_PER_PART`.

    Args:
        kv: uint16 ``[T, 576]`` bf16 / fp16 bits, C-contiguous; with ``v``: ``[T, 192]``.
        gamma: fp32 ``[512]`` (with ``v``: ``[192]``).
        cos, sin: uint16 ``[T, 64]``.
        eps: fp32 epsilon.
        is_bf16: the bits are bf16 (else fp16).
        k_scale, c_scale: fp32 quant multipliers of the k / c rows' widths, both or neither.
        v: None, or uint16 ``[T, 128]`` bits (K/V-split mode).
        order: the kernel's RmsNorm order (:func:`rms_order`; pairwise, no prescale, no reciprocal).

    Returns:
        ``(k_rows, c_rows, k_int8, c_int8)``: uint16 kv-dtype bits ``[T, 64]`` / ``[T, 512]``
        (with ``v``: ``[T, 192]`` / ``[0, 0]``); int8 ``[T, 64]`` / ``[T, 512]`` (with ``v``:
        ``[T, 192]`` / ``[T, 128]``; ``[0, .]`` without scales).
    """
    assert order.lanes != LANES_IN_ORDER and not order.prescale and not order.reciprocal
    t = kv.shape[0]
    quant = k_scale is not None
    split = v is not None
    h = V_SPLIT_K_SIZE if split else RMS_SIZE
    k_size = h if split else ROPE_SIZE
    c_size = v.shape[1] if split else RMS_SIZE
    k_rows = np.empty((t, k_size), dtype=np.uint16)  # [T, 64 | 192] kv-dtype bits
    c_rows = np.empty((0, 0) if split else (t, c_size), dtype=np.uint16)  # [T, 512] kv-dtype bits
    k_int8 = np.empty((t if quant else 0, k_size), dtype=np.int8)  # [T, 64 | 192]
    c_int8 = np.empty((t if quant else 0, c_size), dtype=np.int8)  # [T, 512 | 128]
    v_bits = v if split and quant else _NO_ROWS  # [T, 128] read only to quantize
    operands = (kv, split, gamma, cos, sin, v_bits, np.float32(eps), bool(is_bf16), order.lanes, quant,
                k_scale if quant else _NO_SCALE, c_scale if quant else _NO_SCALE, k_rows, c_rows, k_int8, c_int8)
    parts = _parts(t)
    if parts > 1:
        _kv_rmsnorm_rope_parallel(parts, *operands)
    else:
        _kv_rmsnorm_rope_range(0, t, *operands)
    return k_rows, c_rows, k_int8, c_int8


def _scale(scale: np.ndarray, dim: int) -> np.ndarray:
    """A ``[D]`` / ``[1, D]`` / ``[1]`` fp32 multiplier as the kernel reads it: fp32 ``[dim]``."""
    return kernel_input(np.broadcast_to(scale.reshape(-1), (dim,)))  # [dim] fp32


def kv_rmsnorm_rope_cache(args: KvRmsNormRopeCacheArgs) -> KvRmsNormRopeCacheOutputs:
    """emu implementation of :func:`ascend_emu.ops.npu_kv_rmsnorm_rope_cache`.

    Args:
        args: validated arguments (slots in range, caches contiguous and writable).

    Returns:
        ``(k_cache, ckv_cache, k_embed_out, y_out)``; the caches are the caller's arrays, updated
        in place; ``k_embed_out [B, 1, S, 64]`` / ``y_out [B, 1, S, 512]`` (K/V-split:
        ``[B, 1, S, 192]`` / ``[B, 1, S, 128]``).
    """
    quant, split = args.quant, args.v_split
    t = args.batch * args.seq_len
    k_size, c_size = args.k_layout.dim, args.ckv_layout.dim
    kv = kernel_input(args.kv).reshape(t, -1)  # [T, 576] (split: [T, 192])
    cos = kernel_input(args.cos).reshape(t, ROPE_SIZE)  # [T, 64]
    sin = kernel_input(args.sin).reshape(t, ROPE_SIZE)  # [T, 64]
    v = kernel_input(args.v).reshape(t, c_size) if split else None  # [T, 128] kv dtype
    order = rms_order(args.k_layout, quant)
    if not quant and not split and _small(t, max(k_size, c_size) * 2):
        assert order.lanes != LANES_IN_ORDER and not order.prescale and not order.reciprocal
        k_rows, c_rows = _small_rows_and_scatter(args, kv.view(np.uint16), cos.view(np.uint16), sin.view(np.uint16))
        return _outputs(args, k_rows, c_rows)
    k_rows, c_rows, k_int8, c_int8 = fused_rows(
        kv.view(np.uint16), kernel_input(to_f32(args.gamma)), cos.view(np.uint16), sin.view(np.uint16), args.epsilon,
        args.kv_dtype == BF16, _scale(args.k_rope_scale, k_size) if quant else None,
        _scale(args.c_kv_scale, c_size) if quant else None, v=None if v is None else v.view(np.uint16),
        order=order)
    if split:
        c_rows = v.view(np.uint16)  # [T, 128]: v as it came
    k_src, c_src = (k_int8, c_int8) if quant else (k_rows, c_rows)
    if max(k_src.nbytes, c_src.nbytes) < 2 * SCATTER_BYTES_PER_THREAD:
        keep = None  # both scatters copy in token order (the last writer wins, -1 skipped): no index pass
    else:  # [T'] tokens to write (the last one per slot), shared by both caches
        keep = np.flatnonzero(args.slots >= 0) if args.unique_slots else last_writer(args.slots)
    scatter_rows(args.k_cache, k_src, args.slots, args.k_layout, keep=keep)
    scatter_rows(args.ckv_cache, c_src, args.slots, args.ckv_layout, keep=keep)
    return _outputs(args, k_rows, c_rows)


def _outputs(args: KvRmsNormRopeCacheArgs, k_rows: np.ndarray, c_rows: np.ndarray) -> KvRmsNormRopeCacheOutputs:
    """The op's outputs from the uint16 rows ``k_rows`` ``[T, 64 | 192]`` / ``c_rows`` ``[T, 512 | 128]``
    (K/V-split: ``c_rows`` is the caller's v bits)."""
    split = args.v_split
    k_size, c_size = args.k_layout.dim, args.ckv_layout.dim
    b, s, dtype = args.batch, args.seq_len, args.kv_dtype
    if args.is_output_kv:
        k_embed_out = k_rows.view(dtype).reshape(b, 1, s, k_size)  # [B, 1, S, 64 | 192]
        y_out = c_rows.view(dtype).reshape(b, 1, s, c_size)  # [B, 1, S, 512 | 128]
        if split:
            y_out = y_out.copy()  # not the caller's v
    else:
        k_embed_out = _filled((b, 1, s, k_size), dtype)  # [B, 1, S, 64 | 192]
        y_out = _filled((b, 1, s, c_size), dtype)  # [B, 1, S, 512 | 128]
    return KvRmsNormRopeCacheOutputs(args.k_cache, args.ckv_cache, k_embed_out, y_out)
