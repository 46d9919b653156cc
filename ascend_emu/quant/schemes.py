"""int8 quantization schemes: static (multiplier) and dynamic (dequant-scale) quant.

Source: docs/sources.md#quant_rounding (DynamicQuant, static quant), docs/sources.md#per_tile_rows (per-tile).

- **Static** scales (``quant_scale_ckv``, ``quant_scale_ckr``, ``k_rope_scale``, ``c_kv_scale``)
  are *multipliers*: ``q = round(x * scale)`` in fp32, saturated to int8.
- **Dynamic** quant computes a *dequant* scale per group from ``amax = max |x|`` over the group,
  ``scale = amax / 127`` (per-tile: ``amax * (1/127)``, see :data:`RECIPROCAL_127_GRANULARITIES`),
  and ``q = round(x * (1 / scale))`` (a reciprocal multiply, as the kernel does), so that
  ``x ~= q * scale``.
- Groups (``Granularity``), for ``x`` of shape ``[..., D]``:

  ==================  =====================================  ==========================
  granularity         group                                  scale shape
  ==================  =====================================  ==========================
  ``per_tensor``      all of ``x``                           ``[1]``
  ``per_token``       the last axis (``x`` is ``[T, D]``)    ``[..., 1]``
  ``per_token_head``  the last axis (``x`` is ``[T, N, D]``) ``[..., 1]``
  ``per_tile``        ``tile_size`` consecutive elements      ``[..., D / tile_size]``
                      of the last axis
  ==================  =====================================  ==========================

  Per-channel quant exists only with static scales (:func:`quantize_static`, a ``[D]`` scale).

An all-zero group has ``amax = 0``; the kernel would compute ``1/0``. Here the scale is stored as 0
and the quantized values as 0, so ``q * scale`` is still ``x`` (:data:`ZERO_GROUP_POLICY`). The
same applies to a group of subnormals whose ``amax / 127`` underflows to 0 in fp32 (its values are
below 127 * 2**-149 in magnitude).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..errors import ShapeError, arg_error
from .rounding import INT8_MAX, Rounding, f32_to_int8, saturate_int8

Granularity = Literal["per_tensor", "per_token", "per_token_head", "per_tile"]
GRANULARITIES: tuple[str, ...] = Granularity.__args__
#: What happens to a group whose values are all zero (the kernel's 1/0 is not defined).
ZERO_GROUP_POLICY = ("a group whose dequant scale is 0 (all zeros, or amax / 127 underflowing) gets "
                     "dequant scale 0 and int8 values 0")
#: Granularities whose dynamic scale is ``amax * fp32(1/127)`` (the kernel's Muls, per-tile path,
#: docs/sources.md#quant_rounding); all others use ``amax / 127`` (Div). The two differ by one fp32 ulp for a
#: few percent of amax values.
RECIPROCAL_127_GRANULARITIES = frozenset({"per_tile"})


def _check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: expected one of {list(GRANULARITIES)}, got {granularity!r}")


def quantize_static(x, scale, *, rounding: Rounding = "half_even") -> np.ndarray:
    """Static int8 quant with a multiplier scale: ``saturate(round(fp32(x * scale)))``.

    Source: docs/sources.md#quant_rounding (static quant params are multipliers), docs/sources.md#npu_mla_prolog_v3, docs/sources.md#npu_kv_rmsnorm_rope_cache.

    Args:
        x: values ``[..., C]``, converted to fp32.
        scale: fp32 multiplier with 1 element (per-tensor: ``[1]``, or ``[1, C]`` of which the
            caller has already taken element 0) or ``C`` elements (per-channel: ``[C]`` /
            ``[1, C]``), broadcast over the last axis.
        rounding: ``"half_even"`` (CAST_RINT, the default) or ``"half_away"``.

    Returns:
        int8 array of ``x``'s shape.

    Raises:
        ShapeError: ``scale`` has neither 1 nor ``C`` elements.
    """
    x = np.asarray(x, dtype=np.float32)
    s = np.asarray(scale, dtype=np.float32).reshape(-1)
    c = x.shape[-1] if x.ndim else 1
    if s.size not in (1, c):
        raise arg_error(ShapeError, "scale", f"1 or {c} elements (per-tensor or per-channel)", s.size)
    return f32_to_int8(x * s, rounding)  # fp32 multiply, as the kernel's Muls / Mul


def group_amax(x, granularity: Granularity, *, tile_size: int | None = None) -> np.ndarray:
    """``max |x|`` per quant group, fp32, shaped to broadcast against the groups.

    Args:
        x: values ``[..., D]``, converted to fp32.
        granularity: group shape (module doc).
        tile_size: tile length for ``per_tile`` (must divide D).

    Returns:
        fp32: per_tensor ``[1]``; per_token / per_token_head ``[..., 1]``; per_tile
        ``[..., D / tile_size, 1]`` (against ``x`` reshaped to ``[..., D/tile, tile]``). NaN in
        a group gives NaN.

    Raises:
        ValueError: unknown granularity.
        ShapeError: per_tile without a ``tile_size`` dividing the last axis.
    """
    _check_granularity(granularity)
    a = np.abs(np.asarray(x, dtype=np.float32))
    if granularity == "per_tensor":
        return np.max(a, initial=0.0).reshape(1).astype(np.float32)
    if granularity == "per_tile":
        return np.max(_tiles(a, tile_size), axis=-1, keepdims=True, initial=0.0)
    return np.max(a, axis=-1, keepdims=True, initial=0.0)


def dynamic_scale(amax, granularity: Granularity) -> np.ndarray:
    """Dequant scale from a group's ``amax`` as the kernel forms it (docs/sources.md#quant_rounding).

    ``amax / 127`` in fp32, or ``amax * fp32(1/127)`` for the granularities in
    :data:`RECIPROCAL_127_GRANULARITIES` (per-tile). For per-tile with clipping (docs/sources.md#per_tile_rows) pass
    ``alpha * amax``.

    Args:
        amax: fp32 group maxima, any shape.
        granularity: the quant granularity.

    Returns:
        fp32 array of ``amax``'s shape.

    Raises:
        ValueError: unknown granularity.
    """
    _check_granularity(granularity)
    amax = np.asarray(amax, dtype=np.float32)
    if granularity in RECIPROCAL_127_GRANULARITIES:
        return (amax * (np.float32(1.0) / np.float32(INT8_MAX))).astype(np.float32)
    return (amax / np.float32(INT8_MAX)).astype(np.float32)


def _tiles(x: np.ndarray, tile_size: int | None) -> np.ndarray:
    d = x.shape[-1] if x.ndim else 0
    if not tile_size or tile_size < 0 or d % tile_size:
        raise arg_error(ShapeError, "tile_size", f"a positive divisor of the last dim {d}", tile_size)
    return x.reshape(*x.shape[:-1], d // tile_size, tile_size)


def quantize_dynamic(x, granularity: Granularity, *, tile_size: int | None = None,
                     rounding: Rounding = "half_even") -> tuple[np.ndarray, np.ndarray]:
    """Dynamic symmetric int8 quant: ``scale = dynamic_scale(amax)``, ``q = round(x * (1/scale))``.

    Source: docs/sources.md#quant_rounding (DynamicQuant), docs/sources.md#npu_mla_prolog_v3 (per-token, per-token-head), docs/sources.md#per_tile_rows (per-tile,
    without the alpha clip: clip first and use :func:`quantize_with_dequant_scale` for that).

    Args:
        x: values ``[..., D]``, converted to fp32.
        granularity: group shape (module doc).
        tile_size: tile length for ``per_tile``.
        rounding: int8 rounding (``half_even`` = CAST_RINT).

    Returns:
        ``(q, scale)``: int8 of ``x``'s shape, and fp32 dequant scales (``x ~= q * scale``):
        per_tensor ``[1]``, per_token / per_token_head ``[..., 1]``, per_tile
        ``[..., D / tile_size]``. All-zero groups: see :data:`ZERO_GROUP_POLICY`.

    Raises:
        ValueError: unknown granularity.
        ShapeError: bad ``tile_size``.
    """
    x = np.asarray(x, dtype=np.float32)
    amax = group_amax(x, granularity, tile_size=tile_size)
    scale = dynamic_scale(amax, granularity)
    if granularity == "per_tile":
        scale = scale[..., 0]  # [..., D / tile]
    q = quantize_with_dequant_scale(x, scale, granularity, tile_size=tile_size, rounding=rounding)
    return q, scale


def _expand_scale(scale: np.ndarray, x_shape: tuple[int, ...], granularity: str,
                  tile_size: int | None) -> np.ndarray:
    """``scale`` shaped to broadcast against ``x`` (per_tile: against ``[..., D/tile, tile]``)."""
    if granularity == "per_tile":
        d = x_shape[-1] if x_shape else 0
        tiles = d // tile_size if tile_size and tile_size > 0 and d % tile_size == 0 else None
        if tiles is None:
            raise arg_error(ShapeError, "tile_size", f"a positive divisor of the last dim {d}", tile_size)
        want = (*x_shape[:-1], tiles)
        if scale.shape == (*want, 1):
            scale = scale[..., 0]
        if scale.shape != want:
            raise arg_error(ShapeError, "scale", f"per-tile scales of shape {list(want)}", list(scale.shape))
        return scale[..., None]  # [..., D/tile, 1]
    if granularity == "per_tensor":
        if scale.size != 1:
            raise arg_error(ShapeError, "scale", "1 per-tensor scale", list(scale.shape))
        return scale.reshape(1)
    want = (*x_shape[:-1], 1)
    if scale.shape != want:
        raise arg_error(ShapeError, "scale", f"per-token scales of shape {list(want)}", list(scale.shape))
    return scale


def _grouped(a: np.ndarray, scale, granularity: str, tile_size: int | None
             ) -> tuple[np.ndarray, np.ndarray]:
    """``a`` viewed by groups (per_tile: ``[..., D/tile, tile]``) and ``scale`` broadcast to it."""
    _check_granularity(granularity)
    scale = _expand_scale(np.asarray(scale, dtype=np.float32), a.shape, granularity, tile_size)
    return (_tiles(a, tile_size) if granularity == "per_tile" else a), scale


def quantize_with_dequant_scale(x, scale, granularity: Granularity, *, tile_size: int | None = None,
                                rounding: Rounding = "half_even") -> np.ndarray:
    """``saturate(round(x * fp32(1 / scale)))`` with given dequant scales; zero scale -> 0.

    The reciprocal is taken in fp32, then multiplied, as the kernel does (docs/sources.md#quant_rounding).

    Args:
        x: values ``[..., D]``, converted to fp32.
        scale: fp32 dequant scales shaped as :func:`quantize_dynamic` returns them (per_tile
            also accepts ``[..., D / tile_size, 1]``).
        granularity: group shape (module doc).
        tile_size: tile length for ``per_tile``.
        rounding: int8 rounding.

    Returns:
        int8 array of ``x``'s shape.

    Raises:
        ValueError: unknown granularity.
        ShapeError: ``scale`` does not match the groups of ``x``, or bad ``tile_size``.
    """
    x = np.asarray(x, dtype=np.float32)
    groups, scale = _grouped(x, scale, granularity, tile_size)
    # A subnormal scale has an fp32 reciprocal of inf: x * inf saturates, 0 * inf is NaN -> 0,
    # the kernel's own arithmetic; the floating-point warnings that produces are expected.
    with np.errstate(over="ignore", invalid="ignore"):
        return f32_to_int8(groups * inverse_scale(scale), rounding).reshape(x.shape)


def inverse_scale(scale) -> np.ndarray:
    """The multiplier a dynamic quant applies: ``fp32(1 / scale)``, and 0 where ``scale`` is 0
    (:data:`ZERO_GROUP_POLICY`).

    Args:
        scale: fp32 dequant scales (>= 0), any shape.

    Returns:
        fp32 array of ``scale``'s shape (inf for a subnormal scale, as in fp32 hardware).
    """
    scale = np.asarray(scale, dtype=np.float32)
    positive = scale > 0
    with np.errstate(over="ignore", divide="ignore"):
        return np.where(positive, np.float32(1.0) / np.where(positive, scale, np.float32(1.0)),
                        np.float32(0.0)).astype(np.float32)


def dequantize(q, scale, granularity: Granularity = "per_token", *, tile_size: int | None = None
               ) -> np.ndarray:
    """``fp32(q) * scale`` with the groups of :func:`quantize_dynamic`.

    Args:
        q: int8 (or any integer) ``[..., D]``.
        scale: fp32 dequant scales shaped as :func:`quantize_dynamic` returns them.
        granularity: group shape (module doc); default ``per_token``.
        tile_size: tile length for ``per_tile``.

    Returns:
        fp32 array of ``q``'s shape.

    Raises:
        ValueError: unknown granularity.
        ShapeError: ``scale`` does not match the groups of ``q``, or bad ``tile_size``.
    """
    q = np.asarray(q).astype(np.float32)
    groups, scale = _grouped(q, scale, granularity, tile_size)
    return (groups * scale).reshape(q.shape)


# ---------------------------------------------------------------------- npu_dynamic_quant
#: The largest int4 value, the divisor of npu_dynamic_quant's int4 scale (ops-nn
#: ``quant/dynamic_quant/op_kernel/dynamic_quant_base.h``: ``DYNAMIC_QUANT_INT4_SYM_SCALE = 7.0``,
#: beside ``DYNAMIC_QUANT_INT8_SYM_SCALE = 127.0``, i.e. :data:`INT8_MAX`).
INT4_MAX = 7
#: int4 values per int32 word of npu_dynamic_quant's ``quint4x2`` output (op-plugin
#: ``DynamicQuantKernelNpuOpApi.cpp``: ``INT4_IN_INT32_NUM = 8``).
INT4_PER_INT32 = 8
#: How the A2 / A3 dynamic_quant kernels turn a row's ``amax`` into the stored dequant scale
#: (ops-nn, the GitHub mirror jbgztxdy/ops-nn @ fd1956fc4, ``quant/dynamic_quant/op_kernel/``); the
#: quantized values are the same in both (:func:`quantize_per_token_multiplier`):
#:
#: - ``"amax_times_inverse"``: ``amax * fp32(1 / qmax)`` (``Mul`` by ``constInvScale``):
#:   ``dynamic_quant_db.h:319`` (``QuantizeRow``), ``dynamic_quant_multi_row.h:236``,
#:   ``dynamic_quant_single_row.h:147`` (``DYNAMIC_QUANT_FACTOR = 1.0 / 127.0``, line 313): the
#:   kernels a call without ``group_index`` takes whenever a row fits the unified buffer
#:   (``op_host/dynamic_quant_tiling.cpp`` ``SetTilingKey``, ``SetTilingData``: tiling keys 2 / 3,
#:   10, 100).
#: - ``"inverse_of_multiplier"``: ``fp32(1 / fp32(qmax / amax))`` (the scalar ``1 / scale`` of
#:   ``scaleLocal.SetValue(i, 1 / scale)``): ``dynamic_quant.h:170``, ``dynamic_quant_moe.h:203``
#:   and the large-shape kernels (``dynamic_quant_large_shape_opt.h:79``): every MoE
#:   (``group_index``) call (tiling keys 7 / 8), and rows too long for the double-buffered
#:   kernels (keys 0 / 1 / 6).
#:
#: The two differ by one fp32 ulp for about 30 % of amax values and by two for a few in 10^5
#: (int4, qmax 7: about 50 % and 3 %; measured on 5 million uniform fp32 values).
TOKEN_SCALE_FORMS = ("amax_times_inverse", "inverse_of_multiplier")


def quantize_per_token_multiplier(x, qmax: int, *, scale_form: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-token symmetric quant as npu_dynamic_quant's A2 / A3 kernels compute it.

    For each row (last axis) of the fp32 values ``x`` (already ``x * smooth`` where a smooth
    applies): ``amax = max |x|``; the quant multiplier ``m = fp32(qmax / amax)`` (``Div`` of the
    constant by the row max); ``q = CAST_RINT(x * m)`` (fp32 ``Mul``, then round half to even:
    ``Cast(int32, CAST_RINT)`` -> ``Cast(half, CAST_ROUND)`` -> ``Cast(int8, CAST_TRUNC)``, exact
    by then); the stored dequant scale by ``scale_form`` (:data:`TOKEN_SCALE_FORMS`).

    Source: ops-nn ``quant/dynamic_quant/op_kernel/dynamic_quant.h`` ``Compute`` (lines 152-177 at
    jbgztxdy/ops-nn fd1956fc4: Cast CAST_NONE, Mul smooth, Abs, ReduceMax, Div 165, Muls 171,
    CAST_RINT 173), ``dynamic_quant_db.h`` ``QuantizeRow`` (Div 307, CAST_RINT 311).

    A row of zeros has ``amax = 0``: the kernel's ``m = qmax / 0`` is +inf in IEEE arithmetic (the
    vector ``Div`` page does not say) and both scale forms give exactly 0 (``0 * fp32(1/qmax)``,
    ``1 / inf``); ``0 * inf`` is NaN, whose int cast the sources do not define: here those values
    are 0 (:data:`ZERO_GROUP_POLICY`). Likewise an
    ``amax`` so small that ``m`` overflows to inf (below ``qmax / FLT_MAX``): its non-zero values
    give +-qmax, its zeros 0. A finite ``m`` never leaves ``[-qmax, qmax]`` after rounding
    (``|x * m| <= qmax * (1 + 2**-23)``).

    Args:
        x: values ``[..., H]``, converted to fp32.
        qmax: the output's largest value: :data:`~.rounding.INT8_MAX` (int8) or :data:`INT4_MAX`.
        scale_form: one of :data:`TOKEN_SCALE_FORMS`.

    Returns:
        ``(q, scale)``: int8 ``[..., H]`` in ``[-qmax, qmax]``, and fp32 dequant scales ``[...]``.

    Raises:
        ValueError: unknown ``scale_form``.
    """
    if scale_form not in TOKEN_SCALE_FORMS:
        raise ValueError(f"scale_form: expected one of {list(TOKEN_SCALE_FORMS)}, got {scale_form!r}")
    x = np.asarray(x, dtype=np.float32)
    amax = group_amax(x, "per_token")  # [..., 1]
    top = np.float32(qmax)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        mult = (top / amax).astype(np.float32)  # +inf for a zero row
        if scale_form == "amax_times_inverse":
            scale = (amax * (np.float32(1.0) / top)).astype(np.float32)
        else:
            scale = (np.float32(1.0) / mult).astype(np.float32)
        prod = np.clip(x * mult, -top, top)  # NaN (0 * inf) stays NaN: saturate_int8 makes it 0
    return saturate_int8(np.rint(prod)), scale[..., 0]


def unpack_int4_from_int32(words) -> np.ndarray:
    """The inverse of :func:`pack_int4_to_int32`: int32 ``[..., W]`` -> int8 ``[..., 8 W]`` in
    ``[-8, 7]``, value ``8 w + j`` from bits ``4 j .. 4 j + 3`` of word ``w`` (two's complement)."""
    w = np.asarray(words).view(np.uint32)
    nib = np.stack([(w >> np.uint32(4 * j)) & np.uint32(0xF) for j in range(INT4_PER_INT32)], axis=-1)
    q = nib.astype(np.int8)
    q[q > 7] -= 16
    return q.reshape(*w.shape[:-1], w.shape[-1] * INT4_PER_INT32)


def pack_int4_to_int32(q) -> np.ndarray:
    """Pack int4 values (int8 holding ``[-8, 7]``) into int32 words, 8 per word, the first value
    in the lowest 4 bits (two's-complement nibbles, little-endian): npu_dynamic_quant's
    ``quint4x2`` output, the kernel's packed ``int4b_t`` bytes read as int32 (op-plugin
    ``DynamicQuantKernelNpuOpApi.cpp``; ops-nn ``aclnnDynamicQuant.md``: an INT32 output holds 8
    int4 results, its last dim is x's / 8).

    Args:
        q: integer values in ``[-8, 7]``, ``[..., H]`` with H a multiple of 8.

    Returns:
        int32 ``[..., H / 8]``.

    Raises:
        ShapeError: H is not a multiple of 8.
    """
    q = np.asarray(q)
    h = q.shape[-1] if q.ndim else 0
    if h % INT4_PER_INT32:
        raise arg_error(ShapeError, "q", f"a last dim that is a multiple of {INT4_PER_INT32}", h)
    nib = (q.astype(np.int64) & 0xF).reshape(*q.shape[:-1], h // INT4_PER_INT32, INT4_PER_INT32)
    words = np.zeros(nib.shape[:-1], dtype=np.uint32)
    for j in range(INT4_PER_INT32):
        words |= (nib[..., j].astype(np.uint32) << np.uint32(4 * j))
    return words.view(np.int32)
