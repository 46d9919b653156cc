"""Numba kernels shared by the emu backend: RmsNorm, RoPE, the row scatter into caches.

Numerics (ops_reference §1.1, §1.3; DESIGN.md "Numerics policy"): everything in fp32, no fused
multiply-add (no ``fastmath``); bf16 rounding is :mod:`ascend_emu.quant.rounding`'s RNE on
``uint16`` bits. Kernels take already-validated arguments: slots reaching :func:`scatter_rows`
are in range.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..layouts import CacheLayout

from ..mla import D_ROPE as ROPE_DIM
_HALF = ROPE_DIM // 2


# ---------------------------------------------------------------------- RmsNorm
@njit(cache=True, inline="always")
def rms_norm_row(x, gamma, eps, scale, out):
    """``out = x / sqrt(sum(x^2) * (1/H) + eps) * gamma * scale`` for one row, fp32.

    Kernel order (ops_reference §1.3): square-sum, multiply by 1/H, add eps, sqrt, divide,
    multiply by gamma, then by the v3 scale (qc_qr_scale / kc_scale; 1.0 elsewhere).
    """
    ss = np.float32(0.0)
    for i in range(x.shape[0]):
        ss += x[i] * x[i]
    rms_norm_scale_row(x, ss, gamma, eps, scale, out)


@njit(cache=True, inline="always")
def rms_norm_scale_row(x, ss, gamma, eps, scale, out):
    """The rest of :func:`rms_norm_row` once its square-sum ``ss`` is known (fp32)."""
    h = x.shape[0]
    rms = np.sqrt(ss * np.float32(np.float32(1.0) / np.float32(h)) + eps)
    for i in range(h):
        out[i] = x[i] / rms * gamma[i] * scale


@njit(cache=True, inline="always")
def square_sums4(a, b, c, d):
    """:func:`rms_norm_row`'s square-sums (fp32, element order) of four equal-length rows at once.

    Bit-identical to four separate sums; four independent add chains run ~3x faster than one
    after the other (a single 512-element chain is bound by the add latency).
    """
    s0 = np.float32(0.0)
    s1 = np.float32(0.0)
    s2 = np.float32(0.0)
    s3 = np.float32(0.0)
    for i in range(a.shape[0]):
        s0 += a[i] * a[i]
        s1 += b[i] * b[i]
        s2 += c[i] * c[i]
        s3 += d[i] * d[i]
    return s0, s1, s2, s3


@njit(cache=True, parallel=True)
def _rms_norm_2d(x, gamma, eps, scale, out):
    for t in prange(x.shape[0]):
        rms_norm_row(x[t], gamma, eps, scale, out[t])


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float, scale: float = 1.0) -> np.ndarray:
    """RmsNorm over the last axis in fp32.

    Args:
        x: fp32 ``[T, H]``.
        gamma: fp32 ``[H]``.
        eps: epsilon (rounded to fp32).
        scale: extra multiplier applied last (v3 ``qc_qr_scale`` / ``kc_scale``).

    Returns:
        fp32 ``[T, H]``.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _rms_norm_2d(x, np.ascontiguousarray(gamma, dtype=np.float32), np.float32(eps), np.float32(scale), out)
    return out


# ---------------------------------------------------------------------- RoPE
@njit(cache=True, inline="always")
def rope_row(x, cos, sin, deinterleave, out):
    """RoPE of one 64-element row in fp32 (ops_reference §1.1).

    With ``deinterleave`` (the MLA prolog family) the input pairs are first split into
    ``x' = [x[0::2], x[1::2]]``; then rotate_half with half-layout cos / sin:
    ``out[:32] = x'[:32]*cos[:32] - x'[32:]*sin[:32]``,
    ``out[32:] = x'[32:]*cos[32:] + x'[:32]*sin[32:]``.
    Without it (MlaPreprocess) ``x' = x``.
    """
    for i in range(_HALF):
        if deinterleave:
            a = x[2 * i]
            b = x[2 * i + 1]
        else:
            a = x[i]
            b = x[i + _HALF]
        out[i] = a * cos[i] - b * sin[i]
        out[i + _HALF] = b * cos[i + _HALF] + a * sin[i + _HALF]


@njit(cache=True, parallel=True)
def _rope_3d(x, cos, sin, deinterleave, out):
    for t in prange(x.shape[0]):
        for n in range(x.shape[1]):
            rope_row(x[t, n], cos[t], sin[t], deinterleave, out[t, n])


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, deinterleave: bool) -> np.ndarray:
    """RoPE over the last axis (64) in fp32, cos / sin shared by all heads of a token.

    Args:
        x: fp32 ``[T, 64]`` or ``[T, N, 64]``.
        cos, sin: fp32 ``[T, 64]``.
        deinterleave: True for the MLA prolog family, False for MlaPreprocess.

    Returns:
        fp32 of ``x``'s shape.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    x3 = x.reshape(x.shape[0], -1, ROPE_DIM)  # [T, N, 64]
    out = np.empty_like(x3)
    _rope_3d(x3, np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32),
             deinterleave, out)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------- scatter
@njit(cache=True, inline="always")
def _scatter_token(cache, rows, offsets, chunk, t):
    for j in range(offsets.shape[1]):
        dst = offsets[t, j]
        src = j * chunk
        for k in range(chunk):
            cache[dst + k] = rows[t, src + k]


@njit(cache=True, parallel=True)
def _scatter_chunks(cache, rows, offsets, chunk):
    for t in prange(offsets.shape[0]):
        _scatter_token(cache, rows, offsets, chunk, t)


@njit(cache=True)
def _scatter_chunks_serial(cache, rows, offsets, chunk):
    for t in range(offsets.shape[0]):
        _scatter_token(cache, rows, offsets, chunk, t)


#: Below this many bytes a scatter runs on one thread: starting the pool costs more than the copy.
SCATTER_PARALLEL_MIN_BYTES = 1 << 20


def _copy_word(nbytes: int, chunk: int, row_bytes: int, offsets: np.ndarray):
    """Widest unsigned word (8, 4, 2 or 1 bytes) dividing the cache size, the chunk, the row and every
    offset, so chunks are copied as words (a byte loop is ~10x slower for 32-byte NZ chunks)."""
    low = int(np.bitwise_or.reduce(offsets, axis=None)) if offsets.size else 0
    for word in (np.uint64, np.uint32, np.uint16):
        w = np.dtype(word).itemsize
        if (nbytes | chunk | row_bytes | low) % w == 0:
            return word
    return np.uint8


def last_writer(slots: np.ndarray) -> np.ndarray:
    """Token indices to write so that each slot is written once, by its last token; -1 skipped.

    Makes scatters deterministic whatever the thread count when tokens share a slot.
    """
    slots = np.asarray(slots).reshape(-1)
    live = np.flatnonzero(slots >= 0)
    if live.size == 0:
        return live
    rev = live[::-1]
    _, first_in_rev = np.unique(slots[rev], return_index=True)
    return np.sort(rev[first_in_rev])


def scatter_rows(cache: np.ndarray, rows: np.ndarray, slots: np.ndarray, layout: CacheLayout, *,
                 keep: np.ndarray | None = None) -> None:
    """Write token rows into a cache in place, where ``layout`` puts them.

    Args:
        cache: the C-contiguous cache array (any dtype; treated as raw bytes).
        rows: ``[T, heads * dim]`` values of the cache's element type (or their raw bytes,
            ``uint8 [T, row_bytes]``).
        slots: int64 ``[T]`` validated slots; -1 skips the token; for a slot written by several
            tokens the last one wins.
        layout: the cache's :class:`~ascend_emu.layouts.CacheLayout`.
        keep: ``last_writer(slots)`` when the caller already has it (several caches, same slots).
    """
    keep = last_writer(slots) if keep is None else keep
    if keep.size == 0:
        return
    raw = np.ascontiguousarray(rows).view(np.uint8).reshape(rows.shape[0], -1)  # [T, row_bytes]
    slots = np.asarray(slots).reshape(-1)
    if keep.size < raw.shape[0]:  # else keep is arange(T): no copy needed
        raw, slots = raw[keep], slots[keep]
    offsets = layout.chunk_offsets(slots)  # [T', nchunk]
    flat = cache.reshape(-1).view(np.uint8)  # shares memory with cache
    word = _copy_word(flat.size, layout.chunk_bytes, raw.shape[1], offsets)
    w = np.dtype(word).itemsize
    scatter = _scatter_chunks if raw.itemsize * raw.shape[1] * keep.size >= SCATTER_PARALLEL_MIN_BYTES \
        else _scatter_chunks_serial
    scatter(flat.view(word), np.ascontiguousarray(raw).view(word), offsets // w, layout.chunk_bytes // w)
