"""int8 quantization schemes: static (multiplier) and dynamic (dequant-scale) quant.

Source: ops_reference §1.2 (DynamicQuant, static quant), §2.2 (per-tile) and §6 gotcha 3.

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
from .rounding import INT8_MAX, Rounding, f32_to_int8

Granularity = Literal["per_tensor", "per_token", "per_token_head", "per_tile"]
GRANULARITIES: tuple[str, ...] = Granularity.__args__
#: What happens to a group whose values are all zero (the kernel's 1/0 is not defined).
ZERO_GROUP_POLICY = ("a group whose dequant scale is 0 (all zeros, or amax / 127 underflowing) gets "
                     "dequant scale 0 and int8 values 0")
#: Granularities whose dynamic scale is ``amax * fp32(1/127)`` (the kernel's Muls, per-tile path,
#: ops_reference §1.2); all others use ``amax / 127`` (Div). The two differ by one fp32 ulp for a
#: few percent of amax values.
RECIPROCAL_127_GRANULARITIES = frozenset({"per_tile"})


def _check_granularity(granularity: str) -> None:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: expected one of {list(GRANULARITIES)}, got {granularity!r}")


def quantize_static(x, scale, *, rounding: Rounding = "half_even") -> np.ndarray:
    """Static int8 quant with a multiplier scale: ``saturate(round(fp32(x * scale)))``.

    Source: ops_reference §1.2 (static quant params are multipliers), §2.1, §4.

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
    """Dequant scale from a group's ``amax`` as the kernel forms it (ops_reference §1.2).

    ``amax / 127`` in fp32, or ``amax * fp32(1/127)`` for the granularities in
    :data:`RECIPROCAL_127_GRANULARITIES` (per-tile). For per-tile with clipping (§2.2) pass
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

    Source: ops_reference §1.2 (DynamicQuant), §2.1 (per-token, per-token-head), §2.2 (per-tile,
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

    The reciprocal is taken in fp32, then multiplied, as the kernel does (ops_reference §1.2).

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
