"""npu_fused_infer_attention_score_v2's ``out_dtype`` with ``quant_scale_out`` / ``quant_offset_out``:
the Ascend 950's FP8 E4M3FN / E5M2 and HiFloat8 outputs against ``reference_mha(quant_out_type=...)``
(tests/reference/fused_infer_attention.py, its own FP8 / HiF8 encoders in tests/reference/formats_950.py),
overflow without saturation, the out= and infer_output forms, op-plugin's out_dtype call through the
drop-in, and each rejected combination naming its argument and writing nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import AscendEmuError, DTypeError, ModeError, ShapeError
from tests.reference.fused_infer_attention import reference_mha
from tests.test_fused_infer_attention_mha import make_dense

BF16 = ml_dtypes.bfloat16
FIA2 = ops.npu_fused_infer_attention_score_v2
ASCEND950 = "Ascend950PR_9599"
#: out_dtype code -> element type (torch ScalarType values 23 / 24, torch_npu codes 290-292).
CODES = {23: "float8_e5m2", 291: "float8_e5m2", 24: "float8_e4m3fn", 292: "float8_e4m3fn", 290: "hifloat8"}
V2 = {"actual_seq_lengths": "actual_seq_qlen", "actual_seq_lengths_kv": "actual_seq_kvlen",
      "num_heads": "num_query_heads", "scale": "softmax_scale", "softmax_lse_flag": "return_softmax_lse"}


@pytest.fixture
def soc950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", ASCEND950)


def _v2(kw):
    return {V2.get(key, key): val for key, val in kw.items()}


def _codes(x):
    """uint8 codes of an FP8 / HiF8 output."""
    return np.ascontiguousarray(x).view(np.uint8)


def _assert_same_codes(out, want, name):
    """Byte-equal, NaN codes compared as NaN (the two FP8 encoders may pick different NaN payloads)."""
    got = _codes(out)
    if name == "hifloat8":
        np.testing.assert_array_equal(got, want)
        return
    dt = np.dtype(getattr(ml_dtypes, name))
    nan_got, nan_want = np.isnan(got.view(dt).astype(np.float32)), np.isnan(want.view(dt).astype(np.float32))
    np.testing.assert_array_equal(nan_got, nan_want)
    np.testing.assert_array_equal(np.where(nan_got, 0, got), np.where(nan_want, 0, want))


@pytest.mark.parametrize("code", sorted(CODES))
@pytest.mark.parametrize("dtype,scale_dtype,per_channel,offset", [
    (np.float16, np.float32, False, False), (np.float16, np.float32, True, True),
    (BF16, BF16, True, True), (BF16, np.float32, False, True)])
def test_8bit_output_matches_the_reference(rng, soc950, code, dtype, scale_dtype, per_channel, offset):
    name = CODES[code]
    q, k, v, kw = make_dense(rng, "BSND", dtype=dtype, s2=24, exact=True)
    n, d = 4, 32
    shape = (n, d) if per_channel else (1,)
    qs = rng.uniform(0.3, 40, size=shape).astype(scale_dtype)
    qo = rng.uniform(-3, 3, size=shape).astype(scale_dtype) if offset else None
    out, _ = FIA2(q, k, v, quant_scale_out=qs, quant_offset_out=qo, out_dtype=code, **_v2(kw))
    want, _ = reference_mha(q, k, v, quant_out=(qs.astype(np.float32), None if qo is None else qo.astype(np.float32)),
                            quant_out_type=name, **kw)
    assert out.dtype == (np.uint8 if name == "hifloat8" else np.dtype(getattr(ml_dtypes, name)))
    assert out.shape == want.shape
    _assert_same_codes(out, want, name)
    assert len(np.unique(_codes(out))) > 20  # the output spans many codes, not a constant


@pytest.mark.parametrize("code", [23, 24, 290])
def test_overflow_is_not_saturated(rng, soc950, code):
    """NO_SAT casts: E4M3FN overflow is NaN, E5M2 and HiFloat8 overflow is +-Inf (the 950's INF_NAN mode)."""
    name = CODES[code]
    q, k, v, kw = make_dense(rng, "BNSD", s2=16, exact=True)
    qs = np.array([3.0e5], np.float32)
    out, _ = FIA2(q, k, v, quant_scale_out=qs, out_dtype=code, **_v2(kw))
    want, _ = reference_mha(q, k, v, quant_out=(qs, None), quant_out_type=name, **kw)
    _assert_same_codes(out, want, name)
    codes = _codes(out)
    if name == "hifloat8":
        assert ((codes == 0x6F) | (codes == 0xEF)).any()
    else:
        vals = out.astype(np.float32)
        assert (np.isnan(vals).any() if name == "float8_e4m3fn" else np.isinf(vals).any())


@pytest.mark.parametrize("input_layout", ["BSH", "BNSD_BSND"])
def test_other_layouts_and_the_recorded_dtype_name(rng, soc950, input_layout):
    """The output's layout as the float output's; a recorded call's dtype name stands for its code."""
    q, k, v, kw = make_dense(rng, input_layout, s2=16, exact=True)
    qs, qo = np.array([5.0], np.float32), np.array([-0.5], np.float32)
    out, _ = FIA2(q, k, v, quant_scale_out=qs, quant_offset_out=qo, out_dtype="torch.float8_e5m2", **_v2(kw))
    want, _ = reference_mha(q, k, v, quant_out=(qs, qo), quant_out_type="float8_e5m2", **kw)
    assert out.shape == want.shape == FIA2(q, k, v, **_v2(kw))[0].shape
    _assert_same_codes(out, want, "float8_e5m2")
    hif8, _ = FIA2(q, k, v, quant_scale_out=qs, out_dtype="torch_npu.hifloat8", **_v2(kw))
    _assert_same_codes(hif8, reference_mha(q, k, v, quant_out=(qs, None), quant_out_type="hifloat8", **kw)[0],
                       "hifloat8")


def test_int8_code_is_the_default_output(rng):
    """out_dtype 1 (torch.int8) is the int8 output on every SoC."""
    q, k, v, kw = make_dense(rng, "BSND")
    qs = np.array([60.0], np.float32)
    default, _ = FIA2(q, k, v, quant_scale_out=qs, **_v2(kw))
    named, _ = FIA2(q, k, v, quant_scale_out=qs, out_dtype=1, **_v2(kw))
    assert named.dtype == np.int8
    np.testing.assert_array_equal(named, default)


def test_out_form_and_infer_output(rng, soc950):
    q, k, v, kw = make_dense(rng, "BNSD", exact=True)
    qs = np.array([8.0], np.float32)
    ao, lo = ops._npu_fused_infer_attention_score_v2_infer_output(
        q, v, input_layout="BNSD", quant_scale_out=qs, num_query_heads=4, num_key_value_heads=2,
        return_softmax_lse=True, out_dtype=292)
    assert ao.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and lo.dtype == np.float32
    ah, _ = ops._npu_fused_infer_attention_score_v2_infer_output(q, v, input_layout="BNSD", quant_scale_out=qs,
                                                                 num_query_heads=4, num_key_value_heads=2,
                                                                 out_dtype=290)
    assert ah.dtype == np.uint8
    got = FIA2(q, k, v, quant_scale_out=qs, out_dtype=292, **_v2(kw), return_softmax_lse=True, attention_out=ao,
               softmax_lse=lo)
    assert got[0] is ao
    _assert_same_codes(ao, _codes(FIA2(q, k, v, quant_scale_out=qs, out_dtype=292, **_v2(kw))[0]), "float8_e4m3fn")


def _rejects(call, exc, name, outs=()):
    before = [o.copy() for o in outs]
    with pytest.raises(exc, match=name) as info:
        call()
    assert isinstance(info.value, AscendEmuError)
    for o, b in zip(outs, before, strict=True):
        np.testing.assert_array_equal(o, b)


def test_rejections_name_the_argument_and_write_nothing(rng, monkeypatch):
    q, k, v, kw = make_dense(rng, "BSND")
    kw2 = _v2(kw)
    qs = np.array([10.0], np.float32)
    ao, lo = np.full((2, 3, 4, 32), 7, np.uint8).view(ml_dtypes.float8_e5m2), np.zeros(0, np.float32)
    outs = dict(attention_out=ao, softmax_lse=lo)
    # an Ascend 950 type on the default SoC (A2): torch_npu's "not support on this soc version"
    monkeypatch.delenv("ASCEND_EMU_SOC_NAME", raising=False)
    with pytest.raises(ModeError, match="out_dtype.*not support on this soc version"):
        FIA2(q, k, v, quant_scale_out=qs, out_dtype=23, **kw2, **outs)
    np.testing.assert_array_equal(ao.view(np.uint8), 7)
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", ASCEND950)
    # out_dtype without quant_scale_out (an int8 / fp8 query's out_dtype is not emulated)
    _rejects(lambda: FIA2(q, k, v, out_dtype=23, **kw2), ModeError, "out_dtype.*quant_scale_out")
    # a type the output quant does not write, and non-codes
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=qs, out_dtype=5, **kw2), ModeError, "out_dtype.*5")
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=qs, out_dtype=293, **kw2), ModeError, "out_dtype")
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=qs, out_dtype=True, **kw2), ModeError, "out_dtype")
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=qs, out_dtype=2.5, **kw2), ModeError, "out_dtype")
    # the out= array must have the output's type
    wrong = np.zeros((2, 3, 4, 32), np.int8)
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=qs, out_dtype=23, **kw2, attention_out=wrong, softmax_lse=lo),
             ShapeError, "attention_out", [wrong])
    # the scales' own rules hold for the 8-bit types too
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=np.ones(5, np.float32), out_dtype=23, **kw2, **outs), ShapeError,
             "quant_scale_out", [ao.view(np.uint8)])
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=np.array([np.nan], np.float32), out_dtype=290, **kw2),
             DTypeError, "quant_scale_out")
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=np.ones(1, BF16), out_dtype=23, **kw2), DTypeError,
             "quant_scale_out")  # a bf16 scale needs a bf16 query
    _rejects(lambda: FIA2(q, k, v, quant_scale_out=qs, quant_offset_out=np.ones(1, np.float32), out_dtype=24,
                          **dict(kw2, actual_seq_qlen=[3, 2])), ModeError, "quant_offset_out")
    # the infer_output query applies the same rule
    _rejects(lambda: ops._npu_fused_infer_attention_score_v2_infer_output(q, v, input_layout="BSND", out_dtype=23,
                                                                          num_query_heads=4), ModeError, "out_dtype")
    np.testing.assert_array_equal(ao.view(np.uint8), 7)


def test_op_plugin_out_dtype_call_through_the_drop_in(soc950):
    """op-plugin's test_npu_fused_infer_attention_score_v2_with_outdtype call (smaller kv): a torch
    dtype for out_dtype, an FP8 npu tensor back; torch_npu.hifloat8 gives uint8; the fake kernel
    (torch.compile) agrees on the dtype."""
    torch = pytest.importorskip("torch")
    from ascend_emu import torch_npu

    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 8, 2, 192, dtype=torch.float16, generator=gen).npu()
    key = torch.randn((2, 8, 64, 192), dtype=torch.float16, generator=gen).npu()
    value = torch.randn((2, 8, 64, 128), dtype=torch.float16, generator=gen).npu()
    qs = torch.tensor([0.75], dtype=torch.float32).npu()
    kw = dict(num_query_heads=8, input_layout="BNSD", quant_scale_out=qs, softmax_scale=1 / 0.0078125,
              pre_tokens=65535, next_tokens=65535)
    out, _ = torch_npu.npu_fused_infer_attention_score_v2(query, key, value, out_dtype=torch.float8_e5m2, **kw)
    assert out.dtype == torch.float8_e5m2 and out.shape == (2, 8, 2, 128) and out.device.type == "npu"
    direct, _ = FIA2(query.cpu().numpy(), key.cpu().numpy(), value.cpu().numpy(), out_dtype=23,
                     **dict(kw, quant_scale_out=qs.cpu().numpy()))
    np.testing.assert_array_equal(out.cpu().view(torch.uint8).numpy(), _codes(direct))
    hif8, _ = torch_npu.npu_fused_infer_attention_score_v2(query, key, value, out_dtype=torch_npu.hifloat8, **kw)
    assert hif8.dtype == torch.uint8
    from ascend_emu.torch_npu import _fake

    fake, _ = _fake.fused_infer_attention_score_v2(query.cpu(), key.cpu(), value.cpu(), out_dtype=23, **kw)
    assert fake.dtype == torch.float8_e5m2
