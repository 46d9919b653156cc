"""npu_dynamic_quant against the loop reference in tests/reference/dynamic_quant.py: int8 and int4,
fp16 / bf16, smooth_scales and MoE group_index, byte-exact y and scale bits; ties, zero rows, the
doc's printed examples, the two stored-scale forms; the torch_npu drop-in and meta kernel; bad
arguments; int8 token_x and dequant_scale_x fed to the full-quant npu_mla_prolog_v3."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from tests.reference import dynamic_quant as ref

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def _assert_same(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_array_equal(_bits(g), _bits(w))


def _data(rng, shape, dtype, scale=3.0):
    return (rng.standard_normal(shape) * scale).astype(DTYPES[dtype])


def _smooth(rng, shape, dtype):
    return rng.uniform(0.25, 2.0, shape).astype(DTYPES[dtype])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("int4", [False, True])
def test_matches_reference(rng, dtype, smooth, int4):
    x = _data(rng, (3, 2, 24), dtype)
    s = _smooth(rng, (24,), dtype) if smooth else None
    got = ops.npu_dynamic_quant(x, smooth_scales=s, dst_type=16 if int4 else None)
    want = ref.dynamic_quant(x, s, int4=int4)
    _assert_same(got, want)
    assert got[0].shape == ((3, 2, 3) if int4 else (3, 2, 24)) and got[1].shape == (3, 2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("int4", [False, True])
def test_moe_groups_match_reference(rng, dtype, int4):
    """smooth_scales[i] on rows [group_index[i-1], group_index[i]), an empty group included."""
    x = _data(rng, (7, 16), dtype)
    s = _smooth(rng, (4, 16), dtype)
    gi = np.array([2, 2, 5, 7], np.int32)
    got = ops.npu_dynamic_quant(x, smooth_scales=s, group_index=gi, dst_type="quint4x2" if int4 else "int8")
    _assert_same(got, ref.dynamic_quant(x, s, gi, int4=int4))
    # each row really uses its own group's smooth row: row 2 (group 2) differs with group 1's row
    other = ref.dynamic_quant(x[2:3], s[1], int4=int4)
    assert not np.array_equal(got[0][2:3], other[0])


def test_scale_forms_differ_with_and_without_group_index(rng):
    """Without group_index the stored scale is amax * fp32(1/127) (db / multi-row kernels), with it
    1 / fp32(127 / amax) (MoE kernel): one group covering every row with a smooth of ones changes
    only the scale, and on this data the two forms differ by an ulp on some rows."""
    x = _data(rng, (64, 8), "bfloat16")
    ones = np.ones((8,), ml_dtypes.bfloat16)
    y_plain, s_plain = ops.npu_dynamic_quant(x, smooth_scales=ones)
    y_moe, s_moe = ops.npu_dynamic_quant(x, smooth_scales=ones[None], group_index=np.array([64], np.int32))
    _assert_same((y_plain, s_plain), ref.dynamic_quant(x, ones))
    _assert_same((y_moe, s_moe), ref.dynamic_quant(x, ones[None], np.array([64], np.int32)))
    np.testing.assert_array_equal(y_plain, y_moe)
    assert np.count_nonzero(s_plain != s_moe) > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_multiplier_not_division_by_the_scale(rng, dtype):
    """The kernel multiplies by fp32(127 / amax); the op-plugin golden divides by amax / 127. On
    16K elements the two round differently somewhere; the op follows the kernel."""
    x = _data(rng, (256, 64), dtype)
    got = ops.npu_dynamic_quant(x)
    want = ref.dynamic_quant(x)
    _assert_same(got, want)
    v = x.astype(np.float32)
    golden = np.rint(v / (np.abs(v).max(-1, keepdims=True) / np.float32(127)))
    assert np.count_nonzero(golden != want[0]) > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_ties_round_half_to_even(dtype):
    """v * (127 / amax) exactly k + 0.5: amax 127 gives the multiplier 1, amax 254 gives 0.5."""
    x = np.array([[127, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5],
                  [254, 1, 3, 5, 7, -1, -3, -5]], DTYPES[dtype])
    y, scale = ops.npu_dynamic_quant(x)
    np.testing.assert_array_equal(y, [[127, 0, 2, 2, 0, -2, -2, 126], [127, 0, 2, 2, 4, 0, -2, -2]])
    _assert_same((y, scale), ref.dynamic_quant(x))
    x4 = np.array([[7, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 6.5]], DTYPES[dtype])
    y4, _ = ops.npu_dynamic_quant(x4, dst_type=16)
    nibbles = [(int(y4[0, 0]) >> (4 * j)) & 0xF for j in range(8)]
    assert nibbles == [7, 0, 2, 2, 0, 0xE, 0xE, 6]  # -2 as a two's-complement nibble


@pytest.mark.parametrize("moe", [False, True])
def test_zero_rows_give_zero_values_and_scale(rng, moe):
    """An all-zero row (+0 and -0): the kernel's 127 / 0 is inf, both scale forms give exactly +0;
    its 0 * inf is NaN, emulated as 0."""
    x = _data(rng, (3, 16), "float16")
    x[1] = 0
    x[1, ::2] = -0.0
    kw = dict(smooth_scales=np.ones((1, 16), np.float16), group_index=np.array([3], np.int32)) if moe else {}
    y, scale = ops.npu_dynamic_quant(x, **kw)
    assert not y[1].any() and scale[1].view(np.uint32) == 0
    assert y[0].any() and scale[0] > 0
    _assert_same((y, scale), ref.dynamic_quant(x, kw.get("smooth_scales"), kw.get("group_index")))


def test_tiny_row_max_saturates(rng):
    """amax below 127 / FLT_MAX (bf16 keeps fp32's exponent range): 127 / amax overflows to inf,
    non-zero values give +-127, zeros 0; the scale is amax * fp32(1/127)."""
    x = np.array([[1e-38, -5e-39, 0.0, 2e-39]], ml_dtypes.bfloat16)
    y, scale = ops.npu_dynamic_quant(x)
    np.testing.assert_array_equal(y, [[127, -127, 0, 127]])
    _assert_same((y, scale), ref.dynamic_quant(x))


def test_doc_examples():
    """The doc's printed examples (torch_npu-npu_dynamic_quant.md): y exactly, scale to its 4 digits."""
    x = np.array([[0.7261, 0.3726, 0.9126], [0.9023, 0.9990, 0.1279], [0.8628, 0.6240, 0.9028]], np.float16)
    y, scale = ops.npu_dynamic_quant(x)
    np.testing.assert_array_equal(y, [[101, 52, 127], [115, 127, 16], [121, 88, 127]])
    np.testing.assert_allclose(scale, [0.0072, 0.0079, 0.0071], atol=5e-5)
    x = np.array([[0.6680, 0.9492, 0.0845], [0.1924, 0.5278, 0.1484], [0.6631, 0.9497, 0.0957]], np.float16)
    smooth = np.array([0.8042, 0.0884, 0.8901], np.float16)
    y, scale = ops.npu_dynamic_quant(x, smooth_scales=smooth)
    np.testing.assert_array_equal(y, [[127, 20, 18], [127, 38, 108], [127, 20, 20]])
    np.testing.assert_allclose(scale, [0.0042, 0.0012, 0.0042], atol=5e-5)


def test_drop_in_and_meta(rng):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu import to_numpy, to_torch

    x, s = _data(rng, (2, 3, 16), "bfloat16"), _smooth(rng, (16,), "bfloat16")
    for dst_type, int4 in ((None, False), (torch.int8, False), (torch.quint4x2, True)):
        y, scale = torch_npu.npu_dynamic_quant(to_torch(x), smooth_scales=to_torch(s), dst_type=dst_type)
        assert y.dtype == (torch.int32 if int4 else torch.int8) and scale.dtype == torch.float32
        _assert_same((to_numpy(y), to_numpy(scale)), ref.dynamic_quant(x, s, int4=int4))
    meta = torch.empty(2, 3, 16, dtype=torch.float16, device="meta")
    y, scale = torch.ops.npu.npu_dynamic_quant(meta, dst_type=torch.quint4x2)
    assert (y.shape, y.dtype, scale.shape, scale.dtype) == ((2, 3, 2), torch.int32, (2, 3), torch.float32)
    y, scale = torch.ops.npu.npu_dynamic_quant(meta)
    assert (y.shape, y.dtype, scale.shape) == ((2, 3, 16), torch.int8, (2, 3))
    with pytest.raises(ModeError, match="quant_mode"):
        torch_npu.npu_dynamic_quant(to_torch(x), quant_mode="pertensor")


def _reject_cases():
    f16, bf16 = np.float16, ml_dtypes.bfloat16
    x = np.ones((4, 16), f16)
    return [
        ("1-D x", dict(input=np.ones(16, f16)), ShapeError, "input"),
        ("fp32 x", dict(input=x.astype(np.float32)), DTypeError, "input"),
        ("int4 with H % 8", dict(input=np.ones((4, 12), f16), dst_type=16), ShapeError, "input"),
        ("dst_type int32", dict(input=x, dst_type=3), ModeError, "dst_type"),
        ("dst_type float8", dict(input=x, dst_type="float8_e4m3fn"), ModeError, "dst_type"),
        ("quant_mode", dict(input=x, quant_mode="pertensor"), ModeError, "quant_mode"),
        ("dst_type_max", dict(input=x, dst_type_max=448.0), ModeError, "dst_type_max"),
        ("smooth dtype", dict(input=x, smooth_scales=np.ones(16, bf16)), DTypeError, "smooth_scales"),
        ("smooth length", dict(input=x, smooth_scales=np.ones(15, f16)), ShapeError, "smooth_scales"),
        ("2-D smooth without group_index", dict(input=x, smooth_scales=np.ones((1, 16), f16)), ShapeError,
         "smooth_scales"),
        ("group_index without smooth", dict(input=x, group_index=np.array([4], np.int32)), ShapeError,
         "smooth_scales"),
        ("group_index int64", dict(input=x, smooth_scales=np.ones((2, 16), f16),
                                   group_index=np.array([2, 4], np.int64)), DTypeError, "group_index"),
        ("group_index length", dict(input=x, smooth_scales=np.ones((2, 16), f16),
                                    group_index=np.array([4], np.int32)), ShapeError, "group_index"),
        ("group_index decreasing", dict(input=x, smooth_scales=np.ones((3, 16), f16),
                                        group_index=np.array([3, 1, 4], np.int32)), IndexRangeError, "group_index"),
        ("group_index short of rows", dict(input=x, smooth_scales=np.ones((2, 16), f16),
                                           group_index=np.array([1, 3], np.int32)), IndexRangeError, "group_index"),
        ("group_index past rows", dict(input=x, smooth_scales=np.ones((2, 16), f16),
                                       group_index=np.array([2, 5], np.int32)), IndexRangeError, "group_index"),
        ("too many groups", dict(input=np.ones((1, 8), f16), smooth_scales=np.ones((1025, 8), f16),
                                 group_index=np.ones(1025, np.int32)), ShapeError, "smooth_scales"),
    ]


@pytest.mark.parametrize("what,kw,err,name", _reject_cases(), ids=[c[0] for c in _reject_cases()])
def test_rejects(what, kw, err, name):
    with pytest.raises(err, match=rf"^{name}: expected"):
        ops.npu_dynamic_quant(**kw)


def test_feeds_the_full_quant_prolog():
    """The quantized MLA prolog's token_x / dequant_scale_x come from npu_dynamic_quant: int8
    ``[T, He]`` and fp32 ``[T]``, which npu_mla_prolog_v3 takes as they are (the same outputs as
    with the ``[T, 1]`` form)."""
    from tests.test_mla_prolog import DR, HCKV, HE, QuantData, call_quant

    qdata, modes, t = QuantData(np.random.default_rng(11)), (2, 0, 0), 3
    hidden = (np.random.default_rng(3).standard_normal((t, HE)) * 2.0).astype(ml_dtypes.bfloat16)
    token_x, scale = ops.npu_dynamic_quant(hidden)
    assert (token_x.shape, token_x.dtype, scale.shape, scale.dtype) == ((t, HE), np.int8, (t,), np.float32)
    _, sin, cos = qdata.tokens(modes, (t,))
    outs = []
    for dq in (scale, scale.reshape(t, 1)):
        kv, kr = np.zeros((1, 16, 1, HCKV), ml_dtypes.bfloat16), np.zeros((1, 16, 1, DR), ml_dtypes.bfloat16)
        out = call_quant(qdata, modes, token_x, sin, cos, kv, kr, np.arange(t, dtype=np.int64), dequant_scale_x=dq)
        outs.append([*out, kv, kr])
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    assert np.isfinite(outs[0][0].astype(np.float32)).all() and outs[0][0].any()


def test_non_contiguous_and_empty_inputs(rng):
    """The doc allows non-contiguous x and empty tensors."""
    x = _data(rng, (16, 6), "float16").T  # [6, 16], strided
    _assert_same(ops.npu_dynamic_quant(x), ref.dynamic_quant(np.ascontiguousarray(x)))
    empty = np.zeros((2, 0, 16), np.float16)
    y, scale = ops.npu_dynamic_quant(empty, dst_type=16)
    assert (y.shape, y.dtype, scale.shape, scale.dtype) == ((2, 0, 2), np.int32, (2, 0), np.float32)
