"""The kernels' RmsNorm reduction (``ascend_emu.emu.kernels``) against tests/reference/rms_norm.py.

(a) Accuracy: over 10,000 random rows of 512 and of 1536 (fp32 from bf16 inputs, like real
    activations), the bf16 RmsNorm output equals the one computed from a float64-accumulated sum
    of squares in >= 99.99 % of elements and >= 99 % of rows; the sequential element-order chain
    the emulator used before misses the row target (so the test can tell the orders apart).
(b) Order: the emulator's sums of squares and RmsNorm rows are bit-identical to the independent
    reference's, for every kernel order and for row lengths with and without a tail repeat.
(c) End to end: npu_mla_prolog_v3 non-quant ``query`` on user-style data (weights
    ``randn / sqrt(fan_in)``, T = 3..6) is >= 99.5 % bit-identical to the reference (with
    OpenBLAS's Haswell kernels; 95 % with SkylakeX's), and
    ``query`` / ``query_rope`` / ``query_norm`` differ in at most the measured elements per T
    plus a margin (the figures of docs/ops.md#fidelity-notes).
Also the per-channel kr quant (kv_cache_quant_mode 2) quantizes the bf16 rounding of RoPE(kr),
as the kernel does (``ascend_emu/emu/mla_prolog.py`` step 8 cites the lines).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ascend_emu.emu.kernels import KV_CACHE_RMS, MLA_PROLOG_RMS, MLAPO_KV_RMS, MLAPO_QUANT_RMS, rms_norm, square_sums
from ascend_emu.ops import npu_format_cast, npu_mla_prolog_v3
from tests.helpers import blas_measured, openblas_kernel
from tests.reference import mla_prolog as ref_prolog
from tests.reference.rms_norm import rms_norm as ref_rms_norm
from tests.reference.rms_norm import rms_norm_f64_sum
from tests.reference.rms_norm import square_sum as ref_square_sum

BF16 = np.dtype(ml_dtypes.bfloat16)
ORDERS = {"mla_prolog": MLA_PROLOG_RMS, "mlapo_kv": MLAPO_KV_RMS, "kv_cache": KV_CACHE_RMS,
          "mlapo_quant": MLAPO_QUANT_RMS}
#: (kernel, H) pairs the ops run: kv_rmsnorm 512; MLA prolog 512 (ckv) and 1536 (cq); MlaPreprocess
#: 512 (ckv), 1536 (q_a) and its hidden size.
CASES = [("kv_cache", 512), ("mla_prolog", 512), ("mla_prolog", 1536), ("mlapo_kv", 512),
         ("mlapo_quant", 1536), ("mlapo_quant", 512)]
ROWS = 10_000
EPS = 1e-6
#: Targets (docs/sources.md#rms_norm): bf16 elements / rows equal to the float64-sum result.
MIN_ELEMENT_SHARE = 0.9999
MIN_ROW_SHARE = 0.99


def bf16_rows(rng, rows, h) -> np.ndarray:
    """fp32 rows holding bf16 values, per-row magnitudes spread over four decades."""
    x = rng.standard_normal((rows, h), dtype=np.float32) * np.float32(10.0) ** rng.uniform(-2, 2, (rows, 1))
    return x.astype(np.float32).astype(BF16).astype(np.float32)


def shares(actual, expected) -> tuple[float, float]:
    """(element share, row share) of bit-identical bf16 values."""
    same = actual.view(np.uint16) == expected.view(np.uint16)
    return float(same.mean()), float(same.all(axis=-1).mean())


@pytest.mark.parametrize("kernel, h", CASES)
def test_bf16_output_matches_float64_sum(kernel, h):
    rng = np.random.default_rng(h + len(kernel))
    x = bf16_rows(rng, ROWS, h)  # [ROWS, H]
    gamma = rng.standard_normal(h).astype(BF16).astype(np.float32)  # [H]
    got = rms_norm(x, gamma, EPS, ORDERS[kernel]).astype(BF16)
    want = rms_norm_f64_sum(x, gamma, EPS, kernel).astype(BF16)
    elem, row = shares(got, want)
    assert elem >= MIN_ELEMENT_SHARE and row >= MIN_ROW_SHARE, f"{kernel} H={h}: elements {elem:.6f}, rows {row:.4f}"


def test_sequential_chain_misses_the_row_target():
    """The yardstick separates orders: an element-order fp32 chain falls below the row target."""
    rng = np.random.default_rng(3)
    x = bf16_rows(rng, ROWS, 512)
    gamma = rng.standard_normal(512).astype(BF16).astype(np.float32)
    ss = np.cumsum(x * x, axis=-1, dtype=np.float32)[:, -1:]  # sequential fp32 sum
    seq = (x / np.sqrt(ss * np.float32(1 / 512) + np.float32(EPS)) * gamma).astype(BF16)
    _, row = shares(seq, rms_norm_f64_sum(x, gamma, EPS, "mla_prolog").astype(BF16))
    assert row < MIN_ROW_SHARE


#: Row lengths with and without a tail repeat; the pairwise blocks need H = 64 * 2^k.
REDUCTION_CASES = [(k, h) for k in sorted(ORDERS) for h in (64, 100, 512, 1000, 1536, 7168)
                   if k != "kv_cache" or h in (64, 512, 1024)]


@pytest.mark.parametrize("kernel, h", REDUCTION_CASES)
def test_reduction_bit_identical_to_reference(kernel, h):
    rng = np.random.default_rng(h)
    x = bf16_rows(rng, 300, h)
    x[0] = 0.0  # an all-zero row: rms = sqrt(eps)
    gamma = rng.standard_normal(h).astype(np.float32)
    got = square_sums(x, ORDERS[kernel])
    want = ref_square_sum(x, kernel)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    y = rms_norm(x, gamma, EPS, ORDERS[kernel], scale=3.0)
    y_ref = ref_rms_norm(x, gamma, EPS, kernel, 3.0)
    assert np.array_equal(y.view(np.uint32), y_ref.view(np.uint32))


def test_pairwise_order_rejects_other_lengths():
    with pytest.raises(ValueError, match="halving down to w <= 64"):
        square_sums(np.ones((1, 1000), np.float32), KV_CACHE_RMS)


def test_orders_differ():
    """The three summation orders are distinct (else (b) could not tell them apart)."""
    rng = np.random.default_rng(5)
    x = bf16_rows(rng, 2000, 512)
    a, b = square_sums(x, MLA_PROLOG_RMS), square_sums(x, KV_CACHE_RMS)
    seq = np.cumsum(x * x, axis=-1, dtype=np.float32)[:, -1]
    assert np.any(a != b) and np.any(a != seq) and np.any(b != seq)


# ---------------------------------------------------------------------- (c) MLA prolog v3 end to end
HE, HCQ, HCKV, D, DR, N = 7168, 1536, 512, 128, 64, 16
#: The non-quant query's bit-identical share, per OpenBLAS kernel family (the target,
#: 0.995, holds with Haswell's kernels; SkylakeX's sgemm order flips 1-3 bf16 roundings of
#: query_norm per T, and each flip moves about 5 % of the query rows it feeds across a bf16
#: rounding boundary: measured 0.9526 at T = 3). See docs/ops.md, "Fidelity notes".
MIN_QUERY_SHARE = {"Haswell": 0.995, "SkylakeX": 0.95}
#: Elements differing from the reference per T, measured per OpenBLAS kernel family (query of
#: T*16*512, query_rope of T*16*64, query_norm of T*1536 elements; Haswell: docs/ops.md's
#: 99.98 - 99.99 % / 99.98 - 100 % / 99.98 - 100 %). Each is asserted with a margin of
#: MARGIN_ELEMENTS; with a kernel family not measured, the test is skipped.
MEASURED_DIFFERING = {
    "Haswell": {3: dict(query=2, query_rope=0, query_norm=1), 4: dict(query=7, query_rope=1, query_norm=0),
                5: dict(query=4, query_rope=0, query_norm=0), 6: dict(query=3, query_rope=0, query_norm=0)},
    "SkylakeX": {3: dict(query=1164, query_rope=40, query_norm=3), 4: dict(query=180, query_rope=7, query_norm=1),
                 5: dict(query=7, query_rope=0, query_norm=1), 6: dict(query=1196, query_rope=25, query_norm=2)},
}
MARGIN_ELEMENTS = 2


@pytest.fixture(scope="module")
def user_weights():
    """Weights as a user initialises them: ``randn / sqrt(fan_in)``, bf16; gammas near 1."""
    rng = np.random.default_rng(2024)

    def w(shape, fan_in):
        return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))).astype(BF16)

    return dict(w_dq=w((HE, HCQ), HE), w_uq_qr=w((HCQ, N * (D + DR)), HCQ), w_uk=w((N, D, HCKV), D),
                w_dkv_kr=w((HE, HCKV + DR), HE),
                gamma_cq=(1 + 0.1 * rng.standard_normal(HCQ)).astype(BF16),
                gamma_ckv=(1 + 0.1 * rng.standard_normal(HCKV)).astype(BF16))


def rope_tables(t: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Half-layout cos / sin of positions ``offset..offset+t-1`` (docs/sources.md#rope), bf16."""
    inv = 10000.0 ** (-np.arange(DR // 2) / (DR // 2))
    ang = np.outer(np.arange(offset, offset + t), inv)
    ang = np.concatenate([ang, ang], axis=1)  # [T, 64]
    return np.sin(ang).astype(BF16), np.cos(ang).astype(BF16)


@pytest.mark.parametrize("t", [3, 4, 5, 6])
def test_v3_query_bit_identical_share(user_weights, t):
    min_share, differing_at_most = blas_measured(MIN_QUERY_SHARE), blas_measured(MEASURED_DIFFERING)
    if min_share is None:
        pytest.skip(f"shares measured with OpenBLAS kernels {list(MIN_QUERY_SHARE)}; NumPy runs {openblas_kernel()}")
    w = user_weights
    rng = np.random.default_rng(100 + t)
    x = rng.standard_normal((t, HE), dtype=np.float32).astype(BF16)  # [T, He]
    sin, cos = rope_tables(t, 7 * t)
    kv_cache = np.zeros((2, 16, 1, HCKV), BF16)
    kr_cache = np.zeros((2, 16, 1, DR), BF16)
    out = npu_mla_prolog_v3(x, npu_format_cast(w["w_dq"], 29), npu_format_cast(w["w_uq_qr"], 29), w["w_uk"],
                            npu_format_cast(w["w_dkv_kr"], 29), w["gamma_cq"], w["gamma_ckv"], sin, cos,
                            kv_cache, kr_cache, cache_index=np.arange(t, dtype=np.int64), cache_mode="PA_BSND",
                            query_norm_flag=True)
    gold = ref_prolog.mla_prolog(x, w["w_dq"].astype(np.float64), w["w_uq_qr"].astype(np.float64),
                                 w["w_uk"].astype(np.float64), w["w_dkv_kr"].astype(np.float64),
                                 w["gamma_cq"], w["gamma_ckv"], sin, cos)
    query, query_norm = out[0], out[3]
    share = float(np.mean(query.view(np.uint16) == gold["query"].view(np.uint16)))
    assert share >= min_share, f"T={t}: query bit-identical share {share:.4f}"
    assert float(np.mean(query_norm.view(np.uint16) == gold["query_norm"].view(np.uint16))) >= min_share
    for what, got in (("query", query), ("query_rope", out[1]), ("query_norm", query_norm)):
        differing = int(np.count_nonzero(got.view(np.uint16) != gold[what].view(np.uint16)))
        most = differing_at_most[t][what] + MARGIN_ELEMENTS
        assert differing <= most, f"T={t}: {what}: {differing} of {got.size} elements differ (at most {most})"
