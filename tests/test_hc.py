"""DeepSeek-V4 mHC ops (``ascend_emu.ops.hc``, the ``_C_ascend`` / ``custom`` bindings) against the
independent reference ``tests/reference/hc.py``.

Byte-exact where the result is one defined fp32 computation: HF32 truncation, y given its
weights (v3's ``pre_mix``), hc_post. Elsewhere (inv_rms, the mixes, the gates and Sinkhorn: the
NPU's K-tile order and its vector ``Exp`` are not reproduced) the dual criterion at 0.005
against float64, the official golden's tighter absolute limit on post / comb (1e-4; met with
100x margin) and the bit-identical share against float64 rounded once, measured on this case
(y 0.99998, post 0.55, comb 0.31, pre 0.52) and asserted with a margin (docs/ops.md "mHC").
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from ascend_emu import ops
from ascend_emu.errors import ArgumentError, BackendUnavailable, DTypeError, ModeError, ShapeError
from ascend_emu.ops import hc as hc_ops
from ascend_emu.quant.rounding import hf32_truncate
from tests.helpers import assert_same_bytes, bit_identical_share, dual_threshold_ok
from tests.reference import hc as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
T, D = 32, 4096


def _inputs(t=T, d=D, seed=0, lead=None):
    rng = np.random.default_rng(seed)
    shape = (t, 4, d) if lead is None else (*lead, 4, d)
    x = (rng.random(shape) * 2).astype(BF16)
    hc_fn = (rng.random((24, 4 * d)) / (4 * d)).astype(np.float32)
    return x, hc_fn, (rng.random(3) * 2).astype(np.float32), (rng.random(24) * 2).astype(np.float32)


@pytest.fixture(scope="module")
def case():
    x, hc_fn, scale, base = _inputs()
    return (x, hc_fn, scale, base), ops.npu_hc_pre_v3(x, hc_fn, scale, base), ref.hc_pre_f64(x, hc_fn, scale, base)


# ------------------------------------------------------------------------------ HF32
def test_hf32_truncation_is_the_bit_mask_toward_zero():
    rng = np.random.default_rng(1)
    v = np.concatenate([rng.standard_normal(4096).astype(np.float32) * 1e3,
                        np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1 + 2 ** -10, 1 + 2 ** -11, -(1 + 2 ** -11),
                                  np.finfo(np.float32).max, np.finfo(np.float32).tiny, 1e-45], np.float32)])
    assert_same_bytes(hf32_truncate(v), ref.hf32(v), "hf32")
    t = hf32_truncate(v)
    assert np.all(np.abs(t) <= np.abs(v))                     # toward zero
    assert hf32_truncate(np.float32(1 + 2 ** -11)) == 1.0 and hf32_truncate(np.float32(1 + 2 ** -10)) == 1 + 2 ** -10
    bf = (rng.standard_normal(256)).astype(BF16).astype(np.float32)
    assert_same_bytes(hf32_truncate(bf), bf, "bf16 values are unchanged")


def _crafted(t):
    """x all ones, hc_fn = (1 + 2^-12) * 2^-14: HF32 gives mixes 1.0, fp32 1.000244."""
    x = np.ones((t, 4, D), BF16)
    hc_fn = np.full((24, 4 * D), np.float32((1 + 2 ** -12) * 2 ** -14))
    return x, hc_fn, np.ones(3, np.float32), np.zeros(24, np.float32)


def test_fused_mixes_are_hf32_and_the_decomposed_chain_fp32():
    """v2 (fused, any T) and custom.npu_hc_pre with T = 16 use HF32 operands; custom.npu_hc_pre
    with T = 5 (not a multiple of 16: the decomposed chain) uses fp32 ones."""
    for t, op, hf32 in ((5, ops.npu_hc_pre_v2, True), (16, ops.npu_hc_pre, True), (5, ops.npu_hc_pre, False),
                        (144, ops.npu_hc_pre, False)):
        args = _crafted(t)
        kw = {} if op is ops.npu_hc_pre else dict(hc_mult=4, hc_sinkhorn_iters=20, norm_eps=1e-6, hc_eps=1e-6)
        _, post, _ = op(*args, **kw)
        want = ref.hc_pre_f64(*args, hf32_mixes=hf32)["post"]
        other = ref.hc_pre_f64(*args, hf32_mixes=not hf32)["post"]
        assert np.abs(post - want).max() < 1e-6, (t, op.__name__)
        assert np.abs(post - other).min() > 5e-5, (t, op.__name__)
    assert hc_ops.fused_route(16) and hc_ops.fused_route(128) and not hc_ops.fused_route(144)
    assert not hc_ops.fused_route(1) and not hc_ops.fused_route(8) and not hc_ops.fused_route(17)


# ------------------------------------------------------------------------------ hc_pre
def test_hc_pre_within_the_dual_criterion_with_the_measured_bit_identical_share(case):
    _, (y, post, comb, pre), r = case
    assert y.dtype == BF16 and y.shape == (T, D)
    assert post.dtype == comb.dtype == pre.dtype == np.float32
    assert post.shape == pre.shape == (T, 4) and comb.shape == (T, 4, 4)
    golden = {"y": r["y"].astype(np.float32).astype(BF16), "post": r["post"].astype(np.float32),
              "comb": r["comb"].astype(np.float32), "pre": r["pre"].astype(np.float32)}
    shares = {"y": 0.999, "post": 0.5, "comb": 0.27, "pre": 0.45}
    for name, got in (("y", y), ("post", post), ("comb", comb), ("pre", pre)):
        assert dual_threshold_ok(got, golden[name], 0.005), name
        assert bit_identical_share(got, golden[name]) >= shares[name], (name, bit_identical_share(got, golden[name]))
    for name, got in (("post", post), ("comb", comb), ("pre", pre)):
        assert np.abs(got - r[name]).max() < 1e-6, name       # the golden asks 1e-4 on 99.5 %
    np.testing.assert_allclose(comb.sum(-2), 1.0, atol=1e-5)    # Sinkhorn ends on a column step


def test_v2_v3_and_custom_agree_byte_for_byte(case):
    (x, hc_fn, scale, base), out3, _ = case
    out2 = ops.npu_hc_pre_v2(x, hc_fn, scale, base, 4, 20, 1e-6, 1e-6)
    outc = ops.npu_hc_pre(x, hc_fn, scale, base)                 # T = 32: fused
    for a, b, c in zip(out2, out3[:3], outc, strict=True):
        assert_same_bytes(a, b)
        assert_same_bytes(a, c)
    lead = ops.npu_hc_pre_v2(x.reshape(4, 8, 4, D), hc_fn, scale, base, 4, 20, 1e-6, 1e-6)
    for a, b in zip(lead, out2, strict=True):
        assert a.shape[:2] == (4, 8)
        assert_same_bytes(a, b)


def test_each_token_alone_gives_the_batchs_bytes():
    """Tokens are independent: one token alone (the calling thread's path) gives the bytes it has
    in a batch of 5 (the parallel path, blocks of 4 tokens and a tail), for hc_pre and hc_post.
    The two paths sum the mixes in float64 in different orders; their fp32 roundings agree unless
    a sum lies within float64 error of an fp32 rounding boundary (not so for this case)."""
    x, hc_fn, scale, base = _inputs(t=5, seed=9)
    pre_mix = np.random.default_rng(9).random((5, 4)).astype(np.float32)
    batch = ops.npu_hc_pre_v3(x, hc_fn, scale, base, pre_mix)
    post_batch = ops.npu_hc_post(batch[0], x, batch[1], batch[2])
    for t in range(5):
        alone = ops.npu_hc_pre_v3(x[t:t + 1], hc_fn, scale, base, pre_mix[t:t + 1])
        for a, b in zip(alone, batch, strict=True):
            assert_same_bytes(a[0], b[t])
        post_alone = ops.npu_hc_post(batch[0][t:t + 1], x[t:t + 1], batch[1][t:t + 1], batch[2][t:t + 1])
        assert_same_bytes(post_alone[0], post_batch[t])
    assert_same_bytes(post_batch, ref.hc_post_fp32(batch[0], x, batch[1], batch[2]))


def test_v3_pre_mix_weights_y_exactly(case):
    (x, hc_fn, scale, base), (_, post, comb, pre), _ = case
    pre_mix = np.random.default_rng(3).random((T, 4)).astype(np.float32)
    y, post2, comb2, pre2 = ops.npu_hc_pre_v3(x, hc_fn, scale, base, pre_mix)
    assert_same_bytes(y, ref.weighted_sum_bf16(pre_mix, x), "y from pre_mix")
    for a, b in ((post2, post), (comb2, comb), (pre2, pre)):
        assert_same_bytes(a, b)                                  # pre is still the computed gates
    # y from the computed gates is the same fp32 sequence
    assert_same_bytes(case[1][0], ref.weighted_sum_bf16(pre, x), "y from pre")


def test_every_scalar_argument_is_honoured():
    x, hc_fn, scale, base = _inputs(t=4, seed=5)
    for kw in (dict(hc_sinkhorn_iters=1), dict(hc_sinkhorn_iters=3), dict(norm_eps=0.5), dict(hc_eps=0.1)):
        got = ops.npu_hc_pre_v3(x, hc_fn, scale, base, **kw)
        r = ref.hc_pre_f64(x, hc_fn, scale, base, iters=kw.get("hc_sinkhorn_iters", 20),
                           norm_eps=kw.get("norm_eps", 1e-6), hc_eps=kw.get("hc_eps", 1e-6))
        for name, a in zip(("post", "comb", "pre"), got[1:], strict=True):
            assert np.abs(a - r[name]).max() < 2e-6, (kw, name)
    inv = ops.npu_hc_pre_inv_rms(x, epsilon=3.0)
    np.testing.assert_allclose(inv[:, 0], ref.hc_pre_f64(x, hc_fn, scale, base, norm_eps=3.0)["inv_rms"], rtol=1e-6)
    assert ops.npu_hc_pre_inv_rms(x).shape == (4, 1)


def test_decomposed_stages_match_the_reference():
    x, hc_fn, scale, base = _inputs(t=6, seed=7, lead=(2, 3))
    r = ref.hc_pre_f64(x, hc_fn, scale, base, norm_eps=1e-20, hc_eps=1e-5, hf32_mixes=False)
    inv = ops.npu_hc_pre_inv_rms(x)                              # epsilon 1e-20 by default
    assert inv.shape == (2, 3, 1) and inv.dtype == np.float32
    np.testing.assert_allclose(inv[..., 0], r["inv_rms"], rtol=1e-6)
    inv32 = ops.npu_hc_pre_inv_rms(x.astype(np.float32))        # fp32 x (the recipes' example test)
    assert_same_bytes(inv32, inv)
    mixes = r["mixes"].astype(np.float32)
    y, post, comb = ops.npu_hc_pre_sinkhorn(mixes, inv, scale, base, x)   # hc_eps 1e-5 by default
    assert y.shape == (2, 3, D) and comb.shape == (2, 3, 4, 4)
    assert np.abs(post - r["post"]).max() < 2e-6 and np.abs(comb - r["comb"]).max() < 2e-6
    assert dual_threshold_ok(y, r["y"].astype(np.float32).astype(BF16), 0.005)


# ------------------------------------------------------------------------------ hc_post
@pytest.mark.parametrize("xdt,pdt", [(BF16, np.float32), (BF16, BF16), (np.float16, np.float16),
                                     (np.float32, np.float32)])
def test_hc_post_is_one_fp32_sequence_and_one_rounding(xdt, pdt):
    rng = np.random.default_rng(11)
    lead = (3, 2)
    x = rng.uniform(-10, 10, (*lead, D)).astype(xdt)
    residual = rng.uniform(-10, 10, (*lead, 4, D)).astype(xdt)
    post = rng.uniform(-10, 10, (*lead, 4)).astype(pdt)
    comb = rng.uniform(-10, 10, (*lead, 4, 4)).astype(pdt)
    out = ops.npu_hc_post(x, residual, post, comb)
    assert out.shape == residual.shape and out.dtype == np.dtype(xdt)
    assert_same_bytes(out, ref.hc_post_fp32(x, residual, post, comb), "hc_post")
    flat = ops.npu_hc_post(x.reshape(6, D), residual.reshape(6, 4, D), post.reshape(6, 4), comb.reshape(6, 4, 4))
    assert_same_bytes(flat.reshape(out.shape), out)
    # comb[j, i] (not comb[i, j]): residual j feeds output i
    f64 = post.astype(np.float64)[..., :, None] * x.astype(np.float64)[..., None, :] + np.einsum(
        "...ji,...jd->...id", comb.astype(np.float64), residual.astype(np.float64))
    assert dual_threshold_ok(out, f64, 0.005)


# ------------------------------------------------------------------------------ rejections
def _bad_pre_calls():
    x, fn, sc, ba = _inputs(t=2, seed=2)
    v2 = lambda **kw: ops.npu_hc_pre_v2(**{**dict(x=x, hc_fn=fn, hc_scale=sc, hc_base=ba, hc_mult=4,  # noqa: E731
                                                  hc_sinkhorn_iters=20, norm_eps=1e-6, hc_eps=1e-6), **kw})
    v3 = lambda **kw: ops.npu_hc_pre_v3(**{**dict(x=x, hc_fn=fn, hc_scale=sc, hc_base=ba), **kw})  # noqa: E731
    sk = lambda **kw: ops.npu_hc_pre_sinkhorn(**{**dict(  # noqa: E731
        mixes=np.zeros((2, 24), np.float32), rsqrt=np.ones((2, 1), np.float32), hc_scale=sc, hc_base=ba, x=x), **kw})
    return [
        (v2, dict(hc_mult=3), ModeError, "hc_mult"), (v2, dict(hc_mult=4.0), DTypeError, "hc_mult"),
        (v2, dict(hc_sinkhorn_iters=0), ModeError, "hc_sinkhorn_iters"),
        (v2, dict(hc_sinkhorn_iters=101), ModeError, "hc_sinkhorn_iters"),
        (v2, dict(hc_sinkhorn_iters=True), DTypeError, "hc_sinkhorn_iters"),
        (v2, dict(norm_eps=-1e-6), DTypeError, "norm_eps"), (v2, dict(hc_eps=float("nan")), DTypeError, "hc_eps"),
        (v2, dict(hc_eps=1e40), DTypeError, "hc_eps"),
        (v2, dict(x=x.astype(np.float32)), DTypeError, "x"), (v2, dict(x=x[:, :3]), ShapeError, "x"),
        (v2, dict(x=np.zeros((2, 4, 1024), BF16)), ShapeError, "x"), (v2, dict(x=x[0]), ShapeError, "x"),
        (v2, dict(x=np.zeros((0, 4, D), BF16)), ShapeError, "x"),
        (v2, dict(x=np.asfortranarray(np.zeros((2, 4, D), BF16))), ShapeError, "x"),
        (v2, dict(hc_fn=fn.T), ShapeError, "hc_fn"), (v2, dict(hc_fn=fn.astype(BF16)), DTypeError, "hc_fn"),
        (v2, dict(hc_fn=None), ShapeError, "hc_fn"), (v2, dict(hc_scale=sc[:2]), ShapeError, "hc_scale"),
        (v2, dict(hc_base=ba[:16]), ShapeError, "hc_base"),
        (v2, dict(hc_base=ba.astype(np.float16)), DTypeError, "hc_base"),
        (v3, dict(pre_mix=np.zeros((2, 3), np.float32)), ShapeError, "pre_mix"),
        (v3, dict(pre_mix=np.zeros((2, 4), BF16)), DTypeError, "pre_mix"),
        (sk, dict(mixes=np.zeros((2, 16), np.float32)), ShapeError, "mixes"),
        (sk, dict(rsqrt=np.ones((2,), np.float32)), ShapeError, "rsqrt"),
        (sk, dict(hc_eps=-1.0), DTypeError, "hc_eps"),
        (lambda **kw: ops.npu_hc_pre_inv_rms(x, **kw), dict(epsilon=-1.0), DTypeError, "epsilon"),
        (lambda **kw: ops.npu_hc_pre_inv_rms(**kw), dict(x=x.astype(np.float16)), DTypeError, "x"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_pre_calls())))
def test_hc_pre_rejects_by_name(i):
    call, kw, err, name = _bad_pre_calls()[i]
    with pytest.raises(err, match=f"^{name}: expected"):
        call(**kw)


def test_hc_post_rejects_by_name():
    x = np.zeros((2, D), BF16)
    r, p, c = np.zeros((2, 4, D), BF16), np.zeros((2, 4), np.float32), np.zeros((2, 4, 4), np.float32)
    for kw, err, name in ((dict(x=x.astype(np.int8)), DTypeError, "x"), (dict(residual=r.astype(np.float32)),
                          DTypeError, "residual"), (dict(comb=c.astype(BF16)), DTypeError, "comb"),
                          (dict(post=p[:, :3]), ShapeError, "post"), (dict(comb=c[:1]), ShapeError, "comb"),
                          (dict(residual=r[:, :, :100]), ShapeError, "residual"),
                          (dict(x=np.zeros((2, 100), BF16)), ShapeError, "x"),
                          (dict(x_layout="TND"), ModeError, "x_layout"), (dict(x_layout="BSD"), ShapeError, "x")):
        with pytest.raises(err, match=f"^{name}: expected"):
            ops.npu_hc_post(**{**dict(x=x, residual=r, post=p, comb=c), **kw})


def test_token_bound_checked_before_anything_runs(monkeypatch):
    monkeypatch.setattr(hc_ops, "MAX_TOKENS", 3)
    x, fn, sc, ba = _inputs(t=4, seed=2)
    with pytest.raises(ShapeError, match="^x: expected at most 3 tokens"):
        ops.npu_hc_pre_v2(x, fn, sc, ba, 4, 20, 1e-6, 1e-6)
    with pytest.raises(ShapeError, match="^x: expected at most 3 tokens"):
        ops.npu_hc_post(np.ascontiguousarray(x[:, 0]), x, np.zeros((4, 4), np.float32),
                        np.zeros((4, 4, 4), np.float32))


def test_hw_backend_says_the_ops_are_not_torch_npus():
    x, fn, sc, ba = _inputs(t=1, seed=2)
    with ops.backend("hw"), pytest.raises(BackendUnavailable, match="not a torch_npu op"):
        ops.npu_hc_pre_v2(x, fn, sc, ba, 4, 20, 1e-6, 1e-6)


# ------------------------------------------------------------------------------ torch namespaces
@pytest.fixture(scope="module")
def tnpu():
    import ascend_emu.torch_npu  # noqa: F401  (registers the namespaces)

    return torch.ops


def _t(a):
    return torch.from_numpy(np.asarray(a).view(np.int16)).view(torch.bfloat16) if a.dtype == BF16 \
        else torch.from_numpy(np.asarray(a))


def _n(t):
    return t.view(torch.int16).numpy().view(BF16) if t.dtype == torch.bfloat16 else t.numpy()


def test_namespaces_run_the_same_ops(tnpu, case):
    (x, hc_fn, scale, base), out3, _ = case
    xs = x.reshape(2, 16, 4, D)
    tx, tf, ts, tb = _t(xs), _t(hc_fn), _t(scale), _t(base)
    got2 = tnpu._C_ascend.npu_hc_pre_v2(tx, tf, ts, tb, 4, 20, 1e-6, 1e-6)
    got3 = tnpu._C_ascend.npu_hc_pre_v3(tx, tf, ts, tb, None, hc_mult=4)
    gotc = tnpu.custom.npu_hc_pre(tx, tf, ts, tb, hc_sinkhorn_iters=20)
    for got in (got2, got3[:3], gotc):
        for a, b in zip(got, out3[:3], strict=True):
            assert_same_bytes(_n(a).reshape(b.shape), b)
    assert_same_bytes(_n(got3[3]).reshape(T, 4), out3[3])
    y, post, comb = got2
    out = tnpu._C_ascend.npu_hc_post(y, tx, post, comb)
    assert_same_bytes(_n(out), ref.hc_post_fp32(_n(y), xs, _n(post), _n(comb)))
    out_c = tnpu.custom.npu_hc_post(y.reshape(T, D), tx.reshape(T, 4, D), post.reshape(T, 4), comb.reshape(T, 4, 4))
    assert_same_bytes(_n(out_c).reshape(_n(out).shape), _n(out))
    inv = tnpu.custom.npu_hc_pre_inv_rms(tx, epsilon=1e-6)
    assert tuple(inv.shape) == (2, 16, 1)
    mixes = torch.from_numpy(ref.hc_pre_f64(xs, hc_fn, scale, base, hf32_mixes=False)["mixes"].astype(np.float32))
    y2, post2, comb2 = tnpu.custom.npu_hc_pre_sinkhorn(mixes, inv, ts, tb, tx, 4, 20, 1e-6)
    assert tuple(y2.shape) == (2, 16, D) and tuple(comb2.shape) == (2, 16, 4, 4)


def test_namespaces_errors_and_schemas(tnpu):
    x, fn, sc, ba = _inputs(t=2, seed=2)
    tx, tf, ts, tb = _t(x), _t(fn), _t(sc), _t(ba)
    with pytest.raises(ModeError, match="^hc_mult: expected 4"):
        tnpu._C_ascend.npu_hc_pre_v2(tx, tf, ts, tb, 8, 20, 1e-6, 1e-6)
    with pytest.raises(ShapeError, match=r"^x: expected \[B, S, D\]"):  # vllm-ascend's adapter: 3-D x only
        tnpu._C_ascend.npu_hc_post(tx[:, 0].contiguous(), tx, torch.zeros(2, 4), torch.zeros(2, 4, 4))
    with pytest.raises(ArgumentError, match="at most 4 positional"):  # keyword-only in the recipes' schema
        tnpu.custom.npu_hc_pre(tx, tf, ts, tb, 4)
    schema = tnpu.custom.npu_hc_pre_sinkhorn.default._schema
    assert [a.default_value for a in schema.arguments[-3:]] == [4, 20, 1e-5]
    assert tnpu.custom.npu_hc_pre_inv_rms.default._schema.arguments[-1].default_value == 1e-20


def test_fake_kernels_give_the_output_shapes(tnpu):
    m = lambda *s, dt=torch.float32: torch.empty(s, dtype=dt, device="meta")  # noqa: E731
    x = m(2, 3, 4, D, dt=torch.bfloat16)
    y, post, comb, pre = tnpu._C_ascend.npu_hc_pre_v3(x, m(24, 4 * D), m(3), m(24))
    assert (tuple(y.shape), y.dtype, tuple(post.shape), tuple(comb.shape), tuple(pre.shape)) == \
        ((2, 3, D), torch.bfloat16, (2, 3, 4), (2, 3, 4, 4), (2, 3, 4))
    assert tuple(tnpu.custom.npu_hc_pre_inv_rms(x).shape) == (2, 3, 1)
    out = tnpu.custom.npu_hc_post(m(6, D, dt=torch.float16), m(6, 4, D, dt=torch.float16), m(6, 4), m(6, 4, 4))
    assert tuple(out.shape) == (6, 4, D) and out.dtype == torch.float16
