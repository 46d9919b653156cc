"""``npu_sparse_attn_sharedkv`` on the CPU: window + compressed (+ sink) attention, K as V.

Per query token (NumPy; the contract, :mod:`ascend_emu.ops.sparse_attn_sharedkv`, derived each
token's request, position and the cache rows it reads):

1. the rows: the window's original rows (positions ``max(0, p - 127) .. p``, in position order),
   then the compressed rows (HCA: ``0 .. (p + 1) // 128 - 1``; CSA: the indices as given, ``-1``
   dropped), each read through its request's block table, widened exactly to fp32;
2. tiles: the window rows are one tile; the compressed rows follow in tiles of
   :data:`TILE_ROWS` (the NPU's split comes from the metadata plan and is not reproduced);
3. per tile ``S = (q @ K^T) * fp32(softmax_scale)``: fp32 operands (exact products), summed by the
   project's fp32 product (:func:`ascend_emu.emu.matmul.matmul_f32`: BLAS's order), then one
   fp32 multiply;
4. online softmax in fp32: ``m' = max(m, rowmax S)``, ``a = exp(m - m')``, ``P = exp(S - m')``,
   ``l = l * a + rowsum P`` (NumPy's pairwise fp32 sum), ``acc = acc * a + round(P) @ K``, where
   ``round(P)`` is P rounded (RNE) to the cache dtype before the second product (the reading of
   the reference model's kernel, which copies P to the half-precision buffer before its P @ V;
   the README does not say), while ``l`` sums the unrounded P;
5. the sink: ``l += exp(sink - m)`` after the last tile (the denominator only; A2 / A3), or,
   with ``args.sink_init`` (the Ascend 950 kernel, ``kv_quant_sparse_attn_sharedkv``: "maxUb
   initialised from sinks, sumUb to 1.0"), ``m = sink`` and ``l = 1`` before the first tile;
6. ``out = acc / l``, rounded once (RNE) to q's dtype.

The Ascend 950 op reaches this with its 640-byte rows already decoded by its contract to the
bf16 values its vector unit feeds the cube (:mod:`ascend_emu.ops.kv_quant_sparse_attn_sharedkv`).
"""

from __future__ import annotations

import numpy as np

from ..ops.sparse_attn_sharedkv import SharedKvArgs, SharedKvOutputs
from .matmul import matmul_f32, one_blas_thread

#: Compressed rows per online-softmax tile (the window, <= 128 rows, is one tile).
TILE_ROWS = 128


def _f32(rows: np.ndarray) -> np.ndarray:
    return rows.astype(np.float32)


def sparse_attn_sharedkv(args: SharedKvArgs) -> SharedKvOutputs:
    """The emu backend's ``sparse_attn_sharedkv`` (module doc). Returns ``out`` ``[T, N1, 512]``.

    The per-token products (``[N1, 512] @ [512, <= 128]``) run on one OpenBLAS thread
    (:func:`~ascend_emu.emu.matmul.one_blas_thread`: the same bits; OpenBLAS's threads cost more
    than such a product, about 100 times more on a loaded 2-core machine)."""
    with one_blas_thread():
        return _attend(args)


def _attend(args: SharedKvArgs) -> SharedKvOutputs:
    q = args.q
    t, n, d = q.shape
    dtype = q.dtype
    out = np.empty((t, n, d), dtype)
    scale = np.float32(args.softmax_scale)
    sinks = None if args.sinks is None else args.sinks.astype(np.float32)
    for i in range(t):
        b, p = int(args.token_batch[i]), int(args.token_pos[i])
        lo, hi = max(0, p - args.win_left), p + args.win_right
        base = int(args.ori_base[b])
        tiles = [args.ori_rows[args.ori_slots[b, lo - base:hi + 1 - base]]]
        if args.cmp_rows is not None:
            if args.cmp_indices is None:
                pos = np.arange((p + 1) // args.cmp_ratio)
            else:
                pos = args.cmp_indices[i][args.cmp_indices[i] != -1]
            rows = args.cmp_rows[args.cmp_slots[b, pos]]
            tiles += [rows[k:k + TILE_ROWS] for k in range(0, rows.shape[0], TILE_ROWS)]
        qf = _f32(q[i])  # [N, D]
        if args.sink_init:
            m = sinks.copy()
            l_sum = np.ones(n, np.float32)
        else:
            m = np.full(n, -np.inf, np.float32)
            l_sum = np.zeros(n, np.float32)
        acc = np.zeros((n, d), np.float32)
        for kv in tiles:
            k32 = _f32(kv)  # [L, D]
            s = matmul_f32(qf, k32.T) * scale  # [N, L]
            m_new = np.maximum(m, s.max(axis=1))
            with np.errstate(invalid="ignore"):
                alpha = np.exp(m - m_new)  # exp(-inf) = 0 on the first tile
            pexp = np.exp(s - m_new[:, None])
            l_sum = l_sum * alpha + pexp.sum(axis=1, dtype=np.float32)
            acc = acc * alpha[:, None] + matmul_f32(pexp.astype(dtype).astype(np.float32), k32)
            m = m_new
        if sinks is not None and not args.sink_init:
            l_sum = l_sum + np.exp(sinks - m)
        out[i] = (acc / l_sum[:, None]).astype(dtype)
    return SharedKvOutputs(out)
