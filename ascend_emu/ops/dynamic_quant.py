"""``torch_npu.npu_dynamic_quant`` on NumPy arrays: the contract (family ``quant``).

Per-token symmetric dynamic quant of the A2 / A3 kernels, the producer of the quantized MLA
prolog's int8 ``token_x`` / ``dequant_scale_x`` and of the C8 indexer's int8 inputs.

Sources:

- op-plugin ``docs/context/torch_npu-npu_dynamic_quant.md`` (dtypes, shapes, ``group_index``
  rules, int4 output as int32 holding 8 int4 values) and its golden
  ``test/test_custom_ops/test_npu_dynamic_quant.py`` (``max|x * smooth| / 127``, compared with
  a tolerance of 1 on y);
- torch_npu 2.14's schema (``npu_native_functions_by_codegen.yaml``) and meta function
  (``op_plugin/meta/_meta_registrations.py`` ``npu_dynamic_quant``: y like x, or int32
  ``[..., H / 8]`` for ``quint4x2`` with ``H % 8 == 0``; scale ``x.shape[:-1]`` fp32);
- ops-nn ``quant/dynamic_quant`` (GitHub mirror jbgztxdy/ops-nn @ fd1956fc4): the kernels'
  arithmetic (:func:`ascend_emu.quant.quantize_per_token_multiplier`,
  :data:`ascend_emu.quant.TOKEN_SCALE_FORMS`) and the tiling checks
  (``op_host/dynamic_quant_tiling.cpp``: x fp16 / bf16, line 352; smooth_scales of x's dtype,
  line 366; group_index int32, line 377; at most 1024 groups, ``MAX_EXPERT_NUM``).

What the op computes, per row of x (all axes but the last are rows; H = the last dim):

- ``v = fp32(x) * fp32(smooth)`` (exact widening, one fp32 multiply; no smooth: ``v = fp32(x)``);
  with ``group_index`` (MoE), row r takes ``smooth_scales[i]`` for the first i with
  ``group_index[i] > r`` (the doc: ``smooth_scales[i]`` acts on ``x[group_index[i-1]:
  group_index[i]]``; ops-nn ``dynamic_quant_moe.h`` ``GetSmoothIndex``);
- ``m = fp32(DTYPE_MAX / max|v|)``, ``y = rint(v * m)`` (half to even), DTYPE_MAX 127 (int8) or
  7 (int4);
- the dequant scale: ``max|v| * fp32(1 / DTYPE_MAX)`` without ``group_index``, ``1 / m`` with it
  (the kernels differ; :data:`ascend_emu.quant.TOKEN_SCALE_FORMS`).

Choices where the sources leave room (stricter than the hardware, never looser):

- A row of zeros: scale 0 (what both kernel forms compute) and y 0 (the kernel's ``0 * inf`` is
  NaN, whose int cast is not documented).
- The rows without ``group_index`` that are too long for the double-buffered kernels (tiling
  keys 0 / 1 / 6: a row whose fp32 working set does not fit the unified buffer) store ``1 / m``;
  this emulation always stores ``max|v| * fp32(1/127)`` without ``group_index``: the two differ
  by one or two fp32 ulps on some of those rows (:data:`ascend_emu.quant.TOKEN_SCALE_FORMS`).
- ``group_index``: 1-D int32, as many entries as smooth_scales has rows (<= 1024), non-decreasing,
  each in ``[0, rows]``, the last equal to the row count (the doc's rule); a group_index without
  smooth_scales is rejected (the kernel reads group_index only beside a 2-D smooth_scales).
- ``dst_type``: None, ``torch.int8`` (code 1) or ``torch.quint4x2`` (code 16) only (the doc's
  values for A2 / A3; the 950's fp8 / hifloat8 outputs are not emulated); ``quant_mode``
  ``'pertoken'``, and ``'perchannel'`` on an emulated Ascend 950 (``'pertensor'`` is not
  emulated); ``dst_type_max`` 0.0 only.
- Per channel (Ascend 950): per column (over axis -2) ``scale = max|v| * fp32(1/DTYPE_MAX)``,
  ``y = rint(v / scale)``: op-plugin's per-channel golden (the 950 kernel's arithmetic is not
  published; the doc gives ``max / DTYPE_MAX``).
- ``npu_dynamic_quant_asymmetric`` (:func:`npu_dynamic_quant_asymmetric`): the doc's formula in
  fp32, one rounding per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import IndexRangeError, ModeError, ShapeError, arg_error, describe
from ..quant import INT4_PER_INT32
from ..quant.fp8 import SCALAR_TYPE_CODES
from ..soc import require_ascend950
from ._backend import get_backend
from ._check import check_call_bytes, check_dtype, dtype_name, optional, required

#: x's and smooth_scales' dtypes (doc; tiling line 352).
DYNAMIC_QUANT_DTYPES = ("bfloat16", "float16")
#: The A2 / A3 quant mode (the schema's default; 'pertensor' / 'perchannel' are Ascend 950's).
QUANT_MODES = ("pertoken",)
#: The quant modes emulated on an Ascend 950: per token (a scale per row of the last axis) and
#: per channel (a scale per column: the reduction runs over axis -2). 'pertensor' is not emulated.
QUANT_MODES_950 = ("pertoken", "perchannel")
#: dst_type -> output kind: torch's ScalarType codes (:data:`ascend_emu.quant.fp8.SCALAR_TYPE_CODES`:
#: torch.int8 = 1, torch.quint4x2 = 16), the torch dtypes' names, and None (int8, the doc's default).
DST_TYPES = {None: "int8", **{key: kind for name, kind in (("int8", "int8"), ("quint4x2", "int4"))
                              for key in (SCALAR_TYPE_CODES[name], name, f"torch.{name}")}}
#: At most this many groups (smooth_scales rows) with group_index (tiling ``MAX_EXPERT_NUM``).
MAX_GROUPS = 1024


@dataclass(frozen=True)
class DynamicQuantArgs:
    """Normalised, validated arguments of the ``quant`` family.

    Attributes:
        x: ``[..., H]`` bf16 / fp16 as passed.
        smooth_scales: None, ``[H]``, or ``[E, H]`` with group_index; x's dtype.
        group_index: None or int32 ``[E]`` (cumulative row ends).
        dst: ``'int8'`` or ``'int4'`` (y int32 ``[..., H / 8]``).
        mode: ``'pertoken'`` (reduce over the last axis) or ``'perchannel'`` (over axis -2;
            smooth_scales then ``[S]``, S = ``x.shape[-2]``; Ascend 950).
        asymmetric: ``npu_dynamic_quant_asymmetric`` (scale and offset from the row max and min).
    """

    x: np.ndarray
    smooth_scales: np.ndarray | None
    group_index: np.ndarray | None
    dst: str
    mode: str = "pertoken"
    asymmetric: bool = False


class DynamicQuantOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`).

    Attributes:
        y: int8 of x's shape, or int32 ``[..., H / 8]`` (int4).
        scale: fp32 ``x.shape[:-1]`` (per token) or ``x.shape[:-2] + (H,)`` (per channel).
        offset: the asymmetric form's fp32 offset (scale's shape); None for the symmetric op.
    """

    y: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None = None


def _dst_kind(dst_type) -> str:
    key = dst_type
    if isinstance(dst_type, (int, np.integer)) and not isinstance(dst_type, bool):
        key = int(dst_type)
    elif dst_type is not None and not isinstance(dst_type, str):
        key = str(dst_type)  # a torch.dtype (torch.int8 -> 'torch.int8')
    try:
        kind = DST_TYPES.get(key)
    except TypeError:
        kind = None
    if kind is None:
        raise arg_error(ModeError, "dst_type", "None, torch.int8 (1) or torch.quint4x2 (16) (A2 / A3)",
                        describe(dst_type))
    return kind


#: Bytes :func:`npu_dynamic_quant` allocates per element of x, at most: y (int8), the fp32 copy
#: of x and of x * smooth_scales, and the fp32 row scale (one per element when H = 1).
QUANT_BYTES_PER_ELEMENT = 1 + 4 + 4 + 4


def _validate(input, smooth_scales, group_index, dst_type, quant_mode, dst_type_max,
              asymmetric: bool) -> DynamicQuantArgs:
    """The shared contract of ``npu_dynamic_quant`` and ``npu_dynamic_quant_asymmetric`` (their docs)."""
    if not isinstance(quant_mode, str) or quant_mode not in QUANT_MODES_950:
        raise arg_error(ModeError, "quant_mode", f"one of {QUANT_MODES} (A2 / A3) or {QUANT_MODES_950} (Ascend 950; "
                        "'pertensor' is not emulated)", describe(quant_mode))
    if quant_mode not in QUANT_MODES:
        require_ascend950("quant_mode", quant_mode, "a scale per column")
    if dst_type_max != 0.0:
        raise arg_error(ModeError, "dst_type_max", "0.0 (the fp8 / hifloat8 maxima are Ascend 950's)",
                        describe(dst_type_max))
    dst = _dst_kind(dst_type)
    x = required(input, "input")
    smooth = optional(smooth_scales, "smooth_scales")
    groups = optional(group_index, "group_index")
    if x.ndim < 2:
        raise arg_error(ShapeError, "input", "at least 2 dims [..., H]", f"shape {x.shape}")
    check_dtype(x, "input", DYNAMIC_QUANT_DTYPES)
    h = x.shape[-1]
    if h < 1 or (quant_mode == "perchannel" and x.shape[-2] < 1):
        raise arg_error(ShapeError, "input", "a last dim H >= 1 (and dim -2 >= 1 per channel)", f"shape {x.shape}")
    if dst == "int4" and h % INT4_PER_INT32:
        raise arg_error(ShapeError, "input", f"a last dim that is a multiple of {INT4_PER_INT32} for int4 "
                        "(quint4x2) output", f"shape {x.shape}")
    check_call_bytes(x, "input", QUANT_BYTES_PER_ELEMENT + (8 if asymmetric else 0))
    rows = x.size // h
    if groups is not None and smooth is None:
        raise arg_error(ShapeError, "smooth_scales", "a [E, H] tensor when group_index is given", None)
    if groups is not None and quant_mode != "pertoken":
        raise arg_error(ModeError, "quant_mode", "'pertoken' when group_index is given (the doc's rule)",
                        describe(quant_mode))
    if smooth is not None:
        check_dtype(smooth, "smooth_scales", (dtype_name(x.dtype),))
        if quant_mode == "perchannel":
            s = x.shape[-2]
            if smooth.shape != (s,):
                raise arg_error(ShapeError, "smooth_scales", f"shape [{s}] (input's dim -2, per channel)",
                                f"shape {smooth.shape}")
        elif groups is None:
            if smooth.shape != (h,):
                raise arg_error(ShapeError, "smooth_scales", f"shape [{h}] (x's last dim; [E, {h}] needs "
                                "group_index)", f"shape {smooth.shape}")
        else:
            if smooth.ndim != 2 or smooth.shape[1] != h or not 1 <= smooth.shape[0] <= MAX_GROUPS:
                raise arg_error(ShapeError, "smooth_scales", f"shape [E, {h}] with 1 <= E <= {MAX_GROUPS} "
                                "(with group_index)", f"shape {smooth.shape}")
            check_dtype(groups, "group_index", ("int32",))
            e = smooth.shape[0]
            if groups.shape != (e,):
                raise arg_error(ShapeError, "group_index", f"shape [{e}] (smooth_scales' rows)",
                                f"shape {groups.shape}")
            g = groups.astype(np.int64)
            if (g < 0).any() or (g > rows).any():
                raise arg_error(IndexRangeError, "group_index", f"row ends in [0, {rows}]",
                                f"values in [{int(g.min())}, {int(g.max())}]")
            if (np.diff(g) < 0).any():
                at = int(np.flatnonzero(np.diff(g) < 0)[0])
                raise arg_error(IndexRangeError, "group_index", "non-decreasing values",
                                f"group_index[{at}] = {int(g[at])} > group_index[{at + 1}] = {int(g[at + 1])}")
            if int(g[-1]) != rows:
                raise arg_error(IndexRangeError, "group_index", f"a last value equal to the row count {rows} "
                                f"(x {x.shape})", int(g[-1]))
    return DynamicQuantArgs(x, smooth, groups, dst, quant_mode, asymmetric)


def npu_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode: str = "pertoken",
                      dst_type_max: float = 0.0):
    """``torch_npu.npu_dynamic_quant``: symmetric int8 / int4 dynamic quant, per token (every SoC)
    or per channel (Ascend 950) (module doc).

    ``input`` is the doc's ``x`` (torch_npu's schema names it ``input``).

    Args:
        input: ``[..., H]`` bf16 / fp16, at least 2-D, H >= 1; H a multiple of 8 for int4.
        smooth_scales: optional, x's dtype: ``[H]``, or ``[E, H]`` with group_index; per channel
            ``[S]`` (S = ``input.shape[-2]``), multiplying the rows of axis -2.
        group_index: optional int32 ``[E]``, E <= 1024: non-decreasing row ends, the last equal
            to the row count (``x.size / H``); needs smooth_scales ``[E, H]``; per token only.
        dst_type: None or torch.int8 / 1 (int8 y), torch.quint4x2 / 16 (int4 y packed in int32).
        quant_mode: ``'pertoken'``; ``'perchannel'`` on an emulated Ascend 950 (scale per column:
            ``max|v|`` over axis -2).
        dst_type_max: 0.0 only.

    Returns:
        ``(y, scale)``: y int8 of x's shape (int4: int32 ``[..., H / 8]``, 8 values per word,
        the first in the lowest 4 bits), values in ``[-127, 127]`` (int4 ``[-7, 7]``); scale
        fp32 ``x.shape[:-1]`` (per channel ``x.shape[:-2] + (H,)``), the dequant scale
        (``x * smooth ~= y * scale``).

    Raises:
        ShapeError: a shape other than the above; outputs and working copies over
            :data:`._check.MAX_CALL_BYTES` (a broadcast view of many rows), before allocating.
        DTypeError: x not bf16 / fp16, smooth_scales not x's dtype, group_index not int32.
        IndexRangeError: group_index decreasing, outside ``[0, rows]``, or not ending at rows.
        ModeError: another dst_type, quant_mode or dst_type_max; ``'perchannel'`` on an emulated
            SoC other than an Ascend 950 (the message names the SoC and how to set it).

    Source: op-plugin ``docs/context/torch_npu-npu_dynamic_quant.md`` and master's
    ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_dynamic_quant.md`` (per channel); ops-nn
    ``quant/dynamic_quant/op_kernel/dynamic_quant.h``, ``dynamic_quant_db.h``,
    ``dynamic_quant_moe.h``, ``op_host/dynamic_quant_tiling.cpp`` (module doc).
    """
    args = _validate(input, smooth_scales, group_index, dst_type, quant_mode, dst_type_max,
                     False)
    out = get_backend().quant(args)
    return out.y, out.scale


def npu_dynamic_quant_asymmetric(input, *, smooth_scales=None, group_index=None, dst_type=None,
                                 quant_mode: str = "pertoken", dst_type_max: float = 0.0):
    """``torch_npu.npu_dynamic_quant_asymmetric``: asymmetric int8 / int4 dynamic quant with a
    scale and an offset per token (every SoC) or per channel (Ascend 950).

    Per row r of the fp32 values ``v = x * smooth`` (per channel: per column, over axis -2),
    DST_MAX / DST_MIN 127 / -128 (int8) or 7 / -8 (int4)::

        scale  = fp32((max(v) - min(v)) / (DST_MAX - DST_MIN))
        offset = fp32(DST_MAX - max(v) / scale)
        y      = clip(rint(v / scale + offset), DST_MIN, DST_MAX)

    so that ``v ~= (y - offset) * scale``. A row whose max equals its min (the kernel divides
    0 by 0): scale 0, offset 0, y 0 (a choice; the sources are silent).

    Args, shapes and errors: as :func:`npu_dynamic_quant` (the same argument rules).

    Returns:
        ``(y, scale, offset)``: y int8 of x's shape in ``[-128, 127]`` (int4: ``[-8, 7]`` packed
        in int32 ``[..., H / 8]``, the first value in the lowest 4 bits); scale and offset fp32
        ``x.shape[:-1]`` (per channel ``x.shape[:-2] + (H,)``).

    Source: op-plugin ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_dynamic_quant_asymmetric.md``
    (formula, shapes, group_index rule) and the golden
    ``test/test_custom_ops/test_npu_dynamic_quant_asymmetric.py``; torch_npu 2.14's schema and
    ``npu_dynamic_quant_asymmetric`` meta (docs/ops.md#npu_dynamic_quant_asymmetric).
    """
    args = _validate(input, smooth_scales, group_index, dst_type, quant_mode,
                     dst_type_max, True)
    out = get_backend().quant(args)
    return out.y, out.scale, out.offset
