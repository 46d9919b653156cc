"""Reference npu_scatter_pa_kv_cache / npu_gather_pa_kv_cache: plain loops over tokens and
elements, written from the op-plugin goldens (``test/test_custom_ops/test_scatter_pa_kv_cache.py``
``supported_op_exec`` / ``supported_op_exec_nd``; ``test_npu_gather_pa_kv_cache.py``
``gather_pa_kv_cache_nd`` / ``_nz``) and ops-transformer's ``aclnnScatterPaKvCache.md`` /
``aclnnGatherPaKvCache.md``, independently of ``ascend_emu``; imports only numpy.

Caches are given in their 4-D shapes: Norm ``[nb, bs, N, D]``, PA_NZ ``[nb, N*D/C0, bs, C0]``.
Elements are copied one by one (same dtype: the copies are exact).
"""

from __future__ import annotations

import numpy as np


def scatter(key, value, key_cache, value_cache, slot_mapping, cache_mode):
    """New caches after the scatter: token ``i`` with ``slot = slot_mapping[i] >= 0`` goes to
    block ``slot // bs``, row ``slot % bs`` (later tokens overwrite earlier ones)."""
    kc, vc = key_cache.copy(), value_cache.copy()
    bs = kc.shape[1] if cache_mode == "Norm" else kc.shape[2]
    for i in range(key.shape[0]):
        slot = int(slot_mapping[i])
        if slot < 0:
            continue
        blk, row = slot // bs, slot % bs
        for src, cache in ((key, kc), (value, vc)):
            if cache_mode == "Norm":
                for h in range(src.shape[1]):
                    for d in range(src.shape[2]):
                        cache[blk, row, h, d] = src[i, h, d]
            else:
                flat = src[i].reshape(-1)
                c0 = cache.shape[3]
                for e in range(flat.size):
                    cache[blk, e // c0, row, e % c0] = flat[e]
    return kc, vc


def gather(key_cache, value_cache, block_tables, seq_lens, key_shape, value_shape, seq_offset, cumsum, cache_mode):
    """New key / value: token ``j`` of batch ``i`` (in batch order) from block
    ``block_tables[i, seq_offset[i] // bs + j // bs]``, row ``j % bs``."""
    lens = [int(seq_lens[i + 1] - seq_lens[i]) for i in range(len(seq_lens) - 1)] if cumsum else \
        [int(x) for x in seq_lens]
    key = np.zeros(key_shape, key_cache.dtype)
    value = np.zeros(value_shape, value_cache.dtype)
    bs = key_cache.shape[1] if cache_mode == "Norm" else key_cache.shape[2]
    t = 0
    for i, n in enumerate(lens):
        start = 0 if seq_offset is None else int(seq_offset[i]) // bs
        for j in range(n):
            blk = int(block_tables[i, start + j // bs])
            row = j % bs
            for out, cache in ((key, key_cache), (value, value_cache)):
                if cache_mode == "Norm":
                    out[t] = cache[blk, row]
                else:
                    flat = out[t].reshape(-1)
                    c0 = cache.shape[3]
                    for e in range(flat.size):
                        flat[e] = cache[blk, e // c0, row, e % c0]
            t += 1
    return key, value
