"""Reference npu_mla_prolog_v3 in the Ascend 950's weight_quant_mode 3 (MXFP8), 4 (FP8) and 5
(HiF8), kv_cache non-quant or per-tensor: plain NumPy, step by step.

8-bit values are decoded through ``tests.reference.formats_950`` (bit-field tables, E8M0 as
``2**(byte - 127)``) and encoded by its loop codecs; the shared steps (RmsNorm in the kernel's
order, RoPE, bf16 rounding, ``fp32(acc) * row * column`` dequant) are
``tests.reference.mla_prolog``'s. Matmuls accumulate in float64 (exact for 8-bit products of
these sizes) and are rounded once to fp32.

Sources for the order of the 8-bit steps: ops-transformer ``attention/mla_prolog/op_kernel/
arch35/vf/vf_dynamic_quant.h`` (per-token: scale ``amax * fp32(1/max)``, ``y = x / scale``,
cast saturating, E4M3FN RINT / HiF8 ROUND; MXFP8: bf16 input, OCP shared exponent
``max(exp(amax) - 8, 0)``, elements ``x * 2**(127 - byte)`` saturated to +-448, RINT),
``vf_quant_pertensor.h`` (kv: ``x * quant_scale_ckv`` in fp32, cast saturating), per-tile
(``QuantPerTileVF``: tile amax floored at 1e-4, no clip; rows laid out as the int8 ones),
``mla_prolog_comm_arch35.h`` (the 8-bit matmuls output fp32). op-plugin's ``baseline_mxfp8``
(test_mla_prolog_v3.py) is followed where it agrees; it omits qc_qr_scale / kc_scale.
"""

from __future__ import annotations

import numpy as np

from tests.reference import formats_950 as fmt
from tests.reference.mla_prolog import bf16, dequant, f32, rms_norm, rope

HCKV, DR, BLOCK = 512, 64, 32
FP8 = "float8_e4m3fn"
#: Largest value of the element types (E4M3FN 448, HiF8 2**15).
MAX_VALUE = {FP8: 448.0, "hifloat8": 32768.0}


def decode(codes, element: str) -> np.ndarray:
    """fp32 values of 8-bit codes (uint8 bytes, or an ml_dtypes FP8 array viewed as bytes)."""
    b = np.asarray(codes).view(np.uint8)
    table = fmt.HIF8_TABLE if element == "hifloat8" else fmt.fp8_table(element)
    return table[b].astype(np.float32)


def encode(values, element: str) -> np.ndarray:
    """uint8 codes, saturating (``SatMode::SAT``): FP8 ties to even, HiF8 ties away."""
    v = f32(values)
    if element == "hifloat8":
        return fmt.hif8_encode(np.clip(v, -MAX_VALUE[element], MAX_VALUE[element]))
    return fmt.fp8_encode(v, element, True)


def e8m0(bytes_) -> np.ndarray:
    """E8M0 bytes -> 2**(byte - 127) as float64."""
    return np.ldexp(1.0, np.asarray(bytes_).view(np.uint8).astype(np.int64) - 127)


def mx_matmul(a, a_scale, w, w_scale) -> np.ndarray:
    """``sum_k a[t, k] * sa[t, k/32] * w[k, c] * sw[c, k/32]`` in float64, rounded to fp32."""
    sa = np.repeat(e8m0(a_scale), BLOCK, axis=1)  # [T, K]
    sw = np.repeat(e8m0(w_scale), BLOCK, axis=1).T  # [K, N]
    return ((a.astype(np.float64) * sa) @ (w.astype(np.float64) * sw)).astype(np.float32)


def token_quant(x, element: str) -> tuple[np.ndarray, np.ndarray]:
    """Per row: scale = amax * fp32(1 / max); codes of ``x / scale`` (fp32 division)."""
    x = f32(x)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    scale = amax * (np.float32(1.0) / np.float32(MAX_VALUE[element]))
    return encode(x / scale, element), scale


def per_tile_rows(kv, kr, element: str, tile_size: int = 128) -> np.ndarray:
    """656-byte rows: per tile of 128, scale = max(amax, 1e-4) * fp32(1 / max), codes of
    ``x / scale``; bytes ``[0, 512)`` codes, ``[512, 640)`` bf16 kr, ``[640, 656)`` fp32 scales."""
    t = kv.shape[0]
    tiles = f32(kv).reshape(t, -1, tile_size)
    amax = np.maximum(np.max(np.abs(tiles), axis=-1, keepdims=True), np.float32(1e-4))
    scale = amax * (np.float32(1.0) / np.float32(MAX_VALUE[element]))
    rows = np.zeros((t, 656), np.uint8)
    rows[:, :HCKV] = encode(tiles / scale, element).reshape(t, HCKV)
    rows[:, HCKV:HCKV + 2 * DR] = np.ascontiguousarray(bf16(kr)).view(np.uint8).reshape(t, -1)
    rows[:, HCKV + 2 * DR:] = scale.astype("<f4").reshape(t, -1).view(np.uint8)
    return rows


def mx_quant(x) -> tuple[np.ndarray, np.ndarray]:
    """MXFP8 of bf16(x) along the last axis: (E4M3FN codes, E8M0 bytes ``[T, K/32]``)."""
    codes, pairs = fmt.mx_quantize(f32(bf16(x)), FP8, -1, BLOCK, 0)
    return codes, pairs.reshape(x.shape[0], -1)


def mla_prolog_950(x, w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv, sin, cos, *, mode: int, kv_quant: int,
                   scales: dict, qc_qr_scale: float = 1.0, kc_scale: float = 1.0, eps: float = 1e-5) -> dict:
    """The prolog for T tokens in weight_quant_mode ``mode`` (3, 4, 5), kv_cache_quant_mode
    ``kv_quant`` (0; 1 with per-token-head query quant; 3: per-tile 656-byte rows, bf16 query).

    Args:
        x, w_dq, w_uq_qr, w_dkv_kr: 8-bit codes (uint8 bytes; ND weights ``[He, Hcq]``,
            ``[Hcq, N*(D+Dr)]``, ``[He, 576]``).
        w_uk: bf16 ``[N, D, 512]``.
        gamma_cq, gamma_ckv, sin, cos: bf16.
        scales: by argument name: E8M0 bytes (mode 3) or fp32 arrays.

    Returns:
        dict of ``query`` ([T, N, 512] bf16, or codes with ``dequant_scale_q_nope`` [T, N, 1]),
        ``query_rope`` bf16, ``query_norm`` codes [T, Hcq], ``dequant_scale_q_norm`` (E8M0 bytes
        [T, Hcq/32] or fp32 [T, 1]), ``kv`` (bf16 or codes [T, 512], or uint8 rows [T, 656]),
        ``kr`` bf16 [T, 64] (None with rows).
    """
    element = "hifloat8" if mode == 5 else FP8
    sc = scales
    t, n, d = x.shape[0], w_uk.shape[0], w_uk.shape[1]
    xv = decode(x, element)

    def project(w, col_scale):  # steps 1 / 6, fp32
        wv = decode(w, element)
        if mode == 3:
            return mx_matmul(xv, sc["dequant_scale_x"], wv, col_scale)
        acc = (xv.astype(np.float64) @ wv.astype(np.float64)).astype(np.float32)
        return dequant(acc, sc["dequant_scale_x"], col_scale)

    out = {}
    cq_n = rms_norm(project(w_dq, sc["dequant_scale_w_dq"]), gamma_cq, eps, qc_qr_scale)  # [T, Hcq]
    w_uq = decode(w_uq_qr, element)
    if mode == 3:
        out["query_norm"], out["dequant_scale_q_norm"] = mx_quant(cq_n)
        qcqr = mx_matmul(decode(out["query_norm"], element), out["dequant_scale_q_norm"], w_uq,
                         sc["dequant_scale_w_uq_qr"])
    else:
        if sc.get("smooth_scales_cq") is not None:
            cq_n = cq_n * f32(sc["smooth_scales_cq"]).reshape(-1)
        out["query_norm"], out["dequant_scale_q_norm"] = token_quant(cq_n, element)
        acc = (decode(out["query_norm"], element).astype(np.float64) @ w_uq.astype(np.float64)).astype(np.float32)
        qcqr = dequant(acc, out["dequant_scale_q_norm"], sc["dequant_scale_w_uq_qr"])
    qcqr = qcqr.reshape(t, n, d + DR)
    qc = bf16(qcqr[:, :, :d])  # [T, N, D]
    query = np.empty((t, n, HCKV), dtype=qc.dtype)
    for h in range(n):
        query[:, h] = bf16((f32(qc[:, h]).astype(np.float64) @ f32(w_uk[h]).astype(np.float64)).astype(np.float32))
    out["query"] = query
    out["query_rope"] = bf16(rope(qcqr[:, :, d:], f32(cos)[:, None, :], f32(sin)[:, None, :]))
    if kv_quant == 1:  # per-token-head query quant
        out["query"], out["dequant_scale_q_nope"] = token_quant(f32(query), element)
        qs = f32(sc["quant_scale_ckv"]).reshape(-1)[0]
        out["query_rope"] = bf16(f32(out["query_rope"]) * (qs / out["dequant_scale_q_nope"]))
    ckvkr = project(w_dkv_kr, sc["dequant_scale_w_dkv_kr"])  # [T, 576]
    kv = rms_norm(ckvkr[:, :HCKV], gamma_ckv, eps, kc_scale)
    out["kr"] = bf16(rope(ckvkr[:, HCKV:], f32(cos), f32(sin)))
    if kv_quant == 3:
        out["kv"], out["kr"] = per_tile_rows(kv, out["kr"], element), None
    elif kv_quant == 1:
        out["kv"] = encode(kv * f32(sc["quant_scale_ckv"]).reshape(-1)[0], element)
    else:
        out["kv"] = bf16(kv)
    return out
