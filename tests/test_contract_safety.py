"""Calls that every contract used to accept and then answer wrongly, found by mutating one argument
of a valid call at a time; each is now rejected (naming the argument, nothing written) or right.

- Memory (``ops._check.check_disjoint``, one rule for every op that writes caller arrays): an
  argument the op reads may not share memory with a cache or out= array it writes (a K/V-split
  ``v`` inside ``ckv_cache`` was read after the scatter; MlaPreprocess' ``ctkv_scale`` inside
  ``q_out0`` after q_out0 was written), on the first call of a signature and on the memoised path,
  through the torch_npu drop-in too.
- ``k_nope_clip_alpha`` whose clip limit overflows fp32 (3e38 gave +inf tile scales).
- ``sparse_indices``' K and the TND batch count bounded before anything is allocated.
- A read-only ``key`` / ``key_rope`` / ``value`` reaches the kernels as every other input does
  (a copy): the same result, no new kernel specialisation.
"""

from __future__ import annotations

import importlib

import numba
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import ModeError, ShapeError
from ascend_emu.ops._check import MAX_BATCH
from ascend_emu.ops.sparse_flash_attention import MAX_SPARSE_K
from tests.helpers import BF16, assert_same_bytes, poisoned, raw
from tests import test_kv_rmsnorm_v_split as vsplit
from tests import test_overhead_caching as memo
from tests.reference.kv_rmsnorm_v_split import v_split_ref

kv_contract = importlib.import_module("ascend_emu.ops.kv_rmsnorm_rope_cache")
prolog_contract = importlib.import_module("ascend_emu.ops.mla_prolog")
pre_contract = importlib.import_module("ascend_emu.ops.mla_preprocess")
sfa_kernels = importlib.import_module("ascend_emu.emu.sparse_flash_attention")
li_kernels = importlib.import_module("ascend_emu.emu.lightning_indexer")


def inside(base: np.ndarray, like: np.ndarray) -> np.ndarray:
    """An array of ``like``'s shape and dtype over the first bytes of ``base`` (same signature as
    ``like``: C-contiguous, writable)."""
    return raw(base)[:like.nbytes].view(like.dtype).reshape(like.shape)


def assert_rejected(call, arrays, error, match):
    before = [raw(a).copy() for a in arrays]
    with pytest.raises(error, match=match):
        call()
    for a, b in zip(arrays, before, strict=True):
        assert_same_bytes(a, b, "array after a rejected call")


# ---------------------------------------------------------------------- memory: kv_rmsnorm_rope_cache
@pytest.mark.parametrize("memoised", [False, True], ids=["first call", "memoised"])
@pytest.mark.parametrize("name, cache", [("v", "ckv_cache"), ("v", "k_cache"), ("kv", "ckv_cache"),
                                         ("cos", "k_cache"), ("index", "ckv_cache")])
def test_kv_v_split_input_inside_a_cache_rejected(rng, name, cache, memoised):
    """The fuzz case: v inside ckv_cache was read after the scatter (ckv_cache and y_out got
    overwritten bytes)."""
    inputs, index, k_cache, ckv_cache = vsplit.make_case(rng, "PA_BNSD", 2, 3, BF16, False)
    kv_contract._VALIDATED.clear()
    if memoised:
        vsplit.call(inputs, index, k_cache.copy(), ckv_cache.copy(), cache_mode="PA_BNSD")
        assert len(kv_contract._VALIDATED) == 1
    args = dict(zip(("kv", "gamma", "cos", "sin", "v"), inputs, strict=True), index=index)
    caches = {"k_cache": k_cache, "ckv_cache": ckv_cache}
    alias = inside(caches[cache], args[name])
    alias[...] = args[name]
    args[name] = alias
    before = [c.copy() for c in caches.values()]
    with pytest.raises(ShapeError, match=f"^{name}: expected memory separate from {cache} "):
        vsplit.call([args[k] for k in ("kv", "gamma", "cos", "sin", "v")], args["index"], k_cache, ckv_cache,
                    cache_mode="PA_BNSD", is_output_kv=True)
    for c, b in zip(caches.values(), before, strict=True):
        assert_same_bytes(c, b, "cache after a rejected call")


def test_kv_v_split_separate_copy_of_the_same_bytes_is_right(rng):
    """What the aliased call should have computed: v copied out of the cache first."""
    inputs, index, k_cache, ckv_cache = vsplit.make_case(rng, "PA_BNSD", 2, 3, BF16, False)
    ref = v_split_ref(*inputs[:4], index, k_cache, ckv_cache, inputs[4], cache_mode="PA_BNSD")
    out = vsplit.call(inputs, index, k_cache, ckv_cache, cache_mode="PA_BNSD", is_output_kv=True)
    assert_same_bytes(ckv_cache, ref.ckv_cache, "ckv_cache")
    assert_same_bytes(out[3], ref.v_out, "y_out")


def test_kv_outputs_still_may_be_the_caches_themselves(rng):
    """In-place caches are outputs, not inputs: passing them is the op's normal use."""
    c = memo._kv_case(rng)
    out = memo._kv_call(c)
    assert out[0] is c["k_cache"] and out[1] is c["ckv_cache"]


def test_drop_in_v_inside_ckv_cache_rejected(rng):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    inputs, index, k_cache, ckv_cache = vsplit.make_case(rng, "PA_BNSD", 2, 3, BF16, False)

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16) if a.dtype == BF16 \
            else torch.from_numpy(a)

    kv, gamma, cos, sin, v = (t(x) for x in inputs)
    kc, cc = t(k_cache.copy()), t(ckv_cache.copy())
    v_in_cc = cc.view(-1)[:v.numel()].view(v.shape)
    v_in_cc.copy_(v)
    before = [kc.clone(), cc.clone()]
    with pytest.raises(ShapeError, match="v: expected memory separate from ckv_cache"):
        torch_npu.npu_kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, t(index), kc, cc, v=v_in_cc,
                                               cache_mode="PA_BNSD", is_output_kv=True)
    assert torch.equal(kc.view(torch.int16), before[0].view(torch.int16))
    assert torch.equal(cc.view(torch.int16), before[1].view(torch.int16))


# ---------------------------------------------------------------------- memory: MLA prolog
@pytest.mark.parametrize("memoised", [False, True], ids=["first call", "memoised"])
@pytest.mark.parametrize("name, cache", [("rope_sin", "kr_cache"), ("rmsnorm_gamma_ckv", "kv_cache"),
                                         ("cache_index", "kv_cache")])
def test_prolog_input_inside_a_cache_rejected(rng, name, cache, memoised):
    prolog_contract._VALIDATED.clear()
    c = memo._prolog_case(rng)
    if memoised:
        memo._prolog_call({k: v.copy() if k.endswith("cache") else v for k, v in c.items()})
        assert len(prolog_contract._VALIDATED) == 1
    alias = inside(c[cache], c[name])
    alias[...] = c[name]
    c[name] = alias
    assert_rejected(lambda: memo._prolog_call(c), [c["kv_cache"], c["kr_cache"]], ShapeError,
                    f"^{name}: expected memory separate from {cache} ")


# ---------------------------------------------------------------------- memory: MlaPreprocess out= form
def _int8_out_case(rng):
    from tests.test_mla_preprocess import make_case

    c = make_case(rng, "bfloat16", "int8_nzcache", "per_token_quant_symm")
    t, n = c["args"]["input"].shape[0], c["kwargs"]["q_nope_scale"].shape[0]
    outs = dict(q_out0=poisoned((t, n, 512), np.int8), kv_cache_out0=c["args"]["kv_cache"],
                q_out1=poisoned((t, n, 64), BF16), kv_cache_out1=c["args"]["kv_cache_rope"])
    return c, outs


@pytest.mark.parametrize("memoised", [False, True], ids=["first call", "memoised"])
def test_preprocess_ctkv_scale_inside_q_out0_rejected(rng, memoised):
    """The fuzz case: the int8 out= form read ctkv_scale after q_out0 was written."""
    pre_contract._VALIDATED.clear()
    c, outs = _int8_out_case(rng)
    if memoised:
        memo._pre_call(c, **outs)
        assert len(pre_contract._VALIDATED) == 1
    scale = c["kwargs"]["ctkv_scale"]
    alias = inside(outs["q_out0"], scale)
    alias[...] = scale
    arrays = [outs["q_out0"], outs["q_out1"], outs["kv_cache_out0"], outs["kv_cache_out1"]]
    assert_rejected(lambda: memo._pre_call(c, **dict(outs, ctkv_scale=alias)), arrays, ShapeError,
                    "^ctkv_scale: expected memory separate from q_out0 ")


def test_preprocess_out_form_input_inside_a_cache_out_rejected(rng):
    pre_contract._VALIDATED.clear()
    c, outs = _int8_out_case(rng)
    sm = c["args"]["slotmapping"]
    alias = inside(outs["kv_cache_out1"], sm)
    alias[...] = sm
    arrays = [outs["q_out0"], outs["q_out1"], outs["kv_cache_out0"], outs["kv_cache_out1"]]
    assert_rejected(lambda: ops.npu_mla_preprocess(*dict(c["args"], slotmapping=alias).values(), **c["kwargs"],
                                                   **outs),
                    arrays, ShapeError, "^slotmapping: expected memory separate from kv_cache_out1 ")


# ---------------------------------------------------------------------- k_nope_clip_alpha
def _per_tile(rng):
    t, n, hcq = 2, 1, 1536
    c = memo._prolog_case(rng, t=t, n=n)
    c.update(weight_uq_qr=ops.npu_format_cast(rng.integers(-127, 128, (hcq, n * 192)).astype(np.int8), 29),
             kv_cache=poisoned((2, 16, 1, 656), np.int8), kr_cache=np.zeros((0,), BF16),
             cache_index=np.array([3, 17], np.int64))
    kw = dict(weight_quant_mode=1, kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1,
              dequant_scale_w_uq_qr=np.full((1, n * 192), 1e-3, np.float32), cache_mode="PA_BSND")
    return c, kw


@pytest.mark.parametrize("memoised", [False, True], ids=["first call", "memoised"])
def test_clip_alpha_whose_clip_limit_overflows_rejected(rng, memoised):
    """3e38 is finite in fp32 but alpha * amax is not: +inf tile scales and zero k_nope."""
    prolog_contract._VALIDATED.clear()
    c, kw = _per_tile(rng)
    c["rmsnorm_gamma_ckv"] = np.ones(512, BF16)  # amax <= sqrt(512): 3e38 * 22.6 overflows
    if memoised:
        memo._prolog_call(dict(c, kv_cache=c["kv_cache"].copy()), k_nope_clip_alpha=np.ones(1, np.float32), **kw)
        assert len(prolog_contract._VALIDATED) == 1
    assert_rejected(lambda: memo._prolog_call(c, k_nope_clip_alpha=np.array([3e38], np.float32), **kw),
                    [c["kv_cache"]], ModeError, r"^k_nope_clip_alpha: expected a clip factor whose per-tile clip "
                    r"limit stays finite in fp32 .*got 3\.0000000[0-9]*e\+38")


def test_clip_alpha_bound_follows_gamma_and_kc_scale(rng):
    """The bound is alpha * sqrt(512) * max|gamma_ckv| * |kc_scale|: 1e36 passes with gamma 1
    (scales finite, as the reference computes them) and fails with kc_scale 1e3."""
    prolog_contract._VALIDATED.clear()
    c, kw = _per_tile(rng)
    c["rmsnorm_gamma_ckv"] = np.ones(512, BF16)
    alpha = np.array([1e36], np.float32)
    memo._prolog_call(c, k_nope_clip_alpha=alpha, **kw)
    scales = c["kv_cache"][:, :, 0, 640:656].copy().view(np.float32)  # [2, 16, 4]
    written = scales.reshape(-1, 4)[[3, 17]]
    assert np.isfinite(written).all() and (written > 0).all()
    assert_rejected(lambda: memo._prolog_call(c, k_nope_clip_alpha=alpha, kc_scale=1e3, **kw), [c["kv_cache"]],
                    ModeError, "k_nope_clip_alpha: expected a clip factor whose per-tile clip limit")


# ---------------------------------------------------------------------- bounds before allocating
def _sfa_case(rng, layout="BSND"):
    from tests.test_sparse_flash_attention import make_case

    return make_case(rng, quant=False, layout_query=layout, layout_kv=layout, dtype="bfloat16", sbs=1)


def _sfa_call(case, **over):
    from tests.test_sparse_flash_attention import _call

    return _call(case, False, **over)


def test_sparse_indices_k_bounded_before_allocating(rng):
    case = _sfa_case(rng)
    lead = case["sparse_indices"].shape[:-1]
    huge = np.broadcast_to(np.int32(-1), (*lead, 2 ** 31))  # no memory: a stride-0 view
    with pytest.raises(ShapeError, match=rf"^sparse_indices: expected .* K <= {MAX_SPARSE_K} .*, got "
                                         rf"\[2, 3, 1, {2 ** 31}\]"):
        _sfa_call(case, sparse_indices=huge)
    with pytest.raises(ShapeError, match=f"K <= {MAX_SPARSE_K}"):
        _sfa_call(case, sparse_indices=np.full((*lead, MAX_SPARSE_K + 1), -1, np.int32))
    widest = np.full((*lead, MAX_SPARSE_K), -1, np.int32)
    widest[..., :case["sparse_indices"].shape[-1]] = case["sparse_indices"]
    narrow = _sfa_call(case)
    wide = _sfa_call(case, sparse_indices=widest)  # K = 8192 is accepted: the same rows
    assert_same_bytes(wide[0], narrow[0], "attention_out with K = 8192")


def test_tnd_batch_count_bounded_before_widening(rng):
    case = _sfa_case(rng, "TND")
    too_many = np.zeros(MAX_BATCH + 1, np.int32)
    too_many[-1] = case["query"].shape[0]
    with pytest.raises(ShapeError, match=rf"^actual_seq_lengths_query: expected a 1-D int32 tensor \[B\] with "
                                         rf"1 <= B <= {MAX_BATCH}, got shape \[{MAX_BATCH + 1}\]"):
        _sfa_call(case, actual_seq_lengths_query=too_many)
    from tests.test_lightning_indexer import make_case

    query, key, weights, kw = make_case(rng, "TND", "TND", BF16, [2, 1], [5, 3])
    too_many[-1] = query.shape[0]
    with pytest.raises(ShapeError, match=rf"^actual_seq_lengths_query: .*1 <= B <= {MAX_BATCH}"):
        ops.npu_lightning_indexer(query, key, weights, **dict(kw, actual_seq_lengths_query=too_many))


# ---------------------------------------------------------------------- read-only kernel inputs
def _signatures(module) -> int:
    """Compiled specialisations of every Numba dispatcher in ``module``."""
    return sum(len(d.signatures) for d in vars(module).values() if isinstance(d, numba.core.dispatcher.Dispatcher))


def _read_only(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("quant", [False, True], ids=["sfa", "kv-quant sfa"])
def test_read_only_key_same_result_no_new_kernel_signature(rng, quant):
    from tests.test_sparse_flash_attention import _call, make_case

    case = make_case(rng, quant=quant, layout_query="BSND", layout_kv="PA_BSND", dtype="bfloat16", sbs=1)
    first = _call(case, quant)
    first = first if quant else first[0]
    compiled = _signatures(sfa_kernels)
    over = dict(key=_read_only(case["key"]))
    if quant:
        over["value"] = over["key"]
    else:
        over.update(key_rope=_read_only(case["key_rope"]), value=_read_only(case["value"]))
    again = _call(case, quant, **over)
    again = again if quant else again[0]
    assert_same_bytes(again, first, "attention_out with a read-only key")
    assert _signatures(sfa_kernels) == compiled


def test_read_only_indexer_key_same_result_no_new_kernel_signature(rng):
    from tests.test_lightning_indexer import make_case

    query, key, weights, kw = make_case(rng, "BSND", "PA_BSND", BF16, [2, 1], [20, 9])
    first = ops.npu_lightning_indexer(query, key, weights, sparse_count=8, return_value=True, **kw)
    compiled = _signatures(li_kernels)
    again = ops.npu_lightning_indexer(query, _read_only(key), weights, sparse_count=8, return_value=True, **kw)
    for a, b in zip(again, first, strict=True):
        assert_same_bytes(a, b, "indexer output with a read-only key")
    assert _signatures(li_kernels) == compiled
