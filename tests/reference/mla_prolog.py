"""Reference npu_mla_prolog v1 / v2 / v3, non-quant: plain NumPy, step by step (ops_reference §2.1).

Imports only numpy and ml_dtypes. bf16 rounding is ml_dtypes' fp32 -> bf16 cast (RNE); matmuls
accumulate in float64 (an exact-as-possible stand-in for the kernel's fp32 accumulator) and are
rounded to fp32 first; RmsNorm and RoPE follow the official goldens' formulas in fp32. Cache
layouts and index meanings are written out from ops_reference §1.4 / §2.3 with plain loops.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
HCKV = 512
D_NOPE = 128
D_ROPE = 64
NZ_ROW_BYTES = 32


def bf16(x) -> np.ndarray:
    """fp32 -> bf16, round to nearest even (ml_dtypes)."""
    return np.asarray(x, dtype=np.float32).astype(BF16)


def f32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def matmul(a, b64: np.ndarray) -> np.ndarray:
    """``a @ b`` accumulated in float64, rounded to fp32 (``b64`` is the weight as float64)."""
    return (np.asarray(a).astype(np.float64) @ b64).astype(np.float32)


def rms_norm(x, gamma, eps: float, scale: float = 1.0) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * gamma * scale`` in fp32 (the goldens' formula)."""
    x = f32(x)
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return x / np.sqrt(ms + np.float32(eps)) * f32(gamma) * np.float32(scale)


def rope(x, cos, sin) -> np.ndarray:
    """De-interleave the 64 rope dims, then rotate_half RoPE (fp32), as the OP goldens do.

    ``x`` is ``[..., 64]``; cos / sin broadcast against it.
    """
    x = f32(x)
    lead = x.shape[:-1]
    q = x.reshape(*lead, D_ROPE // 2, 2).swapaxes(-1, -2).reshape(*lead, D_ROPE)  # [x0::2 | x1::2]
    rotated = np.concatenate([-q[..., D_ROPE // 2:], q[..., :D_ROPE // 2]], axis=-1)
    return q * f32(cos) + rotated * f32(sin)


def mla_prolog(x, w_dq64, w_uq_qr64, w_uk64, w_dkv_kr64, gamma_cq, gamma_ckv, sin, cos, *, eps_cq: float = 1e-5,
               eps_ckv: float = 1e-5, qc_qr_scale: float = 1.0, kc_scale: float = 1.0) -> dict:
    """The non-quant MLA prolog for T tokens.

    Args:
        x: bf16 ``[T, He]``.
        w_dq64, w_uq_qr64, w_dkv_kr64: the ND weights as float64 (``[He, Hcq]``,
            ``[Hcq, N*192]``, ``[He, 576]``).
        w_uk64: float64 ``[N, 128, 512]``.
        gamma_cq, gamma_ckv: bf16 ``[Hcq]``, ``[512]``.
        sin, cos: bf16 ``[T, 64]``.

    Returns:
        dict of bf16 arrays: ``query`` [T, N, 512], ``query_rope`` [T, N, 64], ``query_norm``
        [T, Hcq], ``kv`` [T, 512], ``kr`` [T, 64].
    """
    t = x.shape[0]
    n = w_uk64.shape[0]
    cq = bf16(matmul(x, w_dq64))  # [T, Hcq]                                  step 1
    cq_n = bf16(rms_norm(cq, gamma_cq, eps_cq, qc_qr_scale))  # [T, Hcq]         step 2
    qcqr = bf16(matmul(cq_n, w_uq_qr64)).reshape(t, n, D_NOPE + D_ROPE)  # [T, N, 192] step 3
    query = np.empty((t, n, HCKV), dtype=BF16)
    for h in range(n):  # step 4, per head
        query[:, h] = bf16(matmul(qcqr[:, h, :D_NOPE], w_uk64[h]))
    query_rope = bf16(rope(qcqr[:, :, D_NOPE:], cos[:, None, :], sin[:, None, :]))  # [T, N, 64] step 5
    ckvkr = bf16(matmul(x, w_dkv_kr64))  # [T, 576]                             step 6
    kv = bf16(rms_norm(ckvkr[:, :HCKV], gamma_ckv, eps_ckv, kc_scale))  # [T, 512]  step 7
    kr = bf16(rope(ckvkr[:, HCKV:], cos, sin))  # [T, 64]                         step 8
    return dict(query=query, query_rope=query_rope, query_norm=cq_n, kv=kv, kr=kr)


# ---------------------------------------------------------------------- where tokens go (§2.3)
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
