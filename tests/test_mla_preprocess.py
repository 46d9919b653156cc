"""torch_npu.atb.npu_mla_preprocess (ops.npu_mla_preprocess) against tests/reference/mla_preprocess.py.

Every cache_mode x quant_mode pair (bf16; fp16 with its per-tensor kernel), caches pre-filled with
poison and compared byte by byte through the reference's own layout arithmetic, both weight
forms, both NZ cache declarations, the out= form, bad input leaving caches untouched, 1 vs 2
Numba threads, and the kernels' RmsNorm orders (rows and rounding edges of tests/rms_order.py).
"""

from __future__ import annotations

import importlib.util
import warnings

import numba
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, DuplicateSlotWarning, FormatError, IndexRangeError, ModeError, ShapeError
from tests.helpers import BF16, assert_same_bytes, bit_identical_share, dual_threshold_ok, poisoned, raw
from tests.reference import mla_preprocess as ref
from tests.rms_order import candidates, edge_gamma, kernel_rms, order_sensitive_rows, other_rms, rms_factor

T = 4
HIDDEN = 2048  # the smallest legal hiddenSize
N = 16  # head_num (doc range)
BLOCK_SIZE = 128
BLOCK_NUM = 3
SLOTS = [130, 5, -1, 383]  # -1 skips token 2; 383 is the last slot

CACHE_MODES = ["krope_ctkv", "int8_nzcache", "nzcache"]  # aclnn's "kvcache" is rejected (test_errors.py)
QUANT_MODES = ["per_tensor_quant_asymm", "per_token_quant_symm"]
DTYPES = ["bfloat16", "float16"]
NZ_MODES = ("int8_nzcache", "nzcache")

#: Accuracy of q_out0, the one output that goes through the W^UK einsum, whose fp32 accumulation
#: order (BLAS) differs from the reference's float64 sum: the dual criterion of the MLA tests, a
#: floor on the bit-identical share per dtype (measured with the kernels' RmsNorm orders: >= 0.99990
#: bf16, >= 0.99899 fp16) and, for its int8 form ('int8_nzcache': int8(fp16(bf16 einsum *
#: q_nope_scale))), at most MAX_INT8_OFF_BY_ONE of its T*N*512 = 32,768 elements off by one
#: (measured 0: a bf16 einsum value one ulp away moves its int8 by one near a rounding edge, so
#: exactness is not promised). Every other output (q_rope, the cache rows, the int8 ckv) follows
#: the reference's operations exactly (RmsNorm included: same lanes, tree, 1/H and 1/rms steps)
#: and must match byte for byte.
PREC = 0.005
MIN_BIT_IDENTICAL = {np.dtype(BF16): 0.9998, np.dtype(np.float16): 0.998}
MAX_INT8_OFF_BY_ONE = 3


def _dtype(name: str) -> np.dtype:
    return BF16 if name == "bfloat16" else np.dtype(np.float16)


def _kv_spec(cache_mode: str, dt: np.dtype):
    """(kv dim, kv dtype, nz) of a cache mode (every mode torch_npu maps has a separate rope cache)."""
    kv_dt = np.dtype(np.int8) if cache_mode == "int8_nzcache" else dt
    return 512, kv_dt, cache_mode in NZ_MODES


def _cache_shape(dim: int, dtype: np.dtype, nz: bool, *, declared: str = "storage", blocks: int = BLOCK_NUM):
    if not nz or declared == "logical":
        return (blocks, BLOCK_SIZE, 1, dim)
    c0 = 32 // dtype.itemsize
    return (blocks, dim // c0, BLOCK_SIZE, c0)


def make_case(rng, dtype_name: str, cache_mode: str, quant_mode: str, *, t: int = T, slots=SLOTS) -> dict:
    """Arguments of one call: ``args`` (positional, by name) and ``kwargs``; weights cast to NZ."""
    dt = _dtype(dtype_name)
    u = lambda lo, hi, shape: rng.uniform(lo, hi, shape).astype(np.float32).astype(dt)  # noqa: E731

    def descale(size):
        d = (rng.random(size, dtype=np.float32) / 1000).astype(np.float32)
        return d if dt == BF16 else d.view(np.int32).astype(np.int64)  # fp16: fp32 bits in an int64

    big = rng.standard_normal((t, 2 * HIDDEN)).astype(np.float32).astype(dt)
    kv_dim, kv_dt, nz = _kv_spec(cache_mode, dt)
    args = {
        "input": big[:, ::2],  # non-contiguous
        "gamma0": u(-1, 1, HIDDEN), "beta0": rng.integers(-2, 2, HIDDEN).astype(np.float32).astype(dt),
        "wdqkv": ops.npu_format_cast(rng.integers(-8, 8, (2112, HIDDEN), dtype=np.int8), 29),
        "descale0": descale(2112),
        "gamma1": u(-1, 1, 1536), "beta1": rng.integers(-2, 2, 1536).astype(np.float32).astype(dt),
        "wuq": ops.npu_format_cast(rng.integers(-8, 8, (N * 192, 1536), dtype=np.int8), 29),
        "descale1": descale(N * 192),
        "gamma2": u(-1, 1, 512),
        "cos": u(-1, 1, (t, 128))[:, 32:96],  # non-contiguous
        "sin": u(-1, 1, (t, 64)),
        "wuk": u(-0.5, 0.5, (N, 128, 512)),
        "kv_cache": poisoned(_cache_shape(kv_dim, kv_dt, nz), kv_dt),
        "kv_cache_rope": poisoned(_cache_shape(64, dt, nz), dt),
        "slotmapping": np.asarray(slots, dtype=np.int32),
    }
    kwargs = {"cache_mode": cache_mode, "quant_mode": quant_mode}
    if quant_mode == "per_tensor_quant_asymm":
        kwargs.update(quant_scale0=np.array([0.03], dt), quant_offset0=np.array([3], np.int8),
                      bias0=rng.integers(-10, 10, 2112).astype(np.int32),
                      quant_scale1=np.array([0.04], dt), quant_offset1=np.array([-2], np.int8),
                      bias1=rng.integers(-10, 10, N * 192).astype(np.int32))
    if cache_mode == "int8_nzcache":
        kwargs.update(ctkv_scale=np.array([0.02], dt), q_nope_scale=u(0.2, 1.0, N))
    return {"args": args, "kwargs": kwargs}


def run(case: dict, **overrides):
    """Call the op; ``overrides`` replace args / kwargs by name."""
    args = dict(case["args"])
    kwargs = dict(case["kwargs"])
    for k, v in overrides.items():
        (args if k in args else kwargs)[k] = v
    return ops.npu_mla_preprocess(*args.values(), **kwargs)


def reference(case: dict) -> dict:
    inp = {k: np.asarray(v) for k, v in case["args"].items() if v is not None}
    inp.update({k: np.asarray(v) for k, v in case["kwargs"].items() if isinstance(v, np.ndarray)})
    return ref.mla_preprocess_ref(inp, case["kwargs"]["cache_mode"], case["kwargs"]["quant_mode"])


def check_close(actual, expected, what: str, *, exact: bool = True) -> None:
    """``exact``: byte equality. Else int8: equal but for MAX_INT8_OFF_BY_ONE elements off by one; bf16 / fp16:
    dual criterion + bit-identical share floor."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    if exact:
        assert_same_bytes(actual, expected, what)
        return
    if actual.dtype == np.int8:
        diff = np.abs(actual.astype(np.int16) - expected.astype(np.int16))
        assert diff.max(initial=0) <= 1, f"{what}: int8 off by {diff.max()}"
        assert np.count_nonzero(diff) <= MAX_INT8_OFF_BY_ONE, f"{what}: {np.count_nonzero(diff)} elements off by one"
        return
    assert dual_threshold_ok(actual, expected, PREC), what
    assert bit_identical_share(actual, expected) >= MIN_BIT_IDENTICAL[actual.dtype], what


def check_caches(case: dict, out: tuple, want: dict, before: dict) -> None:
    """Read each token's row back with the reference's layout arithmetic, compare it, then rebuild
    the whole cache from the pre-call bytes plus those rows and demand byte equality."""
    mode = case["kwargs"]["cache_mode"]
    _, _, nz = _kv_spec(mode, case["args"]["input"].dtype)
    slots = case["args"]["slotmapping"].astype(np.int64)
    live = slots >= 0
    pairs = [(out[1], before["kv"], want["kv_rows"], "kv_cache"),
             (out[3], before["rope"], want["krope_rows"], "kv_cache_rope")]
    for cache, start, rows, name in pairs:
        dim = rows.shape[1]
        got = ref.read_rows(cache, slots[live], dim, nz=nz, block_size=BLOCK_SIZE)  # [T', dim]
        # last writer per slot (duplicates): the reference rows of the last token with that slot
        last = {int(s): i for i, s in enumerate(slots) if s >= 0}
        check_close(got, rows[[last[int(s)] for s in slots[live]]], f"{name} rows")
        rebuilt = start.copy()
        ref.write_rows(rebuilt, got, slots[live], nz=nz, block_size=BLOCK_SIZE)
        assert_same_bytes(cache, rebuilt, f"{name} (untouched bytes / layout)")


def _snapshot(case: dict) -> dict:
    a = case["args"]
    return {"kv": a["kv_cache"].copy(), "rope": None if a["kv_cache_rope"] is None else a["kv_cache_rope"].copy()}


def _in_place_outs(case: dict) -> dict:
    """out= arrays: poisoned q outputs, the caches themselves."""
    a, kw = case["args"], case["kwargs"]
    mode = kw["cache_mode"]
    dt = a["input"].dtype
    q0_dt = np.int8 if mode == "int8_nzcache" else dt
    return {"q_out0": poisoned((T, N, 512), q0_dt),
            "kv_cache_out0": a["kv_cache"], "q_out1": poisoned((T, N, 64), dt),
            "kv_cache_out1": a["kv_cache_rope"]}


# ---------------------------------------------------------------------- against the reference
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("cache_mode", CACHE_MODES)
@pytest.mark.parametrize("quant_mode", QUANT_MODES)
def test_matches_reference_in_place(rng, dtype_name, cache_mode, quant_mode):
    case = make_case(rng, dtype_name, cache_mode, quant_mode)
    before = _snapshot(case)
    outs = _in_place_outs(case)
    if dtype_name == "float16" and quant_mode == "per_token_quant_symm":  # no fp16 per-token kernel
        with pytest.raises(ModeError, match="per_tensor_quant_asymm"):
            run(case, **outs)
        for name, cache in (("kv", case["args"]["kv_cache"]), ("rope", case["args"]["kv_cache_rope"])):
            if cache is not None:
                assert_same_bytes(cache, before[name], f"{name} cache after a rejected call")
        return
    got = run(case, **outs)
    assert all(g is o for g, o in zip(got, outs.values(), strict=True)), "the out= arrays are returned"
    want = reference(case)
    live = case["args"]["slotmapping"] >= 0
    check_close(got[0], want["q_out0"], "q_out0", exact=False)
    check_close(got[2], want["q_out1"], "q_out1")
    assert live.sum() == T - 1
    check_caches(case, got, want, before)


@pytest.mark.parametrize("cache_mode", CACHE_MODES)
def test_functional_form_returns_copies(rng, cache_mode):
    case = make_case(rng, "bfloat16", cache_mode, "per_token_quant_symm")
    before = _snapshot(case)
    got = run(case)
    assert_same_bytes(case["args"]["kv_cache"], before["kv"], "kv_cache is not modified")
    if before["rope"] is not None:
        assert_same_bytes(case["args"]["kv_cache_rope"], before["rope"], "kv_cache_rope is not modified")
    assert got[1] is not case["args"]["kv_cache"]
    check_caches(case, got, reference(case), before)  # copies of the caches plus the rows
    in_place = run(case, **_in_place_outs(case))
    for a, b, name in zip(got, in_place, ("q_out0", "kv_cache_out0", "q_out1", "kv_cache_out1"), strict=True):
        assert_same_bytes(a, b, f"{name}: functional == out= form")


def test_out_form_into_separate_tensors_leaves_caches(rng):
    """As in the torch_npu doc example: kv_cache_out0 / kv_cache_out1 are other tensors."""
    case = make_case(rng, "float16", "int8_nzcache", "per_tensor_quant_asymm")
    before = _snapshot(case)
    outs = {k: (poisoned(v.shape, v.dtype) if k.startswith("kv") else v) for k, v in _in_place_outs(case).items()}
    got = run(case, **outs)
    assert all(g is o for g, o in zip(got, outs.values(), strict=True))
    assert_same_bytes(case["args"]["kv_cache"], before["kv"], "kv_cache untouched in the out= form")
    assert_same_bytes(case["args"]["kv_cache_rope"], before["rope"], "kv_cache_rope untouched")
    check_caches(case, got, reference(case), {"kv": poisoned(before["kv"].shape, before["kv"].dtype),
                                              "rope": poisoned(before["rope"].shape, before["rope"].dtype)})


def test_fp16_negative_descales_sign_extended(rng):
    """int64 descales whose high word is the sign extension of a negative fp32's bits (module doc)."""
    case = make_case(rng, "float16", "krope_ctkv", "per_tensor_quant_asymm")
    for name in ("descale0", "descale1"):
        bits = case["args"][name].astype(np.uint32).view(np.float32)
        case["args"][name] = (-bits).view(np.int32).astype(np.int64)  # [size] high word 0xFFFFFFFF
        assert (case["args"][name] < 0).all()
    before = _snapshot(case)
    got = run(case, **_in_place_outs(case))
    want = reference(case)
    check_close(got[0], want["q_out0"], "q_out0", exact=False)
    check_close(got[2], want["q_out1"], "q_out1")
    check_caches(case, got, want, before)


# ---------------------------------------------------------------------- RmsNorm order
#: Tokens of the RmsNorm order test: a bf16 kv row has few rounding edges (no scale to search), an
#: fp16 one many.
ORDER_TOKENS = {"bfloat16": 48, "float16": 4}
#: Heads of the RmsNorm order test: q_out1 then holds every column of RmsNormQuant1's int8 output.
ORDER_HEADS = 1536 // 64


def _order_case(dtype_name: str) -> dict:
    """A call (make_case's form) whose kv RmsNorm and RmsNormQuant1 inputs are order-sensitive rows
    (tests/rms_order.py) set exactly, with gammas putting outputs on rounding edges; ``kv`` / ``qa``:
    those rows ``[T, 512]`` / ``[T, 1536]``.

    Token ``t`` is one-hot at column ``t`` (RmsNormQuant0 makes it int8 1 there, 0 elsewhere), so
    ``mm0[t] = round(wdqkv[:, t] * descale0)``: integers times per-column steps, exact in the dtype.
    kv: gamma2 on edges of ``x / rms`` (fp16 also of ``x * (1 / rms)``). q: row ``t_i = i % T`` of
    column ``i`` gets ``gamma1 = c * 2^k`` with ``|x * (1/rms) * gamma1|`` in ``[2^12, 2^14)`` and
    ``beta1`` its negated rounding, so ``y`` is a small remainder that moves by about ``2^-10`` per
    ulp of ``1/rms``: int8 edges are then common (other rows saturate). wuq reads RmsNormQuant1's
    int8 back through q_pe (cos 1, sin 0, descale1 1); q_nope and so q_out0 are zero.
    """
    dt, t = _dtype(dtype_name), ORDER_TOKENS[dtype_name]
    f32 = np.float32
    rng = np.random.default_rng(29)
    step = (2.0 ** rng.uniform(-8, 0, 2112)).astype(f32)  # [2112] descale0

    def draw(cols):
        return lambda r, h: (r.integers(-127, 128, h).astype(f32) * step[cols]).astype(dt).astype(f32)

    kv = order_sensitive_rows(t, 512, ref.EPS, "mlapo_kv", draw(slice(0, 512)))  # [T, 512]
    qa = order_sensitive_rows(t, 1536, ref.EPS, "mlapo_quant", draw(slice(576, 2112)))  # [T, 1536]
    wdqkv = np.zeros((2112, HIDDEN), np.int8)  # krope columns 512:576 stay zero
    wdqkv[:512, :t] = np.rint(kv / step[:512]).T
    wdqkv[576:, :t] = np.rint(qa / step[576:]).T

    rms = np.array([kernel_rms(r, ref.EPS, "mlapo_kv") for r in kv], f32)[:, None, None]  # [T, 1, 1]
    finish = lambda q, g: (kv[:, :, None] / q * g).astype(dt).view(np.uint16)  # noqa: E731
    recip = lambda g: (kv[:, :, None] * (f32(1.0) / rms) * g).astype(dt).view(np.uint16)  # noqa: E731
    gamma2 = edge_gamma(rms[:, 0, 0], finish, candidates(dtype=dt), np.ones(512, f32),
                        alternatives=[recip] if dt == np.float16 else [])
    assert gamma2 is not None, "no kv rounding edges"

    rq = np.array([kernel_rms(r, ref.EPS, "mlapo_quant") for r in qa], f32)[:, None, None]  # [T, 1, 1]
    own = np.arange(1536) % t  # [1536] the row each column's gamma1 / beta1 are made for
    m = qa[own, np.arange(1536)] * rms_factor(rq, "mlapo_quant")[own, 0, 0]  # [1536] x * (1/rms)
    big = np.abs(m) >= 0.25  # gamma1 stays within fp16
    power = np.where(big, 2.0 ** (12 - np.floor(np.log2(np.where(big, np.abs(m), 1.0)))), 0).astype(f32)

    def cancel(gm):  # beta1 making y of the own row a remainder of at most half a ulp of the dtype
        return -(m.reshape(1, -1, 1) * gm).astype(dt).astype(f32)

    def quant(xs, gm):  # RmsNormQuant1's int8 with quant_scale1 1, offset 0, for the scaled rows xs
        with np.errstate(over="ignore"):
            return ref.int8_via_f16(xs[:, :, None] * gm + cancel(gm))

    scaled = lambda g: g * power.reshape(1, -1, 1)  # noqa: E731
    gamma1 = edge_gamma(rms_factor(rq, "mlapo_quant")[:, 0, 0],
                        lambda q, g: quant(qa * q[:, :, 0], scaled(g)), candidates(1.0, 2.0), np.zeros(1536, f32),
                        alternatives=[lambda g: quant(qa / rq[:, :, 0], scaled(g))])
    assert gamma1 is not None, "no RmsNormQuant1 edges"
    gamma1 = gamma1 * power
    beta1 = cancel(gamma1.reshape(1, -1, 1)).reshape(-1)

    def descale(d):
        d = np.asarray(d, f32)
        return d if dt == BF16 else d.view(np.int32).astype(np.int64)

    wuq = np.zeros((ORDER_HEADS * 192, 1536), np.int8)
    head, j = np.divmod(np.arange(1536), 64)
    wuq[head * 192 + 128 + j, np.arange(1536)] = 1  # q_pe[h, j] = int8 column h * 64 + j
    x = np.zeros((t, HIDDEN), dt)
    x[np.arange(t), np.arange(t)] = 1.0
    args = {
        "input": x, "gamma0": np.ones(HIDDEN, dt), "beta0": np.zeros(HIDDEN, dt),
        "wdqkv": ops.npu_format_cast(wdqkv, 29), "descale0": descale(step),
        "gamma1": gamma1.astype(dt), "beta1": beta1.astype(dt),
        "wuq": ops.npu_format_cast(wuq, 29), "descale1": descale(np.ones(ORDER_HEADS * 192)),
        "gamma2": gamma2.astype(dt), "cos": np.ones((t, 64), dt), "sin": np.zeros((t, 64), dt),
        "wuk": np.zeros((ORDER_HEADS, 128, 512), dt),
        "kv_cache": poisoned(_cache_shape(512, dt, False, blocks=1), dt),
        "kv_cache_rope": poisoned(_cache_shape(64, dt, False, blocks=1), dt),
        "slotmapping": np.arange(t, dtype=np.int32),
    }
    kwargs = {"cache_mode": "krope_ctkv", "quant_mode": "per_tensor_quant_asymm",
              "quant_scale0": np.array([32.0], dt), "quant_offset0": np.array([0], np.int8),
              "quant_scale1": np.array([1.0], dt), "quant_offset1": np.array([0], np.int8)}
    # the reference's own first steps give exactly these RmsNorm inputs
    for i in range(t):
        q8, _ = ref.quant_row(ref.rms_norm_row(x[i], args["gamma0"], "mlapo_quant"), 32.0, 0)
        assert np.array_equal(q8, np.eye(1, HIDDEN, i, dtype=np.int8)[0]), f"token {i}: int8 not one-hot"
        mm0 = ref.matmul_dequant_row(q8, wdqkv, None, step, None, dt)
        assert np.array_equal(mm0, np.concatenate([kv[i], np.zeros(64, f32), qa[i]])), f"token {i}: mm0"
    return {"args": args, "kwargs": kwargs, "kv": kv, "qa": qa}


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_rmsnorm_orders(dtype_name):
    """The kv RmsNorm (64 in-order lanes, lane tree, ``/ rms``) and RmsNormQuant (squares times 1/H,
    the same lanes, ``* (1 / rms)``) sum and finish in the kernels' order: on rows where every other
    order of tests/rms_order.py gives another rms, with gammas putting outputs on rounding edges,
    the kv cache rows and RmsNormQuant1's int8 (read back through q_out1) are bit-identical to the
    reference; each other order (and finishing step) changes some of those bytes (checked on the
    reference side)."""
    case = _order_case(dtype_name)
    dt, kv, qa = _dtype(dtype_name), case["kv"], case["qa"]
    t = kv.shape[0]
    before = _snapshot(case)
    got = run(case)
    want = reference(case)
    for a, e, name in ((got[0], want["q_out0"], "q_out0"), (got[2], want["q_out1"], "q_out1")):
        check_close(a, e, name)
    check_caches(case, got, want, before)

    f32 = np.float32
    gamma2 = case["args"]["gamma2"].astype(f32)
    kv_bytes = want["kv_rows"].view(np.uint16)  # [T, 512]
    alts = [other_rms(r, ref.EPS, "mlapo_kv") for r in kv]
    others = {name: [a[name] for a in alts] for name in alts[0]}
    rms = np.array([kernel_rms(r, ref.EPS, "mlapo_kv") for r in kv], f32)[:, None]
    assert np.array_equal((kv / rms * gamma2).astype(dt).view(np.uint16), kv_bytes), "kv formula"
    if dt == np.float16:
        others["x * (1 / rms)"] = None
    for name, alt in others.items():
        out = kv * (f32(1.0) / rms) * gamma2 if alt is None else kv / np.array(alt, f32)[:, None] * gamma2
        assert not np.array_equal(out.astype(dt).view(np.uint16), kv_bytes), f"kv: {name}"

    gamma1, beta1 = case["args"]["gamma1"].astype(f32), case["args"]["beta1"].astype(f32)
    q8 = want["q_out1"].astype(f32).reshape(t, 1536)  # RmsNormQuant1's int8 [T, 1536]
    rq = np.array([kernel_rms(r, ref.EPS, "mlapo_quant") for r in qa], f32)[:, None]

    def quant(xs):
        with np.errstate(over="ignore"):
            return ref.int8_via_f16(xs * gamma1 + beta1).astype(f32)

    assert np.array_equal(quant(qa * rms_factor(rq, "mlapo_quant")), q8), "RmsNormQuant formula"
    alts = [other_rms(r, ref.EPS, "mlapo_quant") for r in qa]
    others = {name: [a[name] for a in alts] for name in alts[0]}
    others["x / rms"] = None
    for name, alt in others.items():
        xs = qa / rq if alt is None else qa * rms_factor(np.array(alt, f32)[:, None], "mlapo_quant")
        assert not np.array_equal(quant(xs), q8), f"RmsNormQuant: {name}"


# ---------------------------------------------------------------------- weight and cache forms
def _storage_form(w: np.ndarray) -> np.ndarray:
    """The doc example's form of a weight: its FRACTAL_NZ storage as a tensor, itself cast."""
    st = ops.npu_format_cast(w, 29).storage()  # [..., K/C0, M/16, 16, C0]
    lead = st.shape[:-4] or (1,)
    return ops.npu_format_cast(st.reshape(*lead, st.shape[-4], -1, st.shape[-1]), 29)


@pytest.mark.parametrize("wuk_form", ["nd", "nz_logical", "nz_storage"])
def test_weight_forms_give_identical_bytes(rng, wuk_form):
    case = make_case(rng, "bfloat16", "krope_ctkv", "per_token_quant_symm")
    base = [np.array(a, copy=True) for a in run(case)]
    wuk = case["args"]["wuk"]
    wuk = {"nd": wuk, "nz_logical": ops.npu_format_cast(wuk, 29), "nz_storage": _storage_form(wuk)}[wuk_form]
    wdqkv, wuq = _storage_form(np.asarray(case["args"]["wdqkv"])), _storage_form(np.asarray(case["args"]["wuq"]))
    assert wdqkv.shape == (1, HIDDEN // 32, 2112, 32) and wuq.shape == (1, 1536 // 32, N * 192, 32)
    for _ in range(2):  # the second call reuses the weights read back on the first
        got = run(case, wdqkv=wdqkv, wuq=wuq, wuk=wuk)
        for a, b in zip(base, got, strict=True):
            assert_same_bytes(b, a, f"wuk {wuk_form}, storage-shaped wdqkv / wuq")


@pytest.mark.parametrize("cache_mode", NZ_MODES)
@pytest.mark.parametrize("declared", ["logical", "heads"])
def test_nz_cache_declarations_hold_the_same_bytes(rng, cache_mode, declared):
    """Storage [B, D/C0, 128, C0], logical [B, 128, 1, D] and the docs' [B/N, N*D/C0, 128, C0]
    (N times the blocks per declared block) are the same raw memory."""
    blocks = N  # so that the head-multiplied declaration has one declared block
    case = make_case(rng, "bfloat16", cache_mode, "per_token_quant_symm",
                     slots=[BLOCK_SIZE * 9 + 3, 17, 2047, BLOCK_SIZE * 5])
    kv_dim, kv_dt, _ = _kv_spec(cache_mode, BF16)
    caches = {}
    for form in ("storage", declared):
        if form == "heads":
            shape_kv = (1, N * kv_dim * kv_dt.itemsize // 32, BLOCK_SIZE, 32 // kv_dt.itemsize)
            shape_kr = (1, N * 64 * 2 // 32, BLOCK_SIZE, 16)
        else:
            shape_kv = _cache_shape(kv_dim, kv_dt, True, declared=form, blocks=blocks)
            shape_kr = _cache_shape(64, BF16, True, declared=form, blocks=blocks)
        caches[form] = run(case, kv_cache=poisoned(shape_kv, kv_dt), kv_cache_rope=poisoned(shape_kr, BF16))
    for a, b in zip(caches["storage"], caches[declared], strict=True):
        assert_same_bytes(b, a, f"{declared} declaration")


def test_nd_caches_with_block_size_256(rng):
    """torch_npu: ND caches take BlockSize <= 128 or 256."""
    case = make_case(rng, "bfloat16", "krope_ctkv", "per_token_quant_symm")
    case["args"]["kv_cache"] = poisoned((2, 256, 1, 512), BF16)
    case["args"]["kv_cache_rope"] = poisoned((2, 256, 1, 64), BF16)
    before = _snapshot(case)
    got = run(case, **_in_place_outs(case))
    check_caches(case, got, reference(case), before)


# ---------------------------------------------------------------------- slots
def test_duplicate_slots_warn_and_last_token_wins(rng):
    case = make_case(rng, "bfloat16", "nzcache", "per_tensor_quant_asymm", slots=[7, 300, 7, -1])
    before = _snapshot(case)
    with pytest.warns(DuplicateSlotWarning, match="slot 7"):
        got = run(case, **_in_place_outs(case))
    check_caches(case, got, reference(case), before)


def test_zero_tokens_write_nothing(rng):
    case = make_case(rng, "bfloat16", "int8_nzcache", "per_token_quant_symm", t=0, slots=[])
    before = _snapshot(case)
    got = run(case)
    assert got[0].shape == (0, N, 512) and got[2].shape == (0, N, 64)
    assert_same_bytes(got[1], before["kv"], "kv_cache")
    assert_same_bytes(got[3], before["rope"], "kv_cache_rope")


# ---------------------------------------------------------------------- bad input
def _bad_cases():
    """(id, cache_mode, quant_mode, dtype, overrides builder, error)."""
    bf, i8 = BF16, np.int8
    return [
        ("slot_out_of_range", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"slotmapping": np.array([0, 1, 384, 2], np.int32)}, IndexRangeError),
        ("slot_minus_two", "int8_nzcache", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"slotmapping": np.array([0, -2, 3, 2], np.int32)}, IndexRangeError),
        ("slot_int64", "nzcache", "per_token_quant_symm", "bfloat16",
         lambda c: {"slotmapping": np.array([0, 1, 3, 2], np.int64)}, DTypeError),
        ("wdqkv_not_nz", "krope_ctkv", "per_token_quant_symm", "bfloat16",
         lambda c: {"wdqkv": np.asarray(c["args"]["wdqkv"])}, FormatError),
        ("wuq_storage_not_nz", "krope_ctkv", "per_token_quant_symm", "bfloat16",
         lambda c: {"wuq": np.asarray(_storage_form(np.asarray(c["args"]["wuq"])))}, FormatError),
        ("fp16_per_token", "krope_ctkv", "per_tensor_quant_asymm", "float16",
         lambda c: {"quant_mode": "per_token_quant_symm", "quant_scale0": None, "quant_offset0": None,
                    "bias0": None, "quant_scale1": None, "quant_offset1": None, "bias1": None}, ModeError),
        ("bias_with_per_token", "nzcache", "per_token_quant_symm", "bfloat16",
         lambda c: {"bias0": np.zeros(2112, np.int32)}, ModeError),
        ("missing_quant_scale", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"quant_scale1": None}, ShapeError),
        ("missing_ctkv_scale", "int8_nzcache", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"ctkv_scale": None}, ShapeError),
        ("ctkv_scale_outside_int8", "nzcache", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"ctkv_scale": np.array([0.1], bf)}, ModeError),
        ("unknown_cache_mode", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"cache_mode": "PA_NZ"}, ModeError),
        ("hidden_not_legal", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"input": np.asarray(c["args"]["input"])[:, :2000]}, ShapeError),
        ("input_fp32", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"input": np.asarray(c["args"]["input"]).astype(np.float32)}, DTypeError),
        ("descale_fp32_with_fp16", "krope_ctkv", "per_tensor_quant_asymm", "float16",
         lambda c: {"descale0": np.ones(2112, np.float32)}, DTypeError),
        ("descale_bad_packing", "krope_ctkv", "per_tensor_quant_asymm", "float16",
         lambda c: {"descale1": c["args"]["descale1"] | np.int64(1 << 40)}, FormatError),
        ("token_num_1025", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"input": np.zeros((1025, HIDDEN), bf)}, ShapeError),
        ("head_num_129", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"wuk": np.ones((129, 128, 512), bf)}, ShapeError),
        ("nd_cache_block_192", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"kv_cache": poisoned((2, 192, 1, 512), bf), "kv_cache_rope": poisoned((2, 192, 1, 64), bf),
                    "kv_cache_out0": None, "q_out0": None, "q_out1": None, "kv_cache_out1": None}, ShapeError),
        ("nz_cache_block_64", "nzcache", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"kv_cache": poisoned((6, 64, 1, 512), bf)}, ShapeError),
        ("int8_cache_bf16", "int8_nzcache", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"kv_cache": poisoned((BLOCK_NUM, 32, BLOCK_SIZE, 16), bf)}, DTypeError),
        ("rope_cache_fewer_slots", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"kv_cache_rope": poisoned((BLOCK_NUM - 1, BLOCK_SIZE, 1, 64), bf)}, ShapeError),
        ("q_out0_wrong_dtype", "int8_nzcache", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"q_out0": poisoned((T, N, 512), bf)}, DTypeError),
        ("partial_out_form", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"q_out1": None}, ModeError),
        ("q_nope_scale_wrong_size", "int8_nzcache", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"q_nope_scale": np.ones(N + 1, bf)}, ShapeError),
        ("wuk_head_mismatch", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"wuk": np.ones((N // 2, 128, 512), bf)}, ShapeError),
        ("quant_offset_not_int8", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"quant_offset0": np.array([3], np.int32)}, DTypeError),
        ("non_contiguous_cache", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"kv_cache_out0": poisoned((BLOCK_NUM, BLOCK_SIZE, 2, 512), bf)[:, :, :1]}, ShapeError),
        ("out_caches_overlap", "krope_ctkv", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"kv_cache_out1": c["args"]["kv_cache"].reshape(-1)[:BLOCK_NUM * BLOCK_SIZE * 64]
                    .reshape(BLOCK_NUM, BLOCK_SIZE, 1, 64)}, ShapeError),
        ("rope_cache_int8", "nzcache", "per_tensor_quant_asymm", "bfloat16",
         lambda c: {"kv_cache_rope": poisoned((BLOCK_NUM, 2, BLOCK_SIZE, 32), i8)}, DTypeError),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("case_id,cache_mode,quant_mode,dtype_name,overrides,error", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_and_leaves_caches(rng, case_id, cache_mode, quant_mode, dtype_name, overrides, error):
    case = make_case(rng, dtype_name, cache_mode, quant_mode)
    outs = _in_place_outs(case)
    over = {**outs, **overrides(case)}
    touched = {k: v for k, v in {**case["args"], **over}.items() if isinstance(v, np.ndarray)}
    before = {k: raw(v).copy() for k, v in touched.items()}
    with pytest.raises(error) as exc:
        run(case, **over)
    assert str(exc.value).strip(), "the error says what is wrong"
    for k, v in touched.items():
        assert_same_bytes(v, before[k], f"{k} after a rejected call")


# ---------------------------------------------------------------------- threads
@pytest.mark.parametrize("quant_mode", ["per_token_quant_symm", "per_tensor_quant_asymm"])
def test_one_and_two_numba_threads_identical(rng, monkeypatch, quant_mode):
    """1 thread (serial row passes) vs 2 threads with every row pass split (parallel twins)."""
    import ascend_emu.emu.kernels as kernels

    monkeypatch.setattr(kernels, "ELEMENTS_PER_PART", 1)  # split even one token's work
    case = make_case(rng, "bfloat16", "int8_nzcache", quant_mode)
    saved = numba.get_num_threads()
    try:
        results = []
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            results.append([np.array(a, copy=True) for a in run(case)])
    finally:
        numba.set_num_threads(saved)
    for a, b in zip(*results, strict=True):
        assert_same_bytes(a, b, "1 vs 2 threads")


@pytest.mark.parametrize("quant_mode", ["per_token_quant_symm", "per_tensor_quant_asymm"])
def test_int8_engine_does_not_change_results(quant_mode):
    """Every int8 engine of ``emu.matmul.matmul_int8`` (float64 BLAS, fp32 K-chunks, oneDNN with
    torch) gives MlaPreprocess the same bytes (wdqkv and wuq read as ``[N, K]``)."""
    from ascend_emu.emu import matmul

    engines = [e for e in matmul.INT8_ENGINES if e != "onednn" or importlib.util.find_spec("torch")]
    results = []
    for engine in engines:
        case = make_case(np.random.default_rng(7), "bfloat16", "int8_nzcache", quant_mode)
        before = matmul.set_int8_engine(engine)
        try:
            results.append([np.array(a, copy=True) for a in run(case)])
        finally:
            matmul.set_int8_engine(before)
    for engine, got in zip(engines[1:], results[1:], strict=True):
        for a, b in zip(results[0], got, strict=True):
            assert_same_bytes(b, a, f"{engine} vs float64 int8 engine")


# ---------------------------------------------------------------------- torch_npu drop-in
def test_torch_atb_out_form_updates_tensors_in_place(rng):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu._convert import to_numpy, to_torch

    case = make_case(rng, "bfloat16", "nzcache", "per_tensor_quant_asymm")
    expected = [np.array(a, copy=True) for a in run(case)]
    tens = {k: (torch_npu.npu_format_cast(to_torch(np.asarray(v)), 29) if k in ("wdqkv", "wuq") else to_torch(v))
            for k, v in {**case["args"], **case["kwargs"]}.items() if isinstance(v, np.ndarray)}
    names = list(case["args"])
    q_out0 = torch.zeros((T, N, 512), dtype=torch.bfloat16)
    q_out1 = torch.zeros((T, N, 64), dtype=torch.bfloat16)
    kv, kr = tens["kv_cache"], tens["kv_cache_rope"]
    got = torch_npu.atb.npu_mla_preprocess(
        *[tens[k] for k in names], **{k: tens[k] for k in tens if k not in names},
        cache_mode="nzcache", quant_mode="per_tensor_quant_asymm",
        q_out0=q_out0, kv_cache_out0=kv, q_out1=q_out1, kv_cache_out1=kr)
    assert got[0] is q_out0 and got[1] is kv and got[2] is q_out1 and got[3] is kr
    for t, e in zip(got, expected, strict=True):
        assert_same_bytes(to_numpy(t), e, "torch out= form == numpy op")


def test_no_warning_for_distinct_slots(rng):
    case = make_case(rng, "bfloat16", "krope_ctkv", "per_token_quant_symm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(case)
