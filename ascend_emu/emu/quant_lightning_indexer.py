"""emu backend of ``npu_quant_lightning_indexer`` (Atlas A2 / A3 int8 path): per batch, the
visible int8 key rows gathered once, one exact integer GEMM, then a Numba pass per query token for
the kernel's fp16 staging, the weighted head sum, the key scale and the top-k.

Numerics, step by step as the A2 / A3 kernel does them (ops-transformer
``attention/quant_lightning_indexer/op_kernel/arch22/``):

1. ``ws[h] = fp16(w[h] * qs[h])``: ``ProcessVec0`` multiplies weights and query_dequant_scale
   as half (``AscendC::Mul`` on ``LocalTensor<half>``, ``quant_lightning_indexer_service_vector_arch22.h``
   ``ProcessVec0``), RNE. The product of two fp16 values is exact in fp32 (11 x 11 significand
   bits), so rounding that once is the fp16 multiply.
2. ``dot[h, p] = q[h] . k[p]``: int8 x int8 on the cube into int32 (``ComputeQk``, L0C
   ``int32_t``). Exact here: every partial sum is an integer of magnitude at most 128**3 = 2**21,
   computed by :func:`~ascend_emu.emu.matmul.matmul_int8` (exact int32), or, where its engine is
   fp32 sgemm anyway, by one fp32 product of the widened values (exact: D <= 1024), held as fp32.
3. ``s[h, p] = fp16(relu(dot) * 2**-10)``: the fixpipe moves L0C to L1 with ``reluPre = 1`` and
   ``quantPre = DEQF16`` with the scale ``0x3a800000`` = 2**-10 (``FixpSToL1``): the scaling is
   exact in fp32 (|dot| < 2**24), then one RNE rounding to fp16 (at most 2048, never overflows).
   The golden: ``(max(q @ k, 0).float() / 1024.0).to(float16)``.
4. ``acc[p] = sum_h fp32(ws[h]) * fp32(s[h, p])``: the second cube matmul, fp16 operands into an
   fp32 L0C (``ComputeWs``, ``Mmad`` with ``k = gSize``), written out unrounded
   (``FixpResToGm``, ``NoQuant``). Each product is exact in fp32; the sum runs in head order in
   fp32 (the cube's internal order is not public, so the last fp32 bit
   of a sum may differ from the hardware's).
5. ``score[p] = acc[p] * fp32(ks[p])`` in fp32 (``ProcessVec1``: ``Cast`` of the fp16 key scale,
   ``Mul``), then the sort on the fp32 scores: the shared top-k of
   :mod:`ascend_emu.emu.lightning_indexer` (descending, equal scores lower position first, NaN
   ranks as -inf; ``-1`` past the last selected position and in skipped rows). The kernel sorts
   with ``SortAll`` / ``MergeSort`` over positions in ascending order; the AscendC ``Sort32``
   doc's constraint ("when score[i] equals score[j] and i > j, score[j] is taken first") gives
   that tie order within a sort; across merged queues the doc says nothing (the op doc: the
   top-k's order for NaN is undefined).

The Ascend 950's FP8 E4M3 / HiF8 paths (ops-transformer ``attention/quant_lightning_indexer/
op_kernel/arch35/``; the contract gates them on the SoC) differ in steps 1-3:

1. ``ws[h] = w[h] * qs[h]``: fp16 weights with fp16 scales rounded to fp16 as in step 1 (the
   golden's fp16 ``now_weights * now_query_scale``); bf16 weights with fp32 scales multiplied in
   fp32 (arch35 ``vf/quant_lightning_indexer_vector1.h`` ``MulWeightAndReduceSum``: ``Cast`` to
   float, ``Mul``; the golden's promotion to fp32 gives the same).
2. ``dot[h, p] = q[h] . k[p]`` of the decoded elements (exact fp32 values) as an fp32 matmul
   (BLAS order; the cube's order is not public).
3. ``s[h, p] = relu(dot)`` in fp32, with no 2**-10 scaling and no fp16 staging: arch35
   ``ReduceSumLoopBody`` applies ``CastFP32ToFP16ToFP32`` (the 1/1024 and the fp16 round trip)
   only to an int32 QK. op-plugin's golden divides by 1024 and rounds to fp16 on the 950 too;
   the emulator follows the kernel.

Steps 4-5 as above: the head sum in head order in fp32 (the arch35 kernel accumulates even and
odd heads in two registers and adds them; not emulated), the key scale in fp32, the top-k on the
fp32 scores (some arch35 templates sort bf16-rounded scores; unverified which one runs, so ties
may differ from hardware).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.quant_lightning_indexer import QuantLightningIndexerArgs, QuantLightningIndexerOutputs
from ..quant.combined import NOPE_BYTE_VALUES
from .lightning_indexer import PARALLEL_MIN_SCORES, _batch_rows, _chunk, _top_k
from .matmul import SGEMM_EXACT_K, int8_engine, matmul_f32, matmul_int8

#: The fixpipe's dequant scale before the fp16 staging (``SetFixpipePreQuantFlag(0x3a800000)``).
DEQ_SCALE = np.float32(2.0 ** -10)


#: Smallest fp32 value fp16's RNE rounds to inf (65504 + half an ulp of 32).
F16_INF_FROM = np.float32(65520.0)


@njit(cache=True, inline="always")
def _stage_f16(d):
    """``fp32(fp16(relu(d) * 2**-10))`` of an exact integer dot ``d`` (fp32 holding an integer of
    magnitude at most ``2**24``), RNE, branch-free so that the head loop vectorises: ``x =
    relu(d) * 2**-10`` is exact and either 0 or at least ``2**-10``, inside fp16's normal range,
    where RNE to fp16 is RNE of the fp32 significand to 11 bits (a carry moves into the exponent
    as it should), and from 65520 up inf. The same bits as the fp16 cast widened back (checked
    over every integer up to ``2**24`` by ``tests/test_quant_lightning_indexer.py``)."""
    d = np.float32(d)
    x = np.float32((d if d > np.float32(0.0) else np.float32(0.0)) * DEQ_SCALE)
    u = x.view(np.uint32)
    r = np.uint32((u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000))
    return np.float32(np.inf) if x >= F16_INF_FROM else r.view(np.float32)


@njit(cache=True)
def _score_top_k_range(lo, hi, dots, ws, ks, limit, staged, idx_out):
    """Scores and top-k of query tokens ``lo <= c < hi`` of a chunk of one batch.

    dots fp32 ``[C * G, L]`` exact int dots (``dots[c * G + h, p]``, below ``2**21``), or the fp32
    dots of the 950's FP8 / HiF8 path; ws fp32 ``[C, G]`` the ``w * qs`` of step 1; ks fp32 ``[L]`` key scales
    of the batch's kv positions; limit int64 ``[C]`` (each <= L, or < 0 for a skipped row);
    staged: the int8 path's fp16 staging (step 3), else ``relu`` only; idx_out int32 ``[C, K]``.
    """
    g = ws.shape[1]
    k = idx_out.shape[1]
    for c in range(lo, hi):
        lim = limit[c]
        if lim <= 0:
            for j in range(k):
                idx_out[c, j] = -1
            continue
        acc = np.zeros(lim, np.float32)  # [L]
        for h in range(g):
            wh = ws[c, h]
            row = dots[c * g + h]
            if staged:
                for p in range(lim):
                    acc[p] = acc[p] + wh * _stage_f16(row[p])
            else:
                for p in range(lim):
                    acc[p] = acc[p] + wh * np.float32(max(row[p], 0.0))
        for p in range(lim):
            acc[p] = acc[p] * ks[p]
        sel = _top_k(acc, k)
        m = sel.shape[0]
        for j in range(m):
            idx_out[c, j] = sel[j]
        for j in range(m, k):
            idx_out[c, j] = -1


@njit(cache=True, parallel=True)
def _score_top_k_parallel(dots, ws, ks, limit, staged, idx_out):
    """:func:`_score_top_k_range` with one query token per parallel iteration."""
    for c in prange(ws.shape[0]):
        _score_top_k_range(c, c + 1, dots, ws, ks, limit, staged, idx_out)


@njit(cache=True, nogil=True)
def _gather_widen_int8(key_rows, slots, kh, out):
    """``out[p] = fp32(key_rows[slots[p], kh])``: int8 key rows ``[R, N2, D]`` gathered and widened
    (exact) in one pass; slots int64 ``[L]`` validated by the contract (each in ``[0, R)``)."""
    for p in range(slots.shape[0]):
        row = key_rows[slots[p], kh]
        for j in range(out.shape[1]):
            out[p, j] = np.float32(row[j])


def _int8_as_f32(dim: int) -> bool:
    """Whether the int8 ``q . k`` runs as an fp32 product of the widened values
    (:func:`~ascend_emu.emu.matmul.matmul_f32`) rather than :func:`~ascend_emu.emu.matmul.matmul_int8`:
    where the int8 engine is ``"sgemm"`` anyway, so the keys are widened once per batch instead of
    once per product. Exact either way: ``dim`` <= :data:`~ascend_emu.emu.matmul.SGEMM_EXACT_K`
    products of at most ``2**14`` sum to at most ``2**24`` in any order."""
    return int8_engine() == "sgemm" and dim <= SGEMM_EXACT_K


def quant_lightning_indexer(args: QuantLightningIndexerArgs) -> QuantLightningIndexerOutputs:
    """Backend of :func:`ascend_emu.ops.npu_quant_lightning_indexer`.

    Returns:
        ``(sparse_indices,)`` as that function documents.
    """
    ia = args.indexer
    n1, dim = ia.query.shape[-2:]
    n2 = ia.key.shape[-2]
    query = ia.query.reshape(-1, n1, dim)  # [T, N1, D] int8
    t_rows = query.shape[0]
    g = n1 // n2
    k = ia.sparse_count
    idx = np.empty((t_rows, n2, k), np.int32)  # [T, N2, K]
    key_rows = ia.key.reshape(-1, n2, dim)  # [R, N2, D] int8
    ks_rows = args.key_dequant_scale.reshape(-1, n2)  # [R, N2] fp16 (fp32 with bf16 weights)
    staged = args.element == "int8"
    if not staged:  # FP8 / HiF8 codes -> exact fp32 values
        table = NOPE_BYTE_VALUES[args.element]
        query = table[np.ascontiguousarray(query).view(np.uint8)]  # [T, N1, D] fp32
    with np.errstate(over="ignore", invalid="ignore"):  # products past fp16 only with non-finite factors
        ws = (ia.weights.astype(np.float32) * args.query_dequant_scale.astype(np.float32))  # exact for fp16 x fp16
        if ia.weights.dtype == np.float16:
            ws = ws.astype(np.float16)
        ws = ws.astype(np.float32).reshape(t_rows, n1)  # [T, N1] step 1
    for b, rows in _batch_rows(ia.token_batch):
        lim = ia.limit[rows]  # [n_tok]
        width = max(int(lim.max()), 0)
        slots = ia.slots[b, :width]  # [L] validated rows
        for kh in range(n2):
            exact_f32 = staged and _int8_as_f32(dim)
            if exact_f32:  # int8 values widened once: every partial sum of D <= 1024 products is exact
                keys = np.empty((width, dim), np.float32)  # [L, D]
                _gather_widen_int8(key_rows, slots, kh, keys)
            else:
                keys = np.ascontiguousarray(key_rows[slots, kh])  # [L, D] int8 / FP8 / HiF8 codes
            if not staged:
                keys = table[keys.view(np.uint8)]  # [L, D] fp32 values of the visible rows only
            ks = np.ascontiguousarray(ks_rows[slots, kh], dtype=np.float32)  # [L]
            step = _chunk(width, g)
            for c0 in range(0, rows.size, step):
                sub = rows[c0:c0 + step]
                q = query[sub, kh * g:(kh + 1) * g].reshape(-1, dim)  # [C * G, D]
                if exact_f32:
                    dots = matmul_f32(q.astype(np.float32), keys.T)  # [C * G, L] exact integers
                elif staged:
                    dots = matmul_int8(q, keys, w_nk=True).astype(np.float32)  # [C * G, L] exact (< 2**24)
                else:
                    dots = matmul_f32(q, keys.T)  # [C * G, L] fp32 values
                w = np.ascontiguousarray(ws[sub, kh * g:(kh + 1) * g])  # [C, G]
                out_i = np.empty((sub.size, k), np.int32)
                sub_lim = lim[c0:c0 + sub.size]
                operands = (dots, w, ks, sub_lim, staged, out_i)
                if sub.size > 1 and int(np.maximum(sub_lim, 0).sum()) * g >= PARALLEL_MIN_SCORES:
                    _score_top_k_parallel(*operands)
                else:
                    _score_top_k_range(0, sub.size, *operands)
                idx[sub, kh] = out_i
    return QuantLightningIndexerOutputs(idx.reshape(ia.out_shape))

