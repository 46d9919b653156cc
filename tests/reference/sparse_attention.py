"""Reference sparse flash attention (npu_sparse_flash_attention / npu_kv_quant_sparse_flash_attention):
plain loops over query tokens, ``sparse_indices`` entries and ``block_table``, vLLM style.

Written from the spec (docs/sources.md#npu_kv_quant_sparse_flash_attention, docs/sources.md#npu_sparse_flash_attention, the op-plugin goldens' gather / mask / softmax),
independently of the kernels: its own block-table walk and its own 656-byte row decoding. Its
fp32 evaluation order: products rounded to fp32 and summed in element order (``np.cumsum`` is
sequential), exp in float64 rounded to fp32, query-dtype roundings by ml_dtypes / NumPy casts
(RNE). The emulator's matmuls sum in BLAS order instead, so some last bits differ.

The Ascend 950's rows (HiF8 / FP8 E4M3 k_nope bytes) are decoded with the bit-field decoders of
:mod:`tests.reference.formats_950`; sinks follow op-plugin's golden softmax (the sink joins the
max, and ``exp(sink - max)`` starts the sum).
"""

from __future__ import annotations

import numpy as np

from ascend_emu.mla import D_ROPE as ROPE
from ascend_emu.mla import HCKV as NOPE
from ascend_emu.mla import TILE_SIZE as TILE

from .formats_950 import fp8_table, hif8_decode
from .layouts import kv_position_to_row


def seq_sum(products: np.ndarray) -> np.ndarray:
    """Sum over the last axis, element by element in order, in fp32."""
    return np.cumsum(products.astype(np.float32), axis=-1, dtype=np.float32)[..., -1]


def element_values(codes: np.ndarray, element: str) -> np.ndarray:
    """fp32 values of one-byte k_nope codes (uint8) read as ``element``."""
    if element == "int8":
        return codes.view(np.int8).astype(np.float32)
    if element == "hifloat8":
        return np.array([hif8_decode(c) for c in codes.reshape(-1)], np.float32).reshape(codes.shape)
    return fp8_table(element)[codes].astype(np.float32)


def decode_rows(rows: np.ndarray, qdt, element: str = "int8") -> tuple[np.ndarray, np.ndarray]:
    """656-byte per-tile rows -> (k_nope in the query dtype, k_rope read as the query dtype)."""
    rows = np.ascontiguousarray(rows).view(np.uint8)
    nope = element_values(rows[:, :NOPE], element)  # [L, 512]
    rope = rows[:, NOPE:NOPE + 2 * ROPE].copy().view(qdt)  # [L, 64]
    scales = rows[:, NOPE + 2 * ROPE:].copy().view(np.float32)  # [L, 4]
    k_nope = (nope * np.repeat(scales, TILE, axis=1)).astype(np.float32).astype(qdt)  # [L, 512]
    return k_nope, rope


def reference(query, key, value, sparse_indices, scale_value, *, quant, query_rope=None, key_rope=None,
              block_table=None, actual_seq_lengths_query=None, actual_seq_lengths_kv=None, sparse_block_size=1,
              layout_query="BSND", layout_kv="BSND", sparse_mode=3, element="int8", sinks=None):
    """Returns ``(out, softmax_max, softmax_sum, valid)``: out like the op's attention_out (0 where
    a (token, head) has no kv token); softmax_max / softmax_sum fp32 ``[T, N2, G]`` (NaN where
    invalid); ``valid`` bool ``[T, N2]``. ``element``: the k_nope type of 656-byte rows;
    ``sinks``: fp32 ``[N1]`` or None."""
    qdt = query.dtype
    n1 = query.shape[-2]
    q = query.reshape(-1, n1, query.shape[-1])  # [T, N1, Dq]
    t_total = q.shape[0]
    if not quant:
        q = np.concatenate([q, query_rope.reshape(t_total, n1, ROPE)], axis=-1)  # [T, N1, 576]
    n2 = key.shape[-2]
    g_size = n1 // n2
    idx = sparse_indices.reshape(t_total, n2, -1)  # [T, N2, K]
    key_rows = key.reshape(-1, n2, key.shape[-1])  # [R, N2, D]
    if not quant:
        rope_rows = key_rope.reshape(-1, n2, ROPE)
        value_rows = (key if value is None else value).reshape(-1, n2, NOPE)
    # batches and per-token positions
    if layout_query == "BSND":
        b_size, s1 = query.shape[:2]
        act_q = [s1] * b_size if actual_seq_lengths_query is None else [int(x) for x in actual_seq_lengths_query]
        tokens = [(b, s, b * s1 + s) for b in range(b_size) for s in range(s1)]
    else:
        ends = [int(x) for x in actual_seq_lengths_query]
        b_size = len(ends)
        act_q = [e - (ends[i - 1] if i else 0) for i, e in enumerate(ends)]
        tokens = [(b, s, (ends[b - 1] if b else 0) + s) for b in range(b_size) for s in range(act_q[b])]
    if layout_kv == "TND":
        ends = [int(x) for x in actual_seq_lengths_kv]
        act_kv = [e - (ends[i - 1] if i else 0) for i, e in enumerate(ends)]
        kv_starts = [ends[i - 1] if i else 0 for i in range(b_size)]
    elif actual_seq_lengths_kv is None:
        act_kv, kv_starts = [key.shape[1]] * b_size, None
    else:
        act_kv, kv_starts = [int(x) for x in actual_seq_lengths_kv], None
    where = dict(s2=key.shape[1] if layout_kv == "BSND" else None, kv_starts=kv_starts, block_table=block_table,
                 block_size=key.shape[1] if layout_kv == "PA_BSND" else None)

    out = np.zeros((t_total, n1, NOPE), dtype=np.float32)
    smax = np.full((t_total, n2, g_size), np.nan, np.float32)
    ssum = np.full((t_total, n2, g_size), np.nan, np.float32)
    valid = np.zeros((t_total, n2), bool)
    for b, s, t in tokens:
        if s >= act_q[b]:
            continue
        limit = act_kv[b] if sparse_mode == 0 else act_kv[b] - act_q[b] + s + 1
        for h in range(n2):
            rows = []
            for block in idx[t, h]:
                if block == -1:
                    break
                for p in range(block * sparse_block_size, min((block + 1) * sparse_block_size, act_kv[b])):
                    if p < limit:
                        rows.append(kv_position_to_row(layout_kv, b, p, **where))
            if not rows:
                continue
            valid[t, h] = True
            if quant:
                k_nope, k_rope = decode_rows(key_rows[rows, h], qdt, element)
                v = k_nope
            else:
                k_nope, k_rope, v = key_rows[rows, h], rope_rows[rows, h], value_rows[rows, h]
            k = np.concatenate([k_nope, k_rope], axis=-1).astype(np.float32)  # [L, 576]
            qh = q[t, h * g_size:(h + 1) * g_size].astype(np.float32)  # [G, 576]
            scores = seq_sum(qh[:, None, :] * k[None, :, :]) * np.float32(scale_value)  # [G, L]
            m = scores.max(axis=-1)  # [G]
            if sinks is not None:
                z = np.asarray(sinks, np.float32)[h * g_size:(h + 1) * g_size]  # [G]
                m = np.maximum(m, z)
                e_z = np.exp((z - m).astype(np.float64)).astype(np.float32)  # [G]
            e = np.exp((scores - m[:, None]).astype(np.float64)).astype(np.float32)  # [G, L]
            total = seq_sum(e if sinks is None else np.concatenate([e_z[:, None], e], axis=1))  # [G]
            p = (e / total[:, None]).astype(qdt).astype(np.float32)  # [G, L]
            o = seq_sum(p[:, :, None].transpose(0, 2, 1) * v.astype(np.float32).T[None, :, :])  # [G, 512]
            out[t, h * g_size:(h + 1) * g_size] = o
            smax[t, h], ssum[t, h] = m, total
    shape = (*query.shape[:-1], NOPE)
    return out.astype(qdt).reshape(shape), smax, ssum, valid
