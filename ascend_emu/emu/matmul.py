"""Matmuls of the emu backend: exact widening to fp32, fp32 BLAS accumulation.

Numerics (DESIGN.md "Numerics policy"): bf16 / fp16 inputs are widened exactly to fp32 and
multiplied with fp32 accumulation (sgemm); the caller rounds the result where the kernel does.
int8 x int8 products are exact in float64 BLAS (``|sum| < 2**53``), then cast to int32-valued
fp32 / int64 by the caller as its dequant chain needs.

Weights cast to FRACTAL_NZ (:class:`~ascend_emu.layouts.NZArray`) are constant for the life of
the cast tensor, like the NZ copy torch_npu makes: their fp32 / fp64 widening is computed on the
first call and kept on the array. Changing such a weight in place after it has been used is not
seen by later calls; cast it again instead.
"""

from __future__ import annotations

import numpy as np

from ..layouts import NZArray
from ..quant import to_f32

_F32_ATTR = "_ascend_emu_f32"
_F64_ATTR = "_ascend_emu_f64"


def _cached(w: np.ndarray, attr: str, make):
    if isinstance(w, NZArray):
        cached = getattr(w, attr, None)
        if cached is None:
            cached = make(np.asarray(w))
            setattr(w, attr, cached)
        return cached
    return make(np.asarray(w))


def weight_f32(w: np.ndarray) -> np.ndarray:
    """fp32 copy of a bf16 / fp16 / fp32 weight (kept on FRACTAL_NZ weights, see module doc)."""
    return _cached(w, _F32_ATTR, to_f32)


def weight_f64(w: np.ndarray) -> np.ndarray:
    """float64 copy of an int8 weight, for exact int8 matmuls (kept on FRACTAL_NZ weights)."""
    return _cached(w, _F64_ATTR, lambda a: a.astype(np.float64))


def matmul_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` with fp32 inputs and fp32 accumulation (BLAS sgemm); batch dims broadcast."""
    return np.matmul(np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32))


def matmul_int8_exact(a_i8: np.ndarray, b_f64: np.ndarray) -> np.ndarray:
    """Exact ``int8 @ int8`` as float64 (every partial sum is an integer below 2**53).

    Args:
        a_i8: int8 ``[..., K]``.
        b_f64: the int8 weight as float64 ``[K, N]`` (see :func:`weight_f64`).

    Returns:
        float64 ``[..., N]`` holding the exact int32 results.
    """
    return np.matmul(np.asarray(a_i8).astype(np.float64), b_f64)
