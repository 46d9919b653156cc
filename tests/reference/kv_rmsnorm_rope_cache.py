"""Reference for ``npu_kv_rmsnorm_rope_cache``: plain NumPy and loops, written from the seed doc and
docs/sources.md#rope, docs/sources.md#quant_rounding, docs/sources.md#paged_nz and docs/sources.md#npu_kv_rmsnorm_rope_cache (the official op-plugin golden's formulas).

Imports only numpy, ml_dtypes and ``tests.reference.rms_norm``. Layouts are spelled out from the formulas:

- ND caches (Norm, PA, PA_BNSD, PA_BLK_BNSD): row ``slot`` holds elements ``[slot*D, slot*D + D)``;
  Norm's slot is ``b * cache_length + index[b, s]``.
- NZ caches (PA_NZ, PA_BLK_NZ): element ``d`` of slot ``blk * bs + r`` sits at element
  ``blk*bs*D + (d // C0)*bs*C0 + r*C0 + d % C0`` with ``C0 = 32 bytes / itemsize``.
- PA_BLK index entries are token offsets of page starts: token ``p`` of batch ``b`` goes to page
  ``index[b * ceil(S/bs) + p // bs] // bs``, row ``p % bs``.
- ``-1`` skips the token (PA_BLK: the page).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from tests.reference.rms_norm import rms_norm

BF16 = np.dtype(ml_dtypes.bfloat16)
RMS = 512
ROPE = 64
NZ_MODES = ("PA_NZ", "PA_BLK_NZ")
TOKEN_INDEX_MODES = ("PA", "PA_BNSD", "PA_NZ")
PAGE_INDEX_MODES = ("PA_BLK_BNSD", "PA_BLK_NZ")


class RefResult(NamedTuple):
    k_cache: np.ndarray      # updated copy of k_cache
    ckv_cache: np.ndarray    # updated copy of ckv_cache
    k_embed_out: np.ndarray  # [B, 1, S, 64] kv dtype
    y_out: np.ndarray        # [B, 1, S, 512] kv dtype
    k_rows: np.ndarray       # [T, 64] what went to k_cache (kv dtype or int8)
    y_rows: np.ndarray       # [T, 512] what went to ckv_cache
    k_scaled: np.ndarray | None  # [T, 64] fp32 k_embed * k_rope_scale (quant only)
    y_scaled: np.ndarray | None  # [T, 512] fp32 y * c_kv_scale (quant only)
    slots: np.ndarray        # [T] destination slot per token, -1 = skipped


def rmsnorm_rope_f32(kv, gamma, cos, sin, epsilon):
    """The golden's fp32 math, the sum of squares in the kernel's order (the golden's ``mean``
    sums in NumPy's order; ``tests/reference/rms_norm.py``). Returns ``(k_embed [B,1,S,64], y [B,1,S,512])``, fp32."""
    x = np.asarray(kv).astype(np.float32)
    b, _, s, _ = x.shape
    rms_in, rope_in = x[..., :RMS], x[..., RMS:]
    y = rms_norm(rms_in, np.asarray(gamma).astype(np.float32), epsilon, "kv_cache")  # the kernel's sum order
    k = rope_in.reshape(b, 1, s, ROPE // 2, 2).swapaxes(-1, -2).reshape(b, 1, s, ROPE)  # de-interleave
    rotated = np.concatenate([-k[..., ROPE // 2:], k[..., :ROPE // 2]], axis=-1)
    k_embed = k * np.asarray(cos).astype(np.float32) + rotated * np.asarray(sin).astype(np.float32)
    return k_embed.astype(np.float32), y.astype(np.float32)


def quantize_int8(x, scale):
    """``clip(rint(x * scale), -128, 127)`` as int8; ``scale`` broadcast over the last axis."""
    prod = x * np.asarray(scale, dtype=np.float32).reshape(-1)
    return np.clip(np.rint(prod), -128, 127).astype(np.int8), prod.astype(np.float32)


def token_slots(index, cache_mode, batch, seq_len, block_size, cache_length):
    """Destination slot of every token (batch-major), -1 when skipped."""
    index = np.asarray(index)
    slots = np.full(batch * seq_len, -1, dtype=np.int64)
    for b in range(batch):
        for p in range(seq_len):
            t = b * seq_len + p
            if cache_mode == "Norm":
                pos = int(index[b, p])
                slots[t] = b * cache_length + pos if pos >= 0 else -1
            elif cache_mode in TOKEN_INDEX_MODES:
                slots[t] = int(index[t])
            elif cache_mode in PAGE_INDEX_MODES:
                pages_per_batch = -(-seq_len // block_size)
                page_start = int(index[b * pages_per_batch + p // block_size])
                slots[t] = (page_start // block_size) * block_size + p % block_size if page_start >= 0 else -1
            else:
                raise ValueError(cache_mode)
    return slots


def row_element_offsets(slot, dim, cache_mode, block_size, itemsize):
    """Flat element offsets of the ``dim`` elements of row ``slot``."""
    d = np.arange(dim)
    if cache_mode in NZ_MODES:
        c0 = 32 // itemsize
        blk, r = divmod(int(slot), block_size)
        return blk * block_size * dim + (d // c0) * block_size * c0 + r * c0 + d % c0
    return int(slot) * dim + d


def scatter(cache, rows, slots, cache_mode, block_size):
    """Copy of ``cache`` with ``rows[t]`` written at ``slots[t]`` (in token order: the last wins)."""
    out = np.array(cache, copy=True)
    flat = out.reshape(-1)
    dim = rows.shape[-1]
    for t, slot in enumerate(slots):
        if slot >= 0:
            flat[row_element_offsets(slot, dim, cache_mode, block_size, out.dtype.itemsize)] = rows[t]
    return out


def cache_geometry(cache, cache_mode):
    """``(block_size, cache_length)`` of a declared cache shape."""
    if cache_mode == "Norm":
        return None, cache.shape[2]  # [B, 1, cache_length, D]
    return cache.shape[1], None  # [block_num, block_size, 1, D]


def kv_rmsnorm_rope_cache_ref(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                              c_kv_scale=None, epsilon=1e-5, cache_mode="Norm") -> RefResult:
    """Expected caches and outputs. The inputs are not modified."""
    kv_dtype = np.asarray(kv).dtype
    b, _, s, _ = kv.shape
    k_embed, y = rmsnorm_rope_f32(kv, gamma, cos, sin, epsilon)
    k_embed_out, y_out = k_embed.astype(kv_dtype), y.astype(kv_dtype)
    k_scaled = y_scaled = None
    if k_rope_scale is not None:
        k_rows, k_scaled = quantize_int8(k_embed.reshape(-1, ROPE), k_rope_scale)
        y_rows, y_scaled = quantize_int8(y.reshape(-1, RMS), c_kv_scale)
    else:
        k_rows, y_rows = k_embed_out.reshape(-1, ROPE), y_out.reshape(-1, RMS)
    block_size, cache_length = cache_geometry(k_cache, cache_mode)
    slots = token_slots(index, cache_mode, b, s, block_size, cache_length)
    return RefResult(
        k_cache=scatter(k_cache, k_rows, slots, cache_mode, block_size),
        ckv_cache=scatter(ckv_cache, y_rows, slots, cache_mode, block_size),
        k_embed_out=k_embed_out, y_out=y_out, k_rows=k_rows, y_rows=y_rows,
        k_scaled=k_scaled, y_scaled=y_scaled, slots=slots)
