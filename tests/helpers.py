"""Test helpers shared by every test module: poison-filled caches, byte comparisons and the
accuracy criteria of the official tests (docs/sources.md#assert_rtol_equal, docs/sources.md#npu_kv_rmsnorm_rope_cache, docs/sources.md#npu_kv_quant_sparse_flash_attention).

Nothing here imports the code under test.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
#: Byte written into every cache before an op runs, so untouched bytes can be told apart.
POISON_BYTE = 0xA5


def poisoned(shape, dtype) -> np.ndarray:
    """A C-contiguous array of ``shape`` / ``dtype`` whose every byte is POISON_BYTE."""
    a = np.empty(shape, dtype=dtype)
    a.reshape(-1).view(np.uint8)[:] = POISON_BYTE
    return a


def raw(a: np.ndarray) -> np.ndarray:
    """The bytes of an array, flat uint8 (a copy for non-contiguous input)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def assert_same_bytes(actual: np.ndarray, expected: np.ndarray, what: str = "array") -> None:
    """Byte-exact comparison with a message giving the first differing byte."""
    a, e = raw(actual), raw(expected)
    assert a.size == e.size, f"{what}: {a.size} bytes vs {e.size} expected"
    diff = np.flatnonzero(a != e)
    assert diff.size == 0, (f"{what}: {diff.size} bytes differ, first at byte {diff[0]}: "
                            f"{a[diff[0]]:#04x} vs {e[diff[0]]:#04x}")


def f32(a) -> np.ndarray:
    """fp32 copy of a bf16 / fp16 / fp32 / int array."""
    return np.asarray(a).astype(np.float32)


def dual_threshold_ok(actual, golden, prec: float) -> bool:
    """torch_npu ``assertRtolEqual`` (non-bf16 branch): fails only if BOTH more than
    ``size*prec`` elements exceed relative error ``prec`` AND more than ``size*prec`` exceed
    absolute error ``prec``. Both-NaN counts as equal."""
    x, y = f32(actual).astype(np.float64), f32(golden).astype(np.float64)
    both_nan = np.isnan(x) & np.isnan(y)
    err = np.where(both_nan, 0.0, np.abs(x - y))
    err = np.nan_to_num(err, nan=np.inf)
    rel = err / (np.maximum(np.abs(x), np.abs(y)) + 1e-9)
    limit = x.size * prec
    return not (np.count_nonzero(rel > prec) > limit and np.count_nonzero(err > prec) > limit)


def bit_identical_share(actual, golden) -> float:
    """Share of elements whose bits are identical (both-NaN counts as identical)."""
    a, g = np.asarray(actual), np.asarray(golden)
    if a.size == 0:
        return 1.0
    same = raw(a).reshape(a.size, -1) == raw(g).reshape(g.size, -1)
    same = same.all(axis=1)
    fa, fg = f32(a).reshape(-1), f32(g).reshape(-1)
    same |= np.isnan(fa) & np.isnan(fg)
    return float(same.mean())


def max_ulp_bf16(actual, golden) -> int:
    """Largest distance in bf16 units in the last place between two bf16 arrays."""
    def ordered(v):
        b = np.asarray(v, dtype=BF16).view(np.uint16).astype(np.int32)
        return np.where(b & 0x8000, 0x8000 - b, b)  # monotone integer order
    if np.asarray(actual).size == 0:
        return 0
    return int(np.abs(ordered(actual) - ordered(golden)).max())


@functools.cache
def openblas_kernel() -> str | None:
    """The OpenBLAS kernel family NumPy's BLAS runs on this CPU (``Haswell`` on AVX2, ``SkylakeX``
    on AVX-512, ...; threadpoolctl's ``architecture``, which ``OPENBLAS_CORETYPE`` overrides), or
    None when NumPy's BLAS is not OpenBLAS or threadpoolctl is missing. Each kernel family sums
    an sgemm's products in its own order, so shares of bits identical to a float64 reference are
    measured per family."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    for lib in threadpool_info():
        if lib.get("internal_api") == "openblas" and "numpy" in lib.get("filepath", ""):
            return lib.get("architecture")
    return None


def blas_measured(tables: dict):
    """``tables[openblas_kernel()]``: figures measured with this host's OpenBLAS kernel family, or
    None where they were not measured (the caller then skips the figure's check, never guesses)."""
    return tables.get(openblas_kernel())
