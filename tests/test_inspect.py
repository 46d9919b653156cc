"""ascend_emu.inspect: where / what / dump / grid / diff / blocks and cache files, for every cache
mode, against tests/reference/layouts.py (element offsets by hand, docs/sources.md#paged_nz, docs/sources.md#cache_index, docs/sources.md#npu_kv_rmsnorm_rope_cache)
and tests/reference/quant.py (656-byte rows by struct, docs/sources.md#per_tile_rows)."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_emu import inspect, ops
from ascend_emu.errors import FormatError, IndexRangeError, ShapeError
from ascend_emu.layouts import CacheLayout, check_block_size
from ascend_emu.quant import BF16
from tests.reference import layouts as ref
from tests.reference import quant as qref

#: (mode, declared shape, dtype): every cache mode, plain and combined rows, NZ in bf16 / int8 / fp32.
CASES = [
    ("PA_BSND", (3, 4, 1, 8), "bfloat16"),
    ("PA_BSND", (2, 5, 2, 6), "int8"),
    ("PA_NZ", (2, 16, 1, 32), "bfloat16"),
    ("PA_NZ", (2, 16, 1, 64), "int8"),
    ("PA_NZ", (1, 16, 1, 16), "float32"),
    ("PA_BLK_NZ", (2, 32, 1, 48), "float16"),
    ("PA_BLK_BSND", (2, 4, 1, 10), "float16"),
    ("BSND", (2, 3, 2, 4), "int8"),
    ("TND", (6, 1, 9), "bfloat16"),
    ("Norm", (2, 1, 7, 6), "float32"),
    ("PA_BSND", (2, 3, 1, 656), "int8"),  # combined 656-byte rows
    ("TND", (3, 1, 656), "int8"),
]
IDS = [f"{m}-{'x'.join(map(str, s))}-{d}" for m, s, d in CASES]
#: Byte offsets of the three fields of a combined row, from the reference struct format.
ROW_FIELDS = {"k_nope": (0, 1, qref.NOPE), "k_rope": (struct.calcsize(f"<{qref.NOPE}b"), 2, qref.ROPE),
              "scale": (struct.calcsize(f"<{qref.NOPE}b{qref.ROPE}H"), 4, qref.TILES)}


def _spec(mode, shape, dtype):
    return inspect.CacheSpec.from_shape(mode, shape, dtype)


def _ref_block_row(mode, shape, slot):
    """(block, row) of a slot as the reference's element_offset takes them."""
    nb, bs, _, _ = ref.declared_geometry(mode, shape)
    return (0, slot) if mode == "TND" else divmod(slot, bs)


def _field_byte_ref(spec, mode, shape, slot, head, field, element) -> int:
    """First byte of (slot, head, field element), by the references."""
    itemsize = spec.dtype.itemsize
    block, row = _ref_block_row(mode, shape, slot)
    if spec.row_format is None:
        return ref.element_offset(mode, shape, itemsize, block, row, head, element) * itemsize
    first, size, _ = ROW_FIELDS[field]
    return ref.element_offset(mode, shape, 1, block, row, head, first + element * size)


def _finite_cache(spec, rng) -> np.ndarray:
    """A cache of finite random values (combined rows packed from random parts)."""
    lay = spec.layout
    if spec.row_format is not None:
        rows = [qref.encode_row(rng.integers(-128, 128, qref.NOPE), rng.standard_normal(qref.ROPE).astype(BF16),
                                rng.random(qref.TILES).astype(np.float32) + 0.01) for _ in range(lay.num_rows)]
        return np.frombuffer(b"".join(rows), dtype=np.int8).copy()
    if spec.dtype == np.int8:
        return rng.integers(-128, 128, lay.nbytes).astype(np.int8)
    return rng.standard_normal(lay.nbytes // spec.dtype.itemsize).astype(spec.dtype)


def _cache(case, rng):
    mode, shape, dtype = case
    spec = _spec(*case)
    return inspect.Cache.from_array(_finite_cache(spec, rng).reshape(shape), mode)


# ---------------------------------------------------------------------- where / what
@pytest.mark.parametrize("case", CASES, ids=IDS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_where_matches_reference_and_what_inverts_it(case, data):
    mode, shape, dtype = case
    spec = _spec(*case)
    lay = spec.layout
    slot = data.draw(st.integers(0, lay.num_rows - 1), "slot")
    head = data.draw(st.integers(0, lay.heads - 1), "head")
    kind = data.draw(st.sampled_from(spec.fields), "field")
    element = data.draw(st.integers(0, kind.count - 1), "element")
    w = inspect.where(spec, slot, head=head, field=kind.name, element=element)
    assert [(r.stop - r.start) for r in w.ranges] == [kind.size]
    start = w.ranges[0].start
    assert start == _field_byte_ref(spec, mode, shape, slot, head, kind.name, element)
    for k in range(kind.size):
        got = inspect.what(spec, start + k)
        assert (got.slot, got.head, got.field, got.field_element, got.field_byte) == (slot, head, kind.name,
                                                                                      element, k)
        assert (got.block, got.row) == divmod(slot, lay.block_size)
        if lay.nz:
            assert (got.c0_chunk, got.fractal) == (got.dim // lay.c0, got.row // 16)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_byte_is_claimed_exactly_once(case):
    spec = _spec(*case)
    counts = inspect.claimed_bytes(spec)
    assert counts.size == spec.layout.nbytes and (counts == 1).all()


def test_where_of_a_whole_nz_slot_lists_its_c0_chunks():
    spec = _spec("PA_NZ", (4, 16, 1, 64), "bfloat16")
    w = inspect.where(spec, 37)
    assert [(r.start, r.first, r.last, r.c0_chunk) for r in w.ranges] == [
        (ref.element_offset("PA_NZ", (4, 16, 1, 64), 2, 2, 5, 0, 16 * j) * 2, 16 * j, 16 * j + 16, j)
        for j in range(4)]
    assert w.nbytes == 128


def test_where_of_a_combined_row_byte_names_its_field_element():
    spec = _spec("PA_BSND", (2, 16, 1, 656), "int8")
    w = inspect.where(spec, 5, dim=512 + 2 * 3 + 1)  # a byte of k_rope[3]
    assert [(r.field, r.first, r.start, r.stop) for r in w.ranges] == [("k_rope", 3, 5 * 656 + 518, 5 * 656 + 520)]


@pytest.mark.parametrize("kwargs, err, text", [
    (dict(slot=64), IndexRangeError, "slot"),
    (dict(slot=0, dim=64), IndexRangeError, "dim"),
    (dict(slot=0, head=1), IndexRangeError, "head"),
    (dict(slot=0, field="scale"), ShapeError, "field"),
    (dict(slot=0, element=3), ShapeError, "element"),
])
def test_where_rejects_bad_coordinates(kwargs, err, text):
    with pytest.raises(err, match=text):
        inspect.where(_spec("PA_NZ", (4, 16, 1, 64), "bfloat16"), **kwargs)


def test_what_rejects_bytes_outside_the_cache():
    with pytest.raises(IndexRangeError, match="byte_offset"):
        inspect.what(_spec("PA_NZ", (4, 16, 1, 64), "bfloat16"), 8192)


@pytest.mark.parametrize("mode, shape, index, seq_lens, page_index, expected", [
    ("PA_NZ", (4, 16, 1, 64), np.array([[3, 17], [40, 63]]), None, None,
     ref.slots_cache_index(np.array([3, 17, 40, 63]))),
    ("PA_BLK_NZ", (4, 16, 1, 64), np.array([3, 1, 2]), [20, 5], "block_ids",
     ref.slots_blk(np.array([3, 1, 2]), [20, 5], 16, page_offsets=False)),
    ("PA_BLK_BSND", (4, 16, 1, 64), np.array([48, 16, 32]), [20, 5], "page_offsets",
     ref.slots_blk(np.array([48, 16, 32]), [20, 5], 16, page_offsets=True)),
    ("Norm", (2, 1, 7, 6), np.array([[6, 0], [2, 5]]), None, None, ref.slots_norm(np.array([[6, 0], [2, 5]]), 7)),
    ("TND", (6, 1, 9), None, None, None, list(range(6))),
])
def test_token_slot_follows_each_index_meaning(mode, shape, index, seq_lens, page_index, expected):
    spec = _spec(mode, shape, "bfloat16")
    kw = {} if page_index is None else dict(page_index=page_index)
    got = [inspect.token_slot(spec, t, index=index, seq_lens=seq_lens, **kw) for t in range(len(expected))]
    assert got == expected


def test_token_slot_refuses_skipped_tokens_and_missing_index():
    spec = _spec("PA_NZ", (4, 16, 1, 64), "bfloat16")
    with pytest.raises(IndexRangeError, match="skipped"):
        inspect.token_slot(spec, 1, index=np.array([3, -1]))
    with pytest.raises(ShapeError, match="index"):
        inspect.token_slot(spec, 1)
    with pytest.raises(IndexRangeError, match=r"index\[1\] = 64"):
        inspect.token_slot(spec, 0, index=np.array([3, 64]))


# ---------------------------------------------------------------------- geometry: BlockSize rule, storage shapes
@pytest.mark.parametrize("mode, shape, dtype", [
    ("PA_NZ", (4, 10, 1, 64), "bfloat16"), ("PA_BLK_NZ", (4, 8, 1, 512), "int8"),
    ("PA_NZ", (4, 24, 1, 64), "bfloat16"), ("PA_NZ", (4, 16, 1, 40), "bfloat16"),
])
def test_geometries_no_op_accepts_are_rejected(mode, shape, dtype):
    with pytest.raises(ShapeError):
        _spec(mode, shape, dtype)


def test_block_size_rule():
    check_block_size("PA_NZ", 16)
    check_block_size("PA_BLK_NZ", 1024)
    check_block_size("PA_BSND", 10)  # MlaPreprocess ND caches take any BlockSize <= 128
    for bad in (0, 10, 40):
        with pytest.raises(ShapeError, match="multiple of 16"):
            check_block_size("PA_NZ", bad)


@pytest.mark.parametrize("storage, itemsize, declared", [
    ((4, 4, 16, 16), 2, (4, 16, 1, 64)),        # MlaPreprocess cacheMode 3 style [BlockNum, D/C0, BS, C0]
    ((4, 16, 128, 32), 1, (4, 128, 1, 512)),    # int8 cacheMode 2
    ((3, 4, 32, 1, 16), 2, (3, 32, 1, 64)),     # aclnnKvRmsNormRopeCache's [BlockNum, D/C0, BS, 1, C0]
    ((2, 16, 1, 16), 2, (2, 16, 1, 16)),        # ambiguous 4-D: read as declared (BlockSize 1 is illegal)
])
def test_from_shape_recognises_nz_storage_shapes(storage, itemsize, declared):
    assert CacheLayout.from_shape("PA_NZ", storage, itemsize) == CacheLayout.from_declared("PA_NZ", declared, itemsize)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_to_rows_reorders_to_logical_rows(case, rng):
    mode, shape, dtype = case
    cache = _cache(case, rng)
    lay = cache.layout
    flat = cache.raw.view(cache.spec.dtype)
    rows = cache.rows()  # [rows, Nkv, D]
    for slot in range(lay.num_rows):
        block, row = _ref_block_row(mode, shape, slot)
        for h in range(lay.heads):
            want = [flat[ref.element_offset(mode, shape, lay.itemsize, block, row, h, d)] for d in range(lay.dim)]
            assert rows[slot, h].view(np.uint8).tobytes() == np.array(want).view(np.uint8).tobytes()


# ---------------------------------------------------------------------- diff
@pytest.mark.parametrize("case", CASES, ids=IDS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_diff_finds_exactly_the_flipped_bytes(case, data):
    """One flipped byte per field kind (a random element of each, a random bit mask) and nothing else."""
    a = _cache(case, np.random.default_rng(data.draw(st.integers(0, 2 ** 16), "seed")))
    spec, lay = a.spec, a.layout
    raw = a.raw.copy()
    flipped = {}
    for kind in spec.fields:
        slot = data.draw(st.integers(0, lay.num_rows - 1), f"{kind.name} slot")
        head = data.draw(st.integers(0, lay.heads - 1), f"{kind.name} head")
        element = data.draw(st.integers(0, kind.count - 1), f"{kind.name} element")
        k = data.draw(st.integers(0, kind.size - 1), f"{kind.name} byte")
        off = _field_byte_ref(spec, *case[:2], slot, head, kind.name, element) + k
        raw[off] ^= data.draw(st.integers(1, 255), f"{kind.name} mask")
        flipped[off] = (slot, kind.name, element + head * kind.count)
    b = inspect.Cache(spec=spec, raw=raw, shape=a.shape)
    d = inspect.diff(a, b, expect_slots=[])
    assert d.changed.tolist() == sorted(flipped)
    assert d.summary["bytes"] == len(flipped) == d.summary["outside_expected_bytes"]
    assert d.summary["slots"] == sorted({s for s, _, _ in flipped.values()})
    got = {(s.slot, f.field, e) for s in d.slots for f in s.fields for e in f.elements}
    assert got == set(flipped.values())
    assert int(d.heat.sum()) == len(flipped)
    if spec.row_format is not None:
        assert d.summary["scale_bytes"] == 1
    assert inspect.diff(a, a).same


def test_diff_is_nan_aware_and_measures_ulps_and_int8_deltas():
    spec = _spec("PA_BSND", (1, 4, 1, 656), "int8")
    parts = [(np.zeros(512, np.int64), np.ones(64, np.float32).astype(BF16), np.ones(4, np.float32))] * 4
    a_rows = [bytearray(qref.encode_row(*p)) for p in parts]
    b_rows = [bytearray(r) for r in a_rows]
    nan_a, nan_b = struct.pack("<f", float("nan")), struct.pack("<I", 0x7FC00001)  # two NaN payloads
    a_rows[0][640:644], b_rows[0][640:644] = nan_a, nan_b  # slot 0 scale 0: NaN == NaN
    b_rows[1][512:514] = struct.pack("<H", 0x3F81)  # slot 1 k_rope[0]: 1.0 -> next bf16 (1 ulp)
    b_rows[2][7] = 256 - 5  # slot 2 k_nope[7]: 0 -> -5
    b_rows[3][644:648] = nan_a  # slot 3 scale 1: 1.0 -> NaN
    mk = lambda rows: inspect.Cache(spec=spec, raw=np.frombuffer(b"".join(rows), np.uint8), shape=(1, 4, 1, 656))
    d = inspect.diff(mk(a_rows), mk(b_rows), expect_slots=[1, 2])
    assert d.nan_equal == 1
    assert d.summary["slots"] == [1, 2, 3]
    assert d.summary["max_ulp_bf16"] == 1 and d.summary["max_int8_delta"] == 5
    assert d.summary["nan_mismatch"] == 1 and d.summary["scale_bytes"] == 2  # the two NaN bytes 0x7fc0 vs 0x3f80
    assert d.summary["outside_expected_slots"] == [3]
    assert d.changed.tolist() == [656 + 512, 2 * 656 + 7, 3 * 656 + 646, 3 * 656 + 647]


def test_diff_rejects_caches_of_different_specs(rng):
    a, b = _cache(CASES[0], rng), _cache(CASES[2], rng)
    with pytest.raises(ShapeError, match="same spec"):
        inspect.diff(a, b)


# ---------------------------------------------------------------------- dump
def test_dump_of_an_nz_slot_decodes_every_element(rng):
    case = ("PA_NZ", (2, 16, 1, 64), "bfloat16")
    cache = _cache(case, rng)
    flat = cache.raw.view(BF16)
    d = inspect.dump(cache, slot=21)
    assert [(ln.first, ln.last, ln.c0_chunk, ln.fractal) for ln in d.lines] == [(16 * j, 16 * j + 16, j, 0)
                                                                                 for j in range(4)]
    for ln in d.lines:
        want = [float(flat[ref.element_offset(*case[:2], 2, 1, 5, 0, e)]) for e in range(ln.first, ln.last)]
        assert ln.values == want
        assert ln.offset == ref.element_offset(*case[:2], 2, 1, 5, 0, ln.first) * 2
        assert bytes.fromhex(ln.hex.replace(" ", "")) == cache.raw[ln.offset:ln.offset + 32].tobytes()


def test_dump_of_an_nz_block_marks_fractals_and_c0_chunks(rng):
    cache = _cache(("PA_NZ", (2, 32, 1, 32), "bfloat16"), rng)
    d = inspect.dump(cache, block=1)
    assert len(d.lines) == 2 * 32 and [ln.offset for ln in d.lines] == list(range(2048, 4096, 32))
    marked = [(ln.c0_chunk, ln.row) for ln in d.lines if any(m.startswith("fractal") for m in ln.marks)]
    assert marked == [(0, 0), (0, 16), (1, 0), (1, 16)]


def test_dump_of_a_combined_row_labels_fields_and_dequantises(rng):
    case = ("PA_BSND", (2, 3, 1, 656), "int8")
    cache = _cache(case, rng)
    d = inspect.dump(cache, slot=4)
    row = cache.raw[4 * 656: 5 * 656].tobytes()
    deq, rope, scales = qref.decode_row(row)
    assert [ln.field for ln in d.lines] == ["k_nope"] * 16 + ["k_rope"] * 4 + ["scale"]
    nope = [v for ln in d.lines if ln.field == "k_nope" for v in ln.dequant]
    assert np.array_equal(np.array(nope, np.float32), deq)
    assert [v for ln in d.lines if ln.field == "k_rope" for v in ln.values] == [float(v) for v in rope]
    assert d.lines[-1].values == [float(v) for v in scales]
    assert [(t.tile, t.scale) for t in d.tiles] == [(t, float(scales[t])) for t in range(4)]
    assert d.tiles[2].dequant_max == float(deq[256:384].max())


def test_dump_of_a_byte_range_widens_to_whole_elements(rng):
    cache = _cache(("PA_NZ", (4, 16, 1, 64), "bfloat16"), rng)
    d = inspect.dump(cache, start=4777, stop=4781)
    assert (d.start, d.stop) == (4776, 4782)
    assert [(ln.slot, ln.first, ln.last) for ln in d.lines] == [(37, 20, 23)]


def test_dump_needs_exactly_one_selection(rng):
    cache = _cache(CASES[0], rng)
    with pytest.raises(ShapeError):
        inspect.dump(cache, slot=1, block=0)
    with pytest.raises(IndexRangeError):
        inspect.dump(cache, block=3)


# ---------------------------------------------------------------------- grid
@pytest.mark.parametrize("shape, dtype", [((2, 16, 1, 64), "bfloat16"), ((2, 32, 1, 64), "int8")])
def test_cache_block_grid(shape, dtype):
    spec = _spec("PA_NZ", shape, dtype)
    g = inspect.grid(spec, block=1)
    c0, bs = spec.layout.c0, shape[1]
    assert g.shape == (shape[3] // c0, bs)
    for j in range(g.shape[0]):
        for r in range(bs):
            assert g.offset[j, r] == ref.element_offset("PA_NZ", shape, spec.dtype.itemsize, 1, r, 0, j * c0) * \
                spec.dtype.itemsize
            assert g.logical_row[j, r] == bs + r and g.first_col[j, r] == j * c0


def test_grid_of_an_nd_cache_is_refused():
    with pytest.raises(ShapeError, match="NZ"):
        inspect.grid(_spec("PA_BSND", (2, 16, 1, 64), "bfloat16"))


@pytest.mark.parametrize("shape, dtype", [((20, 40), BF16), ((33, 64), np.int8), ((2, 5, 17), np.float16)])
def test_weight_grid_against_reference_offsets(shape, dtype):
    itemsize = np.dtype(dtype).itemsize
    batch = 1 if len(shape) == 3 else 0
    g = inspect.weight_grid(shape, dtype, batch=batch)
    m_dim, n_dim = shape[-2:]
    c0 = ref.matrix_c0(itemsize)
    for j in range(g.shape[0]):
        for r in range(g.shape[1]):
            if r < m_dim:
                idx = ((batch,) if len(shape) == 3 else ()) + (r, j * c0)
                assert g.offset[j, r] == ref.nz_flat_offset(shape, itemsize, idx) * itemsize
                assert g.logical_row[j, r] == r and g.valid_cols[j, r] == min(c0, n_dim - j * c0)
            else:
                assert g.logical_row[j, r] == -1 and g.valid_cols[j, r] == 0


@pytest.mark.parametrize("shape, dtype", [((20, 40), BF16), ((3, 33), np.int8), ((2, 5, 17), np.float32)])
def test_every_weight_byte_is_one_element_or_padding(shape, dtype):
    """FRACTAL_NZ weight: what_weight over every storage byte names each logical (element, byte) once,
    at the reference offset, and calls the rest padding."""
    itemsize = np.dtype(dtype).itemsize
    st = ref.nz_storage_shape(shape, itemsize)
    seen = {}
    padding = 0
    for off in range(int(np.prod(st)) * itemsize):
        w = inspect.what_weight(shape, dtype, off)
        if w.padding:
            padding += 1
            continue
        key = (tuple(w.index), w.byte_in_element)
        assert key not in seen
        seen[key] = off
        assert off == ref.nz_flat_offset(shape, itemsize, tuple(w.index)) * itemsize + w.byte_in_element
    assert len(seen) == int(np.prod(shape)) * itemsize
    assert padding == (int(np.prod(st)) - int(np.prod(shape))) * itemsize


# ---------------------------------------------------------------------- blocks
def test_blocks_maps_tokens_and_flags_unused_and_shared_blocks():
    table = np.array([[0, 1, 9], [2, 1, 0]], dtype=np.int32)  # column 2 of row 0 is padding
    m = inspect.blocks(table, [20, 17], 16, num_blocks=5)
    assert m.slots[0, :20].tolist() == ref.slots_block_table(table, [20, 17], 16)[0]
    assert m.slots[1, :17].tolist() == ref.slots_block_table(table, [20, 17], 16)[1]
    assert m.unused_blocks == [3, 4] and m.shared_blocks == [1]
    assert m.owners == {0: [0], 1: [0, 1], 2: [1]}
    assert m.occupancy[1, 0] == -2 and m.occupancy[1, 1:4].tolist() == [0, 0, 0] and m.occupancy[3].max() == -1
    assert [(r.block, r.first_token, r.last_token) for r in m.sequences[0].runs] == [(0, 0, 16), (1, 16, 20)]


def test_blocks_rejects_out_of_range_entries():
    with pytest.raises(IndexRangeError, match=r"block_table\[0, 1\]"):
        inspect.blocks(np.array([[0, 7]]), [20], 16, num_blocks=4)


# ---------------------------------------------------------------------- files
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_npz_round_trip_keeps_bytes_and_metadata(case, rng, tmp_path):
    cache = _cache(case, rng)
    path = inspect.save_cache(tmp_path / "c", cache)
    back = inspect.load_cache(path)
    assert back.spec == cache.spec and back.shape == cache.shape
    assert back.raw.tobytes() == cache.raw.tobytes()


def test_npz_metadata_must_agree_with_arguments(rng, tmp_path):
    path = inspect.save_cache(tmp_path / "c.npz", _cache(CASES[2], rng))
    assert inspect.load_cache(path, cache_mode="PA_NZ").layout.nz
    with pytest.raises(FormatError, match="cache_mode"):
        inspect.load_cache(path, cache_mode="PA_BSND")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(FormatError, match="data"):
        inspect.load_cache(tmp_path / "other.npz")


def test_bare_dumps_npy_and_bin(rng, tmp_path):
    cache = _cache(("PA_NZ", (2, 16, 1, 64), "int8"), rng)
    np.save(tmp_path / "c.npy", cache.array())
    cache.raw.tofile(tmp_path / "c.bin")
    a = inspect.load_cache(tmp_path / "c.npy", cache_mode="PA_NZ")
    b = inspect.load_cache(tmp_path / "c.bin", cache_mode="PA_NZ", shape=(2, 2, 16, 32), dtype="int8")  # storage
    assert a.spec == b.spec == cache.spec and a.raw.tobytes() == b.raw.tobytes() == cache.raw.tobytes()
    with pytest.raises(ShapeError, match="cache_mode"):
        inspect.load_cache(tmp_path / "c.npy")
    with pytest.raises(ShapeError, match="shape/dtype"):
        inspect.load_cache(tmp_path / "c.bin", cache_mode="PA_NZ", shape=(2, 16, 1, 48), dtype="int8")


def test_torch_save_dump_in_storage_shape(rng, tmp_path):
    torch = pytest.importorskip("torch")
    cache = _cache(("PA_NZ", (2, 16, 1, 64), "bfloat16"), rng)
    t = torch.from_numpy(cache.raw.view(np.int16).copy()).view(torch.bfloat16).reshape(2, 4, 16, 16)
    torch.save(t, tmp_path / "kv.pt")
    back = inspect.load_cache(tmp_path / "kv.pt", cache_mode="PA_NZ")
    assert back.spec == cache.spec and back.shape == (2, 4, 16, 16)
    assert back.raw.tobytes() == cache.raw.tobytes()


# ---------------------------------------------------------------------- caches written by the ops
KV_MODES = [("PA_NZ", "PA_BNSD", False), ("PA_BLK_NZ", "PA_BLK_BNSD", False), ("PA_NZ", "PA_BNSD", True),
            ("PA_BLK_NZ", "PA_BLK_BNSD", True)]


@pytest.mark.parametrize("nz_mode, nd_mode, quant", KV_MODES)
def test_caches_written_by_kv_rmsnorm_rope_cache(nz_mode, nd_mode, quant, rng):
    """The NZ run's caches, read by the inspector, hold the ND run's rows byte for byte, at the slots
    where() names."""
    b, s, bs, nb = 2, 3, 32, 4
    kv = rng.standard_normal((b, 1, s, 576)).astype(BF16)
    cos, sin = (rng.standard_normal((b, 1, s, 64)).astype(BF16) for _ in range(2))
    gamma = np.ones(512, BF16)
    index = np.array([5, 70, 33, 100, 2, 127]) if "BLK" not in nz_mode else np.array([64, 0])
    dtype = np.int8 if quant else BF16
    scales = dict(k_rope_scale=np.full(64, 20.0, np.float32), c_kv_scale=np.full(512, 20.0, np.float32)) if quant \
        else {}
    out = {}
    for mode in (nz_mode, nd_mode):
        k_cache, ckv_cache = np.zeros((nb, bs, 1, 64), dtype), np.zeros((nb, bs, 1, 512), dtype)
        ops.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, cache_mode=mode, **scales)
        out[mode] = [inspect.Cache.from_array(c, mode) for c in (k_cache, ckv_cache)]
    for nz, nd in zip(out[nz_mode], out[nd_mode], strict=True):
        assert nz.rows().view(np.uint8).tobytes() == nd.rows().view(np.uint8).tobytes()
        written = np.flatnonzero(nd.rows().view(np.uint8).reshape(nd.layout.num_rows, -1).any(axis=1))
        assert written.size == b * s
        for slot in written[:3]:
            got = b"".join(nz.raw[r.start:r.stop].tobytes() for r in inspect.where(nz, int(slot)).ranges)
            assert got == nd.rows()[slot].view(np.uint8).tobytes()


# ---------------------------------------------------------------------- pictures
def _is_png(path, lo=2_000, hi=2_000_000):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and lo < len(data) < hi


def test_pictures_are_written(rng, tmp_path):
    from ascend_emu.inspect.plot import plot_blocks, plot_diff, plot_grid

    a = _cache(("PA_NZ", (4, 16, 1, 64), "bfloat16"), rng)
    raw = a.raw.copy()
    raw[[10, 5000, 6000]] ^= 1
    d = inspect.diff(a, inspect.Cache(spec=a.spec, raw=raw, shape=a.shape), expect_slots=[0])
    paths = [plot_grid(inspect.grid(a, 2), tmp_path / "grid.png"),
             plot_grid(inspect.weight_grid((20, 40), BF16), tmp_path / "weight.png"),
             plot_diff(d, tmp_path / "diff.png"),
             plot_blocks(inspect.blocks([[0, 1], [2, 1]], [20, 17], 16, 4), tmp_path / "blocks.png")]
    for p in paths:
        assert _is_png(tmp_path / p.rsplit("/", 1)[-1]), p


def test_combined_rows_written_by_mla_prolog_v3_per_tile():
    """npu_mla_prolog_v3 kv_cache_quant_mode=3 (656-byte rows, PA_BSND) through the torch drop-in: the
    inspector reads the op's tensor, recognises the rows, and its fields match a struct decode."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    gen = torch.Generator().manual_seed(0)
    B, S, He, Hcq, Hckv, N, D, Dr = 1, 3, 7168, 1536, 512, 8, 128, 64

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)

    w_uq = torch.randn(Hcq, N * (D + Dr), generator=gen) * Hcq ** -0.5
    w_scale = w_uq.abs().amax(dim=0, keepdim=True) / 127  # [1, N*(D+Dr)]
    w_uq_int8 = torch.round(w_uq / w_scale).to(torch.int8)
    angles = torch.arange(S).float()[:, None] * (1.0 / 10000 ** (torch.arange(0, Dr, 2).float() / Dr))
    angles = torch.cat([angles, angles], dim=-1)[None]  # [1, S, Dr]
    kv_cache = torch.zeros(2, 16, 1, 656, dtype=torch.int8)  # [BlockNum, BlockSize, 1, 656]
    before = inspect.Cache.from_array(kv_cache.clone(), "PA_BSND")
    cache_index = torch.tensor([[5, 17, 30]])
    torch_npu.npu_mla_prolog_v3(
        randn(B, S, He), torch_npu.npu_format_cast(randn(He, Hcq, scale=He ** -0.5), 29),
        torch_npu.npu_format_cast(w_uq_int8, 29), randn(N, D, Hckv, scale=D ** -0.5),
        torch_npu.npu_format_cast(randn(He, Hckv + Dr, scale=He ** -0.5), 29), torch.ones(Hcq, dtype=torch.bfloat16),
        torch.ones(Hckv, dtype=torch.bfloat16), angles.sin().to(torch.bfloat16), angles.cos().to(torch.bfloat16),
        kv_cache, torch.empty(0, dtype=torch.bfloat16), cache_index=cache_index, dequant_scale_w_uq_qr=w_scale,
        k_nope_clip_alpha=torch.tensor([1.0]), cache_mode="PA_BSND", query_norm_flag=True, weight_quant_mode=1,
        kv_cache_quant_mode=3, query_quant_mode=0, ckvkr_repo_mode=1, quant_scale_repo_mode=1, tile_size=128)
    after = inspect.Cache.from_array(kv_cache, "PA_BSND")
    assert after.spec.row_format is not None
    d = inspect.diff(before, after, expect_slots=[5, 17, 30])
    assert d.summary["slots"] == [5, 17, 30] and d.summary["outside_expected_bytes"] == 0
    for slot in (5, 17, 30):
        row = after.raw[slot * 656:(slot + 1) * 656].tobytes()
        deq, rope, scales = qref.decode_row(row)
        (rng_,) = inspect.where(after, slot, field="scale").ranges
        assert after.raw[rng_.start:rng_.stop].view(np.float32).tolist() == scales.tolist()
        dumped = inspect.dump(after, slot=slot)
        assert [t.scale for t in dumped.tiles] == scales.tolist()
        assert np.array_equal(np.array([v for ln in dumped.lines if ln.field == "k_nope" for v in ln.dequant],
                                       np.float32), deq)


def _figure_texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_grid_picture_labels_small_grids_and_only_colours_large_ones():
    import matplotlib  # noqa: F401  (a declared test dependency: missing, the test fails)
    import matplotlib.pyplot as plt

    from ascend_emu.inspect.plot import MAX_TICKS, grid_figure

    mode, shape = "PA_NZ", (2, 16, 1, 64)
    fig = grid_figure(inspect.grid(_spec(mode, shape, "bfloat16"), 1))
    base = ref.element_offset(mode, shape, 2, 1, 0, 0, 0) * 2
    want = {f"slot {16 + r}\n+{ref.element_offset(mode, shape, 2, 1, r, 0, 16 * j) * 2 - base}"
            for j in range(4) for r in range(16)}
    assert set(_figure_texts(fig)) == want
    assert "one cell = one row's C0 chunk" in fig.axes[0].get_title()
    plt.close(fig)
    big = (2, 16, 1, 512)
    fig = grid_figure(inspect.grid(_spec(mode, big, "bfloat16"), 1))  # 32 x 16 cells: one label per fractal
    ax = fig.axes[0]
    base = ref.element_offset(mode, big, 2, 1, 0, 0, 0) * 2
    assert sorted(_figure_texts(fig)) == sorted(f"+{ref.element_offset(mode, big, 2, 1, 0, 0, 16 * j) * 2 - base}"
                                                for j in range(32))
    assert len(ax.get_xticks()) <= MAX_TICKS
    assert "one cell = one row's C0 chunk, 16 elements = 32 bytes" in ax.get_title()
    assert "one colour = one fractal (16 rows x C0), in memory order" in ax.get_title()
    plt.close(fig)
    # a window of a model-sized weight: the tiling at a readable scale, every fractal its own colour
    g = inspect.weight_grid((7168, 1536), BF16, rows=(0, 64), chunks=(0, 16))
    fig = grid_figure(g)
    ax = fig.axes[0]
    colours = np.asarray(ax.images[0].get_array())  # [rows, chunks]
    fractal = (np.arange(64)[:, None] // 16) + 1000 * np.arange(16)[None, :]  # which fractal a cell is in
    for dr, dc in ((1, 0), (0, 1)):  # cells that touch: same colour exactly when the same fractal
        for r in range(64 - dr):
            for c in range(16 - dc):
                assert (colours[r, c] == colours[r + dr, c + dc]) == (fractal[r, c] == fractal[r + dr, c + dc])
    assert "window: rows 0-63 of 7168, C0 chunks 0-15 of 96" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["0", "4"]
    plt.close(fig)


def test_diff_picture_fixed_scale_and_unexpected_slots_marked(rng):
    """A fully rewritten slot is the darkest colour and one changed byte is plainly off the
    background, whatever else changed; slots changed outside --expect-slots are outlined red, the
    expected ones green."""
    import matplotlib  # noqa: F401  (a declared test dependency: missing, the test fails)
    import matplotlib.pyplot as plt

    from ascend_emu.inspect.plot import diff_figure

    mode, shape = "PA_NZ", (2, 16, 1, 64)
    a = _cache((mode, shape, "bfloat16"), rng)

    def changed(slots_full, byte_slots):
        raw = a.raw.copy()
        for slot in slots_full:  # every byte of the slot, by the reference offsets
            b, r = divmod(slot, 16)
            for d in range(64):
                o = ref.element_offset(mode, shape, 2, b, r, 0, d) * 2
                raw[o:o + 2] ^= 0x5A
        for slot in byte_slots:
            b, r = divmod(slot, 16)
            raw[ref.element_offset(mode, shape, 2, b, r, 0, 7) * 2] ^= 1
        return inspect.Cache(spec=a.spec, raw=raw, shape=a.shape)

    def colours(fig):
        im = fig.axes[0].images[0]
        return im.to_rgba(im.get_array())[..., :3]  # [blocks, rows, rgb]

    fig = diff_figure(inspect.diff(a, changed([3, 17], [])))  # only whole slots changed
    whole = colours(fig)[0, 3]
    assert whole @ [0.299, 0.587, 0.114] < 0.25  # dark, on a light background
    plt.close(fig)
    d = inspect.diff(a, changed([3, 20], [9]), expect_slots=[3, 4])
    fig = diff_figure(d, title="call 5 torch_npu.npu_x: kv_cache")
    rgb, ax = colours(fig), fig.axes[0]
    assert np.allclose(rgb[0, 3], whole)  # the same colour, whatever else changed
    assert np.linalg.norm(rgb[0, 9] - rgb[0, 0]) > 0.3 and np.linalg.norm(rgb[0, 9] - rgb[0, 3]) > 0.3
    boxes = {(round(p.get_x() + p.get_width() / 2), round(p.get_y() + p.get_height() / 2), p.get_edgecolor()[:3])
             for p in ax.patches}
    red, green = (1.0, 0.0, 0.0), tuple(np.round(plt.matplotlib.colors.to_rgb("#1a9850"), 6))
    assert {(x, y) for x, y, c in boxes if c == red} == {(9, 0), (4, 1)}  # slots 9 and 20 (block 1, row 4)
    assert {(x, y) for x, y, c in boxes if tuple(np.round(c, 6)) == green} == {(3, 0), (4, 0)}
    assert ax.get_title().startswith("call 5 torch_npu.npu_x: kv_cache\n")
    assert "bytes per slot" in fig.axes[1].get_ylabel()
    plt.close(fig)


def _cielab(rgb) -> np.ndarray:
    """sRGB in [0, 1] ``[n, 3]`` -> CIELAB (D65) ``[n, 3]``, by the CIE formulas."""
    rgb = np.asarray(rgb, float)
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = lin @ np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]).T
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], axis=-1)


def test_blocks_picture_distinct_colours_and_block_order():
    import matplotlib  # noqa: F401  (a declared test dependency: missing, the test fails)
    import matplotlib.pyplot as plt

    from ascend_emu.inspect.plot import blocks_figure

    lens = [40, 17, 64, 5, 33, 70, 16, 25]
    table = [[9, 28, 13, 0, 0], [20, 26, 0, 0, 0], [24, 6, 17, 16, 0], [6, 0, 0, 0, 0], [7, 35, 30, 0, 0],
             [37, 2, 8, 11, 22], [21, 0, 0, 0, 0], [31, 38, 0, 0, 0]]
    fig = blocks_figure(inspect.blocks(table, lens, 16, 40))
    ax = fig.axes[0]
    legend = ax.get_legend()
    lab = _cielab([h.get_facecolor()[:3] for h in legend.legend_handles[:9]])  # 8 sequences + rows read twice
    hue = np.degrees(np.arctan2(lab[:, 2], lab[:, 1]))  # [9]
    chromatic = [i for i in range(8) if np.hypot(lab[i, 1], lab[i, 2]) > 15]
    hue_gaps = [abs((hue[i] - hue[k] + 180) % 360 - 180) for i in chromatic for k in chromatic if k < i]
    assert min(hue_gaps) > 15  # no two sequences in shades of one hue
    assert min(np.linalg.norm(lab[8] - lab[i]) for i in range(8)) > 25
    runs = {}  # (seq, table column) -> block, from the labels where they are drawn
    for t in ax.texts:
        for part in t.get_text().split("  |  "):
            s, k = re.match(r"s(\d+) #(\d+):", part).groups()
            runs[int(s), int(k)] = round(t.get_position()[1])
    assert runs == {(b, k): table[b][k] for b, n in enumerate(lens) for k in range(-(-n // 16))}
    names = [t.get_text() for t in legend.get_texts()]
    assert names[0] == "seq 0 (40 tokens): blocks 9 > 28 > 13" and names[5].endswith("37 > 2 > 8 > 11 > 22")
    plt.close(fig)


@pytest.mark.parametrize("rows, chunks", [((16, 20), (90, 96)), ((7150, 7168), (0, 3)), (None, (5, 6))])
def test_weight_grid_window_against_reference_offsets(rows, chunks):
    """A window of a model-sized weight's grid: only its cells are built, each the reference's."""
    shape, itemsize = (7168, 1536), 2
    g = inspect.weight_grid(shape, BF16, rows=rows, chunks=chunks)
    r0, r1 = rows or (0, 7168)
    assert g.shape == (chunks[1] - chunks[0], r1 - r0) and g.extent == (96, 7168) and not g.whole
    for j in range(g.shape[0]):
        for r in range(0, g.shape[1], 7):
            col, m = (chunks[0] + j) * 16, r0 + r
            assert g.offset[j, r] == ref.nz_flat_offset(shape, itemsize, (m, col)) * itemsize
            assert g.logical_row[j, r] == m and g.first_col[j, r] == col


def test_grid_windows_are_checked_and_bounded():
    from ascend_emu.inspect.grid import MAX_GRID_CELLS

    with pytest.raises(IndexRangeError, match=r"rows: expected a range start:stop with 0 <= start < stop <= 7168, "
                                              r"got 7100:7200"):
        inspect.weight_grid((7168, 1536), BF16, rows=(7100, 7200))
    with pytest.raises(IndexRangeError, match="chunks"):
        inspect.grid(_spec("PA_NZ", (2, 16, 1, 64), "bfloat16"), 1, chunks=(2, 2))
    with pytest.raises(ShapeError, match=f"a window of at most {MAX_GRID_CELLS} cells"):
        inspect.weight_grid((61, 18432, 7168), BF16)  # 8.3 M cells: never allocated whole


def test_diff_of_one_byte_in_a_thousand_block_cache_is_seen(rng, tmp_path, capsys, monkeypatch):
    """One differing byte in a 1,000-block cache: the heat map crops to the block that differs
    (labelled with its id), marks it and outlines the slot; the text has no ``None``."""
    import matplotlib  # noqa: F401  (a declared test dependency: missing, the test fails)
    import matplotlib.pyplot as plt

    from ascend_emu.cli import main
    from ascend_emu.inspect.plot import diff_figure

    mode, shape = "PA_BSND", (1000, 16, 1, 64)
    a = inspect.Cache.from_array(np.zeros(shape, BF16), mode)
    raw = a.raw.copy()
    slot = 637 * 16 + 5
    raw[ref.element_offset(mode, shape, 2, 637, 5, 0, 9) * 2] ^= 1
    b = inspect.Cache(spec=a.spec, raw=raw, shape=a.shape)
    d = inspect.diff(a, b)
    fig = diff_figure(d)
    ax = fig.axes[0]
    assert ax.images[0].get_array().shape == (1, 16)  # only block 637
    assert [t.get_text() for t in ax.get_yticklabels()] == ["637"]
    outlined = {(round(p.get_x() + 0.5), round(p.get_y() + 0.5)) for p in ax.patches}
    assert outlined == {(5, 0)}  # the slot, in its (only) picture row
    (marks,) = ax.lines
    assert list(marks.get_ydata()) == [0]
    assert "showing the 1 block(s) that differ, of 1000" in ax.get_title()
    plt.close(fig)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    inspect.save_cache(tmp_path / "a", a)
    inspect.save_cache(tmp_path / "b", b)
    assert main(["inspect", "diff", "a.npz", "b.npz", "--png", "d.png"]) == 1
    out = capsys.readouterr().out
    assert "None" not in out and f"slots {slot}" in out and (tmp_path / "d.png").stat().st_size > 0
    assert "max ulp (bf16): 1" in out and "max int8 delta" not in out  # a bf16 cache: no int8 field


def test_busy_speaks_only_for_work_over_its_threshold():
    import io
    import time

    from ascend_emu.progress import busy

    quick, slow = io.StringIO(), io.StringIO()
    with busy("drawing a.png", stream=quick):
        pass
    with busy("drawing b.png", after=0.05, stream=slow) as b:
        time.sleep(0.3)
    assert quick.getvalue() == "" and b.shown
    first, last = slow.getvalue().splitlines()
    assert first == "drawing b.png ... (over 0.05 s)" and re.fullmatch(r"drawing b\.png: done in 0\.\d s", last)


@pytest.mark.parametrize("cache_ndim", [3, 4, 5])
def test_read_caches_described_by_the_readers_contract(cache_ndim, rng):
    """A cache fused_infer_attention_score reads is inspected through the CacheLayout its contract
    describes it with (the object the writers' caches use): the rows per kv head are the caller's
    logical ``[nb, KV_N, bs, D]`` values, whatever the layout (PA_BSH, head-major PA_BNSD, NZ)."""
    from ascend_emu.ops.fused_infer_attention_score import FusedInferAttentionCall, normalise
    from tests.test_fused_infer_attention_score import _cache

    nb, kv_n, bs = 5, 2, 16
    logical = rng.standard_normal((nb, kv_n, bs, 128)).astype(BF16)
    rope = rng.standard_normal((nb, kv_n, bs, 64)).astype(BF16)
    key, key_rope = _cache(logical, cache_ndim), _cache(rope, cache_ndim)
    query = rng.standard_normal((1, 1, 4, 128)).astype(BF16)
    args = normalise(FusedInferAttentionCall(
        op="npu_fused_infer_attention_score", query=query, key=key, value=key, query_rope=query[..., :64].copy(),
        key_rope=key_rope, atten_mask=None, act_q=None, act_q_name="actual_seq_lengths", act_kv=[20],
        act_kv_name="actual_seq_lengths_kv", block_table=np.array([[3, 1]], np.int32), num_heads=4,
        heads_name="num_heads", num_key_value_heads=kv_n, scale=0.1, scale_name="scale", pre_tokens=0,
        next_tokens=0, input_layout="BSND", sparse_mode=0, block_size=bs, lse_flag=False,
        lse_name="softmax_lse_flag"))
    for arr, lay, want in ((key, args.key_layout, logical), (key_rope, args.rope_layout, rope)):
        cache = inspect.Cache.from_array(arr, lay, name="key")
        assert cache.layout is lay and cache.layout.heads == kv_n
        rows = cache.rows()  # [nb*bs, KV_N, D]
        assert rows.view(np.uint16).tolist() == want.transpose(0, 2, 1, 3).reshape(nb * bs, kv_n, -1).view(
            np.uint16).tolist()
    assert args.kv_blocks.tolist() == [[3, 1]]
    with pytest.raises(ShapeError, match="bytes"):
        inspect.Cache.from_array(key[:2], args.key_layout)
