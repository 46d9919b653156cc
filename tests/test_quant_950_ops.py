"""npu_dtype_cast and npu_dynamic_mx_quant (Ascend 950 types) against the bit-field references in
tests/reference/formats_950.py, through ascend_emu.ops and the torch_npu drop-in; each rejected on an
emulated Atlas A2 / A3."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from tests.reference import formats_950 as ref

A950 = "Ascend950PR_9599"
NOT_950 = ["Ascend910B2", "Ascend910_9391"]
FP8 = {"float8_e4m3fn": (292, 24), "float8_e5m2": (291, 23)}
FLOATS = {"float16": (np.float16, 5), "bfloat16": (ml_dtypes.bfloat16, 15), "float32": (np.float32, 6)}


@pytest.fixture
def a950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)


def specials(dtype) -> np.ndarray:
    """Values across every HiF8 / FP8 binade, their ties, overflow, Inf, NaN and both zeros, plus
    random values; representable in ``dtype``."""
    rng = np.random.default_rng(7)
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, 448.0, 464.0, 480.0, 57344.0, 61440.0, 2.0 ** 15, 1.25 * 2 ** 15,
         1.2 * 2 ** 15, 2.0 ** -22, 2.0 ** -23, 1.5 * 2 ** -23, 1.0625, 1.125, 3.0 * 2 ** -9, 2.0 ** -10]
    grid = np.ldexp(1.0 + np.arange(16) / 16.0, np.arange(-24, 17)[:, None]).ravel()
    v = np.concatenate([v, grid, -grid, rng.standard_normal(300) * 10.0 ** rng.integers(-6, 5, 300)])
    with np.errstate(over="ignore"):
        return v.astype(np.float32).astype(dtype)


# ---------------------------------------------------------------------- npu_dtype_cast, to the 950 types
@pytest.mark.parametrize("src", list(FLOATS))
def test_cast_to_hifloat8_matches_reference(a950, src):
    x = specials(FLOATS[src][0])
    got = ops.npu_dtype_cast(x, 290)
    assert got.dtype == np.uint8 and got.shape == x.shape
    np.testing.assert_array_equal(got, ref.hif8_encode(x.astype(np.float32)))


@pytest.mark.parametrize("name", list(FP8))
@pytest.mark.parametrize("src", list(FLOATS))
@pytest.mark.parametrize("which", [0, 1])  # the torch_npu code or the torch ScalarType value
def test_cast_to_fp8_matches_reference(a950, name, src, which):
    x = specials(FLOATS[src][0]).reshape(-1, 2)
    got = ops.npu_dtype_cast(x, FP8[name][which])
    assert got.dtype == np.dtype(getattr(ml_dtypes, name)) and got.shape == x.shape
    # the 950 casts in INF_NAN mode: no saturation (E4M3FN overflow NaN, E5M2 +-Inf)
    want = ref.fp8_encode(x.astype(np.float32), name, saturate=False)
    got_bits = got.view(np.uint8)
    nan = np.isnan(ref.fp8_table(name)[want])
    np.testing.assert_array_equal(got_bits[~nan], want[~nan])
    assert np.isnan(ref.fp8_table(name)[got_bits[nan]]).all()


# ---------------------------------------------------------------------- npu_dtype_cast, back
@pytest.mark.parametrize("dst", list(FLOATS))
def test_cast_from_hifloat8_all_codes(a950, dst):
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    got = ops.npu_dtype_cast(codes, FLOATS[dst][1], input_dtype=290)
    assert got.dtype == np.dtype(FLOATS[dst][0]) and got.shape == codes.shape
    np.testing.assert_array_equal(got.astype(np.float64).ravel(), ref.HIF8_TABLE)  # exact, NaN at 0x80


@pytest.mark.parametrize("name", list(FP8))
@pytest.mark.parametrize("dst", list(FLOATS))
def test_cast_from_fp8_all_codes(a950, name, dst):
    codes = np.arange(256, dtype=np.uint8)
    want = ref.fp8_table(name)
    as_bytes = ops.npu_dtype_cast(codes, FLOATS[dst][1], input_dtype=FP8[name][0])
    as_fp8 = ops.npu_dtype_cast(codes.view(getattr(ml_dtypes, name)), FLOATS[dst][1])
    for got in (as_bytes, as_fp8):
        assert got.dtype == np.dtype(FLOATS[dst][0])
        np.testing.assert_array_equal(got.astype(np.float64), want)


def test_cast_round_trips_every_hifloat8_code(a950):
    codes = np.delete(np.arange(256, dtype=np.uint8), 0x80)
    back = ops.npu_dtype_cast(ops.npu_dtype_cast(codes, 15, input_dtype=290), 290)
    np.testing.assert_array_equal(back, codes)


# ---------------------------------------------------------------------- npu_dtype_cast, rejections
@pytest.mark.parametrize("soc", NOT_950)
def test_cast_rejected_on_a2_a3(monkeypatch, soc):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    x = np.ones(4, np.float16)
    for call in (lambda: ops.npu_dtype_cast(x, 290), lambda: ops.npu_dtype_cast(x, 292),
                 lambda: ops.npu_dtype_cast(np.zeros(4, np.uint8), 5, input_dtype=290)):
        with pytest.raises(ModeError, match=rf"^dtype: When dtype is \d+ \(a cast .* -> .*\), not support on this "
                                            rf"soc version {soc} "):
            call()


@pytest.mark.parametrize("args, kwargs, err, text", [
    ((np.ones(2, np.complex64), 6), {}, ModeError, "complex64 -> float32"),
    ((np.full(2, 200.0, np.float32), 1), {}, IndexRangeError, "self: expected values that truncate into [-128, 127]"),
    ((np.ones(2, np.float32), 285), {}, DTypeError, "an int32 array for a cast to torch_npu.int4"),
    ((np.ones(2, np.float32), 296), {}, ModeError, "float4_e2m1fn_x2"),
    ((np.zeros(2, np.uint8), 290), {"input_dtype": 292}, ModeError, "float8_e4m3fn -> hifloat8"),
    ((np.ones(2, np.float32), 1000), {}, ModeError, "dtype: expected a torch ScalarType value"),
    ((np.ones(2, np.float32), 290.0), {}, ModeError, "dtype: expected a dtype code as an int"),
    ((np.ones(2, np.float32), True), {}, ModeError, "dtype: expected a dtype code as an int"),
    ((np.ones(2, np.float16), 290), {"input_dtype": 6}, DTypeError, "a float32 array"),
    ((np.ones(2, np.float16), 5), {"input_dtype": 290}, DTypeError, "a hifloat8 array, or its uint8 bytes"),
    ((np.ones(2, np.float16), 290), {"input_dtype": 15}, DTypeError, "a bfloat16 array"),
])
def test_cast_contract_errors(a950, args, kwargs, err, text):
    with pytest.raises(err, match=text.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ops.npu_dtype_cast(*args, **kwargs)


# ---------------------------------------------------------------------- npu_dynamic_mx_quant
@pytest.mark.parametrize("name", list(FP8))
@pytest.mark.parametrize("scale_alg", [0, 1])
@pytest.mark.parametrize("axis, shape, block", [(-1, (3, 70), 32), (0, (70, 3), 32), (1, (2, 100, 2), 64),
                                                (-1, (2, 96), 96)])
def test_mx_quant_matches_reference(a950, name, scale_alg, axis, shape, block):
    rng = np.random.default_rng(sum(shape) + block)
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(ml_dtypes.bfloat16)
    y, scale = ops.npu_dynamic_mx_quant(x, dst_type=FP8[name][0], axis=axis, block_size=block, scale_alg=scale_alg)
    want_codes, want_scale = ref.mx_quantize(x.astype(np.float32), name, axis, block, scale_alg)
    assert y.dtype == np.dtype(getattr(ml_dtypes, name)) and y.shape == x.shape
    assert scale.dtype == np.uint8 and scale.shape == want_scale.shape
    np.testing.assert_array_equal(y.view(np.uint8), want_codes)
    np.testing.assert_array_equal(scale, want_scale)


@pytest.mark.parametrize("name", list(FP8))
def test_mx_quant_scale_algs_differ_where_the_doc_says(a950, name):
    """Blocks whose amax has a mantissa above max's (1.75 for both FP8 types): scale_alg 1 rounds
    the exponent of amax / max up, one above scale_alg 0's byte (reference), elsewhere equal."""
    x = np.zeros((2, 64), np.float32)
    x[:, 0], x[:, 32] = 1.9, 1.5  # block 0: amax 1.9 (> 1.75), block 1: amax 1.5
    x[1] *= 2.0 ** -20
    x = x.astype(ml_dtypes.bfloat16)
    got = {alg: ops.npu_dynamic_mx_quant(x, dst_type=FP8[name][0], scale_alg=alg)[1] for alg in (0, 1)}
    for alg in (0, 1):
        np.testing.assert_array_equal(got[alg], ref.mx_quantize(x.astype(np.float32), name, -1, 32, alg)[1])
    diff = got[1].astype(int) - got[0].astype(int)
    assert diff[:, 0, 0].tolist() == [1, 1] and diff[:, 0, 1].tolist() == [0, 0]


def test_mx_quant_torch_scalar_type_codes_and_fp16(a950):
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float16)
    for name, (code, scalar) in FP8.items():
        a = ops.npu_dynamic_mx_quant(x, dst_type=code)
        b = ops.npu_dynamic_mx_quant(x, dst_type=scalar)
        want_codes, want_scale = ref.mx_quantize(x.astype(np.float32), name, -1, 32, 0)
        for y, s in (a, b):
            np.testing.assert_array_equal(y.view(np.uint8), want_codes)
            np.testing.assert_array_equal(s, want_scale)


@pytest.mark.parametrize("soc", NOT_950)
def test_mx_quant_rejected_on_a2_a3(monkeypatch, soc):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    with pytest.raises(ModeError, match=rf"^dst_type: When dst_type is 292 \(float8_e4m3fn\), not support on this "
                                        rf"soc version {soc} "):
        ops.npu_dynamic_mx_quant(np.ones((2, 32), np.float16), dst_type=292)


@pytest.mark.parametrize("kwargs, err, text", [
    ({}, ModeError, "dst_type: expected an FP8 code"),  # the schema's default 296 (fp4)
    ({"dst_type": 290}, ModeError, "dst_type: expected an FP8 code"),
    ({"dst_type": 292, "round_mode": "round"}, ModeError, "round_mode"),
    ({"dst_type": 292, "scale_alg": 2}, ModeError, "scale_alg"),
    ({"dst_type": 292, "scale_alg": None}, ModeError, "scale_alg"),
    ({"dst_type": 292, "block_size": 48}, ModeError, "block_size"),
    ({"dst_type": 292, "axis": 2}, ShapeError, "axis"),
])
def test_mx_quant_contract_errors(a950, kwargs, err, text):
    with pytest.raises(err, match=text):
        ops.npu_dynamic_mx_quant(np.ones((2, 32), np.float16), **kwargs)


def test_mx_quant_input_dtype_and_rank(a950):
    with pytest.raises(DTypeError, match="input"):
        ops.npu_dynamic_mx_quant(np.ones((2, 32), np.float32), dst_type=292)
    with pytest.raises(ShapeError, match="input"):
        ops.npu_dynamic_mx_quant(np.array(1.0, np.float16), dst_type=292)


# ---------------------------------------------------------------------- the drop-in
@pytest.fixture
def tnpu():
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    return torch, torch_npu


def test_drop_in_takes_torch_dtypes_and_codes(a950, tnpu):
    torch, torch_npu = tnpu
    x = torch.tensor(specials(np.float32)[:64]).to(torch.bfloat16).npu()
    want = ref.hif8_encode(x.float().cpu().numpy())
    for call in (lambda: torch_npu.npu_dtype_cast(x, torch_npu.hifloat8),
                 lambda: torch.ops.npu.npu_dtype_cast(x, 290)):
        y = call()
        assert y.dtype == torch.uint8 and y.device.type == "npu"
        np.testing.assert_array_equal(y.cpu().numpy(), want)
    back = torch_npu.npu_dtype_cast(y, torch.float32, input_dtype=290)
    np.testing.assert_array_equal(back.cpu().numpy(), ref.HIF8_TABLE[want].astype(np.float32))
    f = torch_npu.npu_dtype_cast(x, dtype=torch.float8_e5m2)
    assert f.dtype == torch.float8_e5m2
    q, s = torch_npu.npu_dynamic_mx_quant(x.reshape(2, 32), dst_type=torch.float8_e4m3fn, scale_alg=1)
    want_codes, want_scale = ref.mx_quantize(x.reshape(2, 32).float().cpu().numpy(), "float8_e4m3fn", -1, 32, 1)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8 and tuple(s.shape) == (2, 1, 2)
    np.testing.assert_array_equal(q.view(torch.uint8).cpu().numpy(), want_codes)
    np.testing.assert_array_equal(s.cpu().numpy(), want_scale)


def test_drop_in_rejects_options_and_a2(monkeypatch, tnpu):
    torch, torch_npu = tnpu
    x = torch.ones(2, 32, dtype=torch.float16)
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)
    with pytest.raises(ModeError, match="dst_type_max"):
        torch_npu.npu_dynamic_mx_quant(x, dst_type=292, dst_type_max=448.0)
    with pytest.raises(DTypeError, match="torch.qint8"):
        torch_npu.npu_dtype_cast(x, torch.float16, input_dtype=torch.qint8)
    with pytest.raises(DTypeError, match=r"expected a int32 array.*got a \[2, 32\] float16"):
        torch_npu.npu_dtype_cast(x, torch.float16, input_dtype=torch.int32)
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend910_9391")
    with pytest.raises(ModeError, match="not support on this soc version Ascend910_9391"):
        torch_npu.npu_dynamic_mx_quant(x, dst_type=torch.float8_e4m3fn)


def test_fake_kernels(a950, tnpu):
    torch, _ = tnpu
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 70, dtype=torch.bfloat16)
        assert torch.ops.npu.npu_dtype_cast(x, 290).dtype == torch.uint8
        assert torch.ops.npu.npu_dtype_cast(x, torch.float8_e5m2).dtype == torch.float8_e5m2
        y, s = torch.ops.npu.npu_dynamic_mx_quant(x, dst_type=292, axis=0)
        assert y.dtype == torch.float8_e4m3fn and tuple(y.shape) == (4, 70) and tuple(s.shape) == (1, 70, 2)


# ---------------------------------------------------------------------- npu_format_cast, the 950 8-bit rows
@pytest.mark.parametrize("shape", [(40, 70), (2, 17, 33)])
@pytest.mark.parametrize("row", ["fp8", "fp8 bytes", "hif8"])
def test_format_cast_950_rows_nz_c0_32(a950, shape, row):
    from tests.reference import layouts as ref_layouts

    raw = np.random.default_rng(3).integers(0, 256, shape, dtype=np.uint8)
    x, kw = {"fp8": (raw.view(ml_dtypes.float8_e4m3fn), {"customize_dtype": 292}),
             "fp8 bytes": (raw, {"customize_dtype": 24, "input_dtype": 292}),
             "hif8": (raw, {"customize_dtype": 290, "input_dtype": 290})}[row]
    z = ops.npu_format_cast(x, 29, **kw)
    assert ops.get_npu_format(z) == 29 and z.dtype == x.dtype
    storage = z.storage()
    assert storage.shape[-1] == 32  # aclnnNpuFormatCast: C0 = 32 bytes / 1-byte type
    np.testing.assert_array_equal(storage.view(np.uint8), ref_layouts.nd_to_nz_transdata(raw))
    np.testing.assert_array_equal(np.asarray(z).view(np.uint8), raw)  # logical values unchanged


@pytest.mark.parametrize("soc", NOT_950)
def test_format_cast_950_rows_rejected_on_a2_a3(monkeypatch, soc):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    with pytest.raises(ModeError, match=rf"^customize_dtype: When customize_dtype is 290 \(hifloat8\), not support "
                                        rf"on this soc version {soc} "):
        ops.npu_format_cast(np.zeros((16, 32), np.uint8), 29, customize_dtype=290, input_dtype=290)


@pytest.mark.parametrize("x, acl_format, kw, err, text", [
    (np.zeros((16, 32), np.uint8), 29, {}, DTypeError, "with the Ascend 950's customize_dtype"),
    (np.zeros((16, 32), np.float16), 29, {"customize_dtype": 5}, ModeError, "float16 data, customize_dtype 5"),
    (np.zeros((16, 32), np.float32), 29, {"customize_dtype": 292}, ModeError, "float32 data, customize_dtype 292"),
    (np.zeros((16, 32), np.uint8), 2, {"customize_dtype": 290, "input_dtype": 290}, ModeError, "acl_format 2"),
    (np.zeros((16, 32), np.uint8), 29, {"customize_dtype": 292, "input_dtype": 290}, ModeError, "hifloat8 data"),
    (np.zeros((16, 32), np.int8), 29, {"customize_dtype": 290, "input_dtype": 290}, DTypeError, "for hifloat8 data"),
    (np.zeros((16, 32), np.uint8), 29, {"input_dtype": 290}, ModeError, "customize_dtype: expected a dtype code"),
])
def test_format_cast_customize_contract(a950, x, acl_format, kw, err, text):
    with pytest.raises(err, match=text):
        ops.npu_format_cast(x, acl_format, **kw)


def test_format_cast_950_drop_in(a950, tnpu):
    torch, torch_npu = tnpu
    from ascend_emu.torch_npu._convert import to_numpy
    from tests.reference import layouts as ref_layouts

    w = torch.randn(40, 70).to(torch.float8_e4m3fn).npu()
    z = torch_npu.npu_format_cast(w, 29, customize_dtype=torch.float8_e4m3fn)
    assert torch_npu.get_npu_format(z) == 29 and z.dtype == torch.float8_e4m3fn
    np.testing.assert_array_equal(to_numpy(z).storage().view(np.uint8),
                                  ref_layouts.nd_to_nz_transdata(w.view(torch.uint8).cpu().numpy()))
    h = torch.ops.npu.npu_format_cast(torch.zeros(16, 32, dtype=torch.uint8), 29, customize_dtype=290, input_dtype=290)
    assert torch_npu.get_npu_format(h) == 29
    with pytest.raises(ModeError, match="customize_dtype"):
        torch_npu.npu_format_cast_(w, 29, customize_dtype=torch.float8_e4m3fn)  # the in-place overload: not emulated
