"""npu_dynamic_mx_quant_with_dual_axis (Ascend 950) against the loop MX reference in
tests/reference/formats_950.py (byte-exact FP8 codes and E8M0 scales, both axes), the doc's
printed example, the SoC gate, the contract errors and the drop-in with its meta shapes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, ModeError, ShapeError
from tests.reference import formats_950 as ref

A950 = "Ascend950PR_9599"
NOT_950 = ["Ascend910B2", "Ascend910_9391"]
FP8 = {"float8_e4m3fn": (292, 24), "float8_e5m2": (291, 23)}


@pytest.fixture
def a950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)


@pytest.mark.parametrize("name", list(FP8))
@pytest.mark.parametrize("scale_alg", [0, 1])
@pytest.mark.parametrize("shape", [(70, 40), (2, 33, 96), (2, 1, 3, 65)])
def test_dual_axis_matches_reference(a950, name, scale_alg, shape):
    rng = np.random.default_rng(sum(shape) + scale_alg)
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(ml_dtypes.bfloat16)
    y1, s1, y2, s2 = ops.npu_dynamic_mx_quant_with_dual_axis(x, dst_type=FP8[name][1], scale_alg=scale_alg)
    for y, s, axis in ((y1, s1, -1), (y2, s2, -2)):
        want_codes, want_scale = ref.mx_quantize(x.astype(np.float32), name, axis, 32, scale_alg)
        assert y.dtype == np.dtype(getattr(ml_dtypes, name)) and y.shape == x.shape
        assert s.dtype == np.uint8 and s.shape == want_scale.shape
        np.testing.assert_array_equal(y.view(np.uint8), want_codes)
        np.testing.assert_array_equal(s, want_scale)
    m, n = shape[-2:]
    pairs = lambda length: (math.ceil(length / 32) + 1) // 2  # noqa: E731  (the doc's shape rule)
    assert s1.shape == shape[:-1] + (pairs(n), 2)
    assert s2.shape == shape[:-2] + (pairs(m), n, 2)


def test_dual_axis_doc_example(a950):
    """The doc's printed float8 example: input [[0, 8, 64, 512]]."""
    x = np.array([[0, 8, 64, 512]], ml_dtypes.bfloat16)
    y1, s1, y2, s2 = ops.npu_dynamic_mx_quant_with_dual_axis(x, dst_type=24)
    np.testing.assert_array_equal(y1.astype(np.float32), [[0, 4, 32, 256]])
    e8m0 = ml_dtypes.float8_e8m0fnu
    np.testing.assert_array_equal(s1.view(e8m0).astype(np.float32), [[[2.0, 2.0 ** -127]]])
    assert s2.shape == (1, 4, 2)
    np.testing.assert_array_equal(s2[0, :, 0].view(e8m0).astype(np.float32), [2.0 ** -127, 2.0 ** -5, 0.25, 2.0])
    assert (s2[..., 1] == 0).all()


def test_dual_axis_zeros_give_zero_scale_bytes(a950):
    """op-plugin's golden: zeros [1, 2, 2] -> codes 0 and scale bytes 0 on both axes."""
    y1, s1, y2, s2 = ops.npu_dynamic_mx_quant_with_dual_axis(np.zeros((1, 2, 2), ml_dtypes.bfloat16), dst_type=23)
    assert s1.shape == (1, 2, 1, 2) and s2.shape == (1, 1, 2, 2)
    for a in (y1.view(np.uint8), s1, y2.view(np.uint8), s2):
        assert not a.any()


@pytest.mark.parametrize("soc", NOT_950)
def test_dual_axis_rejected_on_a2_a3(monkeypatch, soc):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    with pytest.raises(ModeError, match=rf"^dst_type: When dst_type is 24 .*soc version {soc} "):
        ops.npu_dynamic_mx_quant_with_dual_axis(np.ones((2, 32), np.float16), dst_type=24)


@pytest.mark.parametrize("kwargs, err, text", [
    (dict(dst_type=296), ModeError, "^dst_type: expected an FP8 code"),
    (dict(dst_type=24, round_mode="floor"), ModeError, "^round_mode: expected"),
    (dict(dst_type=24, scale_alg=2), ModeError, "^scale_alg: expected"),
    (dict(dst_type=24, dst_type_max=6.0), ModeError, "^dst_type_max: expected"),
])
def test_dual_axis_contract_errors(a950, kwargs, err, text):
    with pytest.raises(err, match=text):
        ops.npu_dynamic_mx_quant_with_dual_axis(np.ones((2, 32), np.float16), **kwargs)


def test_dual_axis_input_dtype_and_rank(a950):
    with pytest.raises(DTypeError, match="^input: expected"):
        ops.npu_dynamic_mx_quant_with_dual_axis(np.ones((2, 32), np.float32), dst_type=24)
    with pytest.raises(ShapeError, match="^input: expected 2 to 7 dims"):
        ops.npu_dynamic_mx_quant_with_dual_axis(np.ones(32, np.float16), dst_type=24)
    with pytest.raises(ShapeError, match="^input: expected 2 to 7 dims"):
        ops.npu_dynamic_mx_quant_with_dual_axis(np.ones((1,) * 8, np.float16), dst_type=24)


def test_dual_axis_drop_in_and_meta(a950):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu import to_torch

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 40, 70)).astype(ml_dtypes.bfloat16)
    want = ops.npu_dynamic_mx_quant_with_dual_axis(x, dst_type=24)
    got = torch_npu.npu_dynamic_mx_quant_with_dual_axis(to_torch(x), dst_type=torch.float8_e4m3fn, dst_type_max=None)
    assert [t.dtype for t in got] == [torch.float8_e4m3fn, torch.uint8] * 2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.cpu().view(torch.uint8).numpy(), w.view(np.uint8))
    meta = torch.empty(3, 40, 70, dtype=torch.bfloat16, device="meta")
    shapes = [tuple(t.shape) for t in torch.ops.npu.npu_dynamic_mx_quant_with_dual_axis(meta, dst_type=23)]
    assert shapes == [(3, 40, 70), (3, 40, 2, 2), (3, 40, 70), (3, 1, 70, 2)]


# ------------------------------------------------------------ npu_dtype_cast: general and int4
from tests.reference import cast as cref  # noqa: E402
from ascend_emu.errors import IndexRangeError  # noqa: E402

CODES = {"bool": 11, "uint8": 0, "int8": 1, "int16": 2, "int32": 3, "int64": 4, "float16": 5, "float32": 6,
         "float64": 7, "complex64": 9, "complex128": 10, "bfloat16": 15}


def _values(dtype) -> np.ndarray:
    rng = np.random.default_rng(11)
    v = [0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.7, 126.9, -128.9, np.nan, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11,
         65504.0, 65520.0, 3.0e-8, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8]
    with np.errstate(over="ignore"):  # 65520 is Inf in fp16
        return np.concatenate([np.array(v), rng.standard_normal(40) * 50]).astype(dtype)


@pytest.mark.parametrize("src", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("dst", ["float16", "bfloat16", "float32", "int8", "int32", "bool"])
@pytest.mark.parametrize("soc", [None, A950])
def test_general_cast_matches_reference(monkeypatch, src, dst, soc):
    """Every SoC: floats round half to even, to integers truncate with NaN -> 0, to bool != 0."""
    if soc:
        monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    x = _values(ml_dtypes.bfloat16 if src == "bfloat16" else np.dtype(src))
    if dst in ("int8", "int32"):
        x = x[np.isnan(x.astype(np.float64)) | (np.abs(x.astype(np.float64)) < 128)]
    got = ops.npu_dtype_cast(x, CODES[dst])
    want = cref.cast(x, dst)
    assert got.shape == x.shape and got.dtype.name == dst
    if dst in ("float16", "bfloat16"):
        got = got.view(np.uint16)
    np.testing.assert_array_equal(got, want)


def test_general_cast_integers_and_complex():
    x = np.array([-128, -1, 0, 7, 127], np.int32)
    np.testing.assert_array_equal(ops.npu_dtype_cast(x, 1), x.astype(np.int8))
    np.testing.assert_array_equal(ops.npu_dtype_cast(x, 6), cref.cast(x, "float32"))
    np.testing.assert_array_equal(ops.npu_dtype_cast(np.array([1, 0, 2], np.uint8), 11), [True, False, True])
    c = np.array([1 + 2j, -3.5j], np.complex64)
    got = ops.npu_dtype_cast(c, 10)
    assert got.dtype == np.complex128 and (got == c.astype(np.complex128)).all()
    big = np.array([2 ** 24 + 1, -(2 ** 24) - 3], np.int64)  # through fp32 to bf16 (torch's CPU cast)
    np.testing.assert_array_equal(ops.npu_dtype_cast(big, 15).view(np.uint16), cref.cast(big, "bfloat16"))


@pytest.mark.parametrize("x, code, err, text", [
    (np.array([1.0, 200.0], np.float32), 1, IndexRangeError, r"^self: expected values that truncate into \[-128, 127\]"),
    (np.array([1.0, np.inf], np.float32), 3, IndexRangeError, "^self: expected values that truncate"),
    (np.array([-1.0], np.float32), 0, IndexRangeError, r"^self: expected values that truncate into \[0, 255\]"),
    (np.array([300], np.int32), 1, IndexRangeError, r"^self: expected values in \[-128, 127\]"),
    (np.array([1j], np.complex64), 6, ModeError, "^dtype: expected a complex dtype"),
])
def test_general_cast_rejects_undefined_values(x, code, err, text):
    with pytest.raises(err, match=text):
        ops.npu_dtype_cast(x, code)


def test_int4_packing_on_950(a950):
    rng = np.random.default_rng(5)
    x = rng.integers(-8, 8, (3, 2, 10)).astype(np.int32)
    got = ops.npu_dtype_cast(x, 285)
    assert got.dtype == np.uint8 and got.shape == (3, 2, 5)
    np.testing.assert_array_equal(got, cref.pack_int4(x))
    np.testing.assert_array_equal(ops.npu_dtype_cast(np.array([[-8, 7, 1, -1]], np.int32), 285), [[0x78, 0xF1]])


@pytest.mark.parametrize("x, err, text", [
    (np.array([[1, 2, 3]], np.int32), ShapeError, "^self: expected a last dim divisible by 2"),
    (np.array([[1, 8]], np.int32), IndexRangeError, r"^self: expected int4 values in \[-8, 7\]"),
    (np.array([[1, 2]], np.int64), DTypeError, "^self: expected an int32 array"),
])
def test_int4_rejects(a950, x, err, text):
    with pytest.raises(err, match=text):
        ops.npu_dtype_cast(x, 285)


@pytest.mark.parametrize("soc", NOT_950)
def test_int4_rejected_on_a2_a3(monkeypatch, soc):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    with pytest.raises(ModeError, match=rf"^dtype: When dtype is 285 \(int4\), not support on this soc version {soc} "):
        ops.npu_dtype_cast(np.zeros((2, 4), np.int32), 285)


def test_dtype_cast_drop_in_autograd_and_meta(monkeypatch):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    x = torch.tensor([[0.5, -1.25, 3.0]], requires_grad=True)
    y = torch_npu.npu_dtype_cast(x, torch.half)
    assert y.dtype == torch.float16 and y.requires_grad and "NpuDtypeCastBackward" in str(y.grad_fn)
    y.backward(torch.tensor([[1.0, 2.0, 65504.0]], dtype=torch.half))
    assert x.grad.dtype == torch.float32 and x.grad.tolist() == [[1.0, 2.0, 65504.0]]
    x2 = torch.randn(3, 3, requires_grad=True)
    y2 = torch_npu.npu_dtype_cast(x2, torch.bfloat16)
    (g,) = torch.autograd.grad(y2, x2, torch.ones_like(y2))
    assert g.grad_fn is None and g.dtype == torch.float32
    (g,) = torch.autograd.grad(y2, x2, torch.ones_like(y2), create_graph=True)
    assert g.grad_fn is not None
    i = torch_npu.npu_dtype_cast(torch.tensor([0, 0.5, -1.0]), dtype=torch.int)  # the doc's example
    assert i.dtype == torch.int32 and i.tolist() == [0, 0, -1]
    meta = torch.empty(4, 6, dtype=torch.int32, device="meta")
    assert torch.ops.npu.npu_dtype_cast(meta, 6).dtype == torch.float32
    with pytest.raises(ModeError, match="^dtype: When dtype is 285"):
        torch.ops.npu.npu_dtype_cast(meta, 285)
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)
    out = torch.ops.npu.npu_dtype_cast(meta, 285)
    assert out.shape == (4, 3) and out.dtype == torch.uint8
    packed = torch_npu.npu_dtype_cast(torch.tensor([[-8, 7, 1, -1]], dtype=torch.int32), 285)
    assert packed.dtype == torch.uint8 and packed.cpu().tolist() == [[0x78, 0xF1]]
    # op-plugin's test_dtype_cast.py: torch_npu.int4 with input_dtype=torch.int32, [1, 2, 3, 4] -> [33, 67]
    packed = torch_npu.npu_dtype_cast(torch.tensor([1, 2, 3, 4], dtype=torch.int32), dtype=torch_npu.int4,
                                      input_dtype=torch.int32)
    assert packed.cpu().tolist() == [33, 67]


def test_dtype_names_stand_for_their_codes():
    """How a recorded call stores a torch dtype: its name."""
    x = np.array([1.5, -2.5], np.float32)
    for name in ("float16", "torch.float16"):
        np.testing.assert_array_equal(ops.npu_dtype_cast(x, name), x.astype(np.float16))
    with pytest.raises(ModeError, match="^dtype: expected a dtype code"):
        ops.npu_dtype_cast(x, "torch.nonsense")
