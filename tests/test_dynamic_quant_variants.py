"""npu_dynamic_quant_asymmetric (per token, MoE groups, int4; per channel on the Ascend 950) and
npu_dynamic_quant's per-channel mode, against the loop references in
tests/reference/dynamic_quant.py, byte-exact; the torch_npu drop-in, the meta shapes of the 2.14
wheel's meta functions, the SoC gate and bad arguments."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from tests.reference import dynamic_quant as ref

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
A950 = "Ascend950PR_9599"
NOT_950 = ["Ascend910B2", "Ascend910_9391"]


@pytest.fixture
def a950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)


def _same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint8), np.ascontiguousarray(w).view(np.uint8))


def _data(rng, shape, dtype):
    return (rng.standard_normal(shape) * 3).astype(DTYPES[dtype])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("smooth", [False, True])
@pytest.mark.parametrize("int4", [False, True])
def test_asymmetric_matches_reference(rng, dtype, smooth, int4):
    x = _data(rng, (3, 2, 24), dtype)
    s = rng.standard_normal(24).astype(DTYPES[dtype]) if smooth else None  # negative smooth values too
    got = ops.npu_dynamic_quant_asymmetric(x, smooth_scales=s, dst_type=16 if int4 else None)
    _same(got, ref.dynamic_quant_asymmetric(x, s, int4=int4))
    y = got[0]
    assert y.shape == ((3, 2, 3) if int4 else (3, 2, 24)) and got[1].shape == got[2].shape == (3, 2)
    if not int4:  # each row spans the whole int8 range: its max at 127, its min at -128
        assert (y.max(axis=-1) == 127).all() and (y.min(axis=-1) == -128).all()


@pytest.mark.parametrize("int4", [False, True])
def test_asymmetric_moe_groups(rng, int4):
    """Group 0 empty (group_index starts at 0, as op-plugin's golden draws it), a later one empty."""
    x = _data(rng, (7, 16), "float16")
    s = rng.standard_normal((4, 16)).astype(np.float16)
    gi = np.array([0, 3, 3, 7], np.int32)
    got = ops.npu_dynamic_quant_asymmetric(x, smooth_scales=s, group_index=gi, dst_type=16 if int4 else 1)
    _same(got, ref.dynamic_quant_asymmetric(x, s, gi, int4=int4))


def test_asymmetric_dequantizes_back(rng):
    """``(y - offset) * scale`` recovers v to half a step."""
    x = _data(rng, (5, 64), "float16")
    y, scale, offset = ops.npu_dynamic_quant_asymmetric(x)
    back = (y.astype(np.float32) - offset[:, None]) * scale[:, None]
    assert np.abs(back - x.astype(np.float32)).max() <= 0.5 * scale.max() * (1 + 1e-5)


def test_asymmetric_constant_row():
    x = np.full((2, 8), 1.5, np.float16)
    x[1, 0] = -1.0
    y, scale, offset = ops.npu_dynamic_quant_asymmetric(x)
    assert scale[0] == 0 and offset[0] == 0 and (y[0] == 0).all()
    assert y[1, 0] == -128 and (y[1, 1:] == 127).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("smooth", [False, True])
def test_per_channel_on_950(a950, rng, dtype, smooth):
    x = _data(rng, (2, 5, 16), dtype)
    s = rng.standard_normal(5).astype(DTYPES[dtype]) if smooth else None
    got = ops.npu_dynamic_quant_asymmetric(x, smooth_scales=s, quant_mode="perchannel")
    _same(got, ref.dynamic_quant_asymmetric(x, s, per_channel=True))
    assert got[1].shape == (2, 16)
    sym = ops.npu_dynamic_quant(x, smooth_scales=s, quant_mode="perchannel")
    _same(sym, ref.dynamic_quant_per_channel(x, s))
    assert (np.abs(sym[0]).max(axis=-2) == 127).all()


@pytest.mark.parametrize("soc", NOT_950)
@pytest.mark.parametrize("op", ["npu_dynamic_quant", "npu_dynamic_quant_asymmetric"])
def test_per_channel_rejected_on_a2_a3(monkeypatch, soc, op):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    with pytest.raises(ModeError, match=rf"^quant_mode: When quant_mode is 'perchannel' .*soc version {soc} .*"
                                        "ASCEND_EMU_SOC_NAME=Ascend950"):
        getattr(ops, op)(np.ones((4, 16), np.float16), quant_mode="perchannel")


def _rejects():
    f16 = np.float16
    x = np.ones((4, 16), f16)
    return [
        ("1-D x", dict(input=np.ones(16, f16)), ShapeError, "input"),
        ("fp32 x", dict(input=x.astype(np.float32)), DTypeError, "input"),
        ("dst_type", dict(input=x, dst_type=3), ModeError, "dst_type"),
        ("pertensor", dict(input=x, quant_mode="pertensor"), ModeError, "quant_mode"),
        ("smooth length", dict(input=x, smooth_scales=np.ones(4, f16)), ShapeError, "smooth_scales"),
        ("group_index decreasing", dict(input=x, smooth_scales=np.ones((2, 16), f16),
                                        group_index=np.array([3, 1], np.int32)), IndexRangeError, "group_index"),
    ]


@pytest.mark.parametrize("what,kw,err,name", _rejects(), ids=[c[0] for c in _rejects()])
def test_asymmetric_rejects(what, kw, err, name):
    with pytest.raises(err, match=rf"^{name}: expected"):
        ops.npu_dynamic_quant_asymmetric(**kw)


def test_per_channel_rejects(a950):
    x = np.ones((4, 16), np.float16)
    with pytest.raises(ShapeError, match=r"^smooth_scales: expected shape \[4\]"):
        ops.npu_dynamic_quant_asymmetric(x, smooth_scales=np.ones(16, np.float16), quant_mode="perchannel")
    with pytest.raises(ModeError, match=r"^quant_mode: expected 'pertoken' when group_index"):
        ops.npu_dynamic_quant(x, smooth_scales=np.ones((1, 16), np.float16), group_index=np.array([4], np.int32),
                              quant_mode="perchannel")


def test_drop_in_and_meta(rng, monkeypatch):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu import to_numpy, to_torch

    x = _data(rng, (2, 3, 16), "bfloat16")
    for dst_type, int4 in ((None, False), (torch.int8, False), (torch.quint4x2, True)):
        outs = torch_npu.npu_dynamic_quant_asymmetric(to_torch(x), dst_type=dst_type)
        assert [t.dtype for t in outs] == [torch.int32 if int4 else torch.int8, torch.float32, torch.float32]
        _same([to_numpy(t) for t in outs], ref.dynamic_quant_asymmetric(x, int4=int4))
    meta = torch.empty(2, 3, 16, dtype=torch.float16, device="meta")
    y, scale, offset = torch.ops.npu.npu_dynamic_quant_asymmetric(meta, dst_type=torch.quint4x2)
    assert (y.shape, y.dtype, scale.shape, offset.shape) == ((2, 3, 2), torch.int32, (2, 3), (2, 3))
    with pytest.raises(ModeError, match="^quant_mode"):
        torch.ops.npu.npu_dynamic_quant_asymmetric(meta, quant_mode="perchannel")
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)
    y, scale, offset = torch.ops.npu.npu_dynamic_quant_asymmetric(meta, quant_mode="perchannel")
    assert (y.shape, scale.shape, offset.shape) == ((2, 3, 16), (2, 16), (2, 16))
    y, scale = torch.ops.npu.npu_dynamic_quant(meta, quant_mode="perchannel")
    assert scale.shape == (2, 16)
    s = rng.standard_normal(3).astype(ml_dtypes.bfloat16)
    outs = torch_npu.npu_dynamic_quant_asymmetric(to_torch(x), smooth_scales=to_torch(s), quant_mode="perchannel")
    _same([to_numpy(t) for t in outs], ref.dynamic_quant_asymmetric(x, s, per_channel=True))


def test_per_channel_divides_by_the_scale(a950):
    """The golden's ``round(v / scale)``, not the per-token kernel's ``rint(v * (qmax / amax))``
    or a reciprocal multiply: on op-plugin's bf16 ``[2, 32, 256]`` shape some values round
    differently, and the output follows the division."""
    x = (np.random.default_rng(0).standard_normal((2, 32, 256)) * 3).astype(ml_dtypes.bfloat16)
    y, scale = ops.npu_dynamic_quant(x, quant_mode="perchannel")
    _same((y, scale), ref.dynamic_quant_per_channel(x))
    v = x.astype(np.float32)
    by_reciprocal = np.rint(v * (np.float32(1) / scale[:, None, :]))
    assert (by_reciprocal != y).any()  # the data tells the two forms apart


def test_asymmetric_divides_by_the_scale():
    """The doc's ``x / scale + offset``, not a reciprocal multiply: on op-plugin's ``[2, 32, 256]``
    shape some values round differently, and the output follows the division (the reference)."""
    x = (np.random.default_rng(1).standard_normal((2, 32, 256)) * 3).astype(np.float16)
    got = ops.npu_dynamic_quant_asymmetric(x)
    _same(got, ref.dynamic_quant_asymmetric(x))
    y, scale, offset = got
    by_reciprocal = np.rint(x.astype(np.float32) * (np.float32(1) / scale[..., None]) + offset[..., None])
    assert (by_reciprocal != y).any()  # the data tells the two forms apart
