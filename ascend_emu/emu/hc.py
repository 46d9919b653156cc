"""The mHC family on the CPU: ``hc_pre`` (fused, decomposed, its two stages) and ``hc_post``.

Two compiled passes per hc_pre call, in the kernel's order after the mixes (vllm-ascend
``csrc/moe/hc_pre/op_kernel/hc_pre_base.h``, ``hc_pre_m_k_split_core.h``; docs/ops.md "mHC"):

- :func:`_mix_rows`, one pass over x's bf16 bits and hc_fn's fp32 bits (HF32 truncation applied
  as the bit mask on the fly: nothing is widened or copied ahead of the pass): the sum of
  squares and the 24 mixes, each the exact products (bf16 x HF32 / fp32 values: exact in
  float64) summed in float64 in an order of the compiler's choosing (blocks of 4 tokens, 2
  mixes per pass over K chunks of :data:`K_CHUNK`; a token outside a block, as in decode, 4
  mixes per pass over its whole row), rounded once to fp32. The NPU sums them on the
  cube in fp32 over K tiles split across cores: not bit-identical. In the deterministic mode
  (docs/numerics.md#deterministic) both sums are fp32 in the mode's fixed order instead;
- :func:`_stage2_rows`, everything after the mixes, one fp32 operation per kernel instruction:
  ``inv_rms`` (``Muls`` by ``fp32(1/K)``, ``Adds`` eps, ``Sqrt``, ``Div`` 1 by it); the gates
  ``mix * inv_rms``, ``* scale``, ``+ base``; ``sigmoid(z) = 1 / (1 + exp(-z))`` as the
  kernel's ``Muls -1, Exp, Adds 1, Div``; softmax: row max, subtract, ``exp``, row sum, divide,
  ``+ hc_eps``; row sums (``WholeReduceSum`` over 4 lanes) taken as the pairwise
  ``(a0 + a1) + (a2 + a3)`` (unverified), column sums (``ReduceSumARA``) sequential over rows
  0..3; y: ``w[j] * x[j]`` in fp32, summed sequentially over j = 0..3, one RNE rounding to
  bf16. ``exp`` is evaluated in float64 and rounded once to fp32 (docs/numerics.md; the
  vector unit's ``Exp`` is an approximation, so gates may differ in the last bits), as a
  written-out polynomial: the same bits on every CPU, in the deterministic mode too.

A single token (a block of at most 4 for the mixes) runs on the calling thread: a parallel
launch costs more than the pass.

``hc_post``: the A2 / A3 kernel (``hc_post_d_split.h``): ``post[i] * x``, then
``+ residual[j] * comb[j, i]`` for j = 0..3, each an fp32 multiply and an fp32 add, one
rounding to x's dtype (RNE); one compiled pass per :data:`POST_CHUNK` values of D: bf16 x
and residual widened in registers (fp16 / fp32 through a widened scratch), the 4 outputs
computed, then rounded into the output; tokens in parallel.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.hc import HcPostArgs, HcPostOutputs, HcPreArgs, HcPreOutputs
from ..quant.rounding import (BF16, HF32_KEEP_MASK, bf16_bits_to_f32, f16_bits_to_f32, f32_bits_to_f16_bits,
                              f32_to_bf16_bits, hf32_truncate, to_f32)
from .. import _deterministic
from .matmul import matmul_f32
from .sparse_flash_attention import _exp_f64

#: Tokens per chunk of the deterministic mode's fp32 copies (CHUNK_TOKENS * 4 * 7168 * 4 bytes).
CHUNK_TOKENS = 64
#: K values per block of :func:`_mix_rows`: 4 tokens' float64 values (32 KiB) stay in L1 / L2.
K_CHUNK = 1024
_F1 = np.float32(1.0)
_NO_MASK = np.uint32(0xFFFFFFFF)
#: Numba flags of the float64 sums: any summation order (``reassoc``; every product is exact in
#: float64, so ``contract`` changes nothing), nothing else of ``fastmath``.
_ANY_ORDER = {"reassoc", "contract"}
#: D values per chunk of the hc_post pass (its fp32 scratch: 9 rows of this, 18 KiB, in L1).
POST_CHUNK = 512
#: dtype codes of the hc_post pass: bf16 bits, fp16 bits, fp32 values.
_BF16, _F16, _F32 = 0, 1, 2


def _tokens(a: np.ndarray, inner: int) -> np.ndarray:
    """``a`` as ``[T, inner...]`` rows (a view of the caller's contiguous array)."""
    return a.reshape((-1, *a.shape[-inner:])) if inner else a.reshape(-1)


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


@njit(cache=True, inline="always")
def _w(wrow, k, mask):
    """float64 value of ``wrow[k]`` (fp32 bits) ``& mask``."""
    return np.float64(np.uint32(wrow[k] & mask).view(np.float32))


@njit(cache=True, inline="always")
def _mix_token(xbits, wbits, mask, mixes, ss, t):
    """:func:`_mix_rows` for token ``t`` alone (a block's tail, decode): x's row widened once to
    fp32, then 4 mixes per pass over it (hc_fn's rows streamed whole)."""
    k_all = xbits.shape[1]
    m = wbits.shape[0]
    xs = np.empty(k_all, np.float32)
    row = xbits[t]
    s = 0.0
    for k in range(k_all):
        v = bf16_bits_to_f32(row[k])
        xs[k] = v
        s += np.float64(v) * np.float64(v)
    ss[t] = np.float32(s)
    for j in range(0, m, 4):
        w0, w1, w2, w3 = wbits[j], wbits[j + 1], wbits[j + 2], wbits[j + 3]
        a0 = a1 = a2 = a3 = 0.0
        for k in range(k_all):
            xv = np.float64(xs[k])
            a0 += xv * _w(w0, k, mask)
            a1 += xv * _w(w1, k, mask)
            a2 += xv * _w(w2, k, mask)
            a3 += xv * _w(w3, k, mask)
        mixes[t, j], mixes[t, j + 1] = np.float32(a0), np.float32(a1)
        mixes[t, j + 2], mixes[t, j + 3] = np.float32(a2), np.float32(a3)


@njit(cache=True, inline="always")
def _mix_block(xbits, wbits, mask, mixes, ss, b):
    """:func:`_mix_rows` for tokens ``4 b .. 4 b + 3`` (compiled with its caller's flags): K in
    chunks of :data:`K_CHUNK`, the 4 tokens' values widened to float64 once per chunk, then 2
    mixes of all 4 tokens per pass over them; a block of fewer tokens runs :func:`_mix_token`."""
    n, k_all = xbits.shape
    m = wbits.shape[0]
    t0 = b * 4
    if n - t0 < 4:
        for t in range(t0, n):
            _mix_token(xbits, wbits, mask, mixes, ss, t)
        return
    xs = np.zeros((4, K_CHUNK))
    acc = np.zeros((4, m))
    sq = np.zeros(4)
    for k0 in range(0, k_all, K_CHUNK):
        kc = min(K_CHUNK, k_all - k0)
        for t in range(4):
            s = 0.0
            row = xbits[t0 + t, k0:k0 + kc]
            dst = xs[t]
            for k in range(kc):
                v = np.float64(bf16_bits_to_f32(row[k]))
                dst[k] = v
                s += v * v
            sq[t] += s
        x0, x1, x2, x3 = xs[0], xs[1], xs[2], xs[3]
        for j in range(0, m, 2):
            wa, wb = wbits[j, k0:k0 + kc], wbits[j + 1, k0:k0 + kc]
            a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = 0.0
            for k in range(kc):
                va = _w(wa, k, mask)
                vb = _w(wb, k, mask)
                a0 += x0[k] * va
                a1 += x1[k] * va
                a2 += x2[k] * va
                a3 += x3[k] * va
                b0 += x0[k] * vb
                b1 += x1[k] * vb
                b2 += x2[k] * vb
                b3 += x3[k] * vb
            acc[0, j] += a0
            acc[1, j] += a1
            acc[2, j] += a2
            acc[3, j] += a3
            acc[0, j + 1] += b0
            acc[1, j + 1] += b1
            acc[2, j + 1] += b2
            acc[3, j + 1] += b3
    for t in range(4):
        ss[t0 + t] = np.float32(sq[t])
        for j in range(m):
            mixes[t0 + t, j] = np.float32(acc[t, j])


@njit(cache=True, parallel=True, fastmath=_ANY_ORDER)
def _mix_rows(xbits, wbits, mask, mixes, ss):
    """Sum of squares and mixes of bf16 rows ``xbits [n, K]`` (uint16) against ``wbits [m, K]``
    (fp32 bits, uint32; ``& mask`` applied as read; m a multiple of 4: 24): ``ss [n]`` and ``mixes [n, m]`` fp32, each
    summed in float64 (exact products; any order: ``reassoc``), rounded once. Blocks of 4
    tokens in parallel."""
    for b in prange((xbits.shape[0] + 3) // 4):
        _mix_block(xbits, wbits, mask, mixes, ss, b)


@njit(cache=True, fastmath=_ANY_ORDER)
def _mix_rows_serial(xbits, wbits, mask, mixes, ss):
    """:func:`_mix_rows` on the calling thread (no parallel launch: one block of tokens)."""
    for b in range((xbits.shape[0] + 3) // 4):
        _mix_block(xbits, wbits, mask, mixes, ss, b)


@njit(cache=True, inline="always")
def _exp32(x):
    """fp32 ``exp(x)``: evaluated in float64, rounded once."""
    return np.float32(_exp_f64(x))


@njit(cache=True, inline="always")
def _sigmoid(z):
    """``1 / (exp(-z) + 1)`` in fp32 (``Muls -1, Exp, Adds 1, Div``)."""
    return _F1 / (_exp32(-z) + _F1)


@njit(cache=True, inline="always")
def _row_sums(c, out):
    """Row sums of ``c [4, 4]`` as ``(c0 + c1) + (c2 + c3)`` into ``out [4]``."""
    for i in range(4):
        out[i] = (c[i, 0] + c[i, 1]) + (c[i, 2] + c[i, 3])


@njit(cache=True, inline="always")
def _col_sums(c, out):
    """Column sums of ``c [4, 4]``, sequential over rows ``((r0 + r1) + r2) + r3``, into ``out [4]``."""
    for i in range(4):
        out[i] = c[0, i]
    for r in range(1, 4):
        for i in range(4):
            out[i] = out[i] + c[r, i]


@njit(cache=True, inline="always")
def _stage2_token(t, mixes, rs, from_ss, k_inv, norm_eps, scale, base, xbits, pre_mix, iters, eps,
                  ybits, post, comb, pre):
    """:func:`_stage2_rows` for token ``t``."""
    d = xbits.shape[2]
    scale_pre, scale_post, scale_comb = scale[0], scale[1], scale[2]
    two = np.float32(2.0)
    r = rs[t]
    if from_ss:
        r = _F1 / np.sqrt(r * k_inv + norm_eps)
    mx = mixes[t]
    w = np.empty(4, np.float32)
    for i in range(4):
        pre[t, i] = _sigmoid((mx[i] * r) * scale_pre + base[i]) + eps
        post[t, i] = _sigmoid((mx[4 + i] * r) * scale_post + base[4 + i]) * two
        w[i] = pre[t, i] if pre_mix.shape[0] == 0 else pre_mix[t, i]
    c = np.empty((4, 4), np.float32)
    s = np.empty(4, np.float32)
    for i in range(4):
        for k in range(4):
            c[i, k] = (mx[8 + 4 * i + k] * r) * scale_comb + base[8 + 4 * i + k]
        top = c[i, 0]
        for k in range(1, 4):
            if c[i, k] > top or c[i, k] != c[i, k]:  # NaN-propagating max, as np.max
                top = c[i, k]
        for k in range(4):
            c[i, k] = _exp32(c[i, k] - top)
    _row_sums(c, s)
    for i in range(4):
        for k in range(4):
            c[i, k] = c[i, k] / s[i] + eps
    _col_sums(c, s)
    for i in range(4):
        for k in range(4):
            c[i, k] = c[i, k] / (s[k] + eps)
    for _ in range(iters - 1):
        _row_sums(c, s)
        for i in range(4):
            for k in range(4):
                c[i, k] = c[i, k] / (s[i] + eps)
        _col_sums(c, s)
        for i in range(4):
            for k in range(4):
                c[i, k] = c[i, k] / (s[k] + eps)
    comb[t] = c
    w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
    x0, x1, x2, x3 = xbits[t, 0], xbits[t, 1], xbits[t, 2], xbits[t, 3]
    y = ybits[t]
    for k in range(d):
        acc = w0 * bf16_bits_to_f32(x0[k])
        acc = acc + w1 * bf16_bits_to_f32(x1[k])
        acc = acc + w2 * bf16_bits_to_f32(x2[k])
        acc = acc + w3 * bf16_bits_to_f32(x3[k])
        y[k] = f32_to_bf16_bits(acc)


@njit(cache=True, parallel=True)
def _stage2_rows(mixes, rs, from_ss, k_inv, norm_eps, scale, base, xbits, pre_mix, iters, eps, ybits, post,
                 comb, pre):
    """Everything after the mixes for ``n`` tokens (hc 4): ``mixes [n, 24]`` fp32; ``rs [n]`` fp32,
    the inverse RMS, or (``from_ss``) the sum of squares it is made from (``* k_inv + norm_eps``,
    sqrt, ``1 /``); ``xbits [n, 4, D]`` bf16 bits; ``pre_mix [n, 4]`` fp32 weights of y, or
    ``[0, 4]`` for the computed gates. Writes ``ybits [n, D]`` (bf16 bits), ``post``, ``comb
    [n, 4, 4]``, ``pre`` fp32. fp32 operations only (no ``fastmath``), exp as :func:`_exp32`."""
    for t in prange(mixes.shape[0]):
        _stage2_token(t, mixes, rs, from_ss, k_inv, norm_eps, scale, base,
                      xbits, pre_mix, iters, eps, ybits, post, comb, pre)


@njit(cache=True)
def _stage2_rows_serial(mixes, rs, from_ss, k_inv, norm_eps, scale, base, xbits, pre_mix, iters, eps, ybits,
                        post, comb, pre):
    """:func:`_stage2_rows` on the calling thread (no parallel launch)."""
    for t in range(mixes.shape[0]):
        _stage2_token(t, mixes, rs, from_ss, k_inv, norm_eps, scale, base,
                      xbits, pre_mix, iters, eps, ybits, post, comb, pre)


def _stage2(mixes, rs, from_ss: bool, k: int, args: HcPreArgs, x_bits, pre_mix, outs) -> None:
    """:func:`_stage2_rows` on checked arrays (``pre_mix`` None: the computed gates weight y); one
    token runs on the calling thread (no parallel launch)."""
    pm = np.empty((0, 4), np.float32) if pre_mix is None else pre_mix
    run = _stage2_rows if mixes.shape[0] > 1 else _stage2_rows_serial
    run(mixes, rs, from_ss, np.float32(1.0 / np.float32(k)), np.float32(args.norm_eps),
        args.hc_scale, args.hc_base, x_bits, pm, args.hc_sinkhorn_iters, np.float32(args.hc_eps), *outs)


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
    x_bits = x_rows.view(np.uint16)
    y = np.empty((n, d), dtype=BF16)
    post, pre = np.empty((n, hc), np.float32), np.empty((n, hc), np.float32)
    comb = np.empty((n, hc, hc), np.float32)
    outs = (y.view(np.uint16), post, comb, pre)
    pre_mix = None if args.pre_mix is None else _tokens(args.pre_mix, 1)
    fused = args.stage == "fused"
    if args.stage == "sinkhorn":
        _stage2(_tokens(args.mixes, 1), args.inv_rms.reshape(-1), False, hc * d, args, x_bits, pre_mix, outs)
    elif _deterministic.enabled():  # fp32 products (exact for HF32 operands) and squares, the fixed order
        w32 = (hf32_truncate(args.hc_fn) if fused else args.hc_fn).T
        for a in range(0, n, CHUNK_TOKENS):
            flat = to_f32(x_rows[a:a + CHUNK_TOKENS].reshape(-1, hc * d))
            rsqrt = inv_rms(flat, args.norm_eps)
            mixes = matmul_f32(flat, w32)
            part = tuple(o[a:a + CHUNK_TOKENS] for o in outs)
            _stage2(mixes, rsqrt, False, hc * d, args, x_bits[a:a + CHUNK_TOKENS],
                    None if pre_mix is None else pre_mix[a:a + CHUNK_TOKENS], part)
    else:
        mixes, ss = np.empty((n, args.hc_fn.shape[0]), np.float32), np.empty(n, np.float32)  # 24 mixes
        run = _mix_rows if n > 4 else _mix_rows_serial
        run(x_bits.reshape(n, hc * d), args.hc_fn.view(np.uint32), HF32_KEEP_MASK if fused else _NO_MASK, mixes, ss)
        _stage2(mixes, ss, True, hc * d, args, x_bits, pre_mix, outs)
    if len(lead) == 1:  # [T, ...] already
        return HcPreOutputs(y, post, comb, pre)
    return HcPreOutputs(y.reshape(*lead, d), post.reshape(*lead, hc), comb.reshape(*lead, hc, hc),
                        pre.reshape(*lead, hc))


@njit(cache=True, inline="always")
def _widen_row(src, dst, kind):
    """fp32 values of one x / residual row ``src`` into ``dst``: bf16 bits, fp16 bits (uint16) or
    fp32 (``kind``; one branch per row, so each loop vectorizes)."""
    if kind == _BF16:
        for k in range(src.shape[0]):
            dst[k] = bf16_bits_to_f32(src[k])
    elif kind == _F16:
        for k in range(src.shape[0]):
            dst[k] = f16_bits_to_f32(src[k])
    else:
        for k in range(src.shape[0]):
            dst[k] = np.float32(src[k])


@njit(cache=True, inline="always")
def _round_row(src, dst, kind):
    """fp32 row ``src`` rounded (RNE) into ``dst``: bf16 bits, fp16 bits (uint16) or fp32."""
    if kind == _BF16:
        for k in range(src.shape[0]):
            dst[k] = f32_to_bf16_bits(src[k])
    elif kind == _F16:
        for k in range(src.shape[0]):
            dst[k] = f32_bits_to_f16_bits(np.float32(src[k]).view(np.uint32))
    else:
        for k in range(src.shape[0]):
            dst[k] = src[k]


@njit(cache=True, inline="always")
def _post_value(xv, r0, r1, r2, r3, p, c0, c1, c2, c3):
    """One output value: ``((((p x + r0 c0) + r1 c1) + r2 c2) + r3 c3)``, fp32 multiplies and adds."""
    return (((p * xv + r0 * c0) + r1 * c1) + r2 * c2) + r3 * c3


@njit(cache=True, inline="always")
def _hc_post_token(n, x, residual, post, comb, out, kind):
    """:func:`_hc_post_rows` for token ``n``: D in chunks of :data:`POST_CHUNK`; the 4 outputs of
    a chunk in one pass over its inputs (bf16 widened in registers, fp16 / fp32 through a
    widened scratch) into an fp32 scratch, then rounded into ``out`` (scratch rows padded off
    each other's cache sets)."""
    d = residual.shape[2]
    xs = np.empty((5, POST_CHUNK + 16), np.float32)
    acc = np.empty((4, POST_CHUNK + 16), np.float32)
    p0, p1, p2, p3 = post[n, 0], post[n, 1], post[n, 2], post[n, 3]
    cm = comb[n]
    c00, c01, c02, c03 = cm[0, 0], cm[0, 1], cm[0, 2], cm[0, 3]
    c10, c11, c12, c13 = cm[1, 0], cm[1, 1], cm[1, 2], cm[1, 3]
    c20, c21, c22, c23 = cm[2, 0], cm[2, 1], cm[2, 2], cm[2, 3]
    c30, c31, c32, c33 = cm[3, 0], cm[3, 1], cm[3, 2], cm[3, 3]
    a0, a1, a2, a3 = acc[0], acc[1], acc[2], acc[3]
    for k0 in range(0, d, POST_CHUNK):
        kc = min(POST_CHUNK, d - k0)
        if kind == _BF16:
            xb, q0, q1, q2, q3 = (x[n, k0:k0 + kc], residual[n, 0, k0:k0 + kc], residual[n, 1, k0:k0 + kc],
                                  residual[n, 2, k0:k0 + kc], residual[n, 3, k0:k0 + kc])
            for k in range(kc):
                xv, r0, r1 = bf16_bits_to_f32(xb[k]), bf16_bits_to_f32(q0[k]), bf16_bits_to_f32(q1[k])
                r2, r3 = bf16_bits_to_f32(q2[k]), bf16_bits_to_f32(q3[k])
                a0[k] = _post_value(xv, r0, r1, r2, r3, p0, c00, c10, c20, c30)
                a1[k] = _post_value(xv, r0, r1, r2, r3, p1, c01, c11, c21, c31)
                a2[k] = _post_value(xv, r0, r1, r2, r3, p2, c02, c12, c22, c32)
                a3[k] = _post_value(xv, r0, r1, r2, r3, p3, c03, c13, c23, c33)
        else:
            _widen_row(x[n, k0:k0 + kc], xs[0, :kc], kind)
            for j in range(4):
                _widen_row(residual[n, j, k0:k0 + kc], xs[1 + j, :kc], kind)
            w, q0, q1, q2, q3 = xs[0], xs[1], xs[2], xs[3], xs[4]
            for k in range(kc):
                a0[k] = _post_value(w[k], q0[k], q1[k], q2[k], q3[k], p0, c00, c10, c20, c30)
                a1[k] = _post_value(w[k], q0[k], q1[k], q2[k], q3[k], p1, c01, c11, c21, c31)
                a2[k] = _post_value(w[k], q0[k], q1[k], q2[k], q3[k], p2, c02, c12, c22, c32)
                a3[k] = _post_value(w[k], q0[k], q1[k], q2[k], q3[k], p3, c03, c13, c23, c33)
        for i in range(4):
            _round_row(acc[i, :kc], out[n, i, k0:k0 + kc], kind)


@njit(cache=True, parallel=True)
def _hc_post_rows(x, residual, post, comb, out, kind):
    """``out[n, i] = post[n, i] * x[n]``, then ``+= residual[n, j] * comb[n, j, i]`` for j = 0..3:
    fp32 multiplies and adds (no contraction into FMA: no ``fastmath``), one rounding to x's
    dtype (``kind``: bf16 / fp16 bits as uint16 arrays, or fp32 arrays), tokens in parallel
    (hc 4)."""
    for n in prange(residual.shape[0]):
        _hc_post_token(n, x, residual, post, comb, out, kind)


@njit(cache=True)
def _hc_post_rows_serial(x, residual, post, comb, out, kind):
    """:func:`_hc_post_rows` on the calling thread (no parallel launch)."""
    for n in range(residual.shape[0]):
        _hc_post_token(n, x, residual, post, comb, out, kind)


def hc_post(args: HcPostArgs) -> HcPostOutputs:
    """``npu_hc_post``'s backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.hc.HcPostArgs`.

    Returns:
        :class:`~ascend_emu.ops.hc.HcPostOutputs`: residual's shape, x's dtype.
    """
    d = args.x.shape[-1]
    hc = args.residual.shape[-2]
    dtype = args.x.dtype
    kind = _F32 if dtype == np.float32 else _BF16 if dtype == BF16 else _F16
    raw = np.float32 if kind == _F32 else np.uint16
    post, comb = to_f32(args.post).reshape(-1, hc), to_f32(args.comb).reshape(-1, hc, hc)
    out = np.empty(args.residual.shape, dtype)
    run = _hc_post_rows if post.shape[0] > 1 else _hc_post_rows_serial
    run(args.x.view(raw).reshape(-1, d), args.residual.view(raw).reshape(-1, hc, d), post, comb,
        out.view(raw).reshape(-1, hc, d), kind)
    return HcPostOutputs(out)
