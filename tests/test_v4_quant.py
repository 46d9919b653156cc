"""DeepSeek-V4 cache quants (ascend_emu.quant.v4) against tests/reference/v4_quant.py, byte for byte."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.errors import ModeError, NonFiniteInputError, ShapeError
from ascend_emu.quant import v4
from tests.reference import v4_quant as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


def _bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(BF16)


def _rows(seed: int, t: int, d: int, lo: float = -10.0, hi: float = 10.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.uniform(lo, hi, (t, d)).astype(np.float32)
    # varied magnitudes per group, tiny and huge ones included
    x *= np.float32(2.0) ** rng.integers(-20, 20, (t, 1)).astype(np.float32)
    return _bf16(x)


def _power_of_two_rows(d: int = 512) -> np.ndarray:
    """Rows whose groups have amax 448 * 2**k (E4M3FN): s = amax * fp32(1/448) is a power of two."""
    x = np.zeros((3, d), np.float32)
    for j in range(7):
        x[0, 64 * j:64 * j + 64] = np.linspace(-1, 1, 64, dtype=np.float32) * 448.0 * 2.0 ** (j - 3)
        x[1, 64 * j + 5] = -448.0 * 2.0 ** (2 * j - 6)
    x[2, :448] = 448.0
    x[:, 448:] = np.arange(64, dtype=np.float32) / 8
    return _bf16(x)


def _ref_rows(x, fn, **kw):
    return np.stack([fn(r, **kw) for r in x])


# ----------------------------------------------------------------------------- geometry
def test_row_widths():
    assert v4.kv_row_bytes(512, 2) == 640 == ref.row_width(512, 2)
    assert v4.kv_row_bytes(512, 1) == 640 == ref.row_width(512, 1)
    for d in (128, 192, 256, 384, 768, 1024):
        for mode in (1, 2):
            assert v4.kv_row_bytes(d, mode) == ref.row_width(d, mode)
    assert v4.kv_row_bytes(512, 3) == 512
    with pytest.raises(ShapeError, match="d"):
        v4.kv_row_bytes(64, 2)
    with pytest.raises(ModeError, match="quant_mode"):
        v4.kv_row_bytes(512, 4)


def test_640_byte_row_fields():
    x = _rows(1, 2, 512)
    row = v4.encode_kv_rows(x)
    assert row.shape == (2, 640) and row.dtype == np.uint8
    np.testing.assert_array_equal(row[:, :128], x[:, 448:].copy().view(np.uint8))  # rope bf16 first
    assert not row[:, 583:].any()  # 57 bytes of padding after 7 scales
    rope, values, scales, pad = v4.split_kv_rows(row)
    assert rope.dtype == BF16 and values.shape == (2, 448) and scales.shape == (2, 7) and pad.shape == (2, 57)
    np.testing.assert_array_equal(scales, row[:, 576:583])


# ----------------------------------------------------------------------------- quant_mode 2
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("d", [512, 256, 768])
def test_mode2_matches_reference(name, d):
    x = _rows(d, 4, d)
    got = v4.encode_kv_rows(x, dtype=name)
    np.testing.assert_array_equal(got, _ref_rows(x, ref.kv_row_mode2, name=name))


def test_mode2_exact_powers_of_two_follow_the_kernel():
    x = _power_of_two_rows()
    got = v4.encode_kv_rows(x)
    kernel = _ref_rows(x, ref.kv_row_mode2, rule="kernel")
    golden = _ref_rows(x, ref.kv_row_mode2, rule="golden")
    np.testing.assert_array_equal(got, kernel)
    assert (got[:, 576:583] != golden[:, 576:583]).any()  # the two rules differ exactly here
    assert got[2, 576] == 128  # amax 448: s == 1.0 exactly; the kernel stores 2**1
    assert golden[2, 576] == 127
    assert v4.KV_E8M0_RULE == "kernel"


def test_mode2_scale_bytes_agree_with_golden_off_powers_of_two():
    x = _rows(7, 8, 512)
    got = v4.encode_kv_rows(x)
    np.testing.assert_array_equal(got, _ref_rows(x, ref.kv_row_mode2, rule="golden"))


def test_mode2_zeros_and_amax_clamp():
    x = _bf16(np.zeros((2, 512)))
    x[1, 3] = _bf16([1e-6])[0]  # amax below the 1e-4 clamp
    got = v4.encode_kv_rows(x)
    np.testing.assert_array_equal(got, _ref_rows(x, ref.kv_row_mode2))
    assert not got[0, 128:576].any()
    byte, _ = ref.e8m0_byte(0.0, "float8_e4m3fn", True)
    assert (got[:, 576:583] == byte).all()  # every group scaled from amax 1e-4


def test_mode2_clips_to_448_without_round_scale():
    x = np.zeros((1, 512), np.float32)
    x[0, :448] = np.float32(3.0)
    x[0, ::7] = -3.0
    x = _bf16(x)
    got = v4.encode_kv_rows(x, round_scale=False)
    np.testing.assert_array_equal(got, _ref_rows(x, ref.kv_row_mode2, round_scale=False))
    vals = got[0, 128:576].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.abs(vals).max() == 448.0  # never the NaN code 0x7F / 0xFF
    assert not np.isnan(vals).any()


def test_mode2_round_trip():
    x = _rows(3, 5, 512)
    back = v4.decode_kv_rows(v4.encode_kv_rows(x))
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(back[:, 448:], x32[:, 448:])
    rope, values, scales, _ = v4.split_kv_rows(v4.encode_kv_rows(x))
    want = values.astype(np.float32) * np.repeat(2.0 ** (scales.astype(np.float64) - 127), 64, axis=1)
    np.testing.assert_array_equal(back[:, :448], want.astype(np.float32))
    assert np.all(np.abs(back[:, :448] - x32[:, :448]) <= np.repeat(2.0 ** (scales - 127.0), 64, axis=1) * 16)


def test_mode2_nan_policy():
    x = _rows(4, 2, 512)
    x[1, 448 + 5] = np.nan  # the rope part is copied, NaN included
    row = v4.encode_kv_rows(x)
    np.testing.assert_array_equal(row[1, :128], x[1, 448:].copy().view(np.uint8))
    for bad in (np.nan, np.inf):
        y = x.copy()
        y[0, 17] = bad
        with pytest.raises(NonFiniteInputError, match=r"x: .*\[0, 17\]"):
            v4.encode_kv_rows(y)


def test_mode2_rejects_other_group_sizes():
    x = _rows(5, 1, 512)
    for bad in (32, 256, 96):
        with pytest.raises(ModeError, match="quant_group_size"):
            v4.encode_kv_rows(x, quant_group_size=bad)
    np.testing.assert_array_equal(v4.encode_kv_rows(x, quant_group_size=64), v4.encode_kv_rows(x))


@pytest.mark.parametrize("d", [512, 256, 200])
def test_mode2_group_128_matches_reference(d):
    """vllm-ascend's quant_group_size 128 (one E8M0 byte per 128 values; a short last group)."""
    x = _rows(6, 5, d)
    got = v4.encode_kv_rows(x, quant_group_size=128)
    assert got.shape[1] == ref.row_width(d, 2, 128) == v4.kv_row_bytes(d, 2, 128)
    np.testing.assert_array_equal(got, _ref_rows(x, ref.kv_row_mode2, group=128))
    back = v4.decode_kv_rows(got, d, quant_group_size=128)
    np.testing.assert_allclose(back, x.astype(np.float32), rtol=0.07, atol=1e-30)


# ----------------------------------------------------------------------------- quant_mode 1 / 3
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_mode1_matches_reference(name):
    x = _rows(11, 4, 512)
    x[2, 128:256] = 0  # a zero group: scale 0, zero values
    got = v4.encode_kv_rows(x, quant_mode=1, dtype=name)
    np.testing.assert_array_equal(got, _ref_rows(x, ref.kv_row_mode1, name=name))
    rope, values, scales, pad = v4.split_kv_rows(got, quant_mode=1, dtype=name)
    assert scales.shape == (4, 4) and scales[2, 1] == 0 and not pad.any()
    np.testing.assert_array_equal(rope.view(np.uint16), x[:, 448:].view(np.uint16))
    with pytest.raises(ModeError, match="quant_group_size"):
        v4.encode_kv_rows(x, quant_mode=1, quant_group_size=64)


def test_mode3_hif8_matches_reference():
    x = _rows(12, 3, 512, -4, 4)
    x[0, 0] = np.nan
    x[0, 1] = np.inf
    got = v4.encode_kv_rows(x, quant_mode=3, scale=0.5)
    assert got.shape == (3, 512)
    np.testing.assert_array_equal(got, _ref_rows(x, ref.kv_row_mode3, scale=0.5))


# ----------------------------------------------------------------------------- indexer
def test_indexer_fp8_matches_reference():
    x = _rows(21, 6, 256)
    x[3, :128] = 0
    x[3, 5] = -0.0
    values, scales = v4.indexer_quant_fp8(x)
    for r in range(6):
        codes, s = ref.indexer_fp8_row(x[r])
        np.testing.assert_array_equal(values[r], codes)
        np.testing.assert_array_equal(scales[r], np.array(s, np.float32))
    assert scales[3, 0] == 0 and values[3, 5] == 0x80 and values[3, 4] == 0x00  # signed zeros kept
    with pytest.raises(NonFiniteInputError):
        v4.indexer_quant_fp8(np.where(np.arange(256) == 9, np.nan, x.astype(np.float32)))


def test_indexer_int8_matches_reference():
    x = _rows(22, 5, 256)
    x[1, 128:] = 0
    values, scales = v4.indexer_quant_int8(x)
    assert values.dtype == np.int8 and scales.dtype == np.float16 and scales.shape == (5, 2)
    for r in range(5):
        codes, s = ref.indexer_int8_row(x[r])
        np.testing.assert_array_equal(values[r], codes)
        np.testing.assert_array_equal(scales[r], np.array(s, np.float16))
    with pytest.raises(ShapeError, match="multiple of 128"):
        v4.indexer_quant_int8(x[:, :200])


def test_indexer_v2_offsets():
    for d, bs, rb, stride in ((128, 128, 132, 0), (128, 16, 136, 0), (256, 8, 264, 4096)):
        slots = np.array([0, 1, bs - 1, bs, 3 * bs + 2])
        vo, so = v4.indexer_v2_offsets(slots, d, bs, rb, stride)
        for i, s in enumerate(slots):
            assert (vo[i], so[i]) == ref.indexer_v2_offsets(int(s), d, bs, rb, stride)
    with pytest.raises(ShapeError, match="row_bytes"):
        v4.indexer_v2_geometry(128, 128, 128)  # no room for the scales
    with pytest.raises(ModeError, match="slots"):
        v4.indexer_v2_offsets([-1], 128, 128, 132)


@pytest.mark.parametrize("d", [192, 384, 768])
def test_mode1_short_last_group_matches_reference(d):
    """The golden's other widths: q = d - 64 values in groups of 128, the last one short."""
    x = _rows(d + 1, 3, d)
    got = v4.encode_kv_rows(x, quant_mode=1)
    assert got.shape == (3, ref.row_width(d, 1))
    np.testing.assert_array_equal(got, _ref_rows(x, ref.kv_row_mode1))


def test_decode_modes_1_and_3():
    x = _rows(31, 3, 512)
    rows = v4.encode_kv_rows(x, quant_mode=1)
    _, values, scales, _ = v4.split_kv_rows(rows, quant_mode=1)
    back = v4.decode_kv_rows(rows, quant_mode=1)
    want = values.astype(np.float32) * np.repeat(scales, 128, axis=1)[:, :448]
    np.testing.assert_array_equal(back[:, :448], want)
    np.testing.assert_array_equal(back[:, 448:], x[:, 448:].astype(np.float32))
    h = v4.encode_kv_rows(x, quant_mode=3, scale=0.5)
    back3 = v4.decode_kv_rows(h, quant_mode=3, scale=0.5)
    from tests.reference.formats_950 import HIF8_TABLE
    np.testing.assert_array_equal(back3, (HIF8_TABLE[h].astype(np.float32) / np.float32(0.5)))
