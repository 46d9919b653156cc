"""Rounding, int8 quant schemes and combined rows (docs/sources.md#quant_rounding, docs/sources.md#per_tile_rows, docs/sources.md#npu_kv_quant_sparse_flash_attention) against
ml_dtypes and the exact-arithmetic references in tests/reference/quant.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numba import njit

from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from ascend_emu.quant import (BF16, GRANULARITIES, MLA_ROW, NOPE_OFFSET, NUM_TILES, RECIPROCAL_127_GRANULARITIES,
                              ROPE_OFFSET, ROW_BYTES, SCALE_OFFSET, ZERO_GROUP_POLICY, CombinedRowFormat,
                              bf16_bits_to_f32, bf16_to_f32, dequantize, dynamic_scale, f32_bits_to_bf16_bits,
                              f32_to_bf16_bits, f32_to_f16, f32_to_int8, f32_to_int8_via_f16, group_amax,
                              quantize_dynamic, quantize_static, quantize_with_dequant_scale, read_combined_cache,
                              round_half_away, round_half_even, saturate_int8, to_bf16, to_f32)
from tests.helpers import assert_same_bytes, poisoned
from tests.reference import quant as ref

ROUNDINGS = ["half_even", "half_away"]
#: fp32 bit patterns at the edges: zeros, subnormals, normals, max, inf, quiet / signalling NaNs
#: with payloads, bf16 ties (0x3F808000: 1 + 2**-8) and near-ties.
SPECIAL_BITS = np.array([0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00008000, 0x00018000,
                         0x00800000, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF,
                         0xFF7FFFFF, 0x7F7F8000, 0x7F800000, 0xFF800000, 0x7F800001, 0xFF800001, 0x7FC00000,
                         0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA12345, 0xFFC12345, 0x7F810000],
                        dtype=np.uint32)
FP32_FINITE = st.floats(width=32, allow_nan=False, allow_infinity=False)
FP32_ANY = st.integers(0, 2**32 - 1).map(lambda b: np.array([b], np.uint32).view(np.float32)[0])


def f32_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


@njit(cache=False)
def _numba_bf16_kernel(bits_in, x_in, bf_out, bf_out2, f32_out):
    """Calls the scalar bf16 helpers from inside a compiled kernel (bf16 as uint16)."""
    for i in range(bits_in.size):
        bf_out[i] = f32_bits_to_bf16_bits(bits_in[i])
        bf_out2[i] = f32_to_bf16_bits(x_in[i])
        f32_out[i] = bf16_bits_to_f32(bf_out[i])


# ---------------------------------------------------------------------- fp32 <-> bf16
def test_to_bf16_equals_ml_dtypes_on_random_bits(rng):
    bits = np.concatenate([SPECIAL_BITS, rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)])
    x = f32_from_bits(bits)
    with np.errstate(invalid="ignore"):
        want = ref.bf16_bits(x)
    got = to_bf16(x)
    assert got.dtype == BF16 and got.shape == x.shape
    assert_same_bytes(got, want, "to_bf16 vs ml_dtypes (NaN payloads included)")


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_bf16_scalar_property(b):
    x = f32_from_bits([b])
    with np.errstate(invalid="ignore"):
        want = int(ref.bf16_bits(x)[0])
    assert int(to_bf16(x).view(np.uint16)[0]) == want
    assert int(f32_bits_to_bf16_bits(np.uint32(b))) == want  # the njit function, called from Python


def test_nan_becomes_ml_dtypes_canonical_quiet_nan():
    nans = SPECIAL_BITS[np.isnan(f32_from_bits(SPECIAL_BITS))]
    assert nans.size >= 8
    sign = (nans >> 16) & 0x8000
    with np.errstate(invalid="ignore"):
        assert (ref.bf16_bits(f32_from_bits(nans)) == (sign | 0x7FC0)).all()  # ml_dtypes' payload
    assert (to_bf16(f32_from_bits(nans)).view(np.uint16) == (sign | 0x7FC0)).all()


def test_bf16_helpers_inside_njit_kernel(rng):
    bits = np.concatenate([SPECIAL_BITS, rng.integers(0, 2**32, size=50_000, dtype=np.uint64).astype(np.uint32)])
    x = f32_from_bits(bits)
    bf, bf2, back = np.empty(bits.size, np.uint16), np.empty(bits.size, np.uint16), np.empty(bits.size, np.float32)
    _numba_bf16_kernel(bits, x, bf, bf2, back)
    with np.errstate(invalid="ignore"):
        want = ref.bf16_bits(x)
    assert_same_bytes(bf, want, "f32_bits_to_bf16_bits in njit")
    assert_same_bytes(bf2, want, "f32_to_bf16_bits in njit")
    assert_same_bytes(back, ref.bf16_to_f32_bits(want), "bf16_bits_to_f32 in njit")


@pytest.mark.parametrize("form", ["bfloat16", "uint16", "int16"])
def test_bf16_to_f32_all_patterns(form):
    h = np.arange(2**16, dtype=np.uint32).astype(np.uint16)  # every bf16 value incl. NaN payloads
    x = {"bfloat16": h.view(BF16), "uint16": h, "int16": h.view(np.int16)}[form]
    got = bf16_to_f32(x)
    assert got.dtype == np.float32
    assert_same_bytes(got, ref.bf16_to_f32_bits(h), "bf16_to_f32 vs ml_dtypes")
    assert_same_bytes(to_f32(h.view(BF16)), ref.bf16_to_f32_bits(h), "to_f32")


def test_bf16_to_f32_rejects_non_bf16():
    with pytest.raises(DTypeError, match="x: expected bfloat16"):
        bf16_to_f32(np.ones(3, np.float32))


def test_to_bf16_rounds_float64_through_fp32():
    # 1 + 2**-8 + 2**-30 lies above the bf16 tie 1 + 2**-8 (nearest bf16: 1 + 2**-7, 0x3F81), but
    # fp32 drops the 2**-30, leaving the tie itself, which goes to even: 1.0 (0x3F80).
    x = np.array([1 + 2**-8 + 2**-30])
    assert np.float32(x[0]) == 1 + 2**-8
    assert to_bf16(x).view(np.uint16)[0] == 0x3F80


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (2, 3, 5)], ids=str)
def test_to_bf16_shapes_and_strides(shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    assert_same_bytes(to_bf16(x), x.astype(BF16), "contiguous")
    if x.ndim >= 2:
        t = np.swapaxes(x, 0, -1)
        assert_same_bytes(to_bf16(t), t.astype(BF16), "non-contiguous")


@pytest.mark.parametrize("dtype", [np.float16, np.int8, np.int32, np.float32])
def test_to_f32_exact(dtype, rng):
    x = rng.integers(-100, 100, size=50).astype(dtype)
    assert_same_bytes(to_f32(x), x.astype(np.float64).astype(np.float32), str(dtype))


# ---------------------------------------------------------------------- integer rounding
TIES = np.array([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 126.5, 127.5, -128.5, 8388607.5], dtype=np.float32)


@pytest.mark.parametrize("mode", ROUNDINGS)
def test_ties(mode):
    fn = round_half_even if mode == "half_even" else round_half_away
    got = fn(TIES)
    assert got.dtype == np.float32
    assert got.tolist() == [ref.round_int(v, mode) for v in TIES]
    if mode == "half_even":
        assert got[:8].tolist() == [-4, -2, -2, 0, 0, 2, 2, 4]
    else:
        assert got[:8].tolist() == [-4, -3, -2, -1, 1, 2, 3, 4]


def test_round_half_away_no_plus_half_trap():
    # the largest double below 0.5: x + 0.5 rounds up to 1.0 in float64; the answer is 0
    assert round_half_away(np.array([0.49999999999999994, -0.49999999999999994])).tolist() == [0.0, 0.0]
    assert round_half_away(np.float32([0.49999997]))[0] == 0.0
    assert np.signbit(round_half_away(np.float32([-0.25]))[0])  # sign of zero kept, like trunc
    specials = round_half_away(np.float32([np.inf, -np.inf, np.nan]))
    assert specials[0] == np.inf and specials[1] == -np.inf and np.isnan(specials[2])


@settings(max_examples=300, deadline=None)
@given(FP32_FINITE)
def test_rounding_property(v):
    x = np.float32([v])
    assert round_half_even(x)[0] == ref.round_int(x[0], "half_even")
    assert round_half_away(x)[0] == ref.round_int(x[0], "half_away")


@pytest.mark.parametrize("mode", ROUNDINGS)
def test_f32_to_int8_saturation_and_specials(mode):
    x = np.float32([127.4, 127.5, 128.0, 1e30, np.inf, -128.4, -128.5, -129.0, -1e30, -np.inf, np.nan, -0.5, 0.5])
    got = f32_to_int8(x, mode)
    assert got.dtype == np.int8
    assert got.tolist() == [ref.to_int8(v, mode) for v in x]
    away = mode == "half_away"
    assert got.tolist() == [127, 127, 127, 127, 127, -128, -128, -128, -128, -128, 0, -1 if away else 0,
                            1 if away else 0]


@settings(max_examples=300, deadline=None)
@given(st.one_of(FP32_ANY, st.floats(-300, 300, width=32)), st.sampled_from(ROUNDINGS))
def test_f32_to_int8_property(v, mode):
    assert int(f32_to_int8(np.float32([v]), mode)[0]) == ref.to_int8(v, mode)


def test_saturate_int8_and_bad_rounding():
    assert saturate_int8(np.array([300.0, -300.0, np.nan, 5.0])).tolist() == [127, -128, 0, 5]
    with pytest.raises(ValueError, match="rounding"):
        f32_to_int8(np.zeros(2), "half_up")
    with pytest.raises(ValueError, match="rounding"):
        f32_to_f16(np.zeros(2), "nearest")


# ---------------------------------------------------------------------- fp32 -> fp16
F16_CASES = np.float32([
    2.0**-25, -(2.0**-25), 3 * 2.0**-25, 2.0**-26, 1.5 * 2.0**-25, 2.0**-24, 5 * 2.0**-25,  # subnormal ties
    1 + 2.0**-11, 1 + 3 * 2.0**-11, -(1 + 2.0**-11), 2049.0, 2051.0, 0.1, -7.3,  # normal ties / values
    65504.0, 65519.0, 65520.0, -65520.0, 65536.0, 1e30, np.inf, -np.inf, np.nan, 0.0, -0.0,
    2.0**-14 - 2.0**-25,  # largest subnormal + half ulp: tie into the smallest normal
])


@pytest.mark.parametrize("mode", ROUNDINGS)
def test_f32_to_f16_cases(mode):
    got = f32_to_f16(F16_CASES, mode)
    assert got.dtype == np.float16
    want = np.array([ref.to_f16(v, mode) for v in F16_CASES], dtype=np.float16)
    assert_same_bytes(got, want, mode)


def test_f32_to_f16_half_away_differs_from_half_even_on_ties():
    away, even = f32_to_f16(F16_CASES[:4], "half_away"), f32_to_f16(F16_CASES[:4], "half_even")
    assert away.tolist() == [2.0**-24, -(2.0**-24), 2.0**-23, 0.0]
    assert even.tolist() == [0.0, -0.0, 2.0**-23, 0.0]
    assert f32_to_f16(np.float32([2049.0]), "half_away")[0] == 2050.0
    assert f32_to_f16(np.float32([2049.0]), "half_even")[0] == 2048.0
    assert np.isinf(f32_to_f16(np.float32([65520.0]), "half_away")[0])
    assert f32_to_f16(np.float32([65519.0]), "half_away")[0] == 65504.0


@settings(max_examples=300, deadline=None)
@given(st.one_of(FP32_FINITE, st.floats(-2.0**-13, 2.0**-13, width=32), st.floats(-70000, 70000, width=32)),
       st.sampled_from(ROUNDINGS))
def test_f32_to_f16_property(v, mode):
    got = f32_to_f16(np.float32([v]), mode)[0]
    want = np.float16(ref.to_f16(v, mode))
    assert got.tobytes() == want.tobytes()


# ---------------------------------------------------------------------- fp32 -> fp16 -> int8
def _via_f16_ref(v, f16_mode, int8_mode):
    h = ref.to_f16(v, f16_mode)
    if not np.isnan(h):
        h = min(max(h, -128.0), 127.0)
    return ref.to_int8(h, int8_mode)


@pytest.mark.parametrize("mode", ROUNDINGS)
def test_double_rounding_differs_from_direct_above_64(mode):
    # search (64, 128) near the ties k + 0.5 for a value where fp32 -> fp16 -> int8 != fp32 -> int8
    cands = np.float32([k + 0.5 + s * j * 2.0**-10 for k in range(64, 128) for j in range(1, 40) for s in (-1, 1)])
    double = f32_to_int8_via_f16(cands, f16_rounding=mode, int8_rounding=mode)
    direct = f32_to_int8(cands, mode)
    differ = np.flatnonzero(double != direct)
    assert differ.size > 0
    for i in differ[:20]:
        v = cands[i]
        assert abs(v) > 64
        assert int(double[i]) == _via_f16_ref(v, mode, mode) != ref.to_int8(v, mode)
        assert abs(int(double[i]) - int(direct[i])) == 1
    # the spec's example region, explicitly: 64.51 -> fp16 64.5 -> 64 (even), direct 65;
    # 64.47 -> fp16 64.5 -> 65 (away), direct 64
    x = np.float32([64.51, 64.47])
    assert f32_to_int8_via_f16(x, f16_rounding="half_even", int8_rounding="half_even").tolist()[0] == 64
    assert f32_to_int8(x, "half_even").tolist()[0] == 65
    assert f32_to_int8_via_f16(x, f16_rounding="half_away", int8_rounding="half_away").tolist()[1] == 65
    assert f32_to_int8(x, "half_away").tolist()[1] == 64


@settings(max_examples=200, deadline=None)
@given(st.one_of(FP32_FINITE, st.floats(-300, 300, width=32)), st.sampled_from(ROUNDINGS),
       st.sampled_from(ROUNDINGS))
def test_f32_to_int8_via_f16_property(v, m1, m2):
    got = f32_to_int8_via_f16(np.float32([v]), f16_rounding=m1, int8_rounding=m2)[0]
    assert int(got) == _via_f16_ref(v, m1, m2)


# ---------------------------------------------------------------------- quant schemes
@pytest.mark.parametrize("scale_shape", [(1,), (8,), (1, 8)], ids=str)
@pytest.mark.parametrize("mode", ROUNDINGS)
def test_quantize_static(scale_shape, mode, rng):
    x = (rng.standard_normal((5, 8)) * 3).astype(np.float32)
    x[0, :4] = [0.25, 0.75, -1.25, 126.9]  # ties after scaling by 2
    scale = np.full(scale_shape, 2.0, np.float32) if scale_shape == (1,) else \
        (rng.random(scale_shape) * 40).astype(np.float32)
    got = quantize_static(x, scale, rounding=mode)
    s = scale.reshape(-1)
    want = [[ref.to_int8(np.float32(x[i, j] * s[j % s.size]), mode) for j in range(8)] for i in range(5)]
    assert got.dtype == np.int8 and got.tolist() == want
    with pytest.raises(ShapeError, match="scale: expected 1 or 8 elements"):
        quantize_static(x, np.ones(3, np.float32))


def _groups(shape, granularity, tile):
    idx = np.arange(int(np.prod(shape))).reshape(shape)
    if granularity == "per_tensor":
        return [idx.reshape(-1)]
    if granularity == "per_tile":
        return list(idx.reshape(-1, tile))
    return list(idx.reshape(-1, shape[-1]))


#: (granularity, x shape, tile_size)
SCHEME_CASES = [("per_tensor", (4, 16), None), ("per_token", (6, 32), None), ("per_token_head", (3, 4, 16), None),
                ("per_tile", (3, 512), 128), ("per_tile", (2, 2, 48), 16)]


@pytest.mark.parametrize("granularity,shape,tile", SCHEME_CASES, ids=lambda v: str(v))
def test_quantize_dynamic_matches_reference(granularity, shape, tile, rng):
    x = (rng.standard_normal(shape) * rng.choice([0.01, 1, 300], size=shape[:-1] + (1,))).astype(np.float32)
    if granularity != "per_tensor":
        x.reshape(-1, tile or shape[-1])[1] = 0  # one all-zero group
    q, scale = quantize_dynamic(x, granularity, tile_size=tile)
    want_q, want_s = ref.quantize_groups(x, _groups(shape, granularity, tile),
                                         reciprocal_127=granularity == "per_tile")  # docs/sources.md#quant_rounding Muls
    assert q.dtype == np.int8 and q.shape == x.shape
    assert_same_bytes(q.reshape(-1), want_q, "q")
    want_shape = {"per_tensor": (1,), "per_tile": (*shape[:-1], shape[-1] // (tile or 1))}.get(
        granularity, (*shape[:-1], 1))
    assert scale.dtype == np.float32 and scale.shape == want_shape
    assert_same_bytes(scale.reshape(-1), np.array(list(want_s.values()), np.float32), "scale")
    # amax broadcast shapes
    amax = group_amax(x, granularity, tile_size=tile)
    assert amax.shape == ((1,) if granularity == "per_tensor" else
                          (*shape[:-1], shape[-1] // tile, 1) if tile else (*shape[:-1], 1))
    # dequantize(quantize(x)) is within half a step of x (plus fp32 rounding of x * (1/scale))
    deq = dequantize(q, scale, granularity, tile_size=tile)
    assert deq.dtype == np.float32 and deq.shape == x.shape
    step = np.broadcast_to(scale.reshape(-1, 1), (scale.size, x.size // scale.size)).reshape(x.shape)
    err = np.abs(deq.astype(np.float64) - x.astype(np.float64))
    assert (err <= step.astype(np.float64) * 0.5 * (1 + 1e-4)).all()
    if granularity != "per_tensor":
        zero = x.reshape(-1, tile or shape[-1])[1]
        assert not zero.any() and not q.reshape(-1, tile or shape[-1])[1].any()
        assert scale.reshape(-1)[1] == 0  # ZERO_GROUP_POLICY
    assert "scale 0" in ZERO_GROUP_POLICY


def test_dynamic_scale_forms(rng):
    amax = (rng.random(4000) * 10).astype(np.float32)
    div = amax / np.float32(127)
    mul = amax * (np.float32(1) / np.float32(127))
    assert (div != mul).any()  # the two forms differ for some amax
    assert RECIPROCAL_127_GRANULARITIES == {"per_tile"}
    for g in GRANULARITIES:
        want = mul if g in RECIPROCAL_127_GRANULARITIES else div
        assert_same_bytes(dynamic_scale(amax, g), want, g)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=8, max_size=8), st.sampled_from(GRANULARITIES))
@example([3.279e-42, 1e-43, 0.0, -2e-45, 1.0, 0.0, 0.0, 0.0], "per_tensor")  # 1.0 keeps the scale normal
@example([3.279e-42, 1e-43, 0.0, -2e-45, 0.0, 0.0, 0.0, 0.0], "per_tensor")  # subnormal scale
@example([-3.279e-42, 1e-43, 0.0, -2e-45, 0.0, 0.0, 0.0, 0.0], "per_tile")
def test_dequant_error_bound_property(vals, granularity):
    """Half a step, wherever the kernel's fp32 reciprocal ``1 / scale`` is finite.

    The bound used to be asserted for every scale > 0 and failed for subnormal inputs
    (amax = 3.279e-42 -> scale 2.5e-44): the property was wrong, not the code. The quantizer
    multiplies by ``fp32(1 / scale)`` as the kernel does (docs/sources.md#quant_rounding), and for a scale
    below about 2**-128 that reciprocal overflows to inf, so every nonzero value saturates (127 / -128) and
    zeros stay 0 (``0 * inf`` is NaN -> 0): ``quantize_with_dequant_scale``'s documented fp32
    arithmetic, asserted here instead of the bound.
    """
    x = np.array(vals, np.float32).reshape(2, 4)
    tile = 2 if granularity == "per_tile" else None
    q, scale = quantize_dynamic(x, granularity, tile_size=tile)
    deq = dequantize(q, scale, granularity, tile_size=tile)
    s = np.repeat(scale.reshape(-1), x.size // scale.size).reshape(x.shape).astype(np.float64)
    err = np.abs(deq.astype(np.float64) - x)
    with np.errstate(divide="ignore", over="ignore"):
        invertible = (s > 0) & np.isfinite(np.float32(1) / s.astype(np.float32))
    assert (err[invertible] <= s[invertible] * 0.5 * (1 + 1e-4)).all()
    overflow = (s > 0) & ~invertible
    want = np.where(x > 0, 127, np.where(x < 0, -128, 0))
    assert (q[overflow] == want[overflow]).all()
    # scale 0: an all-zero group, or subnormals whose amax / 127 underflows (ZERO_GROUP_POLICY)
    live = s > 0
    assert not q[~live].any() and (np.abs(x[~live]) < 127 * 2.0**-149).all()


def test_underflowing_scale_is_a_zero_group():
    x = np.zeros((2, 4), np.float32)
    x[1, 3] = 7 * 2.0**-149  # subnormal: 7 * 2**-149 / 127 rounds to 0 in fp32
    for g in ("per_tensor", "per_token"):
        q, scale = quantize_dynamic(x, g)
        assert not q.any() and not scale.any()


def test_quantize_with_dequant_scale_and_errors(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    q, s = quantize_dynamic(x, "per_tile", tile_size=4)
    assert_same_bytes(quantize_with_dequant_scale(x, s, "per_tile", tile_size=4), q, "per_tile [3, 2]")
    assert_same_bytes(quantize_with_dequant_scale(x, s[..., None], "per_tile", tile_size=4), q, "[3, 2, 1]")
    with pytest.raises(ShapeError, match="scale: expected per-tile scales of shape"):
        quantize_with_dequant_scale(x, s[:, :1], "per_tile", tile_size=4)
    with pytest.raises(ShapeError, match="scale: expected per-token scales"):
        quantize_with_dequant_scale(x, np.ones(3, np.float32), "per_token")
    with pytest.raises(ShapeError, match="scale: expected 1 per-tensor scale"):
        dequantize(q, np.ones(2, np.float32), "per_tensor")
    with pytest.raises(ShapeError, match="tile_size"):
        quantize_dynamic(x, "per_tile", tile_size=3)
    with pytest.raises(ShapeError, match="tile_size"):
        group_amax(x, "per_tile")
    with pytest.raises(ValueError, match="granularity"):
        quantize_dynamic(x, "per_channel")


# ---------------------------------------------------------------------- combined rows
def test_row_constants():
    assert (NOPE_OFFSET, ROPE_OFFSET, SCALE_OFFSET, ROW_BYTES, NUM_TILES) == (0, 512, 640, 656, 4)
    assert ref.ROW_BYTES == ROW_BYTES == MLA_ROW.row_bytes
    small = CombinedRowFormat(d_nope=256, d_rope=32, tile_size=64)
    assert (small.rope_offset, small.scale_offset, small.row_bytes, small.num_tiles) == (256, 320, 336, 4)
    with pytest.raises(ShapeError, match="tile_size"):
        CombinedRowFormat(tile_size=100)


@pytest.mark.parametrize("byte,field", [
    (0, ("k_nope", 0, 0)), (127, ("k_nope", 127, 0)), (128, ("k_nope", 128, 0)), (511, ("k_nope", 511, 0)),
    (512, ("k_rope", 0, 0)), (513, ("k_rope", 0, 1)), (639, ("k_rope", 63, 1)),
    (640, ("scale", 0, 0)), (643, ("scale", 0, 3)), (644, ("scale", 1, 0)), (655, ("scale", 3, 3)),
])
def test_field_of_byte(byte, field):
    assert MLA_ROW.field_of_byte(byte) == field


@pytest.mark.parametrize("byte", [-1, 656])
def test_field_of_byte_range(byte):
    with pytest.raises(ShapeError, match=r"byte: expected a byte in \[0, 656\)"):
        MLA_ROW.field_of_byte(byte)


def _random_parts(lead, rng):
    nope = rng.integers(-128, 128, size=(*lead, 512)).astype(np.int8)
    rope = rng.standard_normal((*lead, 64)).astype(np.float32).astype(BF16)
    scales = (rng.random((*lead, 4)) * 0.1 + 1e-3).astype(np.float32)
    return nope, rope, scales


def test_pack_unpack_dequantize_vs_reference(rng):
    nope, rope, scales = _random_parts((3, 2), rng)
    rows = MLA_ROW.pack(nope, rope, scales)
    assert rows.dtype == np.int8 and rows.shape == (3, 2, 656)
    for idx in np.ndindex(3, 2):
        assert rows[idx].tobytes() == ref.encode_row(nope[idx], rope[idx], scales[idx])
    n2, r2, s2 = MLA_ROW.unpack(rows)
    assert_same_bytes(n2, nope, "k_nope")
    assert_same_bytes(r2, rope, "k_rope")
    assert_same_bytes(s2, scales, "scales")
    deq, r3, s3 = MLA_ROW.dequantize(rows[:, ::-1])  # non-contiguous rows
    for idx in np.ndindex(3, 2):
        want = ref.decode_row(rows[:, ::-1][idx].tobytes())
        assert_same_bytes(deq[idx], want[0], "dequantized k_nope")
        assert_same_bytes(r3[idx], want[1], "k_rope")
        assert_same_bytes(s3[idx], want[2], "scales")


@pytest.mark.parametrize("byte", [0, 511, 512, 513, 639, 640, 655])
def test_boundary_bytes_change_only_their_field(byte, rng):
    nope, rope, scales = _random_parts((), rng)
    row = MLA_ROW.pack(nope, rope, scales)
    bumped = row.copy()
    bumped.view(np.uint8)[byte] ^= 0x01
    field, elem, _ = MLA_ROW.field_of_byte(byte)
    before, after = MLA_ROW.unpack(row), MLA_ROW.unpack(bumped)
    for name, a, b in zip(("k_nope", "k_rope", "scale"), before, after, strict=True):
        changed = np.flatnonzero(a.view(np.uint8 if a.itemsize == 1 else f"u{a.itemsize}") !=
                                 b.view(np.uint8 if b.itemsize == 1 else f"u{b.itemsize}"))
        assert changed.tolist() == ([elem] if name == field else [])
    assert ref.decode_row(bumped.tobytes())[{"k_nope": 0, "k_rope": 1, "scale": 2}[field]].tobytes() != \
        ref.decode_row(row.tobytes())[{"k_nope": 0, "k_rope": 1, "scale": 2}[field]].tobytes()


def test_pack_unpack_errors(rng):
    nope, rope, scales = _random_parts((2,), rng)
    with pytest.raises(DTypeError, match="k_nope"):
        MLA_ROW.pack(nope.astype(np.int16), rope, scales)
    with pytest.raises(DTypeError, match="k_rope"):
        MLA_ROW.pack(nope, rope.astype(np.float32), scales)
    with pytest.raises(ShapeError, match="scales"):
        MLA_ROW.pack(nope, rope, scales[:, :3])
    with pytest.raises(ShapeError, match="leading dims"):
        MLA_ROW.pack(nope, rope[:1], scales)
    with pytest.raises(DTypeError, match="rows"):
        MLA_ROW.unpack(np.zeros((2, 656), np.int16))
    with pytest.raises(ShapeError, match="rows"):
        MLA_ROW.unpack(np.zeros((2, 655), np.int8))


# ---------------------------------------------------------------------- read_combined_cache
#: (layout, cache shape without the row, whether to store it with a non-contiguous block stride)
CACHE_CASES = [("PA_BSND", (3, 4, 1), False), ("PA_BSND", (3, 4, 1), True), ("BSND", (2, 3, 1), False),
               ("TND", (5, 1), False), ("TND", (5, 1), True)]


def _make_cache(lead, strided, rng):
    rows = MLA_ROW.pack(*_random_parts(lead, rng))  # [*lead, 656]
    if not strided:
        return rows
    padded = poisoned((lead[0], lead[1] + 1, *lead[2:], 656), np.int8)  # a padded block / token stride
    cache = padded[:, : lead[1]]
    cache[...] = rows
    assert not cache.flags.c_contiguous
    return cache


@pytest.mark.parametrize("layout,lead,strided", CACHE_CASES, ids=lambda v: str(v))
def test_read_combined_cache(layout, lead, strided, rng):
    cache = _make_cache(lead, strided, rng)
    before = cache.copy()
    rows = [cache[idx].tobytes() for idx in np.ndindex(*lead[:-1])]  # row order = slot order
    ref_rows = [ref.decode_row(r) for r in rows]

    k, r, s = read_combined_cache(cache)  # whole cache
    assert (k.shape, r.shape, s.shape) == ((*lead, 512), (*lead, 64), (*lead, 4))
    assert (k.dtype, r.dtype, s.dtype) == (np.float32, BF16, np.float32)
    for slot, idx in enumerate(np.ndindex(*lead[:-1])):
        assert_same_bytes(k[idx][0], ref_rows[slot][0], f"k_nope slot {slot}")
        assert_same_bytes(r[idx][0], ref_rows[slot][1], f"k_rope slot {slot}")
        assert_same_bytes(s[idx][0], ref_rows[slot][2], f"scales slot {slot}")

    for slot in range(len(rows)):
        k, r, s = read_combined_cache(cache, slot=slot)
        assert (k.shape, r.shape, s.shape) == ((1, 512), (1, 64), (1, 4))
        assert_same_bytes(k[0], ref_rows[slot][0], "k_nope")
        assert_same_bytes(r[0], ref_rows[slot][1], "k_rope")
        assert_same_bytes(s[0], ref_rows[slot][2], "scales")

    if len(lead) == 3:
        bs = lead[1]
        for block in range(lead[0]):
            k, r, s = read_combined_cache(cache, block=block)
            assert k.shape == (bs, 1, 512) and r.shape == (bs, 1, 64) and s.shape == (bs, 1, 4)
            for row in range(bs):
                assert_same_bytes(k[row, 0], ref_rows[block * bs + row][0], "block k_nope")
                assert_same_bytes(s[row, 0], ref_rows[block * bs + row][2], "block scales")
    assert_same_bytes(cache, before, "cache untouched")


def test_read_combined_cache_errors(rng):
    pa = MLA_ROW.pack(*_random_parts((2, 4, 1), rng))
    tnd = MLA_ROW.pack(*_random_parts((5, 1), rng))
    with pytest.raises(DTypeError, match="kv_cache: expected an int8"):
        read_combined_cache(pa.view(np.uint8))
    with pytest.raises(ShapeError, match="kv_cache"):
        read_combined_cache(pa[..., :655])
    with pytest.raises(ShapeError, match="kv_cache"):
        read_combined_cache(np.zeros((2, 4, 2, 656), np.int8))  # Nkv 2
    with pytest.raises(ShapeError, match="kv_cache"):
        read_combined_cache(np.zeros((4, 656), np.int8))
    with pytest.raises(ModeError, match="slot/block"):
        read_combined_cache(pa, slot=0, block=0)
    with pytest.raises(ModeError, match="block: expected None for a 3-D TND cache"):
        read_combined_cache(tnd, block=0)
    with pytest.raises(IndexRangeError, match=r"slot: expected a slot in \[0, 8\), got 8"):
        read_combined_cache(pa, slot=8)
    with pytest.raises(IndexRangeError, match=r"slot: expected a slot in \[0, 5\), got -1"):
        read_combined_cache(tnd, slot=-1)
    with pytest.raises(IndexRangeError, match=r"block: expected a block in \[0, 2\), got 2"):
        read_combined_cache(pa, block=2)


def test_inverse_scale_zero_policy_and_fp32_reciprocal():
    from ascend_emu.quant import inverse_scale
    sub = np.float32(1e-45)  # subnormal: its fp32 reciprocal overflows
    got = inverse_scale(np.array([[0.0], [2.0], [3.0], [sub]], np.float32))
    assert got.dtype == np.float32
    assert got[0, 0] == 0 and got[1, 0] == np.float32(0.5) and got[3, 0] == np.inf
    assert got[2, 0] == np.float32(np.float32(1.0) / np.float32(3.0))


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_ulp_distance_counts_representable_values_between(dtype):
    """Against an independent count: rank every finite 16-bit code by value (+0 and -0 share a
    rank); the distance of two codes is the difference of their ranks."""
    from ascend_emu.quant import ulp_distance

    codes = np.arange(1 << 16, dtype=np.uint16)
    with np.errstate(invalid="ignore"):  # NaN codes (dropped below)
        values = codes.view(dtype).astype(np.float64)
    finite = codes[np.isfinite(values)]
    distinct = np.unique(values[np.isfinite(values)])  # sorted; -0 and +0 are one value
    rank = dict(zip(distinct.tolist(), range(distinct.size), strict=True))
    rng = np.random.default_rng(5)
    a, b = rng.choice(finite, 4000), rng.choice(finite, 4000)
    expected = [abs(rank[float(x)] - rank[float(y)]) for x, y in
                zip(a.view(dtype).astype(np.float64), b.view(dtype).astype(np.float64), strict=True)]
    assert ulp_distance(a.view(dtype), b.view(dtype)).tolist() == expected
