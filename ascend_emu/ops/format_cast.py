"""``npu_format_cast`` / ``get_npu_format`` on NumPy arrays.

Source: the ``npu_format_cast`` doc and docs/sources.md#fractal_nz. Casting to FRACTAL_NZ (29) returns a
new :class:`~ascend_emu.layouts.NZArray`: the same logical ND values, tagged as NZ, whose
``storage()`` is the NZ byte layout. Casting to ND (2) returns a plain copy.

``customize_dtype`` / ``input_dtype`` (torch_npu 2.14's schema; dtype codes as ints, as
:mod:`.quant_950` reads them): the Ascend 950 rows of ops-math's aclnnNpuFormatCast table
(``conversion/npu_format_cast/docs/aclnnNpuFormatCast.md``) for its 8-bit types, ND to
FRACTAL_NZ with C0 = 32 bytes / 1 byte = 32 (:func:`ascend_emu.layouts.c0_for`): float8_e4m3fn
data (an FP8 array, or its uint8 bytes with ``input_dtype`` 292) with ``customize_dtype``
float8_e4m3fn (292 / 24), and hifloat8 data (uint8 with ``input_dtype=290``) with
``customize_dtype`` hifloat8 (290). Only on an emulated Ascend 950
(:func:`ascend_emu.soc.require_ascend950`). The table's other rows (an fp32 / int32 source
with an fp16 / bf16 / fp8 ``customize_dtype``, the FRACTAL_NZ_C0_16 / C0_32 results, fp4, NZ to
ND) are rejected: not emulated.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..layouts import ACL_FORMAT_NAMES, FRACTAL_NZ, ND, as_nz
from ..layouts import get_npu_format as _get_format
from ..layouts import NZ_DTYPES
from ..soc import require_ascend950
from ._check import MAX_CALL_BYTES, dtype_name, required
from .quant_950 import DTYPE_CODE_NAMES, dtype_code

#: The Ascend 950 8-bit rows: (type the data holds, customize_dtype type) -> the dtypes the array
#: may have (its own type, or its uint8 bytes).
CUSTOMIZE_950_ROWS = {("float8_e4m3fn", "float8_e4m3fn"): ("float8_e4m3fn", "uint8"),
                      ("hifloat8", "hifloat8"): ("uint8",)}

#: Largest cast, in bytes of the result: the ops' one bound on a call's allocations
#: (:data:`._check.MAX_CALL_BYTES`).
MAX_CAST_BYTES = MAX_CALL_BYTES


def npu_format_cast(x, acl_format: int, customize_dtype=None, input_dtype=None) -> np.ndarray:
    """Cast ``x`` to ``acl_format``: 29 (FRACTAL_NZ) or 2 (ND).

    Args:
        x: array of bf16 / fp16 / fp32 / int32 / int8, any shape (``[..., M, N]``); at most
            :data:`MAX_CAST_BYTES` bytes. Not a Python / NumPy scalar. With ``customize_dtype``
            (Ascend 950): float8_e4m3fn, or uint8 bytes of the ``input_dtype`` type.
        acl_format: the int 29 or 2 (not a float, string or bool); 29 with ``customize_dtype``.
        customize_dtype: None, or (Ascend 950) the type that sets C0: 292 / 24 for float8_e4m3fn
            data, 290 for hifloat8 data (module doc).
        input_dtype: None (``x``'s own dtype), or the type ``x``'s uint8 bytes hold (290 / 292).

    Returns:
        A new array: an :class:`NZArray` for 29, a plain ``ndarray`` for 2. Logical values equal
        ``x``'s in both cases.

    Raises:
        ModeError: ``acl_format`` not the int 29 or 2 (None, 2.0 and "29" included); a
            ``customize_dtype`` / ``input_dtype`` other than the rows above, or given on a SoC
            other than an Ascend 950 (message names the SoC and the mode).
        DTypeError: ``x`` a scalar, or a dtype without an NZ layout (for 29), or not the dtype
            the ``input_dtype`` row takes.
        ShapeError: the result would exceed :data:`MAX_CAST_BYTES`.
    """
    if isinstance(x, (bool, int, float, complex, np.generic)):
        raise arg_error(DTypeError, "x", "an array (a tensor to cast; scalars have no storage format)", describe(x))
    x = required(x, "x")
    if isinstance(acl_format, (bool, np.bool_)) or not isinstance(acl_format, (int, np.integer)) \
            or int(acl_format) not in (FRACTAL_NZ, ND):
        raise arg_error(ModeError, "acl_format", f"the int {FRACTAL_NZ} ({ACL_FORMAT_NAMES[FRACTAL_NZ]}) or "
                        f"{ND} ({ACL_FORMAT_NAMES[ND]})", describe(acl_format))
    if customize_dtype is not None or input_dtype is not None:
        _check_customized(x, int(acl_format), customize_dtype, input_dtype)
    elif int(acl_format) == FRACTAL_NZ and dtype_name(x.dtype) not in NZ_DTYPES:
        raise arg_error(DTypeError, "x", f"one of {', '.join(NZ_DTYPES)} for FRACTAL_NZ (uint8 / float8_e4m3fn: "
                        "with the Ascend 950's customize_dtype)", x.dtype)
    nbytes = int(np.prod(x.shape, dtype=np.int64)) * x.dtype.itemsize  # no overflow: shapes fit in memory maps
    if nbytes > MAX_CAST_BYTES:
        raise arg_error(ShapeError, "x", f"at most {MAX_CAST_BYTES >> 30} GiB to cast (a broadcast view?)",
                        f"{describe(x)}, {nbytes / (1 << 30):.1f} GiB")
    if int(acl_format) == FRACTAL_NZ:
        return as_nz(x)
    return np.array(x, copy=True).view(np.ndarray)


def _check_customized(x: np.ndarray, acl_format: int, customize_dtype, input_dtype) -> None:
    """The Ascend 950 rows (module doc, :data:`CUSTOMIZE_950_ROWS`), checked before any copy."""
    if customize_dtype is None:
        raise arg_error(ModeError, "customize_dtype", "a dtype code with input_dtype (the Ascend 950 rows: 292 for "
                        "float8_e4m3fn, 290 for hifloat8)", None)
    code = dtype_code(customize_dtype, "customize_dtype")
    custom = DTYPE_CODE_NAMES[code]
    held = dtype_name(x.dtype) if input_dtype is None else DTYPE_CODE_NAMES[dtype_code(input_dtype, "input_dtype")]
    row = CUSTOMIZE_950_ROWS.get((held, custom))
    if row is None or acl_format != FRACTAL_NZ:
        rows = "; ".join(f"{h} data with customize_dtype {c}" for h, c in CUSTOMIZE_950_ROWS)
        raise arg_error(ModeError, "customize_dtype", f"acl_format {FRACTAL_NZ} and one of the emulated Ascend 950 "
                        f"rows: {rows}", f"acl_format {acl_format}, {held} data, customize_dtype {code} ({custom})")
    if dtype_name(x.dtype) not in row:
        raise arg_error(DTypeError, "x", f"one of {list(row)} for {held} data", x.dtype)
    require_ascend950("customize_dtype", code, custom)


def get_npu_format(x) -> int:
    """ACL format id of ``x``: 29 after ``npu_format_cast(x, 29)``, else 2."""
    return _get_format(x)
