"""The MLA prolog (npu_mla_prolog v1 / v2 / v3) on the CPU.

Source: ops_reference §2.1 (computation order and dtypes), §1.1 (RoPE), §1.3 (RmsNorm), §2.3
(cache layouts). Takes the validated :class:`ascend_emu.ops.mla_prolog.MlaPrologArgs`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..quant import BF16, bf16_bits_to_f32, f32_to_bf16_bits, to_f32
from .kernels import rms_norm_row, rope_row, scatter_rows
from .matmul import matmul_f32, weight_f32

#: Per-head column split of weight_uq_qr's output: [D nope | Dr rope].
D_NOPE = 128
#: RoPE dim Dr.
D_ROPE = 64
#: kv low-rank dim; ckvkr = [Hckv kv | Dr rope].
HCKV = 512


# ---------------------------------------------------------------------- fused vector stages
# Each kernel does the vector work between two matmuls for all tokens in one parallel launch
# (prange over tokens); the arithmetic is the shared row kernels' (kernels.rms_norm_row /
# rope_row) and RNE rounding (quant.f32_to_bf16_bits).
@njit(cache=True, inline="always")
def _bf16(x):
    """fp32 -> bf16 (RNE) -> fp32: the value a kernel holds after rounding to bf16."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


@njit(cache=True, parallel=True)
def _cq_norm(cq, gamma, eps, scale, bits, out):
    """Steps 1-2 after ``x @ W_dq``: cq -> bf16; RmsNorm * gamma * scale -> bf16 (bits and value)."""
    h = cq.shape[1]
    for t in prange(cq.shape[0]):
        row = np.empty(h, dtype=np.float32)
        normed = np.empty(h, dtype=np.float32)
        for i in range(h):
            row[i] = _bf16(cq[t, i])
        rms_norm_row(row, gamma, eps, scale, normed)
        for i in range(h):
            b = f32_to_bf16_bits(normed[i])
            bits[t, i] = b
            out[t, i] = bf16_bits_to_f32(b)


@njit(cache=True, parallel=True)
def _qcqr_split_rope(qcqr, cos, sin, q_nope, q_rope_bits):
    """Steps 3 and 5 after ``cq_n @ W_uq_qr``: per head, bf16 nope -> ``q_nope[n, t]`` (its fp32
    value, head-major for the per-head matmul); bf16 rope -> RoPE -> bf16 bits ``[T, N, Dr]``."""
    n, dn, dr = q_nope.shape[0], q_nope.shape[2], q_rope_bits.shape[2]
    for t in prange(qcqr.shape[0]):
        r = np.empty(dr, dtype=np.float32)
        y = np.empty(dr, dtype=np.float32)
        for h in range(n):
            base = h * (dn + dr)
            for i in range(dn):
                q_nope[h, t, i] = _bf16(qcqr[t, base + i])
            for i in range(dr):
                r[i] = _bf16(qcqr[t, base + dn + i])
            rope_row(r, cos[t], sin[t], True, y)
            for i in range(dr):
                q_rope_bits[t, h, i] = f32_to_bf16_bits(y[i])


@njit(cache=True, parallel=True)
def _query_bits(query, out):
    """Step 4's rounding: fp32 ``[N, T, Hckv]`` -> bf16 bits ``[T, N, Hckv]``."""
    for t in prange(out.shape[0]):
        for h in range(out.shape[1]):
            for i in range(out.shape[2]):
                out[t, h, i] = f32_to_bf16_bits(query[h, t, i])


@njit(cache=True, parallel=True)
def _kv_kr(ckvkr, gamma, eps, scale, cos, sin, kv_bits, kr_bits):
    """Steps 6-8 after ``x @ W_dkv_kr``: ckvkr -> bf16; RmsNorm(kv) * gamma * scale -> bf16;
    RoPE(kr) -> bf16."""
    hk, dr = kv_bits.shape[1], kr_bits.shape[1]
    for t in prange(ckvkr.shape[0]):
        row = np.empty(hk + dr, dtype=np.float32)
        normed = np.empty(hk, dtype=np.float32)
        y = np.empty(dr, dtype=np.float32)
        for i in range(hk + dr):
            row[i] = _bf16(ckvkr[t, i])
        rms_norm_row(row[:hk], gamma, eps, scale, normed)
        rope_row(row[hk:], cos[t], sin[t], True, y)
        for i in range(hk):
            kv_bits[t, i] = f32_to_bf16_bits(normed[i])
        for i in range(dr):
            kr_bits[t, i] = f32_to_bf16_bits(y[i])


def mla_prolog(args) -> tuple:
    """Compute the MLA prolog (non-quant scenario) and write kv / kr into their caches.

    The chain (ops_reference §2.1; matmuls widen bf16 exactly to fp32 and accumulate in fp32,
    RmsNorm / RoPE run in fp32; "-> bf16" is one round-to-nearest-even):

    1. ``cq = x @ W_dq`` ``[T, Hcq]`` -> bf16.
    2. ``cq_n = RmsNorm(cq) * gamma_cq * qc_qr_scale`` (fp32; kernel order x / rms * gamma * scale)
       -> bf16; this is ``query_norm``.
    3. ``qcqr = cq_n @ W_uq_qr`` -> bf16, viewed ``[T, N, 192]`` = per head ``[128 nope | 64 rope]``.
    4. ``query[:, n] = qcqr[:, n, :128] @ W_uk[n]`` per head ``[T, 512]`` -> bf16.
    5. ``query_rope = RoPE(qcqr[:, :, 128:])``: de-interleave ``[x0::2 | x1::2]``, then rotate_half
       with half-layout cos / sin (§1.1), fp32 -> bf16.
    6. ``ckvkr = x @ W_dkv_kr`` ``[T, 576]`` -> bf16.
    7. ``kv = RmsNorm(ckvkr[:, :512]) * gamma_ckv * kc_scale`` -> bf16 -> kv_cache.
    8. ``kr = RoPE(ckvkr[:, 512:])`` -> bf16 -> kr_cache.

    v1 / v2 have no scales: ``qc_qr_scale = kc_scale = 1``. Cache rows go to ``args.slots`` in
    ``args.kv_layout`` / ``args.kr_layout`` (-1 skips; for a shared slot the last token wins);
    with ``args.slots is None`` (no token or an empty cache) steps 6-8 are skipped.

    Args:
        args: validated :class:`~ascend_emu.ops.mla_prolog.MlaPrologArgs`.

    Returns:
        ``(query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm)``: bf16
        ``[T, N, 512]``, bf16 ``[T, N, 64]``, None, bf16 ``[T, Hcq]`` when
        ``args.query_norm_flag`` else None, None (the Nones are quant-scenario outputs).
    """
    t, n, hcq = args.num_tokens, args.num_heads, args.weight_dq.shape[1]
    if t == 0:
        query_norm = np.empty((0, hcq), dtype=BF16) if args.query_norm_flag else None
        return np.empty((0, n, HCKV), dtype=BF16), np.empty((0, n, D_ROPE), dtype=BF16), None, query_norm, None
    x = to_f32(args.token_x)  # [T, He]
    cos = to_f32(args.rope_cos)  # [T, Dr]
    sin = to_f32(args.rope_sin)  # [T, Dr]
    f32 = np.float32

    # ---- query path
    cq = matmul_f32(x, weight_f32(args.weight_dq))  # [T, Hcq]                           step 1
    cq_n_bits = np.empty((t, hcq), dtype=np.uint16)  # [T, Hcq] query_norm
    cq_n = np.empty((t, hcq), dtype=np.float32)  # [T, Hcq]
    _cq_norm(cq, to_f32(args.rmsnorm_gamma_cq), f32(args.rmsnorm_epsilon_cq), f32(args.qc_qr_scale), cq_n_bits,
             cq_n)  # steps 1-2
    qcqr = matmul_f32(cq_n, weight_f32(args.weight_uq_qr))  # [T, N*(D+Dr)]                step 3
    q_nope = np.empty((n, t, D_NOPE), dtype=np.float32)  # [N, T, D]
    query_rope = np.empty((t, n, D_ROPE), dtype=np.uint16)  # [T, N, Dr]
    _qcqr_split_rope(qcqr, cos, sin, q_nope, query_rope)  # steps 3, 5
    query = np.empty((t, n, HCKV), dtype=np.uint16)  # [T, N, Hckv]
    _query_bits(matmul_f32(q_nope, to_f32(args.weight_uk)), query)  # step 4

    # ---- kv path
    if args.slots is not None:
        ckvkr = matmul_f32(x, weight_f32(args.weight_dkv_kr))  # [T, Hckv + Dr]              step 6
        kv = np.empty((t, HCKV), dtype=np.uint16)  # [T, Hckv]
        kr = np.empty((t, D_ROPE), dtype=np.uint16)  # [T, Dr]
        _kv_kr(ckvkr, to_f32(args.rmsnorm_gamma_ckv), f32(args.rmsnorm_epsilon_ckv), f32(args.kc_scale), cos, sin,
               kv, kr)  # steps 6-8
        scatter_rows(args.kv_cache, kv, args.slots, args.kv_layout)
        scatter_rows(args.kr_cache, kr, args.slots, args.kr_layout)

    query_norm = cq_n_bits.view(BF16) if args.query_norm_flag else None
    return query.view(BF16), query_rope.view(BF16), None, query_norm, None
