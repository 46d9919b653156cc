"""Independent float64 reference of the Ascend 950's shared-KV attention over 640-byte FP8 rows
(``npu_kv_quant_sparse_attn_sharedkv``). Imports nothing from the package.

A row, as the vllm-ascend README of ``kv_quant_sparse_attn_sharedkv`` describes it ("kv_rope,
kv_nope and nope_quant_scale in that order, padded to 640"): bytes 0-127 the 64 rope values
(bf16), bytes 128-575 the 448 nope values (FP8 E4M3FN), bytes 576-582 one E8M0 scale per 64 nope
values (``2 ** (byte - 127)``), the rest pad. The latent the attention sees is ``[nope * scale,
rope]`` (512 values: the nope part first, as the model's ``[448 | 64]`` split). The attention is
:func:`tests.reference.sparse_attn_sharedkv.sparse_attn_sharedkv` on those values (exact in
float64), sinks required.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .sparse_attn_sharedkv import sparse_attn_sharedkv

ROW_BYTES = 640
ROPE = 64
NOPE = 448
TILE = 64


def decode_rows(rows: np.ndarray) -> np.ndarray:
    """uint8 ``[n, 640]`` -> float64 ``[n, 512]`` (module doc)."""
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    assert rows.ndim == 2 and rows.shape[1] == ROW_BYTES
    n = rows.shape[0]
    rope = rows[:, :2 * ROPE].copy().view(ml_dtypes.bfloat16).astype(np.float64)  # little-endian bf16
    nope = rows[:, 2 * ROPE:2 * ROPE + NOPE].copy().view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    scale_bytes = rows[:, 2 * ROPE + NOPE:2 * ROPE + NOPE + NOPE // TILE].astype(np.int64)
    scales = np.where(scale_bytes == 255, np.nan, np.ldexp(1.0, scale_bytes - 127))
    out = np.empty((n, NOPE + ROPE))
    out[:, :NOPE] = nope * np.repeat(scales, TILE, axis=1)
    out[:, NOPE:] = rope
    return out


def kv_quant_sparse_attn_sharedkv(q, ori_rows, cmp_rows, q_lens, kv_lens, scale, *, ratio=1, indices=None, sinks):
    """float64 ``[T, N, 512]``; ``ori_rows`` / ``cmp_rows``: lists over requests of uint8
    ``[S, 640]`` rows in position order (``cmp_rows`` None for SWA); the rest as
    :func:`tests.reference.sparse_attn_sharedkv.sparse_attn_sharedkv`."""
    ori = [decode_rows(r) for r in ori_rows]
    cmp = None if cmp_rows is None else [decode_rows(r) for r in cmp_rows]
    return sparse_attn_sharedkv(q, ori, cmp, q_lens, kv_lens, scale, ratio=ratio, indices=indices, sinks=sinks)
