"""DeepSeek-V4 row scatters (ascend_emu.ops.scatter_nd_update) and the V4 writers' index policy
(ascend_emu.ops._check.writer_slots) against tests/reference/scatter_nd_update.py: bytes as the
reference writes them, padding rows skipped, strided caches written in place (their padding
untouched), duplicates warned (last row wins), and rejected calls that leave var byte-identical."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import checked_mode, ops
from ascend_emu.errors import DTypeError, DuplicateSlotError, DuplicateSlotWarning, IndexRangeError, ShapeError
from ascend_emu.ops._check import writer_slots
from tests.reference import scatter_nd_update as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
_C_ASCEND = (ops.npu_scatter_nd_update_v2, ops.npu_scatter_nd_update_sk)


def _bytes(a):
    return np.ascontiguousarray(a).view(np.uint8).copy()


def _random(rng, shape, dtype):
    """Arbitrary bit patterns (NaN payloads, -0, subnormals included) of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    return rng.integers(0, 256, (*shape, dtype.itemsize), dtype=np.uint8).view(dtype).reshape(shape)


def _same(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(_bytes(got), _bytes(want))


# ------------------------------------------------------------------------------ writer_slots
def test_writer_slots_policy():
    got = writer_slots(np.array([[0, 1], [-1, 127], [-1, -1], [2, 0]], np.int32), (4, 128), name="slot_mapping")
    assert got.tolist() == [1, -1, -1, 256] and got.dtype == np.int64
    assert writer_slots(np.array([3, -1, 0], np.int64), (4,), name="slot_mapping").tolist() == [3, -1, 0]
    assert writer_slots(np.array([[3], [-1]], np.int64), (4,), name="slot_mapping").tolist() == [3, -1]
    assert writer_slots(np.zeros((0, 2), np.int32), (4, 8), name="slot_mapping").shape == (0,)


@pytest.mark.parametrize("index, dims, where", [
    ([[0, 128]], (4, 128), r"slot_mapping\[0, 1\] = 128: expected an offset in its block in \[0, 128\)"),
    ([[-1, 128]], (4, 128), r"slot_mapping\[0, 1\] = 128: expected -1 or an offset"),
    ([[4, 0]], (4, 128), r"slot_mapping\[0, 0\] = 4: expected -1 \(skip the row\) or a block id in \[0, 4\)"),
    ([[1, -1]], (4, 128), r"slot_mapping\[0, 1\] = -1: expected an offset"),
    ([[-2, 0]], (4, 128), r"slot_mapping\[0, 0\] = -2"),
    ([0, 5, 7], (4,), r"slot_mapping\[1\] = 5: expected -1 \(skip the row\) or a slot in \[0, 4\); 2 row"),
])
def test_writer_slots_rejects_out_of_range(index, dims, where):
    with pytest.raises(IndexRangeError, match=where):
        writer_slots(np.array(index, np.int64), dims, name="slot_mapping")


def test_writer_slots_shapes_dtypes_and_duplicates():
    with pytest.raises(ShapeError, match="slot_mapping"):
        writer_slots(np.zeros((3, 1), np.int32), (4, 8), name="slot_mapping")
    with pytest.raises(ShapeError, match="slot_mapping"):
        writer_slots(np.zeros((3,), np.int32), (4, 8), name="slot_mapping")
    with pytest.raises(DTypeError, match="slot_mapping"):
        writer_slots(np.zeros((3,), np.float32), (4,), name="slot_mapping")
    with pytest.warns(DuplicateSlotWarning, match=r"slot_mapping: 1 cache slot.*slot 9 <- tokens \[0, 2\]"):
        writer_slots(np.array([[1, 1], [0, 0], [1, 1], [-1, 7], [-1, 7]]), (2, 8), name="slot_mapping")


# ----------------------------------------------------------------------- _C_ascend, [n, 2] rows
@pytest.mark.parametrize("op", _C_ASCEND)
@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32, np.int8])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_block_offset_rows_match_reference(op, dtype, index_dtype):
    rng = np.random.default_rng(7)
    nb, bs, d = 5, 16, 32
    cache = _random(rng, (nb, bs, 1, d), dtype)
    before = cache.copy()
    # tokens over several blocks (a physical order that is not the logical one), plus padding rows
    rows = [(3, 0), (3, 1), (0, 15), (4, 7), (-1, bs - 1), (1, 2), (-1, -1), (2, 9)]
    indices = np.array(rows, index_dtype)
    update = _random(rng, (len(rows), 1, d), dtype)
    op(cache, indices, update)
    _same(cache, ref.scatter_nd_update(before, indices, update))
    assert not np.array_equal(_bytes(cache), _bytes(before))


@pytest.mark.parametrize("op", _C_ASCEND)
def test_flat_rows_match_reference(op):
    rng = np.random.default_rng(8)
    var = _random(rng, (40, 128), np.float16)
    before = var.copy()
    indices = np.array([[39], [-1], [0], [17], [-1]], np.int64)
    update = _random(rng, (5, 128), np.float16)
    op(var, indices, update)
    _same(var, ref.scatter_nd_update(before, indices, update))


@pytest.mark.parametrize("every", [2, 7])
def test_interleaved_padding_and_duplicates_match_reference(every):
    """Padding rows all through the call (every 2nd row: more runs of live rows than the kernel
    copies slice by slice; every 7th: fewer), with duplicates among the live rows."""
    rng = np.random.default_rng(every)
    cache = _random(rng, (16, 16, 1, 8), np.float16)
    before = cache.copy()
    slots = rng.choice(256, 300)  # repeats
    idx = np.stack([slots // 16, slots % 16], axis=1).astype(np.int64)
    idx[::every] = (-1, 15)
    upd = _random(rng, (300, 1, 8), np.float16)
    with pytest.warns(DuplicateSlotWarning):
        ops.npu_scatter_nd_update_v2(cache, idx, upd)
    _same(cache, ref.scatter_nd_update(before, idx, upd))
    flat, kept = _random(rng, (256, 8), np.float16), idx[:, 0] * 16 + idx[:, 1]
    flat_before = flat.copy()
    flat_idx = np.where(idx[:, :1] < 0, -1, kept[:, None])
    with pytest.warns(DuplicateSlotWarning):
        ops.npu_scatter_nd_update_sk(flat, flat_idx, upd.reshape(300, 8))
    _same(flat, ref.scatter_nd_update(flat_before, flat_idx, upd.reshape(300, 8)))


def test_v2_dtypes_and_update_shapes_the_callers_pass():
    rng = np.random.default_rng(9)
    for dtype in (np.bool_, np.int16, np.int32, np.int64):
        var = _random(rng, (3, 4, 2), dtype)
        before, idx, upd = var.copy(), np.array([[2, 3], [0, 0]]), _random(rng, (2, 2), dtype)
        ops.npu_scatter_nd_update_v2(var, idx, upd)
        _same(var, ref.scatter_nd_update(before, idx, upd))
    # the indexer scale cache [nb, bs, 1, 1] written with [n, 1, 1, 1] scales (vllm-ascend device_op.py)
    scale_cache = np.zeros((2, 8, 1, 1), np.float16)
    scales = np.array([1.5, 2.5, 3.5], np.float16).reshape(3, 1, 1, 1)
    idx = np.array([[1, 7], [-1, 7], [0, 0]], np.int32)
    ops.npu_scatter_nd_update_v2(scale_cache, idx, scales)
    _same(scale_cache, ref.scatter_nd_update(np.zeros((2, 8, 1, 1), np.float16), idx, scales))
    assert scale_cache[1, 7, 0, 0] == 1.5 and scale_cache[0, 0, 0, 0] == 3.5


@pytest.mark.parametrize("op", _C_ASCEND)
def test_strided_var_is_written_in_place_padding_untouched(op):
    rng = np.random.default_rng(10)
    # rows of width b inside a buffer of width 2b (the golden's non-contiguous var)
    backing = _random(rng, (16, 256), np.float16)
    want = backing.copy()
    var = backing[:, :128]
    idx = np.array([[5], [0], [-1], [15]], np.int32)
    upd = _random(rng, (4, 128), np.float16)
    op(var, idx, upd)
    want[:, :128] = ref.scatter_nd_update(want[:, :128], idx, upd)
    _same(backing, want)
    # a page-padded cache plane: 4 blocks of 8 rows of 64, each block followed by 3 pad rows
    plane = _random(rng, (4, 11, 1, 64), BF16)
    want = plane.copy()
    cache = plane[:, :8]
    idx = np.array([[3, 7], [0, 0], [-1, 7], [2, 4]], np.int64)
    upd = _random(rng, (4, 1, 64), BF16)
    op(cache, idx, upd)
    want[:, :8] = ref.scatter_nd_update(want[:, :8], idx, upd)
    _same(plane, want)


# ------------------------------------------------------------------------ custom.scatter_nd_update_asc
@pytest.mark.parametrize("s", [1, 128, 512])
@pytest.mark.parametrize("dtype", [BF16, np.float16, np.int8])
def test_asc_matches_reference(s, dtype):
    rng = np.random.default_rng(11)
    var = _random(rng, (9, s), dtype)
    before = var.copy()
    idx = np.array([[8], [-1], [2], [0]], np.int32)
    upd = _random(rng, (4, s), dtype)
    ops.scatter_nd_update_asc(var, idx, upd)
    _same(var, ref.scatter_nd_update(before, idx, upd))


# --------------------------------------------------------------------------------- duplicates
@pytest.mark.parametrize("op", [*_C_ASCEND, ops.scatter_nd_update_asc])
def test_duplicates_warn_and_last_row_wins(op):
    var = np.zeros((6, 128), np.float16)
    idx = np.array([[4], [1], [4], [4]], np.int64)
    upd = np.arange(4, dtype=np.float16)[:, None].repeat(128, 1)
    with pytest.warns(DuplicateSlotWarning, match=r"indices: 1 cache slot.*slot 4 <- tokens \[0, 2, 3\]"):
        op(var, idx, upd)
    _same(var, ref.scatter_nd_update(np.zeros((6, 128), np.float16), idx, upd))
    assert var[4, 0] == 3 and var[1, 0] == 1


# ------------------------------------------------------------------------- rejected calls
def _cache_call():
    rng = np.random.default_rng(12)
    return _random(rng, (4, 8, 1, 16), BF16), np.array([[1, 2], [3, 7]], np.int32), _random(rng, (2, 1, 16), BF16)


@pytest.mark.parametrize("change, error, match", [
    (lambda c, i, u: (c, np.array([[1, 2], [4, 0]], np.int32), u), IndexRangeError, r"indices\[1, 0\] = 4"),
    (lambda c, i, u: (c, np.array([[1, 8], [3, 7]], np.int32), u), IndexRangeError, r"indices\[0, 1\] = 8"),
    (lambda c, i, u: (c, np.array([[1, 2], [-1, 8]], np.int32), u), IndexRangeError, r"indices\[1, 1\] = 8"),
    (lambda c, i, u: (c, np.array([[1, -1], [3, 7]], np.int32), u), IndexRangeError, r"indices\[0, 1\] = -1"),
    (lambda c, i, u: (c, np.array([[-2, 0], [3, 7]], np.int32), u), IndexRangeError, r"indices\[0, 0\] = -2"),
    (lambda c, i, u: (c, np.array([9, 10], np.int32), u), ShapeError, r"indices: .*slots\.view\(-1, 1\)"),
    (lambda c, i, u: (c, np.zeros((2, 3), np.int32), u), ShapeError, r"indices: expected a 2-D"),
    (lambda c, i, u: (c, i.astype(np.float32), u), DTypeError, r"indices: expected dtype int32 or int64"),
    (lambda c, i, u: (c, i, u.astype(np.float16)), DTypeError, r"update: expected dtype bfloat16"),
    (lambda c, i, u: (c, i, u[:, :, :8]), ShapeError, r"update: expected \[n=2, \.\.\.\] holding 16"),
    (lambda c, i, u: (c, i, u[:1]), ShapeError, r"update: expected \[n=2"),
    (lambda c, i, u: (np.zeros(c.shape), i, np.zeros(u.shape)), DTypeError, r"var: expected dtype"),
    (lambda c, i, u: (c[:, :, :, ::2], i, u[:, :, :8]), ShapeError, r"var: expected rows \(dims 2:\) C-contiguous"),
])
def test_rejected_calls_write_nothing(change, error, match):
    cache, idx, upd = _cache_call()
    var, idx2, upd2 = change(cache, idx, upd)
    before = _bytes(cache)
    for op in _C_ASCEND:
        with pytest.raises(error, match=match):
            op(var, idx2, upd2)
        np.testing.assert_array_equal(_bytes(cache), before)


@pytest.mark.parametrize("op", _C_ASCEND)
def test_a_signature_seen_before_still_checks_memory_and_indices(op):
    """The static checks run once per call signature; the overlap test and the index values run
    on every call: an update inside var, or a bad index, after a good call of the same shapes."""
    cache, idx, upd = _cache_call()
    inside = cache[0, :2]  # [2, 1, 16], update's shape: same signature as a separate array
    op(cache, idx, inside.copy())
    before = _bytes(cache)
    with pytest.raises(ShapeError, match="update"):
        op(cache, idx, inside)
    with pytest.raises(IndexRangeError, match=r"indices\[1, 0\] = 4"):
        op(cache, np.array([[1, 2], [4, 0]], np.int32), upd)
    np.testing.assert_array_equal(_bytes(cache), before)


def test_rejects_overlap_and_read_only():
    cache, idx, upd = _cache_call()
    before = _bytes(cache)
    with pytest.raises(ShapeError, match="update"):
        ops.npu_scatter_nd_update_v2(cache, idx, cache[0, :2])  # update inside var
    ro = cache.copy()
    ro.flags.writeable = False
    with pytest.raises(ShapeError, match="var: expected a writable"):
        ops.npu_scatter_nd_update_v2(ro, idx, upd)
    overlapping = np.lib.stride_tricks.as_strided(cache, (4, 8, 16), (2 * 16, 2 * 8, 2))  # rows overlap
    with pytest.raises(ShapeError, match="var: expected rows that do not overlap"):
        ops.npu_scatter_nd_update_v2(overlapping, idx, upd.reshape(2, 16))
    np.testing.assert_array_equal(_bytes(cache), before)


@pytest.mark.parametrize("var, idx, upd, error, match", [
    (np.zeros((4, 64), np.int8), [[1]], np.zeros((1, 64), np.int8), ShapeError, r"var: expected \[b, s\] with s in"),
    (np.zeros((2, 128), np.int8), [[1], [0], [1]], np.zeros((3, 128), np.int8), ShapeError, r"1 <= u <= b = 2"),
    (np.zeros((2, 128), np.int8), [[1, 0]], np.zeros((1, 128), np.int8), ShapeError, r"indices: expected a 2-D \[u, 1\]"),
    (np.zeros((2, 128), np.int8), [[2]], np.zeros((1, 128), np.int8), IndexRangeError, r"indices\[0, 0\] = 2"),
    (np.zeros((2, 128), np.int8), [[1]], np.zeros((1, 1, 128), np.int8), ShapeError, r"update: expected \[u=1, s=128\]"),
    (np.zeros((2, 128), np.float32), [[1]], np.zeros((1, 128), np.float32), DTypeError, r"var: expected dtype"),
    (np.zeros((2, 1, 128), np.int8), [[1]], np.zeros((1, 128), np.int8), ShapeError, r"var: expected a 2-D"),
    (np.zeros((2, 256), np.int8)[:, :128], [[1]], np.zeros((1, 128), np.int8), ShapeError, r"var: expected a C-cont"),
])
def test_asc_rejects(var, idx, upd, error, match):
    before = _bytes(var)
    with pytest.raises(error, match=match):
        ops.scatter_nd_update_asc(var, np.array(idx, np.int32), upd)
    np.testing.assert_array_equal(_bytes(var), before)


def test_empty_index_is_a_no_op_in_c_ascend_only():
    var = np.ones((3, 4), np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.npu_scatter_nd_update_v2(var, np.zeros((0, 1), np.int32), np.zeros((0, 4), np.float16))
    assert (var == 1).all()


def test_checked_mode_marks_written_rows_and_rejects_duplicates():
    cache = np.zeros((3, 4, 1, 8), np.float16)
    with checked_mode.checked(poison=True):
        ops.npu_scatter_nd_update_v2(cache, np.array([[2, 1], [-1, 3], [0, 0]]), np.ones((3, 1, 8), np.float16))
        written = checked_mode.written_slots(cache)
        assert np.flatnonzero(written).tolist() == [0, 9]
        assert np.isnan(cache[1, 0, 0, 0]) and cache[2, 1, 0, 0] == 1  # poisoned, then written
        with pytest.raises(DuplicateSlotError, match="indices"):
            ops.scatter_nd_update_asc(np.zeros((4, 128), np.int8), np.array([[1], [1]]), np.ones((2, 128), np.int8))


def test_broadcast_views_are_bounded_before_allocating():
    var = np.zeros((4, 1), np.int8)
    huge = np.broadcast_to(np.zeros((1, 1), np.int64), (1 << 31, 1))
    with pytest.raises(ShapeError, match="indices: expected at most 16 GiB"):
        ops.npu_scatter_nd_update_v2(var, huge, np.broadcast_to(np.zeros((1, 1), np.int8), (1 << 31, 1)))
    with pytest.raises(ShapeError, match="update: expected at most 16 GiB"):
        ops.npu_scatter_nd_update_v2(np.zeros((4, 1 << 20), np.int8), np.zeros((1 << 14, 1), np.int64),
                                     np.broadcast_to(np.zeros((1, 1 << 20), np.int8), (1 << 14, 1 << 20)))
