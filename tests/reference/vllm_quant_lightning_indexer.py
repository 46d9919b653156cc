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
from .quant_lightning_indexer import _values, row_scores


def visible_rows(s2: int, s1: int, i: int, ratio: int, sparse_mode: int) -> int:
    """Compressed rows query ``i`` (of ``s1``) of a request with ``s2`` original tokens scores."""
    if sparse_mode == 0:
        return s2 // ratio
    return max(s2 - s1 + i + 1, 0) // ratio


def vllm_quant_lightning_indexer(q_rows, w_rows, qs_rows, keys, kscales, q_lens, kv_lens, ratio, k, sparse_mode=3,
                                 element="int8"):
    """int32 ``[T, k]``.

    Args:
        q_rows: int8 ``[T, N1, D]``; w_rows, qs_rows: fp16 ``[T, N1]``. Ascend 950
            (``element="float8_e4m3fn"``): FP8 codes, fp32 weights and scales.
        keys: list over requests of ``[S3_b, D]`` compressed rows (q's dtype); kscales: list of
            ``[S3_b]`` scales.
        q_lens, kv_lens: per-request query tokens and original kv tokens.

    The Ascend 950 (vllm-ascend ``op_kernel/arch35/quant_lightning_indexer_service_vector.h``):
    ``ws = fp32(w * qs)``, ``s = fp32(relu(q . k))`` (no fp16 staging), and a query seeing fewer
    than ``k`` rows gets them in row order (``CreateVecIndex``), not sorted by score.
    """
    fp8 = element != "int8"
    out = np.full((q_rows.shape[0], k), PAD_INDEX, np.int32)
    t = 0
    for b, (s1, s2) in enumerate(zip(q_lens, kv_lens, strict=True)):
        kb = [_values(row, element) for row in keys[b]]
        ks = [np.float32(v) for v in kscales[b]]
        for i in range(s1):
            lim = min(visible_rows(s2, s1, i, ratio, sparse_mode), len(kb))
            if lim > 0 and s2 // ratio > 0:
                if fp8 and lim < k:
                    picks = list(range(lim))
                else:
                    picks = top_k(row_scores(q_rows[t], w_rows[t], qs_rows[t], kb[:lim], ks[:lim], stage_ws=not fp8,
                                             stage_s=not fp8, element=element), k)
                for j, p in enumerate(picks):
                    out[t, j] = p
            t += 1
    return out
