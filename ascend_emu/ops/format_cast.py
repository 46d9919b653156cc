"""``npu_format_cast`` / ``get_npu_format`` on NumPy arrays.

Source: the ``npu_format_cast`` doc and ops_reference §1.4. Casting to FRACTAL_NZ (29) returns a
new :class:`~ascend_emu.layouts.NZArray`: the same logical ND values, tagged as NZ, whose
``storage()`` is the NZ byte layout. Casting to ND (2) returns a plain copy.
"""

from __future__ import annotations

import numpy as np

from ..errors import ModeError, arg_error
from ..layouts import ACL_FORMAT_NAMES, FRACTAL_NZ, ND, as_nz
from ..layouts import get_npu_format as _get_format
from ._check import required


def npu_format_cast(x, acl_format: int) -> np.ndarray:
    """Cast ``x`` to ``acl_format``: 29 (FRACTAL_NZ) or 2 (ND).

    Args:
        x: array of bf16 / fp16 / fp32 / int32 / int8, any shape (``[..., M, N]``).
        acl_format: 29 or 2.

    Returns:
        A new array: an :class:`NZArray` for 29, a plain ``ndarray`` for 2. Logical values equal
        ``x``'s in both cases.

    Raises:
        ModeError: unsupported ``acl_format``.
        DTypeError: dtype without an NZ layout (for 29).
    """
    x = required(x, "x")
    acl_format = int(acl_format)
    if acl_format == FRACTAL_NZ:
        return as_nz(x)
    if acl_format == ND:
        return np.array(x, copy=True).view(np.ndarray)
    raise arg_error(ModeError, "acl_format", f"one of {sorted(ACL_FORMAT_NAMES)} "
                    f"({', '.join(ACL_FORMAT_NAMES.values())})", acl_format)


def get_npu_format(x) -> int:
    """ACL format id of ``x``: 29 after ``npu_format_cast(x, 29)``, else 2."""
    return _get_format(x)
