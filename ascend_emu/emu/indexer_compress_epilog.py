"""DeepSeek-V4's indexer key writers on the CPU: the work behind :mod:`ascend_emu.ops.indexer_compress_epilog`.

The fp32-scale quant (the recipes' quant_mode 1 and the ``_v2`` packed cache) runs in one Numba
pass (:func:`.kv_compress_epilog.indexer_fp8_rows`, :func:`~ascend_emu.quant.v4.indexer_quant_fp8`'s
arithmetic) storing values and scales at their byte offsets; the MX quant (quant_mode 0) in
``kv_compress_epilog``'s quant_mode 2 pass (:func:`.kv_compress_epilog.mode2_rows`,
:func:`~ascend_emu.quant.v4.indexer_quant_mx`'s arithmetic: E8M0 bytes per 128 values, no rope
part). The slots are distinct, so the order of the rows does not matter.
"""

from __future__ import annotations

import numpy as np

from ..ops._v4_writers import V4WriterArgs, V4WriterOutputs
from ..quant import v4 as codec
from ..quant.fp8 import FP8_MAX
from .kv_compress_epilog import as_bytes, fp32_scaled, mode2


def indexer_compress_epilog(args: V4WriterArgs) -> V4WriterOutputs:
    """Encode ``x[tokens]`` and write values and scales at ``slots``; returns the caches."""
    if args.kind == "indexer":
        if args.slots.size:
            d = args.x.shape[1]
            n = -(-d // codec.INDEXER_GROUP)
            dst, scale_dst = as_bytes(args.cache), as_bytes(args.scale_cache)
            if args.quant_mode == 1:
                fp32_scaled(args, dst, scale_dst, (1, d, 0, 0, 4 * n, 0, 0), _inv(args.fp8), d)
            else:  # MX: E8M0 bytes per 128 values (quant/v4.py indexer_quant_mx)
                mode2(args, dst, scale_dst, (1, d, 0, 0, n, 0, 0), d, 0, 0)
        return V4WriterOutputs((args.cache, args.scale_cache))
    # indexer_v2: the packed uint8 cache
    if args.slots.size:
        d = args.x.shape[1]
        geo = codec.indexer_v2_geometry(d, args.block_size, args.block_stride // args.block_size, args.block_stride)
        flat = as_bytes(args.cache)
        fp32_scaled(args, flat, flat, (args.block_size, geo["block_stride"], 0, d, geo["block_stride"],
                                       geo["scale_base"], geo["scale_row"]), _inv(args.fp8), d)
    return V4WriterOutputs((args.cache,))


def _inv(name: str) -> np.float32:
    """The indexer kernel's fp32 ``1 / fp8 max`` (E4M3FN: its constant; E5M2: computed in fp32)."""
    inv = codec.INDEXER_INV_FP8_MAX if name == "float8_e4m3fn" else np.float32(np.float32(1.0) /
                                                                               np.float32(FP8_MAX[name]))
    return inv
