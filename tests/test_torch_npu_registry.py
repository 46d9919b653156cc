"""torch_npu 2.14's schemas as torch.ops.npu / torch.ops.atb ops: schema parity, fake kernels
(shapes and dtypes of torch_npu's meta functions, per mode), eager = fake, torch.compile."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ascend_emu.ops as ops  # noqa: E402
import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.errors import DTypeError, ModeError, ShapeError  # noqa: E402
from ascend_emu.torch_npu import _registry  # noqa: E402
from ascend_emu.torch_npu.schemas import FIA_INFER_OUTPUT_SOURCE, OP_PLUGIN_SOURCE, SCHEMAS  # noqa: E402

BF16, F32, I8, I32 = torch.bfloat16, torch.float32, torch.int8, torch.int32

#: The overloads torch_npu 2.14 declares for the emulated ops (the 2.14 additions included).
EXPECTED_OVERLOADS = {
    "npu::get_npu_format", "npu::npu_format_cast", "npu::npu_format_cast.Tensor", "npu::npu_format_cast_",
    "npu::npu_format_cast_.acl_format", "npu::npu_kv_rmsnorm_rope_cache", "npu::npu_kv_rmsnorm_rope_cache_v2",
    "npu::npu_kv_rmsnorm_rope_cache_v2_functional", "npu::npu_mla_prolog", "npu::npu_mla_prolog_v2",
    "npu::npu_mla_prolog_v3", "npu::npu_mla_prolog_v3_functional", "npu::npu_sparse_flash_attention",
    "npu::npu_kv_quant_sparse_flash_attention", "npu::npu_lightning_indexer", "atb::npu_mla_preprocess",
    "atb::npu_mla_preprocess.out", "npu::npu_interleave_rope", "npu::npu_rotary_mul",
    "npu::npu_dtype_cast", "npu::npu_dynamic_mx_quant", "npu::npu_dynamic_mx_quant_with_dual_axis",
    "npu::npu_scatter_pa_kv_cache", "npu::npu_scatter_pa_kv_cache_functional", "npu::npu_gather_pa_kv_cache",
    "npu::npu_gather_pa_kv_cache_functional",
    "npu::npu_dynamic_quant", "npu::npu_dynamic_quant_asymmetric",
    "npu::npu_quant_lightning_indexer",
    "npu::npu_fused_infer_attention_score", "npu::npu_fused_infer_attention_score.out",
    "npu::_npu_fused_infer_attention_score_get_max_workspace", "npu::npu_fused_infer_attention_score_v2",
    "npu::npu_fused_infer_attention_score_v2.out", "npu::_npu_fused_infer_attention_score_v2_get_max_workspace",
    "npu::_npu_fused_infer_attention_score_infer_output", "npu::_npu_fused_infer_attention_score_v2_infer_output",
}


def test_every_emulated_op_is_registered_with_its_2_14_schema():
    assert {f"{s.namespace}::{s.qualified}" for s in SCHEMAS} == EXPECTED_OVERLOADS
    for spec in SCHEMAS:
        stored = str(torch._C.parse_schema(f"{spec.namespace}::{spec.schema}"))
        assert _registry.registered_schema(spec) == stored, spec.qualified
        assert spec.source.startswith("torch_npu/") or spec.source in (OP_PLUGIN_SOURCE, FIA_INFER_OUTPUT_SOURCE), \
            spec.qualified


def test_alias_annotations_are_kept():
    v3 = torch.ops.npu.npu_mla_prolog_v3.default._schema
    mutated = {a.name for a in v3.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"kv_cache", "kr_cache"}
    functional = torch.ops.npu.npu_mla_prolog_v3_functional.default._schema
    assert not any(a.alias_info is not None for a in functional.arguments)
    assert len(functional.returns) == 7
    out = torch.ops.atb.npu_mla_preprocess.out._schema
    assert [r.alias_info is not None and r.alias_info.is_write for r in out.returns] == [True] * 4


def test_torch_npu_attributes_are_the_registered_ops():
    for name in ("npu_mla_prolog", "npu_mla_prolog_v2", "npu_mla_prolog_v3", "npu_mla_prolog_v3_functional",
                 "npu_kv_rmsnorm_rope_cache", "npu_kv_rmsnorm_rope_cache_v2", "npu_format_cast",
                 "npu_kv_rmsnorm_rope_cache_v2_functional", "npu_sparse_flash_attention", "npu_format_cast_",
                 "npu_kv_quant_sparse_flash_attention", "npu_lightning_indexer", "get_npu_format"):
        assert getattr(torch_npu, name).op is getattr(torch.ops.npu, name)
        assert "torch_npu 2.14.0 schema" in getattr(torch_npu, name).__doc__
    assert torch_npu.atb.npu_mla_preprocess.op is torch.ops.atb.npu_mla_preprocess


def test_wrong_argument_kinds_are_ascend_emu_errors_naming_the_argument():
    big = torch.randn(64, 64)
    t = [torch.zeros(2) for _ in range(7)]
    with pytest.raises(ModeError, match=r"cache_mode: expected a str, got a \[64, 64\] float32 tensor") as info:
        torch_npu.npu_kv_rmsnorm_rope_cache(*t, cache_mode=big)
    assert len(str(info.value)) < 400  # summarised, never the whole tensor
    with pytest.raises(DTypeError, match="epsilon: expected a Python float"):
        torch_npu.npu_kv_rmsnorm_rope_cache(*t, epsilon="1e-5")
    with pytest.raises(DTypeError, match="kv: expected a torch.Tensor"):
        torch_npu.npu_kv_rmsnorm_rope_cache(np.zeros(3), *t[1:])
    with pytest.raises(ModeError, match=r"acl_format: expected the int 29 .*got 29\.0"):
        torch_npu.npu_format_cast(torch.zeros(16, 16), 29.0)


# ------------------------------------------------------------------------------ fake kernels
def _meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def _shapes(outs):
    return [(tuple(o.shape), o.dtype) for o in (outs if isinstance(outs, (tuple, list)) else [outs])]


def _prolog_inputs(token_shape, *, x=BF16, w=BF16, wuq=BF16, n=8, hcq=1536, dr=64, kv=BF16):
    lead = token_shape[:-1]
    return (_meta(*token_shape, dtype=x), _meta(7168, hcq, dtype=w), _meta(hcq, n * 192, dtype=wuq),
            _meta(n, 128, 512), _meta(7168, 576, dtype=w), _meta(hcq), _meta(512), _meta(*lead, dr),
            _meta(*lead, dr)), (_meta(4, 16, 1, 512, dtype=kv), _meta(4, 16, 1, 64, dtype=kv))


# Expected (shape, dtype) per mode, read off torch_npu 2.14's meta functions (CANN >= 8.5.0.alpha003).
V3_CASES = [
    # token shape, kwargs, dtypes (x, w, wuq), expected [query, query_rope, dq_nope, query_norm, dq_norm]
    ((3, 7168), {}, (BF16, BF16, BF16),
     [((3, 8, 512), BF16), ((3, 8, 64), BF16), ((0,), F32), ((0,), BF16), ((0,), F32)]),
    ((2, 5, 7168), {"query_norm_flag": True}, (BF16, BF16, BF16),
     [((2, 5, 8, 512), BF16), ((2, 5, 8, 64), BF16), ((0,), F32), ((2, 5, 1536), BF16), ((0,), F32)]),
    ((3, 7168), {"weight_quant_mode": 1, "query_norm_flag": True}, (BF16, BF16, I8),
     [((3, 8, 512), BF16), ((3, 8, 64), BF16), ((0,), F32), ((3, 1536), I8), ((3, 1), F32)]),
    ((2, 5, 7168), {"weight_quant_mode": 2, "kv_cache_quant_mode": 1, "query_quant_mode": 1,
                    "query_norm_flag": True}, (I8, I8, I8),
     [((2, 5, 8, 512), I8), ((2, 5, 8, 64), BF16), ((10, 8, 1), F32), ((2, 5, 1536), I8), ((10, 1), F32)]),
    ((3, 7168), {"weight_quant_mode": 2, "kv_cache_quant_mode": 3}, (I8, I8, I8),
     [((3, 8, 512), BF16), ((3, 8, 64), BF16), ((0,), F32), ((0,), I8), ((0,), F32)]),
    ((3, 7168), {"weight_quant_mode": 3, "kv_cache_quant_mode": 1, "query_norm_flag": True},
     (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float8_e4m3fn),
     [((3, 8, 512), torch.float8_e4m3fn), ((3, 8, 64), BF16), ((3, 8, 1), F32), ((3, 1536), torch.float8_e4m3fn),
      ((3, 48), torch.float8_e8m0fnu)]),
]


@pytest.mark.parametrize("token_shape, kwargs, dtypes, expected", V3_CASES)
def test_mla_prolog_v3_fake_shapes_per_mode(token_shape, kwargs, dtypes, expected):
    x, w, wuq = dtypes
    args, caches = _prolog_inputs(token_shape, x=x, w=w, wuq=wuq)
    outs = torch.ops.npu.npu_mla_prolog_v3(*args, *caches, **kwargs)
    assert _shapes(outs) == expected
    functional = torch.ops.npu.npu_mla_prolog_v3_functional(*args, *caches, **kwargs)
    assert _shapes(functional) == expected + _shapes(caches)


@pytest.mark.parametrize("token_shape", [(3, 7168), (2, 5, 7168)])
def test_mla_prolog_v1_v2_fake_shapes(token_shape):
    args, caches = _prolog_inputs(token_shape)
    lead = token_shape[:-1]
    index = _meta(*lead, dtype=torch.int64)
    v1 = torch.ops.npu.npu_mla_prolog(*args, index, *caches)
    assert _shapes(v1) == [(lead + (8, 512), BF16), (lead + (8, 64), BF16)] + _shapes(caches)
    v2 = torch.ops.npu.npu_mla_prolog_v2(*args, index, *caches)
    assert _shapes(v2) == [(lead + (8, 512), BF16), (lead + (8, 64), BF16)] + _shapes(caches) + [((1,), F32)]
    args8, caches8 = _prolog_inputs(token_shape, x=I8, w=I8, wuq=I8, kv=I8)
    v2q = torch.ops.npu.npu_mla_prolog_v2(*args8, index, *caches8, quant_scale_ckv=_meta(1, dtype=F32))
    tokens = int(np.prod(lead))
    assert _shapes(v2q) == [(lead + (8, 512), I8), (lead + (8, 64), BF16)] + _shapes(caches8) + \
        [((tokens, 8, 1), F32)]


def test_mla_prolog_v3_fake_takes_hifloat8_tags():
    """The meta function's weight_quant_mode 5: uint8 (hifloat8) inputs give a uint8 query and
    query_norm; the tags are checked by the op, not the fake kernel."""
    u8 = torch.uint8
    args, caches = _prolog_inputs((3, 7168), x=u8, w=u8, wuq=u8)
    out = torch.ops.npu.npu_mla_prolog_v3(*args, caches[0].to(u8), caches[1], token_x_dtype=290, weight_dq_dtype=290,
                                          weight_uq_qr_dtype=290, weight_dkv_kr_dtype=290, kv_cache_dtype=290,
                                          weight_quant_mode=5, kv_cache_quant_mode=1, query_quant_mode=1,
                                          query_norm_flag=True)
    assert [o.dtype for o in out] == [torch.uint8, torch.bfloat16, torch.float32, torch.uint8, torch.float32]


def test_kv_rmsnorm_rope_cache_fake_shapes():
    kv, gamma, cos = _meta(2, 1, 3, 576), _meta(512), _meta(2, 1, 3, 64)
    index, kc, ckvc = _meta(6, dtype=torch.int64), _meta(2, 16, 1, 64), _meta(2, 16, 1, 512)
    base = (kv, gamma, cos, cos, index, kc, ckvc)
    k_rope, c_kv = ((2, 1, 3, 64), BF16), ((2, 1, 3, 512), BF16)
    assert _shapes(torch.ops.npu.npu_kv_rmsnorm_rope_cache(*base)) == _shapes((kc, ckvc)) + [k_rope, c_kv]
    assert _shapes(torch.ops.npu.npu_kv_rmsnorm_rope_cache_v2(*base)) == [k_rope, c_kv]
    assert _shapes(torch.ops.npu.npu_kv_rmsnorm_rope_cache_v2_functional(*base)) == [k_rope, c_kv] + \
        _shapes((kc, ckvc))
    v_base = (_meta(2, 1, 3, 64), gamma, cos, cos, index, kc, ckvc)  # kv = RoPE part, v = RmsNorm part
    assert _shapes(torch.ops.npu.npu_kv_rmsnorm_rope_cache_v2(*v_base, v=_meta(2, 1, 3, 512))) == [k_rope, c_kv]


@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_sparse_ops_fake_shapes(layout):
    if layout == "BSND":
        q, k = _meta(2, 3, 16, 576), _meta(2, 40, 1, 576)
        lse = (2, 1, 3, 16)
        idx = _meta(2, 3, 1, 8, dtype=I32)
    else:
        q, k = _meta(6, 16, 576), _meta(40, 1, 576)
        lse = (1, 6, 16)
        idx = _meta(6, 1, 8, dtype=I32)
    out = torch.ops.npu.npu_sparse_flash_attention(q, k, k, idx, 0.1, layout_query=layout, layout_kv=layout)
    assert _shapes(out) == [(tuple(q.shape), BF16), ((0,), F32), ((0,), F32)]
    out = torch.ops.npu.npu_sparse_flash_attention(q, k, k, idx, 0.1, layout_query=layout, layout_kv=layout,
                                                   return_softmax_lse=True)
    assert _shapes(out) == [(tuple(q.shape), BF16), (lse, F32), (lse, F32)]
    out = torch.ops.npu.npu_kv_quant_sparse_flash_attention(q, k, k, idx, 0.1, 2, 2, layout_query=layout,
                                                            layout_kv=layout)
    assert _shapes(out) == [(tuple(q.shape[:-1]) + (512,), BF16)]
    iq, ik, wts = (_meta(2, 3, 64, 128), _meta(2, 40, 1, 128), _meta(2, 3, 64)) if layout == "BSND" else \
        (_meta(6, 64, 128), _meta(40, 1, 128), _meta(6, 64))
    lead = (2, 3, 1) if layout == "BSND" else (6, 1)
    out = torch.ops.npu.npu_lightning_indexer(iq, ik, wts, layout_query=layout, layout_key=layout, sparse_count=8)
    assert _shapes(out) == [(lead + (8,), I32), ((0,), BF16)]
    out = torch.ops.npu.npu_lightning_indexer(iq, ik, wts, layout_query=layout, layout_key=layout, sparse_count=8,
                                              return_value=True)
    assert _shapes(out) == [(lead + (8,), I32), (lead + (8,), BF16)]


def test_mla_preprocess_fake_shapes():
    ins = [_meta(5, 7168)] + [_meta(1)] * 12
    ins[12] = _meta(16, 128, 512)  # wuk [N, 128, 512]
    kv, kr = _meta(4, 16, 1, 512, dtype=I8), _meta(4, 16, 1, 64)
    out = torch.ops.atb.npu_mla_preprocess(*ins, kv, kr, _meta(5, dtype=I32))
    assert _shapes(out) == [((5, 16, 512), I8), ((4, 16, 1, 512), I8), ((5, 16, 64), BF16), ((4, 16, 1, 64), BF16)]


# ------------------------------------------------------------------------------ eager = fake
def _kv_inputs(rng, B=2, S=3):
    kv = torch.from_numpy(rng.standard_normal((B, 1, S, 576), dtype=np.float32)).to(BF16)
    gamma = torch.from_numpy(rng.uniform(0.5, 1.5, 512).astype(np.float32)).to(BF16)
    angle = torch.from_numpy(rng.uniform(0, 6.3, (B, 1, S, 32)).astype(np.float32))
    cos, sin = (torch.cat([f(angle)] * 2, -1).to(BF16) for f in (torch.cos, torch.sin))
    index = torch.tensor([5, 17, 2, 30, 9, 21][: B * S], dtype=torch.int64)  # [B*S] slots
    return kv, gamma, cos, sin, index, torch.zeros(2, 16, 1, 64, dtype=BF16), torch.zeros(2, 16, 1, 512, dtype=BF16)


def _on_meta(args):
    return [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]


def test_kv_ops_eager_outputs_match_fake_and_functional_leaves_caches(rng):
    base = _kv_inputs(rng)
    args = [a.clone() for a in base]
    kw = dict(cache_mode="PA_BNSD", is_output_kv=True)
    for op in (torch.ops.npu.npu_kv_rmsnorm_rope_cache, torch.ops.npu.npu_kv_rmsnorm_rope_cache_v2,
               torch.ops.npu.npu_kv_rmsnorm_rope_cache_v2_functional):
        eager = op(*[a.clone() for a in args], **kw)
        assert _shapes(eager) == _shapes(op(*_on_meta(args), **kw)), op
    kc, ckvc = args[5], args[6]
    k_rope, c_kv = torch_npu.npu_kv_rmsnorm_rope_cache_v2(*args, **kw)
    assert kc.abs().sum() > 0  # v2 writes the caller's caches
    fresh = [a.clone() for a in base]
    f_rope, f_ckv, f_kc, f_ckvc = torch_npu.npu_kv_rmsnorm_rope_cache_v2_functional(*fresh[:5], fresh[5], fresh[6],
                                                                                    **kw)
    assert fresh[5].abs().sum() == 0 and fresh[6].abs().sum() == 0  # functional: caches untouched
    assert torch.equal(f_kc.view(torch.int16), kc.view(torch.int16))
    assert torch.equal(f_ckvc.view(torch.int16), ckvc.view(torch.int16))
    assert torch.equal(f_rope.view(torch.int16), k_rope.view(torch.int16))
    with pytest.raises(ModeError, match="k_cache_dtype"):
        torch_npu.npu_kv_rmsnorm_rope_cache_v2(*args, k_cache_dtype=2, **kw)


def test_kv_v_argument_with_576_mode_widths_is_rejected_with_caches_untouched(rng):
    """torch_npu 2.14's K/V-split mode (``v``) with the 576-wide mode's gamma / caches: a ShapeError
    naming the split mode's widths, nothing written (the mode itself: tests/test_kv_rmsnorm_v_split.py)."""
    args = _kv_inputs(rng)
    kc_before = args[5].clone()
    k_part, v_part = args[0][..., :192].contiguous(), args[0][..., :128].contiguous()
    for op in (torch_npu.npu_kv_rmsnorm_rope_cache, torch_npu.npu_kv_rmsnorm_rope_cache_v2,
               torch_npu.npu_kv_rmsnorm_rope_cache_v2_functional):
        with pytest.raises(ShapeError, match="gamma: expected .*192.*K/V-split mode"):
            op(k_part, *args[1:], v=v_part, cache_mode="PA_BNSD")
    assert torch.equal(args[5], kc_before)


def test_mla_prolog_v3_functional_returns_caches_and_leaves_inputs(rng):
    T, N = 2, 1

    def bf(*shape, scale=1.0):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale).to(BF16)

    w = [torch_npu.npu_format_cast(bf(*s, scale=s[0] ** -0.5), 29) for s in ((7168, 1536), (1536, N * 192))]
    args = (bf(T, 7168), w[0], w[1], bf(N, 128, 512, scale=0.1), torch_npu.npu_format_cast(
        bf(7168, 576, scale=7168 ** -0.5), 29), bf(1536) + 1, bf(512) + 1, bf(T, 64), bf(T, 64))
    kv, kr = torch.zeros(2, 16, 1, 512, dtype=BF16), torch.zeros(2, 16, 1, 64, dtype=BF16)
    index = torch.tensor([3, 20])
    outs = torch_npu.npu_mla_prolog_v3_functional(*args, kv, kr, cache_index=index)
    assert len(outs) == 7 and kv.abs().sum() == 0 and kr.abs().sum() == 0
    assert _shapes(outs) == _shapes(torch.ops.npu.npu_mla_prolog_v3_functional(
        *_on_meta(args), kv.to("meta"), kr.to("meta"), cache_index=index.to("meta")))
    inplace = torch_npu.npu_mla_prolog_v3(*args, kv, kr, cache_index=index)
    for a, b in zip(inplace, outs[:5], strict=True):
        assert torch.equal(a.view(torch.uint8) if a.numel() else a, b.view(torch.uint8) if b.numel() else b)
    assert torch.equal(outs[5].view(torch.int16), kv.view(torch.int16))
    assert torch.equal(outs[6].view(torch.int16), kr.view(torch.int16))


def test_missing_op_raises_not_implemented(monkeypatch):
    monkeypatch.delattr(ops, "npu_lightning_indexer", raising=False)
    q, k, w = torch.zeros(1, 1, 64, 128, dtype=BF16), torch.zeros(1, 4, 1, 128, dtype=BF16), \
        torch.zeros(1, 1, 64, dtype=BF16)
    with pytest.raises(NotImplementedError, match="ascend_emu.ops.npu_lightning_indexer"):
        torch_npu.npu_lightning_indexer(q, k, w, sparse_count=4)


# ------------------------------------------------------------------------------ torch.compile
def test_compile_fullgraph_runs_on_cpu(rng):
    class Cache(torch.nn.Module):
        def forward(self, kv, gamma, cos, sin, index, k_cache, ckv_cache):
            k_rope, c_kv, kc, ckvc = torch_npu.npu_kv_rmsnorm_rope_cache_v2_functional(
                kv, gamma, cos, sin, index, k_cache, ckv_cache, cache_mode="PA_BNSD", is_output_kv=True)
            return k_rope * 2, c_kv, kc, ckvc

    args = _kv_inputs(rng)
    torch._dynamo.reset()
    compiled = torch.compile(Cache(), backend="aot_eager", fullgraph=True)
    got = compiled(*args)
    want = Cache()(*args)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
