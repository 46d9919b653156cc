"""Bit-level cache inspection: where a logical element lives, what a byte means, annotated
dumps, NZ fractal grids, cache diffs and block-table views, plus cache files; the DeepSeek-V4
caches' views (:mod:`.v4`).

Everything here is pure (no printing) and returns plain dataclasses with ``to_dict()``; the
``ascend-emu inspect`` command (:mod:`.cli`) renders them as text, JSON or PNG (:mod:`.plot`,
needs the ``[plot]`` extra). Built on :mod:`ascend_emu.layouts` (addresses: the same
:class:`~ascend_emu.layouts.CacheLayout` the ops use) and :mod:`ascend_emu.quant` (656-byte
combined rows, :data:`~ascend_emu.quant.MLA_ROW`).

>>> import numpy as np, ml_dtypes
>>> from ascend_emu import inspect
>>> kr = inspect.Cache.from_array(np.zeros((4, 16, 1, 64), ml_dtypes.bfloat16), "PA_NZ")
>>> [(r.start, r.stop) for r in inspect.where(kr, 37).ranges]
[(4256, 4288), (4768, 4800), (5280, 5312), (5792, 5824)]
>>> inspect.what(kr, 4777).dim
20
"""

from .address import (PAGE_INDEX_KINDS, ByteRange, WeightByte, What, Where, claimed_bytes, token_slot, what,
                      what_weight, where)
from .blocks import BlockMap, BlockRun, SequenceBlocks, blocks
from .cache import CACHE_DTYPES, ByteMap, Cache, CacheSpec, FieldKind, map_bytes
from .diff import Diff, FieldDiff, SlotDiff, diff
from .dump import Dump, DumpLine, TileInfo, dump
from .files import FILE_FORMAT, FILE_VERSION, load_cache, save_cache
from .grid import Grid, grid, weight_grid
from .v4 import StateRun, V4Blocks, V4Row, v4_blocks, v4_cache_row, v4_row, v4_token

__all__ = [
    "PAGE_INDEX_KINDS", "ByteRange", "WeightByte", "What", "Where", "claimed_bytes", "token_slot", "what",
    "what_weight", "where",
    "BlockMap", "BlockRun", "SequenceBlocks", "blocks",
    "CACHE_DTYPES", "ByteMap", "Cache", "CacheSpec", "FieldKind", "map_bytes",
    "Diff", "FieldDiff", "SlotDiff", "diff",
    "Dump", "DumpLine", "TileInfo", "dump",
    "FILE_FORMAT", "FILE_VERSION", "load_cache", "save_cache",
    "Grid", "grid", "weight_grid",
    "StateRun", "V4Blocks", "V4Row", "v4_blocks", "v4_cache_row", "v4_row", "v4_token",
]
