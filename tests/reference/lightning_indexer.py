"""Reference lightning indexer, written from docs/sources.md#npu_lightning_indexer, the op doc and the official golden
(op-plugin ``test_npu_lightning_indexer.py``) alone: plain loops over batches, query rows and kv
positions, keys read through ``block_table`` one token at a time (vLLM style), float64 scores.

No code shared with ``ascend_emu``: the fills and the tie rule are restated here from the spec.
"""

from __future__ import annotations

import numpy as np

from .layouts import kv_position_to_row

PAD_INDEX = -1
#: Value of unfilled slots of a computed row (kernel: sort buffer initialised to -inf).
PAD_VALUE = -np.inf
#: Value of every slot of a row the kernel skips (query row past its length, empty batch).
SKIPPED_VALUE = 0.0


def _batch_rows(stride, lengths, prefix):
    """(start, count) of each batch's rows: prefix sums (TND) or lengths with a fixed stride."""
    out = []
    if prefix:
        prev = 0
        for v in lengths:
            out.append((prev, int(v) - prev))
            prev = int(v)
    else:
        for b, v in enumerate(lengths):
            out.append((b * stride, int(v)))
    return out


def gather_keys(key, b, kv_len, *, layout_key, block_table=None, kv_start=0):
    """float64 ``[kv_len, D]`` keys of batch ``b`` (head 0), token by token."""
    d = key.shape[-1]
    rows = key.reshape(-1, key.shape[-2], d)  # [R, N2, D]
    where = dict(s2=key.shape[1] if layout_key == "BSND" else None, kv_starts={b: kv_start},
                 block_table=block_table, block_size=key.shape[1] if layout_key == "PA_BSND" else None)
    out = np.zeros((kv_len, d))
    for p in range(kv_len):
        out[p] = rows[kv_position_to_row(layout_key, b, p, **where), 0].astype(np.float64)
    return out


def row_scores(q_row, w_row, keys):
    """float64 ``score[p] = sum_h w[h] * relu(q[h] . k[p])`` for one query token."""
    q = q_row.astype(np.float64)  # [N1, D]
    w = w_row.astype(np.float64)  # [N1]
    scores = np.zeros(keys.shape[0])
    for p in range(keys.shape[0]):
        dots = q @ keys[p]  # [N1]
        scores[p] = float(np.sum(w * np.maximum(dots, 0.0)))
    return scores


def top_k(scores, k):
    """Positions by score descending, equal scores lower position first; at most k."""
    order = sorted(range(len(scores)), key=lambda p: (-scores[p], p))
    return order[:k]


def lightning_indexer(query, key, weights, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                      block_table=None, layout_query="BSND", layout_key="BSND", sparse_count=2048, sparse_mode=3):
    """Reference of ``npu_lightning_indexer`` (key heads N2 = 1).

    Returns:
        ``(indices, values, scores)``: int32 indices and float64 values of the op's output shape
        (values unrounded; PAD_VALUE / SKIPPED_VALUE fills), and ``scores[t]``, the float64 score
        of every visible kv position of query token t (None for skipped rows), for tie checks.
    """
    k = sparse_count
    if layout_query == "BSND":
        b_count, s1 = query.shape[:2]
        q_rows = query.reshape(-1, *query.shape[2:])
        w_rows = weights.reshape(-1, weights.shape[-1])
        q_lens = [s1] * b_count if actual_seq_lengths_query is None else list(actual_seq_lengths_query)
        q_batches = _batch_rows(s1, q_lens, prefix=False)
    else:
        q_rows, w_rows = query, weights
        q_batches = _batch_rows(None, list(actual_seq_lengths_query), prefix=True)
        b_count = len(q_batches)
    t_total = q_rows.shape[0]
    if layout_key == "TND":
        kv = _batch_rows(None, list(actual_seq_lengths_key), prefix=True)
    else:
        s2 = key.shape[1] if layout_key == "BSND" else None
        lens = [s2] * b_count if actual_seq_lengths_key is None else list(actual_seq_lengths_key)
        kv = [(0, int(v)) for v in lens]

    indices = np.full((t_total, k), PAD_INDEX, np.int32)
    values = np.full((t_total, k), SKIPPED_VALUE)
    scores = [None] * t_total
    for b in range(b_count):
        q_start, n_q = q_batches[b]
        kv_start, n_k = kv[b]
        if n_q == 0 or n_k == 0:
            continue
        keys = gather_keys(key, b, n_k, layout_key=layout_key, block_table=block_table, kv_start=kv_start)
        for s in range(n_q):
            t = q_start + s
            limit = n_k if sparse_mode == 0 else min(n_k, max(0, n_k - n_q + s + 1))
            sc = row_scores(q_rows[t], w_rows[t], keys[:limit])
            scores[t] = sc
            chosen = top_k(sc, k)
            values[t, :] = PAD_VALUE
            for j, p in enumerate(chosen):
                indices[t, j] = p
                values[t, j] = sc[p]
    if layout_query == "BSND":
        shape = (query.shape[0], query.shape[1], 1, k)
    else:
        shape = (t_total, 1, k)
    return indices.reshape(shape), values.reshape(shape), scores


def head_sum_kernel_order(prods):
    """fp32 sum of the 64 per-head products ``w[h] * relu(q[h] . k)`` in the A2/A3 kernel's order
    (``DoScale`` / ``DoReduce``, groups of 16 heads): lane i = prods[i] + prods[16 + i] +
    prods[32 + i] + prods[48 + i] left to right, then halving adds 16 -> 8 -> 4 -> 2 -> 1."""
    p = [np.float32(x) for x in prods]
    assert len(p) == 64
    lanes = []
    for i in range(16):
        acc = p[i]
        for grp in range(1, 4):
            acc = np.float32(acc + p[16 * grp + i])
        lanes.append(acc)
    width = 16
    while width > 1:
        width //= 2
        lanes = [np.float32(lanes[i] + lanes[width + i]) for i in range(width)]
    return lanes[0]
