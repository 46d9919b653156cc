"""The torch_npu drop-in: torch patches, torch.npu namespace, NZ tagging, the zero-copy bridge and
the registered ops (in-place caches visible in the caller's tensors)."""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ascend_emu.ops as ops  # noqa: E402
import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.errors import DTypeError, ModeError  # noqa: E402
from ascend_emu.layouts import NZArray  # noqa: E402
from ascend_emu.torch_npu._convert import call_op, to_numpy, to_torch  # noqa: E402
from tests.helpers import POISON_BYTE, assert_same_bytes, poisoned  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64]


def _bits(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes, flat uint8 (a copy), computed with torch only."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().copy()


def _poisoned_tensor(shape, dtype) -> torch.Tensor:
    return torch.full((int(np.prod(shape)) * dtype.itemsize,), POISON_BYTE, dtype=torch.uint8).view(dtype).reshape(shape)


# ------------------------------------------------------------------------------ torch patches
def test_npu_copies_host_tensors_and_cpu_copies_back():
    """Host and device memory are separate, as on hardware: ``.npu()`` of a host tensor and
    ``.cpu()`` of an NPU tensor are copies; ``.npu()`` of an NPU tensor is the tensor itself."""
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for dev in ((), (0,), ("npu:0",)):
        d = t.npu(*dev)
        assert d is not t and d.data_ptr() != t.data_ptr() and torch.equal(d.cpu(), t) and d.device.type == "npu"
        assert d.npu() is d
    d[0, 0] = 100.0
    assert t[0, 0].item() == 0.0  # the host tensor does not see device writes
    h = d.cpu()
    assert h.data_ptr() != d.data_ptr() and torch.equal(h, d.cpu()) and h.device.type == "cpu"
    d[0, 1] = 200.0
    assert h[0, 1].item() == 1.0  # nor does a host copy taken before them
    assert t.cpu() is t  # torch's own behaviour for host tensors
    assert h.npu() is not h  # a .cpu() copy is a host tensor again
    transposed = torch.randn(4, 6).T
    assert transposed.npu().stride() == transposed.stride()  # memory format preserved, as .to() does
    with pytest.raises(ValueError, match="index in"):
        t.npu(1)


def test_module_npu_moves_parameters_in_place():
    m = torch.nn.Linear(2, 2)
    weight = m.weight
    assert m.npu() is m and m.weight is weight
    assert m.weight.npu() is m.weight and m.bias.npu() is m.bias


def test_torch_npu_namespace():
    assert torch.npu is torch_npu.npu
    assert sys.modules["torch.npu"] is torch_npu.npu
    assert torch.npu.is_available() is True
    assert torch.npu.device_count() == 1
    torch.npu.set_device(0)
    torch.npu.set_device("npu:0")
    assert torch.npu.current_device() == 0
    assert torch.npu.synchronize() is None
    with pytest.raises(ValueError, match="npu:<index>"):
        torch.npu.set_device("cuda:0")
    with pytest.raises(ValueError):
        torch.npu.set_device(1)
    old = torch.npu.config.allow_internal_format
    try:
        torch.npu.config.allow_internal_format = True
        assert torch_npu.npu.config.allow_internal_format is True
    finally:
        torch.npu.config.allow_internal_format = old


def test_events_time_host_wall_clock():
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record()
    end.record()
    assert end.elapsed_time(start) <= 0.0 <= start.elapsed_time(end)
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.npu.Event().elapsed_time(end)


def test_install_makes_import_torch_npu_resolve_here(monkeypatch):
    for key in ("torch_npu", "torch_npu.npu", "torch_npu.atb"):
        monkeypatch.setitem(sys.modules, key, None)
    torch_npu.install()
    import torch_npu as imported
    from torch_npu.npu import is_available

    assert imported is torch_npu
    assert is_available is torch_npu.npu.is_available
    assert sys.modules["torch_npu.atb"] is torch_npu.atb


def test_version_names_the_emulator():
    """The emulated torch_npu release (the schemas' wheel, torch-npu 2.14.0), not torch's version."""
    assert torch_npu.__version__.startswith("2.14.0+")
    assert "ascend_emu" in torch_npu.__version__


# ------------------------------------------------------------------------------ npu_format_cast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int8])
def test_format_cast_29_tags_and_keeps_nd_values(dtype):
    w = (torch.randn(40, 70) * 50).to(dtype)  # [M, N], neither a multiple of 16
    w_nz = torch_npu.npu_format_cast(w.npu(), 29)
    assert torch_npu.get_npu_format(w) == 2
    assert torch_npu.get_npu_format(w_nz) == 29
    assert w_nz.npu() is w_nz  # already on the NPU: still tagged
    assert torch_npu.get_npu_format(w_nz.cpu()) == 2  # the host copy is ND, as torch_npu's .cpu()
    assert w_nz.shape == w.shape and w_nz.dtype == w.dtype
    assert torch.equal(w_nz.cpu(), w)  # logical ND values visible, like torch_npu's .cpu()
    host_nz = torch_npu.npu_format_cast(w, 29)  # an all-CPU call: tagged too, on the host
    assert torch_npu.get_npu_format(host_nz) == 29 and host_nz.device.type == "cpu"
    assert w_nz.data_ptr() != w.data_ptr()  # a new tensor
    a = to_numpy(w_nz)
    assert isinstance(a, NZArray) and a.ctypes.data == w_nz.data_ptr()
    assert to_numpy(w_nz) is a  # the same NZArray on every call


def test_format_cast_2_gives_untagged_copy():
    w_nz = torch_npu.npu_format_cast(torch.randn(32, 16).to(torch.bfloat16), 29)
    w_nd = torch_npu.npu_format_cast(w_nz, 2)
    assert torch_npu.get_npu_format(w_nd) == 2
    assert not isinstance(to_numpy(w_nd), NZArray)
    assert torch.equal(w_nd, w_nz) and w_nd.data_ptr() != w_nz.data_ptr()


def test_format_enum_holds_the_acl_codes():
    """``torch_npu.Format`` (callers cast with ``torch_npu.Format.FRACTAL_NZ``; msprobe's dump
    compares ``get_npu_format(t)`` with it): CANN ``acl_base.h``'s ``aclFormat`` values."""
    acl = dict(UNDEFINED=-1, NCHW=0, NHWC=1, ND=2, NC1HWC0=3, FRACTAL_Z=4, NC1HWC0_C04=12, HWCN=16, NDHWC=27,
               FRACTAL_NZ=29, NCDHW=30, NDC1HWC0=32, FRACTAL_Z_3D=33, NC=35, NCL=47)
    assert {f.name: int(f) for f in torch_npu.Format} == acl
    w_nz = torch_npu.npu_format_cast(torch.randn(32, 16).to(torch.bfloat16), torch_npu.Format.FRACTAL_NZ)
    assert torch_npu.get_npu_format(w_nz) == torch_npu.Format.FRACTAL_NZ == 29


def test_format_cast_rejects_unknown_format():
    with pytest.raises(ModeError, match="acl_format"):
        torch_npu.npu_format_cast(torch.randn(16, 16), 5)


def test_nz_weight_widening_kept_across_calls():
    from ascend_emu.emu.matmul import weight_f32

    w_nz = torch_npu.npu_format_cast(torch.randn(64, 32).to(torch.bfloat16), 29)
    first = weight_f32(to_numpy(w_nz))
    assert weight_f32(to_numpy(w_nz)) is first  # kept on the weight (within ASCEND_EMU_WEIGHT_KEEP_MIB)
    np.testing.assert_array_equal(first, w_nz.float().numpy())


# ------------------------------------------------------------------------------ to_numpy / to_torch
@pytest.mark.parametrize("dtype", DTYPES)
def test_to_numpy_is_a_zero_copy_view(dtype):
    t = (torch.randn(4, 6) * 20).to(dtype)
    a = to_numpy(t)
    assert a.shape == (4, 6) and a.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(a.astype(np.float64), t.double().numpy())
    a[1, 2] = 7
    assert t[1, 2].item() == 7


def test_to_numpy_bf16_is_ml_dtypes_bfloat16():
    t = torch.tensor([1.5, -2.25, 3.0e38], dtype=torch.bfloat16)
    a = to_numpy(t)
    assert a.dtype == BF16
    np.testing.assert_array_equal(a.view(np.uint16), t.view(torch.int16).numpy().view(np.uint16))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int8])
def test_to_numpy_non_contiguous_is_a_strided_view(dtype):
    base = (torch.randn(6, 8) * 20).to(dtype)
    for t in (base.T, base[:, ::3], base[1:5:2, 2:]):
        a = to_numpy(t)
        assert a.shape == tuple(t.shape)
        assert a.strides == tuple(s * t.element_size() for s in t.stride())
        np.testing.assert_array_equal(a.astype(np.float64), t.double().numpy())
        a[0, 0] = 5
        assert t[0, 0].item() == 5


def test_to_numpy_detaches_and_passes_none():
    t = torch.randn(3, requires_grad=True)
    a = to_numpy(t)
    assert a.ctypes.data == t.data_ptr()
    assert to_numpy(None) is None
    with pytest.raises(DTypeError, match="weights: expected a torch.Tensor"):
        to_numpy(np.zeros(3), "weights")


def test_to_torch_zero_copy_and_nzarray_untagged():
    a = np.arange(12, dtype=np.float32).astype(BF16).reshape(3, 4)
    t = to_torch(a)
    assert t.dtype == torch.bfloat16 and t.shape == (3, 4) and t.data_ptr() == a.ctypes.data
    a[0, 0] = 9
    assert t[0, 0].item() == 9
    nz = ops.npu_format_cast(a, 29)
    t_nz = to_torch(nz)
    assert torch_npu.get_npu_format(t_nz) == 2
    assert torch.equal(t_nz, t)


def test_to_torch_copies_what_torch_cannot_wrap():
    a = np.arange(10, dtype=np.float32)
    reversed_ = to_torch(a[::-1])
    np.testing.assert_array_equal(reversed_.numpy(), a[::-1])
    ro = a.copy()
    ro.flags.writeable = False
    t = to_torch(ro)
    np.testing.assert_array_equal(t.numpy(), ro)
    assert t.data_ptr() != ro.ctypes.data


# ------------------------------------------------------------------------------ call_op
def _fake_op(x, cache, *, index=None, scale=1.0, note="n"):
    """A NumPy op with the house contract: writes rows of ``cache`` in place, returns it."""
    assert isinstance(x, np.ndarray) and isinstance(cache, np.ndarray)
    if index is not None:
        cache[np.asarray(index)] = x * scale
    return x * 2, cache, None, note


def test_call_op_returns_callers_cache_object_with_update_visible():
    x = torch.arange(4, dtype=torch.float32).reshape(2, 2)  # [T, D]
    cache = torch.zeros(5, 2)  # [slots, D]
    y, cache_out, none, note = call_op(_fake_op, (x, cache), {"index": torch.tensor([3, 1]), "scale": 2.0,
                                                              "note": "s"})
    assert cache_out is cache
    assert torch.equal(cache[3], x[0] * 2) and torch.equal(cache[1], x[1] * 2)
    assert torch.equal(cache[0], torch.zeros(2))
    assert isinstance(y, torch.Tensor) and torch.equal(y, x * 2)
    assert none is None and note == "s"


# ------------------------------------------------------------------------------ op wrappers
def test_registered_op_passes_keywords_and_rejects_unsupported_arguments(monkeypatch):
    """torch_npu.npu_mla_prolog_v3 (the registered torch op) binds its arguments by the schema,
    resolves ascend_emu.ops at call time and refuses settings the op cannot honour."""
    seen = {}

    def fake_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                rope_sin, rope_cos, kv_cache, kr_cache, *, cache_index=None, cache_mode="PA_BSND", kc_scale=1.0):
        seen.update(cache_index=cache_index, cache_mode=cache_mode, kc_scale=kc_scale)
        kv_cache[0] = 7.0  # in place, into the caller's tensor
        return tuple(np.full(1, float(i), dtype=np.float32) for i in range(5))

    monkeypatch.setattr(ops, "npu_mla_prolog_v3", fake_v3)
    tensors = [torch.zeros(2) for _ in range(11)]
    outs = torch_npu.npu_mla_prolog_v3(*tensors, cache_index=torch.tensor([1]), cache_mode="PA_NZ", kc_scale=2)
    assert [o.item() for o in outs] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert all(o.device.type == "cpu" for o in outs)  # an all-CPU call's outputs stay on the host
    assert tensors[9][0].item() == 7.0
    assert seen["cache_mode"] == "PA_NZ" and seen["kc_scale"] == 2
    assert isinstance(seen["cache_index"], np.ndarray)
    torch_npu.npu_mla_prolog_v3(*tensors, tile_size=128)  # default of an argument the op lacks: dropped
    with pytest.raises(ModeError, match="tile_size"):
        torch_npu.npu_mla_prolog_v3(*tensors, tile_size=64)
    with pytest.raises(ModeError, match="token_x_dtype"):
        torch_npu.npu_mla_prolog_v3(*tensors, token_x_dtype=2)
    monkeypatch.setattr(ops, "npu_mla_prolog_v3", None)
    with pytest.raises(NotImplementedError, match="ascend_emu.ops.npu_mla_prolog_v3"):
        torch_npu.npu_mla_prolog_v3(*tensors)


def test_kv_rmsnorm_rope_cache_updates_callers_caches(rng):
    B, S, block_num, block_size = 2, 3, 2, 16
    kv = torch.from_numpy(rng.standard_normal((B, 1, S, 576), dtype=np.float32)).to(torch.bfloat16)
    gamma = torch.from_numpy(rng.uniform(0.5, 1.5, 512).astype(np.float32)).to(torch.bfloat16)
    angle = torch.from_numpy(rng.uniform(0, 6.3, (B, 1, S, 32)).astype(np.float32))
    cos, sin = (torch.cat([f(angle)] * 2, -1).to(torch.bfloat16) for f in (torch.cos, torch.sin))
    index = torch.tensor([5, 17, 2, 30, 9, 21], dtype=torch.int64)  # [B*S] slots
    k_cache = _poisoned_tensor((block_num, block_size, 1, 64), torch.bfloat16)
    ckv_cache = _poisoned_tensor((block_num, block_size, 1, 512), torch.bfloat16)
    np_k, np_ckv = poisoned(k_cache.shape, BF16), poisoned(ckv_cache.shape, BF16)
    expected = ops.npu_kv_rmsnorm_rope_cache(to_numpy(kv), to_numpy(gamma), to_numpy(cos), to_numpy(sin),
                                             to_numpy(index), np_k, np_ckv, cache_mode="PA_BNSD", is_output_kv=True)

    out = torch_npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                              cache_mode="PA_BNSD", is_output_kv=True)
    assert out[0] is k_cache and out[1] is ckv_cache
    k_rope, c_kv = out[2], out[3]
    assert k_rope.device.type == c_kv.device.type == "cpu"  # an all-CPU call's outputs stay on the host
    assert isinstance(k_rope, torch.Tensor) and k_rope.dtype == torch.bfloat16 and k_rope.shape == (B, 1, S, 64)
    assert isinstance(c_kv, torch.Tensor) and c_kv.dtype == torch.bfloat16 and c_kv.shape == (B, 1, S, 512)
    # the torch wrapper writes exactly what the NumPy op writes, into the caller's own tensors
    assert_same_bytes(_bits(k_cache), expected[0], "k_cache")
    assert_same_bytes(_bits(ckv_cache), expected[1], "ckv_cache")
    assert_same_bytes(_bits(k_rope), expected[2], "k_rope")
    # written rows hold the returned rows; every other row is still poison
    rows = k_cache.reshape(-1, 64)
    assert torch.equal(rows[index].view(torch.int16), k_rope.reshape(-1, 64).view(torch.int16))
    untouched = np.setdiff1d(np.arange(block_num * block_size), index.numpy())
    assert (_bits(rows[torch.from_numpy(untouched)]) == POISON_BYTE).all()


def test_mla_prolog_v3_outputs_and_inplace_caches(rng):
    T, He, Hcq, N, Hckv, D, Dr = 3, 7168, 1536, 1, 512, 128, 64
    block_num, block_size = 2, 16

    def bf(*shape, scale=1.0):
        return torch.from_numpy((rng.standard_normal(shape, dtype=np.float32) * scale)).to(torch.bfloat16)

    token_x = bf(T, He)
    w_dq = torch_npu.npu_format_cast(bf(He, Hcq, scale=He ** -0.5), 29)
    w_uq_qr = torch_npu.npu_format_cast(bf(Hcq, N * (D + Dr), scale=Hcq ** -0.5), 29)
    w_uk = bf(N, D, Hckv, scale=D ** -0.5)
    w_dkv_kr = torch_npu.npu_format_cast(bf(He, Hckv + Dr, scale=He ** -0.5), 29)
    gamma_cq, gamma_ckv = bf(Hcq) + 1, bf(Hckv) + 1
    sin, cos = bf(T, Dr), bf(T, Dr)
    cache_index = torch.tensor([20, 3, 31], dtype=torch.int64)  # [T]
    kv_cache = _poisoned_tensor((block_num, block_size, 1, Hckv), torch.bfloat16)
    kr_cache = _poisoned_tensor((block_num, block_size, 1, Dr), torch.bfloat16)
    args = (token_x, w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv, sin, cos)
    np_kv, np_kr = poisoned(kv_cache.shape, BF16), poisoned(kr_cache.shape, BF16)
    expected = ops.npu_mla_prolog_v3(*(to_numpy(a) for a in args), np_kv, np_kr,
                                     cache_index=to_numpy(cache_index), cache_mode="PA_NZ")

    kv_obj, kr_obj = kv_cache, kr_cache
    query, query_rope, dq_nope, q_norm, dq_norm = torch_npu.npu_mla_prolog_v3(
        *args, kv_cache, kr_cache, cache_index=cache_index, cache_mode="PA_NZ")
    assert kv_cache is kv_obj and kr_cache is kr_obj
    assert (query.dtype, tuple(query.shape)) == (torch.bfloat16, (T, N, Hckv))
    assert (query_rope.dtype, tuple(query_rope.shape)) == (torch.bfloat16, (T, N, Dr))
    assert dq_nope.dtype == torch.float32 and dq_norm.dtype == torch.float32
    assert all(isinstance(o, torch.Tensor) for o in (dq_nope, q_norm, dq_norm))
    assert_same_bytes(_bits(query), expected[0], "query")
    assert_same_bytes(_bits(query_rope), expected[1], "query_rope")
    assert_same_bytes(_bits(kv_cache), np_kv, "kv_cache")
    assert_same_bytes(_bits(kr_cache), np_kr, "kr_cache")
    assert not (_bits(kr_cache) == POISON_BYTE).all()  # the caller's tensor was written


def test_npu_cache_update_leaves_the_host_tensor(rng):
    """The op-plugin test pattern: a golden from the host cache, the op on ``cache.npu()``, then
    ``cache_npu.cpu()`` against the golden. The host cache must not see the op's writes (it would
    make that comparison compare a tensor with itself)."""
    B, S = 2, 3
    kv = torch.from_numpy(rng.standard_normal((B, 1, S, 576), dtype=np.float32)).to(torch.bfloat16)
    gamma, cos, sin = torch.ones(512, dtype=torch.bfloat16), torch.ones(B, 1, S, 64, dtype=torch.bfloat16), \
        torch.zeros(B, 1, S, 64, dtype=torch.bfloat16)
    k_cache = _poisoned_tensor((2, 16, 1, 64), torch.bfloat16)
    ckv_cache = _poisoned_tensor((2, 16, 1, 512), torch.bfloat16)
    k_npu, ckv_npu = k_cache.npu(), ckv_cache.npu()
    out = torch_npu.npu_kv_rmsnorm_rope_cache(kv.npu(), gamma.npu(), cos.npu(), sin.npu(),
                                              torch.arange(B * S).npu(), k_npu, ckv_npu, cache_mode="PA")
    assert out[0] is k_npu and out[1] is ckv_npu
    assert (_bits(k_cache) == POISON_BYTE).all() and (_bits(ckv_cache) == POISON_BYTE).all()
    assert not (_bits(k_npu.cpu()) == POISON_BYTE).all()
