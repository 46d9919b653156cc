"""``npu_format_cast`` / ``get_npu_format`` on NumPy arrays.

Source: the ``npu_format_cast`` doc and ops_reference §1.4. Casting to FRACTAL_NZ (29) returns a
new :class:`~ascend_emu.layouts.NZArray`: the same logical ND values, tagged as NZ, whose
``storage()`` is the NZ byte layout. Casting to ND (2) returns a plain copy.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..layouts import ACL_FORMAT_NAMES, FRACTAL_NZ, ND, as_nz
from ..layouts import get_npu_format as _get_format
from ._check import required

#: Largest cast, in bytes of the result: more than any one weight of an MLA / MoE model (one
#: layer's 256 stacked bf16 experts of 7168 x 2048 are 7 GiB), so a bigger request is a mistake
#: (e.g. a broadcast view, which costs nothing until it is copied) and is refused before any
#: allocation.
MAX_CAST_BYTES = 16 << 30


def npu_format_cast(x, acl_format: int) -> np.ndarray:
    """Cast ``x`` to ``acl_format``: 29 (FRACTAL_NZ) or 2 (ND).

    Args:
        x: array of bf16 / fp16 / fp32 / int32 / int8, any shape (``[..., M, N]``); at most
            :data:`MAX_CAST_BYTES` bytes. Not a Python / NumPy scalar.
        acl_format: the int 29 or 2 (not a float, string or bool).

    Returns:
        A new array: an :class:`NZArray` for 29, a plain ``ndarray`` for 2. Logical values equal
        ``x``'s in both cases.

    Raises:
        ModeError: ``acl_format`` not the int 29 or 2 (None, 2.0 and "29" included).
        DTypeError: ``x`` a scalar, or a dtype without an NZ layout (for 29).
        ShapeError: the result would exceed :data:`MAX_CAST_BYTES`.
    """
    if isinstance(x, (bool, int, float, complex, np.generic)):
        raise arg_error(DTypeError, "x", "an array (a tensor to cast; scalars have no storage format)", describe(x))
    x = required(x, "x")
    if isinstance(acl_format, (bool, np.bool_)) or not isinstance(acl_format, (int, np.integer)) \
            or int(acl_format) not in (FRACTAL_NZ, ND):
        raise arg_error(ModeError, "acl_format", f"the int {FRACTAL_NZ} ({ACL_FORMAT_NAMES[FRACTAL_NZ]}) or "
                        f"{ND} ({ACL_FORMAT_NAMES[ND]})", describe(acl_format))
    nbytes = int(np.prod(x.shape, dtype=np.int64)) * x.dtype.itemsize  # no overflow: shapes fit in memory maps
    if nbytes > MAX_CAST_BYTES:
        raise arg_error(ShapeError, "x", f"at most {MAX_CAST_BYTES >> 30} GiB to cast (a broadcast view?)",
                        f"{describe(x)}, {nbytes / (1 << 30):.1f} GiB")
    if int(acl_format) == FRACTAL_NZ:
        return as_nz(x)
    return np.array(x, copy=True).view(np.ndarray)


def get_npu_format(x) -> int:
    """ACL format id of ``x``: 29 after ``npu_format_cast(x, 29)``, else 2."""
    return _get_format(x)
