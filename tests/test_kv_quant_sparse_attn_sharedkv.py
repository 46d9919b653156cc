"""The Ascend 950's shared-KV attention over 640-byte FP8 rows
(``ascend_emu.ops.kv_quant_sparse_attn_sharedkv``, the ``_C_ascend`` / ``custom`` bindings) against
the independent float64 reference (tests/reference/kv_quant_sparse_attn_sharedkv.py): SWA, dense
and sparse compressed rows at ratios 4 and 128, N1 64 / 128, K2 512 / 1024, TND and BSND, the
metadata plan, every argument honoured or rejected by name, caches left as they were."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from ascend_emu import ops
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from ascend_emu.ops import kv_quant_sparse_attn_sharedkv as kq
from ascend_emu.quant import BF16
from tests.helpers import assert_same_bytes, bit_identical_share, dual_threshold_ok
from tests.reference import kv_quant_sparse_attn_sharedkv as ref
from tests.reference.sparse_attn_sharedkv import positions

D, W = 512, 640
SCALE = D ** -0.5
FP8 = ml_dtypes.float8_e4m3fn


@pytest.fixture(autouse=True)
def ascend950(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")


def _rows(n, rng):
    """``n`` valid 640-byte rows: random bf16 rope, FP8 nope in [-8, 8], scale bytes 122..125."""
    rows = np.zeros((n, W), np.uint8)
    rows[:, :128] = rng.uniform(-1, 1, (n, 64)).astype(ml_dtypes.bfloat16).view(np.uint8).reshape(n, 128)
    rows[:, 128:576] = rng.uniform(-8, 8, (n, 448)).astype(FP8).view(np.uint8)
    rows[:, 576:583] = rng.integers(122, 126, (n, 7))
    return rows


def _page(rows_per_req, block_size, rng, extra_blocks=2):
    """Logical rows -> a float8_e4m3fn PA_ND cache ``[blocks, bs, 1, 640]`` (blocks in a random
    physical order, unread rows random bytes) and its int32 block table."""
    need = [max(1, -(-len(r) // block_size)) for r in rows_per_req]
    total = sum(need) + extra_blocks
    perm = rng.permutation(total)
    cache = _rows(total * block_size, rng).reshape(total, block_size, 1, W)
    table = np.full((len(rows_per_req), max(need) + 1), -7, np.int32)
    k = 0
    for b, rows in enumerate(rows_per_req):
        for j in range(need[b]):
            blk = int(perm[k])
            k += 1
            table[b, j] = blk
            part = rows[j * block_size:(j + 1) * block_size]
            cache[blk, :len(part), 0] = part
    return cache.view(FP8), table


def _case(kind, q_lens, kv_lens, *, ratio=None, n1=64, topk=512, seed=0, layout="TND", ori_bs=32, cmp_bs=16,
          sink=None):
    rng = np.random.default_rng(seed)
    t = sum(q_lens)
    ratio = ratio or {"swa": 1, "dense": 128, "sparse": 4}[kind]
    q = rng.uniform(-3, 3, (t, n1, D)).astype(BF16)
    ori = [_rows(s, rng) for s in kv_lens]
    cmp = None if kind == "swa" else [_rows(s // ratio, rng) for s in kv_lens]
    idx = None
    if kind == "sparse":
        idx = np.full((t, topk), -1, np.int32)
        for i, (_, p) in enumerate(positions(q_lens, kv_lens)):
            pick = rng.permutation((p + 1) // ratio)[:min((p + 1) // ratio, 40)]
            idx[i, :pick.size] = pick  # valid entries first (README)
    sinks = rng.uniform(-2, 2, n1).astype(np.float32) if sink is None else np.full(n1, sink, np.float32)
    return dict(kind=kind, q=q, ori=ori, cmp=cmp, idx=idx, sinks=sinks, ratio=ratio, q_lens=list(q_lens),
                kv_lens=list(kv_lens), layout=layout, ori_bs=ori_bs, cmp_bs=cmp_bs, n1=n1, topk=topk)


def _plan(kw, c, **over):
    args = dict(cu_seqlens_q=kw.get("cu_seqlens_q"), seqused_kv=kw["seqused_kv"], batch_size=len(c["q_lens"]),
                max_seqlen_q=max(c["q_lens"]), max_seqlen_kv=max(c["kv_lens"]),
                cmp_topk=c["topk"] if c["idx"] is not None else 0, cmp_ratio=c["ratio"], layout_q=c["layout"],
                has_cmp_kv=c["cmp"] is not None)
    return ops.npu_kv_quant_sparse_attn_sharedkv_metadata(c["n1"], 1, D, 1, **{**args, **over})


def _call_args(c, *, perm_seed=1):
    rng = np.random.default_rng(perm_seed)
    b = len(c["q_lens"])
    ori_kv, ori_table = _page(c["ori"], c["ori_bs"], rng)
    kw = dict(ori_kv=ori_kv, ori_block_table=ori_table, seqused_kv=np.array(c["kv_lens"], np.int32),
              sinks=c["sinks"], tile_size=64, rope_head_dim=64, softmax_scale=SCALE, cmp_ratio=c["ratio"],
              layout_q=c["layout"])
    q, idx = c["q"], c["idx"]
    if c["layout"] == "TND":
        kw["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(c["q_lens"])]).astype(np.int32)
        if idx is not None:
            idx = idx.reshape(-1, 1, c["topk"])
    else:
        s = c["q_lens"][0]
        q = q.reshape(b, s, c["n1"], D)
        if idx is not None:
            idx = idx.reshape(b, s, 1, c["topk"])
    if c["cmp"] is not None:
        kw["cmp_kv"], kw["cmp_block_table"] = _page(c["cmp"], c["cmp_bs"], rng)
    kw["cmp_sparse_indices"] = idx
    kw["metadata"] = _plan(kw, c)
    return q, kw


def _golden(c):
    return ref.kv_quant_sparse_attn_sharedkv(c["q"], c["ori"], c["cmp"], c["q_lens"], c["kv_lens"], SCALE,
                                             ratio=c["ratio"], indices=c["idx"], sinks=c["sinks"])


CASES = {
    "swa": dict(kind="swa", q_lens=[3, 2, 1], kv_lens=[200, 60, 129]),
    "dense128": dict(kind="dense", q_lens=[2, 3], kv_lens=[300, 383]),
    "dense4": dict(kind="dense", ratio=4, q_lens=[2], kv_lens=[150], ori_bs=64),
    "sparse4": dict(kind="sparse", q_lens=[4, 1], kv_lens=[260, 90]),
    "sparse128_k1024": dict(kind="sparse", ratio=128, topk=1024, q_lens=[2], kv_lens=[900]),
    "sparse4_bsnd_n128": dict(kind="sparse", n1=128, q_lens=[2, 2], kv_lens=[150, 40], layout="BSND", ori_bs=16,
                              cmp_bs=32),
    "swa_sinks_high": dict(kind="swa", q_lens=[2], kv_lens=[90], sink=6.0),
}
#: Bit-identical share against the float64 reference rounded to bf16: measured 0.593 .. 0.672 over CASES
#: (P rounded to bf16 before P @ K, as for the A2 / A3 op), asserted with a margin.
SHARE_RANGE = (0.55, 0.75)


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request):
    mp = pytest.MonkeyPatch()
    mp.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    c = _case(**CASES[request.param])
    q, kw = _call_args(c)
    before = {k: v.copy() for k, v in kw.items() if isinstance(v, np.ndarray)}
    out, lse = ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **kw)
    mp.undo()
    return request.param, c, q, kw, before, out, lse


def test_within_the_dual_criterion_with_the_measured_bit_identical_share(run):
    name, c, q, kw, before, out, lse = run
    assert out.shape == q.shape and out.dtype == BF16
    assert lse.shape == (0,) and lse.dtype == np.float32
    for k, v in before.items():
        assert_same_bytes(kw[k], v, k)  # the caches and tables are read, never written
    gold = _golden(c)
    got = out.reshape(gold.shape)
    assert dual_threshold_ok(got, gold, 0.005), name
    share = bit_identical_share(got, gold.astype(np.float32).astype(BF16))
    assert SHARE_RANGE[0] <= share <= SHARE_RANGE[1], (name, share)


def test_the_decoded_rows_are_what_the_a2a3_op_reads(monkeypatch):
    """Without the sink's place in the online softmax (sinks far below every score), the 950 op
    on 640-byte rows gives the A2 / A3 op's bytes on the rows decoded by the reference."""
    c = _case(**CASES["sparse4"], sink=-200.0)
    q, kw = _call_args(c)
    got = ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **kw)[0]

    def bf16_cache(cache):
        flat = ref.decode_rows(cache.view(np.uint8).reshape(-1, W)).astype(np.float32).astype(BF16)
        return flat.reshape(cache.shape[0], cache.shape[1], 1, D)

    a2 = {k: v for k, v in kw.items() if k not in ("tile_size", "rope_head_dim", "metadata")}
    a2.update(ori_kv=bf16_cache(kw["ori_kv"]), cmp_kv=bf16_cache(kw["cmp_kv"]), sinks=None)
    a2["metadata"] = ops.npu_sparse_attn_sharedkv_metadata(
        64, 1, D, cu_seqlens_q=kw["cu_seqlens_q"], seqused_kv=kw["seqused_kv"], batch_size=2, max_seqlen_q=4,
        max_seqlen_kv=260, cmp_topk=512, cmp_ratio=4, layout_q="TND")
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend910_9391")  # the A2 / A3 op runs on A2 / A3 only
    assert_same_bytes(got, ops.npu_sparse_attn_sharedkv(q, **a2)[0])


def test_the_compiled_row_decode_matches_the_reference_bit_for_bit():
    """quant.v4.decode_kv_rows_bf16 (the rows the op reads, decoded in one compiled pass) against the
    reference decode rounded to bf16, over every scale byte (0: fp32 subnormal scale, 0xFF: NaN,
    >= 0xB7: products past the bf16 / fp32 range) and every fp8 code, rows read out of order."""
    from ascend_emu.quant.v4 import decode_kv_rows_bf16, decode_kv_rows_bf16_into

    rng = np.random.default_rng(11)
    rows = rng.integers(0, 256, (512, W), dtype=np.uint8)
    rows[:256, 576:583] = np.arange(256, dtype=np.uint8)[:, None]  # every scale byte
    rows[:256, 128:384] = np.arange(256, dtype=np.uint8)[None, :]  # every fp8 code under each
    slots = rng.permutation(512)[:400]
    got = decode_kv_rows_bf16(rows, slots)  # fp32 holding bf16 values
    with np.errstate(over="ignore", invalid="ignore"):
        want = ref.decode_rows(rows[slots]).astype(np.float32).astype(BF16).astype(np.float32)
    assert got.shape == (400, D) and got.dtype == np.float32
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert_same_bytes(np.where(nan, 0, got.view(np.uint32)), np.where(nan, 0, want.view(np.uint32)))
    out = np.full((1, 3, D), 7.0, np.float32)  # into columns 1.. of a gathered row block; -1 pads with 0
    decode_kv_rows_bf16_into(rows, np.array([[-1, slots[5]]]), out, 1)
    assert (out[0, 0] == 7).all() and (out[0, 1] == 0).all()
    assert_same_bytes(out[0, 2], decode_kv_rows_bf16(rows, slots[5:6])[0])
    with pytest.raises(IndexRangeError, match="slots"):
        decode_kv_rows_bf16(rows, np.array([3, 512]))
    with pytest.raises(IndexRangeError, match="slots"):
        decode_kv_rows_bf16_into(rows, np.array([[-2]]), out, 0)
    with pytest.raises(ShapeError, match="rows"):
        decode_kv_rows_bf16(rows[:, :600], slots)


def test_output_does_not_depend_on_the_physical_block_order():
    for name in ("dense128", "sparse4", "swa"):
        c = _case(**CASES[name])
        q, a = _call_args(c, perm_seed=1)
        _, b = _call_args(c, perm_seed=99)
        assert not np.array_equal(a["ori_block_table"], b["ori_block_table"])
        assert_same_bytes(ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **a)[0],
                          ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **b)[0], name)


def test_each_part_of_a_row_is_read():
    """Changing a window row's rope, one nope byte, or one scale byte changes the output;
    changing its pad does not."""
    c = _case(kind="swa", q_lens=[1], kv_lens=[40], seed=5)
    q, kw = _call_args(c)
    base = ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **kw)[0]
    blk = int(kw["ori_block_table"][0, 0])
    for byte, changes in ((0, True), (1, True), (300, True), (579, True), (600, False), (639, False)):
        cache = kw["ori_kv"].view(np.uint8).copy()
        cache[blk, 3, 0, byte] ^= 0x08
        out = ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **{**kw, "ori_kv": cache.view(FP8)})[0]
        assert (not np.array_equal(out, base)) == changes, byte


def test_rows_no_query_reads_are_not_decoded():
    """Rows outside every window and compressed rows no index names may hold any bytes (a 0xFF
    scale decodes to NaN): the output keeps its bytes."""
    c = _case(**CASES["sparse4"])
    q, kw = _call_args(c)
    base = ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **kw)[0]
    ori = kw["ori_kv"].view(np.uint8).copy()
    # request 0 (queries at 256..259): position 128, in the window's first block but before 256 - 127
    ori[int(kw["ori_block_table"][0, 4]), 0, 0, 576:583] = 0xFF
    cmp = kw["cmp_kv"].view(np.uint8).copy()
    named = {int(j) for j in c["idx"][:4].ravel() if j >= 0}
    unnamed = sorted(set(range(65)) - named)[:5]
    for j in unnamed:
        cmp[int(kw["cmp_block_table"][0, j // 16]), j % 16, 0, 576:583] = 0xFF
    got = ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **{**kw, "ori_kv": ori.view(FP8), "cmp_kv": cmp.view(FP8)})[0]
    assert_same_bytes(got, base)
    cmp[int(kw["cmp_block_table"][0, min(named) // 16]), min(named) % 16, 0, 576] = 0xFF  # a named row: NaN
    got = ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **{**kw, "ori_kv": ori.view(FP8), "cmp_kv": cmp.view(FP8)})[0]
    assert np.isnan(got.astype(np.float32)).any()


def _rejects(change, exc, match, name="sparse4"):
    c = _case(**CASES[name])
    q, kw = _call_args(c)
    q, kw = change(q, dict(kw))
    caches = {k: kw[k].copy() for k in ("ori_kv", "cmp_kv") if kw.get(k) is not None}
    with pytest.raises(exc, match=match):
        ops.npu_kv_quant_sparse_attn_sharedkv(q, kw.pop("kv_quant_mode", 1), **kw)
    for k, v in caches.items():
        assert_same_bytes(kw[k], v, k)


def _set(**changes):
    return lambda q, kw: (q, {**kw, **changes})


def _idx(change):
    def f(q, kw):
        idx = kw["cmp_sparse_indices"].copy()
        change(idx)
        return q, {**kw, "cmp_sparse_indices": idx}
    return f


def _a2a3_plan(q, kw):
    kw["metadata"] = ops.npu_sparse_attn_sharedkv_metadata(
        64, 1, D, cu_seqlens_q=kw["cu_seqlens_q"], seqused_kv=kw["seqused_kv"], batch_size=2, max_seqlen_q=4,
        max_seqlen_kv=260, cmp_topk=512, cmp_ratio=4, layout_q="TND")
    return q, kw


def _dense_plan(q, kw):
    c = _case(**CASES["sparse4"])
    kw["metadata"] = _plan(kw, c, cmp_topk=0)
    return q, kw


REJECTIONS = [
    (_set(kv_quant_mode=2), ModeError, r"^kv_quant_mode: expected 1 \(README"),
    (_set(tile_size=0), ModeError, r"^tile_size: expected 64 \(README"),
    (_set(tile_size=128), ModeError, "^tile_size: expected 64"),
    (_set(rope_head_dim=0), ModeError, "^rope_head_dim: expected 64"),
    (_set(sinks=None), ShapeError, r"^sinks: expected an fp32 \[64\] tensor \(README: sinks must be passed\)"),
    (_set(sinks=np.zeros(128, np.float32)), ShapeError, r"^sinks: expected shape \[64\]"),
    (_set(softmax_scale=0.0), ModeError, "^softmax_scale: expected a scale > 0"),
    (_set(cmp_ratio=16), ModeError, r"^cmp_ratio: expected 4 or 128"),
    (_set(ori_win_left=128), ModeError, "^ori_win_left: expected 127"),
    (_set(return_softmax_lse=True), ModeError, "^return_softmax_lse: expected False"),
    (_set(cu_seqlens_ori_kv=np.array([0, 260, 350], np.int32)), ModeError,
     r"^cu_seqlens_ori_kv: expected None \(reserved"),
    (_set(cu_seqlens_cmp_kv=np.array([0, 65, 87], np.int32)), ModeError, "^cu_seqlens_cmp_kv: expected None"),
    (_set(metadata=None), ShapeError, r"^metadata: expected the int32 \[1024\] plan of "
     "npu_kv_quant_sparse_attn_sharedkv_metadata"),
    (_set(metadata=np.zeros(1024, np.int32)), ModeError, "^metadata: expected a plan made by"),
    (_a2a3_plan, ModeError, "^metadata: expected a plan made by npu_kv_quant_sparse_attn_sharedkv_metadata"),
    (_dense_plan, ModeError, "^metadata: expected a plan built for this call's cmp_topk = 512"),
    (_idx(lambda i: i[0, 0].__setitem__(slice(0, 2), [-1, 3])), IndexRangeError,
     r"^cmp_sparse_indices\[token 0, 0, 1\] = 3: expected the valid indices first"),
    (_idx(lambda i: i.__setitem__((4, 0, 0), 22)), IndexRangeError, r"^cmp_sparse_indices\[token 4, 0, 0\] = 22"),
    (_set(cmp_sparse_indices=np.zeros((5, 1, 256), np.int32)), ShapeError,
     r"^cmp_sparse_indices: expected shape \[5, 1, K2\] \(K2 = 512 or 1024\)"),
    (lambda q, kw: (q[:, :32], kw), ShapeError, r"^q: expected shape \[T, N1, 512\] \(layout_q TND; N1 = 64 or 128"),
    (lambda q, kw: (q.astype(np.float16), kw), DTypeError, "^q: expected dtype bfloat16, got float16"),
    (lambda q, kw: (q, {**kw, "ori_kv": kw["ori_kv"].view(np.uint8)}), DTypeError,
     "^ori_kv: expected dtype float8_e4m3fn"),
    (lambda q, kw: (q, {**kw, "cmp_kv": np.ascontiguousarray(kw["cmp_kv"][..., :512])}), ShapeError,
     r"^cmp_kv: expected shape \[blocks, block_size, 1, 640\]"),
    (_set(seqused_kv=np.array([260, 0], np.int32)), ShapeError, r"^seqused_kv\[1\]: expected a kv count"),
]


@pytest.mark.parametrize("change,exc,match", REJECTIONS, ids=[m[:32] for _, _, m in REJECTIONS])
def test_every_argument_is_honoured_or_rejected_by_name(change, exc, match):
    _rejects(change, exc, match)


def test_swa_takes_cmp_ratio_1_only():
    _rejects(_set(cmp_ratio=0), ModeError, r"^cmp_ratio: expected 1 \(README: only 1 without cmp_kv", name="swa")
    _rejects(_set(cmp_ratio=4), ModeError, "^cmp_ratio: expected 1", name="swa")


def test_other_socs_are_rejected_naming_the_soc(monkeypatch):
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend910_9391")
    with pytest.raises(ModeError, match="^kv_quant_mode: When kv_quant_mode is 1 .*Ascend910_9391"):
        _rejects(lambda q, kw: (q, kw), ModeError, "unused")
    with pytest.raises(ModeError, match="^kv_quant_mode: When kv_quant_mode is 1"):
        ops.npu_kv_quant_sparse_attn_sharedkv_metadata(64, 1, D, 1, seqused_kv=np.array([5], np.int32),
                                                      batch_size=1, max_seqlen_q=1, max_seqlen_kv=5)


def test_metadata_words_and_what_it_accepts():
    c = _case(**CASES["sparse4"])
    kw = dict(cu_seqlens_q=np.array([0, 4, 5], np.int32), seqused_kv=np.array([260, 90], np.int32))
    plan = _plan(kw, c)
    assert plan.dtype == np.int32 and plan.shape == (1024,)
    words = dict(zip(kq.PLAN_FIELDS_950, plan[:len(kq.PLAN_FIELDS_950)].tolist(), strict=True))
    assert words["magic"] == 0x4B515331 and words["kv_quant_mode"] == 1 and words["cmp_topk"] == 512
    assert words["num_heads_q"] == 64 and words["cmp_ratio"] == 4 and not plan[len(kq.PLAN_FIELDS_950):].any()
    # vllm-ascend's A5 caller leaves tile_size / rope_head_dim at 0: the same plan
    assert_same_bytes(plan, _plan(kw, c, tile_size=64, rope_head_dim=64))
    for over, match in ((dict(num_heads_q=32), "^num_heads_q: expected 64 or 128"),
                        (dict(cmp_topk=2048), "^cmp_topk: expected 0 or 512 or 1024"),
                        (dict(tile_size=32), "^tile_size: expected 64 or 0"),
                        (dict(kv_quant_mode=0), "^kv_quant_mode: expected 1")):
        args = dict(num_heads_q=64, num_heads_kv=1, head_dim=D, kv_quant_mode=1, **kw, batch_size=2,
                    max_seqlen_q=4, max_seqlen_kv=260, cmp_topk=512, cmp_ratio=4, layout_q="TND")
        with pytest.raises(ModeError, match=match):
            ops.npu_kv_quant_sparse_attn_sharedkv_metadata(**{**args, **over})


# ------------------------------------------------------------------------------ torch namespaces
@pytest.fixture(scope="module")
def tnpu():
    import ascend_emu.torch_npu  # noqa: F401  (registers the namespaces)

    return torch.ops


def _t(a):
    if a is None or not isinstance(a, np.ndarray):
        return a
    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if a.dtype == FP8:
        return torch.from_numpy(a.view(np.uint8)).view(torch.float8_e4m3fn)
    return torch.from_numpy(a)


def test_namespaces_run_the_op(tnpu):
    c = _case(**CASES["sparse4"])
    q, kw = _call_args(c)
    want = ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **kw)[0]
    tk = {k: _t(v) for k, v in kw.items()}
    meta_kw = dict(cu_seqlens_q=tk["cu_seqlens_q"], seqused_kv=tk["seqused_kv"], batch_size=2, max_seqlen_q=4,
                   max_seqlen_kv=260, cmp_topk=512, cmp_ratio=4, layout_q="TND")
    # _C_ascend: not keyword-only after kv_quant_mode (vllm-ascend torch_binding.cpp)
    meta = tnpu._C_ascend.npu_kv_quant_sparse_attn_sharedkv_metadata(64, 1, D, 1, tk["cu_seqlens_q"], None, None,
                                                                     None, tk["seqused_kv"], 2, 4, 260, 0, 512, 0, 0, 4,
                                                                     layout_q="TND")
    out, lse = tnpu._C_ascend.npu_kv_quant_sparse_attn_sharedkv(
        _t(q), 1, tk["ori_kv"], tk["cmp_kv"], None, tk["cmp_sparse_indices"], tk["ori_block_table"],
        tk["cmp_block_table"], tk["cu_seqlens_q"], None, None, None, tk["seqused_kv"], tk["sinks"], meta, 64, 64,
        SCALE, 4, layout_q="TND")
    assert_same_bytes(out.view(torch.int16).numpy().view(BF16), want)
    assert tuple(lse.shape) == (0,) and lse.dtype == torch.float32
    meta = tnpu.custom.npu_kv_quant_sparse_attn_sharedkv_metadata(64, 1, D, 1, **meta_kw)
    out = tnpu.custom.npu_kv_quant_sparse_attn_sharedkv(_t(q), 1, **{**tk, "metadata": meta})[0]
    assert_same_bytes(out.view(torch.int16).numpy().view(BF16), want)
    with pytest.raises(RuntimeError):  # custom: keyword-only after kv_quant_mode
        tnpu.custom.npu_kv_quant_sparse_attn_sharedkv(_t(q), 1, tk["ori_kv"])


def test_fake_kernels_give_the_output_shapes(tnpu):
    q = torch.empty(5, 128, 512, dtype=torch.bfloat16, device="meta")
    out, lse = tnpu._C_ascend.npu_kv_quant_sparse_attn_sharedkv(q, 1)
    assert tuple(out.shape) == (5, 128, 512) and out.dtype == torch.bfloat16 and tuple(lse.shape) == (0,)
    meta = tnpu.custom.npu_kv_quant_sparse_attn_sharedkv_metadata(64, 1, 512, 1,
                                                                  seqused_kv=torch.empty(2, dtype=torch.int32,
                                                                                         device="meta"))
    assert tuple(meta.shape) == (1024,) and meta.dtype == torch.int32


def test_hw_backend_says_it_is_not_a_torch_npu_op():
    from ascend_emu.errors import BackendUnavailable

    c = _case(**CASES["swa"])
    q, kw = _call_args(c)
    with ops.backend("hw"), pytest.raises(BackendUnavailable, match="npu_kv_quant_sparse_attn_sharedkv is not a "
                                                                     "torch_npu op"):
        ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **kw)
