"""DeepSeek-V4's ``compressor`` on the CPU (the contract in :mod:`ascend_emu.ops.compressor`).

NumPy, in the kernel's steps (vllm-ascend ``csrc/attention/compressor/op_kernel/arch32/``:
``compressor_block_vec_perf.h``, ``rms_norm.h``, ``rope.h``, ``soft_max.h``), each an fp32
operation:

1. ``kv = x @ wkv^T``, ``score = x @ wgate^T`` for the call's tokens that are read or written:
   exact products, fp32 accumulation (BLAS sgemm on blocks of weight rows widened exactly,
   :func:`_project`; the NPU's cube sums K in its own tile order: not bit-identical);
   ``score += ape[p % r]``;
2. the state rows the groups read are gathered first (the state as it was before the call), the
   call's rows are written after the outputs are computed (the contract rejects a call whose
   reads and writes share a row, so this order is the kernel's result);
3. per group and column: ``m = max_k score_k``, ``e_k = exp(score_k - m)``, ``s = sum_k e_k``
   (sequential over the rows: the overlap half's rows first, then the group's own),
   ``w_k = e_k / s``, ``c = sum_k w_k * kv_k`` (sequential in the same order; each product
   rounded to fp32, then added);
4. RMSNorm: ``ss = sum(c^2)`` (the exact squares summed in float64, rounded once to fp32: the
   RmsNorm API's lane order is not reproduced), ``rstd = 1 / sqrt(ss * fp32(1/D) + eps)``,
   ``y = c * rstd * w``;
5. RoPE on the last 64 values: ``y * cos + rotate(y) * sin`` (``rotate``: half
   ``[-y[32:], y[:32]]``, interleave ``(-y[2i+1], y[2i])``), two products rounded to fp32 then
   added, as ``rope.h``;
6. one rounding (RNE) to x's dtype; padding rows are zero.
"""

from __future__ import annotations

import numpy as np

from ..ops.compressor import ROTARY_HALF, CompressorArgs, CompressorOutputs
from ..quant.rounding import to_bf16, to_f32
from .. import _deterministic
from .matmul import _blas_threads, matmul_weight

_ROPE = 64


def _round_out(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == np.float16:
        return v.astype(np.float16)
    return to_bf16(v)


def _rotate(y: np.ndarray, mode: int) -> np.ndarray:
    out = np.empty_like(y)
    if mode == ROTARY_HALF:
        half = y.shape[-1] // 2
        out[:, :half] = -y[:, half:]
        out[:, half:] = y[:, :half]
    else:
        out[:, 0::2] = -y[:, 1::2]
        out[:, 1::2] = y[:, 0::2]
    return out


#: Weight rows widened to fp32 at a time (32 x H=4096 x 4 bytes: 512 KiB, within L2).
BLOCK_ROWS = 32


def _project(xs: np.ndarray, w: np.ndarray) -> np.ndarray:
    """fp32 ``xs [M, H] @ w^T`` for a bf16 / fp16 weight ``w [N, H]``: each block of
    :data:`BLOCK_ROWS` weight rows widened exactly (contiguous rows), then one sgemm per block; in
    the deterministic mode the project's fixed-order product (:func:`matmul_weight`)."""
    if _deterministic.enabled():
        return matmul_weight(xs, w.T)
    out = np.empty((xs.shape[0], w.shape[0]), np.float32)
    with _blas_threads(xs.shape[0] * w.shape[0] * w.shape[1]):
        for lo in range(0, w.shape[0], BLOCK_ROWS):
            np.matmul(xs, to_f32(w[lo:lo + BLOCK_ROWS]).T, out=out[:, lo:lo + BLOCK_ROWS])
    return out


def compressor(args: CompressorArgs) -> CompressorOutputs:
    """The ``compressor`` family (module doc): cmp_kv, and the state rows written in place."""
    a = args
    d, coff, r = a.head_dim, a.coff, a.cmp_ratio
    width = coff * d
    out = np.zeros((int(np.prod(a.out_shape[:-1])), d), np.float32)
    # 1. projections of the tokens that are read or written
    need = np.union1d(a.group_tok[a.group_tok >= 0], a.write_tok).astype(np.int64)
    kv = np.zeros((a.x.shape[0], width), np.float32)
    sc = np.zeros((a.x.shape[0], width), np.float32)
    if need.size:
        xs = to_f32(a.x[need])
        kv[need] = _project(xs, a.wkv)
        sc[need] = _project(xs, a.wgate) + a.ape[a.token_pos[need] % r]
    # 2. the state rows the groups read, before anything is written
    n = a.group_out.size
    if n:
        rows = coff * r
        gkv = np.zeros((n, rows, d), np.float32)
        gsc = np.full((n, rows, d), -np.inf, np.float32)
        for k in range(rows):
            cols = slice(0, d) if coff == 1 or k < r else slice(d, 2 * d)
            tok, blk, off = a.group_tok[:, k], a.group_blk[:, k], a.group_off[:, k]
            mine = tok >= 0
            gkv[mine, k] = kv[tok[mine], cols]
            gsc[mine, k] = sc[tok[mine], cols]
            st = blk >= 0
            if st.any():
                rowv = a.state_cache[blk[st], off[st]]
                gkv[st, k] = rowv[:, cols]
                gsc[st, k] = rowv[:, width + cols.start:width + cols.stop]
        # 3. softmax over the group's rows, weighted sum, in row order
        m = gsc.max(axis=1)
        e = np.exp(gsc - m[:, None, :])
        s = np.zeros((n, d), np.float32)
        for k in range(rows):
            s += e[:, k]
        c = np.zeros((n, d), np.float32)
        for k in range(rows):
            c += (e[:, k] / s) * gkv[:, k]
        # 4. RMSNorm
        ss = np.square(c.astype(np.float64)).sum(axis=1).astype(np.float32)
        rstd = np.float32(1) / np.sqrt(ss * np.float32(1.0 / d) + np.float32(a.norm_eps))
        y = c * rstd[:, None] * to_f32(a.norm_weight)[None, :]
        # 5. RoPE on the last 64 values, the output row's table row
        cos = to_f32(a.rope_cos[a.group_out])
        sin = to_f32(a.rope_sin[a.group_out])
        tail = y[:, d - _ROPE:]
        y[:, d - _ROPE:] = tail * cos + _rotate(tail, a.rotary_mode) * sin
        out[a.group_out] = y
    # the state rows of the call's tokens (block-0 entries were dropped by the contract)
    if a.write_tok.size:
        a.state_cache[a.write_blk, a.write_off, :width] = kv[a.write_tok]
        a.state_cache[a.write_blk, a.write_off, width:] = sc[a.write_tok]
    return CompressorOutputs(_round_out(out, a.out_dtype).reshape(a.out_shape))
