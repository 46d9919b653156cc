"""The MLA prolog (npu_mla_prolog v1 / v2 / v3) on the CPU, every A2 / A3 quant scenario and the
Ascend 950's MXFP8 / FP8 / HiF8 full quant with a non-quant or per-tensor kv_cache.

Source: docs/sources.md#npu_mla_prolog_v3 (computation order and dtypes, quantized variants), docs/sources.md#per_tile_rows (per-tile
combined rows), docs/sources.md#rope (RoPE), docs/sources.md#quant_rounding (rounding), docs/sources.md#rms_norm (RmsNorm), docs/sources.md#cache_index (cache layouts); the A2 / A3
kernel (ops-transformer ``attention/mla_prolog/op_kernel``: ``mla_prolog_vector_comm.h``
Dequant / DynamicQuant / QuantPerTile, ``service_dynamic_quant_qn_mul_qr.h``) for the fp32
operation order of every quantized step. Takes the validated
:class:`ascend_emu.ops.mla_prolog.MlaPrologArgs`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.mla_prolog import D_ROPE, E8M0_DTYPE, HCKV, MlaPrologArgs, MlaPrologOutputs
from ..quant import (BF16, FP8_MAX, HIF8_MAX, INT8_MAX, MX_BLOCK_SIZE, CombinedRowFormat, bf16_bits_to_f32,
                     bf16_to_f32, dynamic_scale, e8m0_to_f32, f32_to_bf16_bits, f32_to_int8, f32_to_int8_via_f16,
                     group_amax, hif8_to_f32, mx_quantize, quantize_static, quantize_with_dequant_scale, to_bf16,
                     to_fp8, to_hif8)
from .kernels import (LANES, MLA_PROLOG_RMS, bits16, kernel_input, launch_rows, narrow_row, rms_norm_row,
                      rope_row, scatter_rows, widen_row)
from .matmul import matmul_bf16_out, matmul_bf16_out_heads, matmul_int8, matmul_weight, widen_f32

#: The int8 bound the kernel's DynamicQuant divides by (its ``maxInt8Tensor``), fp32.
_Q_MAX = np.float32(INT8_MAX)
#: The kernel's RmsNorm order (:data:`~ascend_emu.emu.kernels.MLA_PROLOG_RMS`, sources there).
_RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL = MLA_PROLOG_RMS


# ---------------------------------------------------------------------- fused vector stages
# Each kernel does the vector work between two matmuls for a range of tokens (``*_rows``); a
# ``*_parts`` twin runs contiguous ranges in parallel (prange), and ``kernels.launch_rows`` takes it
# only when each thread gets enough work (``kernels.parallel_parts``): decode-sized batches run on one
# thread, so added threads never make them slower. The arithmetic is the shared row kernels'
# (kernels.rms_norm_row / rope_row) and RNE rounding (quant.f32_to_bf16_bits).
@njit(cache=True, inline="always")
def _bf16(x):
    """fp32 -> bf16 (RNE) -> fp32: the value a kernel holds after rounding to bf16."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


@njit(cache=True)
def _dequant_rows(lo, hi, acc, tok_scale, col_scale, out):
    """int32 matmul result -> fp32, kernel ``Dequant``: ``fp32(acc) * tok_scale[t]`` (RowMuls),
    then ``* col_scale[c]`` (VecMulMat), two fp32 roundings. ``acc`` holds exact integers."""
    for t in range(lo, hi):
        s = tok_scale[t]
        for c in range(acc.shape[1]):
            out[t, c] = np.float32(np.float32(acc[t, c]) * s) * col_scale[c]


@njit(cache=True, parallel=True)
def _dequant_parts(parts, acc, tok_scale, col_scale, out):
    n = acc.shape[0]
    for p in prange(parts):
        _dequant_rows(p * n // parts, (p + 1) * n // parts, acc, tok_scale, col_scale, out)


@njit(cache=True, inline="always")
def _widen_bits(bits):
    """fp32 copy of a 1-D array of bf16 bits (exact; :func:`~ascend_emu.emu.kernels.widen_row`)."""
    out = np.empty(bits.shape[0], dtype=np.float32)
    widen_row(bits, out, True)
    return out


@njit(cache=True)
def _cq_norm_rows(lo, hi, cq, round_in, gamma_bits, eps, scale, narrow, out, out_bits):
    """Steps 1-2 after ``x @ W_dq``: cq (-> bf16 when ``round_in``); RmsNorm * gamma * scale in
    fp32 (``out``). With ``narrow`` (non-quant) the result is rounded to bf16 here: its bits go
    to ``out_bits`` (query_norm) and its exact fp32 value to ``out`` (the next matmul's input);
    otherwise the caller quantizes ``out``. ``gamma_bits``: bf16 bits ``[Hcq]``."""
    h = cq.shape[1]
    gamma = _widen_bits(gamma_bits)
    row = np.empty(h, dtype=np.float32)
    lanes = np.empty(LANES, dtype=np.float32)
    sq = np.empty(1, dtype=np.float32)  # unused by the in-order lanes
    for t in range(lo, hi):
        for i in range(h):
            row[i] = _bf16(cq[t, i]) if round_in else cq[t, i]
        rms_norm_row(row, gamma, eps, scale, _RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL, sq, lanes, out[t])
        if narrow:
            for i in range(h):
                b = f32_to_bf16_bits(out[t, i])
                out_bits[t, i] = b
                out[t, i] = bf16_bits_to_f32(b)


@njit(cache=True, parallel=True)
def _cq_norm_parts(parts, cq, round_in, gamma_bits, eps, scale, narrow, out, out_bits):
    n = cq.shape[0]
    for p in prange(parts):
        _cq_norm_rows(p * n // parts, (p + 1) * n // parts, cq, round_in, gamma_bits, eps, scale, narrow, out,
                      out_bits)


@njit(cache=True)
def _qcqr_split_rope_rows(lo, hi, qcqr, round_rope, cos_bits, sin_bits, q_nope, q_rope_bits):
    """Steps 3 and 5 after ``cq_n @ W_uq_qr``: per head, bf16 nope -> ``q_nope[n, t]`` (its fp32
    value, head-major for the per-head matmul); rope (-> bf16 when ``round_rope``) -> RoPE -> bf16
    bits ``[T, N, Dr]``. ``cos_bits`` / ``sin_bits``: bf16 bits ``[T, Dr]``."""
    n, dn, dr = q_nope.shape[0], q_nope.shape[2], q_rope_bits.shape[2]
    r = np.empty(dr, dtype=np.float32)
    y = np.empty(dr, dtype=np.float32)
    cos = np.empty(dr, dtype=np.float32)
    sin = np.empty(dr, dtype=np.float32)
    for t in range(lo, hi):
        widen_row(cos_bits[t], cos, True)
        widen_row(sin_bits[t], sin, True)
        for h in range(n):
            base = h * (dn + dr)
            for i in range(dn):
                q_nope[h, t, i] = _bf16(qcqr[t, base + i])
            for i in range(dr):
                v = qcqr[t, base + dn + i]
                r[i] = _bf16(v) if round_rope else v
            rope_row(r, cos, sin, True, y)
            for i in range(dr):
                q_rope_bits[t, h, i] = f32_to_bf16_bits(y[i])


@njit(cache=True, parallel=True)
def _qcqr_split_rope_parts(parts, qcqr, round_rope, cos, sin, q_nope, q_rope_bits):
    n = qcqr.shape[0]
    for p in prange(parts):
        _qcqr_split_rope_rows(p * n // parts, (p + 1) * n // parts, qcqr, round_rope, cos, sin, q_nope, q_rope_bits)


@njit(cache=True)
def _query_bits_rows(lo, hi, query, out):
    """Step 4's rounding: fp32 ``[N, T, Hckv]`` -> bf16 bits ``[T, N, Hckv]``."""
    for t in range(lo, hi):
        for h in range(out.shape[1]):
            for i in range(out.shape[2]):
                out[t, h, i] = f32_to_bf16_bits(query[h, t, i])


@njit(cache=True, parallel=True)
def _query_bits_parts(parts, query, out):
    n = out.shape[0]
    for p in prange(parts):
        _query_bits_rows(p * n // parts, (p + 1) * n // parts, query, out)


@njit(cache=True)
def _kv_kr_rows(lo, hi, ckvkr, round_in, gamma_bits, eps, scale, cos_bits, sin_bits, narrow, kv, kv_bits, kr_bits):
    """Steps 6-8 after ``x @ W_dkv_kr``: ckvkr (-> bf16 when ``round_in``); RmsNorm(kv) * gamma *
    scale in fp32: with ``narrow`` (bf16 kv_cache) rounded to bf16 bits ``kv_bits[t]``, else kept
    in ``kv`` (quantized by the caller); RoPE(kr) -> bf16 bits. ``gamma_bits``, ``cos_bits``,
    ``sin_bits``: bf16 bits ``[Hckv]``, ``[T, Dr]``."""
    hk, dr = gamma_bits.shape[0], kr_bits.shape[1]
    gamma = _widen_bits(gamma_bits)
    row = np.empty(hk + dr, dtype=np.float32)
    y = np.empty(dr, dtype=np.float32)
    normed = np.empty(hk, dtype=np.float32)
    cos = np.empty(dr, dtype=np.float32)
    sin = np.empty(dr, dtype=np.float32)
    lanes = np.empty(LANES, dtype=np.float32)
    sq = np.empty(1, dtype=np.float32)  # unused by the in-order lanes
    for t in range(lo, hi):
        for i in range(hk + dr):
            row[i] = _bf16(ckvkr[t, i]) if round_in else ckvkr[t, i]
        out = normed if narrow else kv[t]
        rms_norm_row(row[:hk], gamma, eps, scale, _RMS_LANES, _RMS_PRESCALE, _RMS_RECIPROCAL, sq, lanes, out)
        if narrow:
            narrow_row(normed, kv_bits[t], True)
        widen_row(cos_bits[t], cos, True)
        widen_row(sin_bits[t], sin, True)
        rope_row(row[hk:], cos, sin, True, y)
        for i in range(dr):
            kr_bits[t, i] = f32_to_bf16_bits(y[i])


@njit(cache=True, parallel=True)
def _kv_kr_parts(parts, ckvkr, round_in, gamma_bits, eps, scale, cos_bits, sin_bits, narrow, kv, kv_bits, kr_bits):
    n = ckvkr.shape[0]
    for p in prange(parts):
        _kv_kr_rows(p * n // parts, (p + 1) * n // parts, ckvkr, round_in, gamma_bits, eps, scale, cos_bits, sin_bits,
                    narrow, kv, kv_bits, kr_bits)


def _dequant(acc, tok_scale, col_scale, out):
    launch_rows(_dequant_rows, _dequant_parts, acc.shape[0], acc.shape[1], acc, tok_scale, col_scale, out)


def _cq_norm(cq, round_in, gamma_bits, eps, scale, narrow, out, out_bits):
    launch_rows(_cq_norm_rows, _cq_norm_parts, cq.shape[0], cq.shape[1], cq, round_in, gamma_bits, eps, scale, narrow,
                out, out_bits)


def _qcqr_split_rope(qcqr, round_rope, cos, sin, q_nope, q_rope_bits):
    launch_rows(_qcqr_split_rope_rows, _qcqr_split_rope_parts, qcqr.shape[0], qcqr.shape[1], qcqr, round_rope, cos, sin,
            q_nope, q_rope_bits)


def _query_bits(query, out):
    launch_rows(_query_bits_rows, _query_bits_parts, out.shape[0], out.shape[1] * out.shape[2], query, out)


def _kv_kr(ckvkr, round_in, gamma_bits, eps, scale, cos_bits, sin_bits, narrow, kv, kv_bits, kr_bits):
    launch_rows(_kv_kr_rows, _kv_kr_parts, ckvkr.shape[0], ckvkr.shape[1], ckvkr, round_in, gamma_bits, eps, scale,
                cos_bits, sin_bits, narrow, kv, kv_bits, kr_bits)


# ---------------------------------------------------------------------- quant steps (NumPy)
def _int8_matmul_dequant(a_i8: np.ndarray, w, tok_scale: np.ndarray, col_scale: np.ndarray) -> np.ndarray:
    """``int8 a @ int8 w`` exact (:func:`~ascend_emu.emu.matmul.matmul_int8`), then :func:`_dequant`;
    fp32 ``[T, N]``."""
    acc = matmul_int8(a_i8, w)  # [T, N] int32, exact
    out = np.empty(acc.shape, dtype=np.float32)
    _dequant(acc, _f32_vector(tok_scale), _f32_vector(col_scale), out)
    return out


def _dequant_f32(acc: np.ndarray, tok_scale, col_scale) -> np.ndarray:
    """fp32 matmul result of fp8 / hif8 operands -> :func:`_dequant` (the int8 path's order:
    ``acc * tok_scale[t] * col_scale[c]``); fp32 ``[T, N]``."""
    out = np.empty(acc.shape, dtype=np.float32)
    _dequant(acc, _f32_vector(tok_scale), _f32_vector(col_scale), out)
    return out


def _f32_vector(a) -> np.ndarray:
    """A scale tensor as the kernels read it: fp32, 1-D, a plain writable C-contiguous array."""
    return kernel_input(np.asarray(a, dtype=np.float32).reshape(-1))


def _dynamic_quant_127(x: np.ndarray, *, query: bool) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's row DynamicQuant (``mla_prolog_vector_comm.h``): per row of the last axis
    ``amax = max |x|``, dequant scale ``amax / 127`` (Div), ``y = x * (127 / amax)`` (Div, then
    RowMuls; the golden divides by the scale instead).

    ``query=False`` (cq, ``CastFP32ToINT8``): int8 = rint(y), half-even. ``query=True`` (q_nope,
    ``DynamicQuantQnWithMulQr`` on A2 / A3): y -> fp16 CAST_ROUND -> int8 CAST_ROUND, half away
    from zero twice (the golden rounds x / scale half-even; the two differ by 1 where docs/sources.md#quant_rounding says).
    A row of zeros gets scale 0 and int8 0 (quant.ZERO_GROUP_POLICY).

    Returns:
        ``(q, scale)``: int8 of x's shape; fp32 ``[..., 1]``.
    """
    amax = group_amax(x, "per_token")  # [..., 1]
    scale = dynamic_scale(amax, "per_token")  # amax / 127
    with np.errstate(divide="ignore"):
        mult = np.where(amax > 0, _Q_MAX / amax, np.float32(0.0)).astype(np.float32)
    y = x * mult
    if query:
        return f32_to_int8_via_f16(y, f16_rounding="half_away", int8_rounding="half_away"), scale
    return f32_to_int8(y, "half_even"), scale


def _per_tile_rows(kv: np.ndarray, kr_bits: np.ndarray, alpha: np.float32, tile_size: int) -> np.ndarray:
    """Combined rows ``[512 int8 | 64 bf16 | 4 fp32]`` (docs/sources.md#per_tile_rows; kernel QuantPerTile).

    Per tile of ``tile_size``: ``lim = amax * alpha``; ``x_c = max(min(x, lim), -lim)``; dequant
    scale ``lim * fp32(1/127)``; ``int8 = rint(x_c * (1 / scale))`` half-even. kc_scale is
    already in ``kv``. An all-zero tile gets scale 0 and int8 0.

    Returns:
        int8 ``[T, 656]``.
    """
    t = kv.shape[0]
    fmt = CombinedRowFormat(tile_size=tile_size)  # tile_size 128: quant.MLA_ROW
    amax = group_amax(kv, "per_tile", tile_size=tile_size)  # [T, tiles, 1]
    lim = amax * alpha  # fp32
    clipped = np.maximum(np.minimum(kv.reshape(t, -1, tile_size), lim), -lim)  # [T, tiles, tile]
    scale = dynamic_scale(lim, "per_tile")[..., 0]  # [T, tiles]
    q = quantize_with_dequant_scale(clipped.reshape(t, -1), scale, "per_tile", tile_size=tile_size)
    return fmt.pack(q, kr_bits.view(BF16), scale)


# ---------------------------------------------------------------------- Ascend 950 8-bit steps
def _decode_8bit(a: np.ndarray, element: str) -> np.ndarray:
    """fp32 values of FP8 E4M3FN (ml_dtypes) or HiF8 (uint8 codes) data; exact."""
    return hif8_to_f32(a) if element == "hifloat8" else np.asarray(a).astype(np.float32)


def _cast_8bit(y: np.ndarray, element: str) -> np.ndarray:
    """fp32 -> the element type with saturation, as the arch35 kernels cast (``SatMode::SAT``):
    FP8 E4M3FN ``CAST_RINT`` (:func:`~ascend_emu.quant.to_fp8`, saturating); HiF8 ``CAST_ROUND``
    (:func:`~ascend_emu.quant.to_hif8` of the value clipped to +-2**15: SAT gives +-max, not Inf)."""
    if element == "hifloat8":
        return to_hif8(np.clip(y, -HIF8_MAX, HIF8_MAX))  # NaN passes clip, -> 0x80
    return to_fp8(y, element, saturate=True)


#: The arch35 per-tile 8-bit quant floors each tile's amax here (ComputeVFImpl M=1, ``epsilonValue``).
TILE_AMAX_FLOOR = np.float32(1e-4)


def _dynamic_quant_8bit(x: np.ndarray, element: str, amax_floor=None) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the last axis, the arch35 kernel's ``DynamicQuantPerTokenVf`` (ops-transformer
    ``attention/mla_prolog/op_kernel/arch35/vf/vf_dynamic_quant.h``, ComputeVFImpl M=0): ``amax =
    max |x|``; dequant scale ``amax * fp32(1 / max)`` (Muls; max 448 for E4M3FN, 32768 for HiF8);
    ``y = x / scale`` (Div); :func:`_cast_8bit`. A row of zeros gets scale 0 and zeros (choice, as
    quant.ZERO_GROUP_POLICY: the kernel would divide 0 by 0). With ``amax_floor`` (per-tile, M=1)
    amax is at least that.

    Returns:
        ``(q, scale)``: the element type of x's shape; fp32 ``[..., 1]``.
    """
    max_value = HIF8_MAX if element == "hifloat8" else FP8_MAX[element]
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    if amax_floor is not None:
        amax = np.maximum(amax, amax_floor)
    scale = (amax * (np.float32(1.0) / np.float32(max_value))).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(scale > 0, x / scale, np.float32(0.0)).astype(np.float32)
    return _cast_8bit(y, element), scale


def _mx_matmul(a32: np.ndarray, a_scales: np.ndarray, w: np.ndarray, element: str,
               w_scales: np.ndarray) -> np.ndarray:
    """MXFP8 matmul ``[T, K] @ [K, N]`` -> fp32 ``[T, N]``: each element times its block's E8M0
    scale (blocks of 32 along K: ``a_scales`` ``[T, K/32]``, ``w_scales`` ``[N, K/32]``), exact in
    fp32 (an FP8 value times a power of two), then one fp32 matmul (the cube's output type is
    float, ``mla_prolog_comm_arch35.h`` mmCqOutputType; the order of its sums is not published:
    BLAS's is used). ``w``: the 8-bit weight, decoded and scaled a column block at a time
    (:func:`~ascend_emu.emu.matmul.matmul_weight`)."""
    sa = np.repeat(e8m0_to_f32(np.asarray(a_scales).view(np.uint8)), MX_BLOCK_SIZE, axis=1)  # [T, K]
    sw = e8m0_to_f32(np.asarray(w_scales).view(np.uint8))  # [N, K/32]

    def widen(lo, hi, dst):  # dst [K, hi - lo] = w[:, lo:hi] * its block scales
        np.multiply(_decode_8bit(w[:, lo:hi], element), np.repeat(sw[lo:hi].T, MX_BLOCK_SIZE, axis=0), out=dst)

    with np.errstate(over="ignore", invalid="ignore"):
        return matmul_weight(a32 * sa, w, widen=widen)


def _matmul_8bit(a32: np.ndarray, w: np.ndarray, element: str) -> np.ndarray:
    """``a32 @ w`` in fp32 with ``w`` an 8-bit weight decoded exactly (:func:`_decode_8bit`) a column
    block at a time (:func:`~ascend_emu.emu.matmul.matmul_weight`)."""
    return matmul_weight(a32, w, widen=lambda lo, hi, dst: np.copyto(dst, _decode_8bit(w[:, lo:hi], element)))


def _per_tile_rows_8bit(kv: np.ndarray, kr_bits: np.ndarray, element: str, tile_size: int) -> np.ndarray:
    """Ascend 950 per-tile rows ``[512 codes | 64 bf16 | 4 fp32]`` (arch35 ``QuantPerTile8Bit``:
    ``QuantPerTileVF`` = :func:`_dynamic_quant_8bit` per tile with amax floored at
    :data:`TILE_AMAX_FLOOR`; no clip factor; ``ScatterCkv`` / ``ScatterKr`` put codes, k_rope and
    scales at the int8 rows' offsets, :class:`~ascend_emu.quant.CombinedRowFormat`).

    Returns:
        int8 ``[T, 656]`` (the rows' bytes).
    """
    t = kv.shape[0]
    q, scale = _dynamic_quant_8bit(kv.reshape(t, -1, tile_size), element, TILE_AMAX_FLOOR)  # [T, tiles, tile]
    codes = np.ascontiguousarray(q).view(np.int8).reshape(t, -1)
    return CombinedRowFormat(tile_size=tile_size).pack(codes, kr_bits.view(BF16), scale[..., 0])


def _empty_outputs(args: MlaPrologArgs) -> MlaPrologOutputs:
    t, n, hcq = args.num_tokens, args.num_heads, args.weight_dq.shape[1]
    qq = args.query_quant_mode == 1
    query = np.empty((t, n, HCKV), dtype=np.dtype(args.scenario.dtypes["query"]) if qq else BF16)
    dq_nope = np.empty((t, n, 1), dtype=np.float32) if qq else None
    query_norm = np.empty((t, hcq), dtype=args.weight_uq_qr.dtype) if args.query_norm_flag else None
    mx = args.scenario.mx
    dq_norm = (np.empty((t, hcq // MX_BLOCK_SIZE if mx else 1), dtype=E8M0_DTYPE if mx else np.float32)
               if args.query_norm_flag and args.weight_quant_mode else None)
    return MlaPrologOutputs(query, np.empty((t, n, D_ROPE), dtype=BF16), dq_nope, query_norm, dq_norm)


def mla_prolog(args: MlaPrologArgs) -> MlaPrologOutputs:
    """Compute the MLA prolog in the scenario ``args`` selects; write kv / kr into their caches.

    The chain (docs/sources.md#npu_mla_prolog_v3; bf16 matmuls widen exactly to fp32 and accumulate in fp32,
    the ones rounded straight to bf16 through :func:`~ascend_emu.emu.matmul.matmul_bf16_out` (sgemm, or
    oneDNN's bf16 engine: the same fp32 products in another order, docs/numerics.md#accumulation),
    int8 matmuls are exact integers; RmsNorm / RoPE run in fp32; "-> bf16" is one RNE rounding;
    ``dequant(acc) = fp32(acc) * row scale * column scale``, two fp32 multiplies in that order):

    1. ``cq = x @ W_dq`` ``[T, Hcq]``: bf16 x -> bf16; int8 x (weight_quant_mode 2) ->
       ``dequant(acc, dequant_scale_x[t], dequant_scale_w_dq[c])``, not rounded.
    2. ``cq_n = RmsNorm(cq) * gamma_cq * qc_qr_scale`` (fp32; the kernel's order,
       :data:`~ascend_emu.emu.kernels.MLA_PROLOG_RMS`: squares summed in 64 lanes over the
       repeats, then a pairwise tree over the lanes; x / rms * gamma * scale). Non-quant: -> bf16,
       this is ``query_norm``. weight_quant_mode 1 / 2: times
       ``smooth_scales_cq`` if given, then per-token dynamic quant (:func:`_dynamic_quant_127`,
       half-even): int8 ``query_norm`` and fp32 ``dequant_scale_q_norm`` ``s[t] = amax / 127``.
    3. ``qcqr = cq_n @ W_uq_qr`` viewed ``[T, N, 192]`` = per head ``[128 nope | 64 rope]``: bf16
       path -> bf16; int8 path -> ``dequant(acc, s[t], dequant_scale_w_uq_qr[c])`` in fp32, the
       nope part -> bf16, the rope part kept fp32.
    4. ``query[:, n] = qcqr[:, n, :128] @ W_uk[n]`` per head ``[T, 512]`` -> bf16. With
       query_quant_mode 1: per token and head dynamic quant of that bf16 query
       (:func:`_dynamic_quant_127`: y = x * (127 / amax) -> fp16 -> int8, CAST_ROUND twice, the
       A2 / A3 kernel; the golden's ``round(x / scale)`` half-even differs by 1 now and then),
       ``dequant_scale_q_nope = amax / 127`` ``[T, N, 1]``.
    5. ``query_rope = RoPE(qcqr[:, :, 128:])``: de-interleave ``[x0::2 | x1::2]``, then rotate_half
       with half-layout cos / sin (docs/sources.md#rope), fp32 -> bf16. With query_quant_mode 1 (kernel MulQr):
       ``bf16(fp32(query_rope) * (quant_scale_ckv / dequant_scale_q_nope))``, the factor one fp32
       division (the golden multiplies, then divides).
    6. ``ckvkr = x @ W_dkv_kr`` ``[T, 576]``: bf16 path -> bf16; int8 path ->
       ``dequant(acc, dequant_scale_x[t], dequant_scale_w_dkv_kr[c])``, not rounded.
    7. ``kv = RmsNorm(ckvkr[:, :512]) * gamma_ckv * kc_scale`` (fp32), then by kv_cache_quant_mode:
       0 -> bf16; 1 -> ``rint(kv * quant_scale_ckv[0])`` int8; 2 -> ``rint(kv * quant_scale_ckv[c])``
       int8 (static multipliers, half-even, saturated); 3 -> per-tile combined rows
       (:func:`_per_tile_rows`).
    8. ``kr = RoPE(ckvkr[:, 512:])`` -> bf16 (kr_cache, or bytes 512-639 of the combined row);
       kv_cache_quant_mode 2: ``rint(fp32(bf16 kr) * quant_scale_ckr[c])`` int8. The kernel
       quantizes the bf16 rounding, not the fp32 RoPE that docs/sources.md#npu_mla_prolog_v3 and the golden
       quantize: ``kernel_mla_prolog_split_n.h`` L1572-L1578 (RoPE into ``tmpOut`` of
       ``ropeSinCosType``, then ``RopePostQuantPerChannel``), ``mla_prolog_comm.h`` L225
       (``ropeSinCosType = bfloat16_t``), ``service_rotary_position_embedding.h`` L87-L95
       (``RotaryPosEmbPerTensor``: fp32 RoPE, ``Cast(..., CAST_RINT)`` to that type) and
       L181-L193 (bf16 -> fp32, ``Mul`` scale, ``CastFP32ToINT8``); ops-transformer @
       cannmirror 05c401f.

    Ascend 950 modes (ops-transformer ``attention/mla_prolog/op_kernel/arch35``: the 8-bit
    matmuls output fp32, ``mla_prolog_comm_arch35.h`` MLAPType; quantizers in
    ``vf/vf_dynamic_quant.h``, ``vf/vf_quant_pertensor.h``, ``vf/vf_mul_qr.h``), with E4M3FN / HiF8
    values widened exactly to fp32 (HiF8 codes through :func:`~ascend_emu.quant.hif8_to_f32`):

    - steps 1 / 6, weight_quant_mode 3: :func:`_mx_matmul` (every element times its E8M0 block
      scale, exact, then an fp32 matmul); 4 / 5: fp32 matmul, then ``dequant`` as above. Not
      rounded to bf16.
    - step 2, mode 3: ``cq_n`` -> bf16 (the kernel's MXFP8 quantizer reads bf16,
      ``DynamicQuantPerBlockMxfp8Vf``; op-plugin's ``baseline_mxfp8`` rounds there too), then MXFP8
      blocks of 32 (:func:`~ascend_emu.quant.mx_quantize`, ``scale_alg`` 0: byte
      ``max(exp(amax) - 8, 0)``, elements ``x * 2**(127 - byte)`` RINT saturated to +-448, as
      ComputeScaleVF / ComputeDataVF): float8_e4m3fn ``query_norm``, E8M0
      ``dequant_scale_q_norm`` ``[T, Hcq/32]``; step 3 is :func:`_mx_matmul` of those and
      ``dequant_scale_w_uq_qr``. Modes 4 / 5: times ``smooth_scales_cq`` if given, then
      :func:`_dynamic_quant_8bit` (``amax * fp32(1/max)``, ``x / scale``, cast saturating: E4M3FN
      RINT, HiF8 ROUND) -> ``query_norm`` and fp32 ``[T, 1]``; step 3 is ``dequant`` of the fp32
      matmul. The nope part -> bf16, the rope part kept fp32 (as int8 full quant).
    - step 4 with query_quant_mode 1: :func:`_dynamic_quant_8bit` of the bf16 query per token and
      head; step 5's MulQr as above.
    - step 7 with kv_cache_quant_mode 1: ``cast(fp32(kv * quant_scale_ckv[0]))`` saturating
      (``QuantPerTensorVFImpl``); kr stays bf16. With 3: :func:`_per_tile_rows_8bit` (amax per
      tile of 128 floored at 1e-4, ``amax * fp32(1/max)``, ``x / scale`` cast saturating; no clip
      factor), 656-byte rows with the bf16 kr.

    Cache rows go to ``args.slots`` in ``args.kv_layout`` / ``args.kr_layout`` (-1 skips; for a
    shared slot the last token wins); with ``args.slots is None`` (no token or an empty cache)
    steps 6-8 are skipped.

    Args:
        args: validated :class:`~ascend_emu.ops.mla_prolog.MlaPrologArgs`.

    Returns:
        :class:`~ascend_emu.ops.mla_prolog.MlaPrologOutputs` ``(query, query_rope,
        dequant_scale_q_nope, query_norm, dequant_scale_q_norm)``: query
        ``[T, N, 512]`` (bf16; with query quant int8 / float8_e4m3fn / hifloat8 as uint8), bf16
        ``[T, N, 64]``, fp32 ``[T, N, 1]`` or None, ``[T, Hcq]`` (weight_uq_qr's dtype) when
        ``args.query_norm_flag`` else None, fp32 ``[T, 1]`` (E8M0 ``[T, Hcq/32]`` in mode 3)
        when ``args.query_norm_flag`` and weight_quant_mode > 0, else None.
    """
    t, n, hcq = args.num_tokens, args.num_heads, args.weight_dq.shape[1]
    if t == 0:
        return _empty_outputs(args)
    wqm = args.weight_quant_mode
    full = wqm == 2
    element = args.scenario.element  # Ascend 950: float8_e4m3fn / hifloat8, else None
    cos = bits16(args.rope_cos)  # [T, Dr] bf16 bits
    sin = bits16(args.rope_sin)  # [T, Dr] bf16 bits
    if element is not None:
        x = _decode_8bit(args.token_x, element)  # [T, He] fp32 values of the 8-bit tokens
    else:
        x = args.token_x if full else widen_f32(args.token_x)  # [T, He] int8 / fp32
    f32 = np.float32

    def down_proj(w, col_scale):  # steps 1 and 6: bf16 path (rounded later) or dequantized quant paths
        if args.scenario.mx:
            return _mx_matmul(x, args.dequant_scale_x, w, element, col_scale)
        if element is not None:
            return _dequant_f32(_matmul_8bit(x, w, element), args.dequant_scale_x, col_scale)
        if full:
            return _int8_matmul_dequant(x, w, args.dequant_scale_x, col_scale)
        return matmul_bf16_out(x, w)  # bf16 x bf16, rounded straight to bf16 (_cq_norm / _kv_kr round_in)

    # ---- query path
    cq = down_proj(args.weight_dq, args.dequant_scale_w_dq)  # [T, Hcq]                  step 1
    eps_cq, qc_scale = f32(args.rmsnorm_epsilon_cq), f32(args.qc_qr_scale)
    query_norm = dq_norm = None
    cq_n = np.empty((t, hcq), dtype=np.float32)  # [T, Hcq]
    if wqm == 0:  # steps 1-2, cq_n rounded to bf16 (query_norm) in the kernel
        query_norm = np.empty((t, hcq), dtype=np.uint16)  # [T, Hcq] bf16 bits
        _cq_norm(cq, not full, bits16(args.rmsnorm_gamma_cq), eps_cq, qc_scale, True, cq_n, query_norm)
        query_norm = query_norm.view(BF16)
        qcqr = matmul_bf16_out(cq_n, args.weight_uq_qr)  # [T, N*(D+Dr)]  step 3, rounded in _qcqr_split_rope
    else:
        round_cq = not full and element is None  # bf16 matmul output (partial quant) is bf16
        _cq_norm(cq, round_cq, bits16(args.rmsnorm_gamma_cq), eps_cq, qc_scale, False, cq_n, _NO_BITS)  # steps 1-2
        if args.smooth_scales_cq is not None:
            cq_n *= _f32_vector(args.smooth_scales_cq)  # [1, Hcq] or [1]
        w_uq_qr_scale = args.dequant_scale_w_uq_qr
        if args.scenario.mx:  # bf16, then MXFP8 blocks of 32 (OCP scale): fp8 [T, Hcq], E8M0 [T, Hcq/32]
            query_norm, dq_norm = mx_quantize(to_bf16(cq_n), element, axis=-1, block_size=MX_BLOCK_SIZE)
            dq_norm = dq_norm.reshape(t, -1).view(E8M0_DTYPE)
            qcqr = _mx_matmul(query_norm.astype(f32), dq_norm, args.weight_uq_qr, element, w_uq_qr_scale)  # step 3
        elif element is not None:  # per-token fp8 / hif8 [T, Hcq], fp32 [T, 1]
            query_norm, dq_norm = _dynamic_quant_8bit(cq_n, element)
            qcqr = _dequant_f32(_matmul_8bit(_decode_8bit(query_norm, element), args.weight_uq_qr, element),
                                dq_norm, w_uq_qr_scale)
        else:
            query_norm, dq_norm = _dynamic_quant_127(cq_n, query=False)  # int8 [T, Hcq], fp32 [T, 1]
            qcqr = _int8_matmul_dequant(query_norm, args.weight_uq_qr, dq_norm, w_uq_qr_scale)  # step 3
    q_nope = np.empty((n, t, args.d_nope), dtype=np.float32)  # [N, T, D]
    query_rope = np.empty((t, n, D_ROPE), dtype=np.uint16)  # [T, N, Dr]
    _qcqr_split_rope(qcqr, wqm == 0, cos, sin, q_nope, query_rope)  # steps 3, 5
    query = np.empty((t, n, HCKV), dtype=np.uint16)  # [T, N, Hckv]
    _query_bits(matmul_bf16_out_heads(q_nope, args.weight_uk), query)  # step 4, rounded in _query_bits
    query, query_rope = query.view(BF16), query_rope.view(BF16)
    dq_nope = None
    if args.query_quant_mode == 1 and element is not None:  # fp8 / hif8 [T, N, Hckv], fp32 [T, N, 1]
        query, dq_nope = _dynamic_quant_8bit(bf16_to_f32(query), element)
    elif args.query_quant_mode == 1:
        query, dq_nope = _dynamic_quant_127(bf16_to_f32(query), query=True)  # int8 [T, N, Hckv], [T, N, 1]
    if args.query_quant_mode == 1:
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = f32(_f32_vector(args.quant_scale_ckv)[0]) / dq_nope  # [T, N, 1]
            query_rope = to_bf16(bf16_to_f32(query_rope) * factor)

    # ---- kv path
    if args.slots is not None:
        ckvkr = down_proj(args.weight_dkv_kr, args.dequant_scale_w_dkv_kr)  # [T, Hckv + Dr]  step 6
        _kv_path(args, ckvkr, not full and element is None, cos, sin)  # steps 6-8

    if not args.query_norm_flag:
        query_norm = dq_norm = None
    return MlaPrologOutputs(query, query_rope, dq_nope, query_norm, dq_norm)


def _kv_path(args, ckvkr: np.ndarray, round_in: bool, cos: np.ndarray, sin: np.ndarray) -> None:
    """Steps 7-8 and the scatters (see :func:`mla_prolog`); ``cos`` / ``sin``: bf16 bits ``[T, Dr]``."""
    t, kvq, f32 = args.num_tokens, args.kv_cache_quant_mode, np.float32
    kr = np.empty((t, D_ROPE), dtype=np.uint16)  # [T, Dr] bf16 bits
    norm_args = (bits16(args.rmsnorm_gamma_ckv), f32(args.rmsnorm_epsilon_ckv), f32(args.kc_scale), cos, sin)
    if kvq == 0:  # bf16 kv_cache: rounded in the kernel
        kv = np.empty((t, HCKV), dtype=np.uint16)  # [T, Hckv] bf16 bits
        _kv_kr(ckvkr, round_in, *norm_args, True, _NO_F32, kv, kr)
        scatter_rows(args.kv_cache, kv, args.slots, args.kv_layout)
        scatter_rows(args.kr_cache, kr, args.slots, args.kr_layout)
        return
    kv32 = np.empty((t, HCKV), dtype=np.float32)  # [T, Hckv]
    _kv_kr(ckvkr, round_in, *norm_args, False, kv32, _NO_BITS, kr)
    qs_ckv = _f32_vector(args.quant_scale_ckv) if kvq in (1, 2) else None
    if kvq == 1 and args.scenario.element is not None:  # arch35 QuantPerTensorVF: fp32 x * s, cast SAT
        kv = _cast_8bit(kv32 * qs_ckv[0], args.scenario.element)
    elif kvq == 1:
        kv = quantize_static(kv32, qs_ckv[:1])  # per-tensor: element 0
    elif kvq == 2:
        kv = quantize_static(kv32, qs_ckv)
        kr = quantize_static(bf16_to_f32(kr), _f32_vector(args.quant_scale_ckr))
    elif args.scenario.element is not None:
        rows = _per_tile_rows_8bit(kv32, kr, args.scenario.element, args.tile_size)  # [T, 656]
        scatter_rows(args.kv_cache, rows, args.slots, args.kv_layout)
        return
    else:
        alpha = f32(_f32_vector(args.k_nope_clip_alpha)[0])
        rows = _per_tile_rows(kv32, kr, alpha, args.tile_size)  # [T, 656]
        scatter_rows(args.kv_cache, rows, args.slots, args.kv_layout)
        return
    scatter_rows(args.kv_cache, kv, args.slots, args.kv_layout)
    scatter_rows(args.kr_cache, kr, args.slots, args.kr_layout)


#: Stand-ins for the output a kernel does not write in its mode (Numba needs arrays of the type).
_NO_BITS = np.zeros((0, 0), dtype=np.uint16)
_NO_F32 = np.zeros((0, 0), dtype=np.float32)
