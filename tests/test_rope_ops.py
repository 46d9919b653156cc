"""npu_interleave_rope / npu_rotary_mul against the loop references in tests/reference/rope.py:
NumPy API and torch_npu drop-in, bf16 / fp16 / fp32, both rotary modes, the doc's broadcasts,
bad arguments."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, ModeError, ShapeError
from tests.reference import rope as ref

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8)


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _data(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(DTYPES[dtype])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cos_s", ["S", "1"])
def test_interleave_rope_matches_reference(rng, dtype, cos_s):
    b, n, s = 2, 3, 4
    x = _data(rng, (b, n, s, 64), dtype, 4.0)
    cs = s if cos_s == "S" else 1
    cos, sin = _data(rng, (b, 1, cs, 64), dtype), _data(rng, (b, 1, cs, 64), dtype)
    _assert_same(ops.npu_interleave_rope(x, cos, sin), ref.interleave_rope(x, cos, sin))


# (x shape, r shape): the doc's layouts and the goldens' shapes, scaled down
HALF_CASES = [((2, 3, 5, 16), (1, 1, 5, 16)), ((2, 3, 5, 16), (2, 1, 5, 16)), ((2, 3, 5, 16), (2, 3, 5, 16)),
              ((2, 3, 5, 16), (1, 3, 1, 16)), ((2, 3, 5, 16), (2, 3, 1, 16)), ((3, 2, 5, 8), (3, 1, 1, 8))]
INTERLEAVE_CASES = [((2, 3, 5, 16), (1, 1, 5, 16)), ((2, 3, 5, 16), (1, 3, 1, 16)), ((3, 2, 4, 10), (3, 1, 1, 10))]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("mode,shapes", [("half", c) for c in HALF_CASES] + [("interleave", c) for c in INTERLEAVE_CASES])
def test_rotary_mul_matches_reference(rng, dtype, mode, shapes):
    xs, rs = shapes
    x = _data(rng, xs, dtype, 4.0)
    r1, r2 = _data(rng, rs, dtype), _data(rng, rs, dtype)
    _assert_same(ops.npu_rotary_mul(x, r1, r2, mode), ref.rotary_mul(x, r1, r2, mode))


def test_rotary_mul_default_mode_is_half(rng):
    x, r1, r2 = _data(rng, (1, 2, 3, 8), "float32"), _data(rng, (1, 1, 3, 8), "float32"), _data(rng, (1, 1, 3, 8), "float32")
    _assert_same(ops.npu_rotary_mul(x, r1, r2), ref.rotary_mul(x, r1, r2, "half"))


def test_drop_in(rng):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu import to_numpy, to_torch

    x = _data(rng, (2, 2, 3, 64), "bfloat16", 4.0)
    cos, sin = _data(rng, (2, 1, 1, 64), "bfloat16"), _data(rng, (2, 1, 1, 64), "bfloat16")
    got = torch_npu.npu_interleave_rope(to_torch(x), to_torch(cos), to_torch(sin))
    _assert_same(to_numpy(got), ref.interleave_rope(x, cos, sin))
    x, r1, r2 = _data(rng, (2, 3, 4, 16), "float16"), _data(rng, (1, 1, 4, 16), "float16"), _data(rng, (1, 1, 4, 16), "float16")
    got = torch_npu.npu_rotary_mul(to_torch(x), to_torch(r1), to_torch(r2), rotary_mode="interleave")
    _assert_same(to_numpy(got), ref.rotary_mul(x, r1, r2, "interleave"))
    meta = torch.ops.npu.npu_rotary_mul(torch.empty(2, 3, 4, 16, device="meta"), torch.empty(1, 1, 4, 16, device="meta"),
                                        torch.empty(1, 1, 4, 16, device="meta"))
    assert meta.shape == (2, 3, 4, 16) and meta.dtype == torch.float32
    meta = torch.ops.npu.npu_interleave_rope(*(torch.empty(s, dtype=torch.float16, device="meta")
                                               for s in ((2, 3, 4, 64), (2, 1, 4, 64), (2, 1, 4, 64))))
    assert meta.shape == (2, 3, 4, 64) and meta.dtype == torch.float16
    with pytest.raises(ShapeError, match="^rotate: expected 2-D"):
        torch_npu.npu_rotary_mul(to_torch(x), to_torch(r1), to_torch(r2), rotate=to_torch(r1))


def _ir(rng, x=(2, 3, 4, 64), cos=(2, 1, 4, 64), sin=None, dtype="bfloat16", cdtype=None):
    return (_data(rng, x, dtype), _data(rng, cos, cdtype or dtype), _data(rng, sin or cos, cdtype or dtype))


@pytest.mark.parametrize("kw,err,name", [
    (dict(x=(2, 3, 4, 32), cos=(2, 1, 4, 32)), ShapeError, "x"),
    (dict(x=(3, 4, 64), cos=(2, 1, 4, 64)), ShapeError, "x"),
    (dict(dtype="float32"), DTypeError, "x"),
    (dict(cdtype="float16"), DTypeError, "cos"),
    (dict(cos=(2, 3, 4, 64)), ShapeError, "cos"),
    (dict(cos=(1, 1, 4, 64)), ShapeError, "cos"),
    (dict(cos=(2, 1, 3, 64)), ShapeError, "cos"),
    (dict(cos=(2, 1, 4, 64), sin=(2, 1, 1, 64)), ShapeError, "sin"),
])
def test_interleave_rope_rejects(rng, kw, err, name):
    with pytest.raises(err, match=rf"^{name}\b"):
        ops.npu_interleave_rope(*_ir(rng, **kw))


def test_interleave_rope_rejects_non_contiguous(rng):
    x, cos, sin = _ir(rng, x=(2, 4, 3, 64))
    with pytest.raises(ShapeError, match=r"^x\b.*contiguous"):
        ops.npu_interleave_rope(x.transpose(0, 2, 1, 3), cos, sin)


@pytest.mark.parametrize("xs,rs,mode,err,name", [
    ((2, 3, 5, 16), (1, 3, 5, 16), "half", ShapeError, "r1"),       # 1BC: no doc layout
    ((2, 3, 5, 16), (1, 1, 1, 16), "half", ShapeError, "r1"),
    ((2, 3, 5, 16), (2, 1, 5, 16), "interleave", ShapeError, "r1"),  # B1SD: half only
    ((2, 3, 5, 16), (1, 1, 5, 8), "half", ShapeError, "r1"),
    ((2, 3, 5, 16), (1, 1, 4, 16), "half", ShapeError, "r1"),
    ((2, 3, 5, 15), (1, 1, 5, 15), "half", ShapeError, "self"),
    ((1, 1, 2, 896), (1, 1, 2, 896), "half", ShapeError, "self"),
    ((5, 16), (5, 16), "half", ShapeError, "self"),
    ((3, 5, 16), (1, 5, 16), "half", ShapeError, "r1"),           # TND takes 11D / T1D / TND
    ((3, 5, 16), (1, 5, 16), "interleave", ShapeError, "r1"),
    ((3, 5, 16), (3, 1, 1, 16), "half", ShapeError, "r1"),
    ((2, 3, 5, 16), (1, 1, 5, 16), "quarter", ModeError, "rotary_mode"),
])
def test_rotary_mul_rejects(rng, xs, rs, mode, err, name):
    x, r = _data(rng, xs, "float32"), _data(rng, rs, "float32")
    with pytest.raises(err, match=rf"^{name}\b"):
        ops.npu_rotary_mul(x, r, r.copy(), mode)


def test_rotary_mul_rejects_dtypes_and_r2(rng):
    x, r = _data(rng, (2, 3, 5, 16), "float16"), _data(rng, (1, 1, 5, 16), "float16")
    with pytest.raises(DTypeError, match=r"^r2\b"):
        ops.npu_rotary_mul(x, r, r.astype(np.float32))
    with pytest.raises(DTypeError, match=r"^self\b"):
        ops.npu_rotary_mul(x.astype(np.int32), r, r)
    with pytest.raises(ShapeError, match=r"^r2\b"):
        ops.npu_rotary_mul(x, r, _data(rng, (1, 3, 1, 16), "float16"))


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_size_one_dims_fit_either_reading(rng, mode):
    """self ``[1, B, C, D]`` with r ``[1, 1, C, D]`` is the 11SD layout (the doc's, in both modes):
    a size-1 dim of self does not make it another layout."""
    x = _data(rng, (1, 3, 5, 16), "float32", 4.0)
    r1, r2 = _data(rng, (1, 1, 5, 16), "float32"), _data(rng, (1, 1, 5, 16), "float32")
    _assert_same(ops.npu_rotary_mul(x, r1, r2, mode), ref.rotary_mul(x, r1, r2, mode))


# ------------------------------------------------------------------ 3-D (TND) self and rotate
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("mode, rs", [("half", (3, 1, 16)), ("half", (3, 5, 16)), ("half", (1, 1, 16)),
                                      ("interleave", (3, 1, 16)), ("interleave", (3, 5, 16)),
                                      ("interleave", (1, 1, 16))])
def test_rotary_mul_tnd_matches_reference(rng, dtype, mode, rs):
    x, r1, r2 = _data(rng, (3, 5, 16), dtype, 4.0), _data(rng, rs, dtype), _data(rng, rs, dtype)
    _assert_same(ops.npu_rotary_mul(x, r1, r2, mode), ref.rotary_mul_nd(x, r1, r2, mode))


def _half_matrix(d: int) -> np.ndarray:
    """The doc's ``get_half_matrix``: x @ it is rotate_half(x)."""
    m = np.zeros((d, d), np.float32)
    m[np.arange(d // 2), np.arange(d // 2) + d // 2] = 1
    m[np.arange(d // 2) + d // 2, np.arange(d // 2)] = -1
    return m


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_rotary_mul_rotate_matrix(rng, dtype):
    """The doc's half matrix gives the half mode's result bit for bit; a block-diagonal one (the
    doc's split-D use: two halves of 8 rotated separately) and a dense random one match the
    loop reference."""
    x, r1, r2 = _data(rng, (2, 3, 4, 16), dtype, 4.0), _data(rng, (1, 1, 4, 16), dtype), _data(rng, (1, 1, 4, 16), dtype)
    half = _half_matrix(16).astype(DTYPES[dtype])
    _assert_same(ops.npu_rotary_mul(x, r1, r2, "half", half), ops.npu_rotary_mul(x, r1, r2, "half"))
    block = np.zeros((16, 16), np.float32)
    block[:8, :8], block[8:, 8:] = _half_matrix(8), _half_matrix(8)
    for m in (block.astype(DTYPES[dtype]), _data(rng, (16, 16), dtype)):
        got = ops.npu_rotary_mul(x, r1, r2, "interleave", m)
        _assert_same(got, ref.rotary_mul_nd(x, r1, r2, "interleave", m))
    xt, rt = _data(rng, (3, 2, 16), dtype), _data(rng, (3, 1, 16), dtype)
    m = _data(rng, (16, 16), dtype)
    _assert_same(ops.npu_rotary_mul(xt, rt, rt.copy(), "half", m), ref.rotary_mul_nd(xt, rt, rt, "half", m))


def test_rotary_mul_rotate_bf16_rounds_once_not_per_product(rng):
    """op-plugin's ``test_rotary_mul_mode_matrix`` (bf16, torch.rand data, the doc's half matrix,
    here on a slice of its [2, 24, 28800, 128] shape): the op computes in fp32 and rounds once
    (the loop reference), its golden rounds each bf16 product first. The two differ by one bf16
    ulp on many lanes, and one ulp is beyond the test's all-element ``rtol = atol = 0.001`` for
    every |y| >= 0.25 (docs/op_plugin_tests.md, exempt); the emulator keeps the single rounding."""
    bf16 = DTYPES["bfloat16"]
    x = rng.random((2, 4, 16, 128)).astype(bf16)
    r1, r2 = rng.random((1, 1, 16, 128)).astype(bf16), rng.random((1, 1, 16, 128)).astype(bf16)
    got = ops.npu_rotary_mul(x, r1, r2, "half", _half_matrix(128).astype(bf16))
    _assert_same(got, ref.rotary_mul(x, r1, r2, "half"))
    golden = ref.rotary_mul_half_bf16_per_op(x, r1, r2)
    got32, golden32 = got.astype(np.float32), golden.astype(np.float32)
    beyond = ~np.isclose(got32, golden32, rtol=1e-3, atol=1e-3)
    assert beyond.mean() > 0.05  # a systematic difference, not a stray lane
    # rounding, not a wrong value: within the two results' own rounding errors (bf16 unit
    # roundoff 2^-8 on each product and on each output) on every lane
    x32 = x.astype(np.float32)
    h = x32.shape[-1] // 2
    products = np.abs(r1.astype(np.float32) * x32) + np.abs(r2.astype(np.float32) * np.concatenate(
        [x32[..., h:], x32[..., :h]], axis=-1))
    bound = 2.0 ** -8 * products * (1 + 2.0 ** -8) + 2.0 ** -7 * np.maximum(np.abs(got32), np.abs(golden32))
    assert np.all(np.abs(got32 - golden32) <= bound)
    torch = pytest.importorskip("torch")
    tx, t1, t2 = (torch.from_numpy(a.astype(np.float32)).bfloat16() for a in (x, r1, r2))
    x1, x2 = torch.chunk(tx, 2, -1)
    eager = (t1 * tx + t2 * torch.cat((-x2, x1), dim=-1)).float().numpy()
    np.testing.assert_array_equal(eager, golden32)  # the per-op reference is the golden's arithmetic


def test_rotary_mul_rotate_rejects(rng, monkeypatch):
    x, r = _data(rng, (2, 3, 4, 16), "float16"), _data(rng, (1, 1, 4, 16), "float16")
    with pytest.raises(ShapeError, match=r"^rotate: expected shape \[16, 16\]"):
        ops.npu_rotary_mul(x, r, r, "half", np.zeros((8, 8), np.float16))
    with pytest.raises(DTypeError, match=r"^rotate\b"):
        ops.npu_rotary_mul(x, r, r, "half", np.zeros((16, 16), np.float32))
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    with pytest.raises(ModeError, match=r"^rotate: expected None on Ascend950PR_9599"):
        ops.npu_rotary_mul(x, r, r, "half", np.zeros((16, 16), np.float16))
    ops.npu_rotary_mul(x, r, r, "half")  # without rotate the 950 runs it


def test_rotary_mul_tnd_and_rotate_drop_in(rng):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu import to_numpy, to_torch

    x, r1, r2 = _data(rng, (2, 5, 128), "float32"), _data(rng, (2, 1, 128), "float32"), _data(rng, (2, 1, 128), "float32")
    got = torch_npu.npu_rotary_mul(to_torch(x), to_torch(r1), to_torch(r2), "half")
    _assert_same(to_numpy(got), ref.rotary_mul_nd(x, r1, r2, "half"))
    m = _half_matrix(128)
    got = torch_npu.npu_rotary_mul(to_torch(x), to_torch(r1), to_torch(r2), "interleave", to_torch(m))
    _assert_same(to_numpy(got), to_numpy(torch_npu.npu_rotary_mul(to_torch(x), to_torch(r1), to_torch(r2))))
    meta = torch.ops.npu.npu_rotary_mul(torch.empty(2, 5, 128, device="meta"), torch.empty(2, 1, 128, device="meta"),
                                        torch.empty(2, 1, 128, device="meta"), rotate=torch.empty(128, 128, device="meta"))
    assert meta.shape == (2, 5, 128)


def test_rotary_mode_error_carries_torch_npu_text(rng):
    """op-plugin's golden matches torch_npu's text "The rotary_mode of npu_rotary_mul should be
    half or interleave, but got " (as a RuntimeError there)."""
    x, r = _data(rng, (2, 2, 5, 16), "float32"), _data(rng, (1, 2, 1, 16), "float32")
    with pytest.raises(ModeError, match=r"^rotary_mode: expected .*The rotary_mode of npu_rotary_mul should be "
                                        r"half or interleave, but got quarter"):
        ops.npu_rotary_mul(x, r, r, "quarter")
