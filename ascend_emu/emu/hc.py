"""The mHC family on the CPU: ``hc_pre`` (fused, decomposed, its two stages) and ``hc_post``.

NumPy, vectorised over tokens, in row chunks of :data:`CHUNK_TOKENS` (bounded float64
temporaries). Every step after the mixes is one fp32 operation per kernel instruction, in the
kernel's order (vllm-ascend ``csrc/moe/hc_pre/op_kernel/hc_pre_base.h``,
``hc_pre_m_k_split_core.h``; docs/ops.md "mHC"):

- sum of squares: the exact squares summed in float64, rounded once to fp32 (the NPU sums them
  on the cube in fp32 over K tiles split across cores: not bit-identical);
- ``inv_rms``: ``Muls`` by ``fp32(1/K)``, ``Adds`` eps, ``Sqrt``, ``Div`` 1 by it;
- mixes: HF32 operands (:func:`ascend_emu.quant.rounding.hf32_truncate`; exact products in fp32)
  summed in float64 (BLAS), rounded once to fp32 (the cube's fp32 K-tile order is not
  reproduced); in the deterministic mode (docs/numerics.md#deterministic) both sums are fp32
  in the mode's fixed order instead;
- gates: ``mix * inv_rms``, ``* scale``, ``+ base``; ``sigmoid(z) = 1 / (1 + exp(-z))`` as the
  kernel's ``Muls -1, Exp, Adds 1, Div``, with NumPy's fp32 ``exp`` (the vector unit's ``Exp``
  is an approximation: the emulator's ``exp`` is near correctly rounded, so gates may differ
  in the last bits);
- softmax: row max, subtract, ``exp``, row sum, divide, ``+ hc_eps``; row sums (``WholeReduceSum``
  over 4 lanes) taken as the pairwise ``(a0 + a1) + (a2 + a3)`` (unverified), column sums
  (``ReduceSumARA``) sequential over rows 0..3;
- y: ``w[j] * x[j]`` in fp32, summed sequentially over j = 0..3, one RNE rounding to bf16.

``hc_post``: the A2 / A3 kernel (``hc_post_d_split.h``): ``post[i] * x``, then
``+ residual[j] * comb[j, i]`` for j = 0..3, each an fp32 multiply and an fp32 add, one
rounding to x's dtype (RNE); a Numba loop over tokens (parallel), one pass over D.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.hc import HcPostArgs, HcPostOutputs, HcPreArgs, HcPreOutputs
from ..quant.rounding import BF16, hf32_truncate, to_bf16, to_f32
from .. import _deterministic
from .matmul import SMALL_PRODUCT_MACS, matmul_f32, one_blas_thread

#: Tokens per chunk: bounds the float64 copies of x (CHUNK_TOKENS * 4 * 7168 * 8 bytes).
CHUNK_TOKENS = 64
_F1 = np.float32(1.0)


def _tokens(a: np.ndarray, inner: int) -> np.ndarray:
    """``a`` as ``[T, inner...]`` rows (a view of the caller's contiguous array)."""
    return a.reshape((-1, *a.shape[-inner:])) if inner else a.reshape(-1)


def _rows_f64(x_rows: np.ndarray, hf32: bool) -> np.ndarray:
    x32 = to_f32(x_rows)
    return (hf32_truncate(x32) if hf32 else x32).astype(np.float64)


def inv_rms(x_rows: np.ndarray, eps: float) -> np.ndarray:
    """fp32 ``[n]``: ``1 / sqrt(fp32(sum x^2) * fp32(1/K) + eps)`` of ``x_rows [n, K]`` (any
    real dtype; squares summed in float64, then the kernel's fp32 steps)."""
    if _deterministic.enabled():  # squares of bf16 / HF32 values are exact in fp32: the fixed order
        x32 = to_f32(x_rows)
        ss = matmul_f32(x32[:, None, :], x32[:, :, None]).reshape(-1)
    else:
        x64 = to_f32(x_rows).astype(np.float64)
        ss = np.einsum("ij,ij->i", x64, x64).astype(np.float32)
    k = x_rows.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = ss * np.float32(1.0 / np.float32(k))
        r = r + np.float32(eps)
        return _F1 / np.sqrt(r)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _F1 / (np.exp(-z) + _F1)


def _row_sum(c: np.ndarray) -> np.ndarray:
    """Sums over the last axis (4 lanes) as ``(c0 + c1) + (c2 + c3)``, kept as ``[..., 1]``."""
    return ((c[..., 0] + c[..., 1]) + (c[..., 2] + c[..., 3]))[..., None]


def _col_sum(c: np.ndarray) -> np.ndarray:
    """Sums over the row axis, sequential: ``((r0 + r1) + r2) + r3``, kept as ``[..., 1, hc]``."""
    s = c[..., 0, :]
    for i in range(1, c.shape[-2]):
        s = s + c[..., i, :]
    return s[..., None, :]


def stage2(mixes: np.ndarray, rsqrt: np.ndarray, scale: np.ndarray, base: np.ndarray, x_rows: np.ndarray,
           pre_mix: np.ndarray | None, hc: int, iters: int, eps: float) -> tuple:
    """Everything after the mixes, for ``n`` tokens: ``mixes [n, 24]`` fp32, ``rsqrt [n]`` fp32,
    ``x_rows [n, hc, D]`` bf16 -> ``(y bf16 [n, D], post [n, hc], comb [n, hc, hc], pre [n, hc])``."""
    e = np.float32(eps)
    scale = scale.astype(np.float32)
    base = base.astype(np.float32)
    r = rsqrt.astype(np.float32)[:, None]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        pre = _sigmoid((mixes[:, :hc] * r) * scale[0] + base[:hc]) + e
        post = _sigmoid((mixes[:, hc:2 * hc] * r) * scale[1] + base[hc:2 * hc]) * np.float32(2.0)
        c = ((mixes[:, 2 * hc:] * r) * scale[2] + base[2 * hc:]).reshape(-1, hc, hc)
        c = np.exp(c - c.max(axis=-1, keepdims=True))
        c = c / _row_sum(c) + e
        c = c / (_col_sum(c) + e)
        for _ in range(iters - 1):
            c = c / (_row_sum(c) + e)
            c = c / (_col_sum(c) + e)
    w = (pre if pre_mix is None else pre_mix.astype(np.float32))[:, :, None]
    xf = to_f32(x_rows)
    acc = w[:, 0] * xf[:, 0]
    for j in range(1, hc):
        acc = acc + w[:, j] * xf[:, j]
    return to_bf16(acc), post.astype(np.float32), c.astype(np.float32), pre.astype(np.float32)


def hc_pre(args: HcPreArgs) -> HcPreOutputs:
    """The hc_pre family's backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.hc.HcPreArgs`.

    Returns:
        :class:`~ascend_emu.ops.hc.HcPreOutputs` (the stage's outputs; others None).
    """
    lead, x = args.lead, args.x
    hc, d = x.shape[-2], x.shape[-1]
    x_rows = _tokens(x, 2)
    n = x_rows.shape[0]
    if args.stage == "inv_rms":
        out = np.empty(n, dtype=np.float32)
        for a in range(0, n, CHUNK_TOKENS):
            out[a:a + CHUNK_TOKENS] = inv_rms(x_rows[a:a + CHUNK_TOKENS].reshape(-1, hc * d), args.norm_eps)
        return HcPreOutputs(None, None, None, None, out.reshape(*lead, 1))
    y = np.empty((n, d), dtype=BF16)
    post, pre = np.empty((n, hc), np.float32), np.empty((n, hc), np.float32)
    comb = np.empty((n, hc, hc), np.float32)
    pre_mix = None if args.pre_mix is None else _tokens(args.pre_mix, 1)
    if args.stage != "sinkhorn":
        w64 = (hf32_truncate(args.hc_fn) if args.stage == "fused" else args.hc_fn).astype(np.float64).T
    for a in range(0, n, CHUNK_TOKENS):
        rows = x_rows[a:a + CHUNK_TOKENS]
        if args.stage == "sinkhorn":
            mixes = _tokens(args.mixes, 1)[a:a + CHUNK_TOKENS]
            rsqrt = args.inv_rms.reshape(-1)[a:a + CHUNK_TOKENS]
        else:
            flat = rows.reshape(-1, hc * d)
            rsqrt = inv_rms(flat, args.norm_eps)
            a64 = _rows_f64(flat, args.stage == "fused")
            if _deterministic.enabled():  # fp32 products (exact for HF32 operands) in the fixed order
                mixes = matmul_f32(a64.astype(np.float32), w64.astype(np.float32))
            elif a64.shape[0] * a64.shape[1] * w64.shape[1] <= SMALL_PRODUCT_MACS:  # the project's BLAS policy
                with one_blas_thread():
                    mixes = (a64 @ w64).astype(np.float32)
            else:
                mixes = (a64 @ w64).astype(np.float32)
        part = stage2(mixes, rsqrt, args.hc_scale, args.hc_base, rows,
                      None if pre_mix is None else pre_mix[a:a + CHUNK_TOKENS], hc, args.hc_sinkhorn_iters,
                      args.hc_eps)
        y[a:a + CHUNK_TOKENS], post[a:a + CHUNK_TOKENS], comb[a:a + CHUNK_TOKENS], pre[a:a + CHUNK_TOKENS] = part
    return HcPreOutputs(y.reshape(*lead, d), post.reshape(*lead, hc), comb.reshape(*lead, hc, hc),
                        pre.reshape(*lead, hc))


@njit(cache=True, parallel=True)
def _hc_post_rows(x, residual, post, comb, out):
    """``out[n, i] = post[n, i] * x[n]``, then ``+= residual[n, j] * comb[n, j, i]`` for j = 0..hc-1:
    fp32 multiplies and adds (no contraction into FMA: Numba's default), tokens in parallel."""
    n_tok, hc, d = residual.shape
    for n in prange(n_tok):
        for k in range(d):
            xv = x[n, k]
            for i in range(hc):
                acc = post[n, i] * xv
                for j in range(hc):
                    acc = acc + residual[n, j, k] * comb[n, j, i]
                out[n, i, k] = acc


def hc_post(args: HcPostArgs) -> HcPostOutputs:
    """``npu_hc_post``'s backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.hc.HcPostArgs`.

    Returns:
        :class:`~ascend_emu.ops.hc.HcPostOutputs`: residual's shape, x's dtype.
    """
    d = args.x.shape[-1]
    x, residual = to_f32(args.x).reshape(-1, d), to_f32(args.residual)
    hc = residual.shape[-2]
    post, comb = to_f32(args.post).reshape(-1, hc), to_f32(args.comb).reshape(-1, hc, hc)
    out = np.empty(residual.shape, np.float32)
    _hc_post_rows(x, residual.reshape(-1, hc, d), post, comb, out.reshape(-1, hc, d))
    dtype = args.x.dtype
    if dtype == np.float32:
        return HcPostOutputs(out)
    return HcPostOutputs(to_bf16(out) if dtype == BF16 else out.astype(dtype))
