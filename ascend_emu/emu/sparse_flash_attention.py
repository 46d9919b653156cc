"""emu backend of ``npu_sparse_flash_attention`` and ``npu_kv_quant_sparse_flash_attention``: one
fused Numba kernel family for both.

Per work unit (query token ``t``, kv head ``h``, a chunk of its ``G`` query heads), in one pass
and in per-unit scratch only (nothing is gathered for the whole batch):

1. gather the unit's kept kv rows (the contract's ``starts`` / ``counts``) into ``k [L, 576]``
   (and ``v [L, 512]`` when the values are a separate tensor): KV-quant rows are dequantized
   (``fp32(int8) * scale`` of the tile, one fp32 multiply, RNE to the query dtype) and their rope
   bytes read in the query dtype; bf16 / fp16 caches are widened exactly;
2. ``S = q . K`` as fp32 products summed in element order (mul then add, no FMA), times
   ``scale_value``; per head ``m = max S``, ``e = fp32(exp_f64(S - m))``, ``l = sum e`` in
   selection order, ``P = qdt(e / l)``;
3. ``O = P . V`` with the same fp32 order over the selected tokens, rounded RNE to the query
   dtype.

Every output element is computed by one fixed sequence of fp32 operations whatever the unit
split or the thread count, so results are identical for any number of Numba threads. The
matmuls run as register-blocked loops (12 rows x 32 columns) that LLVM vectorizes; their sums
are the same as the scalar loops'.

Source: ops_reference §5.2 (numerics), the op contract :mod:`ascend_emu.ops.sparse_flash_attention`
(selection, empty rows).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ..mla import D_QK, D_ROPE, HCKV, TILE_SIZE
from ..ops.sparse_flash_attention import (EMPTY_ROW_OUTPUT, EMPTY_ROW_SOFTMAX_MAX, EMPTY_ROW_SOFTMAX_SUM,
                                          SparseFlashAttentionArgs)
from ..quant import NUM_TILES, ROPE_OFFSET, SCALE_OFFSET
from ..quant.rounding import bf16_bits_to_f32, f16_bits_to_f32, f32_bits_to_bf16_bits, f32_bits_to_f16_bits

#: Register block of the matmul loops: rows (kv tokens or heads) x columns.
_MB = 12
_NB = 32
#: uint16 word of the first rope element / fp32 word of the first scale in a 656-byte row.
_ROPE_WORD = ROPE_OFFSET // 2
_SCALE_WORD = SCALE_OFFSET // 4
#: Head chunks are split while there are fewer units than this many per thread.
_UNITS_PER_THREAD = 2
#: Smallest head chunk a unit is split to.
_MIN_CHUNK = 32


@njit(cache=True, inline="always")
def _widen(bits, is_bf16):
    """fp32 value of bf16 / fp16 bits (exact)."""
    if is_bf16:
        return bf16_bits_to_f32(bits)
    return f16_bits_to_f32(bits)


@njit(cache=True, inline="always")
def _narrow(x, is_bf16):
    """bf16 / fp16 bits of fp32 ``x``, RNE."""
    u = np.float32(x).view(np.uint32)
    if is_bf16:
        return f32_bits_to_bf16_bits(u)
    return f32_bits_to_f16_bits(u)


@njit(cache=True, inline="always")
def _matmul(a, b, c):
    """``c[m, n] = sum_k a[m, k] * b[k, n]`` for ``n < c.shape[1]``: fp32 products, added in
    ascending ``k`` (no FMA). Blocks of 12 x 32 outputs stay in registers; leftover rows and
    columns take the same sums one at a time.

    Args:
        a: fp32 ``[M, K]``.
        b: fp32 ``[K, >= N]``.
        c: out, fp32 ``[M, N]``.
    """
    m_size, k_size = a.shape
    n_size = c.shape[1]
    n_main = n_size - n_size % _NB
    m_main = m_size - m_size % _MB
    acc = np.zeros((_MB, _NB), dtype=np.float32)  # [12, 32]
    row = np.empty(_NB, dtype=np.float32)  # [32]
    for m0 in range(0, m_main, _MB):
        for n0 in range(0, n_main, _NB):
            acc[:] = 0
            for k in range(k_size):
                bk = b[k, n0:n0 + _NB]
                a0 = a[m0, k]
                a1 = a[m0 + 1, k]
                a2 = a[m0 + 2, k]
                a3 = a[m0 + 3, k]
                a4 = a[m0 + 4, k]
                a5 = a[m0 + 5, k]
                a6 = a[m0 + 6, k]
                a7 = a[m0 + 7, k]
                a8 = a[m0 + 8, k]
                a9 = a[m0 + 9, k]
                a10 = a[m0 + 10, k]
                a11 = a[m0 + 11, k]
                for j in range(_NB):
                    x = bk[j]
                    acc[0, j] += a0 * x
                    acc[1, j] += a1 * x
                    acc[2, j] += a2 * x
                    acc[3, j] += a3 * x
                    acc[4, j] += a4 * x
                    acc[5, j] += a5 * x
                    acc[6, j] += a6 * x
                    acc[7, j] += a7 * x
                    acc[8, j] += a8 * x
                    acc[9, j] += a9 * x
                    acc[10, j] += a10 * x
                    acc[11, j] += a11 * x
            c[m0:m0 + _MB, n0:n0 + _NB] = acc
    for m in range(m_main, m_size):  # leftover rows, 32 columns at a time
        for n0 in range(0, n_main, _NB):
            row[:] = 0.0
            for k in range(k_size):
                am = a[m, k]
                bk = b[k, n0:n0 + _NB]
                for j in range(_NB):
                    row[j] += am * bk[j]
            c[m, n0:n0 + _NB] = row
    for m in range(m_size):  # leftover columns
        for n in range(n_main, n_size):
            s = np.float32(0.0)
            for k in range(k_size):
                s += a[m, k] * b[k, n]
            c[m, n] = s


@njit(cache=True, inline="always")
def _dequant_row(nope, scales, is_bf16, out):
    """``out[d] = qdt(fp32(nope[d]) * scales[d // 128])`` widened back to fp32. The dtype test sits
    outside the element loops so that each loop is branch-free and vectorizes."""
    for tile in range(NUM_TILES):
        sc = scales[tile]
        base = tile * TILE_SIZE
        if is_bf16:
            for j in range(TILE_SIZE):
                x = np.float32(np.float32(nope[base + j]) * sc)
                out[base + j] = bf16_bits_to_f32(f32_bits_to_bf16_bits(x.view(np.uint32)))
        else:
            for j in range(TILE_SIZE):
                x = np.float32(np.float32(nope[base + j]) * sc)
                out[base + j] = f16_bits_to_f32(f32_bits_to_f16_bits(x.view(np.uint32)))


@njit(cache=True, inline="always")
def _widen_row(bits, is_bf16, out):
    """``out[i]`` = fp32 value of the bf16 / fp16 bits ``bits[i]`` (exact)."""
    if is_bf16:
        for i in range(out.shape[0]):
            out[i] = bf16_bits_to_f32(bits[i])
    else:
        for i in range(out.shape[0]):
            out[i] = f16_bits_to_f32(bits[i])


@njit(cache=True, inline="always")
def _gather(t, h, starts, counts, quant, rows_i8, rows_u16, rows_f32, key, key_rope, value, v_from_key,
            is_bf16, k, v):
    """Fill ``k [L, 576]`` with unit ``(t, h)``'s kept keys (query-dtype values as fp32) and, unless
    V is the keys' k_nope, ``v [L, 512]`` with its values."""
    pos = 0
    for e in range(starts.shape[2]):
        for i in range(counts[t, h, e]):
            r = starts[t, h, e] + i
            if quant:
                _dequant_row(rows_i8[r, :HCKV], rows_f32[r, _SCALE_WORD:_SCALE_WORD + NUM_TILES], is_bf16,
                             k[pos, :HCKV])
                _widen_row(rows_u16[r, _ROPE_WORD:_ROPE_WORD + D_ROPE], is_bf16, k[pos, HCKV:])
            else:
                _widen_row(key[r], is_bf16, k[pos, :HCKV])
                _widen_row(key_rope[r], is_bf16, k[pos, HCKV:])
                if not v_from_key:
                    _widen_row(value[r], is_bf16, v[pos])
            pos += 1


@njit(cache=True, inline="always")
def _attend_unit(t, h, g0, hc, group, query, starts, counts, lengths, quant, rows_i8, rows_u16, rows_f32, key,
                 key_rope, value, v_from_key, scale, is_bf16, out, smax, ssum):
    """One work unit: query token ``t``, kv head ``h``, heads ``g0 .. g0+hc-1`` of its group."""
    length = lengths[t, h]
    head0 = h * group + g0
    if length == 0:
        for g in range(hc):
            for d in range(HCKV):
                out[t, head0 + g, d] = _narrow(np.float32(EMPTY_ROW_OUTPUT), is_bf16)
            smax[t, h, g0 + g] = EMPTY_ROW_SOFTMAX_MAX
            ssum[t, h, g0 + g] = EMPTY_ROW_SOFTMAX_SUM
        return
    rows = -(-length // _MB) * _MB  # kv rows padded to whole 12-row blocks (zero rows, discarded)
    k = np.empty((rows, D_QK), dtype=np.float32)  # [L', 576]
    k[length:] = 0.0
    v = np.empty((0 if v_from_key else length, HCKV), dtype=np.float32)  # [L, 512] separate values
    _gather(t, h, starts, counts, quant, rows_i8, rows_u16, rows_f32, key, key_rope, value, v_from_key, is_bf16, k, v)
    width = -(-hc // _NB) * _NB  # heads padded to whole 32-column blocks (zero columns, discarded)
    qt = np.zeros((D_QK, width), dtype=np.float32)  # [576, hc'] query, transposed
    row = np.empty(D_QK, dtype=np.float32)  # [576]
    for g in range(hc):
        _widen_row(query[t, head0 + g], is_bf16, row)
        qt[:, g] = row
    st = np.empty((rows, width), dtype=np.float32)  # [L', hc'] scores, transposed
    _matmul(k, qt, st)
    heads = -(-hc // _MB) * _MB  # heads padded to whole 12-row blocks (zero rows, discarded)
    p = np.zeros((heads, length), dtype=np.float32)  # [hc', L] probabilities
    for g in range(hc):
        m = np.float32(-np.inf)
        for i in range(length):
            x = st[i, g] * scale
            p[g, i] = x
            if x > m:
                m = x
        total = np.float32(0.0)
        for i in range(length):
            e = np.float32(np.exp(np.float64(p[g, i] - m)))
            p[g, i] = e
            total += e
        for i in range(length):
            p[g, i] = _widen(_narrow(p[g, i] / total, is_bf16), is_bf16)
        smax[t, h, g0 + g] = m
        ssum[t, h, g0 + g] = total
    o = np.empty((heads, HCKV), dtype=np.float32)  # [hc', 512]
    _matmul(p, k if v_from_key else v, o)
    for g in range(hc):
        for d in range(HCKV):
            out[t, head0 + g, d] = _narrow(o[g, d], is_bf16)


@njit(cache=True, parallel=True)
def _attend(chunk, query, starts, counts, lengths, quant, rows_i8, rows_u16, rows_f32, key, key_rope, value,
            v_from_key, scale, is_bf16, out, smax, ssum):
    """Every unit (token, kv head, head chunk of ``chunk`` heads) in parallel; units are independent."""
    t_size, n2 = lengths.shape
    group = smax.shape[2]
    chunks = group // chunk
    for u in prange(t_size * n2 * chunks):
        t = u // (n2 * chunks)
        h = (u // chunks) % n2
        c = u % chunks
        _attend_unit(t, h, c * chunk, chunk, group, query, starts, counts, lengths, quant, rows_i8, rows_u16,
                     rows_f32, key, key_rope, value, v_from_key, scale, is_bf16, out, smax, ssum)


def head_chunk(items: int, group: int, threads: int) -> int:
    """Heads per work unit: the whole group, halved (down to 32, staying a divisor of the group)
    while there are fewer than two units per thread. Numerics do not depend on it."""
    chunk = group
    while items * (group // chunk) < _UNITS_PER_THREAD * threads and chunk % 2 == 0 and chunk // 2 >= _MIN_CHUNK:
        chunk //= 2
    return chunk


def sparse_flash_attention(args: SparseFlashAttentionArgs):
    """emu implementation of both sparse attention ops (:mod:`ascend_emu.ops.sparse_flash_attention`).

    Args:
        args: validated arguments (every kept row in range).

    Returns:
        ``(attention_out, softmax_max, softmax_sum)``: attention_out in the query dtype,
        ``args.out_shape``; softmax_max / softmax_sum fp32 ``[B, N2, S1, G]`` (BSND) or
        ``[N2, T, G]`` (TND) when ``args.return_softmax_lse``, else fp32 ``[0]``.
    """
    t_size, n1 = args.query.shape[:2]
    n2, group = args.num_kv_heads, args.group
    out = np.empty((t_size, n1, HCKV), dtype=np.uint16)  # [T, N1, 512] query-dtype bits
    smax = np.empty((t_size, n2, group), dtype=np.float32)  # [T, N2, G]
    ssum = np.empty((t_size, n2, group), dtype=np.float32)  # [T, N2, G]
    chunk = head_chunk(t_size * n2, group, numba.get_num_threads())
    _attend(chunk, args.query, args.starts, args.counts, args.lengths, args.quant, args.rows_i8, args.rows_u16,
            args.rows_f32, args.key, args.key_rope, args.value, args.v_from_key, args.scale_value, args.is_bf16,
            out, smax, ssum)
    attention_out = out.view(args.query_dtype).reshape(args.out_shape)
    if not args.return_softmax_lse:
        empty = np.empty(0, dtype=np.float32)  # [0]
        return attention_out, empty, empty.copy()
    if args.layout_query == "BSND":
        shape = (args.batch, args.seq_q, n2, group)
        lse = [np.ascontiguousarray(x.reshape(shape).transpose(0, 2, 1, 3)) for x in (smax, ssum)]  # [B, N2, S1, G]
    else:
        lse = [np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (smax, ssum)]  # [N2, T, G]
    return attention_out, lse[0], lse[1]
