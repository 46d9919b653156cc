"""Calls every entry point used to accept and then answer wrongly, write partially or reject with
an error that was not ascend_emu's; each is now rejected naming the argument, with nothing
written, or answered as the reference answers it.

- Meta tensors (the drop-in, every route): a call whose tensors are all meta runs the fake
  kernel (meta outputs of the shapes the real call returns); a call mixing meta and real
  tensors is rejected naming the meta argument (it used to return uninitialised CPU tensors,
  or leave a real cache unwritten).
- ``out=`` memory: FIA's out arrays apart from each other and from every input (the overlap rule
  of ``ops._check.check_disjoint``); a conjugated / negated out tensor is rejected before the
  other output is written.
- Sizes bounded before allocating (``ops._check.MAX_CALL_BYTES``, the bound npu_format_cast
  uses): stride-0 broadcast inputs of 2^31 rows, FIA lengths of 2^31 entries.
- Argument kinds first: FIA's ``.out`` forms, int[] lengths given as floats, ints past int64,
  a long list given for a tensor in ``torch.ops.custom`` / ``_C_ascend``, None for a tensor the
  namespace's schema requires.
- Error texts: NumPy FIA's atten_mask of another kind, npu_interleave_rope with S = 0,
  npu_gather_pa_kv_cache with a zero dim.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import AscendEmuError, DTypeError, ShapeError
from ascend_emu.ops._check import MAX_BATCH, MAX_CALL_BYTES
from tests.helpers import BF16, assert_same_bytes, poisoned, raw
from tests.test_fused_infer_attention_score import make_case

#: Rows of the broadcast inputs: 2^31, as the issue's fuzz run passed them.
HUGE = 1 << 31
A950 = "Ascend950PR_9599"


@pytest.fixture
def a950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", A950)


def _named(exc: BaseException, name: str) -> str:
    msg = str(exc)
    assert isinstance(exc, AscendEmuError) and msg.startswith(f"{name}: expected "), msg[:300]
    assert len(msg) < 500 and "\n" not in msg, msg[:600]
    return msg


# ---------------------------------------------------------------------- sizes (NumPy API)
def _broadcast(shape, dtype):
    return np.broadcast_to(np.zeros((1,) * len(shape), dtype), shape)


def test_broadcast_inputs_over_the_call_bound_are_rejected_before_allocating(a950):
    x = _broadcast((HUGE, 16), np.float16)
    with pytest.raises(ShapeError) as err:
        ops.npu_dynamic_quant(x)
    assert f"at most {MAX_CALL_BYTES >> 30} GiB" in _named(err.value, "input")
    r = _broadcast((HUGE >> 6, 8, 8, 64), np.float16)
    with pytest.raises(ShapeError) as err:
        ops.npu_rotary_mul(r, r, r)
    _named(err.value, "self")
    with pytest.raises(ShapeError) as err:
        ops.npu_dtype_cast(x, 292)
    _named(err.value, "self")
    with pytest.raises(ShapeError) as err:
        ops.npu_dynamic_mx_quant(_broadcast((HUGE, 32), np.float16), dst_type=292)
    _named(err.value, "input")


def test_a_small_broadcast_input_gives_the_contiguous_result():
    from tests.reference.dynamic_quant import dynamic_quant as dynamic_quant_ref

    row = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float16)
    y, scale = ops.npu_dynamic_quant(np.broadcast_to(row, (5, 16)))
    want_y, want_scale = dynamic_quant_ref(np.repeat(row, 5, axis=0))
    assert_same_bytes(y, want_y, "y")
    assert_same_bytes(scale, want_scale, "scale")


@pytest.mark.parametrize("name", ["actual_seq_lengths", "actual_seq_lengths_kv"])
def test_fia_lengths_are_counted_before_they_are_widened(rng, name):
    q, k, v, kw = make_case(rng, "BSND", 4, BF16)
    lengths = np.broadcast_to(np.int32(1), (HUGE,))
    with pytest.raises(ShapeError) as err:
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, **{name: lengths}))
    assert f"1 to {MAX_BATCH} lengths" in _named(err.value, name)


# ---------------------------------------------------------------------- FIA out= (NumPy API)
def _fia_out_case(rng):
    q, k, v, kw = make_case(rng, "BSND", 4, BF16, n=8)
    kw["softmax_lse_flag"] = True
    want_out, want_lse = ops.npu_fused_infer_attention_score(q, k, v, **kw)
    return q, k, v, kw, want_out, want_lse


def test_fia_out_arrays_overlapping_each_other_are_rejected_unwritten(rng):
    q, k, v, kw, want_out, want_lse = _fia_out_case(rng)
    buf = poisoned(want_out.nbytes, np.uint8)
    out = buf.view(BF16).reshape(want_out.shape)
    lse = buf[:want_lse.nbytes].view(np.float32).reshape(want_lse.shape)  # softmax_lse inside attention_out
    before = buf.copy()
    with pytest.raises(ShapeError) as err:
        ops.npu_fused_infer_attention_score(q, k, v, **kw, attention_out=out, softmax_lse=lse)
    assert "memory separate from attention_out" in _named(err.value, "softmax_lse")
    assert_same_bytes(buf, before, "the out= memory")


@pytest.mark.parametrize("inside", ["query", "block_table", "query_rope", "actual_seq_lengths_kv"])
def test_fia_inputs_inside_attention_out_are_rejected_unwritten(rng, inside):
    q, k, v, kw, want_out, want_lse = _fia_out_case(rng)
    kw["actual_seq_lengths_kv"] = np.array(kw["actual_seq_lengths_kv"], np.int32)
    args = dict(kw, query=q)
    given = args[inside]
    out = poisoned(want_out.shape, BF16)
    view = raw(out)[:given.nbytes].view(given.dtype).reshape(given.shape)
    view[...] = given  # the input, where the output will go
    args[inside] = view
    before = raw(out).copy()
    lse = poisoned(want_lse.shape, np.float32)
    query = args.pop("query")
    with pytest.raises(ShapeError) as err:
        ops.npu_fused_infer_attention_score(query, k, v, **args, attention_out=out, softmax_lse=lse)
    assert "memory separate from attention_out" in _named(err.value, inside)
    assert_same_bytes(out, before, "attention_out (holding the input)")
    assert_same_bytes(lse, poisoned(want_lse.shape, np.float32), "softmax_lse")


def test_fia_separate_out_arrays_get_the_plain_call_result(rng):
    q, k, v, kw, want_out, want_lse = _fia_out_case(rng)
    out, lse = poisoned(want_out.shape, BF16), poisoned(want_lse.shape, np.float32)
    got = ops.npu_fused_infer_attention_score(q, k, v, **kw, attention_out=out, softmax_lse=lse)
    assert got[0] is out and got[1] is lse
    assert_same_bytes(out, want_out, "attention_out")
    assert_same_bytes(lse, want_lse, "softmax_lse")


@pytest.mark.parametrize("mask", [1.5, [1, 0], "causal"], ids=["float", "list", "str"])
def test_fia_atten_mask_of_another_kind_is_named(rng, mask):
    q, k, v, kw = make_case(rng, "TND", 4, BF16, q_lens=(2, 1), kv_lens=(20, 7), sparse_mode=3)
    with pytest.raises(DTypeError) as err:
        ops.npu_fused_infer_attention_score(q, k, v, **dict(kw, atten_mask=mask))
    _named(err.value, "atten_mask")


# ---------------------------------------------------------------------- error texts (NumPy API)
@pytest.mark.parametrize("shape", [(1, 2, 0, 64), (0, 2, 3, 64), (1, 0, 3, 64)])
def test_interleave_rope_empty_dims_are_named(shape):
    x = np.zeros(shape, BF16)
    cos = np.zeros((shape[0], 1, shape[2], 64), BF16)
    with pytest.raises(ShapeError) as err:
        ops.npu_interleave_rope(x, cos, cos)
    _named(err.value, "x")


@pytest.mark.parametrize("shape", [(4, 16, 2, 0), (4, 16, 0, 8), (4, 0, 2, 8)])
def test_gather_pa_kv_cache_zero_dims_name_key_cache(shape):
    cache = np.zeros(shape, np.float16)
    rows = np.zeros((0, shape[2], shape[3]), np.float16)
    with pytest.raises(ShapeError) as err:
        ops.npu_gather_pa_kv_cache(cache, cache.copy(), np.zeros((1, 1), np.int32), np.zeros(1, np.int32),
                                   rows, rows.copy())
    _named(err.value, "key_cache")


# ---------------------------------------------------------------------- one kernel signature
def _signatures(module) -> int:
    import numba

    return sum(len(d.signatures) for d in vars(module).values() if isinstance(d, numba.core.dispatcher.Dispatcher))


@pytest.mark.parametrize("form", ["read-only", "Fortran-order"])
def test_weight_uk_of_any_memory_order_reaches_one_kernel_signature(form):
    """A read-only or Fortran-order weight_uk gives the same bytes and compiles no new
    specialisation of the weight widening (it used to add one per memory kind)."""
    from ascend_emu.emu import matmul
    from tests.test_mla_prolog import DR, HCKV, Data, make_tokens

    data = Data(np.random.default_rng(7))
    w_uq_qr, w_uk, _, _ = data.heads(2)
    x, sin, cos = make_tokens(data, (3,))

    def call(weight_uk):
        return ops.npu_mla_prolog_v3(
            token_x=x, weight_dq=data.w_dq_nz, weight_uq_qr=w_uq_qr, weight_uk=weight_uk,
            weight_dkv_kr=data.w_dkv_kr_nz, rmsnorm_gamma_cq=data.gamma_cq, rmsnorm_gamma_ckv=data.gamma_ckv,
            rope_sin=sin, rope_cos=cos, kv_cache=poisoned((2, 16, 1, HCKV), BF16),
            kr_cache=poisoned((2, 16, 1, DR), BF16), cache_index=np.array([0, 1, 2], np.int64))

    first = call(w_uk)
    compiled = _signatures(matmul)
    if form == "read-only":
        other = w_uk.copy()
        other.flags.writeable = False
    else:
        other = np.asfortranarray(w_uk)
    again = call(other)
    for a, b in zip(again, first, strict=True):
        assert_same_bytes(a, b, f"output with a {form} weight_uk")
    assert _signatures(matmul) == compiled


# ---------------------------------------------------------------------- the drop-in
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tnpu():
    import ascend_emu.torch_npu as torch_npu

    return torch_npu


def _t(x):
    from ascend_emu.torch_npu import to_torch

    return to_torch(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x


def _meta(t):
    return t.to("meta")


def test_all_meta_call_runs_the_fake_kernel_with_the_real_shapes(tnpu):
    x = torch.randn(4, 3, 16, dtype=torch.float16)
    smooth = torch.rand(16, dtype=torch.float16) + 0.5
    real = tnpu.npu_dynamic_quant(x, smooth_scales=smooth)
    for route in (tnpu.npu_dynamic_quant, torch.ops.npu.npu_dynamic_quant):
        fake = route(_meta(x), smooth_scales=_meta(smooth))
        for f, r in zip(fake, real, strict=True):
            assert f.is_meta and f.shape == r.shape and f.dtype == r.dtype


@pytest.mark.parametrize("route", ["torch_npu", "torch.ops"])
@pytest.mark.parametrize("which", ["input", "smooth_scales"])
def test_meta_beside_real_tensors_is_rejected_naming_the_meta_one(tnpu, route, which):
    x = torch.randn(4, 16, dtype=torch.float16)
    smooth = torch.rand(16, dtype=torch.float16) + 0.5
    args = {"input": x, "smooth_scales": smooth}
    args[which] = _meta(args[which])
    op = tnpu.npu_dynamic_quant if route == "torch_npu" else torch.ops.npu.npu_dynamic_quant
    with pytest.raises(DTypeError) as err:
        op(args["input"], smooth_scales=args["smooth_scales"])
    assert "meta" in _named(err.value, which)


def test_meta_cache_beside_real_inputs_is_rejected_and_the_real_cache_kept(tnpu):
    key = torch.randn(3, 2, 16, dtype=torch.float16)
    key_cache, value_cache = torch.full((4, 16, 2, 16), 7.0, dtype=torch.float16), torch.full(
        (4, 16, 2, 16), 7.0, dtype=torch.float16)
    slots = torch.tensor([5, 17, 40], dtype=torch.int32)
    with pytest.raises(DTypeError) as err:
        tnpu.npu_scatter_pa_kv_cache(key, key.clone(), _meta(key_cache), value_cache, slots, cache_mode="Norm")
    _named(err.value, "key_cache")
    assert (value_cache == 7).all()


def test_namespace_all_meta_call_gives_meta_outputs(tnpu):
    q = torch.randn(2, 1, 64, 128, dtype=torch.bfloat16)
    k = torch.randn(2, 8, 1, 128, dtype=torch.bfloat16)
    w = torch.randn(2, 1, 64, dtype=torch.bfloat16)
    real = torch.ops.custom.npu_lightning_indexer(q, k, w, sparse_count=4)
    fake = torch.ops.custom.npu_lightning_indexer(_meta(q), _meta(k), _meta(w), sparse_count=4)
    assert fake.is_meta and fake.shape == real.shape and fake.dtype == real.dtype
    with pytest.raises(DTypeError) as err:
        torch.ops._C_ascend.npu_lightning_indexer(q, _meta(k), w, sparse_count=4)
    _named(err.value, "key")


def _fia_torch_case(rng):
    q, k, v, kw = make_case(rng, "BSND", 4, BF16, n=8)
    args = dict(query_rope=_t(kw["query_rope"]), key_rope=_t(kw["key_rope"]), num_heads=8, num_key_value_heads=1,
                input_layout="BSND", scale=kw["scale"], block_table=_t(kw["block_table"]), block_size=16,
                actual_seq_lengths_kv=kw["actual_seq_lengths_kv"])
    return _t(q), _t(k), args


def test_fia_v2_out_with_a_conjugated_softmax_lse_writes_nothing(rng, tnpu):
    q, k, args = _fia_torch_case(rng)
    v2 = dict(query_rope=args["query_rope"], key_rope=args["key_rope"], num_query_heads=8, num_key_value_heads=1,
              input_layout="BSND", softmax_scale=args["scale"], block_table=args["block_table"], block_size=16,
              actual_seq_kvlen=args["actual_seq_lengths_kv"])
    out = torch.full((2, 1, 8, 512), 7.0, dtype=torch.bfloat16)
    lse = torch.zeros(4, dtype=torch.complex64).conj()
    with pytest.raises(DTypeError) as err:
        tnpu.npu_fused_infer_attention_score_v2.out(q, k, k, **v2, workspace=None, out=[out, lse])
    assert "conjugate" in _named(err.value, "softmax_lse")
    assert (out == 7).all()


def test_fia_out_in_the_drop_in_follows_the_overlap_rule(rng, tnpu):
    q, k, args = _fia_torch_case(rng)
    out = torch.full((2, 1, 8, 512), 7.0, dtype=torch.bfloat16)
    lse = out.view(-1)[:32].view(torch.float32).view(2, 8, 1, 1)
    with pytest.raises(ShapeError) as err:
        tnpu.npu_fused_infer_attention_score.out(q, k, k, **args, softmax_lse_flag=True, workspace=None,
                                                 out=[out, lse])
    _named(err.value, "softmax_lse")
    assert (out == 7).all()


@pytest.mark.parametrize("form", ["call", ".out", "torch.ops"])
@pytest.mark.parametrize("name,value,shown", [
    ("softmax_lse_flag", 2.5, "softmax_lse_flag"),
    ("actual_seq_lengths_kv", [20.0, 7.0], "actual_seq_lengths_kv[0]"),
    ("actual_seq_lengths_kv", [20, 1 << 63], "actual_seq_lengths_kv[1]"),
    ("num_heads", 1 << 63, "num_heads"),
    ("block_table", [[0, 1]], "block_table"),
])
def test_fia_argument_kinds_are_checked_on_every_form(rng, tnpu, form, name, value, shown):
    q, k, args = _fia_torch_case(rng)
    args[name] = value
    out = torch.full((2, 1, 8, 512), 7.0, dtype=torch.bfloat16)
    lse = torch.zeros(2, 8, 1, 1)
    with pytest.raises(DTypeError) as err:
        if form == "call":
            tnpu.npu_fused_infer_attention_score(q, k, k, **args)
        elif form == ".out":
            tnpu.npu_fused_infer_attention_score.out(q, k, k, **args, workspace=None, out=[out, lse])
        else:
            torch.ops.npu.npu_fused_infer_attention_score(q, k, k, **args)
    _named(err.value, shown)
    assert (out == 7).all()


@pytest.mark.parametrize("ns", ["_C_ascend", "custom"])
def test_namespace_int_past_int64_is_named(tnpu, ns):
    q = torch.zeros(1, 1, 64, 128, dtype=torch.bfloat16)
    with pytest.raises(DTypeError) as err:
        getattr(torch.ops, ns).npu_lightning_indexer(q, q, q, sparse_count=1 << 63)
    _named(err.value, "sparse_count")


@pytest.mark.parametrize("ns", ["_C_ascend", "custom"])
def test_namespace_long_list_for_a_tensor_is_rejected_at_once(tnpu, ns):
    """torch's binder converts a list element by element before it finds that a tensor was
    expected (about 1 s a million elements); the kinds are checked first."""
    q = torch.zeros(1, 1, 64, 128, dtype=torch.bfloat16)
    lengths = [1] * 3_000_000
    start = time.perf_counter()
    with pytest.raises(DTypeError) as err:
        getattr(torch.ops, ns).npu_lightning_indexer(q, q, q, actual_seq_lengths_key=lengths)
    assert time.perf_counter() - start < 0.5
    _named(err.value, "actual_seq_lengths_key")


@pytest.fixture(scope="module")
def sfa():
    from tests.test_sparse_flash_attention import make_case as sfa_case

    case = sfa_case(np.random.default_rng(17), quant=False, layout_query="TND", layout_kv="PA_BSND",
                    dtype="bfloat16", sbs=1, n1=4)
    kw = {k: _t(v) for k, v in case["kw"].items()}
    return dict(query=_t(case["query"]), key=_t(case["key"]), sparse_indices=_t(case["sparse_indices"]),
                scale_value=0.0625, sparse_block_size=1, block_table=kw["block_table"],
                actual_seq_lengths_query=kw["actual_seq_lengths_query"],
                actual_seq_lengths_kv=kw["actual_seq_lengths_kv"], query_rope=_t(case["query_rope"]),
                key_rope=_t(case["key_rope"]), layout_query="TND", layout_kv="PA_BSND", sparse_mode=3)


@pytest.mark.parametrize("ns", ["_C_ascend", "custom"])
def test_namespace_sfa_requires_value(tnpu, sfa, ns):
    with pytest.raises(DTypeError) as err:
        getattr(torch.ops, ns).npu_sparse_flash_attention(value=None, **sfa)
    assert "required" in _named(err.value, "value")
