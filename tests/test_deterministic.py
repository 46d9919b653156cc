"""The deterministic mode (docs/numerics.md#deterministic): every product in the documented fixed
order, compared byte for byte with the plain-loop reference tests/reference/fixed_order.py; no BLAS,
oneDNN or torch product while it is on; the switch (ASCEND_EMU_DETERMINISTIC, and
``torch.use_deterministic_algorithms`` in the drop-in).

The cross-host proof (the same bytes under other OpenBLAS kernels, thread counts, Numba CPU
targets and NumPy CPU features) is tests/test_deterministic_hosts.py.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from ascend_emu import _deterministic, warmup
from ascend_emu.emu import matmul as emu_matmul
from ascend_emu.errors import ModeError
from tests.helpers import BF16, assert_same_bytes
from tests.reference.fixed_order import exact_int8_matmul, fixed_order_matmul

#: One small call of every op family with products (warm-up's first scenario of each, plus the
#: quantized ones): names as ``ascend_emu.warmup`` gives them.
FAMILY_CALLS = (
    "npu_sparse_flash_attention bfloat16 PA_BSND",
    "npu_kv_quant_sparse_flash_attention per-tile PA_BSND",
    "npu_mla_preprocess bfloat16 krope_ctkv",
    "npu_mla_preprocess float16 int8_nzcache",
    "npu_mla_prolog_v3 non-quant, PA_NZ (quant modes 0, 0, 0)",
    "npu_mla_prolog_v3 full quant, kv_cache per-tensor quant, PA_NZ (quant modes 2, 1, 1)",
    "npu_lightning_indexer bfloat16 PA_BSND",
    "npu_fused_infer_attention_score bfloat16 MLA decode",
    "npu_fused_infer_attention_score_v2 C8 MLA decode",
    "npu_quant_lightning_indexer int8 PA_BSND",
    "compressor A2 / A3 c2",
    "npu_kv_quant_sparse_attn_sharedkv SWA TND",
)
#: Products up to this many multiply-adds are checked against the plain-loop reference.
REFERENCE_MACS = 600_000


def family_calls() -> dict:
    calls = {c.name: c for c in warmup._calls()}
    return {name: calls[name] for name in FAMILY_CALLS}


def _values(rng, shape, kind):
    """fp32 values of one kind: bf16 values, wide-exponent fp32, or values whose products and
    sums round (so a fused multiply-add or another order gives other bits)."""
    if kind == "bf16":
        return rng.standard_normal(shape, dtype=np.float32).astype(BF16).astype(np.float32)
    if kind == "wide":
        mant = rng.standard_normal(shape, dtype=np.float32)
        return (mant * np.exp2(rng.integers(-20, 20, shape)).astype(np.float32)).astype(np.float32)
    x = (1 + rng.random(shape, dtype=np.float32) * np.float32(2**-10)).astype(np.float32)
    return x * rng.choice(np.array([-1, 1], dtype=np.float32), shape)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (1, 16, 3), (3, 17, 5), (9, 48, 129), (2, 100, 260), (16, 31, 8)])
@pytest.mark.parametrize("kind", ["bf16", "wide", "rounding"])
def test_fixed_matmul_matches_the_reference_bytes(m, k, n, kind):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = _values(rng, (m, k), kind), _values(rng, (k, n), kind)
    assert_same_bytes(emu_matmul.fixed_matmul(a, b), fixed_order_matmul(a, b), f"[{m},{k}]x[{k},{n}] {kind}")


def test_fixed_matmul_special_values():
    """Subnormals kept (no flush to zero), infinities and NaN propagate, -0 products sum as IEEE."""
    tiny = np.float32(2.0**-140)
    a = np.array([[tiny, 1.0, -0.0, 3.0], [np.inf, 1.0, 0.0, 0.0], [np.nan, 0.0, 1.0, 2.0]], np.float32)
    b = np.array([[1.0, 0.5], [-0.0, 0.0], [2.0, 1.0], [tiny, -1.0]], np.float32)
    assert_same_bytes(emu_matmul.fixed_matmul(a, b), fixed_order_matmul(a, b))


def test_fixed_matmul_shapes_as_np_matmul():
    """Batch dims broadcast, 1-D operands and ``out=`` as np.matmul; every slice in the fixed order."""
    rng = np.random.default_rng(3)
    a = _values(rng, (2, 1, 5, 20), "rounding")
    b = _values(rng, (3, 20, 7), "rounding")
    got = emu_matmul.fixed_matmul(a, b)
    assert got.shape == (2, 3, 5, 7)
    for i in range(2):
        for j in range(3):
            assert_same_bytes(got[i, j], fixed_order_matmul(a[i, 0], b[j]))
    v = b[0, :, 0].copy()
    assert_same_bytes(emu_matmul.fixed_matmul(a[0, 0], v), fixed_order_matmul(a[0, 0], v[:, None])[:, 0])
    out = np.empty((9, 5, 7), np.float32)[::2]  # a strided out
    assert emu_matmul.fixed_matmul(a[0], b[:1].repeat(5, 0), out=out) is out
    assert_same_bytes(out[4], fixed_order_matmul(a[0, 0], b[0]))


@pytest.mark.parametrize("w_nk", [False, True])
def test_int8_engine_is_exact(w_nk, monkeypatch):
    monkeypatch.setenv(_deterministic.ENV, "1")
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, (7, 300), dtype=np.int8)
    w = rng.integers(-128, 128, (300, 33), dtype=np.int8)
    a[0] = -128
    w[:, 0] = -128
    got = emu_matmul.matmul_int8(a, np.ascontiguousarray(w.T) if w_nk else w, w_nk=w_nk)
    assert_same_bytes(got, exact_int8_matmul(a, w))


@pytest.mark.parametrize("text, on", [("", False), ("0", False), ("1", True)])
def test_env_switch(text, on, monkeypatch):
    monkeypatch.setenv(_deterministic.ENV, text)
    assert _deterministic.enabled() is on
    with _deterministic.scope(True):
        assert _deterministic.enabled()
    with _deterministic.scope(False):
        assert _deterministic.enabled() is on


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(_deterministic.ENV, "yes")
    with pytest.raises(ModeError, match="ASCEND_EMU_DETERMINISTIC: expected .*got 'yes'"):
        _deterministic.enabled()


def test_bad_env_value_is_rejected_before_an_op_writes(monkeypatch):
    """An op without products rejects a bad value too, before it writes its caches."""
    call = {c.name: c for c in warmup._calls()}["npu_kv_rmsnorm_rope_cache bfloat16 PA_NZ"]
    arrays = [v for v in (*call.args, *call.kwargs.values()) if isinstance(v, np.ndarray)]
    before = [a.copy() for a in arrays]
    monkeypatch.setenv(_deterministic.ENV, "true")
    with pytest.raises(ModeError, match="ASCEND_EMU_DETERMINISTIC: expected '1'"):
        call()
    for got, want in zip(arrays, before, strict=True):
        assert_same_bytes(got, want)


# ---------------------------------------------------------------------- no BLAS, every op
class ProductCalled(AssertionError):
    pass


@contextlib.contextmanager
def no_library_products(monkeypatch):
    """numpy's and torch's product entry points raise (the emu backend reaches BLAS and oneDNN only
    through them: ``np.matmul`` / ``torch._int_mm``)."""
    def refuse(name):
        def call(*args, **kwargs):
            raise ProductCalled(f"{name} called in the deterministic mode")
        return call

    with monkeypatch.context() as m:
        for name in ("matmul", "dot", "einsum", "inner", "tensordot", "vdot"):
            m.setattr(np, name, refuse(f"numpy.{name}"))
        torch = pytest.importorskip("torch")
        for name in ("_int_mm", "matmul", "mm", "bmm", "addmm"):
            m.setattr(torch, name, refuse(f"torch.{name}"))
        yield


@pytest.mark.parametrize("name", FAMILY_CALLS)
def test_every_op_makes_no_library_product(name, monkeypatch):
    """With the mode on, each op runs with numpy's and torch's products refused, and every product
    it computes (each :func:`fixed_matmul` call, spied on) equals the plain-loop reference where
    small enough; with the mode off, the same call reaches a refused product (so this can fail)."""
    call = family_calls()[name]
    seen = []
    real = emu_matmul.fixed_matmul

    def spy(a, b, out=None):
        res = real(a, b, out=out)
        seen.append((np.array(a, np.float32), np.array(b, np.float32), np.array(res)))
        return res

    monkeypatch.setattr(emu_matmul, "fixed_matmul", spy)
    emu_matmul.set_int8_engine("onednn" if emu_matmul.default_int8_engine() == "onednn" else None)
    try:
        with no_library_products(monkeypatch):
            monkeypatch.setenv(_deterministic.ENV, "0")
            with pytest.raises(ProductCalled):
                call()
            monkeypatch.setenv(_deterministic.ENV, "1")
            call()
    finally:
        emu_matmul.set_int8_engine(None)
    checked = corners = 0
    for a, b, res in seen:
        a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])  # the ops' products: 2-D or [H, M, K]
        if a.ndim != b.ndim:
            continue
        r3 = res.reshape(a3.shape[0], a3.shape[1], -1)
        if a3.shape[0] * a3.shape[1] * a3.shape[2] * b3.shape[2] > REFERENCE_MACS:
            # a larger product: a corner of its first batch item (each element's order is its own)
            m, n = min(a3.shape[1], 4), min(b3.shape[2], 32)
            if corners == 3 or m * a3.shape[2] * n > REFERENCE_MACS:  # three corners an op: the test stays cheap
                continue
            corners += 1
            assert_same_bytes(r3[0, :m, :n], fixed_order_matmul(a3[0, :m], b3[0, :, :n]),
                              f"{name}: {a.shape} x {b.shape}, batch 0, corner")
        else:
            for h in range(a3.shape[0]):
                assert_same_bytes(r3[h], fixed_order_matmul(a3[h], b3[h]), f"{name}: {a.shape} x {b.shape}, batch {h}")
        checked += 1
    if name != "npu_quant_lightning_indexer int8 PA_BSND":  # int8 products only
        assert checked, f"{name}: no fp32 product checked against the reference ({len(seen)} seen)"


def test_drop_in_honours_use_deterministic_algorithms(monkeypatch):
    """Through the drop-in, ``torch.use_deterministic_algorithms(True)`` alone turns the mode on
    (read at call time), and off again when reset."""
    torch = pytest.importorskip("torch")
    monkeypatch.delenv(_deterministic.ENV, raising=False)
    call = family_calls()["npu_lightning_indexer bfloat16 PA_BSND"]
    before = torch.are_deterministic_algorithms_enabled()
    with monkeypatch.context() as m:
        m.setattr(np, "matmul", lambda *a, **k: (_ for _ in ()).throw(ProductCalled("numpy.matmul")))
        # the fast path's bf16 product may run on the fp32-output bf16 engine (torch.matmul) instead
        m.setattr(torch, "matmul", lambda *a, **k: (_ for _ in ()).throw(ProductCalled("torch.matmul")))
        try:
            torch.use_deterministic_algorithms(True)
            drop_in_det = call.through_drop_in()()
            torch.use_deterministic_algorithms(False)
            with pytest.raises(ProductCalled):
                call.through_drop_in()()
        finally:
            torch.use_deterministic_algorithms(before)
    monkeypatch.setenv(_deterministic.ENV, "1")
    numpy_det = call()
    for got, want in zip(drop_in_det, numpy_det, strict=True):
        assert_same_bytes(got.contiguous().view(torch.uint8).numpy(), want)  # the raw bytes


def test_scope_reaches_side_by_side_workers():
    """The drop-in's scope holds in the Python worker threads ops split their work across."""
    from ascend_emu.emu.kernels import side_by_side

    seen = []
    with _deterministic.scope(True):
        side_by_side(lambda i: seen.append((i, _deterministic.enabled())), [0, 1, 2, 3], 4)
    assert sorted(seen) == [(i, True) for i in range(4)]


def test_hc_pre_products_take_the_fixed_order(monkeypatch):
    """DeepSeek-V4's hc_pre: with the mode on, its two products (the sum of squares and the HF32
    mixes) run through :func:`fixed_matmul` and equal the plain-loop reference's bytes; with the
    mode off they are float64 BLAS / einsum sums (so the spy can tell)."""
    from ascend_emu import ops
    from ascend_emu.quant.rounding import hf32_truncate
    from tests.test_hc import _inputs

    x, hc_fn, scale, base = _inputs(t=3, d=4096, seed=5)
    seen = []
    real = emu_matmul.fixed_matmul

    def spy(a, b, out=None):
        res = real(a, b, out=out)
        seen.append((np.array(a, np.float32), np.array(b, np.float32), np.array(res)))
        return res

    monkeypatch.setattr(emu_matmul, "fixed_matmul", spy)
    monkeypatch.setenv(_deterministic.ENV, "0")
    fast = ops.npu_hc_pre_v2(x, hc_fn, scale, base, 4, 20, 1e-6, 1e-6)
    assert not seen
    monkeypatch.setenv(_deterministic.ENV, "1")
    fixed = ops.npu_hc_pre_v2(x, hc_fn, scale, base, 4, 20, 1e-6, 1e-6)
    flat = x.astype(np.float32).reshape(3, -1)
    squares, mixes = seen  # the order hc_pre computes them in
    assert_same_bytes(mixes[2], fixed_order_matmul(hf32_truncate(flat), hf32_truncate(hc_fn).T))
    for t in range(3):
        assert_same_bytes(squares[2][t].reshape(-1), fixed_order_matmul(flat[t][None, :], flat[t][:, None]).reshape(-1))
    assert fast[0].shape == fixed[0].shape
