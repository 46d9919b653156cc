"""Matrix FRACTAL_NZ (docs/sources.md#fractal_nz): nz_shape, nd_to_nz / nz_to_nd, nz_offset / nz_coords,
NZArray, against the transdata formula and plain loops in tests/reference/layouts.py."""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_emu.errors import DTypeError, ShapeError
from ascend_emu.layouts import (FRACTAL_NZ, ND, NZArray, as_nz, c0_for, get_npu_format, nd_to_nz,
                                nz_coords, nz_offset, nz_shape, nz_to_nd)
from ascend_emu.layouts import nz as nz_module
from tests.helpers import POISON_BYTE, assert_same_bytes, poisoned
from tests.reference import layouts as ref

DTYPES = [np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.int32),
          np.dtype(np.int8)]
SHAPES = [(), (1,), (5,), (16,), (40,), (1, 1), (16, 16), (17, 33), (15, 32), (32, 64), (3, 40, 70),
          (2, 2, 31, 64), (0, 5), (4, 0), (2, 0, 7)]
#: "numpy" forces the NumPy path, "parallel" makes every eligible array take the Numba path.
PATHS = ["numpy", "parallel"]
SETTINGS = settings(max_examples=60, deadline=None)


def ids(v):
    return getattr(v, "name", None) or str(v)


def make(shape, dtype, rng) -> np.ndarray:
    """Distinct-ish non-zero values, so a misplaced or zero element is visible."""
    n = int(np.prod(shape, dtype=np.int64))
    vals = (np.arange(n) % 97 + 1) * np.where(rng.random(n) < 0.5, -1, 1)
    return vals.reshape(shape).astype(dtype)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param == "parallel":
        monkeypatch.setattr(nz_module, "PARALLEL_MIN_BYTES", 0)
    else:
        monkeypatch.setattr(nz_module, "PARALLEL_MIN_BYTES", 1 << 62)
    return request.param


# ---------------------------------------------------------------------- C0 and storage shape
@pytest.mark.parametrize("dtype,c0", [(DTYPES[0], 16), (DTYPES[1], 16), (DTYPES[2], 16), (DTYPES[3], 16),
                                      (DTYPES[4], 32)], ids=ids)
def test_c0_per_dtype(dtype, c0):
    assert c0_for(dtype) == c0 == ref.matrix_c0(dtype.itemsize)


def test_c0_of_the_950_byte_types():
    """uint8 (hifloat8 codes) and float8_e4m3fn: C0 = 32 bytes / 1 byte (aclnnNpuFormatCast); the
    op contract, not the layout, limits them to an emulated Ascend 950."""
    for dtype in (np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e4m3fn)):
        assert c0_for(dtype) == 32 == ref.matrix_c0(dtype.itemsize)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int16, np.bool_, np.complex64], ids=ids)
def test_unsupported_dtype(dtype):
    with pytest.raises(DTypeError, match="FRACTAL_NZ"):
        c0_for(dtype)
    with pytest.raises(DTypeError):
        nd_to_nz(np.zeros((4, 4), dtype=dtype))
    with pytest.raises(DTypeError):
        as_nz(np.zeros((4, 4), dtype=dtype))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_nz_shape(shape, dtype):
    assert nz_shape(shape, dtype) == ref.nz_storage_shape(shape, dtype.itemsize)


def test_nz_shape_known_cases():
    # docs/sources.md#fractal_nz: MlaPreprocess wdqkv int8 [2112, 7168] -> [7168/32=224, 2112, 32] storage
    assert nz_shape((2112, 7168), np.int8) == (224, 132, 16, 32)
    assert nz_shape((7, 20), np.float32) == (2, 1, 16, 16)  # fp32 sized as 2 bytes: C0 16
    assert nz_shape((3,), np.int8) == (1, 1, 16, 32)  # 1-D [L] -> [L, 1]
    assert nz_shape((), ml_dtypes.bfloat16) == (1, 1, 16, 16)  # 0-D -> [1, 1]
    assert nz_shape((5, 2, 33, 17), np.float16) == (5, 2, 2, 3, 16, 16)  # batch dims kept


# ---------------------------------------------------------------------- nd_to_nz / nz_to_nd
@pytest.mark.parametrize("shape", SHAPES + [(130, 256), (2, 64, 512)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_nd_to_nz_matches_references(shape, dtype, path, rng):
    x = make(shape, dtype, rng)
    got = nd_to_nz(x)
    assert got.dtype == dtype and got.flags.c_contiguous
    assert_same_bytes(got, ref.nd_to_nz_transdata(x), "vs transdata")
    if x.size <= 4096:
        assert_same_bytes(got, ref.nd_to_nz_loops(x), "vs loops")
    assert_same_bytes(nz_to_nd(got, shape), x, "round trip")
    assert_same_bytes(nz_to_nd(got, shape), ref.nz_to_nd_loops(got, shape), "nz_to_nd vs loops")


@pytest.mark.parametrize("shape", [(17, 33), (40, 64), (2, 48, 96)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_out_argument_writes_every_byte(shape, dtype, path, rng):
    x = make(shape, dtype, rng)
    out = poisoned(nz_shape(shape, dtype), dtype)
    res = nd_to_nz(x, out=out)
    assert res is out
    assert_same_bytes(out, ref.nd_to_nz_transdata(x), "out")


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_padding_is_zero(dtype, path, rng):
    m, n = 21, 2 * c0_for(dtype) + 3
    x = make((m, n), dtype, rng)
    s = nd_to_nz(x)
    flat = s.reshape(*s.shape[:-3], -1, s.shape[-1])  # [N/C0, M_pad, C0]
    assert not flat[:, m:, :].view(np.uint8).any()  # rows m..M_pad of every column block
    assert not flat[-1, :, n % c0_for(dtype):].view(np.uint8).any()  # columns past N
    assert flat[:, :m].view(np.uint8).any()


@pytest.mark.parametrize("view", ["transposed", "strided_rows", "strided_cols", "offset_by_one"])
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_non_contiguous_and_unaligned_inputs(view, dtype, path, rng):
    base = make((96, 160), dtype, rng)
    x = {"transposed": base.T, "strided_rows": base[::2], "strided_cols": base[:, ::2],
         "offset_by_one": base.reshape(-1)[1:1 + 95 * 160].reshape(95, 160)}[view]
    assert_same_bytes(nd_to_nz(x), ref.nd_to_nz_transdata(np.ascontiguousarray(x)), view)


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_path_thread_count_invariant(threads, rng):
    x = make((3, 200, 384), DTYPES[0], rng)  # > PARALLEL_MIN_BYTES: the Numba path
    assert x.nbytes >= nz_module.PARALLEL_MIN_BYTES
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(threads)
        got = nd_to_nz(x)
    finally:
        numba.set_num_threads(before)
    assert_same_bytes(got, ref.nd_to_nz_transdata(x), f"{threads} threads")


@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_parallel_path_taken_when_eligible(dtype, rng):
    c0 = c0_for(dtype)
    x = make((2, 1100, 4 * c0), dtype, rng)
    out = poisoned(nz_shape(x.shape, dtype), dtype)
    assert nz_module._nd_to_nz_parallel(x, out, c0)  # N % C0 == 0, large, aligned
    assert_same_bytes(out, ref.nd_to_nz_transdata(x), "parallel path")
    ragged = make((1100, 4 * c0 + 1), dtype, rng)
    out = poisoned(nz_shape(ragged.shape, dtype), dtype)
    assert not nz_module._nd_to_nz_parallel(ragged, out, c0)  # N % C0 != 0: NumPy path
    assert (out.view(np.uint8) == POISON_BYTE).all()  # and nothing written


@settings(max_examples=80, deadline=None)
@given(dtype=st.sampled_from(DTYPES),
       shape=st.lists(st.integers(0, 40), min_size=0, max_size=4).map(tuple),
       transpose=st.booleans(), parallel=st.booleans(), seed=st.integers(0, 2**16))
def test_nd_to_nz_property(dtype, shape, transpose, parallel, seed):
    if int(np.prod(shape, dtype=np.int64)) > 20000:
        shape = shape[-2:]
    x = make(shape, dtype, np.random.default_rng(seed))
    if transpose and x.ndim >= 2:
        x = np.swapaxes(x, -1, -2)  # non-contiguous, shape [..., N, M]
    old = nz_module.PARALLEL_MIN_BYTES
    nz_module.PARALLEL_MIN_BYTES = 0 if parallel else 1 << 62
    try:
        got = nd_to_nz(x)
    finally:
        nz_module.PARALLEL_MIN_BYTES = old
    assert got.shape == ref.nz_storage_shape(x.shape, dtype.itemsize)
    assert_same_bytes(got, ref.nd_to_nz_transdata(np.ascontiguousarray(x)), "nd_to_nz")
    back = nz_to_nd(got, x.shape)
    assert back.shape == x.shape
    assert_same_bytes(back, x, "round trip")


def test_nz_to_nd_rejects_wrong_storage_shape():
    s = nd_to_nz(np.ones((20, 20), np.float16))
    with pytest.raises(ShapeError, match="storage"):
        nz_to_nd(s, (40, 20))
    with pytest.raises(ShapeError, match="storage"):
        nz_to_nd(s.reshape(-1), (20, 20))


@pytest.mark.parametrize("bad", ["dtype", "shape", "strided", "readonly"])
def test_out_argument_errors(bad):
    x = np.ones((20, 40), np.float16)
    want = nz_shape(x.shape, x.dtype)
    out = {"dtype": np.zeros(want, np.int16), "shape": np.zeros((3, 1, 32, 16), np.float16),
           "strided": np.zeros(want[:-1] + (32,), np.float16)[..., ::2],
           "readonly": np.zeros(want, np.float16)}[bad]
    if bad == "readonly":
        out.flags.writeable = False
    before = out.copy()
    with pytest.raises(DTypeError if bad == "dtype" else ShapeError, match="out"):
        nd_to_nz(x, out=out)
    assert_same_bytes(out, before, "out untouched")


# ---------------------------------------------------------------------- offsets <-> coordinates
@pytest.mark.parametrize("shape", [(), (5,), (17, 33), (2, 19, 20), (16, 64)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_offset_coords_bijection(shape, dtype, rng):
    x = make(shape, dtype, rng)
    storage = nd_to_nz(x).reshape(-1)
    seen = {}
    for idx in np.ndindex(*shape):
        off = nz_offset(shape, dtype, idx)
        assert off == ref.nz_flat_offset(shape, dtype.itemsize, idx)
        assert storage[off].tobytes() == x[idx].tobytes()
        assert nz_coords(shape, dtype, off) == tuple(idx)
        assert off not in seen
        seen[off] = idx
    padding = [o for o in range(storage.size) if o not in seen]
    assert len(seen) + len(padding) == storage.size == int(np.prod(nz_shape(shape, dtype)))
    for o in padding:  # every storage element is either one logical element or padding
        assert nz_coords(shape, dtype, o) is None
        assert not storage[o:o + 1].view(np.uint8).any()


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES),
       shape=st.lists(st.integers(1, 50), min_size=0, max_size=4).map(tuple), data=st.data())
def test_offset_coords_property(dtype, shape, data):
    size = int(np.prod(nz_shape(shape, dtype)))
    off = data.draw(st.integers(0, size - 1))
    coords = nz_coords(shape, dtype, off)
    if coords is not None:
        assert len(coords) == len(shape)
        assert nz_offset(shape, dtype, coords) == off
    idx = tuple(data.draw(st.integers(0, s - 1)) for s in shape)
    assert nz_coords(shape, dtype, nz_offset(shape, dtype, idx)) == idx


def test_offset_coords_errors():
    with pytest.raises(ShapeError, match="index"):
        nz_offset((4, 4), np.float16, (4, 0))
    with pytest.raises(ShapeError, match="index"):
        nz_offset((4, 4), np.float16, (1,))
    with pytest.raises(ShapeError, match="offset"):
        nz_coords((4, 4), np.float16, 256)
    with pytest.raises(ShapeError, match="offset"):
        nz_coords((4, 4), np.float16, -1)


# ---------------------------------------------------------------------- NZArray
@pytest.mark.parametrize("dtype", DTYPES, ids=ids)
def test_nzarray(dtype, rng):
    x = make((20, 48), dtype, rng)
    w = as_nz(x)
    assert isinstance(w, NZArray) and get_npu_format(w) == FRACTAL_NZ
    assert get_npu_format(x) == ND
    assert_same_bytes(np.asarray(w), x, "logical values")
    assert_same_bytes(w.storage(), ref.nd_to_nz_transdata(x), "storage")
    x[0, 0] = x[0, 1] + x[0, 1]  # as_nz copied
    assert np.asarray(w)[0, 0] != x[0, 0] or x[0, 1] == 0
    assert get_npu_format(w[1:]) == FRACTAL_NZ  # views stay tagged
