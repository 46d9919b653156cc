"""Reference npu_quant_lightning_indexer (Atlas A2 / A3 int8 path), written from the op doc
(op-plugin ``torch_npu-npu_quant_lightning_indexer.md``), the official golden
(``test/test_custom_ops/test_npu_quant_lightning_indexer.py``) and the fp16 staging of the
ops-transformer arch22 kernel (``quant_lightning_indexer_service_vector_arch22.h`` ``ProcessVec0``:
``w * qs`` multiplied as half; ``quant_lightning_indexer_service_cube_arch22.h`` ``FixpSToL1``:
relu and 2**-10 on the int32 dot, out as fp16; ``ComputeWs``: fp16 x fp16 into fp32; ``ProcessVec1``:
times the fp32-cast key scale). Plain loops: Python-int dot products, ``np.float16`` /
``np.float32`` scalars for each rounding, keys and key scales read through ``block_table`` one
token at a time.

No code shared with ``ascend_emu``. ``stage_ws`` / ``stage_s`` switch either fp16 rounding off
(the scores then follow the doc's formula in fp32), so a test can show that its data tells the
staged chain from the unstaged one.

The Ascend 950's FP8 E4M3 / HiF8 paths (``element``): query and key codes decoded with the
bit-field decoders of :mod:`tests.reference.formats_950`, dots summed exactly (Python floats of
exact products; the tests keep them exact in fp32), ``s = relu(dot)`` with no 1/1024 and no fp16
staging (the arch35 kernel stages only int32 QK; ``stage_s=True`` gives op-plugin's 950 golden
chain instead, ``fp16(relu(dot) / 1024)``), ``ws`` rounded to fp16 only for fp16 x fp16.
"""

from __future__ import annotations

import numpy as np

from .formats_950 import fp8_table, hif8_decode
from .layouts import kv_position_to_row
from .lightning_indexer import PAD_INDEX, _batch_rows, top_k


def _values(codes, element: str) -> list:
    """Python numbers of a row of codes: ints for int8, decoded floats for FP8 / HiF8 (uint8 codes)."""
    if element == "int8":
        return [int(v) for v in codes]
    u8 = np.asarray(codes).view(np.uint8)
    if element == "hifloat8":
        return [hif8_decode(int(c)) for c in u8]
    return [float(fp8_table(element)[int(c)]) for c in u8]


def _key_rows(key, key_dequant_scale, b, kv_len, *, layout_key, block_table, kv_start, element="int8"):
    """Python-int keys ``[kv_len][D]`` and fp32 key scales ``[kv_len]`` of batch ``b`` (head 0)."""
    d = key.shape[-1]
    rows = key.reshape(-1, key.shape[-2], d)
    scales = key_dequant_scale.reshape(-1, key_dequant_scale.shape[-1])
    where = dict(s2=key.shape[1] if layout_key == "BSND" else None, kv_starts={b: kv_start},
                 block_table=block_table, block_size=key.shape[1] if layout_key == "PA_BSND" else None)
    keys, ks = [], []
    for p in range(kv_len):
        r = kv_position_to_row(layout_key, b, p, **where)
        keys.append(_values(rows[r, 0], element))
        ks.append(np.float32(scales[r, 0]))
    return keys, ks


def row_scores(q_row, w_row, qs_row, keys, ks, *, stage_ws=True, stage_s=True, element="int8"):
    """fp32 scores of one query token: ``sum_h ws[h] * s[h, p]`` (head order, fp32) times
    ``ks[p]``, with ``ws = fp16(w * qs)`` and ``s = fp16(relu(q . k) / 1024)`` (FP8 / HiF8:
    ``s = fp32(relu(q . k))``)."""
    n1 = q_row.shape[0]
    q = [_values(q_row[h], element) for h in range(n1)]
    ws = []
    for h in range(n1):
        prod = np.float32(w_row[h]) * np.float32(qs_row[h])  # exact: 11 x 11 significand bits
        ws.append(np.float32(np.float16(prod)) if stage_ws else prod)
    out = []
    for p, k in enumerate(keys):
        acc = np.float32(0.0)
        for h in range(n1):
            dot = sum(a * c for a, c in zip(q[h], k, strict=True))
            if element != "int8" and not stage_s:
                s = np.float32(max(dot, 0))
            else:
                s = np.float32(max(dot, 0)) / np.float32(1024.0)
            if stage_s:
                s = np.float32(np.float16(s))
            acc = np.float32(acc + np.float32(ws[h] * s))
        out.append(np.float32(acc * ks[p]))
    return out


def quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, *,
                            actual_seq_lengths_query=None, actual_seq_lengths_key=None, block_table=None,
                            layout_query="BSND", layout_key="BSND", sparse_count=2048, sparse_mode=3,
                            stage_ws=None, stage_s=None, element="int8"):
    """Reference of ``npu_quant_lightning_indexer`` (key heads N2 = 1). ``element``: ``int8``, or
    the Ascend 950's ``float8_e4m3fn`` / ``hifloat8`` (codes as uint8). ``stage_ws`` (default: True
    for int8; for the others True only when weights are fp16) rounds ``w * qs`` to fp16;
    ``stage_s`` (default: True for int8, False otherwise).

    Returns:
        ``(indices, scores)``: int32 indices of the op's output shape (-1 past the selected
        positions and in rows the kernel skips) and ``scores[t]``, the fp32 scores of token t's
        visible kv positions (None for skipped rows).
    """
    k = sparse_count
    n1 = query.shape[-2]
    if layout_query == "BSND":
        b_count, s1 = query.shape[:2]
        q_rows = query.reshape(-1, n1, query.shape[-1])
        q_lens = [s1] * b_count if actual_seq_lengths_query is None else list(actual_seq_lengths_query)
        q_batches = _batch_rows(s1, q_lens, prefix=False)
    else:
        q_rows = query
        q_batches = _batch_rows(None, list(actual_seq_lengths_query), prefix=True)
        b_count = len(q_batches)
    w_rows = weights.reshape(-1, n1)
    if stage_ws is None:
        stage_ws = element == "int8" or weights.dtype == np.float16
    if stage_s is None:
        stage_s = element == "int8"
    qs_rows = query_dequant_scale.reshape(-1, n1)
    t_total = q_rows.shape[0]
    if layout_key == "TND":
        kv = _batch_rows(None, list(actual_seq_lengths_key), prefix=True)
    else:
        s2 = key.shape[1] if layout_key == "BSND" else None
        lens = [s2] * b_count if actual_seq_lengths_key is None else list(actual_seq_lengths_key)
        kv = [(0, int(v)) for v in lens]
    indices = np.full((t_total, k), PAD_INDEX, np.int32)
    scores = [None] * t_total
    for b in range(b_count):
        q_start, n_q = q_batches[b]
        kv_start, n_k = kv[b]
        if n_q == 0 or n_k == 0:
            continue
        keys, ks = _key_rows(key, key_dequant_scale, b, n_k, layout_key=layout_key, block_table=block_table,
                             kv_start=kv_start, element=element)
        for s in range(n_q):
            t = q_start + s
            limit = n_k if sparse_mode == 0 else min(n_k, max(0, n_k - n_q + s + 1))
            sc = row_scores(q_rows[t], w_rows[t], qs_rows[t], keys[:limit], ks[:limit], stage_ws=stage_ws,
                            stage_s=stage_s, element=element)
            scores[t] = sc
            for j, p in enumerate(top_k(sc, k)):
                indices[t, j] = p
    shape = (query.shape[0], query.shape[1], 1, k) if layout_query == "BSND" else (t_total, 1, k)
    return indices.reshape(shape), scores
