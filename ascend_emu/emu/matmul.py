"""Matmuls of the emu backend: exact widening to fp32, fp32 accumulation (BLAS, or oneDNN's bf16 dot
products for bf16 values); exact int8 products.
Every product of every op goes through this module, so one switch covers them all: in the
deterministic mode (:func:`ascend_emu._deterministic.enabled`, docs/numerics.md#deterministic)
:func:`matmul_f32`, :func:`matmul_weight` and :func:`matmul_weight_heads` run
:func:`fixed_matmul` (fp32 sums in the fixed order of :data:`K_STEP`-deep steps, a compiled loop,
the same bits on every host) and :func:`matmul_int8` a compiled exact int32 loop
(:func:`_int8_fixed`), no BLAS, oneDNN or torch call; the rest of this doc is the default, fast mode.

Numerics (docs/numerics.md#accumulation): bf16 / fp16 inputs are widened exactly to fp32 and
multiplied with fp32 accumulation (sgemm); the caller rounds the result where the kernel does.

bf16 products rounded straight to bf16 (:func:`matmul_bf16_out`, :func:`matmul_bf16_out_heads`):
where the kernel rounds a bf16 x bf16 product's fp32 result straight to bf16 (the Cube's fixpipe
output: the non-quant MLA prolog's four products, MlaPreprocess's ``q_nope @ wuk``), a product of
two bf16 values is exact in fp32, so any engine that sums those products in fp32 and rounds once
is as faithful as sgemm plus rounding; engines differ only in the order of the fp32 sums. Two
engines (:data:`BF16_ENGINES`):

- ``"sgemm"``: :func:`matmul_weight` / :func:`matmul_weight_heads` (the exact widening, fp32
  BLAS), the caller's RNE rounding after;
- ``"onednn-bf16"``: ``torch.matmul`` on bf16 tensors (oneDNN: bf16 multiplies, fp32
  accumulation, one RNE rounding to bf16; no widened copy), only where the process has imported
  torch already (the emulator never loads it on its own).

Which one runs (:data:`BF16_ENGINE_ENV`, :func:`set_bf16_engine`; the deterministic mode always
runs :func:`fixed_matmul`): in the default ``auto`` setting a fixed rule per host
(:func:`_bf16_auto_onednn`): oneDNN where the process has imported torch, the product has at
least :data:`BF16_MIN_ROWS` rows, the operands are safe (below) and the CPU has bf16 dot-product
instructions (:func:`_cpu_has_bf16_dot`: ``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``,
read once; without them oneDNN emulates bf16 and is no faster); sgemm for everything else. The
rule never looks at time, so the engine, and with it the bits, depend on the CPU kind only (as
OpenBLAS's kernels already do), never on the machine's load: a recording and its replay, a CLI
subprocess and Ray workers on one host give the same bits. The ``timed`` setting times both
engines at the first call of a shape's ``(kind, heads, M, K, N, torch threads)`` (products of at
least :data:`BF16_MIN_ROWS` rows with safe operands) and keeps the faster for the process
(:func:`bf16_choices`): faster where the rule guesses wrong, but its bits can change with the
load at that first call. The bf16 dot-product instructions
(``vdpbf16ps``, AMX) treat subnormal inputs as zero and flush subnormal results, so oneDNN only
gets operands it sums exactly as sgemm does (:func:`_bf16_operands_safe`, every call; a
FRACTAL_NZ weight's exponent span is kept on it, as its widening is): every value a bf16 value
(no low fp32 bits), none subnormal, inf or nan, both operands with a nonzero value, the smallest
nonzero magnitudes' exponents summing to at least -112 (each product, and so each nonzero partial
sum, a multiple of at least ``2**-126``: normal) and the largest ones' with ``log2(K)`` to at
most 125 (no sum overflows); anything else runs on sgemm. The results differ from sgemm's in the
order of the sums only: measured at the prolog's shapes 99.95-100 % of bf16 outputs equal to
sgemm plus rounding (docs/performance.md, "A bf16-output engine"); the non-quant prolog on oneDNN
stays inside the fidelity docs/fidelity.md states for it (``tests/test_bf16_engine.py``).
``ASCEND_EMU_BF16_ENGINE=sgemm`` or the deterministic mode give the same bits on every CPU kind.

bf16 products with an fp32 result (:func:`matmul_bf16_f32`): where a bf16 x bf16 product's fp32
result feeds more fp32 math (the V4 shared-KV attentions' ``S = q @ K^T`` and ``round(P) @ K``,
the V3.2 sparse flash attentions' ``q @ K^T`` and ``P @ V``, the lightning indexer's ``q . k``;
not the V4 compressor's projections: on oneDNN its near-exactly rounded bf16 outputs lost that,
and a two-row output failed the 0.005 dual criterion its docs state), the same two engines with
an fp32 output: sgemm
(:func:`matmul_f32`), or ``torch.matmul`` on the fp32 tensors with
``torch.backends.mkldnn.matmul.fp32_precision = "bf16"`` (oneDNN: the operands converted to bf16,
exact for bf16 values, bf16 dot products, fp32 accumulation, fp32 output). torch 2.13 has no
per-call form of it (``mm`` / ``bmm`` / ``addmm`` with ``out_dtype`` are not implemented on the
CPU), so the flag, process-wide, is set and restored around each call under a lock: the
emulator's own calls never see each other's, but torch code the user runs in another Python
thread at that moment would run in bf16 mode too. The same settings (:data:`BF16_ENGINE_ENV`),
the same ``auto`` rule and the same operand check; a caller passes the operands' spans
(:func:`span`) where it multiplies views of one array. Measured at the attentions' and the
compressor's shapes on the AMD Zen 4 host: oneDNN's results do not depend on M (16 to 300 rows),
the weight block or the thread count (1, 2); 99.8-100 % of the attention outputs equal to sgemm's,
the bit-identical shares against float64 the same to three digits (docs/performance.md,
"An fp32-output bf16 engine").

int8 x int8 products (:func:`matmul_int8`) have one contract whatever computes them: the exact
int32 result, as the Cube unit's int32 accumulator holds it (docs/sources.md#npu_mla_prolog_v3: int8 matmuls
are exact integers). The contraction length is bounded so that no int32 sum can wrap
(:data:`INT8_MAX_K`). Three engines give that same result, chosen once per process
(:func:`int8_engine`):

- ``"onednn"``: ``torch._int_mm`` (oneDNN ``gemm_s8s8s32``, int32 accumulation), when the process
  has imported torch already (the emulator never loads it on its own) and the CPU has int8
  dot-product instructions (``avx512_vnni`` / ``avx_vnni`` / ``amx_int8``). The CPU kernel takes
  any M, K, N (no padding: the multiple-of-8 and M > 16 rules are the CUDA kernel's). On a CPU without them oneDNN is exact too but runs a slow generic
  kernel, so it is not chosen there.
- ``"sgemm"``: fp32 BLAS over K-chunks of at most :data:`SGEMM_EXACT_K` = 1024. Every product is
  an integer of magnitude at most ``128 * 128 = 2**14``, so every partial sum of a chunk is an
  integer of magnitude at most ``2**24``, which fp32 holds exactly whatever the summation order
  or FMA use; the chunk results are then summed in int32.
- ``"float64"``: float64 BLAS (every partial sum below ``2**53``); the reference the other two
  are checked against, kept for benchmarks.

Widened weights are kept only up to a fixed total (fp32 copies of every weight took about 100 MB
per layer, 6 GB for DeepSeek-V3.2's 61 layers): a FRACTAL_NZ weight's exact fp32 widening (int8:
the engine's fp32 / float64 widening) is kept on the weight while all kept copies together stay
within :func:`keep_limit` (``ASCEND_EMU_WEIGHT_KEEP_MIB``, default :data:`DEFAULT_KEEP_MIB`; the
first weights a process multiplies, so a one-layer loop runs on kept copies), and is released
with the weight. Every other product, :func:`matmul_weight`, widens a block of the weight's output
columns at a time into a per-thread scratch of :data:`SCRATCH_BYTES` (one buffer per Python
thread, reused by every call) and runs one BLAS call per block, so the memory an op needs does not
grow with the number or size of the weights past that limit. Splitting the output columns leaves every output
element's K-summation to the same BLAS kernel, so the results are bit-identical to one BLAS call
on the whole widened weight, provided every block takes the same OpenBLAS path as the whole product
(measured on the prolog's shapes with OpenBLAS 0.3.31 at 1, 2, 4 and 16 threads; checked by
``tests/test_weight_widening.py``):

- the block width is a multiple of :data:`BLOCK_ALIGN` that divides the column count (no ragged
  last block: OpenBLAS's ``gemv`` handles a tail of columns, and each thread's share of them,
  with other kernels than whole groups);
- for two or more rows, every block's ``M * N * K`` stays above :data:`BLAS_SMALL_MNK` where the
  whole product's does (OpenBLAS runs products at or below it on a small-matrix kernel that sums
  in another order).

Where no width meets both, the whole weight is widened at once into a temporary freed after the
call (never kept). int8 products are exact whatever the split. ND weights (``weight_uk``) are
widened a run of heads at a time into the same scratch (:func:`matmul_weight_heads`, 32 heads
of ``[128, 512]``, 256 KiB each): read on every call, so a weight written in place is
always seen. The price of a weight past the limit is the widening on every call
(compiled row passes, about 0.3 ns per element on one core): decode-sized calls (T = 1) take up to
about 1.9x what they take on kept copies, T = 16 calls about the same (docs/performance.md,
"Widened weights").
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import warnings
import weakref
from itertools import pairwise

import numpy as np
from numba import njit, prange

from .. import _deterministic, _threads
from .._env import getenv
from ..errors import ModeError
from ..layouts import NZArray
from ..quant import BF16, to_f32
from .kernels import kernel_input, launch_rows, side_by_side

@njit(cache=True)
def _widen_bf16_bits(bits, out):
    """``out[i] = bits[i] << 16`` (uint16 -> uint32, 1-D): the fp32 bits of bf16 values, one pass."""
    for i in range(bits.shape[0]):
        out[i] = np.uint32(bits[i]) << np.uint32(16)


def widen_f32(w: np.ndarray) -> np.ndarray:
    """:func:`~ascend_emu.quant.to_f32` (exact) with one allocation for bf16 (``bits << 16``; the
    first widening of a large weight is mostly page faults of new memory) and less per-call work
    for small arrays: a plain C-contiguous writable bf16 array is widened in one compiled pass,
    any other in place by NumPy (same bits)."""
    if w.dtype == BF16:
        if type(w) is np.ndarray and w.flags.c_contiguous and w.flags.writeable:
            out = np.empty(w.shape, dtype=np.uint32)
            _widen_bf16_bits(w.reshape(-1).view(np.uint16), out.reshape(-1))
            return out.view(np.float32)
        out = w.view(np.uint16).astype(np.uint32)
        np.left_shift(out, np.uint32(16), out=out)
        return out.view(np.float32)
    return to_f32(w)


#: Bytes of each Python thread's scratch for widened weight blocks (module doc).
SCRATCH_BYTES = 8 << 20
#: Column blocks of :func:`matmul_weight` are multiples of this width (module doc).
BLOCK_ALIGN = 64
#: OpenBLAS runs a product with ``M * N * K`` at most this on its small-matrix kernel (module doc).
BLAS_SMALL_MNK = 100**3
_local = threading.local()


def _scratch(count: int, dtype) -> np.ndarray:
    """``count`` elements of ``dtype`` in this thread's scratch (a temporary where they do not fit)."""
    nbytes = count * np.dtype(dtype).itemsize
    if nbytes > SCRATCH_BYTES:
        return np.empty(count, dtype=dtype)
    buf = getattr(_local, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = _local.buf = np.empty(SCRATCH_BYTES, dtype=np.uint8)
    return buf[:nbytes].view(dtype)


def block_width(m: int, k: int, n: int, itemsize: int = 4) -> int:
    """Columns of an ``[M, K] @ [K, N]`` product widened per BLAS call (module doc): the widest
    multiple of :data:`BLOCK_ALIGN` that divides ``n`` and fits ``k`` rows of ``itemsize`` bytes in
    :data:`SCRATCH_BYTES`, keeping the whole product's side of :data:`BLAS_SMALL_MNK` where
    ``m > 1``; ``n`` itself (the whole weight at once) where none does."""
    if n * k * itemsize <= SCRATCH_BYTES:
        return n
    big = m > 1 and m * n * k > BLAS_SMALL_MNK
    best = n
    for width in range(BLOCK_ALIGN, n, BLOCK_ALIGN):
        if width * k * itemsize > SCRATCH_BYTES:
            break
        if n % width == 0 and (not big or m * width * k > BLAS_SMALL_MNK):
            best = width
    return best


@njit(cache=True, nogil=True)
def _bf16_cols_rows(r0, r1, bits, lo, hi, out):
    """Rows ``r0:r1`` of ``out[k, j] = bits[k, lo + j] << 16``: the fp32 bits of a column block
    of a bf16 weight (uint16 ``[K, N]`` -> uint32 ``[K, hi - lo]``)."""
    for k in range(r0, r1):
        src = bits[k, lo:hi]
        dst = out[k]
        for j in range(src.shape[0]):
            dst[j] = np.uint32(src[j]) << np.uint32(16)


@njit(cache=True, parallel=True)
def _bf16_cols_parts(parts, bits, lo, hi, out):
    n = bits.shape[0]
    for p in prange(parts):
        _bf16_cols_rows(p * n // parts, (p + 1) * n // parts, bits, lo, hi, out)


@njit(cache=True, nogil=True)
def _int_cols_rows(r0, r1, src, lo, hi, out):
    """Rows ``r0:r1`` of ``out[k, j] = src[k, lo + j]`` (int8 -> fp32 / fp64, exact)."""
    for k in range(r0, r1):
        row = src[k, lo:hi]
        dst = out[k]
        for j in range(row.shape[0]):
            dst[j] = row[j]


@njit(cache=True, parallel=True)
def _int_cols_parts(parts, src, lo, hi, out):
    n = src.shape[0]
    for p in prange(parts):
        _int_cols_rows(p * n // parts, (p + 1) * n // parts, src, lo, hi, out)


def _fill_block(w: np.ndarray, lo: int, hi: int, out: np.ndarray) -> None:
    """Write the exact widening of ``w[:, lo:hi]`` into ``out`` (``[K, hi - lo]``, C-contiguous):
    bf16 and int8 in compiled passes (rows split across threads where that pays,
    :func:`~ascend_emu.emu.kernels.launch_rows`), other dtypes (fp16, fp8) by NumPy."""
    if w.dtype == BF16:
        launch_rows(_bf16_cols_rows, _bf16_cols_parts, w.shape[0], hi - lo, w.view(np.uint16), lo, hi,
                    out.view(np.uint32))
    elif w.dtype == np.int8:
        launch_rows(_int_cols_rows, _int_cols_parts, w.shape[0], hi - lo, w, lo, hi, out)
    else:
        np.copyto(out, w[:, lo:hi], casting="unsafe")  # fp16, fp8: exact in fp32


#: Environment variable: MiB of widened FRACTAL_NZ weights kept for reuse, all weights together
#: (default :data:`DEFAULT_KEEP_MIB`; 0: none kept, every call widens blocks).
KEEP_ENV = "ASCEND_EMU_WEIGHT_KEEP_MIB"
#: Default of :data:`KEEP_ENV`: a few layers of DeepSeek-V3.2's prolog weights in fp32 (about
#: 100-400 MB a layer), never the model.
DEFAULT_KEEP_MIB = 1024
_keep_lock = threading.Lock()
_kept_bytes = 0


def keep_limit() -> int:
    """Bytes of widened weights that may be kept (:data:`KEEP_ENV`, read at every call).

    Raises:
        ModeError: the variable is set to something other than an int >= 0.
    """
    text = getenv(KEEP_ENV, "")
    if not text:
        return DEFAULT_KEEP_MIB << 20
    try:
        mib = int(text)
    except ValueError:
        mib = -1
    if mib < 0:
        raise ModeError(f"{KEEP_ENV}: expected an int >= 0 (MiB), got {text!r}")
    return mib << 20


def kept_bytes() -> int:
    """Bytes of widened weights kept now (at most :func:`keep_limit` when each was kept)."""
    return _kept_bytes


def _release(nbytes: int) -> None:
    global _kept_bytes
    with _keep_lock:
        _kept_bytes -= nbytes


def _kept(w, dtype) -> np.ndarray | None:
    """The exact widening of FRACTAL_NZ weight ``w`` ``[K, N]`` to ``dtype``, kept on the weight
    (as torch_npu keeps the NZ copy of a cast tensor): the one made earlier, or a new one where
    the kept total stays within :func:`keep_limit`; None for other weights, or past the limit
    (the caller then widens blocks). A kept copy is released with its weight. Read only."""
    if not isinstance(w, NZArray) or w.ndim != 2 or w.dtype == dtype:
        return None
    attr = f"_ascend_emu_{np.dtype(dtype).name}"
    wide = getattr(w, attr, None)
    if wide is not None:
        return wide
    nbytes = w.size * np.dtype(dtype).itemsize
    global _kept_bytes
    with _keep_lock:
        if _kept_bytes + nbytes > keep_limit():
            return None
        _kept_bytes += nbytes
    wide = np.empty(w.shape, dtype=dtype)
    _fill_block(np.asarray(w), 0, w.shape[1], wide)
    wide.flags.writeable = False
    setattr(w, attr, wide)
    weakref.finalize(w, _release, nbytes)
    return wide


#: Products of at most this many multiply-adds (``M * N * K`` of one sgemm / sgemv) run on one
#: OpenBLAS thread: below it, waking OpenBLAS's sleeping worker (``ascend_emu._threads``: idle
#: workers sleep within a millisecond of a call's end) costs more than the worker saves. Measured on a quiet
#: 2-core machine (``benchmarks/bench_blas_threads.py --threads 2``, each product after a 0.5 ms
#: pause): two threads take 1.10x one thread's time for ``[16, 128] x [128, 512]`` (1M, the
#: prolog's per-head ``q_nope @ W_uk`` at T = 16), 0.74-0.80x from 4M (``[1, 7168] x [7168, 576]``,
#: ``[64, 128] x [128, 512]``) and 0.60-0.66x from 11M. The same bits: OpenBLAS splits a product's
#: rows or columns between threads, never K (docs/ops.md, "BLAS thread count").
SMALL_PRODUCT_MACS = 1 << 21


class _OneBlasThread:
    """``with one_blas_thread():`` OpenBLAS runs on one thread inside, its thread count restored
    after (``ascend_emu._threads.BLAS_THREADS``; nothing where OpenBLAS was not found)."""

    __slots__ = ("saved",)

    def __enter__(self):
        pairs = _threads.BLAS_THREADS
        self.saved = saved = [get() for get, _ in pairs]
        for (_, put), n in zip(pairs, saved, strict=True):
            if n > 1:
                put(1)
        return self

    def __exit__(self, *exc):
        for (_, put), n in zip(_threads.BLAS_THREADS, self.saved, strict=True):
            if n > 1:
                put(n)


def one_blas_thread() -> _OneBlasThread:
    """A context in which OpenBLAS runs on one thread (a process-wide setting: a NumPy product
    another Python thread runs meanwhile also gets one thread; its results are the same)."""
    return _OneBlasThread()


_NO_CONTEXT = contextlib.nullcontext()


def _blas_threads(macs: int):
    """The context a product of ``macs`` multiply-adds (one sgemm / sgemv) runs in: one OpenBLAS
    thread at most :data:`SMALL_PRODUCT_MACS`, else OpenBLAS's own count."""
    return _OneBlasThread() if macs <= SMALL_PRODUCT_MACS and _threads.BLAS_THREADS else _NO_CONTEXT


def matmul_weight(a: np.ndarray, w: np.ndarray, *, widen=None, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ w`` in fp32 (BLAS sgemm) on the kept widening of a FRACTAL_NZ weight, or on a weight
    widened a block of columns at a time into this thread's scratch (module doc): the same bits as
    ``matmul_f32(a, widen_f32(w))`` either way.

    Args:
        a: fp32 ``[M, K]`` (any strides BLAS takes).
        w: ``[K, N]`` bf16 / fp16 / fp32 (NZ or ND, any strides), or a weight ``widen`` decodes.
        widen: ``widen(lo, hi, dst)`` writes the fp32 values of columns ``lo:hi`` into ``dst``
            ``[K, hi - lo]`` (for weights that need more than a cast: HiF8 codes, MX block scales);
            default the exact widening of ``w``'s dtype.
        out: fp32 ``[M, N]`` to write into (default a new array).

    Returns:
        fp32 ``[M, N]``.
    """
    m, k, n = a.shape[0], w.shape[0], w.shape[1]
    mm = fixed_matmul if _deterministic.enabled() else np.matmul
    if widen is None:
        kept = _kept(w, np.float32)
        if kept is not None:
            with _blas_threads(m * k * n):
                return mm(a, kept, out=out)
    w = np.asarray(w)
    if w.dtype == np.float32 and widen is None:
        with _blas_threads(m * k * n):
            return mm(a, w, out=out)
    if out is None:
        out = np.empty((m, n), dtype=np.float32)
    if not (m and n and k):
        out[...] = 0  # an empty product: no block to widen (an empty sum is 0)
        return out
    width = block_width(m, k, n)
    block = _scratch(k * width, np.float32).reshape(k, width)
    fill = widen or (lambda lo, hi, dst: _fill_block(w, lo, hi, dst))
    with _blas_threads(m * k * n):
        for lo in range(0, n, width):
            fill(lo, lo + width, block)
            mm(a, block, out=out[:, lo:lo + width])
    return out


#: Bytes of widened weight one run of :func:`matmul_weight_heads` heads takes: the scratch (32
#: heads of ``[128, 512]``). Measured on 2 cores, N = 128: runs of 1 / 4 / 8 / 32 heads took 2.5 /
#: 1.7 / 1.5 / 1.3 ms at T = 1 on one thread (0.7-0.8 ms on two from 8 heads), 6.4 / 5.6 / 5.4 /
#: 5.4 ms at T = 16: fewer, larger calls.
HEAD_RUN_BYTES = SCRATCH_BYTES


def matmul_weight_heads(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per head ``h``: ``a[h] @ w[h]``: ``a`` fp32 ``[N, M, K]``, ``w`` ``[N, K, D]`` bf16 / fp16 /
    fp32 (``weight_uk``); fp32 ``[N, M, D]``, the bits of ``np.matmul(a, widen_f32(w))`` (one
    batched sgemm over the whole widened weight).

    The weight is widened a run of heads at a time (:data:`HEAD_RUN_BYTES`) into the thread's
    scratch (read on every call, so a weight written in place is always seen), and each run
    multiplied by one ``np.matmul`` on its heads. Where one head's product is at most
    :data:`SMALL_PRODUCT_MACS` it runs on one OpenBLAS thread, and the heads are split into as
    many contiguous ranges as OpenBLAS had threads, taken side by side by Python threads
    (:func:`_head_parts`, :func:`~ascend_emu.emu.kernels.side_by_side`: decode-sized products are
    too small for OpenBLAS to split, so the heads are); every head is still one single-threaded
    product, the same bits."""
    n, m = a.shape[0], a.shape[1]
    out = np.empty((n, m, w.shape[2]), dtype=np.float32)
    if _deterministic.enabled():  # one compiled call per run of heads (its own threads), no BLAS
        _heads_range(a, w, out, 0, n, fixed_matmul)
        return out
    with _blas_threads(m * w.shape[1] * w.shape[2]) as ctx:  # once for all heads, not per head
        parts = _head_parts(ctx, n)
        cuts = [n * i // parts for i in range(parts + 1)]
        side_by_side(lambda r: _heads_range(a, w, out, r[0], r[1]), list(pairwise(cuts)), parts)
    return out


def _heads_range(a, w, out, lo: int, hi: int, mm=np.matmul) -> None:
    """Heads ``lo:hi`` of :func:`matmul_weight_heads`, a run of heads at a time, each run one
    ``mm`` call (``np.matmul``, or :func:`fixed_matmul` in the deterministic mode)."""
    k, d = w.shape[1], w.shape[2]
    run = max(1, HEAD_RUN_BYTES // max(1, k * d * 4))
    for h0 in range(lo, hi, run):
        h1 = min(hi, h0 + run)
        mm(a[h0:h1], _heads_f32(w, h0, h1), out=out[h0:h1])


def _heads_f32(w: np.ndarray, h0: int, h1: int) -> np.ndarray:
    """Heads ``h0:h1`` of ``w`` ``[N, K, D]`` as fp32 ``[h1 - h0, K, D]``: ``w`` itself for fp32, else
    the exact widening in this thread's scratch (valid until the thread's next widening)."""
    heads = w[h0:h1]
    if heads.dtype == np.float32:
        return heads
    k, d = w.shape[1], w.shape[2]
    wide = _scratch((h1 - h0) * k * d, np.float32).reshape(h1 - h0, k, d)
    # a read-only or strided weight as the kernel is compiled for it (a copy of these heads only):
    # one signature of _fill_block for every caller
    heads = kernel_input(heads)
    _fill_block(heads.reshape(-1, d), 0, d, wide.reshape(-1, d))  # [H * K, D] rows, one pass
    return wide


def _head_parts(ctx, heads: int) -> int:
    """Python threads for :func:`matmul_weight_heads`: 1 unless its products run on one OpenBLAS
    thread (``ctx`` a :class:`_OneBlasThread`) that OpenBLAS had more of; then OpenBLAS's count,
    at most one per head."""
    if not isinstance(ctx, _OneBlasThread) or heads < 2:
        return 1
    return min(max(ctx.saved, default=1), heads)


def weight_f32(w: np.ndarray) -> np.ndarray:
    """The fp32 values of a bf16 / fp16 / fp32 weight as the products use them: a FRACTAL_NZ
    weight's kept widening (made now where the limit allows, :func:`keep_limit`), else a new copy
    (:func:`widen_f32`). Read only."""
    kept = _kept(w, np.float32)
    return kept if kept is not None else widen_f32(np.asarray(w))


def matmul_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` with fp32 inputs and fp32 accumulation (BLAS sgemm); batch dims broadcast.
    ``out``: an fp32 C-contiguous array of the result's shape to write into (a reused buffer).
    Products of at most :data:`SMALL_PRODUCT_MACS` multiply-adds each run on one OpenBLAS thread."""
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    if _deterministic.enabled():
        return fixed_matmul(a, b, out=out)
    macs = a.shape[-1] * (a.shape[-2] if a.ndim > 1 else 1) * (b.shape[-1] if b.ndim > 1 else 1)
    with _blas_threads(macs):
        return np.matmul(a, b, out=out)


# ---------------------------------------------------------------------- bf16 x bf16 -> bf16
#: The engines of :func:`matmul_bf16_out` / :func:`matmul_bf16_out_heads` (module doc, "bf16
#: products rounded straight to bf16").
BF16_ENGINES = ("sgemm", "onednn-bf16")
#: Environment variable choosing them (read at every call): ``auto`` or unset (the fixed rule of
#: :func:`_bf16_auto_onednn`), ``timed`` (timed per shape, kept for the process), ``sgemm`` (always
#: the exact widening + sgemm), ``onednn-bf16`` (oneDNN wherever torch is loaded and the operands
#: allow it, any size and CPU; for tests and benchmarks).
BF16_ENGINE_ENV = "ASCEND_EMU_BF16_ENGINE"
_BF16_SETTINGS = ("auto", "timed") + BF16_ENGINES
#: CPU flags (``/proc/cpuinfo``) of the bf16 dot-product instructions oneDNN's bf16 GEMM uses.
_BF16_DOT_FLAGS = ("avx512_bf16", "amx_bf16")
#: Timed rounds per engine when the ``timed`` setting meets a new shape (after one untimed call
#: of each: oneDNN kernel creation, the kept widening, first touch; the engines take turns, the
#: first of a round alternating); the fastest call wins. On the shared 2-core machine single calls
#: of one product spread 2-3x (docs/performance.md), so one timed call each could pick wrong.
BF16_CHOICE_ROUNDS = 3
#: In the ``auto`` and ``timed`` settings, products of fewer rows (``M``, tokens) stay on sgemm:
#: measured on 1 and 2 threads (docs/performance.md, "A bf16-output engine"), oneDNN took
#: 1.2-1.7x sgemm's time at T = 1 and paid from T = 16 (1.8-2.9x faster on one thread), and
#: decode-sized products keep the same bits run after run.
BF16_MIN_ROWS = 16
_bf16_setting: str | None = None
_bf16_choices: dict[tuple, str] = {}
_bf16_used: dict[tuple, str] = {}
#: Shapes :func:`bf16_engines_used` remembers at most (forgotten all at once past it).
BF16_USED_KEEP = 4096
_bf16_lock = threading.Lock()
#: Biased-exponent bounds of :func:`_bf16_operands_safe` (module doc): every nonzero partial sum of
#: fp32 products of the operands is a normal fp32 when the smallest nonzero operands' biased
#: exponents sum to at least this (unbiased sum >= -112: each product is a multiple of
#: ``2**(Ea + Ew - 14)`` >= ``2**-126``) ...
BF16_MIN_EXP_SUM = 142
#: ... and no sum of ``K`` products reaches ``2**127`` when the largest operands' biased exponents
#: plus ``ceil(log2(K))`` sum to at most this (``2**(Ea + 1) * 2**(Ew + 1) * K <= 2**127``).
BF16_MAX_EXP_SUM = 379


def bf16_engine_setting() -> str:
    """The setting of the bf16-output engines now: :func:`set_bf16_engine`'s, else
    :data:`BF16_ENGINE_ENV` (``"auto"`` where unset).

    Raises:
        ModeError: the variable is set to something other than ``auto`` / ``timed`` / ``sgemm`` /
            ``onednn-bf16``.
    """
    if _bf16_setting is not None:
        return _bf16_setting
    text = getenv(BF16_ENGINE_ENV, "") or "auto"
    if text not in _BF16_SETTINGS:
        raise ModeError(f"{BF16_ENGINE_ENV}: expected one of {_BF16_SETTINGS} or unset, got {text!r}")
    return text


def set_bf16_engine(name: str | None) -> str | None:
    """Set the bf16-output engines for this process (``"auto"``, ``"timed"``, ``"sgemm"``,
    ``"onednn-bf16"``; None: back to :data:`BF16_ENGINE_ENV`); returns the previous call's setting
    (None where the environment ruled). ``"timed"`` forgets the per-shape choices made so far.

    Raises:
        ValueError: ``name`` not a setting.
        ImportError: ``"onednn-bf16"`` without torch.
    """
    global _bf16_setting
    if name is not None and name not in _BF16_SETTINGS:
        raise ValueError(f"set_bf16_engine: name must be one of {_BF16_SETTINGS} or None, got {name!r}")
    if name == "onednn-bf16":
        _import_torch()
    before = _bf16_setting
    _bf16_setting = name
    if name == "timed":
        with _bf16_lock:
            _bf16_choices.clear()
    return before


def bf16_engines_used() -> dict[tuple, str]:
    """A copy of the engine each bf16-output product shape ran on last where torch was loaded
    (any setting but the deterministic mode's): ``(kind, batch, M, K, N, torch threads)`` ->
    engine name (``kind`` ``"mm"`` or ``"heads"``); for benchmarks and reports."""
    return dict(_bf16_used)


def bf16_choices() -> dict[tuple, str]:
    """A copy of the per-shape choices the ``timed`` setting made so far: ``(kind, batch, M, K, N,
    torch threads)`` -> engine name (``kind`` ``"mm"`` or ``"heads"``)."""
    with _bf16_lock:
        return dict(_bf16_choices)


@njit(cache=True, nogil=True)
def _bf16_span(bits, shift):
    """``(emin, emax, bad)`` over the values of ``bits`` (1-D uint16 bf16 bits with ``shift`` 16,
    or uint32 fp32 bits with ``shift`` 0): the smallest biased exponent of a nonzero value (255
    where none), the largest (0 where none), and whether any value is subnormal, inf / nan, or
    (fp32) not a bf16 value (low 16 bits set). One branch-free pass."""
    emin = np.uint32(255)
    emax = np.uint32(0)
    bad = np.uint32(0)
    for i in range(bits.shape[0]):
        x = np.uint32(bits[i]) << np.uint32(shift)
        e = (x >> np.uint32(23)) & np.uint32(0xFF)
        mant = x & np.uint32(0x7FFFFF)
        emin = min(emin, e if e != 0 else np.uint32(255))
        emax = max(emax, e)
        bad |= np.uint32(e == 255) | np.uint32(e == 0 and mant != 0) | (x & np.uint32(0xFFFF))
    return emin, emax, bad != 0


def _span_of(x: np.ndarray) -> tuple[int, int, bool]:
    """:func:`_bf16_span` of a bf16 or fp32 array (any shape and strides)."""
    x = np.ascontiguousarray(x)
    if x.dtype == BF16:
        return _bf16_span(x.reshape(-1).view(np.uint16), 16)
    return _bf16_span(x.reshape(-1).view(np.uint32), 0)


_SPAN_ATTR = "_ascend_emu_bf16_span"


def _weight_span(w) -> tuple[int, int, bool]:
    """:func:`_span_of` a bf16 weight: kept on a FRACTAL_NZ weight (as its kept widening is, the
    weight is not written in place), computed on every call for any other."""
    if isinstance(w, NZArray):
        span = getattr(w, _SPAN_ATTR, None)
        if span is None:
            span = _span_of(np.asarray(w))
            setattr(w, _SPAN_ATTR, span)
        return span
    return _span_of(np.asarray(w))


def _bf16_operands_safe(a_span, w_span, k: int) -> bool:
    """Whether oneDNN's bf16 product of operands with these spans sums exactly the same fp32
    products as sgemm (module doc): no subnormal, inf / nan or non-bf16 value, no product or
    partial sum below the normal range (the bf16 dot-product instructions flush those to zero)
    and none that overflows; both operands with a nonzero value."""
    (amin, amax, abad), (wmin, wmax, wbad) = a_span, w_span
    if abad or wbad or amax == 0 or wmax == 0:
        return False
    return int(amin) + int(wmin) >= BF16_MIN_EXP_SUM and int(amax) + int(wmax) + max(0, k - 1).bit_length() <= BF16_MAX_EXP_SUM


def _bf16_tensor(torch, x: np.ndarray):
    """A torch bf16 view of bf16 array ``x`` (any positive strides)."""
    return _as_tensor(torch, np.asarray(x).view(np.uint16)).view(torch.bfloat16)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _bf16_run(key: tuple, sgemm, onednn, safe) -> np.ndarray:
    """Run one bf16-output product ``key = (kind, batch, M, K, N)`` on the engine the setting names
    (module doc) and note it (:func:`bf16_engines_used`): ``sgemm()`` / ``onednn()`` compute it;
    ``safe()`` says whether the operands may go to oneDNN."""
    setting = bf16_engine_setting()
    if setting == "sgemm" or not _torch_loaded():
        return sgemm()
    if setting == "auto":
        name = "onednn-bf16" if _bf16_auto_onednn(key[2], safe) else "sgemm"
    elif key[2] < BF16_MIN_ROWS and setting == "timed" or not safe():
        name = "sgemm"
    else:
        name = setting
    torch = _import_torch()
    key = key + (torch.get_num_threads(),)
    if name == "timed":
        name = _bf16_choices.get(key)
        if name is None:
            return _bf16_choose(key, sgemm, onednn)
    if len(_bf16_used) >= BF16_USED_KEEP and key not in _bf16_used:
        _bf16_used.clear()  # a report, not a cache: bounded
    _bf16_used[key] = name
    return onednn() if name == "onednn-bf16" else sgemm()


def _bf16_choose(key: tuple, sgemm, onednn) -> np.ndarray:
    """The ``timed`` setting's first call of a shape: both engines timed, the faster kept."""
    best = {}
    outs = {}
    engines = [("sgemm", sgemm), ("onednn-bf16", onednn)]
    for name, fn in engines:
        outs[name] = fn()  # untimed: kernel creation, kept widening, first touch
    for r in range(BF16_CHOICE_ROUNDS):
        for name, fn in engines[::-1] if r % 2 else engines:
            took, outs[name] = _timed(fn)
            best[name] = min(best.get(name, took), took)
    choice = min(best, key=best.get)
    with _bf16_lock:
        choice = _bf16_choices.setdefault(key, choice)
    _bf16_used[key] = choice
    return outs[choice]


def _bf16_auto_onednn(rows: int, safe) -> bool:
    """The ``auto`` rule (module doc): whether a product of ``rows`` rows runs on oneDNN: at least
    :data:`BF16_MIN_ROWS` rows, a CPU with bf16 dot-product instructions, torch importable and
    ``safe()`` (checked last, as it reads the operands). Depends on the host and the operands only."""
    if rows < BF16_MIN_ROWS or not _cpu_has_bf16_dot():
        return False
    try:
        _import_torch()
    except ImportError:
        return False
    return bool(safe())


def matmul_bf16_out(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a @ w`` of bf16 values whose fp32 result the kernel rounds straight to bf16 (the Cube's
    fixpipe output): fp32 ``[M, N]`` whose RNE rounding to bf16 is that result; the caller rounds
    (a no-op on the oneDNN engine's values). The engine (module doc, "bf16 products rounded
    straight to bf16"): :func:`matmul_weight` (exact widening, sgemm), or ``torch.matmul`` on bf16
    tensors (oneDNN: fp32 accumulation, one rounding) where torch is loaded, the operands are safe
    for the bf16 dot-product instructions (:func:`_bf16_operands_safe`) and the setting's rule
    allows it (``auto``: at least :data:`BF16_MIN_ROWS` rows on a CPU with bf16 dot-product
    instructions; ``timed``: the faster of the two at this shape's first call). Fixed path
    (:func:`fixed_matmul`) in the deterministic mode.

    Args:
        a: fp32 ``[M, K]`` holding bf16 values (any other fp32 value keeps the product on sgemm).
        w: ``[K, N]`` bf16 weight (NZ or ND); another dtype runs :func:`matmul_weight`.

    Returns:
        fp32 ``[M, N]``.

    Raises:
        ModeError: :data:`BF16_ENGINE_ENV` set to an unknown value.
    """
    m, k, n = a.shape[0], w.shape[0], w.shape[1]
    if _deterministic.enabled() or w.dtype != BF16 or not (m and k and n):
        return matmul_weight(a, w)

    def onednn():
        torch = _import_torch()
        ta = torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16)
        return torch.matmul(ta, _bf16_tensor(torch, w)).float().numpy()

    return _bf16_run(("mm", 1, m, k, n), lambda: matmul_weight(a, w), onednn,
                     lambda: _bf16_operands_safe(_span_of(a), _weight_span(w), k))


def matmul_bf16_out_heads(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per head ``h``: ``a[h] @ w[h]`` rounded straight to bf16 by the kernel, as
    :func:`matmul_bf16_out` (the same engines; the weight's span is read on every call, as its
    values are): ``a`` fp32 ``[N, M, K]`` holding bf16 values, ``w`` bf16 ``[N, K, D]``
    (``weight_uk``; another dtype runs :func:`matmul_weight_heads`); fp32 ``[N, M, D]``.

    Raises:
        ModeError: :data:`BF16_ENGINE_ENV` set to an unknown value.
    """
    heads, m, k, d = a.shape[0], a.shape[1], w.shape[1], w.shape[2]
    if _deterministic.enabled() or w.dtype != BF16 or not (heads and m and k and d):
        return matmul_weight_heads(a, w)

    def onednn():
        torch = _import_torch()
        ta = torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16)
        return torch.matmul(ta, _bf16_tensor(torch, w)).float().numpy()

    return _bf16_run(("heads", heads, m, k, d), lambda: matmul_weight_heads(a, w), onednn,
                     lambda: _bf16_operands_safe(_span_of(a), _span_of(w), k))


# ---------------------------------------------------------------------- bf16 x bf16 -> fp32
_fp32_precision_lock = threading.Lock()


def span(x: np.ndarray) -> tuple[int, int, bool]:
    """The exponent span :func:`matmul_bf16_f32` checks an operand with (``(emin, emax, bad)``,
    module doc): of a bf16 or fp32 array, any shape; a caller multiplying views of one array
    (a tile, a transposed view) passes the whole array's span, which bounds every view's."""
    return _span_of(x)


def bf16_engine_may_run(rows: int) -> bool:
    """Whether a bf16 product of ``rows`` rows can run on oneDNN now (the setting, torch loaded,
    the deterministic mode off, the ``auto`` rule's rows and CPU flags; the operands not yet
    looked at): a caller with work to do only for oneDNN (a widened weight, spans) asks first.

    Raises:
        ModeError: :data:`BF16_ENGINE_ENV` set to an unknown value.
    """
    setting = bf16_engine_setting()
    if setting == "sgemm" or _deterministic.enabled() or not _torch_loaded():
        return False
    if setting == "onednn-bf16":
        return True
    return rows >= BF16_MIN_ROWS and (setting == "timed" or _cpu_has_bf16_dot())


def matmul_bf16_f32(a: np.ndarray, b: np.ndarray, *, a_span=None, b_span=None, sgemm=None) -> np.ndarray:
    """``a @ b`` of bf16 values whose fp32 result feeds more fp32 math (attention scores, a
    projection summed further): fp32 ``[..., M, N]``, batch dims as ``np.matmul``. The engine
    (module doc, "bf16 products with an fp32 result"): :func:`matmul_f32` (sgemm; the fixed order
    in the deterministic mode), or ``torch.matmul`` on the fp32 tensors with
    ``torch.backends.mkldnn.matmul.fp32_precision = "bf16"`` (oneDNN: bf16 dot products, fp32
    accumulation, fp32 output; the flag set and restored around the call under a lock) by the
    same settings and rule as :func:`matmul_bf16_out` (:data:`BF16_ENGINE_ENV`).

    Args:
        a: fp32 ``[..., M, K]`` holding bf16 values (any other value keeps the product on sgemm);
            any positive strides.
        b: fp32 ``[..., K, N]`` likewise (a transposed view is not copied).
        a_span, b_span: :func:`span` of ``a`` / ``b`` or of an array they are views of (computed
            here where None).
        sgemm: the product where oneDNN does not run (default :func:`matmul_f32`): a caller whose
            fp32 path multiplies by blocks keeps its bits.

    Returns:
        fp32 ``[..., M, N]`` (C-contiguous).

    Raises:
        ModeError: :data:`BF16_ENGINE_ENV` set to an unknown value.
    """
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = int(np.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), dtype=np.int64))
    if _deterministic.enabled() or a.dtype != np.float32 or b.dtype != np.float32 or not (m and k and n and batch):
        return matmul_f32(a, b) if sgemm is None else sgemm()

    def onednn():
        torch = _import_torch()
        ta, tb = _as_tensor(torch, a), _as_tensor(torch, b)
        mkl = torch.backends.mkldnn.matmul
        with _fp32_precision_lock:
            before = mkl.fp32_precision
            mkl.fp32_precision = "bf16"
            try:
                out = torch.matmul(ta, tb)
            finally:
                mkl.fp32_precision = before
        return out.numpy()

    def safe():
        return _bf16_operands_safe(_span_of(a) if a_span is None else a_span,
                                   _span_of(b) if b_span is None else b_span, k)

    return _bf16_run(("f32", batch, m, k, n), sgemm or (lambda: matmul_f32(a, b)), onednn, safe)


# ---------------------------------------------------------------------- int8 x int8 -> int32
#: Longest contraction :func:`matmul_int8` accepts: ``K * 128 * 128 <= 2**31 - 1``, so no int32
#: sum can wrap whatever the values (the largest is ``K * (-128) * (-128)``).
INT8_MAX_K = (2**31 - 1) // (128 * 128)
#: Longest K-chunk the ``"sgemm"`` engine sums in fp32: ``1024 * 2**14 = 2**24``, the largest
#: magnitude below which fp32 holds every integer (module doc).
SGEMM_EXACT_K = 1024
#: The int8 engines, fastest first where each is available (module doc).
INT8_ENGINES = ("onednn", "sgemm", "float64")
#: CPU flags (``/proc/cpuinfo``) of the int8 dot-product instructions oneDNN's int8 GEMM uses.
_INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
_int8_engine: str | None = None
_torch = None


def _cpu_flags() -> frozenset:
    """The CPU's flags (Linux ``/proc/cpuinfo``, first ``flags`` line; empty where they cannot be
    read), read once per process."""
    global _cpu_flag_set
    if _cpu_flag_set is None:
        flags = frozenset()
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
                for line in info:
                    if line.startswith("flags"):
                        flags = frozenset(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
        _cpu_flag_set = flags
    return _cpu_flag_set


_cpu_flag_set: frozenset | None = None


def _cpu_has_int8_dot() -> bool:
    """Whether the CPU has int8 dot-product instructions (:data:`_INT8_DOT_FLAGS`; False where the
    flags cannot be read)."""
    return any(f in _cpu_flags() for f in _INT8_DOT_FLAGS)


def _cpu_has_bf16_dot() -> bool:
    """Whether the CPU has bf16 dot-product instructions (:data:`_BF16_DOT_FLAGS`; False where the
    flags cannot be read)."""
    return any(f in _cpu_flags() for f in _BF16_DOT_FLAGS)


def _import_torch():
    global _torch
    if _torch is None:
        import torch  # noqa: PLC0415 (only when the oneDNN engine is used)

        _torch = torch
    return _torch


def _torch_loaded() -> bool:
    """Whether the process has imported torch already (the drop-in's users always have); a
    ``sys.modules["torch"] = None`` entry (torch blocked) is not."""
    return sys.modules.get("torch") is not None


def default_int8_engine() -> str:
    """The engine a process uses unless :func:`set_int8_engine` chose one: ``"onednn"`` when the
    CPU has int8 dot-product instructions and the process has imported torch already (the
    emulator never loads torch, and a second OpenMP runtime, on its own), else ``"sgemm"``
    (module doc). Chosen at the first int8 product."""
    if _cpu_has_int8_dot() and _torch_loaded():
        try:
            _import_torch()
            return "onednn"
        except ImportError:
            pass
    return "sgemm"


def int8_engine() -> str:
    """The int8 engine :func:`matmul_int8` uses now (chosen on first use, module doc)."""
    global _int8_engine
    if _int8_engine is None:
        _int8_engine = default_int8_engine()
    return _int8_engine


def set_int8_engine(name: str | None) -> str:
    """Make :func:`matmul_int8` use engine ``name`` (one of :data:`INT8_ENGINES`; None: back to
    :func:`default_int8_engine`); returns the engine used before. All give the same int32 results;
    benchmarks and tests switch them.

    Raises:
        ValueError: ``name`` not an engine.
        ImportError: ``"onednn"`` without torch.
    """
    global _int8_engine
    if name is not None and name not in INT8_ENGINES:
        raise ValueError(f"set_int8_engine: name must be one of {INT8_ENGINES} or None, got {name!r}")
    if name == "onednn":
        _import_torch()
    before = int8_engine()
    _int8_engine = name
    return before


def _int8_blocked(a: np.ndarray, w: np.ndarray, w_nk: bool, dtype) -> np.ndarray:
    """``"sgemm"`` (fp32, K-chunks of at most :data:`SGEMM_EXACT_K`) and ``"float64"`` engines:
    the int8 weight widened to ``dtype`` a block of output columns at a time into this thread's
    scratch (module doc), each block's chunk products summed in int32 (exact)."""
    m, k = a.shape
    n = w.shape[0] if w_nk else w.shape[1]
    chunk = SGEMM_EXACT_K if dtype == np.float32 else k
    out = np.zeros((m, n), dtype=np.int32)
    if not (m and n and k):
        return out  # an empty product: no block to widen (an empty sum is 0)
    a_wide = a.astype(dtype)
    kept = None if w_nk else _kept(w, dtype)
    width = n if kept is not None else block_width(m, k, n, np.dtype(dtype).itemsize)
    block = None if kept is not None else _scratch(k * width, dtype)
    part = np.empty((m, width), dtype=dtype)
    src = np.asarray(w)
    for lo in range(0, n, width):
        if kept is not None:
            wide = kept
        elif w_nk:
            wide = block.reshape(width, k)
            _fill_block(src[lo:lo + width], 0, k, wide)
            wide = wide.T  # [K, width]
        else:
            wide = block.reshape(k, width)
            _fill_block(src, lo, lo + width, wide)
        for c in range(0, k, chunk):
            np.matmul(a_wide[:, c:c + chunk], wide[c:c + chunk], out=part)
            out[:, lo:lo + width] += part.astype(np.int32)  # each chunk exact, |total| < 2**31 (INT8_MAX_K)
    return out


def _as_tensor(torch, x: np.ndarray):
    """A torch view of ``x`` (a copy only where torch cannot view it: negative strides). A read-only
    array is viewed too: ``torch._int_mm`` only reads it (``from_numpy`` would warn)."""
    x = np.asarray(x)
    if any(st < 0 for st in x.strides):
        x = np.ascontiguousarray(x)
    if x.flags.writeable:
        return torch.from_numpy(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


#: int8 products of at most this many multiply-adds run on one torch (OpenMP) thread on the
#: ``"onednn"`` engine (``torch.set_num_threads(1)`` around the call, about 0.3 us, restored after):
#: below it, waking the other threads costs more than they save. Measured on 2 cores with
#: ``npu_fused_infer_attention_score_v2`` C8 (``bench_fused_infer_attention_score.py --c8
#: --threads 2``, B = 64, N = 16, kv 2048: per-block ``[16, 512] x [512, 512]`` (4M) and
#: per-request ``[16, 512] x [512, 2048]`` (17M) products): 75 -> 59 ms per call with this rule and
#: the serial per-block staging (``emu.fused_infer_attention_score._c8_stage``) together. Exact
#: int32 either way.
SMALL_INT8_MACS = 1 << 24


def _int8_onednn(a: np.ndarray, w: np.ndarray, w_nk: bool) -> np.ndarray:
    """``"onednn"`` engine: ``torch._int_mm`` on the int8 operands as they are (no copy of w), on
    one torch thread for products of at most :data:`SMALL_INT8_MACS` multiply-adds."""
    torch = _import_torch()
    tw = _as_tensor(torch, w)
    ta = _as_tensor(torch, np.ascontiguousarray(a))
    tw = tw.T if w_nk else tw
    if ta.shape[0] * ta.shape[1] * tw.shape[1] <= SMALL_INT8_MACS:
        threads = torch.get_num_threads()
        if threads > 1:
            torch.set_num_threads(1)
            try:
                return torch._int_mm(ta, tw).numpy()
            finally:
                torch.set_num_threads(threads)
    return torch._int_mm(ta, tw).numpy()


def matmul_int8(a: np.ndarray, w: np.ndarray, *, w_nk: bool = False) -> np.ndarray:
    """Exact ``int8 a @ int8 w`` as int32, on the engine :func:`int8_engine` names (module doc).

    Args:
        a: int8 ``[M, K]``.
        w: int8 ``[K, N]`` (``[N, K]`` with ``w_nk``: the product is then ``a @ w.T``), any
            strides (the ``"sgemm"`` / ``"float64"`` engines use its kept widening, or widen
            blocks of it, module doc).
        w_nk: ``w`` is stored ``[N, K]``.

    Returns:
        int32 ``[M, N]``, C-contiguous: the exact integer products, identical on every engine.

    Raises:
        ValueError: an operand not int8 2-D, inner dimensions that differ, or ``K`` above
            :data:`INT8_MAX_K` (an int32 sum could wrap).
    """
    a = np.asarray(a)
    for name, x in (("a", a), ("w", w)):
        if x.dtype != np.int8 or x.ndim != 2:
            raise ValueError(f"matmul_int8: {name} must be a 2-D int8 array, got {x.dtype} of shape {tuple(x.shape)}")
    k_w = w.shape[1] if w_nk else w.shape[0]
    if a.shape[1] != k_w:
        where = "w.shape[1]" if w_nk else "w.shape[0]"
        raise ValueError(f"matmul_int8: a.shape[1] must equal the weight's K ({where}), got {a.shape[1]} and {k_w}")
    if a.shape[1] > INT8_MAX_K:
        raise ValueError(f"matmul_int8: K must be at most {INT8_MAX_K} (int32 sums exact), got {a.shape[1]}")
    if _deterministic.enabled():
        return _int8_fixed(a, w, w_nk)
    engine = int8_engine()
    if engine == "onednn":
        return _int8_onednn(a, w, w_nk)
    return _int8_blocked(a, w, w_nk, np.float32 if engine == "sgemm" else np.float64)


# ---------------------------------------------------------------------- deterministic mode
#: Depth of one Cube step of the fixed order (docs/numerics.md#deterministic): the products of
#: ``K_STEP`` consecutive ``k`` are summed in fp32 in ``k`` order from 0, and each step's sum is
#: added to the fp32 accumulator in step order, as the Cube adds one 16-deep fractal (C0 = 16
#: bf16 / fp16 elements, 32 bytes) into L0C per step. With every Mmad's K a multiple of 16,
#: the kernel's K-blocking between Mmad calls gives this same order.
K_STEP = 16
#: Output columns and rows one task of the fixed-order kernel computes (the order of each
#: element's sum does not depend on them: they only let a task reuse each loaded row of ``b``).
FIXED_TILE_N = 128
FIXED_TILE_M = 8


@njit(cache=True, nogil=True)
def _fixed_tasks(t0, t1, a, b, out):
    """Tasks ``t0:t1`` of :func:`fixed_matmul`: task ``t`` is batch ``t // (row blocks * tiles)``,
    rows ``FIXED_TILE_M * (t // tiles % row blocks)`` on, columns ``FIXED_TILE_N * (t % tiles)`` on.
    Per output element: ``acc = 0``; per step of :data:`K_STEP` ``k``: ``part = 0``,
    ``part = fp32(part + fp32(a[k] * b[k]))`` in ``k`` order, ``acc = fp32(acc + part)``. No
    fastmath: every product and sum rounded once (no fused multiply-add, no reassociation);
    vectorised only across columns."""
    m, k, n = a.shape[1], a.shape[2], b.shape[2]
    tiles = (n + FIXED_TILE_N - 1) // FIXED_TILE_N
    blocks = (m + FIXED_TILE_M - 1) // FIXED_TILE_M
    part = np.empty((FIXED_TILE_M, FIXED_TILE_N), dtype=np.float32)
    acc = np.empty((FIXED_TILE_M, FIXED_TILE_N), dtype=np.float32)
    for t in range(t0, t1):
        tile = t % tiles
        blk = t // tiles
        i0 = (blk % blocks) * FIXED_TILE_M
        g = blk // blocks
        h = min(m, i0 + FIXED_TILE_M) - i0
        j0 = tile * FIXED_TILE_N
        w = min(n, j0 + FIXED_TILE_N) - j0
        for r in range(h):
            for j in range(w):
                acc[r, j] = np.float32(0.0)
        for k0 in range(0, k, K_STEP):
            for r in range(h):
                for j in range(w):
                    part[r, j] = np.float32(0.0)
            for kk in range(k0, min(k, k0 + K_STEP)):
                brow = b[g, kk, j0:j0 + w]
                for r in range(h):
                    x = a[g, i0 + r, kk]
                    pr = part[r]
                    for j in range(w):
                        pr[j] = pr[j] + x * brow[j]
            for r in range(h):
                for j in range(w):
                    acc[r, j] = acc[r, j] + part[r, j]
        for r in range(h):
            for j in range(w):
                out[g, i0 + r, j0 + j] = acc[r, j]


@njit(cache=True, parallel=True)
def _fixed_parts(parts, a, b, out):
    blocks = (a.shape[1] + FIXED_TILE_M - 1) // FIXED_TILE_M
    tasks = a.shape[0] * blocks * ((b.shape[2] + FIXED_TILE_N - 1) // FIXED_TILE_N)
    for p in prange(parts):
        _fixed_tasks(p * tasks // parts, (p + 1) * tasks // parts, a, b, out)


def fixed_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` in fp32 in the fixed order of the deterministic mode (:data:`K_STEP`,
    docs/numerics.md#deterministic): the same bits on every host, any thread count (each output
    element is summed by one thread), no BLAS call. Shapes as ``np.matmul`` (1-D operands, batch
    dims broadcast); the operands are converted to fp32 (exact for bf16 / fp16 / int8 values).

    Args:
        a: ``[..., M, K]`` or ``[K]``.
        b: ``[..., K, N]`` or ``[K]``.
        out: fp32 array of the result's shape to write into (default a new array).

    Returns:
        fp32 ``[..., M, N]`` (``out`` where given).

    Raises:
        ValueError: inner dimensions that differ, or batch dims that do not broadcast.
    """
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    m, k = a2.shape[-2], a2.shape[-1]
    if b2.shape[-2] != k:
        raise ValueError(f"fixed_matmul: a's last dim must equal b's K, got {a.shape} and {b.shape}")
    n = b2.shape[-1]
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    a3 = np.ascontiguousarray(np.broadcast_to(a2, batch + (m, k))).reshape(-1, m, k)
    b3 = np.ascontiguousarray(np.broadcast_to(b2, batch + (k, n))).reshape(-1, k, n)
    res = np.empty((a3.shape[0], m, n), dtype=np.float32)
    tasks = a3.shape[0] * -(-m // FIXED_TILE_M) * -(-n // FIXED_TILE_N)
    if tasks:
        work = max(1, min(m, FIXED_TILE_M) * min(n, FIXED_TILE_N) * k)
        launch_rows(_fixed_tasks, _fixed_parts, tasks, work, a3, b3, res)
    res = res.reshape(shape)
    if out is None:
        return res
    out[...] = res
    return out


@njit(cache=True, nogil=True)
def _int8_fixed_rows(r0, r1, a, w, out):
    """Rows ``r0:r1`` of ``out = a @ w`` (int8 ``[M, K]`` x int8 ``[K, N]``), int32 sums (exact)."""
    k, n = a.shape[1], w.shape[1]
    for i in range(r0, r1):
        for j in range(n):
            out[i, j] = 0
        for kk in range(k):
            x = np.int32(a[i, kk])
            for j in range(n):
                out[i, j] += x * np.int32(w[kk, j])


@njit(cache=True, parallel=True)
def _int8_fixed_parts(parts, a, w, out):
    m = a.shape[0]
    for p in prange(parts):
        _int8_fixed_rows(p * m // parts, (p + 1) * m // parts, a, w, out)


@njit(cache=True, nogil=True)
def _int8_fixed_nk_rows(r0, r1, a, w, out):
    """Rows ``r0:r1`` of ``out = a @ w.T`` (int8 ``[M, K]`` x int8 ``[N, K]``), int32 sums (exact)."""
    k, n = a.shape[1], w.shape[0]
    for i in range(r0, r1):
        for j in range(n):
            s = np.int32(0)
            for kk in range(k):
                s += np.int32(a[i, kk]) * np.int32(w[j, kk])
            out[i, j] = s


@njit(cache=True, parallel=True)
def _int8_fixed_nk_parts(parts, a, w, out):
    m = a.shape[0]
    for p in prange(parts):
        _int8_fixed_nk_rows(p * m // parts, (p + 1) * m // parts, a, w, out)


def _int8_fixed(a: np.ndarray, w: np.ndarray, w_nk: bool) -> np.ndarray:
    """The deterministic mode's int8 engine: int32 sums in a compiled loop, no BLAS or oneDNN
    (exact, so the same int32 as every other engine)."""
    a = kernel_input(np.asarray(a))
    w = kernel_input(np.asarray(w))
    m, k = a.shape
    n = w.shape[0] if w_nk else w.shape[1]
    out = np.empty((m, n), dtype=np.int32)
    if w_nk:
        launch_rows(_int8_fixed_nk_rows, _int8_fixed_nk_parts, m, max(1, n * k), a, w, out)
    else:
        launch_rows(_int8_fixed_rows, _int8_fixed_parts, m, max(1, n * k), a, w, out)
    return out
