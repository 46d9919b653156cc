"""The paged_cache family on the CPU: ``npu_scatter_pa_kv_cache`` / ``npu_gather_pa_kv_cache``.

Pure data movement in NumPy, byte-exact: every cache is viewed as its contiguous chunks
(:attr:`ascend_emu.layouts.CacheLayout.chunk_bytes`: a whole row for Norm, a 32-byte fractal row
for PA_NZ) and :meth:`~ascend_emu.layouts.CacheLayout.chunk_offsets` gives where each token's
chunks live (the layouts' one definition of both modes). Slots are validated by the contract.
"""

from __future__ import annotations

import numpy as np

from ..layouts import CacheLayout
from ..ops.paged_cache import SCATTER, PagedCacheArgs, PagedCacheOutputs


def _chunks(buffer: np.ndarray, layout: CacheLayout) -> np.ndarray:
    """``buffer``'s bytes as ``[nbytes / chunk_bytes, chunk_bytes]`` uint8, a view (C-contiguous)."""
    return np.asarray(buffer).reshape(-1).view(np.uint8).reshape(-1, layout.chunk_bytes)


def _token_bytes(a: np.ndarray, layout: CacheLayout) -> np.ndarray:
    """Token rows ``[T, ...]`` as ``[T, row_bytes / chunk_bytes, chunk_bytes]`` uint8."""
    a = np.ascontiguousarray(np.asarray(a))
    return a.reshape(a.shape[0], -1).view(np.uint8).reshape(a.shape[0], -1, layout.chunk_bytes)


def _last_writes(slots: np.ndarray) -> np.ndarray:
    """Indices of the tokens that write: slot >= 0, and the last token of each duplicate slot."""
    idx = np.flatnonzero(slots >= 0)
    rev = idx[::-1]
    _, first = np.unique(slots[rev], return_index=True)
    return np.sort(rev[first])


def paged_cache(args: PagedCacheArgs) -> PagedCacheOutputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.paged_cache.PagedCacheArgs`.

    Returns:
        :class:`~ascend_emu.ops.paged_cache.PagedCacheOutputs`: the two arrays written in place.
    """
    pairs = ((args.key, args.key_cache, args.k_layout), (args.value, args.value_cache, args.v_layout))
    if args.op == SCATTER:
        tokens = _last_writes(args.slots)  # [t]
        for src, cache, layout in pairs:
            dst = _chunks(cache, layout)
            offsets = layout.chunk_offsets(args.slots[tokens]) // layout.chunk_bytes  # [t, chunks]
            dst[offsets] = _token_bytes(src, layout)[tokens]
    else:
        for out, cache, layout in pairs:
            offsets = layout.chunk_offsets(args.slots) // layout.chunk_bytes  # [T, chunks]
            rows = _chunks(cache, layout)[offsets]  # [T, chunks, chunk_bytes]
            np.asarray(out).reshape(-1).view(np.uint8)[:] = rows.reshape(-1)
    return PagedCacheOutputs(*args.written)
