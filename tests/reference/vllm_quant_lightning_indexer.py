"""Reference of ``_C_ascend.npu_vllm_quant_lightning_indexer`` (A2 / A3 int8): the quant
lightning-indexer score (tests/reference/quant_lightning_indexer.py ``row_scores``) over a
request's compressed key rows, with the visible-row count of the vllm-ascend A2 / A3 kernel
(``op_kernel/arch32``: ``actS2Size = S2 / cmpRatio``; sparse_mode 3: query ``i`` of ``S1`` sees
``(S2 - S1 + i + 1) / cmpRatio`` rows; docs/sources.md). Keys are given logically (per request,
compressed rows in order), so paging is not modelled here; imports nothing from the package.
"""

from __future__ import annotations

import numpy as np

from .lightning_indexer import PAD_INDEX, top_k
from .quant_lightning_indexer import row_scores


def visible_rows(s2: int, s1: int, i: int, ratio: int, sparse_mode: int) -> int:
    """Compressed rows query ``i`` (of ``s1``) of a request with ``s2`` original tokens scores."""
    if sparse_mode == 0:
        return s2 // ratio
    return max(s2 - s1 + i + 1, 0) // ratio


def vllm_quant_lightning_indexer(q_rows, w_rows, qs_rows, keys, kscales, q_lens, kv_lens, ratio, k, sparse_mode=3):
    """int32 ``[T, k]``.

    Args:
        q_rows: int8 ``[T, N1, D]``; w_rows, qs_rows: fp16 ``[T, N1]``.
        keys: list over requests of int8 ``[S3_b, D]`` compressed rows; kscales: list of fp16 ``[S3_b]``.
        q_lens, kv_lens: per-request query tokens and original kv tokens.
    """
    out = np.full((q_rows.shape[0], k), PAD_INDEX, np.int32)
    t = 0
    for b, (s1, s2) in enumerate(zip(q_lens, kv_lens, strict=True)):
        kb = [[int(v) for v in row] for row in keys[b]]
        ks = [np.float32(v) for v in kscales[b]]
        for i in range(s1):
            lim = min(visible_rows(s2, s1, i, ratio, sparse_mode), len(kb))
            if lim > 0 and s2 // ratio > 0:
                sc = row_scores(q_rows[t], w_rows[t], qs_rows[t], kb[:lim], ks[:lim])
                for j, p in enumerate(top_k(sc, k)):
                    out[t, j] = p
            t += 1
    return out
