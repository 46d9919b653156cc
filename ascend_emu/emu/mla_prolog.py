"""The MLA prolog (npu_mla_prolog v1 / v2 / v3) on the CPU.

Source: ops_reference §2.1 (computation order and dtypes), §1.1 (RoPE), §1.3 (RmsNorm), §2.3
(cache layouts). Takes the validated :class:`ascend_emu.ops.mla_prolog.MlaPrologArgs`.
"""

from __future__ import annotations

import numpy as np

from ..quant import BF16, bf16_to_f32, to_f32
from .kernels import rms_norm, rope, scatter_rows, to_bf16_bits
from .matmul import matmul_f32, weight_f32

#: Per-head column split of weight_uq_qr's output: [D nope | Dr rope].
D_NOPE = 128
#: RoPE dim Dr.
D_ROPE = 64
#: kv low-rank dim; ckvkr = [Hckv kv | Dr rope].
HCKV = 512


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 (RNE) -> fp32: the value a kernel holds after rounding its output to bf16."""
    return bf16_to_f32(to_bf16_bits(x))


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

    # ---- query path
    cq = _bf16_round(matmul_f32(x, weight_f32(args.weight_dq)))  # [T, Hcq]            step 1
    cq_n_bits = to_bf16_bits(rms_norm(cq, to_f32(args.rmsnorm_gamma_cq), args.rmsnorm_epsilon_cq,
                                      args.qc_qr_scale))  # [T, Hcq]                      step 2
    qcqr = _bf16_round(matmul_f32(bf16_to_f32(cq_n_bits), weight_f32(args.weight_uq_qr)))  # step 3
    qcqr = qcqr.reshape(t, n, -1)  # [T, N, D + Dr]
    q_nope = np.ascontiguousarray(qcqr[:, :, :D_NOPE].transpose(1, 0, 2))  # [N, T, D]
    query = to_bf16_bits(matmul_f32(q_nope, to_f32(args.weight_uk)).transpose(1, 0, 2))  # [T, N, Hckv] step 4
    query_rope = to_bf16_bits(rope(qcqr[:, :, D_NOPE:], cos, sin, deinterleave=True))  # [T, N, Dr] step 5

    # ---- kv path
    if args.slots is not None:
        ckvkr = _bf16_round(matmul_f32(x, weight_f32(args.weight_dkv_kr)))  # [T, Hckv + Dr] step 6
        kv = to_bf16_bits(rms_norm(ckvkr[:, :HCKV], to_f32(args.rmsnorm_gamma_ckv), args.rmsnorm_epsilon_ckv,
                                   args.kc_scale))  # [T, Hckv]                              step 7
        kr = to_bf16_bits(rope(ckvkr[:, HCKV:], cos, sin, deinterleave=True))  # [T, Dr]     step 8
        scatter_rows(args.kv_cache, kv, args.slots, args.kv_layout)
        scatter_rows(args.kr_cache, kr, args.slots, args.kr_layout)

    query_norm = cq_n_bits.view(BF16) if args.query_norm_flag else None
    return query.view(BF16), query_rope.view(BF16), None, query_norm, None
