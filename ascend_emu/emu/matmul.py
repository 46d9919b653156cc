"""Matmuls of the emu backend: exact widening to fp32, fp32 BLAS accumulation; exact int8 products.

Numerics (DESIGN.md "Numerics policy"): bf16 / fp16 inputs are widened exactly to fp32 and
multiplied with fp32 accumulation (sgemm); the caller rounds the result where the kernel does.

int8 x int8 products (:func:`matmul_int8`) have one contract whatever computes them: the exact
int32 result, as the Cube unit's int32 accumulator holds it (ops_reference §2.1: int8 matmuls
are exact integers). The contraction length is bounded so that no int32 sum can wrap
(:data:`INT8_MAX_K`). Three engines give that same result, chosen once per process
(:func:`int8_engine`):

- ``"onednn"``: ``torch._int_mm`` (oneDNN ``gemm_s8s8s32``, int32 accumulation), when the process
  has imported torch already (the emulator never loads it on its own) and the CPU has int8
  dot-product instructions (``avx512_vnni`` / ``avx_vnni`` / ``amx_int8``). The CPU kernel takes
  any M, K, N (no padding: the multiple-of-8 and M > 16 rules are the CUDA kernel's). On a CPU without them oneDNN is exact too but runs a slow generic
  kernel, so it is not chosen there.
- ``"sgemm"``: fp32 BLAS over K-chunks of at most :data:`SGEMM_EXACT_K` = 1024. Every product is
  an integer of magnitude at most ``128 * 128 = 2**14``, so every partial sum of a chunk is an
  integer of magnitude at most ``2**24``, which fp32 holds exactly whatever the summation order
  or FMA use; the chunk results are then summed in int32. Needs an fp32 copy of the weight
  (kept on FRACTAL_NZ weights, 4 bytes per element).
- ``"float64"``: float64 BLAS (every partial sum below ``2**53``); the reference the other two
  are checked against, kept for benchmarks.

Weights cast to FRACTAL_NZ (:class:`~ascend_emu.layouts.NZArray`) are constant for the life of
the cast tensor, like the NZ copy torch_npu makes: their fp32 widening (and, for int8 weights
under the ``"float64"`` engine, their fp64 one) is computed on the first call and kept on the
array. Changing such a weight in place after it has been used is not seen by later calls; cast it
again instead.

ND weights (``weight_uk``) are widened once too, but checked on every call: the fp32 copy is kept
per memory address, shape, strides and dtype (the torch drop-in hands a new NumPy view of the
same tensor to every call), together with a 64-bit fingerprint of the weight's bytes
(:func:`fingerprint`, a position-weighted sum over 8-byte words, about a tenth of the cost of
widening); a weight written in place since is seen by its new fingerprint and widened again.
At most :data:`ND_CACHE_BYTES` of fp32 copies are kept, least recently used first out.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections import OrderedDict

import numpy as np
from numba import njit

from ..layouts import NZArray
from ..quant import BF16, hif8_to_f32, to_f32

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


def weight_f32_8bit(w: np.ndarray, element: str) -> np.ndarray:
    """fp32 values of an Ascend 950 8-bit weight (exact): ``"float8_e4m3fn"`` (an ml_dtypes
    array) or ``"hifloat8"`` (uint8 codes, :func:`~ascend_emu.quant.hif8_to_f32`); kept on
    FRACTAL_NZ weights, one copy per element type. Read only."""
    decode = hif8_to_f32 if element == "hifloat8" else (lambda a: a.astype(np.float32))
    return _cached(w, f"_emu_{element}_f32", decode)


def weight_f64(w: np.ndarray) -> np.ndarray:
    """float64 copy of an int8 weight, for the ``"float64"`` int8 engine (kept on FRACTAL_NZ weights)."""
    return _cached(w, _F64_ATTR, lambda a: a.astype(np.float64))


def matmul_f32(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` with fp32 inputs and fp32 accumulation (BLAS sgemm); batch dims broadcast.
    ``out``: an fp32 C-contiguous array of the result's shape to write into (a reused buffer)."""
    return np.matmul(np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32), out=out)


# ---------------------------------------------------------------------- int8 x int8 -> int32
#: Longest contraction :func:`matmul_int8` accepts: ``K * 128 * 128 <= 2**31 - 1``, so no int32
#: sum can wrap whatever the values (the largest is ``K * (-128) * (-128)``).
INT8_MAX_K = (2**31 - 1) // (128 * 128)
#: Longest K-chunk the ``"sgemm"`` engine sums in fp32: ``1024 * 2**14 = 2**24``, the largest
#: magnitude below which fp32 holds every integer (module doc).
SGEMM_EXACT_K = 1024
#: The int8 engines, fastest first where each is available (module doc).
INT8_ENGINES = ("onednn", "sgemm", "float64")
#: CPU flags (``/proc/cpuinfo``) of the int8 dot-product instructions oneDNN's int8 GEMM uses.
_INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
_int8_engine: str | None = None
_torch = None


def _cpu_has_int8_dot() -> bool:
    """Whether the CPU has int8 dot-product instructions (Linux ``/proc/cpuinfo`` flags; False
    where they cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return any(f in flags for f in _INT8_DOT_FLAGS)
    except OSError:
        pass
    return False


def _import_torch():
    global _torch
    if _torch is None:
        import torch  # noqa: PLC0415 (only when the oneDNN engine is used)

        _torch = torch
    return _torch


def _torch_loaded() -> bool:
    """Whether the process has imported torch already (the drop-in's users always have)."""
    return "torch" in sys.modules


def default_int8_engine() -> str:
    """The engine a process uses unless :func:`set_int8_engine` chose one: ``"onednn"`` when the
    CPU has int8 dot-product instructions and the process has imported torch already (the
    emulator never loads torch, and a second OpenMP runtime, on its own), else ``"sgemm"``
    (module doc). Chosen at the first int8 product."""
    if _cpu_has_int8_dot() and _torch_loaded():
        try:
            _import_torch()
            return "onednn"
        except ImportError:
            pass
    return "sgemm"


def int8_engine() -> str:
    """The int8 engine :func:`matmul_int8` uses now (chosen on first use, module doc)."""
    global _int8_engine
    if _int8_engine is None:
        _int8_engine = default_int8_engine()
    return _int8_engine


def set_int8_engine(name: str | None) -> str:
    """Make :func:`matmul_int8` use engine ``name`` (one of :data:`INT8_ENGINES`; None: back to
    :func:`default_int8_engine`); returns the engine used before. All give the same int32 results;
    benchmarks and tests switch them.

    Raises:
        ValueError: ``name`` not an engine.
        ImportError: ``"onednn"`` without torch.
    """
    global _int8_engine
    if name is not None and name not in INT8_ENGINES:
        raise ValueError(f"set_int8_engine: name must be one of {INT8_ENGINES} or None, got {name!r}")
    if name == "onednn":
        _import_torch()
    before = int8_engine()
    _int8_engine = name
    return before


def weight_f32_int8(w: np.ndarray) -> np.ndarray:
    """fp32 copy of an int8 weight for the ``"sgemm"`` engine (exact; kept on FRACTAL_NZ weights)."""
    return _cached(w, _F32_ATTR, lambda a: a.astype(np.float32))


def _int8_sgemm(a: np.ndarray, w: np.ndarray, w_nk: bool) -> np.ndarray:
    """``"sgemm"`` engine: fp32 BLAS per K-chunk of at most :data:`SGEMM_EXACT_K`, int32 sum."""
    k = a.shape[1]
    w32 = weight_f32_int8(w).T if w_nk else weight_f32_int8(w)  # [K, N]
    a32 = a.astype(np.float32)
    if k <= SGEMM_EXACT_K:
        return np.matmul(a32, w32).astype(np.int32)
    out = np.zeros((a.shape[0], w32.shape[1]), dtype=np.int32)
    part = np.empty(out.shape, dtype=np.float32)
    for lo in range(0, k, SGEMM_EXACT_K):
        np.matmul(a32[:, lo:lo + SGEMM_EXACT_K], w32[lo:lo + SGEMM_EXACT_K], out=part)
        out += part.astype(np.int32)  # each chunk exact, |total| < 2**31 (INT8_MAX_K)
    return out


def _as_tensor(torch, x: np.ndarray):
    """A torch view of ``x`` (a copy only where torch cannot view it: negative strides). A read-only
    array is viewed too: ``torch._int_mm`` only reads it (``from_numpy`` would warn)."""
    x = np.asarray(x)
    if any(st < 0 for st in x.strides):
        x = np.ascontiguousarray(x)
    if x.flags.writeable:
        return torch.from_numpy(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


def _int8_onednn(a: np.ndarray, w: np.ndarray, w_nk: bool) -> np.ndarray:
    """``"onednn"`` engine: ``torch._int_mm`` on the int8 operands as they are (no copy of w)."""
    torch = _import_torch()
    tw = _as_tensor(torch, w)
    return torch._int_mm(_as_tensor(torch, np.ascontiguousarray(a)), tw.T if w_nk else tw).numpy()


def matmul_int8(a: np.ndarray, w: np.ndarray, *, w_nk: bool = False) -> np.ndarray:
    """Exact ``int8 a @ int8 w`` as int32, on the engine :func:`int8_engine` names (module doc).

    Args:
        a: int8 ``[M, K]``.
        w: int8 ``[K, N]`` (``[N, K]`` with ``w_nk``: the product is then ``a @ w.T``), any
            strides; a FRACTAL_NZ weight keeps the ``"sgemm"`` / ``"float64"`` engines' widened
            copy (pass the weight itself with ``w_nk``, not a transposed view, so the copy is kept).
        w_nk: ``w`` is stored ``[N, K]``.

    Returns:
        int32 ``[M, N]``, C-contiguous: the exact integer products, identical on every engine.

    Raises:
        ValueError: an operand not int8 2-D, inner dimensions that differ, or ``K`` above
            :data:`INT8_MAX_K` (an int32 sum could wrap).
    """
    a = np.asarray(a)
    for name, x in (("a", a), ("w", w)):
        if x.dtype != np.int8 or x.ndim != 2:
            raise ValueError(f"matmul_int8: {name} must be a 2-D int8 array, got {x.dtype} of shape {tuple(x.shape)}")
    k_w = w.shape[1] if w_nk else w.shape[0]
    if a.shape[1] != k_w:
        where = "w.shape[1]" if w_nk else "w.shape[0]"
        raise ValueError(f"matmul_int8: a.shape[1] must equal the weight's K ({where}), got {a.shape[1]} and {k_w}")
    if a.shape[1] > INT8_MAX_K:
        raise ValueError(f"matmul_int8: K must be at most {INT8_MAX_K} (int32 sums exact), got {a.shape[1]}")
    engine = int8_engine()
    if engine == "onednn":
        return _int8_onednn(a, w, w_nk)
    if engine == "sgemm":
        return _int8_sgemm(a, w, w_nk)
    w64 = weight_f64(w).T if w_nk else weight_f64(w)
    return np.matmul(a.astype(np.float64), w64).astype(np.int32)
