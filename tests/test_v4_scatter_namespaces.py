"""The V4 row scatters and the two torch_npu ops vllm-ascend's later ``torch_binding.cpp`` also
declares, through ``torch.ops._C_ascend`` / ``torch.ops.custom`` as the frameworks call them:
bytes against tests/reference (scatters, scatter_pa_kv_cache) or the torch_npu binding on the
same data (npu_mla_prolog_v3, whose own tests hold it against tests/reference); the schemas'
defaults; fake kernels; rejected calls that leave the caches byte-identical."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError  # noqa: E402
from ascend_emu.torch_npu import namespaces  # noqa: E402
from tests.reference import paged_cache as pa_ref  # noqa: E402
from tests.reference import scatter_nd_update as ref  # noqa: E402
from tests.test_namespaces import prolog  # noqa: E402,F401  (the module-scoped bf16 MLA prolog inputs)

C = torch.ops._C_ascend
CUSTOM = torch.ops.custom


def _np(t: torch.Tensor) -> np.ndarray:
    """A tensor's bytes as a NumPy array of the same shape (bf16 through int16)."""
    t = t.detach().cpu().contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def _same(got: torch.Tensor, want, what: str):
    got = _np(got)
    want = np.ascontiguousarray(want)
    assert got.shape == want.shape, what
    assert got.tobytes() == want.tobytes(), what


def _fake(op, *args):
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        return op(*(mode.from_tensor(a) for a in args))


def test_registered():
    report = namespaces.report()
    for key in ("_C_ascend::npu_scatter_nd_update_v2", "_C_ascend::npu_scatter_nd_update_sk",
                "custom::scatter_nd_update_asc", "_C_ascend::npu_scatter_pa_kv_cache", "_C_ascend::npu_mla_prolog_v3"):
        assert report[key] == "registered", key


# ------------------------------------------------------------------------------- row scatters
@pytest.mark.parametrize("op", [C.npu_scatter_nd_update_v2, C.npu_scatter_nd_update_sk], ids=["v2", "sk"])
def test_c_ascend_scatter_as_vllm_ascend_calls_it(op):
    """dsa_kv_compress_scatter: a bf16 [nb, bs, 1, 512] cache, [n, 2] (block, offset) rows with the
    graph-capture padding [-1, bs - 1], kv [n, 1, 512]."""
    g = torch.Generator().manual_seed(3)
    cache = torch.randn(4, 16, 1, 512, generator=g).to(torch.bfloat16)
    before = _np(cache).copy()
    slots = torch.tensor([[2, 0], [2, 1], [0, 15], [-1, 15], [3, 4]], dtype=torch.int32)
    kv = torch.randn(5, 1, 512, generator=g).to(torch.bfloat16)
    assert op(cache, slots, kv) is None
    _same(cache, ref.scatter_nd_update(before, slots.numpy(), _np(kv)), "cache")
    assert _fake(op, cache, slots, kv) is None


def test_sk_on_a_page_padded_view_writes_in_place():
    """DeepSeek-V4.1's cache plane: a strided view of a larger page; only the viewed rows change."""
    g = torch.Generator().manual_seed(4)
    page = torch.randn(3, 6, 1, 64, generator=g)
    want = page.numpy().copy()
    cache = page[:, :4]  # block stride 6 rows, block_size 4
    idx = torch.tensor([[-1, -1], [1, 3], [2, 0]], dtype=torch.int64)
    upd = torch.randn(3, 1, 64, generator=g)
    C.npu_scatter_nd_update_sk(cache, idx, upd)
    want[:, :4] = ref.scatter_nd_update(want[:, :4], idx.numpy(), upd.numpy())
    _same(page, want, "page")


def test_custom_scatter_as_the_recipe_calls_it():
    """update_win_kv: the window cache viewed as [rows, D], slot_mapping.view(-1, 1)."""
    g = torch.Generator().manual_seed(5)
    win = torch.randn(2, 8, 1, 512, generator=g).to(torch.bfloat16)
    before = _np(win).reshape(16, 512).copy()
    slot_mapping = torch.tensor([9, -1, 0, 15])
    kv = torch.randn(4, 512, generator=g).to(torch.bfloat16)
    CUSTOM.scatter_nd_update_asc(win.view(-1, win.shape[-1]), slot_mapping.view(-1, 1), kv)
    _same(win.view(-1, 512), ref.scatter_nd_update(before, slot_mapping.view(-1, 1).numpy(), _np(kv)), "window")
    assert _fake(CUSTOM.scatter_nd_update_asc, win.view(-1, 512), slot_mapping.view(-1, 1), kv) is None


@pytest.mark.parametrize("call, error, match", [
    (lambda c, u: C.npu_scatter_nd_update_v2(c, torch.tensor([[1, 2], [4, 0]]), u), IndexRangeError, r"indices\[1, 0\] = 4"),
    (lambda c, u: C.npu_scatter_nd_update_sk(c, torch.tensor([[1, 16], [0, 0]]), u), IndexRangeError,
     r"indices\[0, 1\] = 16"),
    (lambda c, u: C.npu_scatter_nd_update_v2(c, torch.tensor([[1, 2], [0, 0]]), u.half()), DTypeError, "update"),
    (lambda c, u: CUSTOM.scatter_nd_update_asc(c.view(-1, 512), torch.tensor([[1], [64]]), u.view(2, 512)),
     IndexRangeError, r"indices\[1, 0\] = 64"),
])
def test_rejected_scatters_leave_the_cache_byte_identical(call, error, match):
    cache = torch.randn(4, 16, 1, 512).to(torch.bfloat16)
    before = _np(cache).copy()
    with pytest.raises(error, match=match):
        call(cache, torch.ones(2, 1, 512, dtype=torch.bfloat16))
    _same(cache, before, "cache")


# ------------------------------------------------------------------ _C_ascend.npu_scatter_pa_kv_cache
def _pa_case(seed=6):
    g = torch.Generator().manual_seed(seed)
    key, value = torch.randn(4, 2, 32, generator=g).half(), torch.randn(4, 2, 16, generator=g).half()
    slots = torch.tensor([17, -1, 0, 31], dtype=torch.int32)
    return key, value, slots


def test_c_ascend_scatter_pa_kv_cache_defaults_to_norm():
    key, value, slots = _pa_case()
    kc, vc = torch.zeros(2, 16, 2, 32).half(), torch.zeros(2, 16, 2, 16).half()
    C.npu_scatter_pa_kv_cache(key, value, kc, vc, slots)  # cache_mode left at _C_ascend's 'Norm'
    want_k, want_v = pa_ref.scatter(key.numpy(), value.numpy(), np.zeros((2, 16, 2, 32), np.float16),
                                    np.zeros((2, 16, 2, 16), np.float16), slots.numpy(), "Norm")
    _same(kc, want_k, "key_cache")
    _same(vc, want_v, "value_cache")
    # torch_npu's own default is PA_NZ: the same call there reads these Norm caches as the wrong shape
    with pytest.raises(ShapeError, match="key_cache"):
        torch_npu.npu_scatter_pa_kv_cache(key, value, torch.zeros(2, 16, 2, 32).half(),
                                          torch.zeros(2, 16, 2, 16).half(), slots)


def test_c_ascend_scatter_pa_kv_cache_pa_nz_and_scatter_mode():
    key, value, slots = _pa_case(7)
    kc, vc = torch.zeros(2, 4, 16, 16).half(), torch.zeros(2, 2, 16, 16).half()  # [nb, N*D/C0, bs, C0]
    C.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode="PA_NZ", scatter_mode="None")
    want_k, want_v = pa_ref.scatter(key.numpy(), value.numpy(), np.zeros((2, 4, 16, 16), np.float16),
                                    np.zeros((2, 2, 16, 16), np.float16), slots.numpy(), "PA_NZ")
    _same(kc, want_k, "key_cache")
    _same(vc, want_v, "value_cache")
    before = _np(kc).copy()
    with pytest.raises(ModeError, match="scatter_mode: expected the default 'None'"):
        C.npu_scatter_pa_kv_cache(key, value, kc, vc, slots, cache_mode="PA_NZ", scatter_mode="Nct")
    with pytest.raises(IndexRangeError, match=r"slot_mapping\[0\] = 64"):
        C.npu_scatter_pa_kv_cache(key, value, kc, vc, torch.tensor([64, 0, 1, 2], dtype=torch.int32),
                                  cache_mode="PA_NZ")
    _same(kc, before, "key_cache after rejected calls")
    assert _fake(lambda *a: C.npu_scatter_pa_kv_cache(*a), key, value, kc, vc, slots) is None


# ------------------------------------------------------------------------ _C_ascend.npu_mla_prolog_v3
def test_c_ascend_mla_prolog_v3_is_torch_npus_op(prolog):  # noqa: F811
    args, caches, kw = prolog
    kv_want, kr_want = caches()
    want = torch_npu.npu_mla_prolog_v3(*args, kv_want, kr_want, **kw)
    kv, kr = caches()
    got = C.npu_mla_prolog_v3(*args, kv, kr, **kw)
    assert len(got) == 5
    for g, w, what in zip(got, want, ("query", "query_rope", "dequant_scale_q_nope", "query_norm", "scale_q_norm"),
                          strict=True):
        _same(g, _np(w), what)
    _same(kv, _np(kv_want), "kv_cache (in place)")
    _same(kr, _np(kr_want), "kr_cache (in place)")
    with pytest.raises(Exception, match="token_x_dtype"):  # torch_npu's tag: not in this schema
        C.npu_mla_prolog_v3(*args, kv, kr, **kw, token_x_dtype=None)


@pytest.mark.parametrize("name", ["token_x", "kv_cache"])
def test_c_ascend_mla_prolog_v3_rejects_untagged_uint8(prolog, name):  # noqa: F811
    """uint8 data (HiFloat8 on the 950) cannot be told apart without torch_npu's *_dtype tags."""
    args, caches, kw = prolog
    kv, kr = caches()
    args = list(args)
    if name == "token_x":
        args[0] = torch.zeros(args[0].shape, dtype=torch.uint8)
    else:
        kv = torch.zeros(kv.shape, dtype=torch.uint8)
    before = _np(kv).copy(), _np(kr).copy()
    with pytest.raises(DTypeError, match=rf"{name}: expected a dtype other than uint8 .*no {name}_dtype argument"):
        C.npu_mla_prolog_v3(*args, kv, kr, **kw)
    _same(kv, before[0], "kv_cache")
    _same(kr, before[1], "kr_cache")
