"""The CPU emulation of ``torch_npu.atb.npu_mla_preprocess`` (MlaPreprocessV2).

Takes the arguments :func:`ascend_emu.ops.npu_mla_preprocess` validated and writes the results into
the destinations it prepared. Numerics, step by step (docs/sources.md#rope, docs/sources.md#quant_rounding, docs/sources.md#rms_norm, docs/sources.md#npu_mla_preprocess; the A2/A3 kernel
``mla_preprocess_bf16.h`` / ``mla_preprocess_fp16.h``; "round" = one RNE rounding to the input
dtype, bf16 or fp16):

1. RmsNormQuant0, fp32: ``y = rms_norm(x, gamma0, eps) + beta0`` with the shared
   :func:`~ascend_emu.emu.kernels.rms_norm_row` in the RmsNormQuant order
   (:data:`~ascend_emu.emu.kernels.MLAPO_QUANT_RMS`: ``x * fp32(1 / sqrt(sum(x^2 * (1/H)) + eps))
   * gamma``, the squares scaled by 1/H first and summed in 64 lanes then a pairwise tree).
   Per-tensor: ``v = y * fp32(1/quant_scale0) + quant_offset0``; per-token:
   ``s = max|y| / 127``, ``v = y * fp32(1/s)`` (an all-zero row gives ``s = 0``, ``v = 0``).
   int8 = RINT(clamp(fp16_RNE(v), -128, 127)).
2. ``acc = int8 @ wdqkv^T`` exact in int32 (:func:`~ascend_emu.emu.matmul.matmul_int8`),
   ``fp32(acc + bias0) * descale0`` (per-token: ``fp32(acc) * descale0 * s``), round -> ``[T, 2112]``.
3. RmsNormQuant1 on columns 576: (1536) as step 1; ``@ wuq^T`` as step 2 -> round ->
   ``[T, N, 192]``. ``q_nope @ wuk`` per head in fp32 (sgemm, or oneDNN's bf16 engine for bf16: :func:`~ascend_emu.emu.matmul.matmul_bf16_out_heads`), round; 'int8_nzcache':
   int8(fp16(fp32(rounded) * q_nope_scale[n])). ``q_pe``: plain rotate_half RoPE in fp32
   (``kernels.rope_row`` with ``deinterleave=False``), round.
4. kv: ``ckv = rms_norm(kv[:512], gamma2, eps)`` (fp32; :data:`~ascend_emu.emu.kernels.MLAPO_KV_RMS`:
   ``x / sqrt(sum(x^2) * (1/512) + eps) * gamma``, same lanes and tree), round ('int8_nzcache':
   int8(fp16(ckv * fp32(1/ctkv_scale)))); ``krope = RoPE(kv[512:])``, round; scattered with
   :func:`~ascend_emu.emu.kernels.scatter_rows` (PA_BSND / PA_NZ layouts from the contract).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..layouts import NZArray, nz_shape, nz_to_nd
from ..ops.mla_preprocess import (KV_A_DIM, KV_LORA_RANK, Q_LORA_RANK, QK_HEAD_DIM, QK_NOPE_DIM, ROPE_DIM, WDQKV_DIM,
                                  MlaPreprocessArgs, MlaPreprocessOutputs)
from ..quant import BF16, INT8_MAX, f32_to_int8_via_f16
from ..quant.rounding import bf16_bits_to_f32, f16_bits_to_f32, f32_bits_to_bf16_bits, f32_bits_to_f16_bits
from .kernels import (LANES, LANES_PAIRWISE, MLAPO_KV_RMS, MLAPO_QUANT_RMS, bits16, kernel_input, launch_rows,
                      narrow_row, rms_norm_row, rope_row, round_to_int8, scatter_rows, widen_row)
from .matmul import matmul_bf16_out_heads, matmul_int8, widen_f32


#: The RmsNormQuant order (:data:`~ascend_emu.emu.kernels.MLAPO_QUANT_RMS`) and the kv RmsNorm's
#: (:data:`~ascend_emu.emu.kernels.MLAPO_KV_RMS`).
_QUANT_LANES, _QUANT_PRESCALE, _QUANT_RECIPROCAL = MLAPO_QUANT_RMS
_KV_LANES, _KV_PRESCALE, _KV_RECIPROCAL = MLAPO_KV_RMS


def _to_int8(v: np.ndarray) -> np.ndarray:
    """``CastFrom32To16`` + ``CastFromF16ToI8``: fp32 -> fp16 RNE -> clamp -> int8 RINT (docs/sources.md#quant_rounding)."""
    return f32_to_int8_via_f16(v, f16_rounding="half_even", int8_rounding="half_even")


@njit(cache=True, inline="always")
def _int8_via_f16(v):
    """One value of :func:`_to_int8`: fp32 -> fp16 (RNE; overflow -> inf), then
    :func:`~ascend_emu.emu.kernels.round_to_int8` (half to even, saturating; NaN -> 0): the same as
    clamping the fp16 value to [-128, 127] first, since rounding cannot leave that range."""
    return round_to_int8(f16_bits_to_f32(f32_bits_to_f16_bits(np.float32(v).view(np.uint32))))


@njit(cache=True)
def _rms_norm_quant_rows(lo, hi, x, gamma_bits, beta_bits, is_bf16, eps, per_token, inv_scale, offset, q, scales):
    """RmsNormQuant of fp32 rows ``[lo, hi)`` (:func:`_rms_norm_quant`), one fused pass per row.

    Args:
        x: fp32 ``[T, H]``; gamma_bits, beta_bits: bf16 / fp16 (``is_bf16``) bits ``[H]``; eps: fp32.
        per_token: dynamic per-token quant (else ``y * inv_scale + offset``, fp32 scalars).
        q: out, int8 ``[T, H]``.
        scales: out, fp32 ``[T, 1]`` per-token dequant scales ``max|y| / 127`` (per_token only).
    """
    h = x.shape[1]
    gamma = np.empty(h, dtype=np.float32)
    beta = np.empty(h, dtype=np.float32)
    widen_row(gamma_bits, gamma, is_bf16)
    widen_row(beta_bits, beta, is_bf16)
    y = np.empty(h, dtype=np.float32)
    sq = np.empty(1, dtype=np.float32)  # unused by the in-order lanes
    lanes = np.empty(LANES, dtype=np.float32)
    for t in range(lo, hi):
        rms_norm_row(x[t], gamma, eps, np.float32(1.0), _QUANT_LANES, _QUANT_PRESCALE, _QUANT_RECIPROCAL, sq, lanes,
                     y)
        for i in range(h):
            y[i] = y[i] + beta[i]
        if per_token:
            amax = np.float32(0.0)
            for i in range(h):
                a = abs(y[i])
                if a != a or a > amax:  # NaN propagates, as np.max
                    amax = a
                    if a != a:
                        break
            s = np.float32(amax / np.float32(INT8_MAX))
            scales[t, 0] = s
            inv = np.float32(np.float32(1.0) / s) if s > np.float32(0.0) else np.float32(0.0)
            for i in range(h):
                q[t, i] = _int8_via_f16(np.float32(y[i] * inv))
        else:
            for i in range(h):
                q[t, i] = _int8_via_f16(np.float32(np.float32(y[i] * inv_scale) + offset))


@njit(cache=True, parallel=True)
def _rms_norm_quant_parts(parts, x, gamma_bits, beta_bits, is_bf16, eps, per_token, inv_scale, offset, q, scales):
    n = x.shape[0]
    for p in prange(parts):
        _rms_norm_quant_rows(p * n // parts, (p + 1) * n // parts, x, gamma_bits, beta_bits, is_bf16, eps, per_token,
                             inv_scale, offset, q, scales)


def _rms_norm_quant(x32, gamma, beta, scale, offset, eps) -> tuple[np.ndarray, np.ndarray | None]:
    """RmsNormQuant of fp32 rows ``[T, H]``: int8 ``[T, H]`` and the per-token dequant scales
    ``[T, 1]`` (None for per-tensor, when ``scale`` / ``offset`` are given).

    ``y = rms_norm(x) * gamma + beta`` in fp32 (:data:`MLAPO_QUANT_RMS` order); per-tensor
    ``v = y * fp32(1 / scale) + offset``; per-token ``s = max|y| / 127``, ``v = y * fp32(1 / s)``
    (0 for an all-zero row); then :func:`_to_int8`."""
    x32 = np.ascontiguousarray(x32, dtype=np.float32)
    t, h = x32.shape
    per_token = scale is None
    q = np.empty((t, h), dtype=np.int8)  # [T, H]
    scales = np.empty((t, 1), dtype=np.float32)  # [T, 1]
    if per_token:
        inv = offset = np.float32(0.0)
    else:
        with np.errstate(divide="ignore", over="ignore"):
            inv = np.float32(np.float32(1.0) / scale)
        offset = np.float32(offset)
    launch_rows(_rms_norm_quant_rows, _rms_norm_quant_parts, t, h, x32, bits16(gamma), bits16(beta),
                gamma.dtype == BF16, np.float32(eps), per_token, inv, offset, q, scales)
    return q, scales if per_token else None


@njit(cache=True)
def _dequant_round_rows(lo, hi, acc, bias, descale, token_scale, is_bf16, out):
    """:func:`_matmul_dequant` after the matmul, rows ``[lo, hi)``: ``fp32(acc + bias) * descale
    [* token_scale]``, rounded once (RNE) to bf16 / fp16, as fp32. ``bias`` / ``token_scale`` of
    size 0: absent."""
    has_bias, has_tok = bias.shape[0] > 0, token_scale.shape[0] > 0
    for t in range(lo, hi):
        for c in range(acc.shape[1]):
            a = np.float64(acc[t, c])  # exact: |acc| < 2**31
            if has_bias:
                a += np.float64(bias[c])
            y = np.float32(np.float32(a) * descale[c])
            if has_tok:
                y = np.float32(y * token_scale[t, 0])
            bits = np.float32(y).view(np.uint32)
            out[t, c] = bf16_bits_to_f32(f32_bits_to_bf16_bits(bits)) if is_bf16 else \
                f16_bits_to_f32(f32_bits_to_f16_bits(bits))


@njit(cache=True, parallel=True)
def _dequant_round_parts(parts, acc, bias, descale, token_scale, is_bf16, out):
    n = acc.shape[0]
    for p in prange(parts):
        _dequant_round_rows(p * n // parts, (p + 1) * n // parts, acc, bias, descale, token_scale, is_bf16, out)


_NONE_I32 = np.zeros(0, dtype=np.int32)
_NONE_F32 = np.zeros((0, 1), dtype=np.float32)


def _matmul_dequant(q8, w, bias, descale, token_scale, dtype) -> np.ndarray:
    """``round(fp32(q8 @ w^T + bias) * descale [* token_scale])`` as fp32 ``[T, N]``."""
    acc = matmul_int8(q8, w, w_nk=True)  # [T, N] int32, exact
    out = np.empty(acc.shape, dtype=np.float32)  # [T, N]
    launch_rows(_dequant_round_rows, _dequant_round_parts, acc.shape[0], acc.shape[1], np.ascontiguousarray(acc),
                _NONE_I32 if bias is None else kernel_input(bias), kernel_input(np.asarray(descale, dtype=np.float32)),
                _NONE_F32 if token_scale is None else token_scale, dtype == BF16, out)
    return out


@njit(cache=True)
def _rope_norm_rows(lo, hi, mm1, q_nope, kv, cos_bits, sin_bits, gamma_bits, eps, is_bf16, narrow, q_nope_bits,
                    q_rope, ckv, ckv_bits, krope):
    """Steps 3-4 after the matmuls, tokens ``[lo, hi)`` (module doc): ``q_nope_bits = round(q_nope)``
    (the einsum, head-major in, token-major out), ``q_rope = round(RoPE(q_pe))`` per
    head, ``ckv = rms_norm(kv[:512]) * gamma`` (fp32, :data:`MLAPO_KV_RMS` order), ``krope =
    round(RoPE(kv[512:]))``; plain rotate_half, rounding RNE to the input dtype (bits out).

    Args:
        mm1: fp32 ``[T, N, 192]``; q_nope: fp32 ``[N, T, 512]``; kv: fp32 ``[T, 576]``; cos_bits, sin_bits: bf16 / fp16
        (``is_bf16``) bits ``[T, 64]``; gamma_bits: bits ``[512]``; eps: fp32.
        narrow: round ckv to the input dtype here (``ckv_bits``) instead of keeping it in fp32 (``ckv``).
        q_nope_bits: out, uint16 ``[T, N, 512]``; q_rope: out, uint16 ``[T, N, 64]``; ckv: out, fp32 ``[T, 512]`` (unless ``narrow``); ckv_bits:
        out, uint16 ``[T, 512]`` (with ``narrow``); krope: out, uint16 ``[T, 64]``.
    """
    y = np.empty(ROPE_DIM, dtype=np.float32)
    cos = np.empty(ROPE_DIM, dtype=np.float32)
    sin = np.empty(ROPE_DIM, dtype=np.float32)
    gamma = np.empty(KV_LORA_RANK, dtype=np.float32)
    normed = np.empty(KV_LORA_RANK, dtype=np.float32)
    widen_row(gamma_bits, gamma, is_bf16)
    sq = np.empty(KV_LORA_RANK if _KV_LANES == LANES_PAIRWISE else 1, dtype=np.float32)
    lanes = np.empty(LANES, dtype=np.float32)
    for t in range(lo, hi):
        widen_row(cos_bits[t], cos, is_bf16)
        widen_row(sin_bits[t], sin, is_bf16)
        for h in range(mm1.shape[1]):
            narrow_row(q_nope[h, t], q_nope_bits[t, h], is_bf16)
            rope_row(mm1[t, h, QK_NOPE_DIM:], cos, sin, False, y)
            narrow_row(y, q_rope[t, h], is_bf16)
        out = normed if narrow else ckv[t]
        rms_norm_row(kv[t, :KV_LORA_RANK], gamma, eps, np.float32(1.0), _KV_LANES, _KV_PRESCALE, _KV_RECIPROCAL,
                     sq, lanes, out)
        if narrow:
            narrow_row(normed, ckv_bits[t], is_bf16)
        rope_row(kv[t, KV_LORA_RANK:], cos, sin, False, y)
        narrow_row(y, krope[t], is_bf16)


@njit(cache=True, parallel=True)
def _rope_norm_parts(parts, mm1, q_nope, kv, cos_bits, sin_bits, gamma_bits, eps, is_bf16, narrow, q_nope_bits,
                    q_rope, ckv, ckv_bits, krope):
    n = kv.shape[0]
    for p in prange(parts):
        _rope_norm_rows(p * n // parts, (p + 1) * n // parts, mm1, q_nope, kv, cos_bits, sin_bits, gamma_bits, eps,
                        is_bf16, narrow, q_nope_bits, q_rope, ckv, ckv_bits, krope)


#: Stand-ins for the output :func:`_rope_norm_rows` does not write in its mode.
_NO_BITS = np.zeros((0, 0), dtype=np.uint16)
_NO_F32 = np.zeros((0, 0), dtype=np.float32)


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
    is_bf16 = dt == BF16

    q8, s0 = _rms_norm_quant(widen_f32(args.input), args.gamma0, args.beta0, _scalar(args.quant_scale0),
                             _scalar(args.quant_offset0), args.epsilon)  # [T, He] int8
    mm0 = _matmul_dequant(q8, wdqkv, args.bias0, descale_f32(args.descale0), s0, dt)  # [T, 2112]
    kv, q_a = mm0[:, :KV_A_DIM], mm0[:, KV_A_DIM:]  # [T, 576], [T, 1536]

    q8, s1 = _rms_norm_quant(q_a, args.gamma1, args.beta1, _scalar(args.quant_scale1), _scalar(args.quant_offset1),
                             args.epsilon)  # [T, 1536] int8
    mm1 = _matmul_dequant(q8, wuq, args.bias1, descale_f32(args.descale1), s1, dt).reshape(t, n, QK_HEAD_DIM)
    q_nope = matmul_bf16_out_heads(mm1[:, :, :QK_NOPE_DIM].transpose(1, 0, 2), wuk)  # [N, T, 512], rounded below
    q_nope_bits = np.empty((t, n, KV_LORA_RANK), dtype=np.uint16)  # [T, N, 512] bits
    q_rope = np.empty((t, n, ROPE_DIM), dtype=np.uint16)  # [T, N, 64] bits
    krope = np.empty((t, ROPE_DIM), dtype=np.uint16)  # [T, 64] bits
    nz8 = mode == "int8_nzcache"  # the ckv stays fp32 for its int8 quant; else rounded in the kernel
    ckv = np.empty((t, KV_LORA_RANK), dtype=np.float32) if nz8 else _NO_F32  # [T, 512] fp32
    ckv_bits = _NO_BITS if nz8 else np.empty((t, KV_LORA_RANK), dtype=np.uint16)  # [T, 512] bits
    launch_rows(_rope_norm_rows, _rope_norm_parts, t, n * (KV_LORA_RANK + ROPE_DIM) + KV_A_DIM, mm1, q_nope, kv,
                bits16(args.cos), bits16(args.sin), bits16(args.gamma2), np.float32(args.epsilon), is_bf16, not nz8,
                q_nope_bits, q_rope, ckv, ckv_bits, krope)
    q_nope, q_rope, krope = q_nope_bits.view(dt), q_rope.view(dt), krope.view(dt)

    if nz8:
        np.copyto(args.q_out0, _to_int8(widen_f32(q_nope) * widen_f32(args.q_nope_scale)[None, :, None]))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            ckv_out = _to_int8(ckv * (np.float32(1.0) / _scalar(args.ctkv_scale)))  # [T, 512] int8
    else:
        np.copyto(args.q_out0, q_nope)
        ckv_out = ckv_bits.view(dt)  # [T, 512]
    np.copyto(args.q_out1, q_rope)
    scatter_rows(args.kv_cache_out0, ckv_out, args.slots, args.kv_layout)
    scatter_rows(args.kv_cache_out1, krope, args.slots, args.krope_layout)
    return outputs
