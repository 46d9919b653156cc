"""Bit-level cache inspection: where a logical element lives, what a byte means, annotated
dumps, NZ fractal grids, cache diffs and block-table views, plus cache files.

Everything here is pure (no printing) and returns plain dataclasses with ``to_dict()``; the
``ascend-emu inspect`` command renders them as text, JSON or PNG (:mod:`.plot`, needs the
``[plot]`` extra). Built on :mod:`ascend_emu.layouts` (addresses) and :mod:`ascend_emu.quant`
(656-byte combined rows); the issue behind it is "bit-level debugging of cache layouts".
"""

from .address import ByteRange, What, Where, claimed_bytes, what, where
from .cache import CACHE_DTYPES, ByteMap, Cache, CacheSpec, FieldKind, map_bytes

__all__ = ["ByteRange", "What", "Where", "claimed_bytes", "what", "where",
           "CACHE_DTYPES", "ByteMap", "Cache", "CacheSpec", "FieldKind", "map_bytes"]
