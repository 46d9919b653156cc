"""``emu.matmul.matmul_int8``: one contract (the exact int32 product) on every engine.

The reference is NumPy's int64 matmul (integer arithmetic, no rounding anywhere), independent of
all three engines. Shapes are the quantized prolog's products (He = 7168, Hcq = 1536, N * (D + Dr)
columns of W_uq_qr for a few heads, Hckv + Dr = 576) at T = 1 and 16, plus the sgemm engine's
chunk boundary (K = 1024, 1025) and the longest accepted contraction, on extreme values (every
element -128 or 127, signs mixed), on uniform random int8, and on operands whose first 1100
products are all 127 * 127 (partial sums past 2**24 that one fp32 sum over all of K would round).
The ``"onednn"`` engine needs torch (skipped without it); the engine choice itself is checked with
the CPU flags and torch's importability monkeypatched.
"""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

from ascend_emu.emu import matmul
from ascend_emu.layouts import as_nz

HAS_TORCH = importlib.util.find_spec("torch") is not None
ENGINES = [pytest.param(e, marks=pytest.mark.skipif(e == "onednn" and not HAS_TORCH, reason="needs torch"))
           for e in matmul.INT8_ENGINES]
#: (T, K, N) with few columns, for the extreme values: He and Hcq contractions at T = 1 and 16, and
#: the sgemm engine's chunk edges.
EDGE_SHAPES = [(1, 7168, 64), (16, 7168, 48), (16, 1536, 64), (3, 1024, 40), (5, 1025, 24)]
#: (T, K, N) of the prolog's products, for random data: x @ W_dq (T = 1), x @ W_dkv_kr (T = 16),
#: q @ W_uq_qr for 4 heads of 192 (T = 16).
REAL_SHAPES = [(1, 7168, 1536), (16, 7168, 576), (16, 1536, 768)]


@pytest.fixture
def engine(request):
    before = matmul.set_int8_engine(request.param)
    yield request.param
    matmul.set_int8_engine(before)


def _ref(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    return a.astype(np.int64) @ w.astype(np.int64)


def _operand(rng, shape, kind: str, k_axis: int) -> np.ndarray:
    if kind == "min":
        return np.full(shape, -128, dtype=np.int8)
    if kind == "max":
        return np.full(shape, 127, dtype=np.int8)
    if kind == "signs":  # -128 / 127 at random: the largest sums of either sign and every mix
        return rng.choice(np.array([-128, 127], dtype=np.int8), size=shape)
    if kind == "big_head":  # 127 on the first 1100 of K, then random: partial sums past 2**24,
        # then odd ones, which one fp32 accumulation over all of K would round
        x = rng.integers(-128, 128, size=shape, dtype=np.int8)
        (x[:, :1100] if k_axis == 1 else x[:1100])[...] = 127
        return x
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


CASES = ([(shape, kinds) for shape in EDGE_SHAPES
          for kinds in (("min", "min"), ("max", "min"), ("max", "max"), ("signs", "signs"))]
         + [(shape, ("random", "random")) for shape in REAL_SHAPES + EDGE_SHAPES[-2:]]
         + [(shape, ("big_head", "big_head")) for shape in EDGE_SHAPES[:2]])


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.parametrize("shape,kinds", CASES)
def test_matmul_int8_exact_on_every_engine(engine, shape, kinds, rng):
    t, k, n = shape
    a = _operand(rng, (t, k), kinds[0], k_axis=1)
    w = _operand(rng, (k, n), kinds[1], k_axis=0)
    got = matmul.matmul_int8(a, w)
    assert got.dtype == np.int32 and got.shape == (t, n) and got.flags.c_contiguous
    np.testing.assert_array_equal(got.astype(np.int64), _ref(a, w))


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_matmul_int8_nk_weight_and_nz_weight(engine, rng):
    """A weight stored ``[N, K]`` (MlaPreprocess's wdqkv / wuq) and a FRACTAL_NZ one give the same
    exact product, also where the engine widens it in several column blocks (``[2112, He]``)."""
    a = rng.integers(-128, 128, size=(16, 2112), dtype=np.int8)
    w_nk = rng.integers(-128, 128, size=(96, 2112), dtype=np.int8)
    want = _ref(a, w_nk.T)
    np.testing.assert_array_equal(matmul.matmul_int8(a, w_nk, w_nk=True).astype(np.int64), want)
    nz = as_nz(w_nk)
    np.testing.assert_array_equal(matmul.matmul_int8(a, nz, w_nk=True).astype(np.int64), want)
    np.testing.assert_array_equal(matmul.matmul_int8(a, nz, w_nk=True).astype(np.int64), want)
    np.testing.assert_array_equal(matmul.matmul_int8(a, as_nz(w_nk.T)).astype(np.int64), want)
    a, w_nk = a[:2, :1536], rng.integers(-128, 128, size=(2112, 1536), dtype=np.int8)  # 3 blocks of 704 in fp32
    np.testing.assert_array_equal(matmul.matmul_int8(a, as_nz(w_nk), w_nk=True).astype(np.int64), _ref(a, w_nk.T))


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_matmul_int8_read_only_and_reversed_operands(engine, rng):
    """Read-only operands (the drop-in's weights) and negative strides: same product, no warning."""
    a = rng.integers(-128, 128, size=(4, 96), dtype=np.int8)
    w = rng.integers(-128, 128, size=(96, 40), dtype=np.int8)
    want = _ref(a[::-1], w[:, ::-1])
    a.flags.writeable = False
    w.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = matmul.matmul_int8(a[::-1], w[:, ::-1])
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.parametrize("m,k,n", [(2, 0, 3), (0, 5, 3), (2, 5, 0)])
def test_matmul_int8_empty_products(engine, m, k, n):
    """An empty side gives the empty or all-zero int32 result (an indexer with no key rows)."""
    a, w = np.ones((m, k), np.int8), np.ones((k, n), np.int8)
    for got in (matmul.matmul_int8(a, w), matmul.matmul_int8(a, np.ascontiguousarray(w.T), w_nk=True)):
        assert got.dtype == np.int32 and got.shape == (m, n) and not got.any()


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_matmul_int8_longest_contraction(engine):
    """K = INT8_MAX_K with every element -128: the largest int32 sum there is, exact; one more
    column of K is refused before anything is computed."""
    k = matmul.INT8_MAX_K
    a, w = np.full((2, k), -128, dtype=np.int8), np.full((k, 8), -128, dtype=np.int8)
    got = matmul.matmul_int8(a, w)
    assert (got.astype(np.int64) == k * 16384).all() and k * 16384 <= 2**31 - 1
    with pytest.raises(ValueError, match=rf"K must be at most {k} .*got {k + 1}"):
        matmul.matmul_int8(np.zeros((1, k + 1), np.int8), np.zeros((k + 1, 8), np.int8))


def test_matmul_int8_refuses_bad_operands():
    a8, w8 = np.zeros((2, 16), np.int8), np.zeros((16, 4), np.int8)
    with pytest.raises(ValueError, match=r"a must be a 2-D int8 array, got int32 of shape \(2, 16\)"):
        matmul.matmul_int8(a8.astype(np.int32), w8)
    with pytest.raises(ValueError, match=r"w must be a 2-D int8 array, got int8 of shape \(1, 16, 4\)"):
        matmul.matmul_int8(a8, w8[None])
    with pytest.raises(ValueError, match=r"a.shape\[1\] must equal the weight's K \(w.shape\[1\]\), got 16 and 4"):
        matmul.matmul_int8(a8, w8, w_nk=True)
    with pytest.raises(ValueError, match=r"name must be one of .* got 'int64'"):
        matmul.set_int8_engine("int64")


def test_default_int8_engine_follows_cpu_and_torch(monkeypatch):
    """oneDNN only where the CPU has int8 dot-product instructions and torch is loaded already;
    the exact sgemm chunks otherwise (without torch, or where oneDNN would run its slow generic
    kernel)."""
    monkeypatch.setattr(matmul, "_torch_loaded", lambda: True)
    monkeypatch.setattr(matmul, "_cpu_has_int8_dot", lambda: False)
    assert matmul.default_int8_engine() == "sgemm"
    monkeypatch.setattr(matmul, "_cpu_has_int8_dot", lambda: True)

    def no_torch():
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(matmul, "_import_torch", no_torch)
    assert matmul.default_int8_engine() == "sgemm"
    monkeypatch.setattr(matmul, "_import_torch", lambda: None)
    assert matmul.default_int8_engine() == "onednn"
    monkeypatch.setattr(matmul, "_torch_loaded", lambda: False)  # a NumPy-only process never loads torch
    assert matmul.default_int8_engine() == "sgemm"
