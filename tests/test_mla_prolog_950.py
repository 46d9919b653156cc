"""npu_mla_prolog_v3 on an emulated Ascend 950: weight_quant_mode 3 (MXFP8), 4 (FP8) and 5 (HiF8)
with a non-quant or per-tensor kv_cache, against tests/reference/mla_prolog_950.py; the widened
shapes (He 1024, Hcq 2048, D 192); each mode rejected on Atlas A2 / A3 with nothing written; the
torch_npu drop-in (torch float8 / float8_e8m0fnu tensors, hifloat8 as uint8 with dtype codes).

Small shapes (T = 3, N = 2, He = 1024). 8-bit outputs: the share of identical codes has a floor
and every other code is one step away; bf16 / fp32 outputs: the dual 0.005 criterion plus a
floor on the bit-identical share; bytes outside the written cache rows are byte-exact. The
scenario table here (dtypes, scales) is written from the torch_npu doc, not taken from the op.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.errors import DTypeError, ModeError, ShapeError
from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3
from tests.helpers import assert_same_bytes, bit_identical_share, dual_threshold_ok, poisoned
from tests.reference import formats_950 as fmt
from tests.reference import mla_prolog as ref_a2
from tests.reference import mla_prolog_950 as ref

A950 = "Ascend950PR_9599"
NOT_950 = ["Ascend910B2", "Ascend910_9391"]
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
HE, HCKV, DR, T, N = 1024, 512, 64, 3, 2
#: (weight_quant_mode, kv_cache_quant_mode, query_quant_mode) of the doc's mxfp8 / fp8 / hif8 rows.
MODES = [(3, 0, 0), (3, 1, 1), (3, 3, 0), (4, 0, 0), (4, 1, 1), (4, 3, 0), (5, 0, 0), (5, 1, 1), (5, 3, 0)]
ELEMENT = {3: "float8_e4m3fn", 4: "float8_e4m3fn", 5: "hifloat8"}
#: Measured: every code / bf16 value identical to the reference in these cases; the floors leave
#: room for another BLAS's fp32 summation order, not for a wrong step.
SHARE = 0.99
#: Largest relative gap between neighbouring codes of normal values (E4M3FN 3 mantissa bits; HiF8
#: 1 bit in its widest binades).
STEP = {"float8_e4m3fn": 0.125, "hifloat8": 0.5}
#: Floor of the bit-identical share of the fp32 dynamic scales (3 or 6 per case; measured 1.0).
SCALE_SHARE = 0.66
HIF8 = 290
#: Per-tile rows: 512 codes | 64 bf16 k_rope | 4 fp32 scales.
ROW_BYTES = 656


@pytest.fixture
def a950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)


# ---------------------------------------------------------------------- data
def codes(rng, shape, element) -> np.ndarray:
    """Random 8-bit codes (uint8) of values with 0.25 <= |v| <= 2, picked from the reference
    tables."""
    table = fmt.HIF8_TABLE if element == "hifloat8" else fmt.fp8_table(element)
    ok = np.flatnonzero((np.abs(np.nan_to_num(table)) >= 0.25) & (np.abs(np.nan_to_num(table)) <= 2.0))
    return ok[rng.integers(0, ok.size, shape)].astype(np.uint8)


def as_element(c, element):
    """Codes as the op takes them: an ml_dtypes FP8 array, or the uint8 HiF8 codes."""
    return c if element == "hifloat8" else c.view(FP8)


def nz(c, element):
    if element == "hifloat8":
        return npu_format_cast(c, 29, customize_dtype=HIF8, input_dtype=HIF8)
    return npu_format_cast(c.view(FP8), 29, customize_dtype=292)


class Case:
    """Inputs of one scenario (codes and scales) and the reference results."""

    def __init__(self, modes, *, hcq=1536, d=128, n=N, smooth=False, seed=5, ckv_scale=3.0):
        rng = np.random.default_rng(seed)
        self.modes, self.hcq, self.d, self.n = modes, hcq, d, n
        mode, kvq, _ = modes
        el = self.element = ELEMENT[mode]
        qk = n * (d + DR)
        self.x = codes(rng, (T, HE), el)  # [T, He]
        self.w = dict(weight_dq=codes(rng, (HE, hcq), el), weight_uq_qr=codes(rng, (hcq, qk), el),
                      weight_dkv_kr=codes(rng, (HE, HCKV + DR), el))
        normal = lambda shape, s=1.0: (rng.standard_normal(shape, dtype=np.float32) * np.float32(s)).astype(BF16)
        self.w_uk = normal((n, d, HCKV), d ** -0.5)
        self.gamma_cq, self.gamma_ckv = normal((hcq,)), normal((HCKV,))
        self.sin, self.cos = normal((T, DR)), normal((T, DR))
        if mode == 3:  # E8M0 bytes, 2**-9 .. 2**-4
            e8 = lambda shape: rng.integers(118, 124, shape).astype(np.uint8)
            self.scales = dict(dequant_scale_x=e8((T, HE // 32)), dequant_scale_w_dq=e8((hcq, HE // 32)),
                               dequant_scale_w_uq_qr=e8((qk, hcq // 32)),
                               dequant_scale_w_dkv_kr=e8((HCKV + DR, HE // 32)))
        else:
            u = lambda shape: rng.uniform(1e-3, 2e-3, shape).astype(np.float32)
            self.scales = dict(dequant_scale_x=u((T, 1)), dequant_scale_w_dq=u((1, hcq)),
                               dequant_scale_w_uq_qr=u((1, qk)), dequant_scale_w_dkv_kr=u((1, HCKV + DR)))
            if smooth:
                self.scales["smooth_scales_cq"] = rng.uniform(0.5, 1.5, (1, hcq)).astype(np.float32)
        if kvq == 1:
            self.scales["quant_scale_ckv"] = np.array([ckv_scale], np.float32)
        if kvq == 3:  # required in fp8 / hif8 per-tile; optional in mxfp8 (vllm-ascend passes it)
            self.scales["k_nope_clip_alpha"] = np.array([0.5], np.float32)  # not applied to 8-bit tiles
        self.gold = ref.mla_prolog_950(self.x, self.w["weight_dq"], self.w["weight_uq_qr"], self.w_uk,
                                       self.w["weight_dkv_kr"], self.gamma_cq, self.gamma_ckv, self.sin, self.cos,
                                       mode=mode, kv_quant=kvq, scales=self.scales, qc_qr_scale=0.5, kc_scale=2.0)

    def kwargs(self) -> dict:
        """Scales as the op takes them (E8M0 as ml_dtypes float8_e8m0fnu), modes and dtype tags."""
        mode, kvq, qqm = self.modes
        kw = {k: (v.view(E8M0) if v.dtype == np.uint8 else v) for k, v in self.scales.items()}
        kw.update(weight_quant_mode=mode, kv_cache_quant_mode=kvq, query_quant_mode=qqm, query_norm_flag=True,
                  qc_qr_scale=0.5, kc_scale=2.0, ckvkr_repo_mode=int(kvq == 3), quant_scale_repo_mode=int(kvq == 3))
        if mode == 5:
            kw.update(token_x_dtype=HIF8, weight_dq_dtype=HIF8, weight_uq_qr_dtype=HIF8, weight_dkv_kr_dtype=HIF8,
                      kv_cache_dtype=HIF8 if kvq else None)
        return kw

    def inputs(self) -> tuple:
        el = self.element
        return (as_element(self.x, el), nz(self.w["weight_dq"], el), nz(self.w["weight_uq_qr"], el), self.w_uk,
                nz(self.w["weight_dkv_kr"], el), self.gamma_cq, self.gamma_ckv, self.sin, self.cos)

    def caches(self, block_num=2, block_size=16):
        kvq = self.modes[1]
        kv_dtype = BF16 if not kvq else (np.dtype(np.uint8) if self.element == "hifloat8" else FP8)
        if kvq == 3:  # 656-byte rows; kr_cache empty
            return poisoned((block_num, block_size, 1, ROW_BYTES), kv_dtype), np.zeros((0,), BF16)
        return (poisoned((block_num, block_size, 1, HCKV), kv_dtype), poisoned((block_num, block_size, 1, DR), BF16))


_CASES = {}


def case(modes, **kw) -> Case:
    key = (modes, tuple(sorted(kw.items())))
    if key not in _CASES:
        _CASES[key] = Case(modes, **kw)
    return _CASES[key]


# ---------------------------------------------------------------------- checks
def assert_codes(got, want, element, what):
    """8-bit codes: identical share >= SHARE; others within one code step (relative)."""
    g, w = np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8)
    assert g.shape == w.shape, f"{what}: shape {g.shape} vs {w.shape}"
    share = np.count_nonzero(g == w) / g.size
    assert share >= SHARE, f"{what}: {share:.4f} of the codes identical"
    gv, wv = ref.decode(g, element).astype(np.float64), ref.decode(w, element).astype(np.float64)
    gap = np.abs(gv - wv) / np.maximum(np.maximum(np.abs(gv), np.abs(wv)), 2.0 ** -20)
    assert gap.max(initial=0) <= STEP[element] + 1e-9, f"{what}: a code {gap.max():.3f} (relative) away"


def assert_float(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    assert dual_threshold_ok(got, want, 0.005), f"{what}: fails the dual 0.005 criterion"
    share = bit_identical_share(got, want)
    assert share >= SHARE, f"{what}: bit-identical share {share:.4f}"


def assert_scales(got, want, rtol, what):
    """fp32 dynamic scales: within ``rtol`` (a bf16 ulp of amax for the query's), and most of them
    bit-identical (``amax * fp32(1/448)`` and ``amax / 448`` differ in the last bit for part of
    the values: a floor of 2 / 3 catches that order)."""
    np.testing.assert_allclose(got, want, rtol=rtol, err_msg=what)
    share = bit_identical_share(got, want)
    assert share >= SCALE_SHARE, f"{what}: bit-identical share {share:.3f}"


def assert_cache(cache, before, rows, slots, *, nz_layout, block_size, what, element=None):
    """Bytes outside the written rows unchanged (byte-exact); written rows against ``rows``."""
    live = [s for s in slots if s >= 0]
    live_rows = np.asarray([r for r, s in zip(rows, slots, strict=True) if s >= 0])
    got = ref_a2.read_rows(cache.view(np.uint8) if element else cache, live, nz=nz_layout, block_size=block_size)
    rest, want_rest = cache.copy(), before.copy()
    for c in (rest, want_rest):  # the written rows set equal on both sides: the rest must match byte for byte
        ref_a2.write_rows(c.view(np.uint8) if element else c, live_rows, live, nz=nz_layout, block_size=block_size)
    assert_same_bytes(rest, want_rest, f"{what} outside the written rows")
    if element and got.shape[-1] == ROW_BYTES:  # per-tile rows: codes | bf16 k_rope | fp32 scales
        rope, scale = slice(HCKV, HCKV + 2 * DR), slice(HCKV + 2 * DR, ROW_BYTES)
        assert_codes(got[:, :HCKV], live_rows[:, :HCKV], element, f"{what} k_nope")
        part = lambda a, sl, dt: np.ascontiguousarray(a[:, sl]).view(dt)  # noqa: E731
        assert_float(part(got, rope, BF16), part(live_rows, rope, BF16), f"{what} k_rope")
        assert_scales(part(got, scale, np.float32), part(live_rows, scale, np.float32), 1e-6, f"{what} scales")
    elif element:
        assert_codes(got, live_rows, element, what)
    else:
        assert_float(got, live_rows.astype(BF16), what)


# ---------------------------------------------------------------------- the modes against the reference
#: Every mode in PA_BSND; PA_NZ (C0 = 32 one-byte elements) once per kv_cache dtype kind.
REF_CASES = [(m, "PA_BSND") for m in MODES] + [((4, 0, 0), "PA_NZ"), ((4, 1, 1), "PA_NZ")]


@pytest.mark.parametrize("modes, cache_mode", REF_CASES, ids=[f"{m}-{c}" for m, c in REF_CASES])
def test_950_modes_match_reference(a950, modes, cache_mode):
    c = case(modes, smooth=modes[0] == 4)
    kv, kr = c.caches()
    kv_before, kr_before = kv.copy(), kr.copy()
    cache_index = np.array([5, -1, 20], np.int64)
    out = npu_mla_prolog_v3(*c.inputs(), kv, kr, cache_index=cache_index, cache_mode=cache_mode, **c.kwargs())
    query, query_rope, dq_nope, query_norm, dq_norm = out
    g, el, mode, kvq = c.gold, c.element, modes[0], modes[1]

    # dtypes / shapes as torch_npu's meta function gives them
    carrier = np.dtype(np.uint8) if el == "hifloat8" else FP8
    assert query_norm.dtype == carrier and query_norm.shape == (T, c.hcq)
    assert dq_norm.shape == ((T, c.hcq // 32) if mode == 3 else (T, 1))
    assert dq_norm.dtype == (E8M0 if mode == 3 else np.float32)
    assert_codes(query_norm, g["query_norm"], el, "query_norm")
    if mode == 3:
        same = np.count_nonzero(dq_norm.view(np.uint8) == g["dequant_scale_q_norm"]) / dq_norm.size
        assert same >= SHARE, f"dequant_scale_q_norm: {same:.3f} of the E8M0 bytes equal"
    else:
        assert_scales(dq_norm, g["dequant_scale_q_norm"], 1e-6, "dequant_scale_q_norm")
    if modes[2]:
        assert query.dtype == carrier and query.shape == (T, N, HCKV)
        assert_codes(query, g["query"], el, "query")
        assert dq_nope.shape == (T, N, 1) and dq_nope.dtype == np.float32
        assert_scales(dq_nope, g["dequant_scale_q_nope"], 0.005, "dequant_scale_q_nope")
    else:
        assert dq_nope.shape == (0,)
        assert_float(query, g["query"], "query")
    assert_float(query_rope, g["query_rope"], "query_rope")
    slots = ref_a2.slots_paged(cache_index)
    nz_layout = cache_mode == "PA_NZ"
    assert_cache(kv, kv_before, g["kv"], slots, nz_layout=nz_layout, block_size=16, what="kv_cache",
                 element=el if kvq else None)
    if kvq == 3:
        assert kr.size == 0
    else:
        assert_cache(kr, kr_before, g["kr"], slots, nz_layout=nz_layout, block_size=16, what="kr_cache")


@pytest.mark.parametrize("modes", [(4, 1, 1), (5, 1, 1)], ids=["fp8", "hif8"])
def test_950_per_tensor_kv_quant_saturates(a950, modes):
    """kv_cache_quant_mode 1 with a quant_scale_ckv that takes most ``|kv * scale|`` past the
    element's largest value (E4M3FN 448; HiF8 32768, and past 40960, where a cast without
    saturation rounds to Inf): the cache holds the +-max codes (``SatMode::SAT``), never a NaN or
    Inf code, and every code equals the reference's."""
    c = case(modes, smooth=modes[0] == 4, ckv_scale=1e7)
    kv, kr = c.caches()
    cache_index = np.array([5, -1, 20], np.int64)
    npu_mla_prolog_v3(*c.inputs(), kv, kr, cache_index=cache_index, cache_mode="PA_BSND", **c.kwargs())
    slots = ref_a2.slots_paged(cache_index)
    live = [s for s in slots if s >= 0]
    got = ref_a2.read_rows(kv.view(np.uint8), live, nz=False, block_size=16)  # [2, 512] codes
    want = np.asarray([r for r, s in zip(c.gold["kv"], slots, strict=True) if s >= 0]).view(np.uint8)
    top = ref.MAX_VALUE[c.element]
    saturated = np.abs(ref.decode(want, c.element).astype(np.float64)) == top
    assert saturated.mean() > 0.5  # the data reaches the saturation
    values = ref.decode(got, c.element).astype(np.float64)
    assert np.isfinite(values).all(), "kv_cache holds NaN / Inf codes"
    np.testing.assert_array_equal(got[saturated], want[saturated])
    assert_codes(got, want, c.element, "kv_cache")


def test_950_widened_shapes(a950):
    """Hcq 2048 and D 192 (the current doc's shape table), one head, fp8 full quant."""
    c = case((4, 0, 0), hcq=2048, d=192, n=1, seed=9)
    kv, kr = c.caches()
    out = npu_mla_prolog_v3(*c.inputs(), kv, kr, cache_index=np.arange(T, dtype=np.int64), **c.kwargs())
    assert out[0].shape == (T, 1, HCKV) and out[3].shape == (T, 2048)
    assert_codes(out[3], c.gold["query_norm"], c.element, "query_norm")
    assert_float(out[0], c.gold["query"], "query")
    assert_float(out[1], c.gold["query_rope"], "query_rope")


# ---------------------------------------------------------------------- the contract
@pytest.mark.parametrize("soc", NOT_950)
@pytest.mark.parametrize("mode", [3, 4, 5])
def test_950_modes_rejected_on_a2_a3(monkeypatch, a950, soc, mode):
    c = case((mode, 1, 1))
    inputs, kw = c.inputs(), c.kwargs()  # NZ casts of 8-bit weights need the 950
    kv, kr = c.caches()
    before = kv.copy(), kr.copy()
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    what = {3: "mxfp8", 4: "fp8", 5: "hif8"}[mode]
    with pytest.raises(ModeError, match=rf"^weight_quant_mode: When weight_quant_mode is {mode} \({what} full "
                                        rf"quant\), not support on this soc version {soc} "):
        npu_mla_prolog_v3(*inputs, kv, kr, cache_index=np.array([1, 2, 3]), **kw)
    assert_same_bytes(kv, before[0], "kv_cache")
    assert_same_bytes(kr, before[1], "kr_cache")


@pytest.mark.parametrize("soc", NOT_950)
def test_hifloat8_tags_rejected_on_a2_a3(monkeypatch, soc):
    args = _bf16_call_args(7168)
    before = args[9].copy()
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", soc)
    with pytest.raises(ModeError, match=rf"^token_x_dtype: When token_x_dtype is 290 .*not support on this soc "
                                        rf"version {soc} "):
        npu_mla_prolog_v3(*args, cache_index=np.arange(T, dtype=np.int64), token_x_dtype=HIF8)
    assert_same_bytes(args[9], before, "kv_cache")


def _bf16_call_args(he, hcq=1536, d=128):
    z = lambda shape: np.zeros(shape, BF16)
    return (z((T, he)), npu_format_cast(z((he, hcq)), 29), npu_format_cast(z((hcq, N * (d + DR))), 29), z((N, d, HCKV)),
            npu_format_cast(z((he, HCKV + DR)), 29), z((hcq,)), z((HCKV,)), z((T, DR)), z((T, DR)),
            z((2, 16, 1, HCKV)), z((2, 16, 1, DR)))


@pytest.mark.parametrize("he, hcq, d, what", [(1024, 1536, 128, "He"), (7168, 2048, 128, "Hcq"),
                                              (7168, 1536, 192, "D")])
def test_widened_shapes_only_on_950(monkeypatch, he, hcq, d, what):
    """A2 / A3 keep He 7168 / 7680, Hcq 1536, D 128; the 950 takes the doc's wider table (bf16 here)."""
    args = _bf16_call_args(he, hcq, d)
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend910B2")
    with pytest.raises(ShapeError, match=rf"{what} ="):
        npu_mla_prolog_v3(*args, cache_index=np.arange(T, dtype=np.int64))
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)
    out = npu_mla_prolog_v3(*args, cache_index=np.arange(T, dtype=np.int64), query_norm_flag=True)
    assert out[3].shape == (T, hcq)


def test_950_contract_errors(a950):
    c3, c5 = case((3, 1, 1)), case((5, 1, 1))

    def call(c, **over):
        kv, kr = c.caches()
        before = kv.copy()
        kw = {**c.kwargs(), **over}
        try:
            return npu_mla_prolog_v3(*c.inputs(), kv, kr, cache_index=np.array([1, 2, 3]), **kw)
        finally:
            assert_same_bytes(kv, before, "kv_cache after a rejected call")

    f32_scale = np.ones((T, HE // 32), np.float32)
    with pytest.raises(DTypeError, match="dequant_scale_x.*float8_e8m0fnu"):
        call(c3, dequant_scale_x=f32_scale)
    with pytest.raises(ShapeError, match=r"dequant_scale_w_dq: expected shape \[1536, 32\]"):
        call(c3, dequant_scale_w_dq=np.zeros((1, 1536), np.uint8).view(E8M0))
    with pytest.raises(ModeError, match="smooth_scales_cq"):
        call(c3, smooth_scales_cq=np.ones((1, 1536), np.float32))
    with pytest.raises(ModeError, match=r"token_x_dtype: expected torch_npu.hifloat8 \(290\)"):
        call(c5, token_x_dtype=None)
    with pytest.raises(ModeError, match=r"kv_cache_dtype: expected torch_npu.hifloat8 \(290\)"):
        call(c5, kv_cache_dtype=292)
    with pytest.raises(ModeError, match="token_x_dtype: expected None"):
        call(c3, token_x_dtype=HIF8)
    with pytest.raises(ModeError, match=r"mxfp8 mode takes \(kv_cache_quant_mode, query_quant_mode\) \(0, 0\), "
                                        r"\(1, 1\) or \(3, 0\)"):
        call(c3, kv_cache_quant_mode=2, query_quant_mode=0)
    with pytest.raises(ModeError, match="k_nope_clip_alpha: expected a finite clip factor > 0"):
        call(case((3, 3, 0)), k_nope_clip_alpha=np.zeros(1, np.float32))
    with pytest.raises(ShapeError, match="k_nope_clip_alpha"):
        call(case((4, 3, 0)), k_nope_clip_alpha=None)


# ---------------------------------------------------------------------- the drop-in
@pytest.mark.parametrize("modes", [(3, 1, 1), (5, 1, 1)], ids=str)
def test_950_drop_in(a950, modes):
    """torch float8 / float8_e8m0fnu tensors (MXFP8) and uint8 hifloat8 with dtype codes, through
    torch_npu and torch.ops.npu: the NumPy API's bytes; the fake kernel's shapes and dtypes."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    c = case(modes)
    kv, kr = c.caches()
    want = npu_mla_prolog_v3(*c.inputs(), kv, kr, cache_index=np.array([1, 2, 3]), **c.kwargs())
    def tt(a):  # a torch tensor of the same bytes and type
        if a.dtype == np.float32:
            return torch.from_numpy(a.copy())
        return torch.from_numpy(np.ascontiguousarray(a).view(np.uint8)).view(
            {FP8: torch.float8_e4m3fn, E8M0: torch.float8_e8m0fnu, BF16: torch.bfloat16}.get(a.dtype, torch.uint8))

    if modes[0] == 3:
        cast = lambda w: torch_npu.npu_format_cast(tt(w.view(FP8)), 29, customize_dtype=torch.float8_e4m3fn)
    else:
        cast = lambda w: torch_npu.npu_format_cast(tt(w), 29, customize_dtype=HIF8, input_dtype=HIF8)
    x = tt(as_element(c.x, c.element))
    args = (x, cast(c.w["weight_dq"]), cast(c.w["weight_uq_qr"]), tt(c.w_uk), cast(c.w["weight_dkv_kr"]),
            tt(c.gamma_cq), tt(c.gamma_ckv), tt(c.sin), tt(c.cos))
    kw = {k: (tt(v) if isinstance(v, np.ndarray) else v) for k, v in c.kwargs().items()}
    kv_t, kr_t = tt(poisoned(kv.shape, kv.dtype)), tt(poisoned(kr.shape, BF16))
    got = torch_npu.npu_mla_prolog_v3(*args, kv_t, kr_t, cache_index=torch.tensor([1, 2, 3]), **kw)
    for name, g, w in zip(("query", "query_rope", "dequant_scale_q_nope", "query_norm", "dequant_scale_q_norm"),
                          got, want, strict=True):
        assert_same_bytes(g.contiguous().view(torch.uint8).numpy(), w, name)
    assert_same_bytes(kv_t.view(torch.uint8).numpy(), kv, "kv_cache")
    kv_f = tt(poisoned(kv.shape, kv.dtype))
    functional = torch.ops.npu.npu_mla_prolog_v3_functional(*args, kv_f, tt(poisoned(kr.shape, BF16)),
                                                            cache_index=torch.tensor([1, 2, 3]), **kw)
    assert_same_bytes(functional[5].view(torch.uint8).numpy(), kv, "functional kv_cache")
    assert_same_bytes(kv_f.view(torch.uint8).numpy(), poisoned(kv.shape, kv.dtype), "functional: input kept")
    meta = lambda a: torch.empty_like(a, device="meta") if isinstance(a, torch.Tensor) else a  # noqa: E731
    fake = torch.ops.npu.npu_mla_prolog_v3(*map(meta, args), meta(kv_t), meta(kr_t),
                                           cache_index=meta(torch.tensor([1, 2, 3])),
                                           **{k: meta(v) for k, v in kw.items()})
    assert [(tuple(f.shape), f.dtype) for f in fake] == [(tuple(g.shape), g.dtype) for g in got]


@pytest.mark.parametrize("mode", [4, 5])
def test_950_per_tile_zero_tiles_use_the_amax_floor(a950, mode):
    """A zero kv row (rmsnorm_gamma_ckv = 0): every tile's amax is floored at 1e-4 (arch35
    QuantPerTileVF), so its scale is fp32(1e-4) * fp32(1/max) and its codes are 0 (the int8 rows
    of A2 / A3 write scale 0 there)."""
    c = case((mode, 3, 0))
    args = list(c.inputs())
    args[6] = np.zeros_like(c.gamma_ckv)  # rmsnorm_gamma_ckv
    kv, kr = c.caches()
    npu_mla_prolog_v3(*args, kv, kr, cache_index=np.array([0, 1, 2]), **c.kwargs())
    rows = kv.view(np.uint8).reshape(-1, ROW_BYTES)[:T]
    assert (ref.decode(rows[:, :HCKV], c.element) == 0).all()  # +0 / -0 (E4M3FN has both)
    want = np.float32(1e-4) * (np.float32(1.0) / np.float32(ref.MAX_VALUE[c.element]))
    assert_same_bytes(np.ascontiguousarray(rows[:, HCKV + 2 * DR:]).view(np.float32), np.full((T, 4), want, np.float32),
                      "tile scales")


def test_950_vllm_ascend_mxfp8_call(a950):
    """vllm-ascend's A5 MXFP8 prolog call (``AscendW8A8MXFP8DynamicLinearMethod`` branch): token_x
    and its scales from ``npu_dynamic_mx_quant(hidden_states, dst_type=torch.float8_e4m3fn)``, the
    scale pairs reshaped to ``[T, He/32]`` and viewed as float8_e8m0fnu; against the reference on
    the same codes and scales."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    c = case((3, 0, 0))
    hidden = torch.randn(T, HE, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    token_x, ds = torch_npu.npu_dynamic_mx_quant(hidden, dst_type=torch.float8_e4m3fn)
    scale_x = ds.reshape(token_x.shape[0], -1).view(torch.float8_e8m0fnu)  # [T, He/32]
    x_codes = token_x.view(torch.uint8).numpy()
    sx = scale_x.view(torch.uint8).numpy()
    kw = c.kwargs()
    kw["dequant_scale_x"] = sx.view(E8M0)
    kv, kr = c.caches()
    args = c.inputs()
    out = npu_mla_prolog_v3(x_codes.view(FP8), *args[1:], kv, kr, cache_index=np.arange(T, dtype=np.int64), **kw)
    gold = ref.mla_prolog_950(x_codes, c.w["weight_dq"], c.w["weight_uq_qr"], c.w_uk, c.w["weight_dkv_kr"],
                              c.gamma_cq, c.gamma_ckv, c.sin, c.cos, mode=3, kv_quant=0,
                              scales={**c.scales, "dequant_scale_x": sx}, qc_qr_scale=0.5, kc_scale=2.0)
    assert_float(out[0], gold["query"], "query")
    assert_codes(out[3], gold["query_norm"], "float8_e4m3fn", "query_norm")
