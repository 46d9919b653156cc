"""DeepSeek-V4's indexer key writers on the CPU: the work behind :mod:`ascend_emu.ops.indexer_compress_epilog`.

The rows written are quantized at once (:func:`ascend_emu.quant.v4.indexer_quant_fp8` /
:func:`~ascend_emu.quant.v4.indexer_quant_mx`) and copied into the caches' bytes with one
fancy-indexed assignment per part (distinct slots: the order does not matter).
"""

from __future__ import annotations

import numpy as np

from ..ops._v4_writers import V4WriterArgs, V4WriterOutputs
from ..quant import v4 as codec
from .kv_compress_epilog import as_bytes, scatter_rows


def indexer_compress_epilog(args: V4WriterArgs) -> V4WriterOutputs:
    """Encode ``x[tokens]`` and write values and scales at ``slots``; returns the caches."""
    xs = args.x[args.tokens]
    slots = args.slots
    if args.kind == "indexer":
        if slots.size:
            if args.quant_mode == 1:
                values, scales = codec.indexer_quant_fp8(xs, args.fp8)
                scale_bytes = scales.astype("<f4").view(np.uint8)
            else:
                values, scale_bytes = codec.indexer_quant_mx(xs, args.fp8, round_scale=args.round_scale)
            as_bytes(args.cache).reshape(-1, values.shape[1])[slots] = values
            as_bytes(args.scale_cache).reshape(-1, scale_bytes.shape[1])[slots] = scale_bytes
        return V4WriterOutputs((args.cache, args.scale_cache))
    # indexer_v2: the packed uint8 cache
    if slots.size:
        d = args.x.shape[1]
        values, scales = codec.indexer_quant_fp8(xs)
        row_bytes = args.block_stride // args.block_size
        voff, soff = codec.indexer_v2_offsets(slots, d, args.block_size, row_bytes, args.block_stride)
        flat = as_bytes(args.cache)
        scatter_rows(flat, voff, values)
        scatter_rows(flat, soff, np.ascontiguousarray(scales.astype("<f4")).view(np.uint8))
    return V4WriterOutputs((args.cache,))
