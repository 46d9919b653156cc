"""``torch_npu.npu_interleave_rope`` and ``torch_npu.npu_rotary_mul`` on NumPy arrays: the contract.

Sources (Ascend/op-plugin): the docs ``docs/context/torch_npu-npu_interleave_rope.md`` and
``docs/context/torch_npu-npu_rotary_mul.md`` (shapes, dtypes, modes, broadcast layouts); the
goldens ``test/test_custom_ops/test_npu_interleave_rope.py`` and ``test_npu_rotary_mul.py``;
torch_npu 2.14's schemas (``npu_native_functions_by_codegen.yaml``) and meta functions (output
like ``x`` / ``self``).

What the ops compute, on the last axis (D), fp32 compute and one RNE rounding to the input dtype
(the goldens widen to fp32, or compare with a tolerance):

- ``npu_interleave_rope(x, cos, sin)``: the MLA RoPE reading (docs/sources.md#rope): de-interleave
  ``q = [x[0::2], x[1::2]]``, then ``q * cos + rotate_half(q) * sin``; D = 64, and the output
  stays in the de-interleaved order (the golden does not re-interleave).
- ``npu_rotary_mul(self, r1, r2, rotary_mode)``: ``'half'``: ``self * r1 + rotate_half(self) * r2``
  (no de-interleave); ``'interleave'``: pairwise, ``out[2i] = x[2i] r1[2i] - x[2i+1] r2[2i]``,
  ``out[2i+1] = x[2i+1] r1[2i+1] + x[2i] r2[2i+1]``.

Choices where the sources leave room (stricter than the doc, never looser):

- interleave_rope: cos / sin ``[B, 1, S or 1, 64]`` with x's B (the doc names the shape
  ``(B, N, S, D)`` with N = 1); cos and sin of one shape; x, cos, sin C-contiguous (the doc: no
  non-contiguous tensors).
- rotary_mul: r1 and r2 of one shape and of ``self``'s dtype; D even and < 896; ``self`` 4-D
  ``[A, B, C, D]`` or 3-D ``[T, N, D]`` (the doc's TND). r1's leading dims are one of the doc's
  broadcast layouts over ``self``'s (the doc's BNSD / BSND / SBND readings together; over TND
  11D / T1D / TND in both modes: the doc names T1D / TND, op-plugin's 3-D goldens also 11D and
  an interleave TND): :data:`HALF_LAYOUTS` / :data:`INTERLEAVE_LAYOUTS` (4-D), :data:`HALF_LAYOUTS_3D`
  / :data:`INTERLEAVE_LAYOUTS_3D` (3-D). The doc's ``B, N < 1000`` limits depend on which
  layout the caller means and are not checked; nor is the ``[-1, 1]`` data range of r1 / r2.
  Only the doc's ``'half'`` and ``'interleave'`` modes (``quarter`` / ``interleave-half`` are
  the 950's and not emulated).
- rotary_mul's ``rotate`` (A2 / A3; the doc: not supported on the Ascend 950, so rejected
  there): a ``[D, D]`` matrix of ``self``'s dtype; ``rotate(x) = x @ rotate`` replaces the
  mode's rotation (the doc's formula ``rotate(x) = x . rotate``; its example builds the
  matrix for the mode), each output lane the fp32 sum of D fp32 products (in index order; exact
  for the doc's 0 / +-1 matrices), then ``x * r1 + rotate(x) * r2`` as without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import ModeError, ShapeError, arg_error, describe
from ..mla import D_ROPE
from ..soc import is_ascend950, soc_name
from ._backend import get_backend
from ._check import check_call_bytes, check_dtype, check_ndim, dtype_name, required

#: interleave_rope's dtypes (doc); rotary_mul's.
INTERLEAVE_ROPE_DTYPES = ("bfloat16", "float16")
ROTARY_MUL_DTYPES = ("bfloat16", "float16", "float32")
#: rotary_mul's modes (doc), and the bound on D (doc: D < 896, a multiple of 2).
ROTARY_MODES = ("half", "interleave")
ROTARY_MAX_D = 896
#: r1 / r2 leading dims allowed over self's ``[A, B, C]``: True = the dim of self, False = 1.
#: half: BNSD 11SD / B1SD / BNSD, BSND 1S1D / BS1D, SBND S11D / SB1D (doc); interleave: 11SD /
#: 1S1D / S11D.
HALF_LAYOUTS = frozenset({(False, False, True), (True, False, True), (True, True, True), (False, True, False),
                          (True, True, False), (True, False, False)})
INTERLEAVE_LAYOUTS = frozenset({(False, False, True), (False, True, False), (True, False, False)})
#: The same over a 3-D self ``[T, N, D]``: the doc's TND layouts (half T1D / TND, interleave
#: T1D) and those op-plugin's 3-D goldens call (11D in both modes, TND in interleave).
HALF_LAYOUTS_3D = frozenset({(False, False), (True, False), (True, True)})
INTERLEAVE_LAYOUTS_3D = HALF_LAYOUTS_3D


@dataclass(frozen=True)
class RopeArgs:
    """Normalised, validated arguments of the rope family.

    Attributes:
        op: ``'npu_interleave_rope'`` or ``'npu_rotary_mul'``.
        mode: ``'interleave_rope'`` (de-interleave, then rotate_half), ``'half'`` or ``'interleave'``.
        x: the input ``[A, B, C, D]`` as passed.
        cos, sin: interleave_rope's ``[B, 1, S|1, 64]``; rotary_mul's r1 / r2.
        rotate: rotary_mul's ``[D, D]`` rotation matrix, or None (the mode's rotation).
    """

    op: str
    mode: str
    x: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    rotate: np.ndarray | None = None


class RopeOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`).

    Attributes:
        y: x's shape and dtype.
    """

    y: np.ndarray


def _contiguous(a: np.ndarray, name: str) -> None:
    if not a.flags.c_contiguous:
        raise arg_error(ShapeError, name, "a C-contiguous array (non-contiguous tensors are not supported)",
                        f"strides {a.strides}")


def _fits_a_layout(r_shape: tuple, x_shape: tuple, layouts: frozenset) -> bool:
    """Whether r1 / r2's leading dims are one of ``layouts`` over self's (True: self's dim, False:
    1). Judged per layout, so a size-1 dim of self fits either reading (x ``[1, B, C, D]`` with
    r ``[1, 1, C, D]`` is 11SD whatever the first dim is called)."""
    return any(all(r_shape[i] == (x_shape[i] if keep else 1) for i, keep in enumerate(layout)) for layout in layouts)


def npu_interleave_rope(x, cos, sin) -> np.ndarray:
    """``torch_npu.npu_interleave_rope``: RoPE with the MLA de-interleave (module doc).

    Args:
        x: ``[B, N, S, 64]`` bf16 / fp16, C-contiguous, B, N, S >= 1.
        cos: ``[B, 1, S or 1, 64]``, x's dtype, C-contiguous.
        sin: cos's shape and dtype, C-contiguous.

    Returns:
        ``[B, N, S, 64]`` in x's dtype: fp32 compute, one RNE rounding.

    Raises:
        ShapeError: a shape other than the above, or a non-contiguous array.
        DTypeError: x not bf16 / fp16, or cos / sin not x's dtype.

    Source: op-plugin ``docs/context/torch_npu-npu_interleave_rope.md``,
    ``test/test_custom_ops/test_npu_interleave_rope.py`` (golden).
    """
    x, cos, sin = required(x, "x"), required(cos, "cos"), required(sin, "sin")
    check_ndim(x, "x", (4,), "[B, N, S, D]")
    check_dtype(x, "x", INTERLEAVE_ROPE_DTYPES)
    if x.shape[3] != D_ROPE or min(x.shape) < 1:
        raise arg_error(ShapeError, "x", f"D (dim 3) = {D_ROPE} and B, N, S >= 1", f"shape {x.shape}")
    b, _, s, _ = x.shape
    for name, a in (("cos", cos), ("sin", sin)):
        check_ndim(a, name, (4,), "[B, 1, S, D]")
        check_dtype(a, name, (dtype_name(x.dtype),))
        if a.shape[0] != b or a.shape[1] != 1 or a.shape[2] not in (1, s) or a.shape[3] != D_ROPE:
            raise arg_error(ShapeError, name, f"shape [{b}, 1, {s} or 1, {D_ROPE}] (x {x.shape})", f"shape {a.shape}")
    if sin.shape != cos.shape:
        raise arg_error(ShapeError, "sin", f"cos's shape {cos.shape}", f"shape {sin.shape}")
    for name, a in (("x", x), ("cos", cos), ("sin", sin)):
        _contiguous(a, name)
    return get_backend().rope(RopeArgs("npu_interleave_rope", "interleave_rope", x, cos, sin)).y


def npu_rotary_mul(self, r1, r2, rotary_mode: str = "half", rotate=None) -> np.ndarray:
    """``torch_npu.npu_rotary_mul``: ``self * r1 + rotate(self) * r2`` (module doc).

    ``self`` is the doc's ``input`` (torch_npu's schema names it ``self``).

    Args:
        self: ``[A, B, C, D]`` or ``[T, N, D]``, bf16 / fp16 / fp32, D even and < 896.
        r1: self's rank, ``[A|1, B|1, C|1, D]`` / ``[T|1, N|1, D]`` in one of the doc's layouts
            (:data:`HALF_LAYOUTS`, :data:`INTERLEAVE_LAYOUTS`, :data:`HALF_LAYOUTS_3D`,
            :data:`INTERLEAVE_LAYOUTS_3D`), self's dtype.
        r2: r1's shape and dtype.
        rotary_mode: ``'half'`` or ``'interleave'``.
        rotate: optional ``[D, D]`` of self's dtype: ``rotate(x) = x @ rotate`` instead of the
            mode's rotation; A2 / A3 only (rejected on an emulated Ascend 950, as the doc says).

    Returns:
        self's shape and dtype: fp32 compute, one RNE rounding.

    Raises:
        ModeError: another rotary_mode; ``rotate`` on an emulated Ascend 950.
        ShapeError: a shape other than the above; outputs and working copies over
            :data:`._check.MAX_CALL_BYTES` (a broadcast view), before allocating.
        DTypeError: a dtype other than the above.

    Source: op-plugin ``docs/context/torch_npu-npu_rotary_mul.md`` and master's
    ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_rotary_mul.md`` (TND layouts, ``rotate``),
    ``test/test_custom_ops/test_npu_rotary_mul.py`` (golden).
    """
    if not isinstance(rotary_mode, str) or rotary_mode not in ROTARY_MODES:
        raise arg_error(ModeError, "rotary_mode", f"one of {ROTARY_MODES} (torch_npu: \"The rotary_mode of "
                        f"npu_rotary_mul should be half or interleave, but got {rotary_mode}\")",
                        describe(rotary_mode))
    x, r1, r2 = required(self, "self"), required(r1, "r1"), required(r2, "r2")
    check_ndim(x, "self", (3, 4), "[A, B, C, D] or [T, N, D]")
    check_dtype(x, "self", ROTARY_MUL_DTYPES)
    d = x.shape[-1]
    if d % 2 or d >= ROTARY_MAX_D:
        raise arg_error(ShapeError, "self", f"D (the last dim) even and < {ROTARY_MAX_D}", f"shape {x.shape}")
    four = x.ndim == 4
    if four:
        layouts = HALF_LAYOUTS if rotary_mode == "half" else INTERLEAVE_LAYOUTS
        names = "11SD / 1S1D / S11D" + ("" if rotary_mode == "interleave" else " / B1SD / BS1D / SB1D / full")
    else:
        layouts = HALF_LAYOUTS_3D if rotary_mode == "half" else INTERLEAVE_LAYOUTS_3D
        names = "11D / T1D / TND"
    for name, a in (("r1", r1), ("r2", r2)):
        check_ndim(a, name, (x.ndim,), "[A|1, B|1, C|1, D]" if four else "[T|1, N|1, D]")
        check_dtype(a, name, (dtype_name(x.dtype),))
        if a.shape[-1] != d or not _fits_a_layout(a.shape, x.shape, layouts):
            raise arg_error(ShapeError, name, f"a {rotary_mode}-mode broadcast of self {x.shape} (doc layouts "
                            f"{names})", f"shape {a.shape}")
    if r2.shape != r1.shape:
        raise arg_error(ShapeError, "r2", f"r1's shape {r1.shape}", f"shape {r2.shape}")
    rot = None
    if rotate is not None:
        if is_ascend950():
            raise arg_error(ModeError, "rotate", f"None on {soc_name()} (the Ascend 950 does not take a rotate "
                            "matrix)", "a tensor")
        rot = required(rotate, "rotate")
        check_ndim(rot, "rotate", (2,), "[D, D]")
        check_dtype(rot, "rotate", (dtype_name(x.dtype),))
        if rot.shape != (d, d):
            raise arg_error(ShapeError, "rotate", f"shape [{d}, {d}] (self's D)", f"shape {rot.shape}")
    # the output, and fp32 copies of self, its rotation and r1 / r2 broadcast to self's shape
    check_call_bytes(x, "self", x.dtype.itemsize + 4 * 4)
    return get_backend().rope(RopeArgs("npu_rotary_mul", rotary_mode, x, r1, r2, rot)).y
