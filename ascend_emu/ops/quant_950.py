"""``torch_npu.npu_dtype_cast``, ``torch_npu.npu_dynamic_mx_quant`` and
``torch_npu.npu_dynamic_mx_quant_with_dual_axis`` on NumPy arrays: the contract (the general
cast on every SoC; the Ascend 950's 8-bit types and int4).

Sources: torch_npu 2.14's schemas (``npu_native_functions_by_codegen.yaml``:
``npu_dtype_cast(Tensor self, int dtype, int? input_dtype=None)``, ``npu_dynamic_mx_quant(Tensor
input, *, int axis=-1, str round_mode="rint", int dst_type=296, int block_size=32, int?
scale_alg=0, float dst_type_max=0.0, float max_low_bound=0.0)``) and meta functions
(``op_plugin/meta/_meta_registrations.py``: ``npu_dtype_cast_meta`` gives uint8 for hifloat8,
``TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP`` the torch dtype of every other code;
``npu_dynamic_mx_quant`` the fp8 output of the input's shape and the uint8 scale pairs); op-plugin
``op_plugin/ops/opapi/CastKernelNpuOpApi.cpp`` (``input_dtype`` reinterprets ``self``'s bytes,
hifloat8 output as uint8, then ``aclnnCast``); ops-math ``math/cast/README.md`` (Atlas A3 does
not support HIFLOAT8 / FLOAT8_E5M2 / FLOAT8_E4M3FN) and ops-nn ``quant/dynamic_mx_quant/README.md``
(Ascend 950PR / 950DT only; x FLOAT16 / BFLOAT16; the fp8 ``round_mode`` ``rint``).

Dtype codes are plain ints, as torch_npu takes them: a torch dtype crosses the dispatcher as its
``c10::ScalarType`` value (:data:`SCALAR_TYPE_CODES`: 5 float16, 6 float32, 15 bfloat16, 23
float8_e5m2, 24 float8_e4m3fn), the torch_npu types as ACL enum + 256
(:data:`ascend_emu.quant.TORCH_NPU_DTYPE_CODES`: 290 hifloat8, 291 float8_e5m2, 292 float8_e4m3fn).

On every SoC: ``npu_dtype_cast`` as the general cast of the A2 / A3 doc (op-plugin
``docs/context/（beta）torch_npu-npu_dtype_cast.md``: a dtype conversion, replaceable by
``torch.to``) between :data:`GENERAL_CAST_TYPES` (:func:`npu_dtype_cast`; docs/ops.md#npu_dtype_cast).

What is emulated on an emulated Ascend 950 only (:func:`ascend_emu.soc.require_ascend950`:
elsewhere every call is rejected, naming the SoC and the mode):

- ``npu_dtype_cast``: fp16 / bf16 / fp32 to hifloat8 (:func:`ascend_emu.quant.to_hif8`, codes
  as uint8) or to FP8 E5M2 / E4M3FN (:func:`ascend_emu.quant.to_fp8`, RNE, not saturating: the
  950's INF_NAN mode, E4M3FN overflow is NaN, E5M2 Inf); and back from hifloat8 (uint8 codes with
  ``input_dtype=290``) or FP8 (an fp8 array, or its uint8 bytes with ``input_dtype`` 291 / 292)
  to fp16 / bf16 / fp32 (exact: every HiF8 / FP8 value is an fp16 and a bf16 value); int32 to
  ``torch_npu.int4`` (285, two values a uint8 byte, the wheel's ``npu_dtype_cast_meta``). Other
  pairs with these types (fp4, fp8 <-> hifloat8) are rejected.
- ``npu_dynamic_mx_quant_with_dual_axis``: ``npu_dynamic_mx_quant`` along -1 and -2 in blocks of
  32 (:func:`npu_dynamic_mx_quant_with_dual_axis`).
- ``npu_dynamic_mx_quant``: FP8 E4M3FN / E5M2 elements with E8M0 scale pairs along ``axis``
  (:func:`ascend_emu.quant.mx_quantize`), ``scale_alg`` 0 / 1, ``round_mode`` ``"rint"``;
  fp4 (the schema's default ``dst_type=296``), ``scale_alg`` 2 and the ``dst_type_max`` /
  ``max_low_bound`` options are rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import DTypeError, IndexRangeError, ModeError, ShapeError, arg_error, describe
from ..quant.fp8 import FP8_DTYPES, SCALAR_TYPE_CODES, TORCH_NPU_DTYPE_CODES, TORCH_NPU_DTYPE_NAMES
from ..quant.mx import MX_BLOCK_SIZE, SCALE_ALGS, mx_scale_shape
from ..soc import require_ascend950
from ._backend import get_backend
from ._check import check_call_bytes, dtype_name, required

#: Every dtype code the two ops read -> the type's name (a torch_npu code wins for hifloat8).
DTYPE_CODE_NAMES = {**{code: name for name, code in SCALAR_TYPE_CODES.items()}, **TORCH_NPU_DTYPE_NAMES}
#: The plain float types on the other side of a cast.
CAST_FLOAT_TYPES = ("float16", "bfloat16", "float32")
#: The Ascend 950 element types of the cast: hifloat8 (uint8 codes) and the FP8 types.
CAST_950_TYPES = ("hifloat8", "float8_e5m2", "float8_e4m3fn")
#: The general casts' types (every SoC; the A2 / A3 doc: "a dtype conversion", torch's ``.to()``).
GENERAL_CAST_TYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
                      "float64", "complex64", "complex128")
#: torch_npu.int4 (285): int32 values in [-8, 7] packed two per uint8, the even element in the low
#: nibble (Ascend 950; the meta function halves the last dim).
INT4_CODE = TORCH_NPU_DTYPE_CODES["int4"]
INT4_RANGE = (-8, 7)
#: x dtypes of npu_dynamic_mx_quant (ops-nn README: FLOAT16, BFLOAT16).
MX_QUANT_INPUT_DTYPES = ("float16", "bfloat16")
#: round_mode of npu_dynamic_mx_quant for FP8 outputs (aclnnDynamicMxQuant doc).
MX_ROUND_MODES = ("rint",)


@dataclass(frozen=True)
class Quant950Args:
    """Normalised, validated arguments of the Ascend 950 cast / quant family.

    Attributes:
        op: ``'npu_dtype_cast'`` or ``'npu_dynamic_mx_quant'``.
        x: the input as passed (uint8 bytes for a hifloat8 / FP8 ``input_dtype``).
        src: the input's element type name (``'hifloat8'``, ``'float8_e4m3fn'``, ``'bfloat16'``, ...).
        dst: the output's element type name.
        dtype_code: the caller's ``dtype`` / ``dst_type`` code.
        input_code: the caller's ``input_dtype`` (None when not given; dtype_cast only).
        axis, block_size, scale_alg: the MX quant's (axis normalised to >= 0; 0 for the cast).
    """

    op: str
    x: np.ndarray
    src: str
    dst: str
    dtype_code: int
    input_code: int | None = None
    axis: int = 0
    block_size: int = MX_BLOCK_SIZE
    scale_alg: int = 0


class Quant950Outputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`).

    Attributes:
        y: the cast / quantized values: uint8 HiF8 codes, an ml_dtypes FP8 array, or fp16 /
            bf16 / fp32; x's shape.
        mxscale: npu_dynamic_mx_quant's uint8 E8M0 scale pairs; None for the cast.
    """

    y: np.ndarray
    mxscale: np.ndarray | None = None


def dtype_code(value, name: str) -> int:
    """``value`` checked as a dtype code of :data:`DTYPE_CODE_NAMES` (ModeError naming ``name``).
    A dtype's name (``'float16'``, ``'torch.float16'``, ``'torch_npu.hifloat8'``: how a recorded
    call stores a torch dtype) stands for its code."""
    if isinstance(value, str):
        npu_name = value.startswith("torch_npu.")
        key = value.split(".", 1)[1] if npu_name or value.startswith("torch.") else value
        first, second = (TORCH_NPU_DTYPE_CODES, SCALAR_TYPE_CODES) if npu_name else (SCALAR_TYPE_CODES,
                                                                                   TORCH_NPU_DTYPE_CODES)
        value = first.get(key, second.get(key, value))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise arg_error(ModeError, name, "a dtype code as an int (e.g. 290 hifloat8, 292 float8_e4m3fn, "
                        "15 bfloat16)", describe(value))
    code = int(value)
    if code not in DTYPE_CODE_NAMES:
        raise arg_error(ModeError, name, "a torch ScalarType value (0-24) or a torch_npu dtype code "
                        f"({sorted(TORCH_NPU_DTYPE_CODES.values())})", code)
    return code


def _kind(name: str) -> str:
    """``'b'`` bool, ``'i'`` integer, ``'f'`` real float, ``'c'`` complex (a general cast type)."""
    if name == "bool":
        return "b"
    if name.startswith("complex"):
        return "c"
    return "f" if name.startswith(("float", "bfloat")) else "i"


def _int_range(name: str) -> tuple[int, int]:
    info = np.iinfo(np.dtype(name))
    return int(info.min), int(info.max)


def _check_general(x: np.ndarray, src: str, dst: str, dst_code: int) -> None:
    """The values a general cast ``src -> dst`` takes (stricter than the hardware: values whose
    result the sources leave undefined are rejected, read before anything is written)."""
    sk, dk = _kind(src), _kind(dst)
    if sk == "c" and dk != "c":
        raise arg_error(ModeError, "dtype", "a complex dtype for a complex self (the imaginary part would be "
                        "dropped)", f"{src} -> {dst} (dtype {dst_code})")
    if dk != "i" or x.size == 0:
        return
    lo, hi = _int_range(dst)
    if sk == "f":
        v = x.astype(np.float64)
        finite = v[~np.isnan(v)]  # NaN -> 0 (ops-math cast README)
        if finite.size and (not np.isfinite(finite).all() or np.trunc(finite.min()) < lo
                            or np.trunc(finite.max()) > hi):
            raise arg_error(IndexRangeError, "self", f"values that truncate into [{lo}, {hi}] ({dst}; the cast of "
                            "others is undefined)", f"values in [{finite.min()}, {finite.max()}]")
    elif sk == "i":
        if int(x.min()) < lo or int(x.max()) > hi:
            raise arg_error(IndexRangeError, "self", f"values in [{lo}, {hi}] ({dst}; no wrap-around)",
                            f"values in [{int(x.min())}, {int(x.max())}]")


def npu_dtype_cast(self, dtype, input_dtype=None) -> np.ndarray:
    """``torch_npu.npu_dtype_cast``: the general dtype cast (every SoC), the Ascend 950's
    hifloat8 / FP8 casts, and int32 -> ``torch_npu.int4`` packing (Ascend 950).

    ``self`` is the doc's ``input`` (torch_npu's schema names it ``self``).

    Args:
        self: the values. General cast: any of :data:`GENERAL_CAST_TYPES`. Ascend 950: fp16 /
            bf16 / fp32 to cast to hifloat8 / FP8; uint8 (with ``input_dtype=290``), an ml_dtypes
            ``float8_e5m2`` / ``float8_e4m3fn`` array, or its uint8 bytes (with ``input_dtype``
            291 / 292), to cast back; int32 ``[..., 2k]`` in [-8, 7] to pack as int4.
        dtype: the output type's code: a torch ScalarType value (0 uint8, 1 int8, 2 int16, 3
            int32, 4 int64, 5 float16, 6 float32, 7 float64, 9 complex64, 10 complex128, 11
            bool, 15 bfloat16; 23 / 24 the FP8 types), or a torch_npu code (285 int4, 290
            hifloat8, 291 / 292 FP8).
        input_dtype: None (``self``'s own dtype) or the code of the type ``self``'s bytes hold:
            290 / 291 / 292 for uint8 ``self``, or the code of ``self``'s own dtype.

    Returns:
        New array. General cast: ``self``'s shape in ``dtype``, as torch's CPU ``.to()``
        computes it: floats round to nearest even (a float64 or integer source reaches fp16 /
        bf16 through fp32), floats to integers truncate toward zero with NaN -> 0, to bool ``!=
        0``. Ascend 950: uint8 HiF8 codes (NaN 0x80, +-Inf 0x6F / 0xEF; round to nearest, ties
        away, Inf from 1.25 * 2**15), an ml_dtypes FP8 array (RNE, E4M3FN overflow NaN, E5M2
        overflow +-Inf), or fp16 / bf16 / fp32 values (exact); int4: uint8 ``[..., k]``, element
        2j in the low nibble of byte j, 2j + 1 in the high one (two's complement).

    Raises:
        ModeError: a code that is not an int or not a known type; a pair other than the above
            (complex to real included); a hifloat8 / FP8 / int4 cast on an emulated SoC other
            than an Ascend 950 (message names the SoC and the mode).
        DTypeError: ``self``'s dtype does not fit ``input_dtype`` (or, without it, is not one of
            the types above); int4 from anything but int32.
        IndexRangeError: values whose cast the sources leave undefined: floats whose truncation
            is outside the integer type (or +-Inf), integers outside a narrower integer type,
            int4 values outside [-8, 7].
        ShapeError: int4 from a 0-D self or an odd last dim; output and working copy over
            :data:`._check.MAX_CALL_BYTES` (a broadcast view), before allocating.

    Source: torch_npu 2.14 schema and ``npu_dtype_cast_meta`` (int4: uint8, last dim halved);
    op-plugin ``docs/context/（beta）torch_npu-npu_dtype_cast.md`` (the general cast, replaceable
    by ``torch.to``) and ``CastKernelNpuOpApi.cpp``; ops-math ``math/cast/README.md`` (NaN -> 0
    into integers) and ``op_kernel/arch35/cast_struct.h`` (the casts :mod:`ascend_emu.quant`
    implements); docs/ops.md#npu_dtype_cast.
    """
    x = required(self, "self")
    dst_code = dtype_code(dtype, "dtype")
    dst = DTYPE_CODE_NAMES[dst_code]
    own = dtype_name(x.dtype)
    if input_dtype is None:
        src = own
    else:
        in_code = dtype_code(input_dtype, "input_dtype")
        src = DTYPE_CODE_NAMES[in_code]
        if src in CAST_950_TYPES and own == "uint8":
            pass  # bytes reinterpreted, as the op-api's TensorWrapper does
        elif src != own:
            raise arg_error(DTypeError, "self", f"a {src} array, or its uint8 bytes for a hifloat8 / FP8 input_dtype "
                            f"(input_dtype {in_code})", describe(x))
    if src in CAST_950_TYPES or dst in CAST_950_TYPES:
        to_950 = src in CAST_FLOAT_TYPES and dst in CAST_950_TYPES
        from_950 = src in CAST_950_TYPES and dst in CAST_FLOAT_TYPES
        if not (to_950 or from_950):
            raise arg_error(ModeError, "dtype", f"a cast between {list(CAST_FLOAT_TYPES)} and {list(CAST_950_TYPES)} "
                            "for the Ascend 950 types", f"{src} -> {dst} (dtype {dst_code})")
        require_ascend950("dtype", dst_code, f"a cast {src} -> {dst}")
        check_call_bytes(x, "self", 4 + 4)  # the output (at most fp32) and an fp32 working copy
    elif dst_code == INT4_CODE:
        if src != "int32":
            raise arg_error(DTypeError, "self", "an int32 array for a cast to torch_npu.int4 (285)", describe(x))
        if x.ndim == 0 or x.shape[-1] % 2:
            raise arg_error(ShapeError, "self", "a last dim divisible by 2 for int4 output (two values a byte)",
                            describe(x))
        require_ascend950("dtype", dst_code, "int4")
        if x.size and (int(x.min()) < INT4_RANGE[0] or int(x.max()) > INT4_RANGE[1]):
            raise arg_error(IndexRangeError, "self", f"int4 values in {list(INT4_RANGE)}",
                            f"values in [{int(x.min())}, {int(x.max())}]")
        check_call_bytes(x, "self", 1)
    else:
        if src not in GENERAL_CAST_TYPES or dst not in GENERAL_CAST_TYPES:
            bad_src = src not in GENERAL_CAST_TYPES
            raise arg_error(DTypeError if bad_src else ModeError, "self" if bad_src else "dtype",
                            f"one of {list(GENERAL_CAST_TYPES)}", src if bad_src else f"{dst} (dtype {dst_code})")
        _check_general(x, src, dst, dst_code)
        check_call_bytes(x, "self", 16 + 8)  # the output (at most complex128) and a float64 working copy
    args = Quant950Args("npu_dtype_cast", x, src, dst, dst_code, None if input_dtype is None else int(input_dtype))
    return get_backend().quant_950(args).y


def _mx_common(input, dst_type, round_mode, scale_alg) -> tuple[np.ndarray, int, str]:  # noqa: A002
    """The checks both MX quants make of their shared arguments: ``(x, dst code, dst name)``.

    Raises:
        ModeError: a dst_type that is not FP8 (fp4 outputs are not emulated), a round_mode or
            scale_alg outside :data:`MX_ROUND_MODES` / :data:`SCALE_ALGS`.
    """
    x = required(input, "input")
    code = dtype_code(dst_type, "dst_type")
    dst = DTYPE_CODE_NAMES[code]
    if dst not in FP8_DTYPES:
        raise arg_error(ModeError, "dst_type", "an FP8 code: 292 / 24 (float8_e4m3fn) or 291 / 23 (float8_e5m2); "
                        "fp4 outputs are not emulated", f"{code} ({dst})")
    if not isinstance(round_mode, str) or round_mode not in MX_ROUND_MODES:
        raise arg_error(ModeError, "round_mode", f"one of {MX_ROUND_MODES} for FP8 outputs", describe(round_mode))
    if isinstance(scale_alg, (bool, np.bool_)) or not isinstance(scale_alg, (int, np.integer)) \
            or int(scale_alg) not in SCALE_ALGS:
        raise arg_error(ModeError, "scale_alg", f"one of {SCALE_ALGS} for FP8 outputs", describe(scale_alg))
    return x, code, dst


def npu_dynamic_mx_quant(input, *, axis: int = -1, round_mode: str = "rint", dst_type: int = 296,  # noqa: A002
                         block_size: int = MX_BLOCK_SIZE, scale_alg=0) -> tuple[np.ndarray, np.ndarray]:
    """``torch_npu.npu_dynamic_mx_quant``: MXFP8 quantization along ``axis`` (Ascend 950).

    Args:
        input: fp16 / bf16 values, at least 1-D.
        axis: the blocked axis, in ``[-ndim, ndim - 1]``.
        round_mode: ``"rint"`` (the only FP8 round mode).
        dst_type: 292 / 24 (float8_e4m3fn) or 291 / 23 (float8_e5m2); the schema's default 296
            (float4_e2m1fn_x2) is not emulated.
        block_size: a multiple of 32 in [32, 1024].
        scale_alg: 0 (OCP) or 1 (amax / max rounded up); see :mod:`ascend_emu.quant.mx`.

    Returns:
        ``(y, mxscale)``: ``y`` the ml_dtypes FP8 elements, ``input``'s shape; ``mxscale`` uint8
        E8M0 bytes of shape ``input.shape`` with ``axis`` replaced by ``ceil(ceil(L / block_size)
        / 2)`` and a trailing 2 (an odd block count padded with byte 0).

    Raises:
        ModeError: ``dst_type`` not an FP8 code (fp4 included), ``round_mode`` not ``"rint"``,
            ``scale_alg`` not 0 / 1, ``block_size`` not a multiple of 32 in [32, 1024], or an
            emulated SoC other than an Ascend 950 (message names the SoC and the mode).
        DTypeError: ``input`` not fp16 / bf16.
        ShapeError: 0-D ``input`` or ``axis`` out of range; outputs and working copies over
            :data:`._check.MAX_CALL_BYTES` (a broadcast view), before allocating.

    Source: torch_npu 2.14 schema and ``npu_dynamic_mx_quant`` meta function; ops-nn
    ``quant/dynamic_mx_quant/README.md`` and ``docs/aclnnDynamicMxQuant_en.md`` (formulas, scale
    layout); OCP MX v1.0.
    """
    x, code, dst = _mx_common(input, dst_type, round_mode, scale_alg)
    if dtype_name(x.dtype) not in MX_QUANT_INPUT_DTYPES:
        raise arg_error(DTypeError, "input", f"one of {MX_QUANT_INPUT_DTYPES}", describe(x))
    if x.ndim == 0:
        raise arg_error(ShapeError, "input", "an array of at least 1 dimension", describe(x))
    mx_scale_shape(x.shape, axis, block_size)  # validates axis and block_size (ShapeError / ModeError)
    require_ascend950("dst_type", code, dst)
    check_call_bytes(x, "input", 1 + 4 + 1)  # y, an fp32 working copy, the scales (at most one a value)
    args = Quant950Args("npu_dynamic_mx_quant", x, dtype_name(x.dtype), dst, code, None, int(axis) % x.ndim,
                        int(block_size), int(scale_alg))
    out = get_backend().quant_950(args)
    return out.y, out.mxscale


#: Ranks of npu_dynamic_mx_quant_with_dual_axis's input (doc: 2-7 dims).
DUAL_AXIS_NDIM = (2, 7)


def npu_dynamic_mx_quant_with_dual_axis(input, *, round_mode: str = "rint", dst_type: int = 296,  # noqa: A002
                                        scale_alg=0, dst_type_max=0.0):
    """``torch_npu.npu_dynamic_mx_quant_with_dual_axis``: MXFP8 quantization of ``input`` along
    its last axis and, separately, along axis -2, in blocks of 32 (Ascend 950).

    Each half is :func:`npu_dynamic_mx_quant` with ``axis=-1`` / ``axis=-2`` and ``block_size=32``
    (the doc's formulas are those of the single-axis op, run over both axes): the same fp32
    block maxima, E8M0 scales and RNE FP8 elements.

    Args:
        input: fp16 / bf16 ``[..., M, N]``, 2 to 7 dims.
        round_mode: ``"rint"`` (the only FP8 round mode).
        dst_type: 292 / 24 (float8_e4m3fn) or 291 / 23 (float8_e5m2); the schema's default 296
            and 297 (fp4 outputs) are not emulated.
        scale_alg: 0 (OCP) or 1 (amax / max rounded up); 2 is fp4's.
        dst_type_max: 0.0 or None (the schema's ``float?``; the doc: FP8 outputs take only the default).

    Returns:
        ``(y1, mxscale1, y2, mxscale2)``: y1 / y2 the ml_dtypes FP8 elements of ``input``'s
        shape (blocks along -1 / -2); mxscale1 uint8 E8M0 ``[..., M, ceil(ceil(N / 32) / 2), 2]``,
        mxscale2 ``[..., ceil(ceil(M / 32) / 2), N, 2]`` (two consecutive blocks of a column
        side by side: the doc's "every two rows interleaved"; an odd block count padded with 0).

    Raises:
        ModeError: ``dst_type`` not an FP8 code, ``round_mode`` not ``"rint"``, ``scale_alg`` not
            0 / 1, ``dst_type_max`` not 0.0, or an emulated SoC other than an Ascend 950 (the
            message names the SoC and how to set it).
        DTypeError: ``input`` not fp16 / bf16.
        ShapeError: fewer than 2 or more than 7 dims; outputs and working copies over
            :data:`._check.MAX_CALL_BYTES`, before allocating.

    Source: op-plugin ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_dynamic_mx_quant_with_dual_axis.md``
    (formulas, parameter table, shapes), its golden
    ``test/test_custom_ops/test_npu_dynamic_mx_quant_with_dual_axis.py``; torch_npu 2.14's schema
    and ``npu_dynamic_mx_quant_with_dual_axis`` meta function (docs/ops.md).
    """
    x, code, dst = _mx_common(input, dst_type, round_mode, scale_alg)
    if dst_type_max is not None and (isinstance(dst_type_max, bool) or float(dst_type_max) != 0.0
                                     if isinstance(dst_type_max, (int, float, np.floating, np.integer)) else True):
        raise arg_error(ModeError, "dst_type_max", "0.0 (FP8 outputs take only the default)", describe(dst_type_max))
    if dtype_name(x.dtype) not in MX_QUANT_INPUT_DTYPES:
        raise arg_error(DTypeError, "input", f"one of {MX_QUANT_INPUT_DTYPES}", describe(x))
    lo, hi = DUAL_AXIS_NDIM
    if not lo <= x.ndim <= hi:
        raise arg_error(ShapeError, "input", f"{lo} to {hi} dims", describe(x))
    require_ascend950("dst_type", code, dst)
    check_call_bytes(x, "input", 2 * (1 + 4 + 1))  # two of everything npu_dynamic_mx_quant allocates
    outs = []
    for axis in (x.ndim - 1, x.ndim - 2):
        args = Quant950Args("npu_dynamic_mx_quant", x, dtype_name(x.dtype), dst, code, None, axis, MX_BLOCK_SIZE,
                            int(scale_alg))
        out = get_backend().quant_950(args)
        outs += [out.y, out.mxscale]
    return tuple(outs)


__all__ = ["npu_dtype_cast", "npu_dynamic_mx_quant", "npu_dynamic_mx_quant_with_dual_axis", "Quant950Args",
           "Quant950Outputs", "SCALAR_TYPE_CODES", "DTYPE_CODE_NAMES", "dtype_code"]
