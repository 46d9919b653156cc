"""The DeepSeek-V4 cache descriptors (ascend_emu.layouts.v4) against values worked out by hand from
the sources (docs/v4.md "The V4 caches"): shapes and dtypes per SoC family, state block sizes, and
which SWA / compressed / state row a token lands in."""

import numpy as np
import pytest

from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from ascend_emu.layouts import V4LayerCaches, state_block_size
from ascend_emu.layouts.v4 import V4_FP8_ROW_BYTES, V4_INDEXER_PACKED_ROW, place_of, swa_slots
from ascend_emu.quant import v4 as qv4


def test_shapes_a2a3_csa():
    caches = V4LayerCaches("a2a3", 4, block_size=128, num_blocks=3).caches()
    got = {k: (c.shape, c.dtype) for k, c in caches.items()}
    assert got == {
        "swa": ((3, 128, 1, 512), "bfloat16"),
        "compressed": ((3, 128, 1, 512), "bfloat16"),
        "state": ((3, 8, 1, 2 * 2 * 512), "float32"),
        "indexer_key": ((3, 128, 1, 128), "int8"),
        "indexer_scale": ((3, 128, 1, 1), "float16"),
        "indexer_state": ((3, 8, 1, 2 * 2 * 128), "float32"),
    }
    assert caches["state"].fields == (("kv_state", 0, 1024), ("score_state", 1024, 2048))
    assert caches["compressed"].layout.tokens_per_block == 512


def test_shapes_950_hca_and_csa():
    hca = V4LayerCaches("950", 128, block_size=16, num_blocks=2).caches()
    assert {k: (c.shape, c.dtype) for k, c in hca.items()} == {
        "swa": ((2, 16, 1, 640), "float8_e4m3fn"), "compressed": ((2, 16, 1, 640), "float8_e4m3fn"),
        "state": ((2, 16, 1, 1024), "float32")}
    csa = V4LayerCaches("950", 4, block_size=128, num_blocks=2).caches()
    assert csa["indexer_packed"].shape == (2, 128, 1, 132)
    assert "indexer_key" not in csa and "indexer_scale" not in csa
    # vllm-ascend's full view: one 16,896-byte page per block (128 * 128 fp8 + 128 * 4 fp32)
    assert csa["indexer_packed"].layout.block_size * csa["indexer_packed"].layout.row_bytes == 16896


def test_swa_only_layer_has_one_cache():
    assert list(V4LayerCaches("a2a3", 1).caches()) == ["swa"]


@pytest.mark.parametrize("soc,ratio,want", [("a2a3", 4, 8), ("a2a3", 128, 32), ("950", 4, 8), ("950", 128, 16)])
def test_state_block_sizes(soc, ratio, want):
    assert state_block_size(soc, ratio) == want


def test_constants_agree_with_the_codecs():
    assert V4_FP8_ROW_BYTES == qv4.kv_row_bytes(512, 2) == 640
    geo = qv4.indexer_v2_geometry(128, 128, V4_INDEXER_PACKED_ROW)
    assert geo["scale_base"] == 128 * 128 and geo["block_stride"] == 128 * 132


def test_token_places_csa():
    layer = V4LayerCaches("a2a3", 4, block_size=16, num_blocks=8, state_num_blocks=8)
    # token 37: SWA column 2 -> block 5, row 5, slot 85; compressed row 9 (tokens 36..39, overlap 32..35)
    # in compressed column 0 -> block 3, row 9, slot 57; state block 8 rows: column 4 -> block 6, row 5
    places = layer.token_places(37, [3, 1, 5, 0], state_block_table_row=[0, 0, 0, 0, 6, 0], seq_len=40)
    assert (places.swa.block, places.swa.row, places.swa.slot) == (5, 5, 85)
    assert places.compressed_row == 9 and places.covers == (36, 40) and places.overlap == (32, 36)
    assert places.complete is True
    assert (places.compressed.block, places.compressed.row, places.compressed.slot) == (3, 9, 57)
    assert places.indexer.slot == 57
    assert (places.state.block, places.state.row, places.state.slot) == (6, 5, 53)
    partial = layer.token_places(37, [3, 1, 5, 0], seq_len=38)
    assert partial.complete is False and partial.state is None


def test_state_entry_zero_means_no_update():
    layer = V4LayerCaches("950", 128, block_size=16, num_blocks=4)
    places = layer.token_places(20, [1, 2], state_block_table_row=[0, 3])  # state bs 16: column 1
    assert places.state.slot == 3 * 16 + 4
    skipped = layer.token_places(5, [1, 2], state_block_table_row=[0, 3])
    assert skipped.state is None and skipped.state_skipped
    assert skipped.overlap is None and skipped.covers == (0, 128)


def test_compressed_row_of_the_worked_page_example():
    # c4 indexer page of 128 rows mapped to physical page 7: tokens 0..3 -> slot 896, 508..511 -> 1023;
    # page 2 for the next 512 tokens: token 512 -> slot 256
    layer = V4LayerCaches("950", 4, block_size=128, num_blocks=8)
    table = [7, 2]
    assert layer.token_places(3, [0] * 5, cmp_block_table_row=table).indexer.slot == 896
    assert layer.token_places(511, [0] * 5, cmp_block_table_row=table).indexer.slot == 1023
    assert layer.token_places(512, [0] * 5, cmp_block_table_row=table).compressed.slot == 256


def test_swa_slots_and_errors():
    assert swa_slots([0, 15, 16, 33], [2, 0, 1], 16, 3).tolist() == [32, 47, 0, 17]
    with pytest.raises(IndexRangeError, match="block_table"):
        swa_slots([48], [2, 0, 1], 16, 3)
    with pytest.raises(IndexRangeError, match=r"block_table\[0\].*got 9"):
        place_of(1, [9], 16, 3, name="block_table")
    with pytest.raises(DTypeError, match="block_table"):
        place_of(1, np.array([0.0]), 16, 3, name="block_table")


def test_check_and_rejections():
    layer = V4LayerCaches("950", 4, block_size=16, num_blocks=2)
    arrays = layer.new()
    layer.check(arrays)
    arrays["swa"] = arrays["swa"].view(np.int8).astype(np.float32)
    with pytest.raises(DTypeError, match="swa"):
        layer.check(arrays)
    with pytest.raises(ShapeError, match="state"):
        layer.caches()["state"].check(np.zeros((2, 16, 1, 2048), np.float32))
    with pytest.raises(ModeError, match="caches"):
        layer.check({"swa": arrays["swa"]})
    with pytest.raises(ModeError, match="soc"):
        V4LayerCaches("910", 4)
    with pytest.raises(ModeError, match="ratio"):
        V4LayerCaches("a2a3", 8)


def test_v4_rope_tables_each_frequency_twice():
    """cos / sin row p: angles p * theta ** (-2i / 64), each twice (the interleaved tables the
    compressor with rotary_mode 2 and inplace_partial_rotary_mul read), by hand for p = 3."""
    from ascend_emu.layouts import v4_rope_tables

    cos, sin = v4_rope_tables(5, 40000.0)
    assert cos.shape == sin.shape == (5, 64) and cos.dtype == np.float32
    for i in (0, 1, 17, 31):
        ang = 3 * 40000.0 ** (-2 * i / 64)
        assert cos[3, 2 * i] == cos[3, 2 * i + 1] == np.float32(np.cos(ang))
        assert sin[3, 2 * i] == sin[3, 2 * i + 1] == np.float32(np.sin(ang))
    with pytest.raises(ShapeError, match="positions"):
        v4_rope_tables(-1, 1e4)
