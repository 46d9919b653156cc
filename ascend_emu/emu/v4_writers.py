"""DeepSeek-V4's cache writers on the CPU: the work behind :mod:`ascend_emu.ops.v4_writers`.

The rows to write (their x rows and distinct slots, checked by the contract) are encoded at once
by the vectorised codecs of :mod:`ascend_emu.quant.v4`, then copied into the cache's bytes with
one fancy-indexed assignment per part (the slots are distinct, so the order of the copies does
not matter). No Numba: the quant is a handful of whole-array NumPy passes and the scatter a
byte copy (``benchmarks/bench_v4_writers.py`` measures both against a copy floor).
"""

from __future__ import annotations

import numpy as np

from ..ops.v4_writers import V4WriterArgs, V4WriterOutputs
from ..quant import v4 as codec


def _bytes(a: np.ndarray) -> np.ndarray:
    """The caller's C-contiguous array as a flat uint8 view (writes land in it)."""
    return a.reshape(-1).view(np.uint8)


def _scatter(flat: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> None:
    """``flat[starts[i] : starts[i] + W] = rows[i]`` for every i (distinct, non-overlapping ranges)."""
    if starts.size:
        flat[starts[:, None] + np.arange(rows.shape[1], dtype=np.int64)] = rows


def v4_writer(args: V4WriterArgs) -> V4WriterOutputs:
    """Encode ``x[tokens]`` and write it at ``slots`` (module doc); returns the caches."""
    xs = args.x[args.tokens]
    slots = args.slots
    if args.kind == "kv_rows":
        if args.quant_mode == 3:
            rows = codec.encode_kv_rows(xs, quant_mode=3, scale=args.scale) if slots.size else None
        else:
            rows = codec.encode_kv_rows(xs, quant_mode=args.quant_mode, dtype=args.fp8, round_scale=args.round_scale,
                                        quant_group_size=args.group) if slots.size else None
        if rows is not None:
            width = rows.shape[1]
            _bytes(args.cache).reshape(-1, width)[slots] = rows
        return V4WriterOutputs((args.cache,))
    if args.kind == "kv_layout2":
        if slots.size:
            d = args.x.shape[1]
            rows = codec.encode_kv_rows(xs, quant_mode=2, dtype=args.fp8, round_scale=args.round_scale,
                                        quant_group_size=args.group)
            value, scale = codec.kv_layout2_parts(rows, d, args.group)
            geo = codec.kv_layout2_geometry(d, args.block_size, args.block_stride, args.group)
            blk, off = slots // args.block_size, slots % args.block_size
            base = blk * args.block_stride
            flat = _bytes(args.cache)
            _scatter(flat, base + off * geo["value_row"], value)
            _scatter(flat, base + geo["scale_base"] + off * geo["scale_row"], scale)
        return V4WriterOutputs((args.cache,))
    if args.kind == "indexer":
        if slots.size:
            if args.quant_mode == 1:
                values, scales = codec.indexer_quant_fp8(xs, args.fp8)
                scale_bytes = scales.astype("<f4").view(np.uint8)
            else:
                values, scale_bytes = codec.indexer_quant_mx(xs, args.fp8, round_scale=args.round_scale)
            _bytes(args.cache).reshape(-1, values.shape[1])[slots] = values
            _bytes(args.scale_cache).reshape(-1, scale_bytes.shape[1])[slots] = scale_bytes
        return V4WriterOutputs((args.cache, args.scale_cache))
    # indexer_v2: the packed uint8 cache
    if slots.size:
        d = args.x.shape[1]
        values, scales = codec.indexer_quant_fp8(xs)
        row_bytes = args.block_stride // args.block_size
        voff, soff = codec.indexer_v2_offsets(slots, d, args.block_size, row_bytes, args.block_stride)
        flat = _bytes(args.cache)
        _scatter(flat, voff, values)
        _scatter(flat, soff, np.ascontiguousarray(scales.astype("<f4")).view(np.uint8))
    return V4WriterOutputs((args.cache,))
