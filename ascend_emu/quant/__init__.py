"""Rounding, int8 quant schemes and combined cache rows (docs/sources.md#quant_rounding, docs/sources.md#per_tile_rows); the Ascend 950's
8-bit formats: HiFloat8, FP8 E4M3FN / E5M2 and MX block scaling (docs/formats.md)."""

from .. import _kernel_cache  # noqa: F401  (before any kernel: caches them keyed on the sources)
from .combined import (MLA_ROW, NOPE_DIM, NOPE_OFFSET, NUM_TILES, ROPE_DIM, ROPE_OFFSET, ROW_BYTES,
                       SCALE_OFFSET, TILE_SIZE, CombinedRowFormat, read_combined_cache)
from .fp8 import (FP8_DTYPES, FP8_EMAX, FP8_MAX, TORCH_NPU_DTYPE_CODES, TORCH_NPU_DTYPE_NAMES, fp8_dtype, fp8_name,
                  fp8_to_f32, to_fp8)
from .hifloat8 import (HIF8_INF_THRESHOLD, HIF8_MAX, HIF8_MIN_POSITIVE, HIF8_NAN, HIF8_NEG_INF, HIF8_POS_INF,
                       HIF8_ROUNDING, HIF8_VALUES, hif8_to_f32, to_hif8)
from .mx import (E8M0_BIAS, E8M0_NAN, MX_BLOCK_SIZE, MX_MAX_BLOCK_SIZE, SCALE_ALGS, e8m0_to_f32, mx_dequantize,
                 mx_quantize, mx_scale_bytes, mx_scale_shape)
from .rounding import (BF16, INT8_MAX, INT8_MIN, bf16_bits_to_f32, bf16_to_f32, f32_bits_to_bf16_bits,
                       f32_to_bf16_bits, f32_to_f16, f32_to_int8, f32_to_int8_via_f16, real_to_f32, round_half_away,
                       round_half_even, saturate_int8, to_bf16, to_f32, ulp_distance)
from .schemes import (GRANULARITIES, RECIPROCAL_127_GRANULARITIES, ZERO_GROUP_POLICY, dequantize,
                      dynamic_scale, group_amax, inverse_scale, quantize_dynamic, quantize_static,
                      quantize_with_dequant_scale)
from .schemes import (INT4_MAX, INT4_PER_INT32, TOKEN_SCALE_FORMS, pack_int4_to_int32, unpack_int4_from_int32,
                      quantize_per_token_multiplier)

__all__ = [
    "MLA_ROW", "NOPE_DIM", "NOPE_OFFSET", "NUM_TILES", "ROPE_DIM", "ROPE_OFFSET", "ROW_BYTES",
    "SCALE_OFFSET", "TILE_SIZE", "CombinedRowFormat", "read_combined_cache",
    "BF16", "INT8_MAX", "INT8_MIN", "bf16_bits_to_f32", "bf16_to_f32", "f32_bits_to_bf16_bits",
    "f32_to_bf16_bits", "f32_to_f16", "f32_to_int8", "f32_to_int8_via_f16", "round_half_away",
    "round_half_even", "saturate_int8", "to_bf16", "to_f32", "ulp_distance", "real_to_f32",
    "FP8_DTYPES", "FP8_EMAX", "FP8_MAX", "TORCH_NPU_DTYPE_CODES", "TORCH_NPU_DTYPE_NAMES", "fp8_dtype", "fp8_name",
    "fp8_to_f32", "to_fp8",
    "HIF8_INF_THRESHOLD", "HIF8_MAX", "HIF8_MIN_POSITIVE", "HIF8_NAN", "HIF8_NEG_INF", "HIF8_POS_INF",
    "HIF8_ROUNDING", "HIF8_VALUES", "hif8_to_f32", "to_hif8",
    "E8M0_BIAS", "E8M0_NAN", "MX_BLOCK_SIZE", "MX_MAX_BLOCK_SIZE", "SCALE_ALGS", "e8m0_to_f32", "mx_dequantize",
    "mx_quantize", "mx_scale_bytes", "mx_scale_shape",
    "GRANULARITIES", "RECIPROCAL_127_GRANULARITIES", "ZERO_GROUP_POLICY", "dequantize",
    "dynamic_scale", "group_amax", "inverse_scale", "quantize_dynamic", "quantize_static",
    "quantize_with_dequant_scale",
    "INT4_MAX", "INT4_PER_INT32", "TOKEN_SCALE_FORMS", "pack_int4_to_int32", "unpack_int4_from_int32",
    "quantize_per_token_multiplier",
]
