"""Independent float64 reference of DeepSeek-V4's shared-KV sparse attention (plain NumPy).

From the V4 reference model (hicann/cann-recipes-infer ``models/deepseek_v4_flash_tilelang_and_
inductor_af/model.py``: ``get_window_topk_idxs``, ``get_compress_topk_idxs``, the indexer's causal
mask, ``sparse_attn`` with ``attn_sink``) and the vllm-ascend README of
``npu_sparse_attn_sharedkv`` (docs/sources.md). Imports nothing from the package: the caches are
given as logical per-request arrays (positions, not blocks), so paging is not modelled here.

For a query at position ``p`` of its request (the request's queries are its last kv positions):

- window: original positions ``max(0, p - window + 1) .. p`` (window 128);
- compressed: HCA all rows ``j < (p + 1) // ratio``; CSA the given indices (``-1`` skipped);
- ``out = sum_r softmax_r * kv_r`` over those rows, the softmax denominator also holding
  ``exp(sink[h])``; all in float64 from the exact values.
"""

from __future__ import annotations

import numpy as np

WINDOW = 128


def positions(q_lens, kv_lens):
    """Each token's ``(request, position)``, requests in order."""
    out = []
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens, strict=True)):
        out += [(b, kl - ql + i) for i in range(ql)]
    return out


def sparse_attn_sharedkv(q, ori, cmp, q_lens, kv_lens, scale, *, ratio=1, indices=None, sinks=None):
    """float64 ``[T, N, D]``.

    Args:
        q: ``[T, N, D]`` (any real dtype; read exactly).
        ori: list over requests of ``[S2_b, D]`` original rows in position order.
        cmp: list over requests of ``[S3_b, D]`` compressed rows, or None.
        q_lens, kv_lens: per-request query and kv counts.
        scale: softmax scale.
        ratio: compression ratio (with cmp).
        indices: ``[T, K]`` compressed positions (-1 skip) for CSA, else None.
        sinks: ``[N]`` or None.
    """
    q64 = np.asarray(q).astype(np.float64)
    t, n, d = q64.shape
    out = np.zeros((t, n, d))
    for i, (b, p) in enumerate(positions(q_lens, kv_lens)):
        rows = [np.asarray(ori[b][max(0, p - WINDOW + 1):p + 1]).astype(np.float64)]
        if cmp is not None:
            if indices is None:
                sel = list(range((p + 1) // ratio))
            else:
                sel = [int(j) for j in indices[i] if j != -1]
            rows.append(np.asarray(cmp[b]).astype(np.float64)[sel].reshape(len(sel), d))
        kv = np.concatenate(rows)
        s = q64[i] @ kv.T * scale  # [N, L]
        m = s.max(axis=1)
        if sinks is not None:
            m = np.maximum(m, np.asarray(sinks, np.float64))
        e = np.exp(s - m[:, None])
        den = e.sum(axis=1)
        if sinks is not None:
            den = den + np.exp(np.asarray(sinks, np.float64) - m)
        out[i] = (e @ kv) / den[:, None]
    return out
