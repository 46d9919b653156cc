"""FP8 E4M3FN / E5M2 element casts as the Ascend 950 performs them, and torch_npu's dtype codes.

Sources: OCP 8-bit Floating Point Specification (OFP8) rev 1.0 (the two layouts); CANN ops-math
``math/cast/op_kernel/arch35/cast_struct.h`` (``float -> fp8_e4m3fn_t`` / ``fp8_e5m2_t`` cast with
``CAST_ROUND_MODE_RINT``; ``half`` / ``bfloat16`` sources are two-step casts through ``float``;
fp8 -> ``float`` is exact); ``ml_dtypes`` implements the same RNE element codec and is used
for it. Where a kernel casts with saturation (the MX quantizers, :mod:`.mx`) the saturating
variant clips to +-max first.

torch_npu's dtype codes (:data:`TORCH_NPU_DTYPE_CODES`): the ACL ``aclDataType`` value plus 256,
as torch_npu 2.14's ``op_plugin/meta/_meta_registrations.py`` maps them
(``TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP`` / ``TORCH_NPU_DTYPE_TO_STRING_MAP``) and Ascend/pytorch's
``torch_npu/csrc/custom_dtype/Init.h`` defines them (``enum class DType``: ``ACL_<type>`` plus
``g_toAclOffset = 256``). They are plain ints; HiF8 and fp4x2 data travel as ``uint8``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import DTypeError, ModeError, arg_error
from .rounding import real_to_f32

#: torch_npu dtype name -> code (``torch_npu.<name>``; ACL enum + 256).
TORCH_NPU_DTYPE_CODES = {
    "int4": 285,
    "hifloat8": 290,
    "float8_e5m2": 291,
    "float8_e4m3fn": 292,
    "float8_e8m0fnu": 293,
    "float4_e2m1fn_x2": 296,
    "float4_e1m2fn_x2": 297,
}
#: ``c10::ScalarType`` value of each torch dtype (the int a torch dtype becomes in an ``int``
#: schema argument; torch_npu's ``TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP``).
SCALAR_TYPE_CODES = {
    "uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5, "float32": 6, "float64": 7,
    "complex32": 8, "complex64": 9, "complex128": 10, "bool": 11, "bfloat16": 15, "float8_e5m2": 23,
    "float8_e4m3fn": 24, "quint4x2": 16,
}
#: code -> torch_npu dtype name.
TORCH_NPU_DTYPE_NAMES = {code: name for name, code in TORCH_NPU_DTYPE_CODES.items()}

#: The FP8 element types: name -> ml_dtypes dtype.
FP8_DTYPES = {
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
#: Largest finite magnitude of each FP8 type (448 = 1.75 * 2**8, 57344 = 1.75 * 2**15).
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
#: Unbiased exponent of that largest value: the ``emax`` of the MX scale (aclnnDynamicMxQuant doc).
FP8_EMAX = {"float8_e4m3fn": 8, "float8_e5m2": 15}


def fp8_dtype(name) -> np.dtype:
    """The ml_dtypes dtype of an FP8 element type.

    Args:
        name: ``"float8_e4m3fn"`` / ``"float8_e5m2"``, the ml_dtypes dtype itself, or the
            torch_npu code 292 / 291.

    Returns:
        ``np.dtype(ml_dtypes.float8_e4m3fn)`` or ``np.dtype(ml_dtypes.float8_e5m2)``.

    Raises:
        ModeError: anything else.
    """
    return FP8_DTYPES[fp8_name(name)]


def fp8_name(name) -> str:
    """``"float8_e4m3fn"`` / ``"float8_e5m2"`` for a name, an ml_dtypes dtype or a torch_npu code.

    Raises:
        ModeError: anything else (HiF8 and E8M0 are not FP8 element types).
    """
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        key = TORCH_NPU_DTYPE_NAMES.get(int(name))
    elif isinstance(name, str):
        key = name
    else:
        try:
            key = np.dtype(name).name
        except TypeError:
            key = None
    if key not in FP8_DTYPES:
        raise arg_error(ModeError, "dtype", "an FP8 element type: 'float8_e4m3fn' (code 292) or 'float8_e5m2' "
                        "(code 291)", repr(name))
    return key



def to_fp8(x, dtype, *, saturate: bool = False) -> np.ndarray:
    """Cast values to an FP8 type: round to nearest, ties to even (``CAST_ROUND_MODE_RINT``).

    fp16 and bf16 are widened to fp32 first (exact), as ops-math's two-step casts do; float64 is
    first rounded to fp32.

    Source: ops-math ``math/cast/op_kernel/arch35/cast_struct.h``; OCP OFP8 rev 1.0; the element
    codec is ``ml_dtypes``'.

    Args:
        x: fp32, fp16 or bf16 values, any shape.
        dtype: ``"float8_e4m3fn"`` / ``"float8_e5m2"`` (or its ml_dtypes dtype or torch_npu code).
        saturate: False: overflow as ml_dtypes / OFP8 define it without saturation (E4M3FN: NaN,
            from ``|x| >= 464``; E5M2: +-Inf, from ``|x| >= 61440``; Inf likewise). True: finite
            values and +-Inf beyond +-max become +-max (448 / 57344), the SAT mode the MX
            quantizer kernels cast with. NaN stays NaN in both.

    Returns:
        New ml_dtypes FP8 array of ``x``'s shape.

    Raises:
        DTypeError: ``x`` is not a real array. ModeError: unknown ``dtype``.
    """
    name = fp8_name(dtype)
    x32 = real_to_f32(x, "x")
    if saturate:
        x32 = np.clip(x32, -FP8_MAX[name], FP8_MAX[name])  # NaN passes through clip
    with np.errstate(over="ignore", invalid="ignore"):
        return x32.astype(FP8_DTYPES[name])


def fp8_to_f32(x) -> np.ndarray:
    """Widen FP8 values to fp32 (exact).

    Args:
        x: an ml_dtypes ``float8_e4m3fn`` / ``float8_e5m2`` array, any shape.

    Returns:
        New fp32 array of ``x``'s shape.

    Raises:
        DTypeError: any other dtype (raw ``uint8`` bytes are not guessed at: view them first).
    """
    x = np.asarray(x)
    if x.dtype not in FP8_DTYPES.values():
        raise arg_error(DTypeError, "x", "an ml_dtypes float8_e4m3fn / float8_e5m2 array", x.dtype)
    return x.astype(np.float32)
