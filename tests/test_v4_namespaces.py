"""DeepSeek-V4 small ops through ``torch.ops._C_ascend`` / ``torch.ops.custom`` (the drop-in's
registry): the frameworks' calls give the bytes of tests/reference/v4_small.py; fake kernels;
errors name the argument and leave x untouched."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ascend_emu.torch_npu  # noqa: E402,F401  (registers the namespaces)
from ascend_emu.errors import ArgumentError, IndexRangeError, ModeError  # noqa: E402
from ascend_emu.torch_npu import namespaces  # noqa: E402
from tests.reference import v4_small as ref  # noqa: E402

C = torch.ops._C_ascend
CUSTOM = torch.ops.custom


def _np(t) -> np.ndarray:
    import ml_dtypes

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _same(got, want: np.ndarray):
    g = _np(got)
    assert g.shape == want.shape and g.dtype == want.dtype, (g.shape, g.dtype, want.shape, want.dtype)
    np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def test_registered():
    report = namespaces.report()
    for key in ("_C_ascend::npu_rms_norm_dynamic_quant", "_C_ascend::inplace_partial_rotary_mul",
                "_C_ascend::compressor_metadata", "_C_ascend::compressor_metadata_out",
                "custom::npu_rms_norm_dynamic_quant", "custom::inplace_partial_rotary_mul"):
        assert report[key] == "registered", key


def test_rms_norm_dynamic_quant_both_namespaces():
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4, 1, 256, generator=g) * 9 + 1).to(torch.bfloat16)
    gamma = torch.rand(256, generator=g).to(torch.bfloat16)
    smooth = torch.rand(256, generator=g).to(torch.bfloat16)
    want_y, want_s = ref.rms_norm_dynamic_quant(_np(x), _np(gamma), _np(smooth), None, 1e-6)
    y, s = C.npu_rms_norm_dynamic_quant(x, gamma, smooth, None, 1e-6)  # vllm-ascend: positional
    _same(y, want_y)
    _same(s, want_s)
    y2, s2 = CUSTOM.npu_rms_norm_dynamic_quant(x, gamma, smooth_scale=smooth, beta=None, epsilon=1e-6)
    _same(y2, want_y)
    _same(s2, want_s)
    with pytest.raises(ArgumentError, match="positional"):  # custom's smooth_scale is keyword-only
        CUSTOM.npu_rms_norm_dynamic_quant(x, gamma, smooth)


def test_inplace_partial_rotary_mul_as_vllm_and_recipes_call_it():
    g = torch.Generator().manual_seed(2)
    q = (torch.rand(3, 1, 4, 512, generator=g) * 9 + 1).to(torch.bfloat16)
    cos = (torch.rand(3, 1, 1, 64, generator=g) * 2 - 1).to(torch.bfloat16)
    sin = (torch.rand(3, 1, 1, 64, generator=g) * 2 - 1).to(torch.bfloat16)
    want = ref.partial_rotary(_np(q), _np(cos), _np(sin), 448, 512)
    a = q.clone()
    assert C.inplace_partial_rotary_mul(a, cos, sin, rotary_mode="interleave", partial_slice=[448, 512]) is None
    _same(a, want)
    b = q.clone()
    CUSTOM.inplace_partial_rotary_mul(b, cos, sin, rotary_mode="interleave", partial_slice=[448, 512])
    _same(b, want)
    c = q.clone()
    before = _np(c).copy()
    with pytest.raises(ModeError, match="rotary_mode"):
        C.inplace_partial_rotary_mul(c, cos, sin, "half", [448, 512])
    _same(c, before)


def _metadata_inputs():
    values = torch.arange(2048 * 64, dtype=torch.float32).reshape(2048, 64)
    cos, sin = values.to(torch.bfloat16), (values * 0.25).to(torch.bfloat16)
    cu = torch.tensor([0, 131, 151, 171, 178], dtype=torch.int32)
    start = torch.tensor([0, 125, 508, 640], dtype=torch.int32)
    table = torch.tensor([list(range(10 * k, 10 * k + 6)) for k in (1, 2, 3, 4)], dtype=torch.int32)
    return cos, sin, cu, start, table


@pytest.mark.parametrize("fmt", [1, 2])
def test_compressor_metadata_and_out(fmt):
    cos, sin, cu, start, table = _metadata_inputs()
    want = ref.compressor_metadata(_np(cos), _np(sin), _np(cu), _np(start), _np(table), 128, fmt, 4, 48)
    got = C.compressor_metadata(cos, sin, cu, start, table, 128, fmt, 4, 48, 4)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    outs = (torch.empty(48, 1, 1, 64, dtype=torch.bfloat16), torch.empty(48, 1, 1, 64, dtype=torch.bfloat16),
            torch.empty((48,) if fmt == 1 else (48, 2), dtype=torch.int32))
    res = C.compressor_metadata_out(cos, sin, cu, start, table, 128, fmt, 4, 4, *outs)
    for r, o, w in zip(res, outs, want, strict=True):
        assert r.data_ptr() == o.data_ptr()
        _same(o, w)


def test_compressor_metadata_rejects_non_monotone_cu_seqlens():
    cos, sin, cu, start, table = _metadata_inputs()
    outs = (torch.zeros(8, 1, 1, 64, dtype=torch.bfloat16), torch.zeros(8, 1, 1, 64, dtype=torch.bfloat16),
            torch.zeros(8, 2, dtype=torch.int32))
    bad = torch.tensor([0, 131, 120, 171, 178], dtype=torch.int32)
    with pytest.raises(IndexRangeError, match="cu_seqlens"):
        C.compressor_metadata_out(cos, sin, bad, start, table, 128, 2, 4, 4, *outs)
    assert all(not o.any() for o in outs)


def test_fake_kernels():
    from torch._subclasses.fake_tensor import FakeTensorMode

    cos, sin, cu, start, table = _metadata_inputs()
    x = torch.ones(2, 3, 256, dtype=torch.bfloat16)
    gamma = torch.ones(256, dtype=torch.bfloat16)
    mode = FakeTensorMode()
    with mode:
        fx, fg = mode.from_tensor(x), mode.from_tensor(gamma)
        y, s = C.npu_rms_norm_dynamic_quant(fx, fg)
        assert (tuple(y.shape), y.dtype, tuple(s.shape), s.dtype) == ((2, 3, 256), torch.int8, (2, 3), torch.float32)
        f = [mode.from_tensor(t) for t in (cos, sin, cu, start, table)]
        c, sn, slot = C.compressor_metadata(*f, 128, 2, 4, 48, 4)
        assert tuple(c.shape) == (48, 1, 1, 64) and c.dtype == torch.bfloat16 and tuple(slot.shape) == (48, 2)
        q = mode.from_tensor(torch.ones(1, 1, 1, 512, dtype=torch.bfloat16))
        r = mode.from_tensor(torch.ones(1, 1, 1, 64, dtype=torch.bfloat16))
        assert C.inplace_partial_rotary_mul(q, r, r, "interleave", [448, 512]) is None
