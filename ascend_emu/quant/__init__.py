"""Rounding, int8 quant schemes and combined cache rows (ops_reference §1.2, §2.2)."""

from .. import _kernel_cache  # noqa: F401  (before any kernel: caches them keyed on the sources)
from .combined import (MLA_ROW, NOPE_DIM, NOPE_OFFSET, NUM_TILES, ROPE_DIM, ROPE_OFFSET, ROW_BYTES,
                       SCALE_OFFSET, TILE_SIZE, CombinedRowFormat, read_combined_cache)
from .rounding import (BF16, INT8_MAX, INT8_MIN, bf16_bits_to_f32, bf16_to_f32, f32_bits_to_bf16_bits,
                       f32_to_bf16_bits, f32_to_f16, f32_to_int8, f32_to_int8_via_f16, round_half_away,
                       round_half_even, saturate_int8, to_bf16, to_f32, ulp_distance)
from .schemes import (GRANULARITIES, RECIPROCAL_127_GRANULARITIES, ZERO_GROUP_POLICY, dequantize,
                      dynamic_scale, group_amax, inverse_scale, quantize_dynamic, quantize_static,
                      quantize_with_dequant_scale)
from .schemes import (INT4_MAX, INT4_PER_INT32, TOKEN_SCALE_FORMS, pack_int4_to_int32,
                      quantize_per_token_multiplier)

__all__ = [
    "MLA_ROW", "NOPE_DIM", "NOPE_OFFSET", "NUM_TILES", "ROPE_DIM", "ROPE_OFFSET", "ROW_BYTES",
    "SCALE_OFFSET", "TILE_SIZE", "CombinedRowFormat", "read_combined_cache",
    "BF16", "INT8_MAX", "INT8_MIN", "bf16_bits_to_f32", "bf16_to_f32", "f32_bits_to_bf16_bits",
    "f32_to_bf16_bits", "f32_to_f16", "f32_to_int8", "f32_to_int8_via_f16", "round_half_away",
    "round_half_even", "saturate_int8", "to_bf16", "to_f32", "ulp_distance",
    "GRANULARITIES", "RECIPROCAL_127_GRANULARITIES", "ZERO_GROUP_POLICY", "dequantize",
    "dynamic_scale", "group_amax", "inverse_scale", "quantize_dynamic", "quantize_static",
    "quantize_with_dequant_scale",
    "INT4_MAX", "INT4_PER_INT32", "TOKEN_SCALE_FORMS", "pack_int4_to_int32", "quantize_per_token_multiplier",
]
