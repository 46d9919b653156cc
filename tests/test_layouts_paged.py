"""Paged / block KV-cache layouts (docs/sources.md#paged_nz, docs/sources.md#cache_index, docs/sources.md#npu_kv_rmsnorm_rope_cache): CacheLayout forward and reverse
maps for every cache mode, and the index -> slot maps, against tests/reference/layouts.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from ascend_emu.layouts import (CACHE_MODE_ALIASES, CACHE_MODES, SKIP_INDEX, CacheLayout, CacheLocation,
                                canonical_cache_mode, check_index_range, duplicate_slots, is_nz_mode,
                                slots_from_block_table, slots_from_cache_index, slots_from_pages,
                                slots_from_positions)
from tests.reference import layouts as ref

#: (mode as the seeds spell it, declared shape, itemsize)
LAYOUT_CASES = [
    ("PA_BSND", (3, 4, 1, 8), 2),
    ("PA_BSND", (2, 16, 2, 6), 1),
    ("PA", (2, 4, 1, 5), 4),
    ("PA_BNSD", (2, 3, 1, 4), 2),  # head-major [nb=2, N=3, bs=1, D=4]
    ("PA_BNSD", (2, 3, 4, 5), 2),
    ("PA_BNSD", (3, 1, 4, 6), 1),
    ("PA_NZ", (2, 4, 1, 32), 2),
    ("PA_NZ", (3, 16, 1, 64), 1),
    ("PA_NZ", (2, 2, 1, 16), 4),
    ("PA_BLK_NZ", (2, 8, 1, 48), 2),
    ("PA_BLK_BSND", (2, 4, 1, 10), 2),
    ("PA_BLK_BNSD", (3, 2, 1, 3), 1),
    ("PA_BLK_BNSD", (2, 2, 3, 5), 4),
    ("BSND", (2, 5, 1, 7), 2),
    ("BSND", (2, 3, 2, 4), 1),
    ("TND", (6, 1, 9), 2),
    ("TND", (4, 2, 3), 4),
    ("Norm", (2, 1, 7, 6), 2),
    ("PA_BSND", (2, 4, 1, 656), 1),  # combined per-tile rows (int8, docs/sources.md#per_tile_rows)
]
CASE_IDS = [f"{m}-{'x'.join(map(str, s))}-i{i}" for m, s, i in LAYOUT_CASES]


def logical_elements(mode, shape):
    """Every (block, row, head, d) of a declared cache."""
    nb, bs, nkv, dim = ref.declared_geometry(mode, shape)
    for blk in range(nb):
        for r in range(bs):
            for h in range(nkv):
                for d in range(dim):
                    yield blk, r, h, d


# ---------------------------------------------------------------------- modes
def test_canonical_cache_mode():
    for mode in CACHE_MODES:
        assert canonical_cache_mode(mode) == mode
    assert CACHE_MODE_ALIASES == {"PA": "PA_BSND"}  # PA_BNSD is head-major, no alias of PA_BSND
    for alias, mode in CACHE_MODE_ALIASES.items():
        assert canonical_cache_mode(alias) == mode
    assert canonical_cache_mode("PA", allowed=("PA", "PA_NZ")) == "PA_BSND"
    with pytest.raises(ModeError, match="cache_mode: expected one of"):
        canonical_cache_mode("PA_NZZ")
    with pytest.raises(ModeError, match="my_mode"):
        canonical_cache_mode("TND", allowed=("PA_BSND",), name="my_mode")
    with pytest.raises(ModeError):
        canonical_cache_mode(3)
    assert is_nz_mode("PA_NZ") and is_nz_mode("PA_BLK_NZ") and not is_nz_mode("PA_BNSD")


# ---------------------------------------------------------------------- geometry
@pytest.mark.parametrize("mode,shape,itemsize", LAYOUT_CASES, ids=CASE_IDS)
def test_from_declared_geometry(mode, shape, itemsize):
    lay = CacheLayout.from_declared(mode, shape, itemsize)
    nb, bs, nkv, dim = ref.declared_geometry(mode, shape)
    assert (lay.mode, lay.num_blocks, lay.block_size, lay.heads, lay.dim, lay.itemsize) == (
        canonical_cache_mode(mode), nb, bs, nkv, dim, itemsize)
    assert lay.nbytes == int(np.prod(shape)) * itemsize
    assert lay.row_bytes == nkv * dim * itemsize
    assert int(np.prod(lay.storage_shape())) * itemsize == lay.nbytes
    if lay.nz:
        c0 = ref.cache_c0(itemsize)
        assert lay.c0 == c0 and lay.chunk_bytes == 32
        assert lay.storage_shape() == (nb, dim // c0, bs, c0)
    elif lay.head_major:
        assert lay.chunk_bytes == dim * itemsize
        assert lay.storage_shape() == (nb, nkv, bs, dim) == shape
    else:
        assert lay.chunk_bytes == lay.row_bytes
        assert lay.storage_shape() == (nb, bs, nkv, dim)


@pytest.mark.parametrize("mode,shape,itemsize", LAYOUT_CASES, ids=CASE_IDS)
def test_forward_map_matches_reference_formula(mode, shape, itemsize):
    lay = CacheLayout.from_declared(mode, shape, itemsize)
    storage = np.arange(lay.nbytes // itemsize).reshape(lay.storage_shape())
    for blk, r, h, d in logical_elements(mode, shape):
        slot = blk * lay.block_size + r
        want = ref.element_offset(mode, shape, itemsize, blk, r, h, d)
        assert lay.element_offset(slot, d, h) == want
        assert lay.byte_offset(slot, d, h) == want * itemsize
        # storage_shape shows the memory order
        at = (blk, d // lay.c0, r, d % lay.c0) if lay.nz else (blk, h, r, d) if lay.head_major else (blk, r, h, d)
        assert storage[at] == want


@pytest.mark.parametrize("mode,shape,itemsize", LAYOUT_CASES, ids=CASE_IDS)
def test_every_byte_located_exactly_once(mode, shape, itemsize):
    lay = CacheLayout.from_declared(mode, shape, itemsize)
    hits = np.zeros(lay.nbytes, dtype=np.int64)
    for blk, r, h, d in logical_elements(mode, shape):
        off = ref.element_offset(mode, shape, itemsize, blk, r, h, d) * itemsize
        for k in range(itemsize):
            hits[off + k] += 1
            loc = lay.locate(off + k)
            assert loc == CacheLocation(blk, r, h, d, k)
            assert lay.slot_of(loc) == blk * lay.block_size + r
    assert (hits == 1).all()  # no byte unused, none shared


@pytest.mark.parametrize("mode,shape,itemsize", LAYOUT_CASES, ids=CASE_IDS)
def test_chunk_offsets_consistent_with_byte_offset(mode, shape, itemsize, rng):
    lay = CacheLayout.from_declared(mode, shape, itemsize)
    slots = rng.permutation(lay.num_rows)[:5]
    offs = lay.chunk_offsets(slots)  # [T, nchunk]
    cb = lay.chunk_bytes
    assert offs.dtype == np.int64 and offs.shape == (slots.size, lay.row_bytes // cb)
    for t, slot in enumerate(slots):
        for rb in range(lay.row_bytes):  # every byte of the row, as a kernel writes it
            j, k = divmod(rb, cb)
            e, byte = divmod(rb, itemsize)
            h, d = divmod(e, lay.dim)
            assert offs[t, j] + k == lay.byte_offset(int(slot), d, h) + byte


def test_paged_nz_block_layout_example():
    # docs/sources.md#paged_nz: an int8 kv cache [BlockNum, bs, 1, 512] in PA_NZ is memory [BlockNum, 16, bs, 32]
    lay = CacheLayout.from_declared("PA_NZ", (4, 128, 1, 512), 1)
    assert lay.storage_shape() == (4, 16, 128, 32)
    # token idx = 300: blk 2, r 44; element d = 70 -> [2, 2, 44, 6]
    assert lay.byte_offset(300, 70) == np.ravel_multi_index((2, 2, 44, 6), (4, 16, 128, 32))
    bf = CacheLayout.from_declared("PA_NZ", (4, 128, 1, 64), 2)  # bf16 kr cache: [4, 4, 128, 16]
    assert bf.storage_shape() == (4, 4, 128, 16)
    assert bf.element_offset(129, 17) == 1 * 128 * 64 + 1 * 128 * 16 + 1 * 16 + 1


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_round_trip_property(data):
    mode = data.draw(st.sampled_from(CACHE_MODES + tuple(CACHE_MODE_ALIASES)))
    itemsize = data.draw(st.sampled_from([1, 2, 4]))
    nz = canonical_cache_mode(mode) in ("PA_NZ", "PA_BLK_NZ")
    nkv = 1 if nz or mode == "Norm" else data.draw(st.integers(1, 3))
    c0 = 32 // itemsize
    dim = c0 * data.draw(st.integers(1, 4)) if nz else data.draw(st.integers(1, 40))
    nb, bs = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 20))
    shape = {"TND": (bs, nkv, dim), "Norm": (nb, 1, bs, dim), "PA_BNSD": (nb, nkv, bs, dim),
             "PA_BLK_BNSD": (nb, nkv, bs, dim)}.get(mode, (nb, bs, nkv, dim))
    lay = CacheLayout.from_declared(mode, shape, itemsize)
    nb_ref, bs_ref, _, _ = ref.declared_geometry(mode, shape)
    blk, r = data.draw(st.integers(0, nb_ref - 1)), data.draw(st.integers(0, bs_ref - 1))
    h, d = data.draw(st.integers(0, nkv - 1)), data.draw(st.integers(0, dim - 1))
    off = lay.byte_offset(blk * bs_ref + r, d, h)
    assert off == ref.element_offset(mode, shape, itemsize, blk, r, h, d) * itemsize
    assert lay.locate(off) == (blk, r, h, d, 0)
    any_byte = data.draw(st.integers(0, lay.nbytes - 1))
    loc = lay.locate(any_byte)
    assert lay.byte_offset(lay.slot_of(loc), loc.dim, loc.head) + loc.byte == any_byte


@pytest.mark.parametrize("mode,shape,itemsize,match", [
    ("PA_NZ", (2, 4, 1, 40), 2, "D: expected a multiple of C0=16"),
    ("PA_BLK_NZ", (2, 4, 1, 48), 1, "C0=32"),
    ("PA_NZ", (2, 4, 2, 32), 2, "Nkv: expected 1"),
    ("PA_BNSD", (2, 4, 8), 2, r"4-D \[BlockNum, Nkv, BlockSize, D\]"),
    ("Norm", (2, 2, 4, 8), 2, "N: expected 1"),
    ("PA_BSND", (2, 4, 8), 2, "4-D"),
    ("TND", (2, 4, 1, 8), 2, "3-D"),
    ("Norm", (4, 8), 2, r"\[B, 1, cache_length, D\]"),
    ("BSND", (2, 4, 1, 8), 3, "itemsize"),
    ("BSND", (2, -4, 1, 8), 2, "block_size"),
    ("PA_BSND", (2, 4, 1, 0), 2, "D: expected an integer >= 1"),
])
def test_geometry_errors(mode, shape, itemsize, match):
    with pytest.raises(ShapeError, match=match):
        CacheLayout.from_declared(mode, shape, itemsize)


def test_coordinate_errors():
    lay = CacheLayout.from_declared("PA_BSND", (2, 4, 2, 8), 2)
    for args, name in [((8, 0, 0), "slot"), ((-1, 0, 0), "slot"), ((0, 8, 0), "d"), ((0, 0, 2), "head")]:
        with pytest.raises(IndexRangeError, match=f"^{name}: expected"):
            lay.element_offset(*args)
        with pytest.raises(IndexRangeError, match=f"^{name}: expected"):
            lay.byte_offset(*args)
    with pytest.raises(IndexRangeError, match=r"byte_offset: expected a byte in \[0, 256\)"):
        lay.locate(256)
    with pytest.raises(IndexRangeError):
        lay.locate(-1)
    with pytest.raises(ModeError):
        CacheLayout(mode="PAGED", num_blocks=1, block_size=1, dim=1, itemsize=1)


# ---------------------------------------------------------------------- index -> slot maps
CACHE_INDEX_CASES = [np.array([5, -1, 0, 11, 3]), np.array([[1, 2, -1], [7, 0, 11]]), np.zeros((0,), np.int64)]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("cache_index", CACHE_INDEX_CASES, ids=["T", "BS", "empty"])
def test_slots_from_cache_index(cache_index, dtype):
    got = slots_from_cache_index(cache_index.astype(dtype), 12)
    assert got.dtype == np.int64
    assert got.tolist() == ref.slots_cache_index(cache_index)


def test_slots_from_cache_index_errors():
    with pytest.raises(IndexRangeError, match=r"cache_index\[1, 2\] = 12: expected -1 \(skip\) or slot "
                                              r"in \[0, 12\); 2 value\(s\) out of range"):
        slots_from_cache_index(np.array([[1, 2, 3], [4, 5, 12], [13, 0, 0]]), 12)
    with pytest.raises(IndexRangeError, match=r"cache_index\[0\] = -2"):  # only -1 means skip
        slots_from_cache_index(np.array([-2, 0]), 12)
    with pytest.raises(IndexRangeError, match=r"slot_mapping\[1\] = -1: expected slot in"):
        slots_from_cache_index(np.array([0, -1]), 12, name="slot_mapping", allow_skip=False)
    with pytest.raises(DTypeError, match="cache_index: expected an integer"):
        slots_from_cache_index(np.array([0.0, 1.0]), 12)


def test_check_index_range_scalar_and_empty():
    check_index_range(np.zeros((0, 3), np.int32), 0, 1, name="x", what="v")
    with pytest.raises(IndexRangeError, match=r"^x = 5: expected v in \[0, 4\)"):
        check_index_range(np.int64(5), 0, 4, name="x", what="v", allow_skip=False)


#: (tokens per batch, block size)
PAGE_CASES = [([5], 4), ([3, 0, 9], 4), ([4, 4], 4), ([1, 1, 1], 16), ([17, 2], 8)]


def _pages_for(seq_lens, bs, num_blocks, rng, skip_some):
    n_pages = sum(ref.ceil_div(s, bs) for s in seq_lens)
    ids = rng.permutation(num_blocks)[:n_pages].astype(np.int64)
    if skip_some and n_pages > 1:
        ids[rng.integers(0, n_pages)] = SKIP_INDEX
    return ids


@pytest.mark.parametrize("skip_some", [False, True])
@pytest.mark.parametrize("page_offsets", [False, True], ids=["block_ids", "page_offsets"])
@pytest.mark.parametrize("seq_lens,bs", PAGE_CASES, ids=str)
def test_slots_from_pages(seq_lens, bs, page_offsets, skip_some, rng):
    num_blocks = 12
    ids = _pages_for(seq_lens, bs, num_blocks, rng, skip_some)
    index = np.where(ids >= 0, ids * bs, SKIP_INDEX) if page_offsets else ids
    got = slots_from_pages(index.astype(np.int32), seq_lens, bs, num_blocks, page_offsets=page_offsets,
                           name="cache_index")
    assert got.dtype == np.int64
    assert got.tolist() == ref.slots_blk(index, seq_lens, bs, page_offsets=page_offsets)
    # the two index meanings address the same slots
    same = slots_from_pages(ids, seq_lens, bs, num_blocks, page_offsets=False, name="cache_index")
    assert got.tolist() == same.tolist()


def test_slots_from_pages_non_merged_and_row_zero():
    # non-merged [B, ceil(S/bs)] table; each batch starts at row 0 of its first block
    table = np.array([[3, 1], [0, 2]])
    got = slots_from_pages(table, [6, 6], 4, 4, page_offsets=False, name="cache_index")
    assert got.tolist() == [12, 13, 14, 15, 4, 5, 0, 1, 2, 3, 8, 9]
    offsets = slots_from_pages(table * 4, [6, 6], 4, 4, page_offsets=True, name="index")
    assert offsets.tolist() == got.tolist()


def test_slots_from_pages_errors():
    with pytest.raises(ShapeError, match=r"cache_index: expected 3 page entries"):
        slots_from_pages(np.array([0, 1]), [5, 1], 4, 8, page_offsets=False, name="cache_index")
    with pytest.raises(IndexRangeError, match=r"cache_index\[1, 0\] = 8: expected -1 \(skip\) or block id "
                                              r"in \[0, 8\)"):
        slots_from_pages(np.array([[0, 1], [8, 2]]), [5, 5], 4, 8, page_offsets=False, name="cache_index")
    with pytest.raises(IndexRangeError, match=r"index\[1\] = 6: expected a page start offset, a multiple of "
                                              r"block_size=4"):
        slots_from_pages(np.array([4, 6]), [3, 2], 4, 8, page_offsets=True, name="index")
    with pytest.raises(IndexRangeError, match=r"index\[0\] = 32: expected -1 \(skip\) or page start offset "
                                              r"in \[0, 32\)"):
        slots_from_pages(np.array([32]), [3], 4, 8, page_offsets=True, name="index")
    with pytest.raises(ShapeError, match=r"seq_lens\[1\]"):
        slots_from_pages(np.array([0]), [3, -1], 4, 8, page_offsets=False, name="cache_index")
    with pytest.raises(ShapeError, match="block_size"):
        slots_from_pages(np.array([0]), [3], 0, 8, page_offsets=False, name="cache_index")
    with pytest.raises(DTypeError):
        slots_from_pages(np.array([0.0]), [3], 4, 8, page_offsets=False, name="cache_index")


@settings(max_examples=60, deadline=None)
@given(seq_lens=st.lists(st.integers(0, 20), min_size=1, max_size=4), bs=st.integers(1, 8),
       page_offsets=st.booleans(), seed=st.integers(0, 2**16))
def test_slots_from_pages_property(seq_lens, bs, page_offsets, seed):
    rng = np.random.default_rng(seed)
    n_pages = sum(ref.ceil_div(s, bs) for s in seq_lens)
    num_blocks = n_pages + 3
    ids = _pages_for(seq_lens, bs, num_blocks, rng, skip_some=bool(seed % 2))
    index = np.where(ids >= 0, ids * bs, SKIP_INDEX) if page_offsets else ids
    got = slots_from_pages(index, seq_lens, bs, num_blocks, page_offsets=page_offsets, name="i")
    assert got.tolist() == ref.slots_blk(index, seq_lens, bs, page_offsets=page_offsets)
    live = got[got >= 0]
    assert len(set(live.tolist())) == live.size  # distinct pages -> distinct slots
    assert (live < num_blocks * bs).all()


def test_slots_from_positions():
    index = np.array([[0, 6, -1], [3, -1, 2]], dtype=np.int32)
    got = slots_from_positions(index, 7)
    assert got.dtype == np.int64
    assert got.tolist() == ref.slots_norm(index, 7) == [0, 6, -1, 10, -1, 9]
    with pytest.raises(IndexRangeError, match=r"index\[1, 2\] = 7: expected -1 \(skip\) or position in \[0, 7\)"):
        slots_from_positions(np.array([[0, 1, 2], [0, 1, 7]]), 7)
    with pytest.raises(ShapeError, match=r"index: expected a 2-D \[B, S\]"):
        slots_from_positions(np.array([0, 1]), 7)


def test_duplicate_slots():
    assert duplicate_slots(np.array([3, 1, 3, -1, 1, 2, 3, -1])) == {1: [1, 4], 3: [0, 2, 6]}
    assert duplicate_slots(np.array([0, 1, 2, -1, -1])) == {}
    assert duplicate_slots(np.array([], dtype=np.int64)) == {}
    assert duplicate_slots(np.array([[5, 5]])) == {5: [0, 1]}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1, 6), max_size=30))
def test_duplicate_slots_property(slots):
    want = {}
    for t, s in enumerate(slots):
        if s >= 0:
            want.setdefault(s, []).append(t)
    want = {s: t for s, t in sorted(want.items()) if len(t) > 1}
    got = duplicate_slots(np.array(slots, dtype=np.int64))
    assert got == want and list(got) == list(want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1, 80), min_size=33, max_size=200), st.sampled_from([1, 1 << 40]))
def test_duplicate_slots_property_many_rows(slots, spread):
    """Over 32 live slots the duplicate search marks a table (slots close together) or sorts
    (``spread``: slots far apart); both against the dictionary built here."""
    slots = [s * spread if s >= 0 else s for s in slots]
    want = {}
    for t, s in enumerate(slots):
        if s >= 0:
            want.setdefault(s, []).append(t)
    want = {s: t for s, t in sorted(want.items()) if len(t) > 1}
    got = duplicate_slots(np.array(slots, dtype=np.int64))
    assert got == want and list(got) == list(want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16, np.uint8])
@pytest.mark.parametrize("kv_lens, bs", [([5, 2], 4), ([16, 1, 0, 33], 16), ([1], 1)])
def test_slots_from_block_table(kv_lens, bs, dtype, rng):
    """int32 / int64 tables take the one-pass kernel, other integer dtypes the NumPy path."""
    num_blocks = 40
    cols = max(-(-n // bs) for n in kv_lens) + 1  # one spare column of padding
    table = rng.permutation(num_blocks)[:len(kv_lens) * cols].reshape(len(kv_lens), cols).astype(dtype)
    table[:, -1] = np.iinfo(dtype).max  # padding past what any batch needs is not read
    slots = slots_from_block_table(table, kv_lens, bs, num_blocks)
    assert slots.dtype == np.int64 and slots.shape == (len(kv_lens), max(kv_lens))
    for b, expected in enumerate(ref.slots_block_table(table, kv_lens, bs)):
        assert slots[b, :kv_lens[b]].tolist() == expected
        assert (slots[b, kv_lens[b]:] == SKIP_INDEX).all()


def test_slots_from_block_table_errors():
    table = np.array([[3, 1], [0, -1]], dtype=np.int32)
    with pytest.raises(IndexRangeError, match=r"block_table\[1, 1\] = -1: .*kv tokens \[4, 6\) of batch 1"):
        slots_from_block_table(table, [5, 6], 4, 4)
    with pytest.raises(IndexRangeError, match=r"block_table\[0, 1\] = 9"):
        slots_from_block_table(np.array([[3, 9]]), [5], 4, 4)
    with pytest.raises(ShapeError, match=r"block_table: expected a 2-D \[B=1, >= 3\]"):
        slots_from_block_table(table[:1], [9], 4, 4)
    with pytest.raises(ShapeError, match="kv_lens"):
        slots_from_block_table(table, [1, -2], 4, 4)
    with pytest.raises(DTypeError, match="block_table"):
        slots_from_block_table(table.astype(np.float32), [1, 1], 4, 4)
    with pytest.raises(ShapeError, match="block_size"):
        slots_from_block_table(table, [1, 1], 0, 4)
    with pytest.raises(ShapeError, match=r"block_table: expected a 2-D \[B=3"):
        slots_from_block_table(table, [1, 1, 1], 4, 4)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int16])
def test_slots_from_block_table_first_bad_entry(dtype):
    """Several bad needed entries: the message names the first in row-major order and counts
    them all, whichever path the table takes; a bad entry in padding is not one of them."""
    table = np.array([[0, 1, 2, 99], [3, 7, -5, 0], [1, 4, 6, 2]], dtype=dtype)  # [B=3, 4], 4 blocks
    strided = np.zeros((3, 8), dtype=dtype)[:, ::2]  # the same values, not C-contiguous
    strided[:] = table
    for t in (table, strided):
        with pytest.raises(IndexRangeError, match=r"^block_table\[1, 1\] = 7: expected a block id in \[0, 4\) "
                           r"\(the entry covers kv tokens \[4, 8\) of batch 1\); 4 needed entries out of range$"):
            slots_from_block_table(t, [12, 9, 15], 4, 4)


# ---------------------------------------------------------------------- head-major caches and reads
def test_pa_bnsd_is_head_major_and_equals_pa_bsnd_with_one_head(rng):
    # N > 1: [nb, N, bs, D] in torch_npu's order, against the reference formula
    shape = (3, 4, 16, 8)
    lay = CacheLayout.from_declared("PA_BNSD", shape, 2)
    assert lay.head_major and lay.heads == 4 and lay.block_size == 16
    cache = rng.integers(0, 2 ** 15, size=shape).astype(np.uint16)
    flat = cache.reshape(-1)
    rows = lay.to_rows(cache)  # [nb*bs, N, D]
    for slot in rng.permutation(lay.num_rows)[:10]:
        blk, r = divmod(int(slot), 16)
        for h in range(4):
            want = [flat[ref.element_offset("PA_BNSD", shape, 2, blk, r, h, d)] for d in range(8)]
            assert rows[slot, h].tolist() == want == cache[blk, h, r].tolist()
    # N = 1: the same bytes as PA_BSND [nb, bs, 1, D]
    one = CacheLayout.from_declared("PA_BNSD", (3, 1, 16, 8), 2)
    bsnd = CacheLayout.from_declared("PA_BSND", (3, 16, 1, 8), 2)
    for slot in range(0, one.num_rows, 7):
        for d in range(8):
            assert one.byte_offset(slot, d) == bsnd.byte_offset(slot, d)
    with pytest.raises(ModeError, match="head_major"):
        CacheLayout(mode="PA_BSND", num_blocks=1, block_size=1, dim=1, itemsize=1, head_major=True)


def _nz_head_major(nb, n, dim, bs, itemsize):
    c0 = 32 // itemsize
    return (nb, n, dim // c0, bs, c0), CacheLayout(mode="PA_NZ", num_blocks=nb, block_size=bs, dim=dim,
                                                  itemsize=itemsize, heads=n, head_major=True)


def test_head_major_nz_offsets_match_reference():
    shape, lay = _nz_head_major(2, 3, 32, 16, 2)
    assert lay.storage_shape() == shape
    hits = np.zeros(lay.nbytes // 2, np.int64)
    for blk in range(2):
        for r in range(16):
            for h in range(3):
                for d in range(32):
                    want = ref.head_major_nz_offset(shape, blk, r, h, d)
                    assert lay.element_offset(blk * 16 + r, d, h) == want
                    assert lay.locate(want * 2 + 1) == CacheLocation(blk, r, h, d, 1)
                    hits[want] += 1
    assert (hits == 1).all()
    with pytest.raises(ShapeError, match="not head-major"):
        CacheLayout(mode="PA_NZ", num_blocks=1, block_size=16, dim=16, itemsize=2, heads=2)


@pytest.mark.parametrize("kind", ["bsh", "bnsd", "nz", "nz1", "tnd"])
def test_read_blocks_and_rows_match_reference_offsets(kind, rng):
    nb, n, bs, dim = 5, 2, 16, 32
    if kind == "bsh":
        shape, lay = (nb, bs, n * dim), CacheLayout(mode="PA_BSND", num_blocks=nb, block_size=bs, dim=dim,
                                                    itemsize=2, heads=n)
        off = lambda b, r, h, d: ref.element_offset("PA_BSND", (nb, bs, n, dim), 2, b, r, h, d)  # noqa: E731
    elif kind == "bnsd":
        shape = (nb, n, bs, dim)
        lay = CacheLayout.from_declared("PA_BNSD", shape, 2)
        off = lambda b, r, h, d: ref.element_offset("PA_BNSD", shape, 2, b, r, h, d)  # noqa: E731
    elif kind == "nz":
        shape, lay = _nz_head_major(nb, n, dim, bs, 2)
        off = lambda b, r, h, d: ref.head_major_nz_offset(shape, b, r, h, d)  # noqa: E731
    elif kind == "nz1":
        n = 1
        shape, lay = (nb, bs, 1, dim), CacheLayout.from_declared("PA_NZ", (nb, bs, 1, dim), 2)
        off = lambda b, r, h, d: ref.element_offset("PA_NZ", shape, 2, b, r, h, d)  # noqa: E731
    else:
        shape, lay = (nb * bs, n, dim), CacheLayout.from_declared("TND", (nb * bs, n, dim), 2)
        off = lambda b, r, h, d: ref.element_offset("TND", shape, 2, 0, b * bs + r, h, d)  # noqa: E731
    cache = rng.integers(0, 2 ** 15, size=shape).astype(np.uint16)
    flat = cache.reshape(-1)
    blocks = np.array([3, 0, 4])
    for h in range(n):
        if lay.paged:
            got = lay.read_blocks(cache, blocks, h)  # [3*bs, D]
            want = [[flat[off(b, r, h, d)] for d in range(dim)] for b in blocks for r in range(bs)]
            assert got.tolist() == want
        slots = rng.permutation(lay.num_rows)[:7]
        want = [[flat[off(*divmod(int(s), bs), h, d)] for d in range(dim)] for s in slots]
        assert lay.read_rows(cache, slots, h).tolist() == want


def test_blocks_from_block_table_and_slots_of_blocks():
    from ascend_emu.layouts import blocks_from_block_table
    table = np.array([[2, 0, 9], [1, 7, 7]], np.int32)
    blocks = blocks_from_block_table(table, [20, 5], 16, 4)
    assert blocks.tolist() == [[2, 0], [1, -1]]  # entries past the lengths' need are never read
    lay = CacheLayout.from_declared("PA_BSND", (4, 16, 1, 8), 2)
    assert np.array_equal(lay.slots_of_blocks(blocks, [20, 5]), slots_from_block_table(table, [20, 5], 16, 4))
    with pytest.raises(IndexRangeError, match=r"block_table\[0, 2\] = 9"):
        blocks_from_block_table(table, [40, 5], 16, 4)
    assert lay.place(37) == "block 2, row 5 (slot 37)"
    assert CacheLayout.from_declared("TND", (8, 1, 8), 2).place(5) == "slot 5"


def test_v4_geometries_fit():
    # 640-byte fp8 rows, compressed rows of `ratio` tokens, fp32 state caches [blocks, sbs, 1, 2*coff*D]
    fp8 = CacheLayout.from_declared("PA_BSND", (4, 64, 1, 640), 1)
    assert fp8.row_bytes == 640 and fp8.byte_offset(65, 3) == 65 * 640 + 3
    comp = CacheLayout(mode="PA_BSND", num_blocks=4, block_size=64, dim=512, itemsize=2, ratio=4)
    assert comp.tokens_per_block == 256 and comp.num_rows == 256
    state = CacheLayout.from_declared("PA_BSND", (8, 4, 1, 2 * 2 * 512), 4)
    assert state.row_bytes == 2 * 2 * 512 * 4
    with pytest.raises(ShapeError, match="ratio"):
        CacheLayout(mode="PA_BSND", num_blocks=1, block_size=1, dim=1, itemsize=1, ratio=0)


@pytest.mark.parametrize("mode,shape,itemsize", LAYOUT_CASES, ids=CASE_IDS)
def test_locate_many_is_locate(mode, shape, itemsize):
    lay = CacheLayout.from_declared(mode, shape, itemsize)
    offs = np.arange(lay.nbytes)
    many = lay.locate_many(offs)
    assert [tuple(int(a[o]) for a in many) for o in offs] == [tuple(lay.locate(int(o))) for o in offs]
    assert np.array_equal(lay.slots_at(many[0], many[1]), many[0] * lay.block_size + many[1])


def test_locate_many_head_major_nz():
    _, lay = _nz_head_major(2, 3, 32, 16, 2)
    offs = np.arange(0, lay.nbytes, 7)
    many = lay.locate_many(offs)
    assert [tuple(int(a[i]) for a in many) for i in range(offs.size)] == [tuple(lay.locate(int(o))) for o in offs]


@pytest.mark.parametrize("mode,shape,itemsize", LAYOUT_CASES, ids=CASE_IDS)
def test_from_rows_inverts_to_rows_and_declared_shape_reads_back(mode, shape, itemsize, rng):
    lay = CacheLayout.from_declared(mode, shape, itemsize)
    assert lay.declared_shape() == shape
    raw = rng.integers(0, 256, lay.nbytes).astype(np.uint8)
    assert np.array_equal(lay.from_rows(lay.to_rows(raw)), raw)
    _, hm = _nz_head_major(2, 3, 32, 16, 2)
    raw = rng.integers(0, 256, hm.nbytes).astype(np.uint8)
    assert np.array_equal(hm.from_rows(hm.to_rows(raw)), raw) and hm.declared_shape() == hm.storage_shape()
