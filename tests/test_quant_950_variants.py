"""npu_dynamic_mx_quant_with_dual_axis (Ascend 950) against the loop MX reference in
tests/reference/formats_950.py (byte-exact FP8 codes and E8M0 scales, both axes), the doc's
printed example, the SoC gate, the contract errors and the drop-in with its meta shapes."""

from __future__ import annotations

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
    assert s1.shape == shape[:-1] + (-(-(-(-n // 32)) // 2), 2)
    assert s2.shape == shape[:-2] + (-(-(-(-m // 32)) // 2), n, 2)


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
