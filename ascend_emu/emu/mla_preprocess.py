"""The CPU emulation of ``torch_npu.atb.npu_mla_preprocess`` (MlaPreprocessV2).

Takes the arguments :func:`ascend_emu.ops.npu_mla_preprocess` validated and writes the results into
the destinations it prepared. Numerics, step by step (ops_reference §1.1-§1.3, §3; the A2/A3 kernel
``mla_preprocess_bf16.h`` / ``mla_preprocess_fp16.h``; "round" = one RNE rounding to the input
dtype, bf16 or fp16):

1. RmsNormQuant0, fp32: ``y = rms_norm(x, gamma0, eps) + beta0`` with the shared
   :func:`~ascend_emu.emu.kernels.rms_norm` in the RmsNormQuant order
   (:data:`~ascend_emu.emu.kernels.MLAPO_QUANT_RMS`: ``x * fp32(1 / sqrt(sum(x^2 * (1/H)) + eps))
   * gamma``, the squares scaled by 1/H first and summed in 64 lanes then a pairwise tree).
   Per-tensor: ``v = y * fp32(1/quant_scale0) + quant_offset0``; per-token:
   ``s = max|y| / 127``, ``v = y * fp32(1/s)`` (an all-zero row gives ``s = 0``, ``v = 0``).
   int8 = RINT(clamp(fp16_RNE(v), -128, 127)).
2. ``acc = int8 @ wdqkv^T`` exact (float64 BLAS), ``fp32(acc + bias0) * descale0`` (per-token:
   ``fp32(acc) * descale0 * s``), round -> ``[T, 2112]``.
3. RmsNormQuant1 on columns 576: (1536) as step 1; ``@ wuq^T`` as step 2 -> round ->
   ``[T, N, 192]``. ``q_nope @ wuk`` per head in fp32 (sgemm), round; 'int8_nzcache':
   int8(fp16(fp32(rounded) * q_nope_scale[n])). ``q_pe``: plain rotate_half RoPE in fp32
   (``kernels.rope`` with ``deinterleave=False``), round.
4. kv: ``ckv = rms_norm(kv[:512], gamma2, eps)`` (fp32; :data:`~ascend_emu.emu.kernels.MLAPO_KV_RMS`:
   ``x / sqrt(sum(x^2) * (1/512) + eps) * gamma``, same lanes and tree), round ('int8_nzcache':
   int8(fp16(ckv * fp32(1/ctkv_scale)))); ``krope = RoPE(kv[512:])``, round; scattered with
   :func:`~ascend_emu.emu.kernels.scatter_rows` (PA_BSND / PA_NZ layouts from the contract).
"""

from __future__ import annotations

import numpy as np

from ..layouts import NZArray, nz_shape, nz_to_nd
from ..ops.mla_preprocess import (KV_A_DIM, KV_LORA_RANK, Q_LORA_RANK, QK_HEAD_DIM, QK_NOPE_DIM, WDQKV_DIM,
                                  MlaPreprocessArgs, MlaPreprocessOutputs)
from ..quant import BF16, dynamic_scale, f32_to_f16, f32_to_int8_via_f16, group_amax, inverse_scale, to_bf16
from .kernels import MLAPO_KV_RMS, MLAPO_QUANT_RMS, rms_norm, rope, scatter_rows
from .matmul import matmul_f32, matmul_int8_exact, weight_f32, weight_f64, widen_f32


def _round(x32: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One RNE rounding of fp32 values to bf16 / fp16."""
    return to_bf16(x32) if dtype == BF16 else f32_to_f16(x32)


def _to_int8(v: np.ndarray) -> np.ndarray:
    """``CastFrom32To16`` + ``CastFromF16ToI8``: fp32 -> fp16 RNE -> clamp -> int8 RINT (§1.2)."""
    return f32_to_int8_via_f16(v, f16_rounding="half_even", int8_rounding="half_even")


def _rms_norm_quant(x32, gamma, beta, scale, offset, eps) -> tuple[np.ndarray, np.ndarray | None]:
    """RmsNormQuant of fp32 rows ``[T, H]``: int8 ``[T, H]`` and the per-token dequant scales
    ``[T, 1]`` (None for per-tensor, when ``scale`` / ``offset`` are given)."""
    y = rms_norm(x32, widen_f32(gamma), eps, MLAPO_QUANT_RMS) + widen_f32(beta)  # [T, H] fp32
    if scale is not None:
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            return _to_int8(y * (np.float32(1.0) / scale) + offset), None
    s = dynamic_scale(group_amax(y, "per_token"), "per_token")  # [T, 1] max|y| / 127
    with np.errstate(invalid="ignore"):
        return _to_int8(y * inverse_scale(s)), s


def _matmul_dequant(q8, w, bias, descale, token_scale, dtype) -> np.ndarray:
    """``round(fp32(q8 @ w^T + bias) * descale [* token_scale])`` as fp32 ``[T, N]``."""
    acc = matmul_int8_exact(q8, weight_f64(w).T)  # [T, N] exact integers (float64)
    if bias is not None:
        acc = acc + bias
    y = acc.astype(np.float32) * descale  # int32 -> fp32 (RNE), then the per-channel Mul
    if token_scale is not None:
        y = y * token_scale  # the per-token Muls
    return widen_f32(_round(y, dtype))


#: Attribute of a storage-shaped NZ weight holding its logical NZArray once read back.
_LOGICAL_ATTR = "_ascend_emu_logical"


def logical_weight(w: np.ndarray, logical: tuple[int, ...]) -> np.ndarray:
    """A weight the contract accepted, in its logical shape: ``w`` itself, or its FRACTAL_NZ
    storage-shaped form (``[B, K/C0, M_pad16, C0]``) read back with :func:`nz_to_nd`, once per
    tensor (kept on the array, like the NZ copy torch_npu makes)."""
    if w.shape == logical:
        return w
    cached = getattr(w, _LOGICAL_ATTR, None)
    if cached is None:
        cached = nz_to_nd(np.asarray(w).reshape(nz_shape(logical, w.dtype)), logical).view(NZArray)  # [*logical]
        setattr(w, _LOGICAL_ATTR, cached)
    return cached


def descale_f32(d: np.ndarray) -> np.ndarray:
    """A descale as fp32: as given (bf16 input), or the low 32 bits of the int64 read as fp32
    (fp16 input; the contract checked the high bits)."""
    if d.dtype == np.float32:
        return d
    return (np.ascontiguousarray(d).view(np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)


def _scalar(x: np.ndarray | None) -> np.float32 | None:
    """A ``[1]`` tensor as an exact fp32 scalar (None stays None)."""
    return None if x is None else np.float32(widen_f32(x)[0])


def mla_preprocess(args: MlaPreprocessArgs) -> MlaPreprocessOutputs:
    """Run MlaPreprocess on validated arguments, writing ``args.q_out0`` / ``args.q_out1`` and the
    caches ``args.kv_cache_out0`` / ``args.kv_cache_out1`` in place (module doc for the numerics).

    Returns:
        Those four destinations, as :class:`~ascend_emu.ops.mla_preprocess.MlaPreprocessOutputs`.
    """
    dt, t, n = args.dtype, args.token_num, args.head_num
    mode = args.cache_mode
    outputs = MlaPreprocessOutputs(args.q_out0, args.kv_cache_out0, args.q_out1, args.kv_cache_out1)
    if t == 0:
        return outputs  # no token: nothing to write
    hidden = args.input.shape[1]
    wdqkv = logical_weight(args.wdqkv, (WDQKV_DIM, hidden))  # [2112, He] int8
    wuq = logical_weight(args.wuq, (n * QK_HEAD_DIM, Q_LORA_RANK))  # [N*192, 1536] int8
    wuk = logical_weight(args.wuk, (n, QK_NOPE_DIM, KV_LORA_RANK))  # [N, 128, 512]
    cos, sin = widen_f32(args.cos), widen_f32(args.sin)  # [T, 64]

    q8, s0 = _rms_norm_quant(widen_f32(args.input), args.gamma0, args.beta0, _scalar(args.quant_scale0),
                             _scalar(args.quant_offset0), args.epsilon)  # [T, He] int8
    mm0 = _matmul_dequant(q8, wdqkv, args.bias0, descale_f32(args.descale0), s0, dt)  # [T, 2112]
    kv, q_a = mm0[:, :KV_A_DIM], mm0[:, KV_A_DIM:]  # [T, 576], [T, 1536]

    q8, s1 = _rms_norm_quant(q_a, args.gamma1, args.beta1, _scalar(args.quant_scale1), _scalar(args.quant_offset1),
                             args.epsilon)  # [T, 1536] int8
    mm1 = _matmul_dequant(q8, wuq, args.bias1, descale_f32(args.descale1), s1, dt).reshape(t, n, QK_HEAD_DIM)
    q_nope = matmul_f32(mm1[:, :, :QK_NOPE_DIM].transpose(1, 0, 2), weight_f32(wuk))  # [N, T, 512]
    q_nope = _round(q_nope.transpose(1, 0, 2), dt)  # [T, N, 512]
    q_rope = _round(rope(mm1[:, :, QK_NOPE_DIM:], cos, sin, deinterleave=False), dt)  # [T, N, 64]

    ckv = rms_norm(kv[:, :KV_LORA_RANK], widen_f32(args.gamma2), args.epsilon, MLAPO_KV_RMS)  # [T, 512] fp32
    krope = _round(rope(kv[:, KV_LORA_RANK:], cos, sin, deinterleave=False), dt)  # [T, 64]

    if mode == "int8_nzcache":
        np.copyto(args.q_out0, _to_int8(widen_f32(q_nope) * widen_f32(args.q_nope_scale)[None, :, None]))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            ckv_out = _to_int8(ckv * (np.float32(1.0) / _scalar(args.ctkv_scale)))  # [T, 512] int8
    else:
        np.copyto(args.q_out0, q_nope)
        ckv_out = _round(ckv, dt)
    np.copyto(args.q_out1, q_rope)
    scatter_rows(args.kv_cache_out0, ckv_out, args.slots, args.kv_layout)
    scatter_rows(args.kv_cache_out1, krope, args.slots, args.krope_layout)
    return outputs
