"""emu backend of ``npu_fused_infer_attention_score`` / ``_v2`` (the MLA subset and the MHA / GQA
form: its dense key / value become token-major rows once per call, :func:`_dense_tokens`, its
kv antiquant is applied there; its explicit masks and sinks enter :func:`_softmax_rows`).

Work units are (request ``b``, kv head ``h``) pairs: the unit's query rows (its tokens x the G
query heads of ``h``, token-major) attend the unit's kv positions ``0 .. max limit - 1``, read
from the cache a block at a time through the block ids the contract checked (``args.kv_blocks``;
non-paged TND: the token rows ``args.kv_rows``), each cache read through its
:class:`~ascend_emu.layouts.CacheLayout` (``args.key_layout`` / ``value_layout`` /
``rope_layout``: :meth:`~ascend_emu.layouts.CacheLayout.read_blocks`):

1. gather (NumPy fancy indexing, any of the three cache layouts, NZ included): K ``[L, D + 64]``
   = key | key_rope rows and V ``[L, D]``, widened exactly to fp32; the query rows
   ``[R, D + 64]`` likewise;
2. ``S = Q @ K^T`` by fp32 BLAS (:func:`~ascend_emu.emu.matmul.matmul_f32`);
3. softmax (Numba, :func:`_softmax_rows`, rows in parallel where there are enough): ``S * scale`` in fp32, ``m`` = max over the
   row's first ``limit`` entries, ``e = fp32(exp(S - m))`` with exp evaluated in float64
   (:func:`ascend_emu.emu.sparse_flash_attention._exp_f64`, the sparse attention ops' one
   definition), ``l = sum e`` in kv order, ``P = qdt(e)`` RNE (unnormalised, as the kernel's:
   divided by ``l`` after ``P @ V``), 0 past the limit;
4. ``O = P @ V`` by fp32 BLAS, ``fp32(O / l)``, one RNE rounding to the query dtype;
   ``lse = fp32(m + fp32(ln l))``.

The gathered rows go into one fp32 buffer per call (K | K_rope; V is its first D columns when
value is the key cache), the scores into another: fresh multi-MB arrays per request would pay
page faults on every call.

The C8 decode (:func:`_c8_attention`, steps C1-C7 of the op module): per request the exact int8
dots (:func:`~ascend_emu.emu.matmul.matmul_int8`) and fp32 rope products, then one parallel
Numba pass per row (:func:`_c8_softmax_rows`: scores, 512-token blocks, int8 P per block) and,
per block, the exact int8 P @ V and its fp16 staging (:func:`_c8_stage_rows`).

Rows with no kv position keep :data:`~ascend_emu.ops.fused_infer_attention_score.EMPTY_ROW_OUTPUT`
and :data:`~ascend_emu.ops.fused_infer_attention_score.EMPTY_ROW_LSE`. The zero P entries past a
row's causal limit add exact zeros to the P @ V sums (their V rows are finite cache values).

Source: the op contract :mod:`ascend_emu.ops.fused_infer_attention_score` (numerics, empty rows).
"""

from __future__ import annotations

import contextlib
import threading

import numba
import numpy as np
from numba import njit, prange

from ..mla import D_ROPE
from ..ops.fused_infer_attention_score import (C8_DOT_BIAS, C8_DOT_BIAS_BITS, C8_FLOAT_EPS, C8_KV_BLOCK, C8_P_RANGE,
                                               C8_PV_STAGE_SCALE, EMPTY_ROW_LSE, EMPTY_ROW_OUTPUT,
                                               FusedInferAttentionArgs, FusedInferAttentionOutputs)
from ..quant import BF16, to_fp8, to_hif8, unpack_int4_from_int32
from ..quant.rounding import bf16_bits_to_f32, f32_bits_to_bf16_bits
from ..quant.rounding import f32_round_f16 as _f16
from ..quant.rounding import f32_to_f16, round_half_even, saturate_int8
from .kernels import launch_rows, side_by_side
from .matmul import SMALL_INT8_MACS, SMALL_PRODUCT_MACS, matmul_f32, matmul_int8, one_blas_thread, widen_f32
from .sparse_flash_attention import _exp_f64


@njit(cache=True, nogil=True)
def _softmax_rows(lo, hi, scores, limits, scale, is_bf16, m, total, masked, group, sinks):
    """In place, rows ``lo:hi``: fp32 scores ``[R, L]`` -> P (query-dtype values as fp32, unnormalised
    exp) over the first ``limits[r]`` entries (the rest set to 0); ``m`` / ``total``: out, fp32
    ``[R]`` the row max and exp sum (rows with limit 0 are left untouched). ``masked``: uint8
    ``[R / group, L]`` (row ``r`` reads row ``r // group``; 1 drops the entry: exp 0), or ``[0, 0]``
    for none; ``sinks``: fp32 ``[R]`` each row's learnable sink (one more softmax entry, its exp
    added to the sum last), or ``[0]``. Within a row the scale / exp / rounding passes vectorize
    and the sum runs in kv order."""
    has_mask = masked.shape[0] > 0
    has_sink = sinks.shape[0] > 0
    for r in range(lo, hi):
        n = limits[r]
        row = scores[r]
        if n <= 0:
            row[:] = 0.0
            continue
        seg = row[:n]  # a slice and fresh locals: the loops vectorize
        for i in range(n):
            seg[i] = np.float32(seg[i] * scale)
        if has_mask:
            mrow = masked[r // group]
            for i in range(n):
                if mrow[i]:
                    seg[i] = -np.inf
        mx = np.float32(-np.inf)
        for i in range(n):
            if seg[i] > mx:
                mx = seg[i]
        if has_sink and sinks[r] > mx:
            mx = sinks[r]
        mxf = np.float32(mx)
        for i in range(n):
            seg[i] = np.float32(_exp_f64(seg[i] - mxf))
        tot = np.float32(0.0)
        for i in range(n):
            tot = np.float32(tot + seg[i])
        if has_sink:
            tot = np.float32(tot + np.float32(_exp_f64(sinks[r] - mxf)))
        bits = seg.view(np.uint32)
        if is_bf16:
            for i in range(n):
                seg[i] = bf16_bits_to_f32(f32_bits_to_bf16_bits(bits[i]))
        else:
            for i in range(n):
                seg[i] = _f16(seg[i])
        row[n:] = 0.0
        m[r] = mx
        total[r] = tot


@njit(cache=True, parallel=True)
def _softmax_parts(parts, scores, limits, scale, is_bf16, m, total, masked, group, sinks):
    """:func:`_softmax_rows` over ``parts`` contiguous row ranges in parallel."""
    rows = scores.shape[0]
    for i in prange(parts):
        _softmax_rows(rows * i // parts, rows * (i + 1) // parts, scores, limits, scale, is_bf16, m, total, masked,
                      group, sinks)


@njit(cache=True, nogil=True)
def _c8_softmax_rows(lo, hi, dot, scores, d1, limits, block, p_out, max_p16, exp16, m, total):
    """The C8 kernel's scores, blocked softmax and P quantisation, rows ``lo:hi`` (steps C1-C4 of
    the op's module docstring). dot: int32 ``[R, L]`` exact nope dots; scores: fp32
    ``[R, L]`` the rope products in, the scores out; d1: fp32 ``[R]`` ``fp32(fp32(qs * ks) * scale)``;
    limits: int64 ``[R]`` (rows with limit <= 0 are left untouched); block: kv positions per block.
    Out: p_out int8 ``[R, L]`` (0 past the limit), max_p16 / exp16 fp32 ``[R, nblk]`` the block's
    fp16 P max and fp16 rescale factor (0 / 1 for blocks past the limit), m / total fp32 ``[R]``
    the final max and exp sum."""
    eps = np.float32(C8_FLOAT_EPS)
    p_range = np.float32(C8_P_RANGE)
    bias = np.float32(C8_DOT_BIAS)
    nblk = max_p16.shape[1]
    for r in range(lo, hi):
        lim = limits[r]
        row = scores[r]
        drow = dot[r]
        out = p_out[r]
        out[:] = 0
        if lim <= 0:
            continue
        dq = d1[r]
        for i in range(lim):
            bits = np.int32(drow[i] + np.int32(C8_DOT_BIAS_BITS))
            nope = np.float32(bits.view(np.float32) - bias)
            row[i] = np.float32(np.float32(nope + row[i]) * dq)
        mo = np.float32(-np.inf)
        tot = np.float32(0.0)
        for j in range(nblk):
            lo = j * block
            if lo >= lim:
                max_p16[r, j] = 0.0
                exp16[r, j] = 1.0
                continue
            seg = row[lo:min(lo + block, lim)]  # slices, fresh locals: the loops vectorize
            oseg = out[lo:min(lo + block, lim)]
            lm = np.float32(seg[0])
            for i in range(1, seg.shape[0]):
                if seg[i] > lm:
                    lm = np.float32(seg[i])
            mn = mo
            if lm > mo:
                mn = lm
            ed = np.float32(0.0)
            if j > 0:
                ed = np.float32(_exp_f64(mo - mn))
            mnf = np.float32(mn)
            for i in range(seg.shape[0]):
                seg[i] = np.float32(_exp_f64(seg[i] - mnf))
            s = np.float32(0.0)
            for i in range(seg.shape[0]):
                s = np.float32(s + seg[i])
            tot = np.float32(np.float32(ed * tot) + s)
            mp = np.float32(np.float32(_exp_f64(lm - mnf)) + eps)
            qs = np.float32(p_range / mp)
            for i in range(seg.shape[0]):
                h = np.rint(_f16(seg[i] * qs))
                oseg[i] = np.int8(min(max(h, -128.0), 127.0))
            max_p16[r, j] = _f16(mp)
            exp16[r, j] = _f16(ed)
            mo = mn
        m[r] = mo
        total[r] = tot


@njit(cache=True, parallel=True)
def _c8_softmax_parts(parts, dot, scores, d1, limits, block, p_out, max_p16, exp16, m, total):
    """:func:`_c8_softmax_rows` over ``parts`` contiguous row ranges in parallel."""
    rows = scores.shape[0]
    for i in prange(parts):
        _c8_softmax_rows(rows * i // parts, rows * (i + 1) // parts, dot, scores, d1, limits, block, p_out, max_p16,
                         exp16, m, total)


@njit(cache=True, nogil=True)
def _c8_stage_rows(lo, hi, pv, max_p16, exp16, acc, first):
    """Step C5-C6 for one kv block, rows ``lo:hi``, in place on ``acc`` (fp32 ``[R, D]`` holding
    fp16 values): ``x = fp16(fp16(pv * 2**-10) * max_p16)``, ``acc = x`` (``first``) or
    ``fp16(fp16(acc * exp16) + x)``. pv int32 ``[R, D]`` exact; max_p16 / exp16 fp32 ``[R]`` fp16
    values. A product of two fp16 values is exact in fp32 and a sum's fp32 rounding cannot change
    its fp16 one (24 >= 2 * 11 + 2 bits), so each step rounds as fp16 arithmetic does."""
    stage = np.float32(C8_PV_STAGE_SCALE)
    for r in range(lo, hi):
        mp = max_p16[r]
        e = exp16[r]
        for c in range(pv.shape[1]):
            x = _f16(_f16(np.float32(pv[r, c]) * stage) * mp)
            if first:
                acc[r, c] = x
            else:
                acc[r, c] = _f16(_f16(acc[r, c] * e) + x)


@njit(cache=True, parallel=True)
def _c8_stage_parts(parts, pv, max_p16, exp16, acc, first):
    """:func:`_c8_stage_rows` over ``parts`` contiguous row ranges in parallel."""
    rows = pv.shape[0]
    for i in prange(parts):
        _c8_stage_rows(rows * i // parts, rows * (i + 1) // parts, pv, max_p16, exp16, acc, first)


def _c8_stage(pv, max_p16, exp16, acc, first) -> None:
    """:func:`_c8_stage_rows` over every row: on the calling thread for a block of a decode's few
    rows (``launch_rows``; as a parallel kernel it took about 64 us a call on 2 threads against 8
    on one, C8 B = 64 N = 16 kv 2048 under cProfile), else in parallel."""
    launch_rows(_c8_stage_rows, _c8_stage_parts, pv.shape[0], pv.shape[1], pv, max_p16, exp16, acc, first)


_NO_MASK = np.zeros((0, 0), np.uint8)
_NO_SINK = np.zeros(0, np.float32)


def _requests(args: FusedInferAttentionArgs, group: int):
    """Per request with rows to compute: ``(b, nq, tokens, width, kv, row_limits, live)``: its index, its query
    tokens (int64 ``[nq]``, token-major indices), the kv positions any row sees (``width``), where
    they are (``kv``: the ``ceil(width / bs)`` block ids it reads, or the non-paged TND token rows
    ``[width]``; :func:`_gather`), each row's limit (``[nq * group]``, token-major) and whether it
    is > 0 (step 1 of the op module; :meth:`FusedInferAttentionArgs.row_limits`)."""
    for b in range(args.batch):
        nq, kv_len = int(args.act_q[b]), int(args.act_kv[b])
        if nq == 0 or kv_len == 0:
            continue
        s = np.arange(nq)
        limits = args.row_limits(nq, kv_len)
        width = int(limits.max())
        if width == 0:
            continue
        row_limits = np.repeat(limits, group).astype(np.int64)  # [nq*G]
        if args.kv_blocks is None:
            kv = args.kv_rows[b, :width]
        else:
            kv = args.kv_blocks[b, :-(-width // args.block_size)]
        yield b, nq, int(args.q_start[b]) + s, width, kv, row_limits, row_limits > 0


def _store(out, lse, tokens, heads, o, m, total, live) -> None:
    """Write the live rows of fp32 ``o`` ``[R, D]`` into ``out[tokens, heads]`` and their lse
    ``fp32(m + fp32(ln total))`` into ``lse[tokens, heads]`` (rows token-major); the rest keep the
    empty-row values."""
    nq, d = tokens.size, out.shape[-1]
    block_out = out[tokens, heads].reshape(-1, d)  # copy [R, D]
    block_out[live] = o[live]
    out[tokens, heads] = block_out.reshape(nq, -1, d)
    block_lse = lse[tokens, heads].reshape(-1)  # copy [R]
    ln = np.log(total[live].astype(np.float64)).astype(np.float32)
    block_lse[live] = (m[live] + ln).astype(np.float32)
    lse[tokens, heads] = block_lse.reshape(nq, -1)


def _c8_attention(args: FusedInferAttentionArgs) -> tuple[np.ndarray, np.ndarray]:
    """The C8 decode (int8 query / caches, KV_N = 1): fp32 ``out`` ``[T, N, 512]`` and ``lse``
    ``[T, N]``, token-major (:func:`_finish` lays them out). The steps are the op module's C1-C7."""
    q = _tokens_first(args.query, args.query_layout)  # [T, N, 512] int8
    qr = _tokens_first(args.query_rope, args.query_layout)  # [T, N, 64] bf16
    qs = args.dequant_scale_query
    qs = (qs.transpose(0, 2, 1) if args.query_layout == "BNSD" else qs).reshape(q.shape[0], q.shape[1])  # [T, N]
    ks = np.float32(args.dequant_scale_key.reshape(-1)[0])
    vs = np.float32(args.dequant_scale_value.reshape(-1)[0])
    t_size, n, d = q.shape
    out = np.full((t_size, n, d), EMPTY_ROW_OUTPUT, dtype=np.float32)  # [T, N, D]
    lse = np.full((t_size, n), EMPTY_ROW_LSE, dtype=np.float32)  # [T, N]
    # C2: fp32(fp32(qs * ks) * scale) per row
    d1 = ((qs.astype(np.float32) * ks).astype(np.float32) * np.float32(args.scale)).astype(np.float32)  # [T, N]
    v_scale = np.float32(vs * np.float32(1.0 / C8_P_RANGE))  # C7: deqScale2Val * scaleP2
    block = C8_KV_BLOCK

    def one(request) -> None:
        _, nq, tokens, width, kv, row_limits, live = request
        k = _gather(args, args.key, args.key_layout, kv, width, 0, widen=False)  # [L, 512] int8
        kr = _gather(args, args.key_rope, args.rope_layout, kv, width, 0)  # [L, 64] fp32
        v = k if args.value is args.key else _gather(args, args.value, args.value_layout, kv, width, 0,
                                                     widen=False)  # [L, 512] int8
        qrows = q[tokens].reshape(-1, d)  # [R, 512] int8
        # C1: exact int dot (read through the biased fp32 accumulator in the kernel), rope in fp32
        dot = matmul_int8(qrows, k, w_nk=True)  # [R, L] int32
        with one_blas_thread():  # the same bits at any thread count (and side by side)
            scores = matmul_f32(qr[tokens].reshape(-1, D_ROPE).astype(np.float32), kr.T)  # [R, L] rope, then S
        nblk = -(-width // block)
        rows = scores.shape[0]
        p8 = np.empty((rows, width), np.int8)  # [R, L]
        max_p16 = np.empty((rows, nblk), np.float32)
        exp16 = np.empty((rows, nblk), np.float32)
        m = np.empty(rows, np.float32)
        total = np.empty(rows, np.float32)
        launch_rows(_c8_softmax_rows, _c8_softmax_parts, rows, width, dot, scores, d1[tokens].reshape(-1), row_limits,
                    block, p8, max_p16, exp16, m, total)
        acc = np.empty((rows, d), np.float32)  # [R, 512] fp16 values
        for j in range(nblk):  # C5-C6: fp16 staging of each block's P @ V, fp16 online rescale
            lo, hi = j * block, min((j + 1) * block, width)
            pv = matmul_int8(np.ascontiguousarray(p8[:, lo:hi]), v[lo:hi])  # [R, 512] int32, exact
            _c8_stage(pv, max_p16[:, j].copy(), exp16[:, j].copy(), acc, j == 0)
        o = acc * np.float32(1.0 / C8_PV_STAGE_SCALE)  # C7
        o = (o / np.where(live, total, np.float32(1))[:, None]).astype(np.float32)
        _store(out, lse, tokens, slice(None), (o * v_scale).astype(np.float32), m, total, live)

    requests = list(_requests(args, n))
    costs = [nq * n * width for _, nq, _, width, *_ in requests]  # [requests] rows x kv positions
    threads = _request_threads(costs, d, SMALL_INT8_MACS)
    with one_blas_thread() if threads > 1 else contextlib.nullcontext():
        side_by_side(one, requests, threads, costs)
    return out, lse


#: (request, kv head) units per thread from which a decode (bf16 or C8) runs its units side by
#: side even where their products are large enough for several threads each
#: (:func:`_request_threads`).
REQUESTS_PER_THREAD = 2


def _request_threads(costs: list, macs_per_cost: int, small_macs: int) -> int:
    """Python threads that run an attention's (request, kv head) units side by side (each unit
    then on one thread throughout, :func:`~ascend_emu.emu.kernels.side_by_side`), or 1 (units one
    after the other, their products and passes threaded inside): Numba's thread count where there
    are at least two units and either every unit's largest product (``cost * macs_per_cost``
    multiply-adds: C8's int8 ``q @ K``, ``rows * 512 * kv``; bf16's ``q @ K^T``, ``rows * 576 *
    kv``) is at most ``small_macs`` (one thread each anyway) or there are
    :data:`REQUESTS_PER_THREAD` units per thread to balance. ``costs``: rows x kv positions per
    unit."""
    threads = numba.get_num_threads()
    if threads < 2 or len(costs) < 2:
        return 1
    if max(costs) * macs_per_cost <= small_macs or len(costs) >= REQUESTS_PER_THREAD * threads:
        return threads
    return 1


def _tokens_first(x: np.ndarray, layout: str, heads: int = 0) -> np.ndarray:
    """Query-like ``x`` as ``[T, N, D]`` (token-major: request after request); ``heads``: N of a BSH
    ``[B, S, N*D]`` array (a key / value: KV_N)."""
    if layout == "BSND":
        return x.reshape(-1, x.shape[2], x.shape[3])
    if layout == "BNSD":
        return x.transpose(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3])
    if layout == "BSH":
        return x.reshape(x.shape[0] * x.shape[1], heads, x.shape[2] // heads)
    if layout in ("NTD", "NSD"):
        return x.transpose(1, 0, 2)
    return x


def _dense_tokens(args: FusedInferAttentionArgs) -> tuple[np.ndarray, np.ndarray]:
    """The key and value a ``_gather`` reads: the caches themselves (paged, or TND), else the MHA
    form's dense key / value as C-contiguous token-major ``[T2, KV_N, D]`` (one copy per call where
    the layout is not already so: BNSD, NTD, NSD), the rows of ``args.kv_rows``."""
    if args.kv_blocks is not None or args.query_layout == "TND":
        return args.key, args.value  # paged antiquant: dequantised per gathered block (:func:`_gather`)
    key = np.ascontiguousarray(_tokens_first(args.key, args.query_layout, args.num_kv_heads))
    value = key if args.value is args.key else \
        np.ascontiguousarray(_tokens_first(args.value, args.query_layout, args.num_kv_heads))
    if args.kv_antiquant is not None:
        k_scale, k_offset, v_scale, v_offset = args.kv_antiquant
        key, value = (_antiquant(x, scale, offset, args.query_dtype)
                      for x, scale, offset in ((key, k_scale, k_offset), (value, v_scale, v_offset)))
    return key, value


def _antiquant(x: np.ndarray, scale: np.ndarray, offset, qdt) -> np.ndarray:
    """int8 / int32 (8 int4 each) ``[T2, KV_N, D']`` -> ``qdt(scale * (x + offset))`` ``[T2, KV_N, D]``
    (Ascend C's AscendAntiQuant: an fp16 result computed in fp16 step by step, a bf16 one in fp32
    and rounded once); scale / offset fp32 ``[KV_N, D]`` holding query-dtype values."""
    if x.dtype == np.int32:
        x = unpack_int4_from_int32(x)
    if qdt == BF16:
        v = x.astype(np.float32)
        if offset is not None:
            v = v + offset
        return (v * scale).astype(BF16)
    v = x.astype(np.float16)
    if offset is not None:
        v = v + offset.astype(np.float16)
    return v * scale.astype(np.float16)


def _gather(args: FusedInferAttentionArgs, cache: np.ndarray, layout, kv: np.ndarray, width: int, h: int,
            widen: bool = True, antiquant=None) -> np.ndarray:
    """fp32 ``[width, D]``: kv head ``h`` of a request's first ``width`` kv positions in ``cache``
    (described by ``layout``), widened exactly (``widen=False``: in the cache's dtype). ``kv``: the
    request's block ids (paged: whole blocks read, :meth:`~ascend_emu.layouts.CacheLayout.read_blocks`)
    or token rows (non-paged TND, :meth:`~ascend_emu.layouts.CacheLayout.read_rows`). ``antiquant``:
    ``(scale, offset)`` fp32 ``[KV_N, D]`` of an int8 paged cache: the rows dequantised
    (:func:`_antiquant`, head ``h``'s channels) to the query dtype."""
    if args.kv_blocks is None:
        rows = layout.read_rows(cache, kv, h)  # [L, D]
    else:
        rows = layout.read_blocks(cache, kv, h)[:width]  # [L, D]
    if antiquant is not None:
        scale, offset = antiquant
        rows = _antiquant(rows[:, None, :], scale[h:h + 1], None if offset is None else offset[h:h + 1],
                          args.query_dtype)[:, 0, :]
    if not widen:
        return np.ascontiguousarray(rows)
    return widen_f32(rows)


def fused_infer_attention_score(args: FusedInferAttentionArgs) -> FusedInferAttentionOutputs:
    """emu implementation of both FIA names (:mod:`ascend_emu.ops.fused_infer_attention_score`).

    Args:
        args: validated arguments (every slot the lengths need in range).

    Returns:
        ``(attention_out, softmax_lse)``: ``args.out_shape`` in the query dtype; fp32
        ``args.lse_shape``.
    """
    if args.quantised:
        return _finish(args, *_c8_attention(args))
    if args.full_quant is not None:
        return _finish(args, *_full_quant_attention(args))
    qdt = args.query_dtype
    is_bf16 = qdt == BF16
    q = _tokens_first(args.query, args.query_layout, args.num_heads)  # [T, N, D]
    key, value = _dense_tokens(args)
    t_size, n, d = q.shape
    dr = D_ROPE if args.rope else 0  # the no-rope form: D = 192 (nope | rope concatenated by the caller)
    dv = args.value_dim
    group, kv_n = args.group, args.num_kv_heads
    out = np.full((t_size, n, dv), EMPTY_ROW_OUTPUT, dtype=np.float32)  # [T, N, Dv] fp32 before the rounding
    lse = np.full((t_size, n), EMPTY_ROW_LSE, dtype=np.float32)  # [T, N]
    scale = np.float32(args.scale)
    # buffers reused by every (request, kv head) a thread takes: fresh large arrays cost page
    # faults per call
    width_max = max(args.kv_width, 1)
    rows_max = int(args.act_q.max()) * group
    buffers = {}

    def thread_buffers():
        key = threading.get_ident()
        if key not in buffers:
            buffers[key] = (np.empty((width_max, d + dr), np.float32),  # [W, D+64] keys
                            None if value is key and not paged_aq else np.empty((width_max, dv), np.float32),
                            np.empty(max(rows_max * width_max, 1), np.float32))  # scores
        return buffers[key]

    if dr:
        q = np.concatenate([q, _tokens_first(args.query_rope, args.query_layout)], axis=-1)  # [T, N, D+64]
    paged_aq = args.kv_antiquant is not None and args.kv_blocks is not None  # int8 paged caches, decode
    k_aq = args.kv_antiquant[:2] if paged_aq else None
    v_aq = args.kv_antiquant[2:] if paged_aq else None

    def one(unit) -> None:
        (b, nq, tokens, width, kv, row_limits, live), h = unit
        k_buf, v_buf, s_buf = thread_buffers()
        heads = slice(h * group, (h + 1) * group)
        k = k_buf[:width]  # [L, D+64], widened exactly on assignment
        k[:, :d] = _gather(args, key, args.key_layout, kv, width, h, widen=False, antiquant=k_aq)
        if dr:
            k[:, d:] = _gather(args, args.key_rope, args.rope_layout, kv, width, h, widen=False)
        if v_buf is None:
            v = k[:, :d]  # [L, D]: the ckv cache is key and value
        else:
            v = v_buf[:width]
            v[...] = _gather(args, value, args.value_layout, kv, width, h, widen=False, antiquant=v_aq)
        qrows = q[tokens, heads].reshape(-1, d + dr)
        scores = matmul_f32(qrows.astype(np.float32), k.T,
                            out=s_buf[:nq * group * width].reshape(nq * group, width))  # [nq*G, L]
        m = np.empty(scores.shape[0], np.float32)  # [nq*G]
        total = np.empty(scores.shape[0], np.float32)  # [nq*G]
        if args.rule == "band":  # [nq, L]: the positions before each row's band
            masked = (np.arange(width)[None, :] < args.row_starts(nq, int(args.act_kv[b]))[:, None]).view(np.uint8)
        elif args.mask is None:
            masked = _NO_MASK
        else:  # [nq, L]: the request's rows of the explicit mask (token-major rows read row // G)
            masked = np.ascontiguousarray(args.mask[b if args.mask.shape[0] > 1 else 0, :nq, :width]).view(np.uint8)
        sinks = _NO_SINK if args.sink is None else np.tile(args.sink[heads], nq)  # [nq*G]
        launch_rows(_softmax_rows, _softmax_parts, scores.shape[0], scores.shape[1], scores, row_limits, scale,
                    is_bf16, m, total, masked, group, sinks)
        o = matmul_f32(scores, v)  # [nq*G, D]
        o = (o / np.where(live, total, np.float32(1))[:, None]).astype(np.float32)
        _store(out, lse, tokens, heads, o, m, total, live)

    units = [(request, h) for request in _requests(args, group) for h in range(kv_n)]
    costs = [request[1] * group * request[3] for request, _ in units]  # rows x kv positions
    threads = _request_threads(costs, d + dr, SMALL_PRODUCT_MACS)
    with one_blas_thread() if threads > 1 else contextlib.nullcontext():
        side_by_side(one, units, threads, costs)
    return _finish(args, out, lse)


def _full_quant_attention(args: FusedInferAttentionArgs) -> tuple[np.ndarray, np.ndarray]:
    """v1's int8 full quant (steps Q1-Q8 of the op module), per request and query head in NumPy:
    fp32 ``out`` ``[T, N, D]`` holding fp16 values and ``lse`` ``[T, N]`` (empty rows as
    :func:`_store` leaves them). The int8 products are summed exactly (float64 BLAS: every partial
    sum of an int8 dot with D <= 512 is an integer below 2**53)."""
    ds1, qs1, ds2 = args.full_quant
    q = _tokens_first(args.query, args.query_layout, args.num_heads)  # [T, N, D] int8
    key, value = _dense_tokens(args)  # [T2, KV_N, D] int8
    t_size, n, d = q.shape
    out = np.full((t_size, n, d), EMPTY_ROW_OUTPUT, dtype=np.float32)
    lse = np.full((t_size, n), EMPTY_ROW_LSE, dtype=np.float32)
    scale16 = np.float64(np.float16(args.scale))  # Q3: the score scale in fp16
    qs1_16 = np.float64(np.float16(qs1))  # Q6: AscendQuant's fp16 scale
    group = args.group
    for b, nq, tokens, width, kv, row_limits, live in _requests(args, group):
        limits, starts = row_limits[::group], args.row_starts(nq, int(args.act_kv[b]))  # [nq] each
        pos = np.arange(width)[None, :]
        visible = (pos < limits[:, None]) & (pos >= starts[:, None])  # [nq, L]
        if args.mask is not None:
            visible &= ~args.mask[b if args.mask.shape[0] > 1 else 0, :nq, :width]
        chunk = max(1, FULL_QUANT_CHUNK // width)  # query rows per pass: each row's chain is its own
        for h in range(args.num_kv_heads):
            k = key[kv, h].astype(np.float64)  # [L, D] exact
            v = value[kv, h].astype(np.float64)
            for n_i in range(h * group, (h + 1) * group):
                for r0 in range(0, nq, chunk):
                    rows = slice(r0, min(r0 + chunk, nq))
                    o, m, total = _full_quant_rows(q[tokens[rows], n_i], k, v, visible[rows], ds1, scale16, qs1_16,
                                                   ds2)
                    _store(out, lse, tokens[rows], slice(n_i, n_i + 1), o, m, total, live[::group][rows])
    return out, lse


#: Elements of one query-row chunk of the full quant (``[rows, L]`` float64 temporaries).
FULL_QUANT_CHUNK = 1 << 20


def _full_quant_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, ds1: float,
                     scale16: np.float64, qs1_16: np.float64, ds2: float):
    """Steps Q1-Q8 for query rows ``q`` int8 ``[R, D]`` of one head against ``k`` / ``v`` (float64
    holding the int8 values, ``[L, D]``), ``visible`` bool ``[R, L]``: ``(o, m, total)``, fp32
    ``[R, D]`` holding fp16 values, fp32 ``[R]`` each (rows with no visible position: garbage,
    dropped by the caller)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        dots = q.astype(np.float64) @ k.T  # Q1: exact int32 dots [R, L]
        s16 = (dots * ds1).astype(np.float16)  # Q2: fixpipe dequant, one RNE rounding
        s = (s16.astype(np.float64) * scale16).astype(np.float16).astype(np.float32)  # Q3
        s = np.where(visible, s, np.float32(-np.inf))
        m = s.max(axis=1)  # [R] fp32
        e = _exp_rows(s - m[:, None])  # Q5: fp32 exp, 0 where not visible
        total = np.cumsum(e, axis=1, dtype=np.float32)[:, -1]  # fp32, kv order
        p16 = (e.astype(np.float16).astype(np.float64) * qs1_16).astype(np.float16)  # Q6
        p8 = saturate_int8(round_half_even(p16.astype(np.float32)))
        o16 = ((p8.astype(np.float64) @ v) * ds2).astype(np.float16)  # Q7
        l16 = f32_to_f16(total, "half_away").astype(np.float64)  # Q8: the sum in fp16, CAST_ROUND
        o = (o16.astype(np.float64) / l16[:, None]).astype(np.float16).astype(np.float32)
    return o, m, total


def _exp_rows(x: np.ndarray) -> np.ndarray:
    """fp32 ``exp(x)`` (x fp32, -inf -> 0), evaluated in float64 and rounded once, as
    :func:`~ascend_emu.emu.sparse_flash_attention._exp_f64`."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


def output_quant(out: np.ndarray, scale: np.ndarray, offset) -> np.ndarray:
    """Step Q9, Ascend C's AscendQuant of the op's output: ``int8(fp16(fp16(fp16(x) * fp16(scale))
    + fp16(offset)))``, each fp16 step RNE, the last cast RNE saturating to [-128, 127].

    Args:
        out: fp32 ``[T, N, D]`` before the output rounding; scale, offset: fp32 ``[N, D]``
            (offset None: 0).

    Returns:
        int8 ``[T, N, D]``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        x = out.astype(np.float16).astype(np.float32)
        y = (x * scale.astype(np.float16).astype(np.float32)).astype(np.float16)  # exact fp32 product, one rounding
        if offset is not None:
            y = (y.astype(np.float32) + offset.astype(np.float16).astype(np.float32)).astype(np.float16)
        return saturate_int8(round_half_even(y.astype(np.float32)))


def output_quant_950(out: np.ndarray, scale: np.ndarray, offset, name: str) -> np.ndarray:
    """Step Q10, the Ascend 950's post-quant to an 8-bit float: ``cast(fp32(fp32(x * scale) +
    offset))``, FP8 RNE unsaturated (:func:`ascend_emu.quant.to_fp8`), HiFloat8 nearest, ties
    away (:func:`ascend_emu.quant.to_hif8`; the hardware's CAST_HYBRID is stochastic).

    Args:
        out: fp32 ``[T, N, D]`` before the output rounding; scale, offset: fp32 ``[N, D]``
            (offset None: none added); name: ``'float8_e4m3fn'``, ``'float8_e5m2'`` or ``'hifloat8'``.

    Returns:
        ``[T, N, D]``: an ml_dtypes FP8 array, or uint8 HiFloat8 codes.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        y = out * scale  # fp32 product, one rounding
        if offset is not None:
            y = y + offset
    return to_hif8(y) if name == "hifloat8" else to_fp8(y, name, saturate=False)


def _finish(args: FusedInferAttentionArgs, out: np.ndarray, lse: np.ndarray) -> FusedInferAttentionOutputs:
    """fp32 ``out`` ``[T, N, D]`` and ``lse`` ``[T, N]`` (token-major) -> the op's outputs: one RNE
    rounding to ``args.out_dtype`` (with an output quant: :func:`output_quant`, or
    :func:`output_quant_950` for v2's 8-bit float types), the output / lse
    layouts."""
    t_size, n, d = out.shape
    if args.quant_out is not None and args.quant_out_type != "int8":
        rounded = output_quant_950(out, *args.quant_out, args.quant_out_type)  # [T, N, D] fp8 / hif8 codes
    elif args.quant_out is not None:
        rounded = output_quant(out, *args.quant_out)  # [T, N, D] int8
    else:
        rounded = out.astype(args.out_dtype)  # one RNE rounding, [T, N, D]
    packed = args.query_layout in ("TND", "NTD")
    if not packed:
        rounded = rounded.reshape(args.batch, args.seq_q, n, d)  # [B, S1, N, D]
    layout = args.out_layout
    if layout == "BNSD":
        rounded = rounded.transpose(0, 2, 1, 3)
    elif layout == "NBSD":
        rounded = rounded.transpose(2, 0, 1, 3)
    elif layout == "NTD":
        rounded = rounded.transpose(1, 0, 2)
    elif layout == "NSD":  # B = 1
        rounded = rounded[0].transpose(1, 0, 2)
    attention_out = np.ascontiguousarray(rounded).reshape(args.out_shape)
    if not args.softmax_lse_flag:
        return FusedInferAttentionOutputs(attention_out, np.empty(0, dtype=np.float32))
    if packed:
        lse_out = lse.reshape(t_size, n, 1)
    else:
        lse_out = lse.reshape(args.batch, args.seq_q, n).transpose(0, 2, 1)[..., None]  # [B, N, S1, 1]
    return FusedInferAttentionOutputs(attention_out, np.ascontiguousarray(lse_out))
