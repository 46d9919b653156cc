"""The serving frameworks' namespaces (``torch.ops._C_ascend.*``, ``torch.ops.custom.*``,
:mod:`ascend_emu.torch_npu.namespaces`): each op called as the framework calls it gives the
bytes of the torch_npu binding on the same data (which its own tests hold against
``tests/reference``; the indexer here against the reference too), with the namespace's
defaults, keyword-only arguments and outputs; fake kernels; errors; what is skipped and why."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ascend_emu.ops as ops  # noqa: E402
import ascend_emu.torch_npu as torch_npu  # noqa: E402
from ascend_emu.errors import ArgumentError, DTypeError, ModeError  # noqa: E402
from ascend_emu.torch_npu import namespaces  # noqa: E402
from ascend_emu.torch_npu._convert import to_torch  # noqa: E402
from ascend_emu.torch_npu.namespaces import NAMESPACE_SCHEMAS  # noqa: E402
from tests.helpers import BF16  # noqa: E402
from tests.reference.lightning_indexer import lightning_indexer as indexer_ref  # noqa: E402
from tests.test_lightning_indexer import make_case as indexer_case  # noqa: E402
from tests.test_sparse_flash_attention import SCALE  # noqa: E402
from tests.test_sparse_flash_attention import make_case as sfa_case  # noqa: E402

C = torch.ops._C_ascend
CUSTOM = torch.ops.custom


def _t(a):
    """A NumPy input as an emulated-NPU tensor (None and non-arrays as they are)."""
    return to_torch(np.ascontiguousarray(a)).npu() if isinstance(a, np.ndarray) else a


def _bytes(t: torch.Tensor) -> bytes:
    return t.cpu().contiguous().numpy().tobytes() if t.dtype != torch.bfloat16 else \
        t.cpu().contiguous().view(torch.int16).numpy().tobytes()


def _same(got, want, what):
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), what
    assert _bytes(got) == _bytes(want), what


def _check_fake(op, args, kwargs, real):
    """The op under FakeTensorMode: outputs of the real call's shapes and dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fake = lambda v: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
    with mode:
        out = op(*(fake(a) for a in args), **{k: fake(v) for k, v in kwargs.items()})
    outs = out if isinstance(out, (tuple, list)) else (out,)
    reals = real if isinstance(real, (tuple, list)) else (real,)
    assert [(tuple(o.shape), o.dtype) for o in outs] == [(tuple(r.shape), r.dtype) for r in reals]


# ---------------------------------------------------------------------- the data and the report
def test_every_entry_cites_its_source_and_is_registered_or_skipped_explicitly():
    report = namespaces.report()
    assert set(report) == ({f"{s.namespace}::{s.qualified}" for s in NAMESPACE_SCHEMAS}
                           | {f"{s.namespace}::{s.name}" for s in namespaces.PENDING_SCHEMAS})
    for spec in NAMESPACE_SCHEMAS:
        key = f"{spec.namespace}::{spec.qualified}"
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{8} \S+:(\d+|char~\d+)", spec.source), spec.source
        assert spec.namespace in ("_C_ascend", "custom") and spec.caller
        if hasattr(ops, spec.op):
            assert report[key] == "registered", key
            packet = getattr(getattr(torch.ops, spec.namespace), spec.name)
            declared = torch._C.parse_schema(f"{spec.namespace}::{spec.schema}")
            assert str(packet.default._schema) == str(declared), key
            n_out = len(declared.returns)
            assert not spec.outputs or len(spec.outputs) + len(spec.functional) == n_out, key
        else:  # an op landing later: kept as data, not registered, and said so
            assert report[key] == f"skipped: ascend_emu.ops has no {spec.op} (not emulated by this version)"
            assert not hasattr(getattr(torch.ops, spec.namespace), spec.name), key


#: One fresh interpreter for the registration cases (an import of torch and ascend_emu each):
#: ``_C_ascend::npu_lightning_indexer`` defined first (as a loaded vllm-ascend library would);
#: ``ascend_emu.ops`` without npu_sparse_flash_attention; a stand-in
#: ``ascend_emu.ops.npu_quant_lightning_indexer`` of torch_npu 2.14's signature (the op lands on
#: another branch) that records what it is called with.
_FRESH = textwrap.dedent("""
    import warnings, numpy as np, torch
    lib = torch.library.Library("_C_ascend", "FRAGMENT")
    lib.define("npu_lightning_indexer(Tensor query) -> Tensor")
    import ascend_emu.ops as ops
    del ops.npu_sparse_flash_attention
    seen = []
    def npu_quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale,
                                    query_quant_mode, key_quant_mode, *, actual_seq_lengths_query=None,
                                    actual_seq_lengths_key=None, block_table=None, layout_query="BSND",
                                    layout_key="BSND", sparse_count=2048, sparse_mode=3,
                                    pre_tokens=2**63 - 1, next_tokens=2**63 - 1, query_dtype=None, key_dtype=None):
        seen.append((query_quant_mode, key_quant_mode, layout_query, layout_key, sparse_count, sparse_mode))
        return np.full((query.shape[0], 1, sparse_count), 7, np.int32)
    ops.npu_quant_lightning_indexer = npu_quant_lightning_indexer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import ascend_emu.torch_npu
    from ascend_emu.torch_npu import namespaces
    r = namespaces.report()
    print("WARN", [str(w.message) for w in caught if w.category is namespaces.NamespaceWarning])
    print("LI", r["_C_ascend::npu_lightning_indexer"])
    print("SCHEMA", torch.ops._C_ascend.npu_lightning_indexer.default._schema)
    print("SFA", r["_C_ascend::npu_sparse_flash_attention"], r["custom::npu_sparse_flash_attention"])
    print("HAS", hasattr(torch.ops._C_ascend, "npu_sparse_flash_attention"),
          hasattr(torch.ops.custom, "npu_sparse_flash_attention"))
    print("KVQ", r["_C_ascend::npu_kv_quant_sparse_flash_attention"])
    print("REPORT", sorted(k for k, v in r.items() if v == "registered" and "quant" in k and "indexer" in k))
    q = torch.zeros(3, 4, 128, dtype=torch.int8); k = torch.zeros(2, 16, 1, 128, dtype=torch.int8)
    w = torch.zeros(3, 4, dtype=torch.float16); qs = torch.zeros(3, 4, dtype=torch.float16)
    ks = torch.zeros(2, 16, 1, dtype=torch.float16)
    a = torch.ops._C_ascend.npu_lightning_indexer_quant(query=q, key=k, weights=w, query_dequant_scale=qs,
        key_dequant_scale=ks, layout_query="TND", layout_key="PA_BSND", sparse_count=8)
    b = torch.ops.custom.npu_lightning_indexer_quant(q, k, w, qs, ks, layout_query="TND", layout_key="PA_BSND",
        sparse_count=8)
    c = torch.ops.custom.npu_quant_lightning_indexer(q, k, w, qs, ks, 0, 0, layout_query="TND", sparse_count=8)
    print("A", tuple(a.shape), a.dtype, int(a[0, 0, 0]))
    print("B", type(b).__name__, tuple(b.shape))
    print("C", len(c), tuple(c[0].shape), tuple(c[1].shape), c[1].dtype)
    print("SEEN", seen)
    try:
        torch.ops.custom.npu_quant_lightning_indexer(q, k, w, qs, ks, 0, 0, layout_query="TND", cmp_ratio=4)
    except Exception as exc:
        print("CMP", type(exc).__name__, str(exc)[:60])
""")


@pytest.fixture(scope="module")
def fresh() -> str:
    """The output of :data:`_FRESH`."""
    proc = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_skips_an_existing_op_and_an_op_ascend_emu_lacks(fresh):
    """An op the process already has is left alone with a warning; with ``ascend_emu.ops``
    lacking npu_sparse_flash_attention its namespace ops are not registered; the rest are."""
    out = fresh
    assert "torch.ops._C_ascend.npu_lightning_indexer already exists in this process" in out
    assert "LI skipped: already defined in this process (left as it is)" in out
    assert "SCHEMA _C_ascend::npu_lightning_indexer(Tensor query) -> Tensor" in out
    assert ("SFA skipped: ascend_emu.ops has no npu_sparse_flash_attention (not emulated by this version) "
            "skipped: ascend_emu.ops has no npu_sparse_flash_attention") in out
    assert "HAS False False" in out
    assert "KVQ registered" in out


def test_quant_indexer_entries_light_up_when_the_op_exists(fresh):
    """With the stand-in quant indexer the three quant-indexer entries register (besides the V4
    compressed-key indexer's two, which have their own op), each call
    reaches the op with the namespace's defaults by torch_npu's argument names, the outputs are
    mapped (the V4 schema's second output an fp32 ``[0]``); the custom V4 op runs torch_npu's op
    (the stand-in) at cmp_ratio 1 and the compressed-key indexer above it."""
    out = fresh
    assert ("REPORT ['_C_ascend::npu_lightning_indexer_quant', '_C_ascend::npu_vllm_quant_lightning_indexer', "
            "'_C_ascend::npu_vllm_quant_lightning_indexer_metadata', 'custom::npu_lightning_indexer_quant', "
            "'custom::npu_quant_lightning_indexer', 'custom::npu_quant_lightning_indexer_metadata']") in out
    assert "A (3, 1, 8) torch.int32 7" in out
    assert "B Tensor (3, 1, 8)" in out
    assert "C 2 (3, 1, 8) (0,) torch.float32" in out
    # _C_ascend / custom V3.2: quant modes keyword defaults 0, layout_key given; V4: layout_key's default PA_BSND
    assert "SEEN [(0, 0, 'TND', 'PA_BSND', 8, 3), (0, 0, 'TND', 'PA_BSND', 8, 3), (0, 0, 'TND', 'PA_BSND', 8, 3)]" in out
    # the custom op with cmp_ratio > 1 is the compressed-key indexer (int8, N1 64), not torch_npu's op
    assert "CMP ShapeError query: expected N1 = 64, D = 128" in out


# ---------------------------------------------------------------------- sparse attention
@pytest.fixture(scope="module")
def sfa():
    """A TND query over a PA_BSND cache, as vllm-ascend's SFA decode / MTP step."""
    case = sfa_case(np.random.default_rng(17), quant=False, layout_query="TND", layout_kv="PA_BSND",
                    dtype="bfloat16", sbs=1, n1=4)
    return {k: _t(v) for k, v in case.items() if k != "kw"} | {"kw": {k: _t(v) for k, v in case["kw"].items()}}


def _vllm_sfa_kwargs(c, **over):
    """``device_op.py``'s execute_sparse_flash_attention_process call: every argument by keyword."""
    kw = c["kw"]
    return dict(query=c["query"], key=c["key"], value=c["value"], sparse_indices=c["sparse_indices"],
                scale_value=SCALE, sparse_block_size=1, block_table=kw["block_table"],
                actual_seq_lengths_query=kw["actual_seq_lengths_query"],
                actual_seq_lengths_kv=kw["actual_seq_lengths_kv"], query_rope=c["query_rope"],
                key_rope=c["key_rope"], layout_query="TND", layout_kv="PA_BSND", sparse_mode=3) | over


def _torch_npu_sfa(c):
    kw = _vllm_sfa_kwargs(c)
    return torch_npu.npu_sparse_flash_attention(**kw, attention_mode=2)


def test_c_ascend_sparse_flash_attention_as_vllm_calls_it(sfa):
    want = _torch_npu_sfa(sfa)
    kwargs = _vllm_sfa_kwargs(sfa, attention_mode=2, return_softmax_lse=False)
    got = C.npu_sparse_flash_attention(**kwargs)
    assert isinstance(got, tuple) and len(got) == 3
    for g, w, what in zip(got, want, ("attention_out", "softmax_max", "softmax_sum"), strict=True):
        _same(g, w, what)
    assert got[1].shape == (0,) and got[1].dtype == torch.float32 and got[0].is_npu
    # attention_mode defaults to 2 in _C_ascend (0 in torch_npu): the same call without it
    default = C.npu_sparse_flash_attention(**_vllm_sfa_kwargs(sfa))
    _same(default[0], want[0], "attention_out, attention_mode left at _C_ascend's default")
    _check_fake(C.npu_sparse_flash_attention, (), kwargs, got)


def test_custom_sparse_flash_attention_as_the_recipe_calls_it(sfa):
    """cann-recipes-infer: sparse_block_size positional-or-keyword and required, no
    attention_mode, one output."""
    want = _torch_npu_sfa(sfa)[0]
    kwargs = _vllm_sfa_kwargs(sfa)
    got = CUSTOM.npu_sparse_flash_attention(**kwargs)
    assert isinstance(got, torch.Tensor)
    _same(got, want, "attention_out")
    _check_fake(CUSTOM.npu_sparse_flash_attention, (), kwargs, got)
    del kwargs["sparse_block_size"]
    with pytest.raises(ArgumentError, match=r"sparse_block_size.*torch\.ops\.custom\.npu_sparse_flash_attention"):
        CUSTOM.npu_sparse_flash_attention(**kwargs)
    with pytest.raises(ArgumentError, match="attention_mode"):  # not in the recipe's schema
        CUSTOM.npu_sparse_flash_attention(**_vllm_sfa_kwargs(sfa), attention_mode=2)


def test_c_ascend_sparse_flash_attention_errors_name_the_argument(sfa):
    with pytest.raises(ModeError, match="return_softmax_lse"):  # the doc: no lse with PA_BSND
        C.npu_sparse_flash_attention(**_vllm_sfa_kwargs(sfa, return_softmax_lse=True))
    with pytest.raises(DTypeError, match="scale_value") as info:  # wrong kind: torch rejects, we explain
        C.npu_sparse_flash_attention(**_vllm_sfa_kwargs(sfa, scale_value="0.1"))
    assert "tensor(" not in str(info.value)
    with pytest.raises(ArgumentError, match=r"at most 5 positional"):  # torch_npu's positional form
        C.npu_sparse_flash_attention(sfa["query"], sfa["key"], sfa["value"], sfa["sparse_indices"], SCALE, 1)


@pytest.fixture(scope="module")
def kvq():
    """The int8 656-byte-row cache of the C8 path, TND query over PA_BSND."""
    case = sfa_case(np.random.default_rng(23), quant=True, layout_query="TND", layout_kv="PA_BSND",
                    dtype="bfloat16", sbs=1, n1=4)
    return {k: _t(v) for k, v in case.items() if k != "kw"} | {"kw": {k: _t(v) for k, v in case["kw"].items()}}


def _vllm_kvq_kwargs(c, **over):
    """``device_op.py``'s _execute_kv_quant_sparse_flash_attention call."""
    kw = c["kw"]
    return dict(query=c["query"], key=c["key"], value=c["key"], sparse_indices=c["sparse_indices"],
                scale_value=SCALE, sparse_block_size=1, block_table=kw["block_table"],
                actual_seq_lengths_query=kw["actual_seq_lengths_query"],
                actual_seq_lengths_kv=kw["actual_seq_lengths_kv"], layout_query="TND", layout_kv="PA_BSND",
                sparse_mode=3, attention_mode=2, quant_scale_repo_mode=1, tile_size=128, key_quant_mode=2,
                value_quant_mode=2, rope_head_dim=64, return_softmax_lse=False) | over


def test_c_ascend_kv_quant_sparse_flash_attention_three_outputs(kvq):
    kwargs = _vllm_kvq_kwargs(kvq)
    want = torch_npu.npu_kv_quant_sparse_flash_attention(
        **{k: v for k, v in kwargs.items() if k != "return_softmax_lse"})
    got = C.npu_kv_quant_sparse_flash_attention(**kwargs)
    assert isinstance(got, tuple) and len(got) == 3
    _same(got[0], want, "attention_out")
    for placeholder in got[1:]:  # what the real op returns without return_softmax_lse: fp32 [0]
        assert placeholder.shape == (0,) and placeholder.dtype == torch.float32 and placeholder.is_npu
    _check_fake(C.npu_kv_quant_sparse_flash_attention, (), kwargs, got)


def test_c_ascend_kv_quant_defaults_and_modes_name_the_argument(kvq):
    kwargs = _vllm_kvq_kwargs(kvq)
    for name in ("key_quant_mode", "value_quant_mode"):  # _C_ascend's default is 1; per-tile (2) only
        with pytest.raises(ModeError, match=name):
            C.npu_kv_quant_sparse_flash_attention(**{k: v for k, v in kwargs.items() if k != name})
    with pytest.raises(ModeError, match=r"return_softmax_lse.*torch\.ops\._C_ascend"):
        C.npu_kv_quant_sparse_flash_attention(**kwargs | {"return_softmax_lse": True})
    with pytest.raises(ArgumentError, match="at most 5 positional"):  # torch_npu's positional quant modes
        C.npu_kv_quant_sparse_flash_attention(kvq["query"], kvq["key"], kvq["key"], kvq["sparse_indices"], SCALE, 2, 2)


def test_custom_antiquant_as_the_recipe_calls_it(kvq):
    kwargs = _vllm_kvq_kwargs(kvq)
    want = C.npu_kv_quant_sparse_flash_attention(**kwargs)[0]
    recipe = {k: v for k, v in kwargs.items() if k not in ("return_softmax_lse",)}
    recipe.update(key_dequant_scale=None, value_dequant_scale=None)
    got = CUSTOM.npu_sparse_flash_attention_antiquant(**recipe)
    _same(got, want, "attention_out")
    _check_fake(CUSTOM.npu_sparse_flash_attention_antiquant, (), recipe, got)
    for name in ("tile_size", "rope_head_dim", "quant_scale_repo_mode"):  # the recipe's defaults are 0
        with pytest.raises(ModeError, match=name):
            CUSTOM.npu_sparse_flash_attention_antiquant(**{k: v for k, v in recipe.items() if k != name})


# ---------------------------------------------------------------------- lightning indexer
@pytest.fixture(scope="module")
def li():
    """Integer-valued data (exact scores) with N1 = 64 heads, TND query over PA_BSND, as
    vllm-ascend's indexer_select_post_process."""
    query, key, weights, kw = indexer_case(np.random.default_rng(5), "TND", "PA_BSND", BF16, [2, 1], [40, 25],
                                           data="int")
    ref = indexer_ref(query, key, weights, sparse_count=16, sparse_mode=3, **kw)
    kwargs = dict(query=query, key=key, weights=weights, **kw, sparse_count=16, sparse_mode=3)
    return {k: _t(v) for k, v in kwargs.items()}, ref


def test_c_ascend_lightning_indexer_as_vllm_calls_it(li):
    kwargs, ref = li
    idx, values = C.npu_lightning_indexer(**kwargs)
    np.testing.assert_array_equal(idx.cpu().numpy(), ref[0])
    want = torch_npu.npu_lightning_indexer(**kwargs)
    _same(idx, want[0], "sparse_indices")
    _same(values, want[1], "sparse_values")
    _check_fake(C.npu_lightning_indexer, (), kwargs, (idx, values))
    with pytest.raises(DTypeError, match="weights"):
        C.npu_lightning_indexer(**kwargs | {"weights": kwargs["weights"].to(torch.int32)})


def test_custom_lightning_indexer_one_output(li):
    kwargs, ref = li
    idx = CUSTOM.npu_lightning_indexer(**kwargs)
    assert isinstance(idx, torch.Tensor)
    np.testing.assert_array_equal(idx.cpu().numpy(), ref[0])
    _check_fake(CUSTOM.npu_lightning_indexer, (), kwargs, idx)
    with pytest.raises(ArgumentError, match="return_value"):  # not in the recipe's schema
        CUSTOM.npu_lightning_indexer(**kwargs, return_value=True)


# ---------------------------------------------------------------------- mla prolog v3
@pytest.fixture(scope="module")
def prolog():
    rng = np.random.default_rng(3)
    T, He, Hcq, N, Hckv, D, Dr = 2, 7168, 1536, 1, 512, 128, 64

    def bf(*shape, scale=1.0):
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * scale).to(torch.bfloat16)

    nz = lambda w: torch_npu.npu_format_cast(w, 29)  # noqa: E731
    args = (bf(T, He), nz(bf(He, Hcq, scale=He ** -0.5)), nz(bf(Hcq, N * (D + Dr), scale=Hcq ** -0.5)),
            bf(N, D, Hckv, scale=D ** -0.5), nz(bf(He, Hckv + Dr, scale=He ** -0.5)), bf(Hcq) + 1, bf(Hckv) + 1,
            bf(T, Dr), bf(T, Dr))
    caches = lambda: (torch.zeros(2, 16, 1, Hckv, dtype=torch.bfloat16), torch.zeros(2, 16, 1, Dr, dtype=torch.bfloat16))  # noqa: E731,E501
    return args, caches, dict(cache_index=torch.tensor([20, 3]), cache_mode="PA_BSND")


def test_custom_mla_prolog_v3_and_functional(prolog):
    args, caches, kw = prolog
    kv_want, kr_want = caches()
    want = torch_npu.npu_mla_prolog_v3(*args, kv_want, kr_want, **kw)
    kv, kr = caches()
    got = CUSTOM.npu_mla_prolog_v3(*args, kv, kr, **kw)
    for g, w, what in zip(got, want, ("query", "query_rope", "dequant_scale_q_nope", "query_norm", "scale_q_norm"), strict=True):
        _same(g, w, what)
    _same(kv, kv_want, "kv_cache (in place)")
    _same(kr, kr_want, "kr_cache (in place)")
    kv_f, kr_f = caches()
    out = CUSTOM.npu_mla_prolog_v3_functional(*args, kv_f, kr_f, **kw)
    assert len(out) == 7
    _same(out[0], want[0], "query (functional)")
    _same(out[5], kv_want, "kv_cache copy")
    _same(out[6], kr_want, "kr_cache copy")
    assert not kv_f.any() and not kr_f.any()  # the caller's caches are not written
    _check_fake(CUSTOM.npu_mla_prolog_v3_functional, (*args, kv_f, kr_f), kw, out)
    with pytest.raises(ArgumentError, match="token_x_dtype"):  # torch_npu 2.14's keyword; not the recipe's
        CUSTOM.npu_mla_prolog_v3(*args, kv, kr, **kw, token_x_dtype=None)


# ---------------------------------------------------------------------- defaults pinned to the sources
def test_defaults_pinned_to_the_upstream_schemas(sfa, li, prolog):
    """The defaults a framework's call leaves out, pinned to the upstream registrations (written
    here, not read from this package's schema strings) on data where the value shows:
    vllm-ascend ``csrc/torch_binding.cpp``: ``_C_ascend.npu_sparse_flash_attention`` ``int
    sparse_mode=3``, ``_C_ascend.npu_lightning_indexer`` ``int sparse_count=2048``;
    cann-recipes-infer ``ops_def_registration.cpp``: ``custom.npu_lightning_indexer`` ``int
    sparse_count=2048``, ``custom.npu_mla_prolog_v3_functional`` ``str cache_mode='PA_BSND'``."""
    # sparse_mode 3 (causal: request 0's first query token sees kv positions 0 .. kv_len - 3)
    # against 0: that token picks the last kv position, which only mode 0 lets it see
    full = {k: v for k, v in _vllm_sfa_kwargs(sfa, attention_mode=2).items() if k != "sparse_mode"}
    picks = full["sparse_indices"].clone()
    last = int(full["actual_seq_lengths_kv"][0]) - 1
    if last not in picks[0, 0].tolist():
        picks[0, 0, 0] = last
    full["sparse_indices"] = picks
    default = C.npu_sparse_flash_attention(**full)[0]
    causal = C.npu_sparse_flash_attention(**full, sparse_mode=3)[0]
    plain = C.npu_sparse_flash_attention(**full, sparse_mode=0)[0]
    assert _bytes(causal) != _bytes(plain)
    _same(default, causal, "attention_out, sparse_mode left at _C_ascend's default 3")

    kwargs, _ = li  # the indexer's output has sparse_count columns (-1 past the visible positions)
    rest = {k: v for k, v in kwargs.items() if k != "sparse_count"}
    want = torch_npu.npu_lightning_indexer(**rest, sparse_count=2048)[0]
    assert want.shape[-1] == 2048
    _same(C.npu_lightning_indexer(**rest)[0], want, "_C_ascend sparse_indices, sparse_count left at 2048")
    _same(CUSTOM.npu_lightning_indexer(**rest), want, "custom sparse_indices, sparse_count left at 2048")

    args, caches, kw = prolog  # PA_BSND and PA_NZ lay the same rows out differently
    rest = {k: v for k, v in kw.items() if k != "cache_mode"}
    outs = {mode: CUSTOM.npu_mla_prolog_v3_functional(*args, *caches(), **rest, cache_mode=mode)
            for mode in ("PA_BSND", "PA_NZ")}
    assert _bytes(outs["PA_BSND"][5]) != _bytes(outs["PA_NZ"][5])
    got = CUSTOM.npu_mla_prolog_v3_functional(*args, *caches(), **rest)
    _same(got[5], outs["PA_BSND"][5], "kv_cache copy, cache_mode left at 'PA_BSND'")
    _same(got[6], outs["PA_BSND"][6], "kr_cache copy, cache_mode left at 'PA_BSND'")


# ---------------------------------------------------------------------- torch_npu.<op> = torch.ops.custom.<op>
def test_recipes_mount_custom_ops_onto_torch_npu(monkeypatch, li, sfa):
    """cann-recipes-infer's custom_ops/__init__.py (and so sglang, which imports it) assigns every
    ``torch.ops.custom.<op>`` onto ``torch_npu``: afterwards ``torch_npu.<op>`` follows the
    recipe's schema and the ops not replaced keep working."""
    mounted = [name for name in dir(CUSTOM) if not name.startswith("_")]
    assert {"npu_lightning_indexer", "npu_sparse_flash_attention", "npu_mla_prolog_v3"} <= set(mounted)
    for name in mounted:
        monkeypatch.setattr(torch_npu, name, getattr(CUSTOM, name), raising=False)
    kwargs, ref = li
    idx = torch_npu.npu_lightning_indexer(**kwargs)  # the recipe's one output
    np.testing.assert_array_equal(idx.cpu().numpy(), ref[0])
    out = torch_npu.npu_sparse_flash_attention(**_vllm_sfa_kwargs(sfa))
    assert isinstance(out, torch.Tensor)
    x = torch.ones(1, 1, 2, 4, dtype=torch.float16)
    assert torch_npu.npu_rotary_mul(x, x, x).shape == x.shape  # not replaced



def test_v41_ops_are_registered_to_fail_naming_what_is_missing():
    """DeepSeek-V4.1's ops: the schema as vllm-ascend declares it, a call (real or meta tensors)
    raising NotEmulatedError (a RuntimeError, as torch_npu's rejections) that names the op and
    the missing facts; not counted among the emulated ops."""
    from ascend_emu.errors import NotEmulatedError

    report = namespaces.report()
    names = {s.name for s in namespaces.PENDING_SCHEMAS}
    assert names == {"npu_quant_lightning_indexer_v2", "npu_quant_lightning_indexer_v2_metadata",
                     "npu_quant_lightning_indexer_v3", "npu_sparse_flash_mla", "npu_sparse_flash_mla_metadata"}
    for spec in namespaces.PENDING_SCHEMAS:
        assert report[f"{spec.namespace}::{spec.name}"].startswith("not emulated"), spec.name
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{8} \S+:(\d+|char~\d+)", spec.source), spec.source
        packet = getattr(torch.ops._C_ascend, spec.name)
        assert str(packet.default._schema) == str(torch._C.parse_schema(f"_C_ascend::{spec.schema}"))
    with pytest.raises(NotEmulatedError, match=r"^torch.ops._C_ascend.npu_sparse_flash_mla is registered but not "
                       r"emulated by ascend_emu: .*topk_value_mode"):
        torch.ops._C_ascend.npu_sparse_flash_mla(torch.zeros(1, 64, 512))
    with pytest.raises(RuntimeError, match="npu_quant_lightning_indexer_v3 .*two-level top-k"):
        m = torch.empty(1, device="meta")
        torch.ops._C_ascend.npu_quant_lightning_indexer_v3(m, m, m, m, m, 512, 1)
