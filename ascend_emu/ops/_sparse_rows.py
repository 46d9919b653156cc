"""The sparse attention contract's index pass: the rows each query token reads, checked.

:func:`sparse_rows` turns ``sparse_indices`` (sparse block ids, -1 ending a row) into cache rows
in one compiled pass and reports the first bad entry; :func:`_raise_bad_index` words it. Split
from :mod:`.sparse_flash_attention`, the contract that calls them (docs/ops.md#npu_sparse_flash_attention).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..errors import IndexRangeError


@functools.lru_cache(maxsize=64)
def _bsnd_tokens(b: int, s1: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch and position of every BSND query token: int64 ``[B*S1]`` each (shared: never write)."""
    return np.repeat(np.arange(b, dtype=np.int64), s1), np.tile(np.arange(s1, dtype=np.int64), b)


def _raise_bad_index(idx, status, tok_b, tok_s, act_kv, sbs: int, q_nd: int) -> None:
    """The IndexRangeError for the first bad sparse index :func:`sparse_rows` found."""
    t, h, j, first_end = (int(v) for v in status[1:])
    kv_len = int(act_kv[tok_b[t]])
    nblk = -(-kv_len // sbs)
    coord = (int(tok_b[t]), int(tok_s[t]), h, j) if q_nd == 4 else (t, h, j)
    at = f"sparse_indices[{', '.join(map(str, coord))}] = {int(idx[t, h, j])}"
    if j > first_end:
        msg = f"{at}: expected -1 after the row's first -1 at entry {first_end} (valid ids first)"
    else:
        msg = (f"{at}: expected a sparse block id in [0, {nblk}) (batch {int(tok_b[t])}: act_kv="
               f"{kv_len}, sparse_block_size={sbs}) or -1 ending the row")
    raise IndexRangeError(f"{msg}; {int(status[0])} bad entries")


@njit(cache=True)
def sparse_rows(idx, tok_b, tok_s, act_q, act_kv, slot_map, sbs, sparse_mode, starts, counts, lengths, status):
    """The kv rows every (token, head, entry) reads, with every read entry checked (module doc,
    "Sparse-index rows"): entry ``i`` before the row's first -1 selects kv positions
    ``[i*sbs, min((i+1)*sbs, limit))`` of the token's batch (``limit``: act_kv, or the causal
    limit of sparse_mode 3); rows of tokens past ``act_q`` are not read.

    Args:
        idx: int32 ``[T, N2, K]`` sparse indices as given (unchecked: checked here before use).
        tok_b, tok_s: int64 ``[T]`` batch and position of each query token.
        act_q, act_kv: int64 ``[B]`` query / kv lengths.
        slot_map: int64 ``[B, W]`` slot of kv position ``p`` of batch ``b`` (W >= every act_kv).
        sbs: sparse block size; sparse_mode: 0 or 3.
        starts, counts, lengths: out, ``[T, N2, K]`` first key row and kept tokens per entry,
            ``[T, N2]`` kept tokens per (token, head); key row = slot * N2 + h.
        status: out, int64 ``[5]``: bad entries (0: none), then the first bad ``(t, h, j)`` in
            row-major order and the first -1 of its row (K: none).
    """
    n_tok, n2, k = idx.shape
    for t in range(n_tok):
        bt = tok_b[t]
        live = tok_s[t] < act_q[bt]
        kv_len = act_kv[bt]
        limit = kv_len
        if sparse_mode != 0:
            limit = min(kv_len - act_q[bt] + tok_s[t] + 1, kv_len)
        nblk = (kv_len + sbs - 1) // sbs
        for h in range(n2):
            total = 0
            first_end = k
            for j in range(k):
                v = idx[t, h, j]
                if first_end == k and v == -1:
                    first_end = j
                starts[t, h, j] = 0
                counts[t, h, j] = 0
                after = j >= first_end
                if not live:
                    continue
                bad = (v != -1) if after else (v < 0 or v >= nblk)
                if bad:
                    if status[0] == 0:
                        status[1], status[2], status[3] = t, h, j
                        status[4] = k
                        for jj in range(k):  # the row's first -1, for the message
                            if idx[t, h, jj] == -1:
                                status[4] = jj
                                break
                    status[0] += 1
                    continue
                if after:
                    continue
                begin = v * sbs
                end = min(begin + sbs, limit)
                if end > begin and begin < slot_map.shape[1]:
                    starts[t, h, j] = slot_map[bt, begin] * n2 + h
                    counts[t, h, j] = end - begin
                    total += end - begin
            lengths[t, h] = total
