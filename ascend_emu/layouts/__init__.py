"""Storage layouts: matrix FRACTAL_NZ and the paged KV-cache modes (docs/sources.md#fractal_nz, docs/sources.md#paged_nz, docs/sources.md#cache_index, docs/sources.md#npu_kv_rmsnorm_rope_cache); the DeepSeek-V4 caches (:mod:`.v4`, docs/v4.md)."""

from .. import _kernel_cache  # noqa: F401  (before any kernel: caches them keyed on the sources)
from .nz import (ACL_FORMAT_NAMES, FRACTAL_NZ, ND, NZ_950_DTYPES, NZ_DTYPES, NZArray, as_nz, c0_for, get_npu_format, nd_to_nz,
                 nz_coords, nz_offset, nz_shape, nz_to_nd)
from .paged import (CACHE_MODE_ALIASES, CACHE_MODE_TRAITS, CACHE_MODES, HEAD_MAJOR_MODES, NZ_BLOCK_ROWS, NZ_ROW_BYTES, CacheLayout,
                    CacheLocation, CacheMode, CacheModeTraits, cache_mode_traits, canonical_cache_mode,
                    check_block_size, is_nz_mode)
from .slots import (SKIP_INDEX, blocks_from_block_table, check_index_range, duplicate_slots, slot_of_block_row,
                    slots_from_block_table, slots_from_cache_index, slots_from_index_rows, slots_from_pages,
                    slots_from_positions)
from .v4 import (DSV4_BLOCK_SIZES, STATE_SKIP_BLOCK, V4_CACHE_NAMES, V4_COFF, V4_FP8_ROW_BYTES, V4_HEAD_DIM,
                 V4_INDEXER_DIM, V4_INDEXER_PACKED_ROW, V4_LAYER_KINDS, V4_ROPE_DIM, V4_SOCS, V4_STATE_BLOCK_SIZES,
                 V4_WINDOW, V4_ROPE_THETA, V4_CMP_ROPE_THETA, TokenPlaces, V4Cache, V4LayerCaches, state_block_size,
                 v4_rope_tables)

__all__ = [
    "ACL_FORMAT_NAMES", "FRACTAL_NZ", "ND", "NZ_950_DTYPES", "NZ_DTYPES", "NZArray", "as_nz", "c0_for", "get_npu_format", "nd_to_nz",
    "nz_coords", "nz_offset", "nz_shape", "nz_to_nd",
    "CACHE_MODE_ALIASES", "CACHE_MODE_TRAITS", "CACHE_MODES", "HEAD_MAJOR_MODES", "NZ_BLOCK_ROWS", "NZ_ROW_BYTES", "SKIP_INDEX", "CacheLayout",
    "CacheLocation", "CacheMode", "CacheModeTraits", "cache_mode_traits", "canonical_cache_mode", "check_block_size", "check_index_range",
    "duplicate_slots", "is_nz_mode", "blocks_from_block_table", "slot_of_block_row",
    "slots_from_block_table", "slots_from_cache_index", "slots_from_index_rows", "slots_from_pages", "slots_from_positions",
    "DSV4_BLOCK_SIZES", "STATE_SKIP_BLOCK", "V4_CACHE_NAMES", "V4_COFF", "V4_FP8_ROW_BYTES", "V4_HEAD_DIM",
    "V4_INDEXER_DIM", "V4_INDEXER_PACKED_ROW", "V4_LAYER_KINDS", "V4_ROPE_DIM", "V4_SOCS", "V4_STATE_BLOCK_SIZES",
    "V4_WINDOW", "V4_ROPE_THETA", "V4_CMP_ROPE_THETA", "TokenPlaces", "V4Cache", "V4LayerCaches", "state_block_size",
    "v4_rope_tables",
]
