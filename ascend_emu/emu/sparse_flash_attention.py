"""emu backend of ``npu_sparse_flash_attention`` and ``npu_kv_quant_sparse_flash_attention``: one
kernel family for both.

Work units are (query token ``t``, kv head ``h``) pairs with kept kv rows; they are taken in
order, in passes of at most :data:`PASS_ROWS` gathered rows and :data:`PASS_UNITS` units (a unit
with more rows is a pass of its own), so memory stays bounded whatever the batch. Per pass:

1. gather (Numba, parallel over rows): each kept kv row, in selection order, becomes one row of
   a reused fp32 buffer ``kv [rows, 576 (+512)]``: KV-quant rows dequantized
   (``fp32(elem) * scale`` of the tile, one fp32 multiply, RNE to the query dtype; an int8 element
   converted, a HiF8 / FP8 one looked up in its 256-entry fp32 table, exact either way) with their
   rope bytes read in the query dtype; bf16 / fp16 key / key_rope (and a separate value, in
   columns 576..1087) widened exactly. V is a view: the key's k_nope (columns 0..511) or the
   value columns;
2. the pass's query heads widened exactly to fp32; per unit ``S^T = K [L, 576] @ q^T [576, G]``
   by fp32 BLAS (:func:`~ascend_emu.emu.matmul.matmul_f32`), into a ``[rows, G]`` score buffer;
3. softmax (Numba, across the G heads of each row, so it vectorizes; parallel over units for the
   per-head max and sum, over rows for the element-wise steps): ``S * scale_value`` in fp32,
   ``m = max``, ``e = fp32(exp(S - m))`` with ``exp`` evaluated in float64 (:func:`_exp_f64`),
   ``l = sum e`` in selection order, ``P = qdt(e / l)``; with sinks the head's sink joins ``m``
   and starts ``l`` as ``fp32(exp(sink - m))``;
4. per unit ``O = P [G, L] @ V [L, 512]`` by fp32 BLAS (``P`` the transposed view of the score
   buffer), then one RNE rounding of ``O`` to the query dtype per pass.

The matmuls' summation order is BLAS's (docs/numerics.md#accumulation: inputs widened exactly to
fp32, fp32 accumulation, one rounding where the kernel rounds). With a bf16 query every operand of
both products holds bf16 values (dequantized rows and ``P`` are rounded to the query dtype), so
they go through the fp32-output bf16 engine :func:`~ascend_emu.emu.matmul.matmul_bf16_f32`
(oneDNN's bf16 dot products with fp32 accumulation where its fixed per-host rule allows it, with
the operands' exponent spans read once per pass; else sgemm): the same exact products summed in
fp32 in another order; ``P @ V`` multiplies ``P`` scaled by ``2**P_SHIFT`` so that its values down
to bf16's subnormal range stay on the engine (:data:`P_SHIFT`). Measured at the op-plugin
golden's decode shape 1.5x faster for the whole op on one thread (docs/performance.md). BLAS is never called inside a
Numba parallel region; parallelism comes from BLAS's threads and from ``prange`` in the gather,
the softmax and the rounding. Each unit's matmul shapes depend only on its data, and the Numba
parts compute every element in a fixed order, so results do not depend on the Numba thread count.
They may depend on the BLAS thread count: OpenBLAS orders sgemm sums differently on 1 thread and
on several (last-bit differences).

Source: docs/sources.md#npu_kv_quant_sparse_flash_attention (numerics), the op contract :mod:`ascend_emu.ops.sparse_flash_attention`
(selection, empty rows).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba import get_num_threads, njit, prange

from ..mla import D_QK, D_ROPE, HCKV, TILE_SIZE
from ..ops.sparse_flash_attention import (EMPTY_ROW_OUTPUT, EMPTY_ROW_SOFTMAX_MAX, EMPTY_ROW_SOFTMAX_SUM,
                                          SparseFlashAttentionArgs, SparseFlashAttentionOutputs)
from ..quant import BF16, MLA_ROW, NUM_TILES, ROPE_OFFSET, SCALE_OFFSET
from ..quant.combined import NOPE_BYTE_VALUES
from ..quant.rounding import bf16_bits_to_f32, f16_bits_to_f32, f32_bits_to_bf16_bits, f32_bits_to_f16_bits
from .kernels import bits16, kernel_input, narrow_row, parallel_parts, widen_row
from .matmul import bf16_engine_may_run, matmul_bf16_f32, matmul_f32, span

#: uint16 word of the first rope element / fp32 word of the first scale in a 656-byte row.
_ROPE_WORD = ROPE_OFFSET // 2
_SCALE_WORD = SCALE_OFFSET // 4
#: Gathered kv rows per pass (the fp32 buffer: 2048 x 576 x 4 B = 4.5 MiB, 8.5 MiB with a separate
#: value, so it stays in cache between the gather and the matmuls: at b=4 top-2048 the op takes
#: 1.10x the floor's CPU time against 1.17x with 16384-row passes); a unit with more rows makes a
#: pass of its own.
PASS_ROWS = 2048
#: Units per pass at most (bounds the pass's widened query and fp32 output: 64 units of 128
#: heads are 19 MiB + 17 MiB).
PASS_UNITS = 64
#: Elements per parallel task of the output rounding.
_ROUND_CHUNK = 1 << 14
#: exp constants: clamp range, log2(e), ln2 split so that ``k * _LN2_HI`` is exact (fdlibm's
#: ``ln2_hi`` / ``ln2_lo``), 1.5 * 2**52 (adding and subtracting it rounds to an integer), 1 / i!.
_EXP_LO, _EXP_HI = -160.0, 100.0
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_ROUND_MAGIC = 6755399441055744.0
_EXP_TAYLOR = np.array([1.0 / math.factorial(i) for i in range(14)])


@functools.lru_cache(maxsize=None)
def _element_table(element: str) -> np.ndarray:
    """fp32 ``[256]`` value of each k_nope byte read as int8 ``b``, at index ``b + 128``
    (:data:`~ascend_emu.quant.combined.NOPE_BYTE_VALUES` re-indexed); size 0 for int8, whose
    elements the kernel converts directly."""
    if element == "int8":
        return np.zeros(0, np.float32)
    return np.ascontiguousarray(NOPE_BYTE_VALUES[element][(np.arange(256) - 128) & 0xFF])


@njit(cache=True, inline="always")
def _dequant_row(nope, scales, is_bf16, table, out):
    """``out[d] = qdt(fp32(elem(nope[d])) * scales[d // 128])`` widened back to fp32; ``elem``:
    the int8 itself (``table`` empty) or ``table[nope[d] + 128]`` (HiF8 / FP8). The dtype tests
    sit outside the element loops so that each loop is branch-free."""
    for tile in range(NUM_TILES):
        sc = scales[tile]
        base = tile * TILE_SIZE
        if table.size:
            for j in range(TILE_SIZE):
                x = np.float32(table[np.int32(nope[base + j]) + 128] * sc)
                if is_bf16:
                    out[base + j] = bf16_bits_to_f32(f32_bits_to_bf16_bits(x.view(np.uint32)))
                else:
                    out[base + j] = f16_bits_to_f32(f32_bits_to_f16_bits(x.view(np.uint32)))
        elif is_bf16:
            for j in range(TILE_SIZE):
                x = np.float32(np.float32(nope[base + j]) * sc)
                out[base + j] = bf16_bits_to_f32(f32_bits_to_bf16_bits(x.view(np.uint32)))
        else:
            for j in range(TILE_SIZE):
                x = np.float32(np.float32(nope[base + j]) * sc)
                out[base + j] = f16_bits_to_f32(f32_bits_to_f16_bits(x.view(np.uint32)))


@njit(cache=True, inline="always")
def _gather_row(i, src, quant, rows_i8, rows_u16, rows_f32, table, key, key_rope, value, v_from_key, is_bf16, kv):
    r = src[i]
    if quant:
        _dequant_row(rows_i8[r, :HCKV], rows_f32[r, _SCALE_WORD:_SCALE_WORD + NUM_TILES], is_bf16, table,
                     kv[i, :HCKV])
        widen_row(rows_u16[r, _ROPE_WORD:_ROPE_WORD + D_ROPE], kv[i, HCKV:D_QK], is_bf16)
    else:
        widen_row(key[r], kv[i, :HCKV], is_bf16)
        widen_row(key_rope[r], kv[i, HCKV:D_QK], is_bf16)
        if not v_from_key:
            widen_row(value[r], kv[i, D_QK:D_QK + HCKV], is_bf16)


@njit(cache=True)
def _gather_rows(lo, hi, src, quant, rows_i8, rows_u16, rows_f32, table, key, key_rope, value, v_from_key, is_bf16,
                 kv):
    """:func:`_gather` of rows ``lo <= i < hi``."""
    for i in range(lo, hi):
        _gather_row(i, src, quant, rows_i8, rows_u16, rows_f32, table, key, key_rope, value, v_from_key, is_bf16,
                    kv)


@njit(cache=True, parallel=True)
def _gather(parts, src, quant, rows_i8, rows_u16, rows_f32, table, key, key_rope, value, v_from_key, is_bf16, kv):
    """``kv[i, :576]`` = key row ``src[i]`` as query-dtype values in fp32 (KV-quant: dequantized
    k_nope and rope; else key and key_rope widened); unless V is the key's k_nope,
    ``kv[i, 576:1088]`` = value row ``src[i]`` widened. In ``parts`` contiguous ranges of rows run
    in parallel, each by :func:`_gather_rows` (a compiled call: a loop body inlined into a parallel
    loop is compiled twice, seconds more on a cold cache).

    Args:
        parts: ranges (one per thread).
        src: int64 ``[n]`` key rows (in range: the contract checked them).
        table: fp32 ``[256]`` k_nope element values (:func:`_element_table`), empty for int8.
        kv: out, fp32 ``[>= n, 576]`` or ``[>= n, 1088]``.
    """
    n = src.shape[0]
    for p in prange(parts):
        _gather_rows(p * n // parts, (p + 1) * n // parts, src, quant, rows_i8, rows_u16, rows_f32, table, key,
                     key_rope, value, v_from_key, is_bf16, kv)


@njit(cache=True)
def _gather_serial(parts, src, quant, rows_i8, rows_u16, rows_f32, table, key, key_rope, value, v_from_key, is_bf16,
                   kv):
    """:func:`_gather` on the calling thread (``parts`` ignored)."""
    _gather_rows(0, src.shape[0], src, quant, rows_i8, rows_u16, rows_f32, table, key, key_rope, value, v_from_key,
                 is_bf16, kv)


@njit(cache=True, inline="always")
def _exp_f64(x):
    """``exp(x)`` evaluated in float64 (for fp32 ``x``), within a few float64 ulps: ``x = k ln2 + r``
    (Cody-Waite, ``|r| <= ln2 / 2``), ``exp(r)`` by its Taylor polynomial to degree 13 (truncation
    below 1e-17), times ``2**k`` built from its bits. Branch-free, so loops over it vectorize (a
    libm call per element does not). Arguments are clamped to [-160, 100] (their exp is 0 / inf
    in fp32 beyond); NaN passes through.
    """
    xd = np.float64(x)
    xc = min(max(xd, _EXP_LO), _EXP_HI)
    kf = (xc * _LOG2E + _ROUND_MAGIC) - _ROUND_MAGIC  # nearest integer (ties to even)
    r = (xc - kf * _LN2_HI) - kf * _LN2_LO  # kf * _LN2_HI is exact
    p = _EXP_TAYLOR[13]
    for i in range(12, -1, -1):
        p = p * r + _EXP_TAYLOR[i]
    two_k = np.int64((np.int64(kf) + 1023) << 52).view(np.float64)
    y = p * two_k
    return y if xd == xd else xd


@njit(cache=True, inline="always")
def _scale_max(scores, off, length, scale, sinks, m, g0, g1):
    """Softmax step 1 for one unit's rows and heads ``g0:g1``: ``S * scale`` in place, ``m`` =
    per-head max (of the head's sink too, when ``sinks`` is not empty). Every loop runs over a
    slice from 0 (with a run-time start the loops do not vectorize: 4x slower)."""
    mg = m[g0:g1]
    mg[:] = -np.inf
    for i in range(off, off + length):
        row = scores[i, g0:g1]
        for g in range(row.shape[0]):
            x = row[g] * scale
            row[g] = x
            mg[g] = x if x > mg[g] else mg[g]
    if sinks.size:
        sg = sinks[g0:g1]
        for g in range(sg.shape[0]):
            mg[g] = sg[g] if sg[g] > mg[g] else mg[g]


@njit(cache=True, inline="always")
def _exp_row(scores, i, m, g0, g1):
    """Softmax step 2 for one row's heads ``g0:g1``: ``fp32(exp(S - m))`` in place."""
    row, mg = scores[i, g0:g1], m[g0:g1]
    for g in range(row.shape[0]):
        row[g] = np.float32(_exp_f64(row[g] - mg[g]))


@njit(cache=True, inline="always")
def _sum_unit(scores, off, length, sinks, m, total, g0, g1):
    """Softmax step 3 for one unit's rows and heads ``g0:g1``: ``total`` = per-head sum, in row
    order, after the sink's ``fp32(exp(sink - m))`` when ``sinks`` is not empty."""
    tg = total[g0:g1]
    tg[:] = 0.0
    if sinks.size:
        sg, mg = sinks[g0:g1], m[g0:g1]
        for g in range(tg.shape[0]):
            tg[g] = np.float32(_exp_f64(sg[g] - mg[g]))
    for i in range(off, off + length):
        row = scores[i, g0:g1]
        for g in range(row.shape[0]):
            tg[g] += row[g]


@njit(cache=True, inline="always")
def _normalise_row(scores, i, total, is_bf16, g0, g1):
    """Softmax step 4 for one row's heads ``g0:g1``: ``qdt(e / l)`` (RNE) as fp32, in place."""
    row, tg = scores[i, g0:g1], total[g0:g1]
    if is_bf16:
        for g in range(row.shape[0]):
            x = np.float32(row[g] / tg[g])
            row[g] = bf16_bits_to_f32(f32_bits_to_bf16_bits(x.view(np.uint32)))
    else:
        for g in range(row.shape[0]):
            x = np.float32(row[g] / tg[g])
            row[g] = f16_bits_to_f32(f32_bits_to_f16_bits(x.view(np.uint32)))


@njit(cache=True, error_model="numpy")
def _softmax_unit(scores, off, length, scale, sinks, is_bf16, m, total, g0, g1):
    """Steps 1-4 for one unit's rows ``off:off + length`` and heads ``g0:g1`` (every step of a
    head reads only that head's column). A compiled call, not inlined into the parallel loop."""
    _scale_max(scores, off, length, scale, sinks, m, g0, g1)
    for i in range(off, off + length):
        _exp_row(scores, i, m, g0, g1)
    _sum_unit(scores, off, length, sinks, m, total, g0, g1)
    for i in range(off, off + length):
        _normalise_row(scores, i, total, is_bf16, g0, g1)


@njit(cache=True, parallel=True)
def _softmax(scores, offsets, lengths, scale, sinks, is_bf16, smax, ssum, cols):
    """In place: transposed scores ``S^T`` -> ``P^T`` (query-dtype values as fp32), per head.

    Every inner loop runs across heads of one kv row (contiguous, so it vectorizes). The units,
    each cut into ``cols`` contiguous ranges of heads, run in parallel, all four steps of a range
    in one go (one parallel launch per call; a decode's one unit still splits; each head's max and
    sum run over its rows in order, so the split does not change a bit).

    Args:
        scores: fp32 ``[rows, G]``: unit ``u``'s ``[L_u, G]`` scores are rows ``offsets[u]`` on.
        offsets: int64 ``[U]`` first row of each unit; lengths: int64 ``[U]`` its rows.
        scale: fp32 scale_value.
        sinks: fp32 ``[G]`` attention sinks of the G heads (N2 = 1), or empty.
        smax, ssum: out, fp32 ``[U, G]``: ``m`` and ``l`` per head.
        cols: head ranges per unit (:func:`_head_cols`).
    """
    group = scores.shape[1]
    for j in prange(lengths.shape[0] * cols):
        u, c = j // cols, j % cols
        _softmax_unit(scores, offsets[u], lengths[u], scale, sinks, is_bf16, smax[u], ssum[u], group * c // cols,
                      group * (c + 1) // cols)


@njit(cache=True)
def _softmax_serial(scores, offsets, lengths, scale, sinks, is_bf16, smax, ssum, cols):
    """:func:`_softmax` on the calling thread, unit after unit (``cols`` is not needed)."""
    for u in range(lengths.shape[0]):
        _softmax_unit(scores, offsets[u], lengths[u], scale, sinks, is_bf16, smax[u], ssum[u], 0, scores.shape[1])


@njit(cache=True, parallel=True)
def _widen_query(query, units, is_bf16, q):
    """``q[i] = query[units[i]]`` widened exactly to fp32; query uint16 ``[T*N2, G, 576]`` bits,
    q fp32 ``[U', G, 576]``."""
    group = query.shape[1]
    for j in prange(units.shape[0] * group):
        widen_row(query[units[j // group], j % group], q[j // group, j % group], is_bf16)


@njit(cache=True)
def _widen_query_serial(query, units, is_bf16, q):
    """:func:`_widen_query` on the calling thread."""
    group = query.shape[1]
    for j in range(units.shape[0] * group):
        widen_row(query[units[j // group], j % group], q[j // group, j % group], is_bf16)


@njit(cache=True, parallel=True)
def _round_out(o, is_bf16, out):
    """``out = qdt(o)`` bits, RNE; o fp32 ``[n]``, out uint16 ``[n]``, in parallel chunks."""
    chunks = -(-o.shape[0] // _ROUND_CHUNK)
    for c in prange(chunks):
        lo = c * _ROUND_CHUNK
        hi = min(lo + _ROUND_CHUNK, o.shape[0])
        narrow_row(o[lo:hi], out[lo:hi], is_bf16)


@njit(cache=True)
def _round_out_serial(o, is_bf16, out):
    """:func:`_round_out` on the calling thread."""
    narrow_row(o, out, is_bf16)


@njit(cache=True)
def _pass_rows(starts, counts, units, src, offsets):
    """The gathered rows of one pass: for unit ``units[u]`` (in order) and its entries (in
    order), ``counts`` consecutive key rows from ``starts`` -> ``src``; ``offsets[u]`` its first
    gathered row."""
    r = 0
    for u in range(units.shape[0]):
        offsets[u] = r
        for j in range(starts.shape[1]):
            for i in range(counts[units[u], j]):
                src[r] = starts[units[u], j] + i
                r += 1


def _passes(lengths: np.ndarray, total: int) -> list[tuple[int, int]]:
    """Consecutive unit ranges ``[u0, u1)`` of at most :data:`PASS_ROWS` rows and
    :data:`PASS_UNITS` units (a unit with more rows makes a pass of its own); ``total`` =
    ``lengths.sum()``."""
    if total <= PASS_ROWS and lengths.size <= PASS_UNITS:
        return [(0, lengths.size)]  # one pass (decode)
    ends = np.cumsum(lengths)
    passes, u0, done = [], 0, 0
    while u0 < lengths.size:
        u1 = max(int(np.searchsorted(ends, done + PASS_ROWS, side="right")), u0 + 1)
        u1 = min(u1, u0 + PASS_UNITS)
        passes.append((u0, u1))
        done, u0 = int(ends[u1 - 1]), u1
    return passes


class _Operands(NamedTuple):
    """The kernels' view of the arguments: uint16 bits for bf16 / fp16, the cache as 2-D rows."""

    query: np.ndarray  # uint16 [T, N1, 576]: query (and query_rope) bits, C-contiguous
    rows_i8: np.ndarray  # quant: int8 [R, 656] key rows, any element type's bytes (else [0, 656])
    rows_u16: np.ndarray  # quant: uint16 [R, 328] view of the same bytes (rope at words 256..319)
    rows_f32: np.ndarray  # quant: fp32 [R, 164] view of the same bytes (scales at words 160..163)
    key: np.ndarray  # non-quant: uint16 [R, 512] key bits (else [0, 512])
    key_rope: np.ndarray  # non-quant: uint16 [R, 64] (else [0, 64])
    value: np.ndarray  # non-quant with a separate value: uint16 [R, 512] (else [0, 512])


#: Placeholders for the operands a call does not use (size 0; never written).
_ROW_BYTES = MLA_ROW.row_bytes
_NO_I8, _NO_U16, _NO_F32 = (np.zeros((0, _ROW_BYTES // k), d) for k, d in ((1, np.int8), (2, np.uint16),
                                                                            (4, np.float32)))
_NO_KEY, _NO_ROPE = np.zeros((0, HCKV), np.uint16), np.zeros((0, D_ROPE), np.uint16)
_NO_SINKS = np.zeros(0, np.float32)


def _operands(args: SparseFlashAttentionArgs) -> _Operands:
    """The caller's arrays (``args``) as the kernels read them (R = key slots * N2 rows), each
    made a plain C-contiguous writable array by :func:`~ascend_emu.emu.kernels.kernel_input` (a
    read-only or strided key would otherwise compile new kernel specialisations)."""
    t, n1 = args.query.size // (args.num_heads * args.query.shape[-1]), args.num_heads
    r = args.num_key_slots * args.num_kv_heads
    q_bits = bits16(args.query).reshape(t, n1, -1)  # [T, N1, 512|576]
    if args.quant:
        rows = kernel_input(args.key.view(np.int8)).reshape(r, _ROW_BYTES)  # [R, 656] int8 (HiF8 / FP8 bytes too)
        return _Operands(q_bits, rows, rows.view(np.uint16), rows.view(np.float32), _NO_KEY, _NO_ROPE, _NO_KEY)
    qr_bits = bits16(args.query_rope).reshape(t, n1, D_ROPE)  # [T, N1, 64]
    v_bits = _NO_KEY if args.v_from_key else bits16(args.value).reshape(r, HCKV)
    return _Operands(np.concatenate([q_bits, qr_bits], axis=-1),  # [T, N1, 576]
                     _NO_I8, _NO_U16, _NO_F32,
                     bits16(args.key).reshape(r, HCKV),  # [R, 512]
                     bits16(args.key_rope).reshape(r, D_ROPE),  # [R, 64]
                     v_bits)  # [R, 512] or [0, 512]


def _attend(args: SparseFlashAttentionArgs, opd: _Operands, units: np.ndarray, lengths: np.ndarray, total: int,
            out: np.ndarray, smax: np.ndarray, ssum: np.ndarray, parallel: bool, dense: bool) -> None:
    """Steps 1-4 of the module doc for the units with kept rows (``units``, ``lengths`` rows
    each, ``total`` in all), pass after pass, into ``out`` (bits ``[T*N2, G, 512]``), ``smax`` /
    ``ssum`` (``[T*N2, G]``); the threaded kernels with ``parallel``, else their calling-thread
    twins. ``dense``: ``units`` is every unit, ``0 .. T*N2-1``."""
    if parallel:
        gather, widen_query, softmax, round_out = _gather, _widen_query, _softmax, _round_out
    else:
        gather, widen_query, softmax, round_out = _gather_serial, _widen_query_serial, _softmax_serial, _round_out_serial
    n2, group = args.num_kv_heads, args.group
    t_size = opd.query.shape[0]
    is_bf16, scale = args.query_dtype == BF16, np.float32(args.scale_value)
    table = _element_table(args.nope_element)  # [256] or [0]
    sinks = _NO_SINKS if args.sinks is None else np.ascontiguousarray(args.sinks, np.float32)  # [G] (N2 = 1) or [0]
    query = opd.query.reshape(t_size * n2, group, D_QK)  # [T*N2, G, 576] bits, by unit
    starts = args.starts.reshape(t_size * n2, -1)  # [T*N2, K]
    counts = args.counts.reshape(t_size * n2, -1)  # [T*N2, K]
    passes = _passes(lengths, total)
    most = total if len(passes) == 1 else max(int(lengths[u0:u1].sum()) for u0, u1 in passes)
    kv = np.empty((most, D_QK if args.v_from_key else D_QK + HCKV), dtype=np.float32)  # [rows, 576|1088]
    v_cols = slice(0, HCKV) if args.v_from_key else slice(D_QK, D_QK + HCKV)
    scores = np.empty((most, group), dtype=np.float32)  # [rows, G] S^T, then P^T
    for u0, u1 in passes:
        pass_units = units[u0:u1]  # [U']
        lens = lengths[u0:u1]  # [U']
        rows = total if len(passes) == 1 else int(lens.sum())
        src = np.empty(rows, np.int64)  # [rows] key row of each gathered row
        offsets = np.empty(u1 - u0, np.int64)  # [U'] first gathered row of each unit
        _pass_rows(starts, counts, pass_units, src, offsets)
        gather(get_num_threads(), src, args.quant, opd.rows_i8, opd.rows_u16, opd.rows_f32, table, opd.key,
               opd.key_rope, opd.value, args.v_from_key, is_bf16, kv)
        q = np.empty((u1 - u0, group, D_QK), dtype=np.float32)  # [U', G, 576]
        widen_query(query, pass_units, is_bf16, q)
        spans = list(zip(offsets.tolist(), lens.tolist(), strict=True))  # (first row, rows) per unit
        # bf16 queries: every operand of both products holds bf16 values (the dequantized rows are
        # rounded to the query dtype, P too), so they may run on the fp32-output bf16 engine; the
        # spans of the whole pass's buffers bound every unit's views (one pass each)
        engine = is_bf16 and bf16_engine_may_run(max(int(lens.max()), group))
        kv_span = span(kv[:rows]) if engine else None
        q_span = span(q) if engine else None
        for i, (off, length) in enumerate(spans):
            k_rows, q_t = kv[off:off + length, :D_QK], q[i].T  # [L, 576], [576, G]
            scores[off:off + length] = (matmul_bf16_f32(k_rows, q_t, a_span=kv_span, b_span=q_span) if engine
                                        else matmul_f32(k_rows, q_t))  # [L, G]
        if dense:  # units u0..u1-1 are rows u0..u1-1: the kernels write them in place
            sm, ss = smax[u0:u1], ssum[u0:u1]  # [U', G] views
        else:
            sm = np.empty((u1 - u0, group), dtype=np.float32)  # [U', G]
            ss = np.empty((u1 - u0, group), dtype=np.float32)  # [U', G]
        softmax(scores[:rows], offsets, lens, scale, sinks, is_bf16, sm, ss, _head_cols(u1 - u0, group))
        if not dense:
            smax[pass_units], ssum[pass_units] = sm, ss
        o = np.empty((u1 - u0, group, HCKV), dtype=np.float32)  # [U', G, 512]
        if engine:  # P scaled by 2**P_SHIFT (exact): its small and subnormal values normal for oneDNN
            p_scaled = scores[:rows] * np.float32(2.0 ** P_SHIFT)  # [rows, G]
            p_span = span(p_scaled)
        for i, (off, length) in enumerate(spans):
            p_t, v_rows = scores[off:off + length].T, kv[off:off + length, v_cols]  # [G, L], [L, 512]
            o_i = None
            if engine:  # None where the engine's rule or the operands keep the product on sgemm
                o_i = _scaled_pv(matmul_bf16_f32(p_scaled[off:off + length].T, v_rows, a_span=p_span,
                                                 b_span=kv_span, sgemm=_no_product))
            o[i] = matmul_f32(p_t, v_rows) if o_i is None else o_i  # [G, 512]
        bits = out[u0:u1].reshape(-1) if dense else np.empty((u1 - u0) * group * HCKV, dtype=np.uint16)  # [U'*G*512]
        round_out(o.reshape(-1), is_bf16, bits)
        if not dense:
            out[pass_units] = bits.reshape(u1 - u0, group, HCKV)


#: ``P @ V`` on the fp32-output bf16 engine multiplies ``P * 2**P_SHIFT`` (exact: a power of two;
#: ``P`` <= 1, so at most ``2**64``) and scales the result back: ``P``'s smallest values (down to
#: bf16's subnormal ``2**-133``) would otherwise keep the product off the engine, whose bf16
#: dot-product instructions flush subnormal operands and products. The products are the same
#: exact values scaled, summed in fp32 in another order; where sgemm would round a product or a
#: sum in fp32's subnormal range (below ``2**-126``: an output element that is the sum of tiny
#: ``P * V`` terms only, e.g. where the dominant row's ``V`` is 0) the engine's sum is exact and
#: rounded once (RNE) when scaled back.
P_SHIFT = 64


def _no_product() -> None:
    """The sgemm stand-in of the scaled ``P @ V``: None, the caller runs the unscaled product."""
    return None


def _scaled_pv(o_scaled: np.ndarray | None) -> np.ndarray | None:
    """``o_scaled * 2**-P_SHIFT`` (exact for normal results, one RNE rounding below ``2**-126``),
    or None where there is no result (the caller then runs the unscaled product on sgemm)."""
    if o_scaled is None:
        return None
    o_scaled *= np.float32(2.0 ** -P_SHIFT)
    return o_scaled


#: Fewest heads in one range of the softmax (:func:`_head_cols`): 16 fp32 lanes, one AVX-512 vector.
HEADS_PER_COL = 16


def _head_cols(units: int, group: int) -> int:
    """Head ranges per unit for :func:`_softmax`: 1 where there are as many units as threads,
    else enough for one range per thread, each at least :data:`HEADS_PER_COL` heads (a decode's
    one unit of 128 heads on 2 threads: 2 ranges of 64). Narrower ranges cost more passes over
    the scores: the softmax of one unit of 2048 x 128 took 0.59 / 0.64 / 0.96 ms on 2 threads
    with 2 / 4 / 8 ranges, 0.78 ms on one thread, 0.75 ms before, with parallel row passes.
    Since step 4's division vectorizes (:func:`_softmax_unit`) one thread takes 0.54-0.56 ms and
    2 ranges 0.66 ms alone, the same within the noise inside a b = 1 call (the scores sit in both
    cores' caches after the two-thread product)."""
    threads = get_num_threads()
    if units >= threads:
        return 1
    return max(1, min(-(-threads // units), group // HEADS_PER_COL))


@functools.lru_cache(maxsize=4)
def _empty_row_bits(dtype: np.dtype) -> np.uint16:
    """:data:`EMPTY_ROW_OUTPUT` as bits of the query dtype (memoised per dtype)."""
    return np.asarray(EMPTY_ROW_OUTPUT, np.float32).astype(dtype).view(np.uint16)[()]


def sparse_flash_attention(args: SparseFlashAttentionArgs) -> SparseFlashAttentionOutputs:
    """emu implementation of both sparse attention ops (:mod:`ascend_emu.ops.sparse_flash_attention`).

    Args:
        args: validated arguments (every kept row in range).

    Returns:
        ``(attention_out, softmax_max, softmax_sum)``: attention_out in the query dtype,
        ``args.out_shape``; softmax_max / softmax_sum fp32 ``[B, N2, S1, G]`` (BSND) or
        ``[N2, T, G]`` (TND) when ``args.return_softmax_lse``, else fp32 ``[0]``.
    """
    opd = _operands(args)
    t_size, n1 = opd.query.shape[:2]
    n2, group = args.num_kv_heads, args.group
    all_lengths = args.lengths.reshape(-1)  # [T*N2]
    dense = np.count_nonzero(all_lengths) == all_lengths.size  # every unit has rows: _attend writes every element
    units = np.arange(all_lengths.size) if dense else np.flatnonzero(all_lengths)  # [U] units t * N2 + h with rows
    lengths = all_lengths if dense else all_lengths[units]  # [U]
    if dense:
        out = np.empty((t_size * n2, group, HCKV), dtype=np.uint16)  # [T*N2, G, 512] query-dtype bits
        smax = np.empty((t_size * n2, group), dtype=np.float32)  # [T*N2, G]
        ssum = np.empty((t_size * n2, group), dtype=np.float32)  # [T*N2, G]
    else:
        out = np.full((t_size * n2, group, HCKV), _empty_row_bits(args.query_dtype), dtype=np.uint16)
        smax = np.full((t_size * n2, group), EMPTY_ROW_SOFTMAX_MAX, dtype=np.float32)
        ssum = np.full((t_size * n2, group), EMPTY_ROW_SOFTMAX_SUM, dtype=np.float32)
    if units.size:
        # threaded kernels, or the calling thread's when the call is too small to split: a parallel
        # launch costs 20-150 us, more than B=1 decode work (with the workqueue threading layer even
        # on one thread); both give the same bytes. The Numba kernels' work per kept row is its
        # gathered 576 values and its G scores (the G x 576 products run in BLAS, outside them).
        total = int(lengths.sum())
        parallel = parallel_parts(total, D_QK + group) > 1
        _attend(args, opd, units, lengths, total, out, smax, ssum, parallel, dense)
    attention_out = out.view(args.query_dtype).reshape(args.out_shape)
    if not args.return_softmax_lse:
        empty = np.empty(0, dtype=np.float32)  # [0]
        return SparseFlashAttentionOutputs(attention_out, empty, empty.copy())
    smax, ssum = smax.reshape(t_size, n2, group), ssum.reshape(t_size, n2, group)  # [T, N2, G]
    if args.layout_query == "BSND":
        shape = (args.batch, args.seq_q, n2, group)
        lse = [np.ascontiguousarray(x.reshape(shape).transpose(0, 2, 1, 3)) for x in (smax, ssum)]  # [B, N2, S1, G]
    else:
        lse = [np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (smax, ssum)]  # [N2, T, G]
    return SparseFlashAttentionOutputs(attention_out, lse[0], lse[1])
