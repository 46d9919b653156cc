"""DeepSeek-V4's indexer key writers on the CPU: the work behind :mod:`ascend_emu.ops.indexer_compress_epilog`.

The fp32-scale quant (the recipes' quant_mode 1 and the ``_v2`` packed cache) runs in one Numba
pass (:func:`.kv_compress_epilog.indexer_fp8_rows`, :func:`~ascend_emu.quant.v4.indexer_quant_fp8`'s
arithmetic) storing values and scales at their byte offsets; the MX quant (quant_mode 0) encodes
with :func:`~ascend_emu.quant.v4.indexer_quant_mx` and copies with one fancy-indexed assignment
per part (distinct slots: the order does not matter).
"""

from __future__ import annotations

import numpy as np

from ..ops._v4_writers import V4WriterArgs, V4WriterOutputs
from ..quant import v4 as codec
from ..quant.fp8 import FP8_MAX
from .kv_compress_epilog import FP8_FORMATS, as_bytes, geometry, indexer_fp8_rows


def indexer_compress_epilog(args: V4WriterArgs) -> V4WriterOutputs:
    """Encode ``x[tokens]`` and write values and scales at ``slots``; returns the caches."""
    slots = args.slots
    if args.kind == "indexer":
        if slots.size:
            d = args.x.shape[1]
            if args.quant_mode == 1:
                n = -(-d // codec.INDEXER_GROUP)
                _fp8_rows(args, as_bytes(args.cache), as_bytes(args.scale_cache), (1, d, 0, 0, 4 * n, 0, 0))
            else:
                xs = args.x[args.tokens]
                values, scale_bytes = codec.indexer_quant_mx(xs, args.fp8, round_scale=args.round_scale)
                as_bytes(args.cache).reshape(-1, values.shape[1])[slots] = values
                as_bytes(args.scale_cache).reshape(-1, scale_bytes.shape[1])[slots] = scale_bytes
        return V4WriterOutputs((args.cache, args.scale_cache))
    # indexer_v2: the packed uint8 cache
    if slots.size:
        d = args.x.shape[1]
        geo = codec.indexer_v2_geometry(d, args.block_size, args.block_stride // args.block_size, args.block_stride)
        flat = as_bytes(args.cache)
        _fp8_rows(args, flat, flat, (args.block_size, geo["block_stride"], 0, d, geo["block_stride"],
                                     geo["scale_base"], geo["scale_row"]))
    return V4WriterOutputs((args.cache,))


def _fp8_rows(args: V4WriterArgs, dst: np.ndarray, scale_dst: np.ndarray, placement: tuple) -> None:
    """The fp32-scale indexer quant of ``x[tokens]`` by :func:`.kv_compress_epilog.indexer_fp8_rows`,
    placed by ``placement`` (:data:`.kv_compress_epilog.GEO_FIELDS`)."""
    inv = codec.INDEXER_INV_FP8_MAX if args.fp8 == "float8_e4m3fn" else np.float32(np.float32(1.0) /
                                                                                   np.float32(FP8_MAX[args.fp8]))
    geo = geometry(*placement, int(args.x.dtype == np.float16), *FP8_FORMATS[args.fp8])
    indexer_fp8_rows(dst, scale_dst, np.ascontiguousarray(args.x).view(np.uint16), args.tokens, args.slots, geo, inv)
