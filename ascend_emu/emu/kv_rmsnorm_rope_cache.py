"""emu backend of ``npu_kv_rmsnorm_rope_cache``: one fused Numba pass per token, then two scatters.

Numerics (ops_reference §1.1-§1.3, §4; kernel ``kv_rms_norm_rope_cache_b16_pa_nz_quant.h``):

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
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ..ops.kv_rmsnorm_rope_cache import (HIDDEN_SIZE, RMS_SIZE, ROPE_SIZE, UNWRITTEN_OUTPUT_FILL,
                                         KvRmsNormRopeCacheArgs, KvRmsNormRopeCacheOutputs)
from ..quant import BF16, INT8_MAX, INT8_MIN, to_f32
from .kernels import (KV_CACHE_RMS, LANES, kernel_input, last_writer, narrow_row, rms_norm_row, rope_row,
                      scatter_rows, widen_row)

#: The kernel's RmsNorm order (:data:`~ascend_emu.emu.kernels.KV_CACHE_RMS`).
_RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL = KV_CACHE_RMS
#: Fewest tokens per parallel range: a range must outlast the wake-up of its thread (tens of
#: microseconds; a token takes about 0.2 us), so small batches run on one thread.
TOKENS_PER_PART = 256
_NO_SCALE = np.empty(0, dtype=np.float32)


@njit(cache=True, inline="always")
def _round_float_to_int8(x):
    """``RoundFloat2Int8``: round half to even, saturate to int8; NaN -> 0."""
    if x != x:
        return np.int8(0)
    r = np.rint(x)
    if r > INT8_MAX:
        return np.int8(INT8_MAX)
    if r < INT8_MIN:
        return np.int8(INT8_MIN)
    return np.int8(r)


@njit(cache=True)
def _kv_rmsnorm_rope_range(lo, hi, kv, gamma, cos, sin, eps, is_bf16, quant, k_scale, c_scale, k_rows, y_rows,
                           k_int8, y_int8):
    """Tokens ``[lo, hi)``: RmsNorm of ``kv[:512]``, RoPE of ``kv[512:]``, rounding and quant.

    Args:
        lo, hi: token range.
        kv: uint16 ``[T, 576]`` bf16 / fp16 bits.
        gamma: fp32 ``[512]``.
        cos, sin: uint16 ``[T, 64]``.
        eps: fp32.
        is_bf16: bits are bf16 (else fp16).
        quant: also write ``k_int8`` / ``y_int8``.
        k_scale, c_scale: fp32 ``[64]`` / ``[512]`` multipliers (unused without ``quant``).
        k_rows, y_rows: out, uint16 ``[T, 64]`` / ``[T, 512]`` kv-dtype bits.
        k_int8, y_int8: out, int8 ``[T, 64]`` / ``[T, 512]`` (``[0, .]`` without ``quant``).
    """
    one = np.float32(1.0)
    x = np.empty(RMS_SIZE, dtype=np.float32)  # [512] widened rms_in
    y = np.empty(RMS_SIZE, dtype=np.float32)  # [512]
    sq = np.empty(RMS_SIZE, dtype=np.float32)  # [512] squares, halved in place
    lanes = np.empty(LANES, dtype=np.float32)  # [64]
    r = np.empty(ROPE_SIZE, dtype=np.float32)  # [64]
    c = np.empty(ROPE_SIZE, dtype=np.float32)  # [64]
    s = np.empty(ROPE_SIZE, dtype=np.float32)  # [64]
    k = np.empty(ROPE_SIZE, dtype=np.float32)  # [64]
    for t in range(lo, hi):
        widen_row(kv[t, :RMS_SIZE], x, is_bf16)
        rms_norm_row(x, gamma, eps, one, _RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL, sq, lanes, y)
        widen_row(kv[t, RMS_SIZE:], r, is_bf16)
        widen_row(cos[t], c, is_bf16)
        widen_row(sin[t], s, is_bf16)
        rope_row(r, c, s, True, k)
        narrow_row(y, y_rows[t], is_bf16)
        narrow_row(k, k_rows[t], is_bf16)
        if quant:
            for i in range(RMS_SIZE):
                y_int8[t, i] = _round_float_to_int8(y[i] * c_scale[i])
            for i in range(ROPE_SIZE):
                k_int8[t, i] = _round_float_to_int8(k[i] * k_scale[i])


@njit(cache=True, parallel=True)
def _kv_rmsnorm_rope_parallel(parts, kv, gamma, cos, sin, eps, is_bf16, quant, k_scale, c_scale, k_rows, y_rows,
                              k_int8, y_int8):
    """:func:`_kv_rmsnorm_rope_range` over ``parts`` contiguous token ranges in parallel. Every token
    is computed alone, so the result does not depend on ``parts`` or the thread count."""
    n = kv.shape[0]
    for p in prange(parts):
        _kv_rmsnorm_rope_range(p * n // parts, (p + 1) * n // parts, kv, gamma, cos, sin, eps, is_bf16, quant,
                               k_scale, c_scale, k_rows, y_rows, k_int8, y_int8)


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
    return max(1, min(numba.get_num_threads(), tokens // TOKENS_PER_PART))


def fused_rows(kv: np.ndarray, gamma: np.ndarray, cos: np.ndarray, sin: np.ndarray, eps: np.float32,
               is_bf16: bool, k_scale: np.ndarray | None = None, c_scale: np.ndarray | None = None):
    """The fused per-token pass (module doc) over all tokens, threaded above :data:`TOKENS_PER_PART`.

    Args:
        kv: uint16 ``[T, 576]`` bf16 / fp16 bits, C-contiguous.
        gamma: fp32 ``[512]``.
        cos, sin: uint16 ``[T, 64]``.
        eps: fp32 epsilon.
        is_bf16: the bits are bf16 (else fp16).
        k_scale, c_scale: fp32 ``[64]`` / ``[512]`` quant multipliers, both or neither.

    Returns:
        ``(k_rows, y_rows, k_int8, y_int8)``: uint16 ``[T, 64]`` / ``[T, 512]`` kv-dtype bits; int8
        ``[T, 64]`` / ``[T, 512]`` (``[0, .]`` without scales).
    """
    t = kv.shape[0]
    quant = k_scale is not None
    k_rows = np.empty((t, ROPE_SIZE), dtype=np.uint16)  # [T, 64] kv-dtype bits
    y_rows = np.empty((t, RMS_SIZE), dtype=np.uint16)  # [T, 512] kv-dtype bits
    k_int8 = np.empty((t if quant else 0, ROPE_SIZE), dtype=np.int8)  # [T, 64]
    y_int8 = np.empty((t if quant else 0, RMS_SIZE), dtype=np.int8)  # [T, 512]
    operands = (kv, gamma, cos, sin, np.float32(eps), bool(is_bf16), quant,
                k_scale if quant else _NO_SCALE, c_scale if quant else _NO_SCALE, k_rows, y_rows, k_int8, y_int8)
    parts = _parts(t)
    if parts > 1:
        _kv_rmsnorm_rope_parallel(parts, *operands)
    else:
        _kv_rmsnorm_rope_range(0, t, *operands)
    return k_rows, y_rows, k_int8, y_int8


def _scale(scale: np.ndarray, dim: int) -> np.ndarray:
    """A ``[D]`` / ``[1, D]`` / ``[1]`` fp32 multiplier as the kernel reads it: fp32 ``[dim]``."""
    return kernel_input(np.broadcast_to(scale.reshape(-1), (dim,)))  # [dim] fp32


def kv_rmsnorm_rope_cache(args: KvRmsNormRopeCacheArgs) -> KvRmsNormRopeCacheOutputs:
    """emu implementation of :func:`ascend_emu.ops.npu_kv_rmsnorm_rope_cache`.

    Args:
        args: validated arguments (slots in range, caches contiguous and writable).

    Returns:
        ``(k_cache, ckv_cache, k_embed_out [B, 1, S, 64], y_out [B, 1, S, 512])``; the caches are
        the caller's arrays, updated in place.
    """
    quant = args.quant
    t = args.batch * args.seq_len
    kv = kernel_input(args.kv).reshape(t, HIDDEN_SIZE)  # [T, 576]
    cos = kernel_input(args.cos).reshape(t, ROPE_SIZE)  # [T, 64]
    sin = kernel_input(args.sin).reshape(t, ROPE_SIZE)  # [T, 64]
    k_rows, y_rows, k_int8, y_int8 = fused_rows(kv.view(np.uint16), kernel_input(to_f32(args.gamma)),
                                                cos.view(np.uint16), sin.view(np.uint16), args.epsilon,
                                                args.kv_dtype == BF16,
                                                _scale(args.k_rope_scale, ROPE_SIZE) if quant else None,
                                                _scale(args.c_kv_scale, RMS_SIZE) if quant else None)
    # [T'] tokens to write (the last one per slot), shared by both caches
    keep = np.flatnonzero(args.slots >= 0) if args.unique_slots else last_writer(args.slots)
    scatter_rows(args.k_cache, k_int8 if quant else k_rows, args.slots, args.k_layout, keep=keep)
    scatter_rows(args.ckv_cache, y_int8 if quant else y_rows, args.slots, args.ckv_layout, keep=keep)

    b, s, dtype = args.batch, args.seq_len, args.kv_dtype
    if args.is_output_kv:
        k_embed_out = k_rows.view(dtype).reshape(b, 1, s, ROPE_SIZE)  # [B, 1, S, 64]
        y_out = y_rows.view(dtype).reshape(b, 1, s, RMS_SIZE)  # [B, 1, S, 512]
    else:
        k_embed_out = _filled((b, 1, s, ROPE_SIZE), dtype)  # [B, 1, S, 64]
        y_out = _filled((b, 1, s, RMS_SIZE), dtype)  # [B, 1, S, 512]
    return KvRmsNormRopeCacheOutputs(args.k_cache, args.ckv_cache, k_embed_out, y_out)
