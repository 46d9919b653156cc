"""Reference npu_mla_prolog v1 / v2 / v3, every quant scenario: plain NumPy, step by step.

Imports numpy, ml_dtypes, ``tests.reference.rms_norm`` and ascend_emu.mla's dims. Sources:
docs/sources.md#npu_mla_prolog_v3 (steps and their quantized variants), docs/sources.md#per_tile_rows (per-tile rows), docs/sources.md#quant_rounding (rounding),
docs/sources.md#rms_norm (RmsNorm kernel order).

- bf16 rounding is ml_dtypes' fp32 -> bf16 cast (RNE).
- bf16 matmuls accumulate in float64 (an exact-as-possible stand-in for the kernel's fp32
  accumulator) and are rounded to fp32 first; int8 matmuls are exact int64 sums.
- Where a result is compared byte for byte or nearly so (int8 outputs, full-quant caches, fp32
  dynamic scales), the fp32 steps follow the kernel's operation order as docs/sources.md#quant_rounding /
  docs/sources.md#rms_norm record it: RmsNorm sums squares in the kernel's 64 lanes and pairwise tree
  (``tests/reference/rms_norm.py``) and multiplies by fp32(1/H); dequant is ``fp32(acc) * row
  scale * column scale``; dynamic quant multiplies by ``127 / amax``; per-tile quant multiplies by
  ``1 / scale``; the q_nope int8 rounds through fp16 half-away-from-zero twice. The official
  golden's own forms (division by the dequant scale, half-even q_nope, ``x * qscale / scale`` for
  query_rope) are given too where they differ (``query_golden``, query_rope).
- Cache layouts and index meanings are written out from docs/sources.md#paged_nz / docs/sources.md#cache_index with loops.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from tests.reference.rms_norm import rms_norm as rms_norm_ref

BF16 = np.dtype(ml_dtypes.bfloat16)
from ascend_emu.mla import D_NOPE, D_ROPE, HCKV  # noqa: E402
NZ_ROW_BYTES = 32
Q_MAX = np.float32(127.0)
#: Per-tile combined row: 512 int8 | 64 bf16 | 4 fp32 = 656 bytes.
ROW_BYTES = 656


def bf16(x) -> np.ndarray:
    """fp32 -> bf16, round to nearest even (ml_dtypes)."""
    return np.asarray(x, dtype=np.float32).astype(BF16)


def f32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def matmul(a, b64: np.ndarray) -> np.ndarray:
    """``a @ b`` accumulated in float64, rounded to fp32 (``b64`` is the weight as float64)."""
    return (np.asarray(a).astype(np.float64) @ b64).astype(np.float32)


def int_matmul(a, w) -> np.ndarray:
    """Exact ``int8 a @ int8 w`` as int64."""
    return np.einsum("tk,kn->tn", np.asarray(a, dtype=np.int64), np.asarray(w, dtype=np.int64))


def dequant(acc, row_scale, col_scale) -> np.ndarray:
    """``fp32(acc) * row_scale[t] * col_scale[c]``, in that order, fp32."""
    return (np.asarray(acc).astype(np.float32) * f32(row_scale).reshape(-1, 1)) * f32(col_scale).reshape(1, -1)


def rms_norm(x, gamma, eps: float, scale: float = 1.0) -> np.ndarray:
    """``x / sqrt(sum(x^2) * (1/H) + eps) * gamma * scale`` in fp32, the squares summed as the
    mla_prolog kernel does (64 lanes over the repeats, then a pairwise tree: reference.rms_norm);
    the goldens' ``mean`` is the same formula with another summation order."""
    return rms_norm_ref(x, gamma, eps, "mla_prolog", scale)


def rope(x, cos, sin) -> np.ndarray:
    """De-interleave the 64 rope dims, then rotate_half RoPE (fp32), as the OP goldens do.

    ``x`` is ``[..., 64]``; cos / sin broadcast against it.
    """
    x = f32(x)
    lead = x.shape[:-1]
    q = x.reshape(*lead, D_ROPE // 2, 2).swapaxes(-1, -2).reshape(*lead, D_ROPE)  # [x0::2 | x1::2]
    rotated = np.concatenate([-q[..., D_ROPE // 2:], q[..., :D_ROPE // 2]], axis=-1)
    return q * f32(cos) + rotated * f32(sin)


# ---------------------------------------------------------------------- quant primitives
def saturate(v) -> np.ndarray:
    return np.clip(v, -128, 127).astype(np.int8)


def dynamic_quant(x) -> tuple[np.ndarray, np.ndarray]:
    """Per row: scale = amax / 127; int8 = rint(x * (127 / amax)), half-even (kernel order)."""
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    return saturate(np.rint(x * (Q_MAX / amax))), amax / Q_MAX


def round_half_away(v) -> np.ndarray:
    """Round float64 values to integers, ties away from zero."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def f16_half_away(y) -> np.ndarray:
    """fp32 -> the nearest fp16 value, ties away from zero (CAST_ROUND), as float64 (|y| < 65504)."""
    y = np.asarray(y, dtype=np.float64)
    _, e = np.frexp(np.abs(y))  # |y| = m * 2**e, 0.5 <= m < 1
    ulp = np.exp2(np.maximum(e - 1, -14) - 10)  # fp16: 10 mantissa bits, normal exponents >= -14
    return round_half_away(y / ulp) * ulp


def query_quant(q) -> dict:
    """Per token and head dynamic quant of the bf16 query ``[T, N, 512]``.

    Returns:
        ``query`` (kernel: ``y = x * (127 / amax)`` -> fp16 -> int8, half away twice),
        ``query_golden`` (the official golden: ``rint(x / scale)``, half-even), and
        ``dequant_scale_q_nope`` ``[T, N, 1]`` = amax / 127.
    """
    x = f32(q)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    scale = amax / Q_MAX
    kernel = saturate(round_half_away(f16_half_away(x * (Q_MAX / amax))))
    golden = saturate(np.rint(x / scale))
    return dict(query=kernel, query_golden=golden, dequant_scale_q_nope=scale)


def static_quant(x, scale) -> np.ndarray:
    """``rint(x * scale)`` half-even, saturated (static scales are multipliers)."""
    return saturate(np.rint(f32(x) * f32(scale)))


def per_tile_rows(kv, kr, alpha: float, tile_size: int = 128) -> np.ndarray:
    """Combined 656-byte rows ``[512 int8 | 64 bf16 kr | 4 fp32 scales]`` (docs/sources.md#per_tile_rows).

    Per tile: ``lim = amax * alpha``; clip to ``[-lim, lim]``; scale ``lim * fp32(1/127)``;
    int8 = rint(x * fp32(1 / scale)), half-even; a zero tile has scale 0 and int8 0.
    """
    kv = f32(kv)
    t = kv.shape[0]
    tiles = kv.reshape(t, -1, tile_size)
    lim = np.max(np.abs(tiles), axis=-1, keepdims=True) * np.float32(alpha)
    scale = lim * (np.float32(1.0) / Q_MAX)  # [T, tiles, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(scale > 0, np.float32(1.0) / scale, np.float32(0.0)).astype(np.float32)
    q = saturate(np.rint(np.clip(tiles, -lim, lim) * inv)).reshape(t, -1)
    rows = np.zeros((t, ROW_BYTES), dtype=np.uint8)
    rows[:, :HCKV] = q.view(np.uint8)
    rows[:, HCKV:HCKV + 2 * D_ROPE] = np.ascontiguousarray(kr, dtype=BF16).view(np.uint8).reshape(t, -1)
    rows[:, HCKV + 2 * D_ROPE:] = scale.astype("<f4").reshape(t, -1).view(np.uint8)
    return rows.view(np.int8)


# ---------------------------------------------------------------------- the op
def _project(x, w, row_scale, col_scale) -> np.ndarray:
    """Steps 1 / 6: int8 weights: exact int matmul, dequantized, fp32 (not rounded); bf16
    weights (given as float64): bf16(x @ w) as fp32."""
    if np.asarray(w).dtype.kind == "i":
        return dequant(int_matmul(x, w), row_scale, col_scale)
    return f32(bf16(matmul(x, w)))


def mla_prolog(x, w_dq, w_uq_qr, w_uk64, w_dkv_kr, gamma_cq, gamma_ckv, sin, cos, *, eps_cq: float = 1e-5,
               eps_ckv: float = 1e-5, qc_qr_scale: float = 1.0, kc_scale: float = 1.0, modes=(0, 0, 0),
               scales=None, tile_size: int = 128) -> dict:
    """The MLA prolog for T tokens, in the scenario ``modes``.

    Args:
        x: bf16 ``[T, He]`` (int8 with weight_quant_mode 2).
        w_dq, w_uq_qr, w_dkv_kr: the ND weights ``[He, Hcq]``, ``[Hcq, N*192]``, ``[He, 576]``:
            bf16 weights as float64, int8 weights as int8.
        w_uk64: float64 ``[N, 128, 512]``.
        gamma_cq, gamma_ckv: bf16 ``[Hcq]``, ``[512]``.
        sin, cos: bf16 ``[T, 64]``.
        modes: ``(weight_quant_mode, kv_cache_quant_mode, query_quant_mode)``.
        scales: the scale arguments by name (fp32 arrays; missing = None).

    Returns:
        dict: ``query`` [T, N, 512] (bf16, or int8 with query quant, plus ``query_golden`` and
        ``dequant_scale_q_nope`` [T, N, 1]), bf16 ``query_rope`` [T, N, 64], ``query_norm``
        [T, Hcq] (bf16, or int8 plus ``dequant_scale_q_norm`` [T, 1]), ``kv`` [T, 512] (bf16 /
        int8) and ``kr`` [T, 64] (bf16 / int8), or ``kv`` = combined int8 rows [T, 656], ``kr``
        None and ``kv_f32`` the fp32 kv before its quant (per-tile).
    """
    wqm, kvq, qqm = modes
    sc = dict(scales or {})
    t, n = x.shape[0], w_uk64.shape[0]
    out = {}
    cq = _project(x, w_dq, sc.get("dequant_scale_x"), sc.get("dequant_scale_w_dq"))  # [T, Hcq]     step 1
    cq_n = rms_norm(cq, gamma_cq, eps_cq, qc_qr_scale)  # [T, Hcq] fp32                              step 2
    if wqm == 0:
        out["query_norm"] = bf16(cq_n)
        qcqr = f32(bf16(matmul(out["query_norm"], w_uq_qr)))  # [T, N*192]                             step 3
    else:
        if sc.get("smooth_scales_cq") is not None:
            cq_n = cq_n * f32(sc["smooth_scales_cq"]).reshape(-1)
        out["query_norm"], out["dequant_scale_q_norm"] = dynamic_quant(cq_n)  # int8 [T, Hcq], [T, 1]
        qcqr = dequant(int_matmul(out["query_norm"], w_uq_qr), out["dequant_scale_q_norm"],
                       sc["dequant_scale_w_uq_qr"])  # [T, N*192] fp32
    qcqr = qcqr.reshape(t, n, D_NOPE + D_ROPE)
    qc = bf16(qcqr[:, :, :D_NOPE])  # [T, N, 128]
    query = np.empty((t, n, HCKV), dtype=BF16)
    for h in range(n):  # step 4, per head
        query[:, h] = bf16(matmul(qc[:, h], w_uk64[h]))
    qr = qcqr[:, :, D_NOPE:] if wqm else f32(bf16(qcqr[:, :, D_NOPE:]))  # [T, N, 64]
    out["query_rope"] = bf16(rope(qr, cos[:, None, :], sin[:, None, :]))  # step 5
    out["query"] = query
    if qqm:
        out.update(query_quant(query))
        with np.errstate(divide="ignore", invalid="ignore"):  # golden: x * quant_scale_ckv / scale
            out["query_rope"] = bf16(f32(out["query_rope"]) * f32(sc["quant_scale_ckv"]).reshape(-1)[0]
                                     / out["dequant_scale_q_nope"])
    ckvkr = _project(x, w_dkv_kr, sc.get("dequant_scale_x"), sc.get("dequant_scale_w_dkv_kr"))  # [T, 576] step 6
    kv = rms_norm(ckvkr[:, :HCKV], gamma_ckv, eps_ckv, kc_scale)  # [T, 512] fp32                    step 7
    kr = bf16(rope(ckvkr[:, HCKV:], cos, sin))  # [T, 64]                                             step 8
    if kvq == 0:
        kv = bf16(kv)
    elif kvq == 1:
        kv = static_quant(kv, f32(sc["quant_scale_ckv"]).reshape(-1)[0])
    elif kvq == 2:
        kv = static_quant(kv, f32(sc["quant_scale_ckv"]).reshape(-1))
        kr = static_quant(kr, f32(sc["quant_scale_ckr"]).reshape(-1))
    else:
        out["kv_f32"] = kv
        kv, kr = per_tile_rows(kv, kr, f32(sc["k_nope_clip_alpha"]).reshape(-1)[0], tile_size), None
    out.update(kv=kv, kr=kr)
    return out


# ---------------------------------------------------------------------- where tokens go (docs/sources.md#cache_index)
def slots_paged(cache_index) -> list[int]:
    """PA_BSND / PA_NZ: cache_index[t] is the global row (block * BlockSize + row); -1 skips."""
    return [int(v) for v in np.asarray(cache_index).reshape(-1)]


def slots_blocks(cache_index, seq_lens, block_size: int) -> list[int]:
    """PA_BLK_*: cache_index lists block ids; batch b's token p goes to block
    ``ids[off_b + p // bs]``, row ``p % bs``; a -1 block skips its tokens."""
    ids = [int(v) for v in np.asarray(cache_index).reshape(-1)]
    slots, off = [], 0
    for s_b in seq_lens:
        for p in range(int(s_b)):
            blk = ids[off + p // block_size]
            slots.append(-1 if blk < 0 else blk * block_size + p % block_size)
        off += -(-int(s_b) // block_size)
    return slots


def _rows_view(cache: np.ndarray, nz: bool, block_size: int) -> np.ndarray:
    """A view of the cache memory indexed ``[slot] -> row`` (ND) or ``[block, D/C0, bs, C0]`` (NZ)."""
    d = cache.shape[-1]
    if not nz:
        return cache.reshape(-1, d)
    c0 = NZ_ROW_BYTES // cache.dtype.itemsize
    return cache.reshape(-1, d // c0, block_size, c0)


def write_rows(cache: np.ndarray, rows, slots, *, nz: bool, block_size: int) -> None:
    """Write ``rows[t]`` (``[T, D]``) at ``slots[t]`` in token order (the last writer wins)."""
    view = _rows_view(cache, nz, block_size)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        if nz:
            blk, r = divmod(slot, block_size)
            view[blk, :, r, :] = np.asarray(rows[t]).reshape(view.shape[1], view.shape[3])
        else:
            view[slot] = rows[t]


def read_rows(cache: np.ndarray, slots, *, nz: bool, block_size: int) -> np.ndarray:
    """The rows at ``slots`` (all >= 0), ``[len(slots), D]``."""
    view = _rows_view(cache, nz, block_size)
    out = []
    for slot in slots:
        if nz:
            blk, r = divmod(slot, block_size)
            out.append(view[blk, :, r, :].reshape(-1))
        else:
            out.append(view[slot])
    return np.array(out, dtype=cache.dtype).reshape(len(out), cache.shape[-1])
