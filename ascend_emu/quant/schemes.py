"""int8 quantization schemes: static (multiplier) and dynamic (dequant-scale) quant.

Source: ops_reference §1.2 and §6 gotcha 3.

- **Static** scales (``quant_scale_ckv``, ``quant_scale_ckr``, ``k_rope_scale``, ``c_kv_scale``)
  are *multipliers*: ``q = round(x * scale)``, saturated to int8.
- **Dynamic** quant computes a *dequant* scale per group, ``scale = amax / 127`` with
  ``amax = max |x|`` over the group, and ``q = round(x * (1 / scale))`` (a reciprocal multiply,
  as the kernel does), so that ``x ~= q * scale``.
- Groups: per-tensor (all), per-channel (static only: the scale broadcasts over the last axis),
  per-token (last axis), per-token-head (last axis of ``[T, N, D]``), per-tile (``tile_size``
  consecutive elements of the last axis).

An all-zero group has ``amax = 0``. The kernel would compute ``1/0``; here the scale is stored
as 0 and the quantized values as 0, so ``q * scale`` is still ``x`` (choice recorded in
:data:`ZERO_GROUP_POLICY`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..errors import ShapeError, arg_error
from .rounding import INT8_MAX, Rounding, f32_to_int8

Granularity = Literal["per_tensor", "per_token", "per_token_head", "per_tile"]
ZERO_GROUP_POLICY = "an all-zero group gets dequant scale 0 and int8 values 0"


def quantize_static(x, scale, *, rounding: Rounding = "half_even") -> np.ndarray:
    """Static int8 quant with a multiplier scale: ``saturate(round(x * scale))``.

    Args:
        x: fp32 ``[..., C]``.
        scale: fp32 multiplier, ``[1]`` (per-tensor) or ``[C]`` / ``[1, C]`` (per-channel),
            broadcast over the last axis.
        rounding: ``half_even`` (CAST_RINT, the default) or ``half_away``.

    Returns:
        int8 of ``x``'s shape.

    Raises:
        ShapeError: ``scale`` does not broadcast over the last axis of ``x``.
    """
    x = np.asarray(x, dtype=np.float32)
    s = np.asarray(scale, dtype=np.float32).reshape(-1)
    if s.size not in (1, x.shape[-1]):
        raise arg_error(ShapeError, "scale", f"1 or {x.shape[-1]} elements (per-tensor or per-channel)",
                        s.size)
    return f32_to_int8(x * s, rounding)  # fp32 multiply, as the kernel's Muls / Mul


def group_amax(x, granularity: Granularity, *, tile_size: int | None = None) -> np.ndarray:
    """max |x| per quant group, fp32, shaped to broadcast against ``x``'s groups.

    Returns:
        per_tensor ``[1]``; per_token / per_token_head ``[..., 1]``; per_tile
        ``[..., D / tile_size, 1]`` (against ``x`` reshaped to ``[..., D/tile, tile]``).

    Raises:
        ShapeError: per_tile without a ``tile_size`` dividing the last axis.
    """
    a = np.abs(np.asarray(x, dtype=np.float32))
    if granularity == "per_tensor":
        return np.max(a, initial=0.0).reshape(1).astype(np.float32)
    if granularity in ("per_token", "per_token_head"):
        return np.max(a, axis=-1, keepdims=True, initial=0.0)
    if granularity == "per_tile":
        return np.max(_tiles(a, tile_size), axis=-1, keepdims=True, initial=0.0)
    raise ValueError(f"granularity: expected one of {Granularity.__args__}, got {granularity!r}")


def _tiles(x: np.ndarray, tile_size: int | None) -> np.ndarray:
    d = x.shape[-1]
    if not tile_size or d % tile_size:
        raise arg_error(ShapeError, "tile_size", f"a positive divisor of the last dim {d}", tile_size)
    return x.reshape(*x.shape[:-1], d // tile_size, tile_size)


def quantize_dynamic(x, granularity: Granularity, *, tile_size: int | None = None,
                     rounding: Rounding = "half_even") -> tuple[np.ndarray, np.ndarray]:
    """Dynamic symmetric int8 quant: ``scale = amax / 127``, ``q = round(x * (1 / scale))``.

    Args:
        x: fp32 ``[..., D]``.
        granularity: group shape (module doc).
        tile_size: tile length for ``per_tile``.
        rounding: int8 rounding.

    Returns:
        ``(q, scale)``: int8 of ``x``'s shape, and fp32 dequant scales: per_tensor ``[1]``,
        per_token / per_token_head ``[..., 1]``, per_tile ``[..., D / tile_size]``.

    Raises:
        ShapeError: bad ``tile_size``.
    """
    x = np.asarray(x, dtype=np.float32)
    amax = group_amax(x, granularity, tile_size=tile_size)
    scale = (amax / np.float32(INT8_MAX)).astype(np.float32)
    q = quantize_with_dequant_scale(x, scale, granularity, tile_size=tile_size, rounding=rounding)
    if granularity == "per_tile":
        scale = scale[..., 0]
    return q, scale


def quantize_with_dequant_scale(x, scale, granularity: Granularity, *, tile_size: int | None = None,
                                rounding: Rounding = "half_even") -> np.ndarray:
    """``round(x * (1 / scale))`` with groups as in :func:`group_amax`; zero scale -> 0."""
    x = np.asarray(x, dtype=np.float32)
    scale = np.asarray(scale, dtype=np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, np.float32(1.0) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    if granularity == "per_tile":
        inv = inv.reshape(*x.shape[:-1], -1, 1)
        return f32_to_int8(_tiles(x, tile_size) * inv, rounding).reshape(x.shape)
    return f32_to_int8(x * inv, rounding)


def dequantize(q, scale, granularity: Granularity = "per_token", *, tile_size: int | None = None
               ) -> np.ndarray:
    """``q * scale`` in fp32 with the groups of :func:`quantize_dynamic`."""
    q = np.asarray(q).astype(np.float32)
    scale = np.asarray(scale, dtype=np.float32)
    if granularity == "per_tile":
        return (_tiles(q, tile_size) * scale[..., None]).reshape(q.shape)
    return q * scale
