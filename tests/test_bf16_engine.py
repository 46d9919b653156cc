"""The bf16-output engine of ``ascend_emu.emu.matmul`` (``matmul_bf16_out``,
``matmul_bf16_out_heads``): the ``auto`` rule (fixed per host, never timed), the ``timed``
setting's per-shape chooser, the fallback to sgemm for operands the bf16
dot-product instructions would flush, the deterministic mode's fixed path, and the non-quant
``npu_mla_prolog_v3`` routed through oneDNN against tests/reference/mla_prolog.py.

The products are checked against float64 sums of the same bf16 values rounded once to bf16
(ml_dtypes RNE), never against the code under test. Needs torch (the engine's oneDNN path).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ascend_emu import _deterministic  # noqa: E402
from ascend_emu.emu import matmul  # noqa: E402
from ascend_emu.errors import ModeError  # noqa: E402
from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3  # noqa: E402
from tests.helpers import dual_threshold_ok, max_ulp_bf16  # noqa: E402
from tests.reference import mla_prolog as ref_prolog  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def engine():
    """Set the engine inside a test; the process's setting and choices restored after."""
    before = matmul.set_bf16_engine(None)
    saved, used = matmul.bf16_choices(), matmul.bf16_engines_used()
    yield matmul.set_bf16_engine
    matmul.set_bf16_engine(before)
    matmul._bf16_choices.clear()
    matmul._bf16_choices.update(saved)
    matmul._bf16_used.clear()
    matmul._bf16_used.update(used)


def ref_bf16(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 ``a @ w`` of the bf16 values, rounded once to bf16 (``[..., M, N]``)."""
    return np.matmul(np.asarray(a, np.float64), np.asarray(w).astype(np.float64)).astype(BF16)


def positive(rng, shape, scale=1.0) -> np.ndarray:
    """bf16 values in [0.5, 1.5) * scale: every sum of products well conditioned, so any fp32
    order lands within one bf16 ulp of the float64 sum (relative error <= K * 2**-24)."""
    return (rng.uniform(0.5, 1.5, shape) * scale).astype(BF16)


def test_onednn_engine_within_one_ulp_of_float64(engine, rng):
    engine("onednn-bf16")
    a = positive(rng, (16, 1024))
    w = positive(rng, (1024, 384), 2**-10)
    got = matmul.matmul_bf16_out(a.astype(np.float32), npu_format_cast(w, 29)).astype(BF16)
    assert max_ulp_bf16(got, ref_bf16(a, w)) <= 1
    heads_a, heads_w = positive(rng, (4, 16, 128)), positive(rng, (4, 128, 512), 2**-7)
    got = matmul.matmul_bf16_out_heads(heads_a.astype(np.float32), heads_w).astype(BF16)
    assert max_ulp_bf16(got, ref_bf16(heads_a, heads_w)) <= 1


@pytest.mark.parametrize("flags", [set(), {"avx512_bf16"}, {"amx_bf16"}], ids=["no bf16 dot", "avx512_bf16", "amx_bf16"])
def test_auto_is_a_fixed_rule(engine, rng, monkeypatch, flags):
    """``auto`` never times: oneDNN exactly where the CPU has bf16 dot-product instructions, the
    product has at least BF16_MIN_ROWS rows and the operands are safe; the same engine, so the
    same bits, on every call however the engines' times compare."""
    engine("auto")
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(matmul, "_timed", lambda fn: pytest.fail("auto timed an engine"))
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: calls.append(1) or real(*xs))  # type: ignore[func-returns-value]
    w = npu_format_cast(positive(rng, (256, 128), 2**-8), 29)
    big = positive(rng, (matmul.BF16_MIN_ROWS, 256)).astype(np.float32)
    small = big[:-1]
    first = matmul.matmul_bf16_out(big, w)
    again = matmul.matmul_bf16_out(big, w)
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))
    assert len(calls) == (2 if flags else 0)
    matmul.matmul_bf16_out(small, w)  # decode-sized: sgemm on every CPU
    assert len(calls) == (2 if flags else 0)
    unsafe = big.copy()
    unsafe[0, 0] = 2.0**-130  # subnormal: sgemm on every CPU
    matmul.matmul_bf16_out(unsafe, w)
    assert len(calls) == (2 if flags else 0)
    used = matmul.bf16_engines_used()
    threads = torch.get_num_threads()
    assert used[("mm", 1, matmul.BF16_MIN_ROWS, 256, 128, threads)] == "sgemm"  # the unsafe call last
    assert used[("mm", 1, matmul.BF16_MIN_ROWS - 1, 256, 128, threads)] == "sgemm"
    assert not matmul.bf16_choices()


def test_cpu_flags_read_once(monkeypatch):
    monkeypatch.setattr(matmul, "_cpu_flag_set", None)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))  # type: ignore[func-returns-value]
    first = matmul._cpu_has_bf16_dot(), matmul._cpu_has_int8_dot()
    assert (matmul._cpu_has_bf16_dot(), matmul._cpu_has_int8_dot()) == first
    assert opened.count("/proc/cpuinfo") <= 1


def test_chooser_times_once_per_shape(engine, rng, monkeypatch):
    engine("timed")
    timings = []
    real = matmul._timed
    monkeypatch.setattr(matmul, "_timed", lambda fn: timings.append(1) or real(fn))  # type: ignore[func-returns-value]
    w = npu_format_cast(positive(rng, (256, 128), 2**-8), 29)
    a = positive(rng, (matmul.BF16_MIN_ROWS, 256)).astype(np.float32)
    first = matmul.matmul_bf16_out(a, w)
    key = ("mm", 1, matmul.BF16_MIN_ROWS, 256, 128, torch.get_num_threads())
    choice = matmul.bf16_choices()[key]
    assert choice in matmul.BF16_ENGINES
    assert len(timings) == 2 * matmul.BF16_CHOICE_ROUNDS
    again = matmul.matmul_bf16_out(a, w)
    assert len(timings) == 2 * matmul.BF16_CHOICE_ROUNDS  # cached: no second timing
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))  # the same engine both times
    small = positive(rng, (matmul.BF16_MIN_ROWS - 1, 256)).astype(np.float32)
    matmul.matmul_bf16_out(small, w)  # decode-sized: sgemm, no timing, no choice
    assert len(timings) == 2 * matmul.BF16_CHOICE_ROUNDS
    assert not any(k[2] == matmul.BF16_MIN_ROWS - 1 for k in matmul.bf16_choices())


def test_setting_rejects_unknown_names(engine, monkeypatch):
    with pytest.raises(ValueError, match=r"set_bf16_engine: name must be one of .* got 'mkl'"):
        engine("mkl")
    engine(None)
    monkeypatch.setenv(matmul.BF16_ENGINE_ENV, "fast")
    with pytest.raises(ModeError, match=rf"{matmul.BF16_ENGINE_ENV}: expected one of .* got 'fast'"):
        matmul.matmul_bf16_out(np.ones((16, 8), np.float32), np.ones((8, 8), BF16))
    for name in ("sgemm", "timed", "auto"):
        monkeypatch.setenv(matmul.BF16_ENGINE_ENV, name)
        assert matmul.bf16_engine_setting() == name


def _tie_case(rng, extra_a: float, extra_w: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose float64 sum sits just above a bf16 rounding tie only through one small product
    ``extra_a * extra_w``: ``2**-110 + 2**-118 (the tie) + extra``; a flush of that product (or
    operand) rounds the tie to even instead. 16 rows, K = 64, N = 64 (oneDNN runs products this
    small with K = 8 on a path that does not flush)."""
    a = np.zeros((16, 64), np.float32)
    w = np.zeros((64, 64), np.float32)
    a[:, 0], w[0] = 2.0**-55, 2.0**-55
    a[:, 1], w[1] = 2.0**-59, 2.0**-59
    a[:, 2], w[2] = extra_a, extra_w
    return a.astype(BF16), w.astype(BF16)


@pytest.mark.parametrize("extra", [(2.0**-130, 2.0**0), (2.0**-65, 2.0**-65)],
                         ids=["subnormal operand", "subnormal product"])
def test_flushed_operands_stay_exact(engine, rng, extra):
    """A subnormal operand (bf16 2**-130) or a product below fp32's normal range (2**-130 from
    two normal operands) would be flushed to zero by the bf16 dot-product instructions; the engine
    keeps such products on sgemm, so the sum keeps it and rounds up past the tie. Measured on
    AMD Zen 4 (AVX512-BF16): oneDNN flushes the subnormal operand, and keeps the subnormal
    product (so that case guards CPUs whose instructions flush products, as Intel documents)."""
    engine("onednn-bf16")
    a, w = _tie_case(rng, *extra)
    want = ref_bf16(a, w)
    assert np.all(want.astype(np.float64) == 2.0**-110 * (1 + 2.0**-7))  # the extra product decides
    for weight in (w, npu_format_cast(w, 29)):
        got = matmul.matmul_bf16_out(a.astype(np.float32), weight).astype(BF16)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    got = matmul.matmul_bf16_out_heads(a.astype(np.float32)[None], w[None]).astype(BF16)
    assert np.array_equal(got[0].view(np.uint16), want.view(np.uint16))


def test_non_bf16_or_non_finite_operands_stay_exact(engine, rng, monkeypatch):
    engine("onednn-bf16")
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: calls.append(1) or real(*xs))  # type: ignore[func-returns-value]
    w = positive(rng, (64, 32))
    a = positive(rng, (16, 64)).astype(np.float32)
    matmul.matmul_bf16_out(a, w)
    assert len(calls) == 1  # safe operands do go to oneDNN
    for bad in (np.float32(1.0) + np.float32(2.0**-20), np.inf, np.nan):  # not a bf16 value, inf, nan
        b = a.copy()
        b[3, 5] = bad
        got = matmul.matmul_bf16_out(b, w)
        assert len(calls) == 1
        want = np.matmul(b.astype(np.float64), w.astype(np.float64))
        finite = np.isfinite(want)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert max_ulp_bf16(got[finite].astype(BF16), want[finite].astype(BF16)) <= 1


def test_deterministic_mode_keeps_its_fixed_path(engine, rng, monkeypatch):
    engine("onednn-bf16")
    monkeypatch.setattr(torch, "matmul", lambda *xs: pytest.fail("oneDNN called in the deterministic mode"))
    a = positive(rng, (16, 96)).astype(np.float32)
    w = positive(rng, (96, 40))
    with _deterministic.scope(True):
        got = matmul.matmul_bf16_out(a, npu_format_cast(w, 29))
        heads = matmul.matmul_bf16_out_heads(a[None], w[None])
    want = matmul.fixed_matmul(a, w.astype(np.float32))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(heads[0].view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------------- the prolog through oneDNN
HE, HCQ, HCKV, D, DR, N, T = 7168, 1536, 512, 128, 64, 8, 16


def test_mla_prolog_non_quant_on_onednn(engine, monkeypatch):
    """All four bf16 products of the non-quant prolog on oneDNN (counted), T = 16, user-style
    weights (``randn / sqrt(fan_in)``), against the float64 reference: the dual 0.005 criterion,
    every error within two bf16 ulps of its row's largest value (no bound in ulps of the element
    itself: on such data sgemm's order too lands hundreds of ulps off on values that cancel near
    zero), and a bit-identical share of at least 0.95, the floor tests/test_rmsnorm_fidelity.py
    holds another fp32 order (OpenBLAS SkylakeX) to: each flipped rounding of query_norm moves
    about 5 % of the query row it feeds across bf16 boundaries. Measured here: query 0.984
    (sgemm 0.991), query_rope 0.997, query_norm 0.9997, kv 0.9996, kr 1.0."""
    engine("onednn-bf16")
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: calls.append(1) or real(*xs))  # type: ignore[func-returns-value]
    rng = np.random.default_rng(37)

    def w(shape, fan_in):
        return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))).astype(BF16)

    w_dq, w_uq_qr, w_uk, w_dkv_kr = w((HE, HCQ), HE), w((HCQ, N * (D + DR)), HCQ), w((N, D, HCKV), D), \
        w((HE, HCKV + DR), HE)
    gamma_cq = (1 + 0.1 * rng.standard_normal(HCQ)).astype(BF16)
    gamma_ckv = (1 + 0.1 * rng.standard_normal(HCKV)).astype(BF16)
    x = rng.standard_normal((T, HE), dtype=np.float32).astype(BF16)
    ang = np.outer(np.arange(T), 10000.0 ** (-np.arange(DR // 2) / (DR // 2)))
    sin, cos = (np.concatenate([f(ang), f(ang)], axis=1).astype(BF16) for f in (np.sin, np.cos))
    kv_cache = np.zeros((1, T, 1, HCKV), BF16)
    kr_cache = np.zeros((1, T, 1, DR), BF16)
    out = npu_mla_prolog_v3(x, npu_format_cast(w_dq, 29), npu_format_cast(w_uq_qr, 29), w_uk,
                            npu_format_cast(w_dkv_kr, 29), gamma_cq, gamma_ckv, sin, cos, kv_cache, kr_cache,
                            cache_index=np.arange(T, dtype=np.int64), cache_mode="PA_BSND", query_norm_flag=True)
    assert len(calls) == 4  # x @ W_dq, cq @ W_uq_qr, q_nope @ W_uk, x @ W_dkv_kr
    gold = ref_prolog.mla_prolog(x, w_dq.astype(np.float64), w_uq_qr.astype(np.float64), w_uk.astype(np.float64),
                                 w_dkv_kr.astype(np.float64), gamma_cq, gamma_ckv, sin, cos)
    got = {"query": out[0], "query_rope": out[1], "query_norm": out[3], "kv": kv_cache.reshape(T, HCKV),
           "kr": kr_cache.reshape(T, DR)}
    for what, actual in got.items():
        want = gold[what].reshape(actual.shape)
        assert dual_threshold_ok(actual, want, 0.005), what
        err = np.abs(actual.astype(np.float64) - want.astype(np.float64))
        scale = np.abs(want.astype(np.float64)).max(axis=-1, keepdims=True)
        assert np.all(err <= scale * 2.0**-7), f"{what}: an error above 2 bf16 ulps of its row's largest value"
        share = float(np.mean(actual.view(np.uint16) == want.view(np.uint16)))
        assert share >= 0.95, f"{what}: bit-identical share {share:.4f}"


# ---------------------------------------------------------------------- bf16 x bf16 -> fp32
def ref_f32_bound(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``a @ b`` and the fp32-accumulation bound ``K * 2**-24 * (|a| @ |b|)`` (every
    product exact, K - 1 fp32 additions in any order; the classical bound with ``K`` for ``K - 1``)."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a64 @ b64, a.shape[-1] * 2.0**-24 * (np.abs(a64) @ np.abs(b64))


def test_f32_engine_runs_onednn_in_bf16_mode_and_restores_the_flag(engine, rng, monkeypatch):
    engine("onednn-bf16")
    flags = torch.backends.mkldnn.matmul
    before = flags.fp32_precision
    seen = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: seen.append(flags.fp32_precision) or real(*xs))  # type: ignore[func-returns-value]
    a = rng.standard_normal((3, 16, 512), dtype=np.float32).astype(BF16).astype(np.float32)
    b = rng.standard_normal((3, 640, 512), dtype=np.float32).astype(BF16).astype(np.float32)
    got = matmul.matmul_bf16_f32(a, b.transpose(0, 2, 1))  # a transposed view, as the attention's K^T
    assert seen == ["bf16"] and flags.fp32_precision == before
    want, bound = ref_f32_bound(a, b.transpose(0, 2, 1))
    assert got.dtype == np.float32 and got.shape == (3, 16, 640)
    assert np.all(np.abs(got - want) <= bound)
    assert np.mean(got.view(np.uint32) & 0xFFFF != 0) > 0.9  # an fp32 result, not rounded to bf16
    monkeypatch.setattr(torch, "matmul", lambda *xs: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        matmul.matmul_bf16_f32(a, b.transpose(0, 2, 1))
    assert flags.fp32_precision == before  # restored on an error too


def test_f32_engine_auto_rule_and_sgemm_setting(engine, rng, monkeypatch):
    a = positive(rng, (16, 256)).astype(np.float32)
    b = positive(rng, (256, 64), 2**-8).astype(np.float32)
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: calls.append(1) or real(*xs))  # type: ignore[func-returns-value]
    monkeypatch.setattr(matmul, "_timed", lambda fn: pytest.fail("auto timed an engine"))
    engine("auto")
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert matmul.bf16_engine_may_run(16) and not matmul.bf16_engine_may_run(15)
    matmul.matmul_bf16_f32(a, b)
    matmul.matmul_bf16_f32(a[:15], b)  # fewer rows: sgemm
    assert len(calls) == 1
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"avx512f"}))
    assert not matmul.bf16_engine_may_run(16)
    got = matmul.matmul_bf16_f32(a, b)
    assert len(calls) == 1
    assert np.array_equal(got.view(np.uint32), np.matmul(a, b).view(np.uint32))  # sgemm's bits
    engine("sgemm")
    monkeypatch.setattr(matmul, "_cpu_flags", lambda: frozenset({"amx_bf16"}))
    assert not matmul.bf16_engine_may_run(1024)
    matmul.matmul_bf16_f32(a, b)
    assert len(calls) == 1


@pytest.mark.parametrize("extra", [(2.0**-130, 2.0**0), (2.0**-65, 2.0**-65)],
                         ids=["subnormal operand", "subnormal product"])
def test_f32_engine_keeps_flushed_operands_exact(engine, rng, extra, monkeypatch):
    """As test_flushed_operands_stay_exact, with an fp32 result: the extra product is part of the
    exact fp32 sum ``2**-110 + 2**-118 + 2**-130``, which a flush would drop. Measured on AMD Zen 4:
    oneDNN's fp32 matmul in bf16 mode kept both at these shapes, so the operands are also checked
    not to reach it (the guard is for CPUs that flush, as Intel documents)."""
    engine("onednn-bf16")
    monkeypatch.setattr(torch, "matmul", lambda *xs: pytest.fail("flushable operands sent to oneDNN"))
    a, w = _tie_case(rng, *extra)
    a32, w32 = a.astype(np.float32), w.astype(np.float32)
    want = np.matmul(a32.astype(np.float64), w32.astype(np.float64))
    assert np.all(want == 2.0**-110 + 2.0**-118 + 2.0**-130)
    got = matmul.matmul_bf16_f32(a32, w32)
    assert np.array_equal(got.astype(np.float64), want)
    got = matmul.matmul_bf16_f32(a32[None], w32[None], a_span=matmul.span(a32), b_span=matmul.span(w32))
    assert np.array_equal(got[0].astype(np.float64), want)


def test_f32_engine_non_bf16_values_and_deterministic_mode(engine, rng, monkeypatch):
    engine("onednn-bf16")
    monkeypatch.setattr(torch, "matmul", lambda *xs: pytest.fail("oneDNN called"))
    a = positive(rng, (16, 96)).astype(np.float32)
    b = positive(rng, (96, 40)).astype(np.float32)
    c = a.copy()
    c[2, 3] += np.float32(2.0**-12)  # not a bf16 value: its low bits would be dropped
    assert np.array_equal(matmul.matmul_bf16_f32(c, b).view(np.uint32), np.matmul(c, b).view(np.uint32))
    with _deterministic.scope(True):
        got = matmul.matmul_bf16_f32(a, b)
    assert np.array_equal(got.view(np.uint32), matmul.fixed_matmul(a, b).view(np.uint32))


def test_shared_kv_attention_through_the_f32_engine(engine, monkeypatch):
    """npu_sparse_attn_sharedkv with both products on oneDNN (counted): within the dual criterion
    of the float64 reference, with the bit-identical share test_sparse_attn_sharedkv.py asserts
    (measured the same to three digits on sgemm and oneDNN, 99.8-100 % of outputs equal)."""
    from ascend_emu import ops
    from tests import test_sparse_attn_sharedkv as skv_tests
    from tests.helpers import bit_identical_share

    engine("onednn-bf16")
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: calls.append(1) or real(*xs))  # type: ignore[func-returns-value]
    c = skv_tests._case(**skv_tests.CASES["hca"])
    q, kw = skv_tests._call_args(c)
    gold = skv_tests._golden(c)
    got = ops.npu_sparse_attn_sharedkv(q, **kw)[0].reshape(gold.shape)
    assert len(calls) >= 2
    assert dual_threshold_ok(got, gold, 0.005)
    share = bit_identical_share(got, gold.astype(np.float32).astype(BF16))
    assert skv_tests.SHARE_RANGE[0] <= share <= skv_tests.SHARE_RANGE[1]


#: Bit-identical shares of test_sparse_flash_attention.py's bigger bf16 cases (its LAYOUTS order)
#: with both products on oneDNN, measured on an AVX-512 bf16 CPU (on sgemm: 0.9986, 0.9998, 0.9999,
#: 1.0); asserted less that file's SHARE_MARGIN.
SFA_ONEDNN_SHARES = (1.0, 1.0, 0.9995, 1.0)


def test_sparse_flash_attention_through_the_f32_engine(engine, monkeypatch):
    """npu_sparse_flash_attention (separate value) and npu_kv_quant_sparse_flash_attention with
    q @ K^T and P @ V on oneDNN (counted: 64 heads, up to 80 kept rows a unit): the official
    criterion, every (token, head) row within the bound, and the bit-identical share against
    tests/reference/sparse_flash_attention.py."""
    from tests import test_sparse_flash_attention as sfa

    engine("onednn-bf16")
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: calls.append(1) or real(*xs))  # type: ignore[func-returns-value]
    for i, (lq, lk) in enumerate(sfa.LAYOUTS):
        quant = i % 2 == 1
        case = sfa.make_case(np.random.default_rng(100 + i), quant=quant, layout_query=lq, layout_kv=lk,
                             dtype="bfloat16", sbs=2, n1=64, act_q=(2, 1), act_kv=(90, 64), k=40)
        del calls[:]
        out = sfa.run_op(case, quant=quant, sparse_mode=3)[0]
        assert len(calls) >= 2, f"{lq}/{lk}: {len(calls)} products on oneDNN"
        gold = sfa.run_reference(case, quant=quant, sparse_mode=3)[0]
        sfa.assert_matches(out, gold, f"attention_out {lq}/{lk} on oneDNN", SFA_ONEDNN_SHARES[i])


def test_lightning_indexer_through_the_f32_engine(engine, monkeypatch):
    """npu_lightning_indexer's q . k product on oneDNN (counted; 64 heads): integer-valued data
    (every fp32 sum exact in any order) gives the reference's indices and values exactly, random
    data the top-k within the score tolerance of tests/reference/lightning_indexer.py, 99 % of the
    indices equal."""
    from tests import test_lightning_indexer as li

    engine("onednn-bf16")
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: calls.append(1) or real(*xs))  # type: ignore[func-returns-value]
    rng = np.random.default_rng(23)
    query, key, weights, kw = li.make_case(rng, "BSND", "PA_BSND", BF16, [1, 2], [300, 120], block_size=32,
                                           data="int")
    out, ref = li.run_both(query, key, weights, kw, 64, 3)
    assert calls
    li.check(out, ref, BF16, exact=True)
    del calls[:]
    query, key, weights, kw = li.make_case(rng, "BSND", "PA_BSND", BF16, [1, 1], [2048, 700], block_size=128)
    out, ref = li.run_both(query, key, weights, kw, 512, 3)
    assert calls
    li.check(out, ref, BF16, exact=False, scale=li._score_scale(query, weights, key, kw))
    assert np.mean(out[0].reshape(-1, 512) == ref[0].reshape(-1, 512)) > 0.99


def test_kv_quant_sparse_flash_attention_decode_scales_p_onto_the_engine(engine, monkeypatch):
    """op-plugin's decode scenario scaled down (128 heads, top-256, peaked softmax: P holds values
    down to bf16's subnormal range): P @ V runs on oneDNN too (P scaled by an exact power of two,
    every product counted), within the official criterion and the row bound of
    tests/reference/sparse_attention.py, bit-identical share measured 0.9978 (0.9949 on sgemm)."""
    from ascend_emu import ops
    from ascend_emu.mla import D_QK, D_ROPE, HCKV
    from tests import test_sparse_flash_attention as sfa
    from tests.helpers import bit_identical_share

    engine("onednn-bf16")
    calls = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda *xs: calls.append(1) or real(*xs))  # type: ignore[func-returns-value]
    rng = np.random.default_rng(11)
    b, n1, bs, act, k, nb = 2, 128, 256, 700, 256, 6
    q = rng.uniform(-10, 10, (b, 1, n1, D_QK)).astype(BF16)
    nope = rng.uniform(-5, 10, (nb, bs, 1, HCKV)).astype(np.int8)
    rope = rng.uniform(-10, 10, (nb, bs, 1, D_ROPE)).astype(BF16)
    sc = rng.uniform(-100, 100, (nb, bs, 1, 4)).astype(np.float32)
    key = np.concatenate([nope, rope.view(np.int8), sc.view(np.int8)], axis=-1)
    idx = np.stack([rng.choice(act, k, replace=False) for _ in range(b)]).reshape(b, 1, 1, k).astype(np.int32)
    kw = dict(block_table=np.arange(nb, dtype=np.int32).reshape(b, -1), actual_seq_lengths_query=np.ones(b, np.int32),
              actual_seq_lengths_kv=np.full(b, act, np.int32), layout_kv="PA_BSND")
    out = ops.npu_kv_quant_sparse_flash_attention(q, key, key, idx, 1 / 24, 2, 2, attention_mode=2, **kw)
    assert len(calls) == 2 * b, f"{len(calls)} of {2 * b} products on oneDNN"
    gold = sfa.reference(q, key, key, idx, 1 / 24, quant=True, **kw)[0]
    sfa.assert_matches(out, gold, "attention_out on oneDNN", 0.9978)
    assert bit_identical_share(out, gold) >= 0.9978 - sfa.SHARE_MARGIN
