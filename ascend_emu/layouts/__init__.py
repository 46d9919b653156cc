"""Storage layouts: matrix FRACTAL_NZ and the paged KV-cache modes (docs/sources.md#fractal_nz, docs/sources.md#paged_nz, docs/sources.md#cache_index, docs/sources.md#npu_kv_rmsnorm_rope_cache)."""

from .. import _kernel_cache  # noqa: F401  (before any kernel: caches them keyed on the sources)
from .nz import (ACL_FORMAT_NAMES, FRACTAL_NZ, ND, NZ_950_DTYPES, NZ_DTYPES, NZArray, as_nz, c0_for, get_npu_format, nd_to_nz,
                 nz_coords, nz_offset, nz_shape, nz_to_nd)
from .paged import (CACHE_MODE_ALIASES, CACHE_MODE_TRAITS, CACHE_MODES, HEAD_MAJOR_MODES, NZ_BLOCK_ROWS, NZ_ROW_BYTES, CacheLayout,
                    CacheLocation, CacheMode, CacheModeTraits, cache_mode_traits, canonical_cache_mode,
                    check_block_size, is_nz_mode)
from .slots import (SKIP_INDEX, blocks_from_block_table, check_index_range, duplicate_slots, slot_of_block_row,
                    slots_from_block_table, slots_from_cache_index, slots_from_index_rows, slots_from_pages,
                    slots_from_positions)

__all__ = [
    "ACL_FORMAT_NAMES", "FRACTAL_NZ", "ND", "NZ_950_DTYPES", "NZ_DTYPES", "NZArray", "as_nz", "c0_for", "get_npu_format", "nd_to_nz",
    "nz_coords", "nz_offset", "nz_shape", "nz_to_nd",
    "CACHE_MODE_ALIASES", "CACHE_MODE_TRAITS", "CACHE_MODES", "HEAD_MAJOR_MODES", "NZ_BLOCK_ROWS", "NZ_ROW_BYTES", "SKIP_INDEX", "CacheLayout",
    "CacheLocation", "CacheMode", "CacheModeTraits", "cache_mode_traits", "canonical_cache_mode", "check_block_size", "check_index_range",
    "duplicate_slots", "is_nz_mode", "blocks_from_block_table", "slot_of_block_row",
    "slots_from_block_table", "slots_from_cache_index", "slots_from_index_rows", "slots_from_pages", "slots_from_positions",
]
