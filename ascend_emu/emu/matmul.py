"""Matmuls of the emu backend: exact widening to fp32, fp32 BLAS accumulation.

Numerics (DESIGN.md "Numerics policy"): bf16 / fp16 inputs are widened exactly to fp32 and
multiplied with fp32 accumulation (sgemm); the caller rounds the result where the kernel does.
int8 x int8 products are exact in float64 BLAS (``|sum| < 2**53``), then cast to int32-valued
fp32 / int64 by the caller as its dequant chain needs.

Weights cast to FRACTAL_NZ (:class:`~ascend_emu.layouts.NZArray`) are constant for the life of
the cast tensor, like the NZ copy torch_npu makes: their fp32 / fp64 widening is computed on the
first call and kept on the array. Changing such a weight in place after it has been used is not
seen by later calls; cast it again instead.

ND weights (``weight_uk``) are widened once too, but checked on every call: the fp32 copy is kept
per memory address, shape, strides and dtype (the torch drop-in hands a new NumPy view of the
same tensor to every call), together with a 64-bit fingerprint of the weight's bytes
(:func:`fingerprint`, a position-weighted sum over 8-byte words, about a tenth of the cost of
widening); a weight written in place since is seen by its new fingerprint and widened again.
At most :data:`ND_CACHE_BYTES` of fp32 copies are kept, least recently used first out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
from numba import njit

from ..layouts import NZArray
from ..quant import BF16, to_f32

_F32_ATTR = "_ascend_emu_f32"
_F64_ATTR = "_ascend_emu_f64"


@njit(cache=True)
def _widen_bf16_bits(bits, out):
    """``out[i] = bits[i] << 16`` (uint16 -> uint32, 1-D): the fp32 bits of bf16 values, one pass."""
    for i in range(bits.shape[0]):
        out[i] = np.uint32(bits[i]) << np.uint32(16)


def widen_f32(w: np.ndarray) -> np.ndarray:
    """:func:`~ascend_emu.quant.to_f32` (exact) with one allocation for bf16 (``bits << 16``; the
    first widening of a large weight is mostly page faults of new memory) and less per-call work
    for small arrays: a plain C-contiguous writable bf16 array is widened in one compiled pass,
    any other in place by NumPy (same bits)."""
    if w.dtype == BF16:
        if type(w) is np.ndarray and w.flags.c_contiguous and w.flags.writeable:
            out = np.empty(w.shape, dtype=np.uint32)
            _widen_bf16_bits(w.reshape(-1).view(np.uint16), out.reshape(-1))
            return out.view(np.float32)
        out = w.view(np.uint16).astype(np.uint32)
        np.left_shift(out, np.uint32(16), out=out)
        return out.view(np.float32)
    return to_f32(w)


def _cached(w: np.ndarray, attr: str, make):
    if isinstance(w, NZArray):
        cached = getattr(w, attr, None)
        if cached is None:
            cached = make(np.asarray(w))
            setattr(w, attr, cached)
        return cached
    return make(np.asarray(w))


#: Largest total size of the fp32 copies of ND weights kept (module doc).
ND_CACHE_BYTES = 1 << 30
_nd_cache: OrderedDict[tuple, tuple[int, np.ndarray]] = OrderedDict()
_nd_lock = threading.Lock()


@njit(cache=True)
def _weighted_sum(words):
    h = np.uint64(0)
    for i in range(words.shape[0]):
        h += words[i] * np.uint64(2 * i + 1)  # wraps modulo 2**64
    return h


def fingerprint(a: np.ndarray) -> int:
    """64-bit fingerprint of a C-contiguous array's bytes: ``sum(word[i] * (2i + 1)) mod 2**64``
    over its 8-byte words (narrower words when the size is not a multiple of 8). Any change of
    one word changes it; it is not a cryptographic hash."""
    nbytes = a.nbytes
    word = np.uint64 if nbytes % 8 == 0 else np.uint32 if nbytes % 4 == 0 else np.uint16 if nbytes % 2 == 0 \
        else np.uint8
    return int(_weighted_sum(a.reshape(-1).view(np.uint8).view(word)))


def _nd_weight_f32(w: np.ndarray) -> np.ndarray:
    """fp32 copy of an ND weight, reused while its bytes are unchanged (module doc)."""
    if not w.flags.c_contiguous or w.dtype == np.float32:
        return widen_f32(w)
    key = (w.__array_interface__["data"][0], w.shape, w.strides, w.dtype)
    mark = fingerprint(w)
    with _nd_lock:
        hit = _nd_cache.get(key)
        if hit is not None and hit[0] == mark:
            _nd_cache.move_to_end(key)
            return hit[1]
    wide = widen_f32(w)
    with _nd_lock:
        _nd_cache[key] = (mark, wide)
        _nd_cache.move_to_end(key)
        total = sum(v[1].nbytes for v in _nd_cache.values())
        while total > ND_CACHE_BYTES and len(_nd_cache) > 1:
            total -= _nd_cache.popitem(last=False)[1][1].nbytes
    return wide


def clear_weight_cache() -> None:
    """Forget every kept fp32 copy of an ND weight (NZ weights keep theirs on the array)."""
    with _nd_lock:
        _nd_cache.clear()


def weight_f32(w: np.ndarray) -> np.ndarray:
    """fp32 copy of a bf16 / fp16 / fp32 weight: kept on FRACTAL_NZ weights; for ND weights kept
    per address and reused while the weight's fingerprint is unchanged (module doc). Read only:
    callers must not write into it."""
    if isinstance(w, NZArray):
        return _cached(w, _F32_ATTR, widen_f32)
    return _nd_weight_f32(np.asarray(w))


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
