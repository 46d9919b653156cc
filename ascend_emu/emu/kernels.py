"""Numba kernels shared by the emu backend: the kernels' RmsNorm, RoPE, the row scatter into caches.

Numerics (docs/sources.md#rope, docs/sources.md#rms_norm; docs/numerics.md#accumulation): everything in fp32, no fused
multiply-add (no ``fastmath``); bf16 rounding is :mod:`ascend_emu.quant.rounding`'s RNE on
``uint16`` bits. Kernels take already-validated arguments: slots reaching :func:`scatter_rows`
are in range.
"""

from __future__ import annotations

import contextvars
import os
import sys
import threading
from typing import NamedTuple

import numba
import numpy as np
from numba import njit, prange

from ..layouts import CacheLayout

from ..mla import D_ROPE as ROPE_DIM
from ..quant import INT8_MAX, INT8_MIN
from ..quant.rounding import bf16_bits_to_f32, f16_bits_to_f32, f32_bits_to_bf16_bits, f32_bits_to_f16_bits
_HALF = ROPE_DIM // 2


def kernel_input(x: np.ndarray) -> np.ndarray:
    """``x`` as the Numba kernels are compiled for it: a plain, C-contiguous, writable ndarray in
    native byte order; ``x`` itself when it is one already, else a copy.

    Numba types a read-only, strided or subclass array differently, so without this the first
    call with one compiles a new specialisation of every kernel it reaches (seconds each); with
    it one compiled signature serves every caller. The kernels only read these inputs.
    """
    if type(x) is np.ndarray and x.flags.c_contiguous and x.flags.writeable and x.dtype.isnative:
        return x
    return np.array(x, dtype=x.dtype.newbyteorder("="), order="C", subok=False)


def bits16(x: np.ndarray) -> np.ndarray:
    """A bf16 / fp16 array as the uint16 bits the kernels read (:func:`kernel_input`: a view when
    ``x`` is a plain C-contiguous writable array, else a copy)."""
    return kernel_input(x.view(np.uint16))


# ---------------------------------------------------------------------- threads
#: Fewest scalar elements one parallel range processes (about 30-100 us of vector work): waking a
#: thread and joining it costs tens of microseconds (more on a loaded machine), so smaller work
#: runs on the calling thread, and more threads never split work finer than this.
ELEMENTS_PER_PART = 1 << 16


def parallel_parts(items: int, elements_per_item: int) -> int:
    """How many contiguous ranges to split ``items`` independent rows into: 1 (run serially)
    below two ranges of :data:`ELEMENTS_PER_PART` or in a :func:`side_by_side` task, else one
    per thread (at most), each at least that large."""
    parts = items * elements_per_item // ELEMENTS_PER_PART
    if parts < 2 or getattr(_task, "serial", False):
        return 1
    return max(1, min(numba.get_num_threads(), parts, items))


_task = threading.local()
_pool = None
_pool_key = None


def side_by_side(fn, items: list, threads: int, costs: list | None = None) -> None:
    """``fn(item)`` for every item, split into ``min(threads, len(items))`` contiguous runs of about
    equal total ``costs`` (default: equal counts) that Python threads take side by side (the
    calling thread one of them); returns when all are done, raising the first error. For work
    whose compiled kernels release the GIL. Inside a run, :func:`parallel_parts` is 1 (every Numba
    kernel runs serially: the ``workqueue`` layer must not be entered from two Python threads at
    once) and torch, where imported, uses one thread on that Python thread (its count is kept per
    thread); the caller runs OpenBLAS on one thread around it (a process-wide setting). Called
    inside a run, it runs its items there, one after the other.

    The worker threads are one pool per process (made again in a ``fork``'s child, which inherits
    a pool without threads)."""
    parts = min(threads, len(items))
    if parts <= 1 or getattr(_task, "serial", False):  # inside a run: no nested split (the pool's
        for item in items:  # threads could all be waiting on it)
            fn(item)
        return
    if costs is None:
        cuts = [len(items) * i // parts for i in range(parts + 1)]
    else:
        edges = np.cumsum(np.asarray(costs, dtype=np.float64))  # [items]
        cuts = [0] + [int(np.searchsorted(edges, edges[-1] * i / parts, side="right")) for i in range(1, parts)]
        cuts.append(len(items))
    torch = sys.modules.get("torch")
    if torch is not None:
        # torch gives a thread its count on the thread's first use, from the last count set by
        # any thread: read it here before a worker sets 1, or this thread would keep 1
        torch.get_num_threads()

    def run(lo: int, hi: int) -> None:
        before = getattr(_task, "serial", False)
        _task.serial = True
        torch_threads = torch.get_num_threads() if torch is not None else 1
        if torch_threads > 1:
            torch.set_num_threads(1)
        try:
            for item in items[lo:hi]:
                fn(item)
        finally:
            _task.serial = before
            if torch_threads > 1:
                torch.set_num_threads(torch_threads)

    pool = _worker_pool(parts - 1)
    # each worker runs in a copy of the caller's context (the deterministic mode's scope, the backend)
    futures = [pool.submit(contextvars.copy_context().run, run, cuts[i], cuts[i + 1])
               for i in range(1, parts) if cuts[i] < cuts[i + 1]]
    try:
        run(cuts[0], cuts[1])
    finally:
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


def _worker_pool(workers: int):
    """The process's pool of at least ``workers`` threads for :func:`side_by_side` (made once per
    process, and again where more workers are asked for: the old one's threads end)."""
    global _pool, _pool_key
    if _pool_key is None or _pool_key[0] != os.getpid() or _pool_key[1] < workers:
        from concurrent.futures import ThreadPoolExecutor

        if _pool is not None and _pool_key[0] == os.getpid():
            _pool.shutdown(wait=False)
        _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ascend_emu")
        _pool_key = (os.getpid(), workers)
    return _pool


def launch_rows(rows_fn, parts_fn, tokens: int, elements_per_token: int, *operands) -> None:
    """Run a ``*_rows`` kernel over all tokens: serially, or as ``*_parts`` over contiguous token
    ranges when :func:`parallel_parts` finds enough work per thread. Every
    token is computed alone, so the result does not depend on the split."""
    parts = parallel_parts(tokens, elements_per_token)
    if parts > 1:
        parts_fn(parts, *operands)
    else:
        rows_fn(0, tokens, *operands)


# ---------------------------------------------------------------------- int8
@njit(cache=True, inline="always")
def round_to_int8(x):
    """One fp32 value to int8: round half to even, saturate to [-128, 127]; NaN -> 0
    (kv_rms_norm_rope_cache ``RoundFloat2Int8``; :func:`~ascend_emu.quant.f32_to_int8` element-wise)."""
    if x != x:
        return np.int8(0)
    r = np.rint(x)
    if r > INT8_MAX:
        return np.int8(INT8_MAX)
    if r < INT8_MIN:
        return np.int8(INT8_MIN)
    return np.int8(r)


# ---------------------------------------------------------------------- bf16 / fp16 rows
@njit(cache=True, inline="always")
def widen_row(bits, out, is_bf16):
    """``out[i]`` = fp32 value of the bf16 / fp16 bits ``bits[i]`` (exact). The dtype test sits outside
    the element loops so that each loop is branch-free (twice as fast)."""
    if is_bf16:
        for i in range(out.shape[0]):
            out[i] = bf16_bits_to_f32(bits[i])
    else:
        for i in range(out.shape[0]):
            out[i] = f16_bits_to_f32(bits[i])


@njit(cache=True, inline="always")
def narrow_row(x, out, is_bf16):
    """``out[i]`` = bf16 / fp16 bits of fp32 ``x[i]``, RNE."""
    if is_bf16:
        for i in range(out.shape[0]):
            out[i] = f32_bits_to_bf16_bits(np.float32(x[i]).view(np.uint32))
    else:
        for i in range(out.shape[0]):
            out[i] = f32_bits_to_f16_bits(np.float32(x[i]).view(np.uint32))


# ---------------------------------------------------------------------- RmsNorm
#: fp32 lanes of one vector repeat (256 bytes): the width of every kernel's square-sum.
LANES = 64

#: How the lane sums of the squares are formed (the lanes then go through :func:`lane_tree_sum`).
#: ``LANES_IN_ORDER``: lane ``l`` adds ``x[l]^2, x[64+l]^2, x[128+l]^2, ...`` one repeat after the
#: other (the tail repeat masked to its first lanes): one vector ``Add`` whose repeats accumulate
#: into the same 64-lane buffer. ``LANES_PAIRWISE``: the row is cut into ``2^k`` blocks of
#: ``w = H / 2^k`` lanes, the fewest halvings that leave ``w <= 64``, and the blocks are added
#: pairwise, neighbours first, by halving ``Add`` calls (512: eight blocks of 64,
#: ``((B0+B1)+(B2+B3))+((B4+B5)+(B6+B7))``; 192: four blocks of 48, ``(B0+B1)+(B2+B3)``).
#: ``LANES_PAIRWISE_EIGHTHS``: the same with always three halvings, eight blocks of ``H / 8``
#: (512: as ``LANES_PAIRWISE``; 192: eight blocks of 24). The ``w`` lanes left then go through
#: ``WholeReduceSum`` with a ``w``-lane mask, taken as the 64-lane tree with the masked lanes
#: zero (adding an exact 0.0 to a sum of squares changes nothing) [unverified].
LANES_IN_ORDER = 0
LANES_PAIRWISE = 1
LANES_PAIRWISE_EIGHTHS = 2


class RmsNormOrder(NamedTuple):
    """Where one kernel's RmsNorm rounds (see :func:`rms_norm_row`)."""

    lanes: int  #: LANES_IN_ORDER or LANES_PAIRWISE
    prescale: bool  #: squares times fp32(1/H) before the sum (else the sum times fp32(1/H))
    reciprocal: bool  #: ``x * fp32(1 / rms)`` (else ``x / rms``)


#: npu_mla_prolog v1 / v2 / v3 (ops-transformer ``attention/mla_prolog/op_kernel/arch32/rms_norm.h``
#: L39-L99 @ cannmirror 05c401f: ``Mul`` squares, ``Add`` repeats 1.. into repeat 0 with
#: dstRepStride 0 / src1RepStride 0 (L43-L52), ``WholeReduceSum`` (L54), ``Muls`` reciprocal
#: 1/H (L58; host ``reciprocalCq_ = 1.0f / hcqSize``), ``Adds`` eps (L62), ``Sqrt`` (L66), ``Div``
#: (L87), ``Mul`` gamma (L95), ``Muls`` scale (L99)). MlaPreprocess's kv RmsNorm is the same chain
#: (``mla_preprocess_bf16.h`` L2735-L2751: ``ReduceSumCustom`` L594-L629 from a zeroed lane buffer,
#: scalar ``sqrt(sum / 512 + eps)``, ``Div``, ``Mul`` gamma).
MLA_PROLOG_RMS = RmsNormOrder(LANES_IN_ORDER, prescale=False, reciprocal=False)
#: MlaPreprocess's kv RmsNorm: the chain of :data:`MLA_PROLOG_RMS` (sources there).
MLAPO_KV_RMS = MLA_PROLOG_RMS
#: npu_kv_rmsnorm_rope_cache, every cache mode (``posembedding/kv_rms_norm_rope_cache/op_kernel/
#: kv_rms_norm_rope_cache_b16_pa_nz_quant.h`` L426-L458 and the same code in ``*_b16_pa.h``,
#: ``*_pa_bnsd_quant.h``, ``*_pa_blk_*.h``, ``*_b1sd.h``, ``*_mtp.h``: three ``Add`` calls with
#: dstRepStride 8, srcRepStride 16 halve 512 -> 256 -> 128 -> 64, then ``WholeReduceSum``,
#: ``Muls`` reciprocal, ``Adds`` eps, ``Sqrt``, ``Div``, ``Mul`` gamma). Its K/V-split mode (``v``
#: given, 192-wide rows: ``RmsNormV2`` in ``*_b16_mtp.h``, ``*_b16_mtp_quant.h``, ``*_b16_pa.h``,
#: ``*_b16_b1sd.h`` and every ``*_quant.h`` @ hicann/ops-nn b927bff ``norm/kv_rms_norm_rope_cache``)
#: halves 192 -> 96 -> 48 with a 48-lane mask (dstRepStride 6, srcRepStride 12), then
#: ``WholeReduceSum`` over 48 lanes: the same rule.
KV_CACHE_RMS = RmsNormOrder(LANES_PAIRWISE, prescale=False, reciprocal=False)
#: npu_kv_rmsnorm_rope_cache, non-quant PA_BLK_NZ (tiling key 4000, ``*_b16_pa_blk_nz.h``
#: ``RmsNormV2`` @ hicann/ops-nn b927bff): three halvings with a 24-lane mask (dstRepStride 3,
#: srcRepStride 6), 192 -> 96 -> 48 -> 24, then ``WholeReduceSum`` over 24 lanes. For 512-wide
#: rows this is :data:`KV_CACHE_RMS` (eight blocks of 64 either way).
KV_CACHE_BLK_NZ_RMS = RmsNormOrder(LANES_PAIRWISE_EIGHTHS, prescale=False, reciprocal=False)
#: MlaPreprocess RmsNormQuant (``attention/mla_preprocess/op_kernel/mla_preprocess_bf16.h`` L830-L856,
#: ``mla_preprocess_fp16.h`` L641-L671): ``Muls(sqx, avg_factor)`` (1/H, L834) before
#: ``ReduceSumCustom`` (L836), ``Adds`` eps, ``Sqrt``, scalar ``factor = 1 / rms`` (L843),
#: ``Muls`` factor (L846), ``Mul`` gamma (L853); beta is the caller's.
MLAPO_QUANT_RMS = RmsNormOrder(LANES_IN_ORDER, prescale=True, reciprocal=True)


@njit(cache=True, inline="always")
def lane_tree_sum(lanes):
    """``WholeReduceSum`` of 64 fp32 lanes (in place): neighbours first, ``v[i] = v[2i] + v[2i+1]``
    over 32, 16, ..., 1 pairs; returns ``v[0]``.

    The binary-tree order the AscendC reduction docs give for one repeat (``ReduceSum`` /
    ``BlockReduceSum``: "data0 + data1, data2 + data3, ..."); the ``WholeReduceSum`` page itself
    states no order [unverified].
    """
    w = LANES // 2
    while w >= 1:
        for i in range(w):
            lanes[i] = lanes[2 * i] + lanes[2 * i + 1]
        w //= 2
    return lanes[0]


@njit(cache=True, inline="always")
def pairwise_width(h, lanes_order):
    """Lanes ``w`` a pairwise order leaves of an ``H``-wide row (:data:`LANES_PAIRWISE`: the fewest
    halvings to ``w <= 64``; :data:`LANES_PAIRWISE_EIGHTHS`: ``H / 8``); 0 when ``H`` does not halve
    exactly down to a whole number of 32-byte blocks (``w`` a multiple of 8) of at most 64 lanes."""
    w = h
    if lanes_order == LANES_PAIRWISE_EIGHTHS:
        for _ in range(3):
            if w % 2:
                return 0
            w //= 2
    else:
        while w > LANES and w % 2 == 0:
            w //= 2
    if w > LANES or w < 8 or w % 8:
        return 0
    return w


@njit(cache=True, inline="always")
def _halve_blocks(sq, h, w):
    """``sq[:h]`` as ``h / w`` blocks of ``w`` lanes, added neighbour to neighbour in place until one
    block is left (in ``sq[:w]``)."""
    nblk = h // w
    while nblk > 1:
        nblk //= 2
        for j in range(nblk):
            a = 2 * j * w
            b = a + w
            o = j * w
            for l in range(w):
                sq[o + l] = sq[a + l] + sq[b + l]


@njit(cache=True, inline="always")
def square_sum(x, lanes_order, prescale, inv_h, sq, lanes):
    """The kernels' fp32 sum of ``x[i]^2`` (``* inv_h`` per square first when ``prescale``).

    Args:
        x: fp32 ``[H]``; a pairwise order needs ``pairwise_width(H) > 0`` (512, 192, ...).
        lanes_order: ``LANES_IN_ORDER``, ``LANES_PAIRWISE`` or ``LANES_PAIRWISE_EIGHTHS``.
        prescale: multiply each square by ``inv_h`` before summing.
        inv_h: fp32 ``1/H``.
        sq: fp32 scratch ``[H]`` (pairwise orders only; ``[0]`` otherwise).
        lanes: fp32 scratch ``[64]``.
    """
    h = x.shape[0]
    reps = h // LANES
    if lanes_order != LANES_IN_ORDER:
        w = pairwise_width(h, lanes_order)
        for i in range(h):
            q = x[i] * x[i]
            sq[i] = q * inv_h if prescale else q
        # the kernels' widths as constants: the compiler vectorises the in-place halving only then
        if w == LANES:
            _halve_blocks(sq, h, LANES)
        elif w == 48:
            _halve_blocks(sq, h, 48)
        elif w == 24:
            _halve_blocks(sq, h, 24)
        else:
            _halve_blocks(sq, h, w)
        for l in range(w):
            lanes[l] = sq[l]
        for l in range(w, LANES):  # masked lanes of WholeReduceSum
            lanes[l] = 0.0
    else:
        for l in range(LANES):
            lanes[l] = 0.0
        for r in range(reps):
            base = r * LANES
            for l in range(LANES):
                q = x[base + l] * x[base + l]
                if prescale:
                    q = q * inv_h
                lanes[l] = q + lanes[l]
        base = reps * LANES
        for l in range(h - base):  # the tail repeat, masked to its first lanes
            q = x[base + l] * x[base + l]
            if prescale:
                q = q * inv_h
            lanes[l] = q + lanes[l]
    return lane_tree_sum(lanes)


@njit(cache=True, inline="always")
def rms_norm_row(x, gamma, eps, scale, lanes_order, prescale, reciprocal, sq, lanes, out):
    """One row of the kernels' RmsNorm in fp32 (no fused multiply-add):

    ``ss = square_sum(x)`` (:func:`square_sum`, 64 lanes then :func:`lane_tree_sum`);
    ``ms = ss * fp32(1/H)`` (or ``ss`` itself when ``prescale`` already scaled the squares);
    ``rms = sqrt(ms + eps)``; ``out = x / rms * gamma * scale`` or, with ``reciprocal``,
    ``x * fp32(1 / rms) * gamma * scale``. ``scale`` is v3's qc_qr_scale / kc_scale, 1.0
    elsewhere (a multiply by 1.0 is exact). The kernel variants are :data:`MLA_PROLOG_RMS`,
    :data:`MLAPO_KV_RMS`, :data:`KV_CACHE_RMS`, :data:`KV_CACHE_BLK_NZ_RMS`, :data:`MLAPO_QUANT_RMS`
    (sources there).

    Args:
        x, gamma: fp32 ``[H]``; eps, scale: fp32.
        lanes_order, prescale, reciprocal: the fields of an :class:`RmsNormOrder`.
        sq, lanes: fp32 scratch, see :func:`square_sum`.
        out: fp32 ``[H]`` (may not alias ``x``).
    """
    h = x.shape[0]
    inv_h = np.float32(np.float32(1.0) / np.float32(h))
    ss = square_sum(x, lanes_order, prescale, inv_h, sq, lanes)
    ms = ss if prescale else ss * inv_h
    rms = np.sqrt(ms + eps)
    if reciprocal:
        f = np.float32(np.float32(1.0) / rms)
        for i in range(h):
            out[i] = x[i] * f * gamma[i] * scale
    else:
        for i in range(h):
            out[i] = x[i] / rms * gamma[i] * scale


@njit(cache=True)
def _rms_norm_rows(lo, hi, x, gamma, eps, scale, lanes_order, prescale, reciprocal, out):
    sq = np.empty(x.shape[1] if lanes_order != LANES_IN_ORDER else 1, dtype=np.float32)
    lanes = np.empty(LANES, dtype=np.float32)
    for t in range(lo, hi):
        rms_norm_row(x[t], gamma, eps, scale, lanes_order, prescale, reciprocal, sq, lanes, out[t])


@njit(cache=True, parallel=True)
def _rms_norm_parts(parts, x, gamma, eps, scale, lanes_order, prescale, reciprocal, out):
    n = x.shape[0]
    for p in prange(parts):
        _rms_norm_rows(p * n // parts, (p + 1) * n // parts, x, gamma, eps, scale, lanes_order, prescale, reciprocal,
                       out)


@njit(cache=True, parallel=True)
def _square_sums_2d(x, lanes_order, prescale, out):
    inv_h = np.float32(np.float32(1.0) / np.float32(x.shape[1]))
    for t in prange(x.shape[0]):
        sq = np.empty(x.shape[1] if lanes_order != LANES_IN_ORDER else 1, dtype=np.float32)
        lanes = np.empty(LANES, dtype=np.float32)
        out[t] = square_sum(x[t], lanes_order, prescale, inv_h, sq, lanes)


def _check_order(h: int, order: RmsNormOrder) -> None:
    if order.lanes != LANES_IN_ORDER and not pairwise_width(h, order.lanes):
        raise ValueError(f"pairwise RmsNorm needs H = w * 2^k halving down to w <= 64 lanes, w a multiple of 8 "
                         f"(512, 192, ...), got H={h}")


def square_sums(x: np.ndarray, order: RmsNormOrder) -> np.ndarray:
    """The sums of squares :func:`rms_norm` forms (:func:`square_sum`), one per row.

    Args:
        x: fp32 ``[T, H]``.
        order: an :class:`RmsNormOrder` (``prescale``: of ``x^2 * fp32(1/H)``).

    Returns:
        fp32 ``[T]``.

    Raises:
        ValueError: a pairwise order with an H it cannot halve (an internal misuse).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    _check_order(x.shape[-1], order)
    out = np.empty(x.shape[0], dtype=np.float32)
    _square_sums_2d(x, order.lanes, order.prescale, out)
    return out


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float, order: RmsNormOrder, scale: float = 1.0) -> np.ndarray:
    """RmsNorm over the last axis in fp32, in one kernel's order (:func:`rms_norm_row`).

    Args:
        x: fp32 ``[T, H]`` (a pairwise order: H halving down to <= 64 lanes, e.g. 512 or 192).
        gamma: fp32 ``[H]``.
        eps: epsilon (rounded to fp32).
        order: an :class:`RmsNormOrder` (:data:`MLA_PROLOG_RMS`, :data:`KV_CACHE_RMS`, ...).
        scale: extra multiplier applied last (v3 ``qc_qr_scale`` / ``kc_scale``).

    Returns:
        fp32 ``[T, H]``.

    Raises:
        ValueError: a pairwise order with an H it cannot halve (an internal misuse).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    _check_order(x.shape[-1], order)
    out = np.empty_like(x)
    operands = (x, np.ascontiguousarray(gamma, dtype=np.float32), np.float32(eps), np.float32(scale), order.lanes,
                order.prescale, order.reciprocal, out)
    parts = parallel_parts(x.shape[0], x.shape[1])
    if parts > 1:
        _rms_norm_parts(parts, *operands)
    else:
        _rms_norm_rows(0, x.shape[0], *operands)
    return out


# ---------------------------------------------------------------------- RoPE
@njit(cache=True, inline="always")
def rope_row(x, cos, sin, deinterleave, out):
    """RoPE of one 64-element row in fp32 (docs/sources.md#rope).

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


@njit(cache=True)
def _rope_rows(lo, hi, x, cos, sin, deinterleave, out):
    for t in range(lo, hi):
        for n in range(x.shape[1]):
            rope_row(x[t, n], cos[t], sin[t], deinterleave, out[t, n])


@njit(cache=True, parallel=True)
def _rope_parts(parts, x, cos, sin, deinterleave, out):
    n = x.shape[0]
    for p in prange(parts):
        _rope_rows(p * n // parts, (p + 1) * n // parts, x, cos, sin, deinterleave, out)


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
    operands = (x3, np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32),
                deinterleave, out)
    parts = parallel_parts(x3.shape[0], x3.shape[1] * ROPE_DIM)
    if parts > 1:
        _rope_parts(parts, *operands)
    else:
        _rope_rows(0, x3.shape[0], *operands)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------- scatter
@njit(cache=True, inline="always")
def _scatter_token(cache, rows, slot, src, nz, block_size, row_words, chunk):
    """Copy row ``src`` of ``rows`` to ``slot`` of the cache (all sizes in copy words).

    ND: the row is contiguous at ``slot * row_words``. NZ (docs/sources.md#paged_nz): ``row_words / chunk``
    chunks of 32 bytes; chunk ``j`` of slot ``blk * block_size + r`` starts at
    ``blk * block_size * row_words + j * block_size * chunk + r * chunk`` (the same offsets as
    :meth:`~ascend_emu.layouts.CacheLayout.chunk_offsets`)."""
    if nz:
        blk = slot // block_size
        base = blk * block_size * row_words + (slot - blk * block_size) * chunk
        for j in range(row_words // chunk):
            dst = base + j * block_size * chunk
            off = j * chunk
            for k in range(chunk):
                cache[dst + k] = rows[src, off + k]
    else:
        dst = slot * row_words
        for k in range(row_words):
            cache[dst + k] = rows[src, k]


@njit(cache=True, parallel=True)
def _scatter_parallel(cache, rows, slots, keep, nz, block_size, row_words, chunk, parts):
    """:func:`_scatter_token` for tokens ``keep`` over ``parts`` contiguous ranges in parallel."""
    n = keep.shape[0]
    for p in prange(parts):
        for i in range(p * n // parts, (p + 1) * n // parts):
            _scatter_token(cache, rows, slots[keep[i]], keep[i], nz, block_size, row_words, chunk)


@njit(cache=True)
def _scatter_serial(cache, rows, slots, keep, nz, block_size, row_words, chunk):
    for i in range(keep.shape[0]):
        _scatter_token(cache, rows, slots[keep[i]], keep[i], nz, block_size, row_words, chunk)


#: Fewest bytes a thread scatters: below 2 x this a scatter runs on one thread (starting the pool
#: costs more than the copy), above it one range per thread of at least this size, so adding
#: threads never splits a scatter finer than pays.
SCATTER_BYTES_PER_THREAD = 1 << 19


#: Unsigned copy words by size in bytes (:func:`_word_size`).
_WORDS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


def _word_size(nbytes: int, chunk: int, row_bytes: int) -> int:
    """Size in bytes of the widest unsigned word (8, 4, 2 or 1) dividing the cache size, the chunk
    and the row, so chunks are copied as words (a byte loop is ~10x slower for 32-byte NZ chunks).
    Every chunk offset is then a multiple of it too: ND offsets are multiples of the row, NZ
    offsets of the 32-byte chunk (an NZ row is a multiple of 32 bytes)."""
    low = nbytes | chunk | row_bytes
    return 8 if low % 8 == 0 else 4 if low % 4 == 0 else 2 if low % 2 == 0 else 1


def last_writer(slots: np.ndarray) -> np.ndarray:
    """Token indices to write so that each slot is written once, by its last token; -1 skipped.

    Makes scatters deterministic whatever the thread count when tokens share a slot.
    """
    slots = np.asarray(slots).reshape(-1)
    live = np.flatnonzero(slots >= 0)
    if live.size < 2:
        return live
    rev = live[::-1]
    _, first_in_rev = np.unique(slots[rev], return_index=True)
    return np.sort(rev[first_in_rev])


def scatter_rows(cache: np.ndarray, rows: np.ndarray, slots: np.ndarray, layout: CacheLayout, *,
                 keep: np.ndarray | None = None) -> None:
    """Write token rows into a cache in place, where ``layout`` puts them.

    Below two threads' worth of bytes (:data:`SCATTER_BYTES_PER_THREAD`) the tokens are copied
    on the calling thread in token order, so a slot written by several tokens ends with the last
    one without a :func:`last_writer` pass; larger scatters write each slot once, from
    ``last_writer(slots)``, over contiguous token ranges in parallel. Both write the same bytes.

    Args:
        cache: the C-contiguous cache array (any dtype; treated as raw bytes).
        rows: ``[T, heads * dim]`` values of the cache's element type (or their raw bytes,
            ``uint8 [T, row_bytes]``).
        slots: int64 ``[T]`` validated slots; -1 skips the token; for a slot written by several
            tokens the last one wins.
        layout: the cache's :class:`~ascend_emu.layouts.CacheLayout`.
        keep: int64 ``last_writer(slots)`` when the caller already has it (several caches, same
            slots).
    """
    t = rows.shape[0]
    if t == 0:
        return
    raw = np.ascontiguousarray(rows).reshape(t, -1)  # [T, row] in the rows' own element type
    row_bytes, chunk = raw.nbytes // t, layout.chunk_bytes
    w = _word_size(cache.nbytes, chunk, row_bytes)
    word = _WORDS[w]
    flat, src = cache.reshape(-1).view(word), raw.view(word)  # flat shares memory with cache; w divides the row
    slots = np.asarray(slots).reshape(-1)  # [T]
    geometry = (layout.nz, layout.block_size, row_bytes // w, chunk // w)
    if keep is None and row_bytes * t < 2 * SCATTER_BYTES_PER_THREAD:
        _scatter_in_order(flat, src, slots, *geometry)
        return
    keep = last_writer(slots) if keep is None else keep
    parts = row_bytes * keep.size // SCATTER_BYTES_PER_THREAD
    if parts > 1:
        parts = min(numba.get_num_threads(), parts)
    if parts > 1:
        _scatter_parallel(flat, src, slots, keep, *geometry, parts)
    elif keep.size:
        _scatter_serial(flat, src, slots, keep, *geometry)


@njit(cache=True)
def _scatter_in_order(cache, rows, slots, nz, block_size, row_words, chunk):
    """:func:`_scatter_token` for every token with a slot >= 0, in token order (a later token
    overwrites an earlier one's slot: the last writer wins without :func:`last_writer`)."""
    for t in range(slots.shape[0]):
        if slots[t] >= 0:
            _scatter_token(cache, rows, slots[t], t, nz, block_size, row_words, chunk)
