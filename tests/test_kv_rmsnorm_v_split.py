"""npu_kv_rmsnorm_rope_cache's K/V-split mode (``v`` given) against tests/reference/kv_rmsnorm_v_split.py.

Caches are compared byte for byte with the reference (poisoned first, so unwritten bytes count):
the reference sums the RmsNorm squares in the kernel's order and rounds once, so the hardware's
bytes are reproduced exactly. Also: the rejected calls (nothing written), the torch_npu drop-in's
``_v2`` / ``_v2_functional``, the hw backend passing ``v`` on (stand-in torch_npu), checked mode.
"""

from __future__ import annotations

import numpy as np
import pytest

from ascend_emu import checked_mode
from ascend_emu.emu.kernels import KV_CACHE_BLK_NZ_RMS, KV_CACHE_RMS, square_sums
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from ascend_emu.ops import npu_kv_rmsnorm_rope_cache
from tests.helpers import BF16, assert_same_bytes, poisoned, raw
from tests.reference.kv_rmsnorm_v_split import DK, DV, block_width, square_sum, v_split_ref
from tests import test_hw
from tests.test_hw import assert_backends_agree

standin = test_hw.standin  #: the stand-in torch_npu fixture
MODES = ["Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ"]
DTYPES = [BF16, np.dtype(np.float16)]
SHAPES = [(4, 1), (2, 37), (2, 300)]  # decode; several pages per batch; > 512 tokens (threaded pass)


def make_inputs(rng, b, s, dtype):
    """op-plugin's generate_inputs for method_mode 1 (kv, v ~ 8 N(0,1) - 10; gamma ~ 990 N - 1000)."""
    kv = (8 * rng.standard_normal((b, 1, s, DK)) - 10).astype(dtype)  # [B, 1, S, 192]
    gamma = (990 * rng.standard_normal(DK) - 1000).astype(dtype)  # [192]
    cos = rng.standard_normal((b, 1, s, 64)).astype(dtype)  # [B, 1, S, 64]
    sin = (0.02 * rng.standard_normal((b, 1, s, 64)) - 0.01).astype(dtype)  # [B, 1, S, 64]
    v = (8 * rng.standard_normal((b, 1, s, DV)) - 10).astype(dtype)  # [B, 1, S, 128]
    return kv, gamma, cos, sin, v


def make_scales(rng):
    """Multipliers that keep most values inside int8 and saturate some."""
    return rng.uniform(0.005, 0.08, DK).astype(np.float32), rng.uniform(1.0, 16.0, DV).astype(np.float32)


def make_case(rng, mode, b, s, dtype, quant, block_size=32, cache_length=None):
    """Inputs, a shuffled index (last entry -1) and poisoned caches for ``mode``."""
    cache_dtype = np.dtype(np.int8) if quant else dtype
    if mode == "Norm":
        length = cache_length or s + 3
        index = np.stack([rng.permutation(length)[:s] for _ in range(b)]).astype(np.int64)  # [B, S]
        shapes = (b, 1, length, DK), (b, 1, length, DV)
    else:
        pages = -(-s // block_size)
        nb = pages * b + 2
        if mode.startswith("PA_BLK"):
            index = rng.permutation(nb)[:b * pages].astype(np.int64) * block_size  # [B*pages] page starts
        else:
            index = rng.permutation(nb * block_size)[:b * s].astype(np.int64)  # [B*S] slots
        shapes = (nb, block_size, 1, DK), (nb, block_size, 1, DV)
    if index.size > 1:
        index.reshape(-1)[-1] = -1
    return make_inputs(rng, b, s, dtype), index, poisoned(shapes[0], cache_dtype), poisoned(shapes[1], cache_dtype)


def call(inputs, index, k_cache, ckv_cache, scales=(None, None), **kw):
    kv, gamma, cos, sin, v = inputs
    return npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale=scales[0],
                                     c_kv_scale=scales[1], v=v, **kw)


# ---------------------------------------------------------------------- values and layout
@pytest.mark.parametrize("b,s", SHAPES)
@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_caches_and_outputs_byte_exact(rng, mode, dtype, quant, b, s):
    inputs, index, k_cache, ckv_cache = make_case(rng, mode, b, s, dtype, quant)
    scales = make_scales(rng) if quant else (None, None)
    ref = v_split_ref(*inputs[:4], index, k_cache, ckv_cache, inputs[4], k_rope_scale=scales[0],
                      c_kv_scale=scales[1], cache_mode=mode)
    output_kv = mode != "Norm"
    out = call(inputs, index, k_cache, ckv_cache, scales, cache_mode=mode, is_output_kv=output_kv)
    assert out[0] is k_cache and out[1] is ckv_cache
    assert_same_bytes(k_cache, ref.k_cache, "k_cache")
    assert_same_bytes(ckv_cache, ref.ckv_cache, "ckv_cache")
    assert out[2].shape == (b, 1, s, DK) and out[3].shape == (b, 1, s, DV)
    assert out[2].dtype == dtype and out[3].dtype == dtype
    if output_kv:
        assert_same_bytes(out[2], ref.k_out, "k_embed_out")
        assert_same_bytes(out[3], ref.v_out, "y_out")
        assert not np.shares_memory(out[3], inputs[4])
    else:
        assert not raw(out[2]).any() and not raw(out[3]).any()  # zero-filled (UNWRITTEN_OUTPUT_FILL)


def test_official_golden_within_criterion(rng):
    """The op-plugin golden (fp32 torch.mean order, here NumPy's) is met at its own criterion for
    PA_BNSD bf16 (the v_split test case): k within prec 0.04, v byte-exact."""
    b, s = 64, 1
    inputs, index, k_cache, ckv_cache = make_case(rng, "PA_BNSD", b, s, BF16, False, block_size=128)
    index = np.arange(b * s, dtype=np.int64)
    call(inputs, index, k_cache, ckv_cache, cache_mode="PA_BNSD")
    kv, gamma, cos, sin, v = (x.astype(np.float32) for x in inputs)
    y = kv / np.sqrt(np.mean(kv ** 2, axis=-1, keepdims=True) + np.float32(1e-5)) * gamma
    k = y[..., :64].reshape(b, 1, s, 32, 2).swapaxes(-1, -2).reshape(b, 1, s, 64)
    k = k * cos + np.concatenate([-k[..., 32:], k[..., :32]], axis=-1) * sin
    golden = np.concatenate([k, y[..., 64:]], axis=-1).reshape(-1, DK).astype(BF16)
    got = k_cache.reshape(-1, DK)[:b * s].astype(np.float32)
    err = np.abs(got - golden.astype(np.float32))
    assert np.count_nonzero(err > 0.04 * np.maximum(np.abs(got), 1.0)) == 0
    assert_same_bytes(ckv_cache.reshape(-1, DV)[:b * s], inputs[4].reshape(-1, DV), "ckv_cache")


def test_blk_nz_order_is_the_kernels(rng):
    """The two 192-wide orders (48-lane blocks; 24-lane blocks in the non-quant PA_BLK_NZ kernel)
    give different sums, and the emulator's square sums equal the reference's bit for bit."""
    x = (8 * rng.standard_normal((2000, DK)) - 10).astype(BF16).astype(np.float32)
    s48, s24 = square_sum(x, 48), square_sum(x, 24)
    assert np.any(s48 != s24)
    assert block_width("PA_BLK_NZ", False) == 24 and block_width("PA_BLK_NZ", True) == 48
    assert np.array_equal(square_sums(x, KV_CACHE_RMS).view(np.uint32), s48.view(np.uint32))
    assert np.array_equal(square_sums(x, KV_CACHE_BLK_NZ_RMS).view(np.uint32), s24.view(np.uint32))


@pytest.mark.parametrize("quant", [False, True])
def test_pa_blk_nz_rows_follow_its_kernels_order(rng, quant):
    """Over 4096 tokens a few bf16 k rows depend on the order (24- vs 48-lane blocks): PA_BLK_NZ's
    k rows are the 24-lane order's without quant, the 48-lane order's with it."""
    from tests.reference.kv_rmsnorm_v_split import k_rows_f32

    b, s, bs = 1, 4096, 32
    kv, gamma, cos, sin, v = make_inputs(rng, b, s, BF16)
    rows = {w: k_rows_f32(kv, gamma, cos, sin, 1e-5, w).astype(BF16).view(np.uint16) for w in (24, 48)}
    assert np.any(rows[24] != rows[48])  # else this test could not tell the orders apart
    dt = np.int8 if quant else BF16
    k_cache, ckv_cache = np.zeros((s // bs, bs, 1, DK), dt), np.zeros((s // bs, bs, 1, DV), dt)
    scales = make_scales(rng) if quant else (None, None)
    out = call((kv, gamma, cos, sin, v), np.arange(s // bs, dtype=np.int64) * bs, k_cache, ckv_cache, scales,
               cache_mode="PA_BLK_NZ", is_output_kv=True)
    got = out[2].reshape(-1, DK).view(np.uint16)
    assert np.array_equal(got, rows[48 if quant else 24])


def test_duplicate_slots_last_token_wins(rng):
    inputs, _, k_cache, ckv_cache = make_case(rng, "PA_NZ", 2, 3, BF16, False)
    index = np.array([5, 9, 5, 7, 9, -1], np.int64)
    ref = v_split_ref(*inputs[:4], index, k_cache, ckv_cache, inputs[4], cache_mode="PA_NZ")
    with pytest.warns(Warning):
        call(inputs, index, k_cache, ckv_cache, cache_mode="PA_NZ")
    assert_same_bytes(k_cache, ref.k_cache, "k_cache")
    assert_same_bytes(ckv_cache, ref.ckv_cache, "ckv_cache")


# ---------------------------------------------------------------------- rejected calls
def _bad(rng, what):
    """Arguments of a PA_NZ call with one thing wrong (``what``)."""
    inputs, index, k_cache, ckv_cache = make_case(rng, "PA_NZ", 2, 3, BF16, what.startswith("q_"))
    kv, gamma, cos, sin, v = inputs
    scales = make_scales(rng) if what.startswith("q_") else (None, None)
    kw = dict(cache_mode="PA_NZ")
    if what == "kv_576":
        kv = np.zeros((2, 1, 3, 576), BF16)
    elif what == "n2":
        kv, v = np.zeros((2, 2, 3, DK), BF16), np.zeros((2, 2, 3, DV), BF16)
    elif what == "gamma_512":
        gamma = np.zeros(512, BF16)
    elif what == "v_dtype":
        v = v.astype(np.float16)
    elif what == "v_width":
        v = np.zeros((2, 1, 3, 64), BF16)
    elif what == "v_seq":
        v = np.zeros((2, 1, 4, DV), BF16)
    elif what == "v_3d":
        v = v.reshape(2, 3, DV)
    elif what == "k_cache_64":
        k_cache = poisoned(k_cache.shape[:3] + (64,), BF16)
    elif what == "ckv_cache_512":
        ckv_cache = poisoned(ckv_cache.shape[:3] + (512,), BF16)
    elif what == "q_scale_1":
        scales = (np.ones(1, np.float32), scales[1])
    elif what == "q_scale_64":
        scales = (np.ones(64, np.float32), scales[1])
    elif what == "q_scale_512":
        scales = (scales[0], np.ones(512, np.float32))
    elif what == "q_bf16_caches":
        k_cache, ckv_cache = poisoned(k_cache.shape, BF16), poisoned(ckv_cache.shape, BF16)
    elif what == "norm_output_kv":
        inputs, index, k_cache, ckv_cache = make_case(rng, "Norm", 2, 3, BF16, False)
        kw = dict(cache_mode="Norm", is_output_kv=True)
    elif what == "offset":
        kw["k_rope_offset"] = np.zeros(DK, np.float32)
    elif what == "index_range":
        index = index.copy()
        index[0] = k_cache.shape[0] * k_cache.shape[1]
    return (kv, gamma, cos, sin, index, k_cache, ckv_cache), dict(k_rope_scale=scales[0], c_kv_scale=scales[1], v=v,
                                                                  **kw)


BAD = [("kv_576", ShapeError, r"kv: expected .*\[B, 1, S, 192\] \(K/V-split.*got \[2, 1, 3, 576\]"),
       ("n2", ModeError, r"kv: expected N = kv.shape\[1\] in \[1\].*\[2, 2, 3, 192\]"),
       ("gamma_512", ShapeError, r"gamma: expected shape \[192\] \(K/V-split mode: v given\), got \[512\]"),
       ("v_dtype", DTypeError, r"v: expected .*bfloat16.*float16"),
       ("v_width", ShapeError, r"v: expected .*\[B, 1, S, 128\].*\[2, 1, 3, 64\]"),
       ("v_seq", ShapeError, r"v: expected .*\[B, 1, S, 128\].*\[2, 1, 4, 128\]"),
       ("v_3d", ShapeError, r"v: expected"),
       ("k_cache_64", ShapeError, r"k_cache: expected .*\[block_num, block_size, 1, 192\]"),
       ("ckv_cache_512", ShapeError, r"ckv_cache: expected .*\[block_num, block_size, 1, 128\]"),
       ("q_scale_1", ShapeError, r"k_rope_scale: expected shape \[192\] or \[1, 192\].*got \[1\]"),
       ("q_scale_64", ShapeError, r"k_rope_scale: expected shape \[192\]"),
       ("q_scale_512", ShapeError, r"c_kv_scale: expected shape \[128\] or \[1, 128\].*got \[512\]"),
       ("q_bf16_caches", DTypeError, r"k_cache: expected dtype int8"),
       ("norm_output_kv", ModeError, r"is_output_kv: expected False in cache_mode Norm"),
       ("offset", ModeError, r"k_rope_offset: expected None"),
       ("index_range", IndexRangeError, r"index")]


@pytest.mark.parametrize("what, error, message", BAD, ids=[b[0] for b in BAD])
def test_rejected_calls_write_nothing(rng, what, error, message):
    args, kw = _bad(rng, what)
    before = [raw(a).copy() for a in args[5:7]]
    with pytest.raises(error, match=message):
        npu_kv_rmsnorm_rope_cache(*args, **kw)
    for a, b in zip(args[5:7], before, strict=True):
        assert_same_bytes(a, b)


def test_norm_quant_accepted(rng):
    """Unlike the 576-wide mode, quant in Norm has a kernel here (tiling keys 1010 / 3010)."""
    inputs, index, k_cache, ckv_cache = make_case(rng, "Norm", 2, 5, BF16, True)
    scales = (make_scales(rng)[0].reshape(1, DK), make_scales(rng)[1].reshape(1, DV))  # [1, D] spelling
    ref = v_split_ref(*inputs[:4], index, k_cache, ckv_cache, inputs[4], k_rope_scale=scales[0],
                      c_kv_scale=scales[1], cache_mode="Norm")
    call(inputs, index, k_cache, ckv_cache, scales, cache_mode="Norm")
    assert_same_bytes(k_cache, ref.k_cache, "k_cache")
    assert_same_bytes(ckv_cache, ref.ckv_cache, "ckv_cache")


# ---------------------------------------------------------------------- checked mode
def test_checked_mode_marks_written_slots(rng):
    from tests.reference.kv_rmsnorm_rope_cache import token_slots

    b, s = 2, 37
    inputs, index, k_cache, ckv_cache = make_case(rng, "PA_BLK_NZ", b, s, BF16, False)
    with checked_mode.checked(poison=True):
        call(inputs, index, k_cache, ckv_cache, cache_mode="PA_BLK_NZ")
        written = [checked_mode.written_slots(c) for c in (k_cache, ckv_cache)]
    slots = token_slots(index, "PA_BLK_NZ", b, s, k_cache.shape[1], None)
    want = np.zeros(k_cache.shape[0] * k_cache.shape[1], bool)  # [BlockNum * BlockSize]
    want[slots[slots >= 0]] = True
    for w in written:
        assert w is not None and np.array_equal(w, want)


# ---------------------------------------------------------------------- torch_npu drop-in, hw backend
def test_drop_in_v2_and_v2_functional(rng):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    inputs, index, k_cache, ckv_cache = make_case(rng, "PA_BLK_BNSD", 2, 37, BF16, False)
    ref = v_split_ref(*inputs[:4], index, k_cache, ckv_cache, inputs[4], cache_mode="PA_BLK_BNSD")

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16) if a.dtype == BF16 \
            else torch.from_numpy(a)

    def host(x):
        return x.contiguous().view(torch.int16).numpy().view(BF16)

    kv, gamma, cos, sin, v = (t(x) for x in inputs)
    kc, cc = t(k_cache.copy()), t(ckv_cache.copy())
    k_out, v_out = torch_npu.npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, t(index), kc, cc, v=v,
                                                           cache_mode="PA_BLK_BNSD", is_output_kv=True)
    assert_same_bytes(host(kc), ref.k_cache, "k_cache (v2, in place)")
    assert_same_bytes(host(cc), ref.ckv_cache, "ckv_cache (v2, in place)")
    assert_same_bytes(host(k_out), ref.k_out, "k_rope")
    assert_same_bytes(host(v_out), ref.v_out, "c_kv")

    kc, cc = t(k_cache.copy()), t(ckv_cache.copy())
    outs = torch_npu.npu_kv_rmsnorm_rope_cache_v2_functional(kv, gamma, cos, sin, t(index), kc, cc, v=v,
                                                             cache_mode="PA_BLK_BNSD", is_output_kv=True)
    assert len(outs) == 4
    assert_same_bytes(host(kc), k_cache, "k_cache (functional: untouched)")
    assert_same_bytes(host(outs[2]), ref.k_cache, "k_cache (functional: returned)")
    assert_same_bytes(host(outs[3]), ref.ckv_cache, "ckv_cache (functional: returned)")
    assert tuple(outs[0].shape) == (2, 1, 37, DK) and tuple(outs[1].shape) == (2, 1, 37, DV)


@pytest.mark.parametrize("mode, quant", [("PA_NZ", False), ("Norm", False), ("PA_BLK_BNSD", True)])
def test_hw_backend_passes_v(standin, rng, mode, quant):
    inputs, index, k_cache, ckv_cache = make_case(rng, mode, 2, 3, BF16, quant)
    kv, gamma, cos, sin, v = inputs
    kw = dict(v=v, cache_mode=mode, is_output_kv=mode != "Norm")
    if quant:
        kw["k_rope_scale"], kw["c_kv_scale"] = make_scales(rng)
    assert_backends_agree(npu_kv_rmsnorm_rope_cache, [kv, gamma, cos, sin, index, k_cache, ckv_cache], kw)
