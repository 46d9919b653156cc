"""The Ascend 950's 8-bit formats (HiFloat8, FP8 E4M3FN / E5M2, MX block scaling, torch_npu dtype
codes) against the bit-field references in tests/reference/formats_950.py."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ascend_emu.errors import DTypeError, ModeError, ShapeError
from ascend_emu.quant import (E8M0_NAN, FP8_MAX, HIF8_INF_THRESHOLD, HIF8_MAX, HIF8_MIN_POSITIVE, HIF8_NAN,
                              HIF8_NEG_INF, HIF8_POS_INF, HIF8_VALUES, TORCH_NPU_DTYPE_CODES, TORCH_NPU_DTYPE_NAMES,
                              e8m0_to_f32, fp8_dtype, fp8_name, fp8_to_f32, hif8_to_f32, mx_dequantize,
                              mx_quantize, mx_scale_bytes, mx_scale_shape, to_fp8, to_hif8)
from tests.helpers import assert_same_bytes
from tests.reference import formats_950 as ref

ALL_CODES = np.arange(256, dtype=np.uint8)
ALL_16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
FP8_NAMES = ["float8_e4m3fn", "float8_e5m2"]


def f32_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def same_values(a, b) -> bool:
    """Equal as float64, NaN equal to NaN (any sign), and the sign of every zero equal."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    numbers = ~np.isnan(a)
    return bool(np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a[numbers]), np.signbit(b[numbers])))


def ref_hif8_values(codes) -> np.ndarray:
    return ref.HIF8_TABLE[np.asarray(codes, dtype=np.int64)]


# ---------------------------------------------------------------------- HiF8 decode
def test_hif8_decode_all_256_codes():
    got = hif8_to_f32(ALL_CODES)
    assert got.dtype == np.float32 and got.shape == (256,)
    assert same_values(got, ref.HIF8_TABLE)


def test_hif8_code_space_facts():
    """arXiv 2409.16626 §2: one zero, one NaN, +-Inf at 0x6F / 0xEF, 126 positive finite codes over
    38 binades from 2**-22 to 2**15 (facts of the paper, not of the code under test)."""
    v = hif8_to_f32(ALL_CODES).astype(np.float64)
    assert np.flatnonzero(v == 0).tolist() == [0x00]
    assert np.flatnonzero(np.isnan(v)).tolist() == [HIF8_NAN] == [0x80]
    assert (HIF8_POS_INF, HIF8_NEG_INF) == (0x6F, 0xEF)
    assert v[0x6F] == np.inf and v[0xEF] == -np.inf and np.isinf(v).sum() == 2
    pos = v[np.isfinite(v) & (v > 0)]
    assert pos.size == 126 and np.unique(pos).size == 126
    assert pos.max() == 2.0 ** 15 == HIF8_MAX and pos.min() == 2.0 ** -22 == HIF8_MIN_POSITIVE
    assert np.unique(np.floor(np.log2(pos))).size == 38
    assert same_values(v[0x80 | np.arange(1, 128)], -v[np.arange(1, 128)])  # sign symmetric (0x80 excepted)
    assert HIF8_INF_THRESHOLD == 1.25 * 2.0 ** 15
    # mantissa widths per binade: 3 bits around 1 (|E| <= 3), 2 bits for |E| 4..7, 1 bit for |E| 8..15
    for e, m in ((0, 3), (3, 3), (-3, 3), (4, 2), (-7, 2), (8, 1), (-15, 1), (14, 1)):
        assert np.count_nonzero((pos >= 2.0 ** e) & (pos < 2.0 ** (e + 1))) == 2 ** m, e
    assert np.count_nonzero((pos >= 2.0 ** 15)) == 1  # 2**15 itself; 1.5 * 2**15 is the Inf code


def test_hif8_table_is_read_only():
    with pytest.raises(ValueError):
        HIF8_VALUES[1] = 0


@pytest.mark.parametrize("bad", [np.arange(4, dtype=np.int8), np.zeros(3, np.float32), np.zeros(2, np.uint16)])
def test_hif8_decode_rejects_non_uint8(bad):
    with pytest.raises(DTypeError, match="codes: expected HiF8 codes as uint8"):
        hif8_to_f32(bad)


# ---------------------------------------------------------------------- HiF8 encode
@pytest.mark.parametrize("source", ["bf16", "fp16"])
def test_hif8_encode_every_16_bit_pattern(source):
    x = ALL_16.view(ml_dtypes.bfloat16) if source == "bf16" else ALL_16.view(np.float16)
    with np.errstate(invalid="ignore"):
        x32 = x.astype(np.float32)
    got = to_hif8(x)
    assert got.dtype == np.uint8 and got.shape == x.shape
    assert_same_bytes(got, ref.hif8_encode(x32), f"HiF8 codes of every {source} pattern")


def _tie_points() -> np.ndarray:
    """Every midpoint between neighbouring non-negative HiF8 values (and the Inf threshold), with
    the fp32 values one ulp either side, both signs."""
    v = np.unique(ref.HIF8_TABLE[np.isfinite(ref.HIF8_TABLE) & (ref.HIF8_TABLE >= 0)])
    mids = np.append((v[:-1] + v[1:]) / 2, 1.25 * 2.0 ** 15).astype(np.float32)
    assert np.array_equal(mids.astype(np.float64), np.append((v[:-1] + v[1:]) / 2, 1.25 * 2.0 ** 15))  # exact
    around = np.concatenate([mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf))])
    return np.concatenate([around, -around, v.astype(np.float32), -v.astype(np.float32)])


def test_hif8_encode_tie_points_against_exact_nearest():
    x = _tie_points()
    want = np.array([ref.hif8_encode_exact(float(t)) for t in x], np.uint8)
    assert_same_bytes(to_hif8(x), want, "HiF8 codes at and next to every tie point")
    assert_same_bytes(ref.hif8_encode(x), want, "the two references agree")


def test_hif8_encode_dense_fp32_grid():
    """Every binade from 2**-26 to 2**17 (denormals, all mantissa widths, overflow) with 2**12
    evenly spaced mantissas each, 256 random fp32 mantissas each, both signs."""
    rng = np.random.default_rng(20)
    exps = np.arange(-26, 18)
    grid = (1.0 + np.arange(4096) / 4096.0)[None, :] * np.ldexp(1.0, exps)[:, None]
    rand = f32_from_bits((((exps + 127).astype(np.uint32) << 23)[:, None]
                          | rng.integers(0, 1 << 23, size=(exps.size, 256), dtype=np.uint32)))
    x = np.concatenate([grid.astype(np.float32).ravel(), rand.ravel()])
    x = np.concatenate([x, -x])
    assert_same_bytes(to_hif8(x), ref.hif8_encode(x), "HiF8 codes of the fp32 grid")


def test_hif8_encode_specials_and_thresholds():
    t = np.float32(HIF8_INF_THRESHOLD)
    below = np.nextafter(t, np.float32(0))
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, t, -t, below, -below, 2.0 ** 15, 0.0, -0.0,
                  2.0 ** -23, -(2.0 ** -23), np.nextafter(np.float32(2.0 ** -23), np.float32(0)), 2.0 ** -149,
                  -(2.0 ** -149), 3.4e38, -3.4e38], np.float32)
    want = [0x80, 0x80, 0x6F, 0xEF, 0x6F, 0xEF, 0x6E, 0xEE, 0x6E, 0x00, 0x00,
            0x01, 0x81, 0x00, 0x00, 0x00, 0x6F, 0xEF]
    assert to_hif8(x).tolist() == want
    assert [ref.hif8_encode_exact(float(v)) for v in x] == want


def test_hif8_encode_accepts_fp32_fp16_bf16_alike():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(4096) * 2.0 ** rng.integers(-20, 16, 4096)).astype(np.float32)
    for narrow in (np.float16, ml_dtypes.bfloat16):
        with np.errstate(over="ignore"):
            n = x.astype(narrow)
        assert_same_bytes(to_hif8(n), to_hif8(n.astype(np.float32)), f"{np.dtype(narrow).name} via fp32")
    assert to_hif8(np.float32(1.0)).shape == ()
    assert to_hif8([[1.0, -2.0]]).tolist() == [[0x08, 0x90]]


def test_hif8_encode_rejects_non_real():
    with pytest.raises(DTypeError, match="x: expected a real array"):
        to_hif8(np.zeros(2, np.complex64))


def test_hif8_round_trip_every_code():
    """encode(decode(c)) == c for all 256 codes (each value has one code; NaN -> 0x80)."""
    assert_same_bytes(to_hif8(hif8_to_f32(ALL_CODES)), ALL_CODES, "encode(decode(code))")


@settings(max_examples=200, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-2.0 ** 16, max_value=2.0 ** 16))
@example(1.0625)
@example(-18.0)
@example(2.0 ** -23)
@example(40960.0)
@example(-40959.996)
def test_hif8_decode_encode_is_nearest(v):
    """decode(encode(v)) is a nearest HiF8 value (the larger magnitude on a tie), or +-Inf at or
    beyond the threshold."""
    v = float(np.float32(v))
    got = float(hif8_to_f32(to_hif8(np.float32(v))))
    assert to_hif8(np.float32(v)) == ref.hif8_encode_exact(v)
    if abs(v) >= 1.25 * 2 ** 15:
        assert got == math.copysign(math.inf, v)
        return
    finite = ref.HIF8_TABLE[np.isfinite(ref.HIF8_TABLE)]
    best = np.min(np.abs(finite - v))
    assert abs(got - v) == best
    ties = finite[np.abs(finite - v) == best]
    assert abs(got) == np.max(np.abs(ties))


# ---------------------------------------------------------------------- FP8
@pytest.mark.parametrize("name", FP8_NAMES)
def test_fp8_decode_matches_bit_fields(name):
    got = fp8_to_f32(ALL_CODES.view(fp8_dtype(name)))
    assert got.dtype == np.float32
    assert same_values(got, ref.fp8_table(name))
    assert FP8_MAX[name] == ref.fp8_max(name)


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("name", FP8_NAMES)
@pytest.mark.parametrize("source", ["bf16", "fp16"])
def test_fp8_encode_every_16_bit_pattern(source, name, saturate):
    x = ALL_16.view(ml_dtypes.bfloat16) if source == "bf16" else ALL_16.view(np.float16)
    with np.errstate(invalid="ignore"):
        x32 = x.astype(np.float32)
    got = to_fp8(x, name, saturate=saturate)
    assert got.dtype == fp8_dtype(name) and got.shape == x.shape
    want = ref.fp8_encode(x32, name, saturate)
    g, w = got.view(np.uint8), want
    both_nan = np.isnan(ref.fp8_table(name)[g]) & np.isnan(ref.fp8_table(name)[w])
    assert np.array_equal(np.isnan(ref.fp8_table(name)[g]), np.isnan(ref.fp8_table(name)[w]))
    bad = np.flatnonzero((g != w) & ~both_nan)
    assert bad.size == 0, f"{bad.size} codes differ, first {x32[bad[0]]!r}: {g[bad[0]]:#04x} vs {w[bad[0]]:#04x}"


@pytest.mark.parametrize("name", FP8_NAMES)
def test_fp8_saturation_edges(name):
    mx = FP8_MAX[name]
    x = np.array([mx, -mx, mx * 1.0625, -mx * 1.0625, 1e30, -np.inf, np.inf, np.nan], np.float32)
    sat = fp8_to_f32(to_fp8(x, name, saturate=True))
    assert same_values(sat, [mx, -mx, mx, -mx, mx, -mx, mx, np.nan])
    with np.errstate(over="ignore"):
        plain = fp8_to_f32(to_fp8(x, name))
    over = np.nan if name == "float8_e4m3fn" else np.inf
    assert same_values(plain[4:7], [over, -over, over])


def test_fp8_names_and_codes():
    assert fp8_name(292) == fp8_name("float8_e4m3fn") == fp8_name(ml_dtypes.float8_e4m3fn) == "float8_e4m3fn"
    assert fp8_name(291) == fp8_name(np.dtype(ml_dtypes.float8_e5m2)) == "float8_e5m2"
    for bad in (290, 293, "hifloat8", np.float16, True, None):
        with pytest.raises(ModeError, match="dtype: expected an FP8 element type"):
            fp8_name(bad)
    with pytest.raises(DTypeError, match="x: expected an ml_dtypes float8"):
        fp8_to_f32(np.zeros(2, np.uint8))


def test_torch_npu_dtype_codes():
    """torch_npu 2.14 ``op_plugin/meta/_meta_registrations.py`` (ACL enum + 256)."""
    assert TORCH_NPU_DTYPE_CODES == {"int4": 285, "hifloat8": 290, "float8_e5m2": 291, "float8_e4m3fn": 292,
                                     "float8_e8m0fnu": 293, "float4_e2m1fn_x2": 296, "float4_e1m2fn_x2": 297}
    assert {v: k for k, v in TORCH_NPU_DTYPE_CODES.items()} == TORCH_NPU_DTYPE_NAMES


# ---------------------------------------------------------------------- MX
#: (shape, axis, block_size): full and partial blocks, odd and even block counts, every axis.
MX_CASES = [
    ((2, 64), -1, 32), ((3, 33), -1, 32), ((2, 95), 1, 32), ((2, 100), -1, 64), ((1, 32), 1, 32),
    ((70, 3), 0, 32), ((33, 2), -2, 32), ((2, 40, 3), 1, 32), ((2, 3, 130), 2, 64), ((5,), 0, 32),
    ((129, 2), 0, 128),
]


def _mx_input(shape, seed):
    rng = np.random.default_rng(seed)
    mags = 2.0 ** rng.integers(-30, 30, size=shape) * rng.standard_normal(shape)
    x = mags.astype(ml_dtypes.bfloat16)
    flat = x.reshape(-1)
    flat[:: max(1, flat.size // 7)] = 0  # zeros inside blocks
    return x


@pytest.mark.parametrize("scale_alg", [0, 1])
@pytest.mark.parametrize("name", FP8_NAMES)
@pytest.mark.parametrize("shape,axis,block_size", MX_CASES)
def test_mx_quantize_against_reference(shape, axis, block_size, name, scale_alg):
    x = _mx_input(shape, hash((shape, axis)) % 1000)
    y, scales = mx_quantize(x, name, axis=axis, block_size=block_size, scale_alg=scale_alg)
    want_codes, want_scales = ref.mx_quantize(x.astype(np.float32), name, axis, block_size, scale_alg)
    assert y.dtype == fp8_dtype(name) and y.shape == x.shape
    assert scales.dtype == np.uint8 and scales.shape == want_scales.shape == mx_scale_shape(shape, axis, block_size)
    assert_same_bytes(scales, want_scales, "E8M0 scale pairs")
    assert_same_bytes(y, want_codes, "MX elements")
    got = mx_dequantize(y, scales, axis=axis, block_size=block_size)
    assert same_values(got, ref.mx_dequantize(want_codes, want_scales, name, axis, block_size))


def test_mx_scale_pair_layout_byte_exact():
    """Three blocks along the last axis: bytes (b0, b1), (b2, 0); along axis 0 the pairs
    interleave the rows of blocks 2k and 2k+1 on the trailing axis."""
    x = np.zeros((2, 96), np.float32)
    x[0, 0], x[0, 40], x[0, 70] = 1.0, 2.0 ** 10, 2.0 ** -5  # blocks 0, 1, 2 of row 0
    x[1, 31] = -3.0
    _, s = mx_quantize(x, "float8_e4m3fn", axis=-1, scale_alg=0)
    # biased_exp - 8: 1.0 -> 119, 2**10 -> 129, 2**-5 -> 114, 3.0 -> 120; an all-zero block -> 0
    assert s.tolist() == [[[119, 129], [114, 0]], [[120, 0], [0, 0]]]
    _, s0 = mx_quantize(x.T.copy(), "float8_e4m3fn", axis=0, scale_alg=0)
    assert s0.shape == (2, 2, 2)
    assert s0.tolist() == [[[119, 129], [120, 0]], [[114, 0], [0, 0]]]


@pytest.mark.parametrize("name", FP8_NAMES)
def test_mx_scale_bytes_edges(name):
    mx, emax = FP8_MAX[name], {"float8_e4m3fn": 8, "float8_e5m2": 15}[name]
    amax = np.array([0.0, 2.0 ** -149, 1.0, 1.5, mx, mx * 2, mx * 2 * 1.0000001, 2.0 ** -120, np.inf, np.nan,
                     3.3e38, mx * 2.0 ** -126, mx * 2.0 ** -127, mx * 1.5 * 2.0 ** -127], np.float32)
    for alg in (0, 1):
        got = mx_scale_bytes(amax, name, alg)
        want = [ref.mx_scale_byte(float(a), name, alg) for a in amax]
        assert got.tolist() == want, alg
    assert mx_scale_bytes(np.float32(1.0), name, 0) == 127 - emax
    assert mx_scale_bytes(np.float32(mx), name, 1) == 127  # S = 1 exactly: no round up
    assert mx_scale_bytes(np.float32(np.inf), name, 0) == E8M0_NAN


@pytest.mark.parametrize("name", FP8_NAMES)
def test_mx_non_finite_block_is_nan(name):
    x = np.ones((2, 64), np.float32)
    x[0, 3], x[1, 40] = np.nan, -np.inf
    y, s = mx_quantize(x, name)
    assert s[0, 0].tolist() == [E8M0_NAN, 127 - {"float8_e4m3fn": 8, "float8_e5m2": 15}[name]]
    assert s[1, 0, 1] == E8M0_NAN
    d = mx_dequantize(y, s)
    assert np.isnan(d[0, :32]).all() and np.isnan(d[1, 32:]).all() and (d[0, 32:] == 1).all()
    elems = fp8_to_f32(y)
    assert np.isnan(elems[0, :32]).all() and np.isnan(elems[1, 32:]).all()  # the elements too, not only the scale
    assert np.isfinite(elems[0, 32:]).all() and np.isfinite(elems[1, :32]).all()
    want_codes, want_scales = ref.mx_quantize(x, name, -1, 32, 1)
    y1, s1 = mx_quantize(x, name, scale_alg=1)
    assert_same_bytes(s1, want_scales, "scale pairs of non-finite blocks")
    assert np.array_equal(np.isnan(fp8_to_f32(y1)), np.isnan(ref.fp8_table(name)[want_codes]))


def test_e8m0_values():
    b = np.array([0, 1, 126, 127, 128, 254, 255], np.uint8)
    assert same_values(e8m0_to_f32(b), [2.0 ** -127, 2.0 ** -126, 0.5, 1, 2, 2.0 ** 127, np.nan])
    with pytest.raises(DTypeError, match="scales: expected E8M0 bytes as uint8"):
        e8m0_to_f32(np.zeros(2, np.int8))


@pytest.mark.parametrize("kwargs,err,match", [
    ({"block_size": 48}, ModeError, "block_size: expected a multiple of 32 in \\[32, 1024\\], got 48"),
    ({"block_size": 0}, ModeError, "block_size"), ({"block_size": 2048}, ModeError, "block_size"),
    ({"block_size": 32.0}, ModeError, "block_size: expected an int"),
    ({"scale_alg": 2}, ModeError, "scale_alg: expected one of \\(0, 1\\)"),
    ({"axis": 2}, ShapeError, "axis: expected an axis in \\[-2, 1\\]"),
    ({"dtype": 290}, ModeError, "dtype: expected an FP8 element type"),
])
def test_mx_quantize_rejects(kwargs, err, match):
    with pytest.raises(err, match=match):
        mx_quantize(np.ones((2, 64), np.float32), **kwargs)


def test_mx_quantize_rejects_0d_and_dequantize_checks_shapes():
    with pytest.raises(ShapeError, match="x: expected an array of at least 1 dimension"):
        mx_quantize(np.float32(1.0))
    y, s = mx_quantize(np.ones((2, 96), np.float32))
    with pytest.raises(ShapeError, match=r"scales: expected shape \[2, 2, 2\]"):
        mx_dequantize(y, s[:, :1])
    with pytest.raises(DTypeError, match="y: expected an ml_dtypes float8"):
        mx_dequantize(y.view(np.uint8), s)
    with pytest.raises(DTypeError, match="scales: expected E8M0 bytes as uint8"):
        mx_dequantize(y, s.view(np.int8))
