"""DeepSeek-V4's ``compressor`` on the CPU (the contract in :mod:`ascend_emu.ops.compressor`).

In the kernel's steps (vllm-ascend ``csrc/attention/compressor/op_kernel/arch32/``:
``compressor_block_vec_perf.h``, ``rms_norm.h``, ``rope.h``, ``soft_max.h``), each an fp32
operation:

1. ``kv = x @ wkv^T``, ``score = x @ wgate^T`` for the call's tokens that are read or written:
   exact products, fp32 accumulation (BLAS sgemm on blocks of :data:`BLOCK_ROWS` weight rows
   widened exactly, :func:`_project`; the NPU's cube sums K in its own tile order: not
   bit-identical); ``score += ape[p % r]``. Both land in one fp32 row per token, ``[kv | score]``:
   the state row's layout;
2. the state rows the groups read are gathered first (the state as it was before the call), the
   call's rows are written after the outputs are computed (the contract rejects a call whose
   reads and writes share a row, so this order is the kernel's result);
3. per group and column: ``m = max_k score_k``, ``e_k = exp(score_k - m)``, ``s = sum_k e_k``
   (sequential over the rows: the overlap half's rows first, then the group's own),
   ``w_k = e_k / s``, ``c = sum_k w_k * kv_k`` (sequential in the same order; each product
   rounded to fp32, then added);
4. RMSNorm: ``ss = sum(c^2)`` (the exact squares summed in float64 in column order, rounded once
   to fp32: the RmsNorm API's lane order is not reproduced),
   ``rstd = 1 / sqrt(ss * fp32(1/D) + eps)``, ``y = c * rstd * w``;
5. RoPE on the last 64 values: ``y * cos + rotate(y) * sin`` (``rotate``: half
   ``[-y[32:], y[:32]]``, interleave ``(-y[2i+1], y[2i])``), two products rounded to fp32 then
   added, as ``rope.h``;
6. one rounding (RNE) to x's dtype; padding rows are zero.

Steps 2, 3 (but ``exp``) and 4-5 run in two compiled passes over a chunk of groups at a time
(:func:`_group_scores`, :func:`_group_rows`: no fused multiply-add, every operation in the order
above; :data:`GROUP_BYTES`); ``exp`` is NumPy's fp32 ``exp`` on the chunk's ``score - m`` between
them. Every group is computed alone, so the chunks do not change the result.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from ..ops.compressor import ROTARY_HALF, CompressorArgs, CompressorOutputs
from ..quant.rounding import to_bf16, to_f32
from .. import _deterministic
from ..layouts import NZArray
from .kernels import kernel_input, widen_row
from .matmul import _blas_threads, matmul_weight, weight_f32, widen_f32

_ROPE = 64


def _round_out(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.float16:
        return v.astype(np.float16)
    return to_bf16(v)


#: Weight rows widened to fp32 at a time (32 x H=4096 x 4 bytes: 512 KiB, within L2), on every
#: path (a kept widening is multiplied by the same blocks). OpenBLAS picks its kernels by shape,
#: so the block width is part of the bits: 256-row blocks took about 10 % less time at T = 256
#: but moved the last bit of some fp32 sums, and so some bf16 outputs, against these.
BLOCK_ROWS = 32


def _project(xs: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """``out[:] = xs [M, H] @ w^T`` in fp32 for a bf16 / fp16 weight ``w [N, H]``: each block of
    :data:`BLOCK_ROWS` weight rows widened exactly (contiguous rows), then one sgemm per block; a
    weight cast to FRACTAL_NZ (:class:`~ascend_emu.layouts.NZArray`: vllm-ascend's linear
    weights with ``weight_nz_mode`` 2) by the same blocks of its widening kept on it
    (:func:`~ascend_emu.emu.matmul.weight_f32`, within the keep limit: the same bits); in the
    deterministic mode the project's fixed-order product (:func:`matmul_weight`)."""
    if _deterministic.enabled():
        out[...] = matmul_weight(xs, w.T)
        return
    with _blas_threads(xs.shape[0] * w.shape[0] * w.shape[1]):
        # cast to FRACTAL_NZ: its widening kept on it (emu.matmul keep limit), multiplied by blocks
        kept = weight_f32(w) if isinstance(w, NZArray) else None
        bits = None if kept is not None else kernel_input(np.asarray(w).view(np.uint16))
        for lo in range(0, w.shape[0], BLOCK_ROWS):
            hi = min(lo + BLOCK_ROWS, w.shape[0])
            if kept is not None:
                block = kept[lo:hi]
            else:
                block = _scratch(hi - lo, w.shape[1])
                _widen_rows(bits[lo:hi], block, w.dtype != np.float16)
            np.matmul(xs, block.T, out=out[:, lo:hi])


_local = threading.local()


def _scratch(rows: int, cols: int) -> np.ndarray:
    """This thread's fp32 ``[rows, cols]`` buffer for a widened weight block, reused by every call
    (a new array per block costs its allocation and page faults each time)."""
    buf = getattr(_local, "block", None)
    if buf is None or buf.size < rows * cols:
        buf = _local.block = np.empty(BLOCK_ROWS * cols, np.float32)
    return buf[:rows * cols].reshape(rows, cols)


@njit(cache=True)
def _widen_rows(bits, out, is_bf16):
    """``out[i] = `` the fp32 values of the bf16 / fp16 bits ``bits[i]`` (exact), row by row."""
    for i in range(bits.shape[0]):
        widen_row(bits[i], out[i], is_bf16)


#: Bytes of ``exp(score - m)`` the group passes fill at a time (a chunk of groups; at least one
#: group: C128A's 128 rows x 512 take 256 KiB), so that the three passes over it run in L2.
GROUP_BYTES = 512 << 10


@njit(cache=True, error_model="numpy")
def _take_max(src, dst, m):
    """``dst[:] = src``; ``m = max(m, src)`` per column, NaN once any is NaN (as ``np.max``)."""
    for j in range(dst.shape[0]):
        v = src[j]
        dst[j] = v
        mj = m[j]
        m[j] = mj if (mj >= v or mj != mj) else v


@njit(cache=True, error_model="numpy")
def _group_scores(proj, state, g_row, g_blk, g_off, r, coff, d, width, e):
    """``e[i, k] = score_k - m`` for every group ``i`` and row ``k`` (``m``: the column max over the
    group's rows, NaN if any is NaN as ``np.max``); a row's score from the call's ``proj`` row
    ``g_row[i, k]``, else from the state row ``(g_blk, g_off)``, else -inf (block -1)."""
    rows = coff * r
    m = np.empty(d, np.float32)
    empty = np.full(d, -np.inf, np.float32)
    for i in range(g_row.shape[0]):
        m[:] = empty
        for k in range(rows):
            c0 = width + (0 if coff == 1 or k < r else d)
            t, b = g_row[i, k], g_blk[i, k]
            if t >= 0:
                _take_max(proj[t, c0:c0 + d], e[i, k], m)
            elif b >= 0:
                _take_max(state[b, g_off[i, k], c0:c0 + d], e[i, k], m)
            else:
                _take_max(empty, e[i, k], m)
        for k in range(rows):
            ek = e[i, k]
            for j in range(d):
                ek[j] = ek[j] - m[j]


@njit(cache=True, error_model="numpy")
def _weigh(ek, s, kv, c):
    """``c += (e_k / s) * kv_k`` per column, each operation rounded to fp32."""
    for j in range(c.shape[0]):
        c[j] = c[j] + (ek[j] / s[j]) * kv[j]


@njit(cache=True, error_model="numpy")
def _group_rows(proj, state, g_row, g_blk, g_off, r, coff, d, e, inv_d, eps, norm_w, cos, sin, half,
                g_out, out):
    """Steps 3-5 of the module doc for every group ``i`` from ``e = exp(score - m)``, into fp32
    ``out[g_out[i]]``."""
    rows = coff * r
    s = np.empty(d, np.float32)
    c = np.empty(d, np.float32)
    zeros = np.zeros(d, np.float32)
    tail = np.empty(64, np.float32)
    h = d - 64
    for i in range(g_row.shape[0]):
        s[:] = zeros
        for k in range(rows):
            ek = e[i, k]
            for j in range(d):
                s[j] = s[j] + ek[j]
        c[:] = zeros
        for k in range(rows):
            c0 = 0 if coff == 1 or k < r else d
            t, b = g_row[i, k], g_blk[i, k]
            if t >= 0:
                _weigh(e[i, k], s, proj[t, c0:c0 + d], c)
            elif b >= 0:
                _weigh(e[i, k], s, state[b, g_off[i, k], c0:c0 + d], c)
            else:
                _weigh(e[i, k], s, zeros, c)
        ss = 0.0
        for j in range(d):
            v = np.float64(c[j])
            ss += v * v
        rstd = np.float32(1) / np.float32(np.sqrt(np.float64(np.float32(ss) * inv_d + eps)))
        y = out[g_out[i]]
        for j in range(d):
            y[j] = (c[j] * rstd) * norm_w[j]
        tail[:] = y[h:]
        ci, si = cos[i], sin[i]
        for j in range(64):
            if half:
                rot = -tail[j + 32] if j < 32 else tail[j - 32]
            else:
                rot = -tail[j + 1] if j % 2 == 0 else tail[j - 1]
            y[h + j] = tail[j] * ci[j] + rot * si[j]


def compressor(args: CompressorArgs) -> CompressorOutputs:
    """The ``compressor`` family (module doc): cmp_kv, and the state rows written in place."""
    a = args
    d, coff, r = a.head_dim, a.coff, a.cmp_ratio
    width = coff * d
    out = np.zeros((int(np.prod(a.out_shape[:-1])), d), np.float32)
    # 1. projections of the tokens that are read or written, one [kv | score] row each
    taken = np.zeros(a.x.shape[0], bool)
    taken[a.group_tok[a.group_tok >= 0]] = True
    taken[a.write_tok] = True
    need = np.flatnonzero(taken)
    proj = np.empty((need.size, 2 * width), np.float32)
    if need.size:
        xs = widen_f32(a.x[need])
        _project(xs, a.wkv, proj[:, :width])
        _project(xs, a.wgate, proj[:, width:])
        proj[:, width:] += a.ape[a.token_pos[need] % r]
    row_of = np.full(a.x.shape[0], -1, np.int64)
    row_of[need] = np.arange(need.size)
    n = a.group_out.size
    if n:
        # 2.-3. the group rows (the state as it was before the call), softmax, weighted sum
        g_row = np.where(a.group_tok >= 0, row_of[np.maximum(a.group_tok, 0)], -1)
        g_blk, g_off, g_out = a.group_blk, a.group_off, kernel_input(a.group_out)
        norm_w = kernel_input(to_f32(a.norm_weight))
        cos, sin = kernel_input(to_f32(a.rope_cos[g_out])), kernel_input(to_f32(a.rope_sin[g_out]))
        half = a.rotary_mode == ROTARY_HALF
        inv_d, eps = np.float32(1.0 / d), np.float32(a.norm_eps)
        step = max(1, GROUP_BYTES // (coff * r * d * 4))  # groups whose exp(score - m) stay in cache
        e = np.empty((min(n, step), coff * r, d), np.float32)
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            eg = e[:hi - lo]
            _group_scores(proj, a.state_cache, g_row[lo:hi], g_blk[lo:hi], g_off[lo:hi], r, coff, d, width, eg)
            np.exp(eg, out=eg)
            # 4.-5. RMSNorm, RoPE on the last 64 values with the output row's table row
            _group_rows(proj, a.state_cache, g_row[lo:hi], g_blk[lo:hi], g_off[lo:hi], r, coff, d, eg, inv_d, eps,
                        norm_w, cos[lo:hi], sin[lo:hi], half, g_out[lo:hi], out)
    # the state rows of the call's tokens (block-0 entries were dropped by the contract)
    if a.write_tok.size:
        a.state_cache[a.write_blk, a.write_off] = proj[row_of[a.write_tok]]
    return CompressorOutputs(_round_out(out, a.out_dtype).reshape(a.out_shape))
