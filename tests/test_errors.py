"""What a user's mistakes get back: every rejected call names the argument, the expectation and a
summary of the value (never a whole tensor), and leaves caches and out= arrays byte-identical.

Covers the hardware-rejected modes (``npu_mla_prolog_v3`` (2, 3, 1), ``npu_mla_preprocess``
'kvcache'), message quality (tensor summaries, missing scales, dtype vs mode, transposed weights),
inputs that used to pass and give wrong results (non-native byte order, overlapping out= arrays,
floats that overflow fp32, ``npu_format_cast`` arguments, oversized ``actual_seq_len``), and the
one-signature rule for what reaches a Numba kernel.
"""

from __future__ import annotations

import importlib

import numba
import numpy as np
import pytest

import ascend_emu.errors
from ascend_emu import ops
from ascend_emu.errors import DTypeError, ModeError, ShapeError, describe
from tests.helpers import BF16, assert_same_bytes, poisoned, raw

#: The longest message a rejected call may produce: one line; a tensor is summarised in well under
#: 200 characters, the rest is the expectation (the longest, a rejected mode combination with its
#: evidence and the legal list, is about 1,050).
MAX_MESSAGE_CHARS = 1200


def _bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape).astype(np.float32) * scale).astype(BF16)


def assert_rejected(call, arrays, error, match):
    """``call()`` raises ``error`` matching ``match`` with a short one-line message, and every
    array in ``arrays`` keeps its bytes."""
    before = [raw(a).copy() for a in arrays]
    with pytest.raises(error, match=match) as exc:
        call()
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) <= MAX_MESSAGE_CHARS, msg
    for a, b in zip(arrays, before, strict=True):
        assert_same_bytes(a, b, "array after a rejected call")
    return msg


# ---------------------------------------------------------------------- npu_kv_rmsnorm_rope_cache
def kv_case(rng, *, quant=False, b=2):
    """Valid PA-mode arguments: kv ``[B, 1, 1, 576]``, caches of 2 blocks."""
    bs = 32 if quant else 16
    cache_dt = np.int8 if quant else BF16
    args = dict(kv=_bf16(rng, (b, 1, 1, 576)), gamma=_bf16(rng, (512,)), cos=_bf16(rng, (b, 1, 1, 64)),
                sin=_bf16(rng, (b, 1, 1, 64)), index=np.array([3, bs + 1, 5, 7][:b], np.int64),
                k_cache=poisoned((2, bs, 1, 64), cache_dt), ckv_cache=poisoned((2, bs, 1, 512), cache_dt))
    kw = dict(cache_mode="PA")
    if quant:
        kw.update(k_rope_scale=np.full(64, 20.0, np.float32), c_kv_scale=np.full(512, 30.0, np.float32))
    return args, kw


def kv_call(args, kw):
    return ops.npu_kv_rmsnorm_rope_cache(*args.values(), **kw)


def test_message_summarises_a_tensor_argument(rng):
    """A tensor where a float goes: shape, dtype and a few values, not the tensor's repr."""
    args, kw = kv_case(rng)
    big = np.arange(4 * 2 * 576, dtype=np.float32).reshape(4, 2, 576)
    msg = assert_rejected(lambda: kv_call(args, {**kw, "epsilon": big}), [args["k_cache"], args["ckv_cache"]],
                          DTypeError, r"epsilon: expected a float .*got a \[4, 2, 576\] float32 array "
                                      r"\(0\.0, 1\.0, 2\.0, 3\.0, \.\.\.\)")
    assert "4607" not in msg  # the last value is not shown
    msg = assert_rejected(lambda: kv_call(args, {**kw, "k_rope_offset": big}), [args["k_cache"]], ModeError,
                          r"k_rope_offset: expected None .*got a \[4, 2, 576\] float32 array")


def test_torch_message_summarises_an_unsupported_tensor_argument(rng):
    """A torch tensor where the drop-in wants None (an offset): summarised, not printed whole."""
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.torch_npu._convert import to_torch

    args, kw = kv_case(rng)
    t = {k: to_torch(v) for k, v in args.items()}
    off = torch.randn(4, 1, 2, 576)
    assert_rejected(lambda: torch_npu.npu_kv_rmsnorm_rope_cache(*t.values(), k_rope_offset=off, **kw),
                    [args["k_cache"]], ModeError, r"k_rope_offset: expected None .*got a \[4, 1, 2, 576\] float32 "
                                                  r"(tensor|array) \(")


#: A [4, 1, 2, 576] array (4,608 values: numpy prints dozens of lines) where a scalar goes.
BIG = np.arange(4 * 2 * 576, dtype=np.float32).reshape(4, 1, 2, 576)


def _assert_summarised(call, arrays):
    before = [raw(a).copy() for a in arrays]
    with pytest.raises(ascend_emu.errors.AscendEmuError) as exc:
        call()
    msg = str(exc.value)
    assert "[4, 1, 2, 576] float32 array (0.0, 1.0, 2.0, 3.0, ...)" in msg, msg
    assert "array(" not in msg and "\n" not in msg and len(msg) <= MAX_MESSAGE_CHARS, msg
    for a, b in zip(arrays, before, strict=True):
        assert_same_bytes(a, b, "array after a rejected call")


@pytest.mark.parametrize("name", ["cache_mode", "is_output_kv", "epsilon", "k_rope_offset", "c_kv_offset"])
def test_kv_rmsnorm_scalar_arguments_given_a_tensor(rng, name):
    args, kw = kv_case(rng)
    _assert_summarised(lambda: kv_call(args, {**kw, name: BIG}), [args["k_cache"], args["ckv_cache"]])


@pytest.mark.parametrize("name", ["cache_mode", "quant_mode", "ctkv_scale", "bias0"])
def test_mla_preprocess_scalar_arguments_given_a_tensor(rng, name):
    args, _ = preprocess_case(rng)
    _assert_summarised(lambda: preprocess_call(args, **{name: BIG}), [args["kv_cache"], args["kv_cache_rope"]])


def test_describe_never_copies_or_prints_a_whole_array():
    huge = np.broadcast_to(np.float32(1.5), (1 << 40,))  # a 4 TiB view
    assert describe(huge) == "a [1099511627776] float32 array (1.5, 1.5, 1.5, 1.5, ...)"
    assert describe(np.zeros((0, 3), np.int8)) == "a [0, 3] int8 array"
    assert describe(None) == "None" and describe("PA") == "'PA'" and describe(np.float32(2)).endswith("2.0)")
    assert len(describe("x" * 10000)) <= ascend_emu.errors.MAX_VALUE_CHARS


def test_int8_caches_without_scales_name_the_missing_scales(rng):
    args, kw = kv_case(rng, quant=True)
    kw = {k: v for k, v in kw.items() if not k.endswith("_scale")}
    assert_rejected(lambda: kv_call(args, kw), [args["k_cache"], args["ckv_cache"]], ModeError,
                    r"k_rope_scale, c_kv_scale: expected fp32 multiplier tensors \(int8 k_cache and ckv_cache.*"
                    r"got None")


@pytest.mark.parametrize("name, dtype", [("kv", ">f2"), ("index", ">i8"), ("k_cache", ">f2")])
def test_non_native_byte_order_rejected(rng, name, dtype):
    """'>f2' / '>i8' used to pass the dtype checks (they compare names) and be read as native."""
    args, kw = kv_case(rng)
    args["kv"] = args["kv"].astype(np.float16)
    args["gamma"], args["cos"], args["sin"] = (args[k].astype(np.float16) for k in ("gamma", "cos", "sin"))
    args["k_cache"] = poisoned(args["k_cache"].shape, np.float16)
    args["ckv_cache"] = poisoned(args["ckv_cache"].shape, np.float16)
    args[name] = args[name].astype(dtype)
    assert_rejected(lambda: kv_call(args, kw), [args["k_cache"], args["ckv_cache"]], DTypeError,
                    rf"{name}: expected native byte order .*got dtype '{dtype}'")


@pytest.mark.parametrize("value", [1e40, 3.5e38, float("inf"), float("nan"), 10**39, 10**400, np.float64(-1e39)])
def test_epsilon_overflowing_fp32_rejected(rng, value):
    """1e40 passed the old float64 finiteness check and became inf in fp32."""
    args, kw = kv_case(rng)
    assert_rejected(lambda: kv_call(args, {**kw, "epsilon": value}), [args["k_cache"], args["ckv_cache"]],
                    DTypeError, r"epsilon: expected a float finite in fp32")


#: The emu backend's op modules (``ascend_emu.emu`` re-exports functions of the same names).
emu_kv = importlib.import_module("ascend_emu.emu.kv_rmsnorm_rope_cache")
emu_prolog = importlib.import_module("ascend_emu.emu.mla_prolog")
emu_kernels = importlib.import_module("ascend_emu.emu.kernels")


def _dispatchers(*modules):
    return [f for m in modules for f in vars(m).values() if isinstance(f, numba.core.registry.CPUDispatcher)]


def _signature_count(*modules) -> int:
    return sum(len(f.signatures) for f in _dispatchers(*modules))


@pytest.mark.parametrize("quant", [False, True])
def test_read_only_and_strided_inputs_reuse_the_compiled_kernel(rng, quant):
    """The contract hands kernels plain C-contiguous writable arrays: a read-only or strided input
    gives the same bytes and compiles no new specialisation."""
    args, kw = kv_case(rng, quant=quant)

    def run(**over):
        a = {**args, "k_cache": args["k_cache"].copy(), "ckv_cache": args["ckv_cache"].copy(), **over}
        out = ops.npu_kv_rmsnorm_rope_cache(*a.values(), **{**kw, "is_output_kv": True})
        return [np.array(o, copy=True) for o in out]

    base = run()
    count = _signature_count(emu_kv, emu_kernels)
    assert count > 0
    read_only = {k: args[k].copy() for k in ("kv", "cos", "sin", "gamma")}
    for a in read_only.values():
        a.flags.writeable = False
    wide = np.zeros(args["kv"].shape[:-1] + (2 * 576,), BF16)
    wide[..., ::2] = args["kv"]
    over = [read_only, {"kv": wide[..., ::2]}]
    if quant:
        scales = {k: np.array(kw[k]) for k in ("k_rope_scale", "c_kv_scale")}
        for a in scales.values():
            a.flags.writeable = False
        kw = {**kw, **scales}
    for o in over:
        for got, want in zip(run(**o), base, strict=True):
            assert_same_bytes(got, want, "read-only / strided input")
    assert _signature_count(emu_kv, emu_kernels) == count, "a new Numba specialisation was compiled"


# ---------------------------------------------------------------------- npu_format_cast
@pytest.mark.parametrize("x, acl_format, error, match", [
    (1.5, 29, DTypeError, r"x: expected an array .*got 1\.5"),
    (np.float32(3), 29, DTypeError, r"x: expected an array"),
    (np.zeros((16, 16), np.float32), 2.0, ModeError, r"acl_format: expected the int 29 .*got 2\.0"),
    (np.zeros((16, 16), np.float32), "29", ModeError, r"acl_format: expected the int 29 .*got '29'"),
    (np.zeros((16, 16), np.float32), None, ModeError, r"acl_format: expected the int 29 .*got None"),
    (np.zeros((16, 16), np.float32), True, ModeError, r"acl_format: expected the int 29"),
    (np.zeros((16, 16), np.float32), 3, ModeError, r"acl_format: expected the int 29"),
    (np.broadcast_to(np.zeros((1, 48), np.float32), (1 << 31, 48)), 29, ShapeError,
     r"x: expected at most 16 GiB to cast .*got a \[2147483648, 48\] float32 array .*384\.0 GiB"),
    (np.zeros((16, 16), ">f4"), 29, DTypeError, r"x: expected native byte order"),
])
def test_format_cast_rejects(x, acl_format, error, match):
    with pytest.raises(error, match=match):
        ops.npu_format_cast(x, acl_format)


def test_format_cast_accepts_numpy_ints():
    w = np.arange(256, dtype=np.float32).reshape(16, 16)
    assert ops.get_npu_format(ops.npu_format_cast(w, np.int64(29))) == 29
    assert ops.get_npu_format(ops.npu_format_cast(w, 2)) == 2


def test_torch_format_cast_rejects_a_float_format():
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    with pytest.raises(ModeError, match=r"acl_format: expected the int 29 .*got 29\.0"):
        torch_npu.npu_format_cast(torch.zeros(16, 16), 29.0)


# ---------------------------------------------------------------------- npu_mla_prolog_v3
HE, HCQ = 7168, 1536


@pytest.fixture(scope="module")
def prolog():
    """Weights of a non-quant and a partial-quant v3 call with N = 1 (shared, never written)."""
    rng = np.random.default_rng(7)
    nd = dict(weight_dq=_bf16(rng, (HE, HCQ), HE ** -0.5), weight_uq_qr=_bf16(rng, (HCQ, 192), HCQ ** -0.5),
              weight_dkv_kr=_bf16(rng, (HE, 576), HE ** -0.5))
    return dict(
        nd=nd, nz={k: ops.npu_format_cast(v, 29) for k, v in nd.items()},
        weight_uq_qr_int8=ops.npu_format_cast(rng.integers(-127, 128, (HCQ, 192), dtype=np.int8), 29),
        dequant_scale_w_uq_qr=np.full((1, 192), 0.01, np.float32),
        weight_uk=_bf16(rng, (1, 128, 512), 0.1), gamma_cq=_bf16(rng, (HCQ,)), gamma_ckv=_bf16(rng, (512,)))


def prolog_args(p, rng, t=2, **over):
    """Positional and keyword arguments of a valid non-quant PA_BSND v3 call."""
    args = dict(token_x=_bf16(rng, (t, HE)), weight_dq=p["nz"]["weight_dq"], weight_uq_qr=p["nz"]["weight_uq_qr"],
                weight_uk=p["weight_uk"], weight_dkv_kr=p["nz"]["weight_dkv_kr"], rmsnorm_gamma_cq=p["gamma_cq"],
                rmsnorm_gamma_ckv=p["gamma_ckv"], rope_sin=_bf16(rng, (t, 64)), rope_cos=_bf16(rng, (t, 64)),
                kv_cache=poisoned((2, 16, 1, 512), BF16), kr_cache=poisoned((2, 16, 1, 64), BF16))
    kw = dict(cache_index=np.arange(t, dtype=np.int64) * 3)
    for k, v in over.items():
        (args if k in args else kw)[k] = v
    return args, kw


def prolog_call(args, kw):
    return ops.npu_mla_prolog_v3(*args.values(), **kw)


@pytest.mark.parametrize("name", ["cache_mode", "query_norm_flag", "weight_quant_mode", "ckvkr_repo_mode",
                                  "tile_size", "rmsnorm_epsilon_cq", "qc_qr_scale", "token_x_dtype",
                                  "quant_scale_ckr"])
def test_mla_prolog_scalar_arguments_given_a_tensor(prolog, rng, name):
    args, kw = prolog_args(prolog, rng, **{name: BIG})
    _assert_summarised(lambda: prolog_call(args, kw), [args["kv_cache"], args["kr_cache"]])


def test_mla_prolog_v3_231_rejected_with_the_evidence(prolog, rng):
    """The seed's full-quant per-tile row prints query_quant_mode=1; A2 / A3 rejects it."""
    args, kw = prolog_args(prolog, rng, weight_quant_mode=2, kv_cache_quant_mode=3, query_quant_mode=1,
                           ckvkr_repo_mode=1, quant_scale_repo_mode=1)
    msg = assert_rejected(lambda: prolog_call(args, kw), [args["kv_cache"], args["kr_cache"]], ModeError,
                          r"\(weight_quant_mode=2, kv_cache_quant_mode=3, query_quant_mode=1\) is not a legal mode")
    assert "_meta_registrations.py" in msg and "mla_prolog_tiling_check.cpp" in msg and "(2, 3, 0)" in msg
    assert not hasattr(ascend_emu.errors, "HardwareDivergenceWarning")


def test_bf16_weight_in_partial_quant_names_the_weight_and_mode(prolog, rng):
    """No dequant scale and a bf16 weight_uq_qr with weight_quant_mode=1: the weight's dtype is
    the mistake, not the missing scale."""
    args, kw = prolog_args(prolog, rng, weight_quant_mode=1)
    assert_rejected(lambda: prolog_call(args, kw), [args["kv_cache"], args["kr_cache"]], DTypeError,
                    r"weight_uq_qr: expected dtype int8 with weight_quant_mode=1, .*partial quant.*got bfloat16")


@pytest.mark.parametrize("name", ["weight_dq", "weight_uq_qr", "weight_dkv_kr", "weight_uk"])
def test_transposed_weight_gets_a_hint(prolog, rng, name):
    nd = prolog["nd"].get(name, prolog["weight_uk"])
    flipped = np.ascontiguousarray(np.swapaxes(nd, -1, -2))
    w = flipped if name == "weight_uk" else ops.npu_format_cast(flipped, 29)
    args, kw = prolog_args(prolog, rng, **{name: w})
    assert_rejected(lambda: prolog_call(args, kw), [args["kv_cache"], args["kr_cache"]], ShapeError,
                    rf"{name}: expected .*it looks transposed")


@pytest.mark.parametrize("name", ["rmsnorm_epsilon_cq", "rmsnorm_epsilon_ckv", "qc_qr_scale", "kc_scale"])
@pytest.mark.parametrize("value", [1e40, 3.5e38])
def test_prolog_floats_overflowing_fp32_rejected(prolog, rng, name, value):
    args, kw = prolog_args(prolog, rng, **{name: value})
    assert_rejected(lambda: prolog_call(args, kw), [args["kv_cache"], args["kr_cache"]], DTypeError,
                    rf"{name}: expected a float finite in fp32")


@pytest.mark.parametrize("alpha, error", [(np.array([1e40]), DTypeError),
                                          (np.full(1, np.inf, np.float32), ModeError)])  # fp32(1e40)
def test_clip_alpha_overflowing_fp32_rejected(prolog, rng, alpha, error):
    """k_nope_clip_alpha is an fp32 tensor: 1e40 is either float64 (dtype) or inf (value)."""
    args, kw = prolog_args(prolog, rng, t=2, weight_quant_mode=1, kv_cache_quant_mode=3, ckvkr_repo_mode=1,
                           quant_scale_repo_mode=1, weight_uq_qr=prolog["weight_uq_qr_int8"],
                           dequant_scale_w_uq_qr=prolog["dequant_scale_w_uq_qr"], k_nope_clip_alpha=alpha,
                           kv_cache=poisoned((2, 16, 1, 656), np.int8), kr_cache=np.zeros((0,), BF16))
    assert_rejected(lambda: prolog_call(args, kw), [args["kv_cache"]], error, "k_nope_clip_alpha")


def test_huge_actual_seq_len_rejected_before_any_copy(prolog, rng):
    """A broadcast view of 2**34 int32 zeros: its length is checked before the int64 conversion
    (16 GiB before the fix would have been allocated first)."""
    view = np.broadcast_to(np.int32(0), (1 << 34,))
    args, kw = prolog_args(prolog, rng, cache_mode="PA_BLK_BSND", actual_seq_len=view,
                           cache_index=np.zeros(1, np.int64))
    assert_rejected(lambda: prolog_call(args, kw), [args["kv_cache"], args["kr_cache"]], ShapeError,
                    r"B \(actual_seq_len\.shape\[0\]\): expected at most 65536, got 17179869184")


def test_read_only_scales_reuse_the_compiled_kernels(prolog, rng):
    args, kw = prolog_args(prolog, rng, weight_quant_mode=1, weight_uq_qr=prolog["weight_uq_qr_int8"],
                           dequant_scale_w_uq_qr=prolog["dequant_scale_w_uq_qr"])

    def run(**over):
        a = {**args, "kv_cache": args["kv_cache"].copy(), "kr_cache": args["kr_cache"].copy()}
        out = ops.npu_mla_prolog_v3(*a.values(), **{**kw, **over})
        return [np.array(o, copy=True) for o in out] + [a["kv_cache"], a["kr_cache"]]

    base = run()
    count = _signature_count(emu_prolog, emu_kernels)
    assert count > 0
    scale = np.array(prolog["dequant_scale_w_uq_qr"])
    scale.flags.writeable = False
    wide = np.zeros((1, 2 * 192), np.float32)
    wide[:, ::2] = prolog["dequant_scale_w_uq_qr"]
    for s in (scale, wide[:, ::2]):
        for got, want in zip(run(dequant_scale_w_uq_qr=s), base, strict=True):
            assert_same_bytes(got, want, "read-only / strided scale")
    assert _signature_count(emu_prolog, emu_kernels) == count, "a new Numba specialisation was compiled"


# ---------------------------------------------------------------------- npu_mla_preprocess
T_PRE, N_PRE, HIDDEN_PRE = 2, 1, 2048


def preprocess_case(rng):
    """Valid bf16 'krope_ctkv' / per-token arguments, caches of 2 blocks of 128, out= arrays."""
    args = dict(
        input=_bf16(rng, (T_PRE, HIDDEN_PRE)), gamma0=_bf16(rng, (HIDDEN_PRE,)), beta0=_bf16(rng, (HIDDEN_PRE,)),
        wdqkv=ops.npu_format_cast(rng.integers(-8, 8, (2112, HIDDEN_PRE), dtype=np.int8), 29),
        descale0=np.full(2112, 1e-3, np.float32), gamma1=_bf16(rng, (1536,)), beta1=_bf16(rng, (1536,)),
        wuq=ops.npu_format_cast(rng.integers(-8, 8, (N_PRE * 192, 1536), dtype=np.int8), 29),
        descale1=np.full(N_PRE * 192, 1e-3, np.float32), gamma2=_bf16(rng, (512,)), cos=_bf16(rng, (T_PRE, 64)),
        sin=_bf16(rng, (T_PRE, 64)), wuk=_bf16(rng, (N_PRE, 128, 512), 0.1),
        kv_cache=poisoned((2, 128, 1, 512), BF16), kv_cache_rope=poisoned((2, 128, 1, 64), BF16),
        slotmapping=np.array([1, 130], np.int32))
    outs = dict(q_out0=poisoned((T_PRE, N_PRE, 512), BF16), kv_cache_out0=args["kv_cache"],
                q_out1=poisoned((T_PRE, N_PRE, 64), BF16), kv_cache_out1=args["kv_cache_rope"])
    return args, outs


def preprocess_call(args, **kw):
    return ops.npu_mla_preprocess(*args.values(), **kw)


def test_mla_preprocess_kvcache_rejected_with_the_evidence(rng):
    args, _ = preprocess_case(rng)
    args["kv_cache"] = poisoned((2, 128, 1, 576), BF16)
    args["kv_cache_rope"] = None
    msg = assert_rejected(lambda: preprocess_call(args, cache_mode="kvcache"), [args["kv_cache"]], ModeError,
                          r"cache_mode: expected one of \['krope_ctkv', 'int8_nzcache', 'nzcache'\] or None "
                          r"\(torch_npu does not support cache_mode='kvcache'")
    assert "cache_mode_map" in msg and "_atb_meta_registrations.py" in msg


def test_mla_preprocess_valid_out_form_runs(rng):
    """The base case of the overlap tests is valid."""
    args, outs = preprocess_case(rng)
    got = preprocess_call(args, **outs)
    assert all(g is o for g, o in zip(got, outs.values(), strict=True))


def _alias(base: np.ndarray, shape, dtype=BF16) -> np.ndarray:
    """An array of ``shape`` over the first bytes of ``base``."""
    return raw(base)[:int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


@pytest.mark.parametrize("name, target, match", [
    ("q_out0", "kv_cache_out0", "q_out0: expected memory separate from kv_cache_out0"),
    ("q_out0", "kv_cache_out1", "q_out0: expected memory separate from kv_cache_out1"),
    ("q_out1", "kv_cache_out0", "q_out1: expected memory separate from kv_cache_out0"),
    ("q_out1", "kv_cache_out1", "q_out1: expected memory separate from kv_cache_out1"),
    ("q_out1", "q_out0", "q_out1: expected memory separate from q_out0"),
])
def test_mla_preprocess_out_arrays_must_not_overlap(rng, name, target, match):
    """The cache write used to corrupt a returned query that shared its memory."""
    args, outs = preprocess_case(rng)
    outs[name] = _alias(outs[target], outs[name].shape)
    arrays = [a for a in {id(a): a for a in outs.values()}.values()]
    assert_rejected(lambda: preprocess_call(args, **outs), arrays, ShapeError, match)


def test_mla_preprocess_transposed_weight_gets_a_hint(rng):
    args, _ = preprocess_case(rng)
    args["wdqkv"] = ops.npu_format_cast(np.ascontiguousarray(np.asarray(args["wdqkv"]).T), 29)
    assert_rejected(lambda: preprocess_call(args), [args["kv_cache"], args["kv_cache_rope"]], ShapeError,
                    r"wdqkv: expected the logical shape \[2112, 2048\] .*it looks transposed")


def test_mla_preprocess_unread_argument_rejected_with_a_summary(rng):
    args, _ = preprocess_case(rng)
    scale = np.ones(3, BF16)
    assert_rejected(lambda: preprocess_call(args, ctkv_scale=scale), [args["kv_cache"]], ModeError,
                    r"ctkv_scale: expected None \(cache_mode='krope_ctkv'; the kernel does not read it\), "
                    r"got a \[3\] bfloat16 array \(1\.0, 1\.0, 1\.0\)")
