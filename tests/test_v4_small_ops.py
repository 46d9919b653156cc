"""DeepSeek-V4 small ops (ascend_emu.ops.v4_small) against tests/reference/v4_small.py: results bit
for bit, the golden's listed slot mappings, and rejected calls that write nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from tests.reference import v4_small as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


# ----------------------------------------------------------------------------- rms_norm_dynamic_quant
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)])
@pytest.mark.parametrize("extras", ["none", "smooth", "beta", "both"])
def test_rms_norm_dynamic_quant_matches_reference(dtype, extras):
    rng = np.random.default_rng(3)
    x = rng.uniform(-10, 10, (3, 2, 320)).astype(dtype)
    gamma = rng.uniform(0, 1, 320).astype(dtype)
    smooth = rng.uniform(0, 1, 320).astype(dtype) if extras in ("smooth", "both") else None
    beta = rng.uniform(-1, 1, 320).astype(dtype) if extras in ("beta", "both") else None
    y, scale = ops.npu_rms_norm_dynamic_quant(x, gamma, smooth_scale=smooth, beta=beta, epsilon=1e-6)
    want_y, want_s = ref.rms_norm_dynamic_quant(x, gamma, smooth, beta, 1e-6)
    _same(y, want_y)
    _same(scale, want_s)
    assert y.dtype == np.int8 and scale.shape == (3, 2)


def test_rms_norm_dynamic_quant_zero_row_and_errors():
    x = np.zeros((2, 128), BF16)
    x[1] = 1
    y, scale = ops.npu_rms_norm_dynamic_quant(x, np.ones(128, BF16))
    assert scale[0] == 0 and not y[0].any() and (y[1] == 127).all()
    with pytest.raises(ShapeError, match="gamma"):
        ops.npu_rms_norm_dynamic_quant(x, np.ones(64, BF16))
    with pytest.raises(DTypeError, match="beta"):
        ops.npu_rms_norm_dynamic_quant(x, np.ones(128, BF16), beta=np.ones(128, np.float32))
    with pytest.raises(DTypeError, match="x"):
        ops.npu_rms_norm_dynamic_quant(x.astype(np.float32), np.ones(128, np.float32))
    with pytest.raises(DTypeError, match="epsilon"):
        ops.npu_rms_norm_dynamic_quant(x, np.ones(128, BF16), epsilon=-1.0)


# ----------------------------------------------------------------------------- inplace_partial_rotary_mul
def _rope_case(rng, x_shape, r_shape, dtype, r_dtype):
    x = rng.uniform(1, 10, x_shape).astype(dtype)
    cos = rng.uniform(-10, 10, r_shape).astype(r_dtype)
    sin = rng.uniform(-10, 10, r_shape).astype(r_dtype)
    return x, cos, sin


@pytest.mark.parametrize("lo,hi,r_lead,r_dtype", [
    (448, 512, (2, 1, 1), BF16),       # the golden's [448, 512], cos [B, 1, 1, 64]
    (484, 512, (1, 1, 3), BF16),       # [484, 512] with per-head tables
    (64, 128, (2, 4, 1), np.float32),  # mixed precision, slice inside D: the tail stays untouched
])
@pytest.mark.parametrize("negate_sin", [False, True])
def test_partial_rotary_matches_reference(lo, hi, r_lead, r_dtype, negate_sin):
    rng = np.random.default_rng(lo + hi)
    x, cos, sin = _rope_case(rng, (2, 4, 3, 512), (*r_lead, hi - lo), BF16, r_dtype)
    want = ref.partial_rotary(x, cos, sin, lo, hi, negate_sin)
    got = x
    returned = ops.inplace_partial_rotary_mul(got, cos, sin, "interleave", [lo, hi],  # type: ignore[func-returns-value]
                                              negate_sin=negate_sin)
    assert returned is None  # in place, as the op's schema returns nothing
    _same(got, want)


def test_partial_rotary_inverse_with_doubled_frequencies():
    """DeepSeek-V4's tables hold each frequency twice; RoPE by +sin then -sin is close to the identity."""
    rng = np.random.default_rng(5)
    theta = rng.uniform(0, 6.28, 32)
    cos = np.repeat(np.cos(theta), 2).astype(np.float32).reshape(1, 1, 1, 64)
    sin = np.repeat(np.sin(theta), 2).astype(np.float32).reshape(1, 1, 1, 64)
    x = rng.uniform(-1, 1, (1, 2, 1, 512)).astype(BF16)
    orig = x.copy()
    ops.inplace_partial_rotary_mul(x, cos, sin, "interleave", [448, 512])
    assert not np.array_equal(x, orig)
    ops.inplace_partial_rotary_mul(x, cos, sin, "interleave", [448, 512], negate_sin=True)
    np.testing.assert_allclose(x.astype(np.float32), orig.astype(np.float32), atol=2e-2)
    _same(x[..., :448], orig[..., :448])


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(rotary_mode="half"), ModeError, "rotary_mode"),
    (dict(partial_slice=[448, 511]), ModeError, "partial_slice"),
    (dict(partial_slice=[448, 520]), ModeError, "partial_slice"),
    (dict(partial_slice=[448]), ModeError, "partial_slice"),
    (dict(cos_shape=(1, 1, 1, 32)), ShapeError, "r1"),
    (dict(cos_shape=(3, 1, 1, 64)), ShapeError, "r1"),
    (dict(cos_dtype=np.float16), DTypeError, "r1"),
    (dict(negate_sin=1), ModeError, "negate_sin"),
])
def test_partial_rotary_rejects_and_writes_nothing(kwargs, err, match):
    rng = np.random.default_rng(9)
    cos_shape = kwargs.pop("cos_shape", (1, 1, 1, 64))
    x, cos, sin = _rope_case(rng, (2, 1, 1, 512), cos_shape, BF16, kwargs.pop("cos_dtype", BF16))
    before = x.copy()
    call = dict(rotary_mode="interleave", partial_slice=[448, 512])
    call.update(kwargs)
    with pytest.raises(err, match=match):
        ops.inplace_partial_rotary_mul(x, cos, sin, **call)
    _same(x, before)


def test_partial_rotary_rejects_tables_inside_x():
    x = np.ones((1, 1, 1, 512), BF16)
    with pytest.raises(ShapeError, match="memory separate"):
        ops.inplace_partial_rotary_mul(x, x[..., :64], x[..., 64:128], "interleave", [448, 512])


# ----------------------------------------------------------------------------- compressor_metadata
def _rope(rows=2048, d=64, dtype=BF16):
    values = np.arange(rows * d, dtype=np.float32).reshape(rows, d)
    return values.astype(dtype), (values * 0.25).astype(dtype)


def _meta(case, fmt, n, rope=None):
    if rope is None:  # as the golden's _make_rope: enough rows for every position
        top = max(s + case["cu"][i + 1] - case["cu"][i] for i, s in enumerate(case["start"]))
        rope = _rope(rows=max(2048, top + 1))
    cos, sin = rope
    cu = np.array(case["cu"], np.int32)
    start = np.array(case["start"], np.int32)
    table = np.array(case["table"], np.int32)
    return (cos, sin, cu, start, table, 128, fmt, case["ratio"]), n, len(case["start"])


INVALID = (-1, 127)
#: Cases and expected slot mappings listed in vllm-ascend's golden test_compressor_metadata.py.
GOLDEN_CASES = [
    (dict(ratio=4, cu=(0, 131), start=(0,), table=((1, 0, 0, 0, 0, 0),)),
     [(1, o) for o in range(32)] + [INVALID]),
    (dict(ratio=4, cu=(0, 131, 262), start=(0, 0), table=((1, 0, 0, 0, 0, 0), (3, 0, 0, 0, 0, 0))),
     [(1, o) for o in range(32)] + [(3, o) for o in range(32)] + [INVALID] * 3),
    (dict(ratio=4, cu=(0, 2, 4, 6, 8), start=(133, 0, 0, 0), table=((1, 0, 0, 0, 0, 0),) + ((0,) * 6,) * 3),
     [INVALID] * 2),
    (dict(ratio=4, cu=(0, 2, 4), start=(130, 133), table=((5, 0, 0, 0, 0, 0), (6, 0, 0, 0, 0, 0))),
     [(5, 32)] + [INVALID] * 2),
    (dict(ratio=128, cu=(0, 131), start=(0,), table=((2,),)), [(2, 0), INVALID]),
    (dict(ratio=128, cu=(0, 131, 262), start=(0, 0), table=((2,), (4,))), [(2, 0), (4, 0)] + [INVALID] * 2),
    (dict(ratio=128, cu=(0, 2, 4), start=(254, 257), table=((7,), (8,))), [(7, 1), INVALID]),
    (dict(ratio=4, cu=(0, 8), start=(508,), table=((10, 11),)), [(10, 127), (11, 0)]),
    (dict(ratio=128, cu=(0, 256), start=(16256,), table=((20, 21),)), [(20, 127), (21, 0)]),
]
MIXED_CASES = [
    (dict(ratio=4, cu=(0, 131, 151, 171, 178), start=(0, 125, 508, 640),
          table=tuple(tuple(range(10 * k, 10 * k + 6)) for k in (1, 2, 3, 4))), 48),
    (dict(ratio=128, cu=(0, 131, 391, 521, 531), start=(0, 127, 254, 512),
          table=tuple(tuple(range(10 * k, 10 * k + 4)) for k in (5, 6, 7, 8))), 10),
    (dict(ratio=4, cu=tuple(range(0, 21, 2)), start=tuple(range(126, 136)),
          table=tuple(tuple(range(10 * k, 10 * k + 4)) for k in range(9, 19))), 12),
]


@pytest.mark.parametrize("case,expected", GOLDEN_CASES)
def test_compressor_metadata_golden_slots(case, expected):
    args, n, reqs = _meta(case, 2, len(expected))
    cos, sin, slot = ops.compressor_metadata(*args, n, reqs)
    _same(slot, np.array(expected, np.int32))
    want = ref.compressor_metadata(*args, n)
    _same(cos, want[0])
    _same(sin, want[1])
    flat = np.array([-1 if b < 0 else b * 128 + o for b, o in expected], np.int32)
    args2, _, _ = _meta(case, 1, n)
    _same(ops.compressor_metadata(*args2, n, reqs)[2], flat)


@pytest.mark.parametrize("case,n", MIXED_CASES)
@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize("rope_dtype", [BF16, np.dtype(np.float32)])
def test_compressor_metadata_matches_reference(case, n, fmt, rope_dtype):
    args, n, reqs = _meta(case, fmt, n, _rope(dtype=rope_dtype))
    got = ops.compressor_metadata(*args, n, reqs)
    want = ref.compressor_metadata(*args, n)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    outs = (np.full_like(want[0], 7), np.full_like(want[1], 7), np.full_like(want[2], 7))
    res = ops.compressor_metadata_out(*args, reqs, *outs)
    assert all(r is o for r, o in zip(res, outs, strict=True))
    for g, w in zip(outs, want, strict=True):
        _same(g, w)


def test_compressor_metadata_invalid_rows():
    # a negative block id, a row past the table, a rope row past the table: all invalid rows
    case = dict(ratio=4, cu=(0, 8, 16, 24), start=(0, 508, 4000), table=((-1, 3), (4, 5), (6, 7)))
    rope = _rope(rows=1024)
    args, n, reqs = _meta(case, 2, 8, rope)
    cos, sin, slot = ops.compressor_metadata(*args, n, reqs)
    want = ref.compressor_metadata(*args, n)
    _same(slot, want[2])
    _same(cos, want[0])
    assert (slot[:2] == INVALID).all() and (cos[:2] == 1).all() and (sin[:2] == 0).all()


def test_compressor_metadata_rejects_and_out_untouched():
    case = dict(ratio=4, cu=(0, 8), start=(0,), table=((1, 2),))
    args, n, reqs = _meta(case, 2, 2)
    outs = (np.zeros((2, 1, 1, 64), BF16), np.zeros((2, 1, 1, 64), BF16), np.zeros((2, 2), np.int32))
    bad_cu = list(args)
    bad_cu[2] = np.array([2, 8], np.int32)  # not from 0
    with pytest.raises(IndexRangeError, match="cu_seqlens"):
        ops.compressor_metadata_out(*bad_cu, reqs, *outs)
    two = list(args)
    two[2], two[3], two[4] = np.array([0, 8, 4], np.int32), np.zeros(2, np.int32), np.ones((2, 2), np.int32)
    with pytest.raises(IndexRangeError, match="non-decreasing"):  # non-monotone (vllm-ascend #14122)
        ops.compressor_metadata_out(*two, 2, *outs)
    with pytest.raises(ModeError, match="slot_mapping_format"):
        ops.compressor_metadata(*args[:6], 0, args[7], n, reqs)
    with pytest.raises(ShapeError, match="slot_mapping_out"):
        ops.compressor_metadata_out(*args, reqs, outs[0], outs[1], np.zeros(2, np.int32))
    with pytest.raises(ShapeError, match="memory separate"):
        ops.compressor_metadata_out(*args, reqs, outs[0], outs[0], outs[2])
    with pytest.raises(DTypeError, match="kv_block_table"):
        ops.compressor_metadata(*args[:4], args[4].astype(np.int64), *args[5:], n, reqs)
    big = list(args)
    big[4] = np.array([[2**30, 1]], np.int32)
    big[6] = 1
    with pytest.raises(IndexRangeError, match="fit int32"):
        ops.compressor_metadata(*big, n, reqs)
    for o in outs:
        assert not o.view(np.uint8).any()


def test_compressor_metadata_negative_start_has_no_rows():
    # graph-capture padding: a request with start_pos -1 completes no compressed rows (the golden)
    case = dict(ratio=4, cu=(0, 8, 16), start=(-1, 0), table=((9, 9), (3, 4)))
    args, n, reqs = _meta(case, 2, 3)
    _, _, slot = ops.compressor_metadata(*args, n, reqs)
    _same(slot, np.array([(3, 0), (3, 1), INVALID], np.int32))
    _same(slot, ref.compressor_metadata(*args, n)[2])


def test_hw_backend_says_these_are_not_torch_npu_ops():
    from ascend_emu.errors import BackendUnavailable

    x = np.ones((1, 1, 1, 512), BF16)
    r = np.ones((1, 1, 1, 64), BF16)
    with ops.backend("hw"), pytest.raises(BackendUnavailable, match="not a torch_npu op"):
        ops.inplace_partial_rotary_mul(x, r, r, "interleave", [448, 512])
    assert (x == 1).all()
