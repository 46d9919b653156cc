"""DeepSeek-V4 shared-KV sparse attention (``ascend_emu.ops.sparse_attn_sharedkv``, the
``_C_ascend`` / ``custom`` bindings) against the independent float64 reference
(tests/reference/sparse_attn_sharedkv.py): SWA, HCA and CSA over paged caches, the metadata plan,
every argument honoured or rejected by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ascend_emu import ops
from ascend_emu.errors import BackendUnavailable, DTypeError, IndexRangeError, ModeError, ShapeError
from ascend_emu.ops import sparse_attn_sharedkv as skv
from ascend_emu.quant import BF16
from tests.helpers import assert_same_bytes, bit_identical_share, dual_threshold_ok
from tests.reference import sparse_attn_sharedkv as ref

N, D = 64, 512
SCALE = D ** -0.5


def _page(rows_per_req, block_size, rng, extra_blocks=2):
    """Logical rows (list over requests of ``[S, D]``) -> a PA_ND cache ``[blocks, bs, 1, D]`` with
    the blocks in a random physical order, and its int32 block table ``[B, W]``."""
    need = [max(1, -(-len(r) // block_size)) for r in rows_per_req]
    total = sum(need) + extra_blocks
    perm = rng.permutation(total)
    cache = rng.uniform(-30, 30, (total, block_size, 1, D)).astype(BF16)  # unread rows: garbage
    width = max(need) + 1
    table = np.full((len(rows_per_req), width), -7, np.int32)  # unread entries: out of range
    k = 0
    for b, rows in enumerate(rows_per_req):
        for j in range(need[b]):
            blk = int(perm[k])
            k += 1
            table[b, j] = blk
            part = rows[j * block_size:(j + 1) * block_size]
            cache[blk, :len(part), 0] = part
    return cache, table


def _case(kind, q_lens, kv_lens, *, seed=0, layout="TND", ori_bs=32, cmp_bs=16, sinks="random",
          q_range=3.0):
    rng = np.random.default_rng(seed)
    t = sum(q_lens)
    q = rng.uniform(-q_range, q_range, (t, N, D)).astype(BF16)
    ori = [rng.uniform(-1, 1, (s, D)).astype(BF16) for s in kv_lens]
    ratio = {"swa": 1, "hca": 128, "csa": 4}[kind]
    cmp = None if kind == "swa" else [rng.uniform(-1, 1, (s // ratio, D)).astype(BF16) for s in kv_lens]
    idx = None
    if kind == "csa":
        idx = np.full((t, skv.CMP_TOPK), -1, np.int32)
        for i, (_, p) in enumerate(ref.positions(q_lens, kv_lens)):
            vis = (p + 1) // ratio
            pick = rng.permutation(vis)[:min(vis, 40)]
            slots = np.sort(rng.choice(skv.CMP_TOPK, pick.size, replace=False))
            idx[i, slots] = pick
    sk = None if sinks is None else (rng.uniform(-2, 2, N).astype(np.float32) if sinks == "random"
                                     else np.full(N, sinks, np.float32))
    return dict(kind=kind, q=q, ori=ori, cmp=cmp, idx=idx, sinks=sk, ratio=ratio, q_lens=list(q_lens),
                kv_lens=list(kv_lens), layout=layout, ori_bs=ori_bs, cmp_bs=cmp_bs, seed=seed)


def _call_args(c, *, perm_seed=1):
    rng = np.random.default_rng(perm_seed)
    b = len(c["q_lens"])
    ori_kv, ori_table = _page(c["ori"], c["ori_bs"], rng)
    kw = dict(ori_kv=ori_kv, ori_block_table=ori_table, seqused_kv=np.array(c["kv_lens"], np.int32),
              sinks=c["sinks"], softmax_scale=SCALE, cmp_ratio=c["ratio"], ori_win_left=127,
              layout_q=c["layout"], layout_kv="PA_ND")
    q, idx = c["q"], c["idx"]
    if c["layout"] == "TND":
        kw["cu_seqlens_q"] = np.concatenate([[0], np.cumsum(c["q_lens"])]).astype(np.int32)
        if idx is not None:
            idx = idx.reshape(-1, 1, skv.CMP_TOPK)
    else:
        s = c["q_lens"][0]
        q = q.reshape(b, s, N, D)
        if idx is not None:
            idx = idx.reshape(b, s, 1, skv.CMP_TOPK)
    if c["cmp"] is not None:
        kw["cmp_kv"], kw["cmp_block_table"] = _page(c["cmp"], c["cmp_bs"], rng)
    kw["cmp_sparse_indices"] = idx
    kw["metadata"] = _plan(kw, c)
    return q, kw


def _plan(kw, c):
    csa = c["kind"] == "csa"
    return ops.npu_sparse_attn_sharedkv_metadata(
        N, 1, D, cu_seqlens_q=kw.get("cu_seqlens_q"), seqused_kv=kw["seqused_kv"],
        batch_size=len(c["q_lens"]), max_seqlen_q=max(c["q_lens"]), max_seqlen_kv=max(c["kv_lens"]),
        cmp_topk=skv.CMP_TOPK if csa else 0, cmp_ratio=c["ratio"], layout_q=c["layout"],
        has_cmp_kv=c["cmp"] is not None)


def _golden(c):
    return ref.sparse_attn_sharedkv(c["q"], c["ori"], c["cmp"], c["q_lens"], c["kv_lens"], SCALE,
                                    ratio=c["ratio"], indices=c["idx"], sinks=c["sinks"])


CASES = {
    # several blocks, windows crossing block boundaries, a query at position < 127
    "swa": dict(kind="swa", q_lens=[3, 2, 1], kv_lens=[200, 60, 129]),
    "hca": dict(kind="hca", q_lens=[2, 3], kv_lens=[300, 383]),   # positions 381, 382 cross 3 * 128
    "csa": dict(kind="csa", q_lens=[4, 1], kv_lens=[260, 90]),
    "csa_bsnd": dict(kind="csa", q_lens=[2, 2], kv_lens=[150, 40], layout="BSND", ori_bs=16, cmp_bs=32),
    "hca_no_sinks": dict(kind="hca", q_lens=[1], kv_lens=[700], sinks=None, ori_bs=64),
    "swa_sinks_above_max": dict(kind="swa", q_lens=[2], kv_lens=[90], sinks=40.0),
}
#: Bit-identical share against the float64 reference rounded to bf16: measured 0.628 .. 0.640 over
#: CASES (P rounded to bf16 before P @ K, as the emulator reads the kernel), asserted with a margin
#: on both sides (an unrounded P measures about 0.99: it would fail the upper bound).
SHARE_RANGE = (0.60, 0.70)


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request):
    c = _case(**CASES[request.param])
    q, kw = _call_args(c)
    out, lse = ops.npu_sparse_attn_sharedkv(q, **kw)
    return request.param, c, q, kw, out, lse


def test_within_the_dual_criterion_with_the_measured_bit_identical_share(run):
    name, c, q, _kw, out, lse = run
    assert out.shape == q.shape and out.dtype == BF16
    assert lse.shape == (0,) and lse.dtype == np.float32
    gold = _golden(c)
    got = out.reshape(gold.shape)
    assert dual_threshold_ok(got, gold, 0.005), name
    share = bit_identical_share(got, gold.astype(np.float32).astype(BF16))
    if name != "swa_sinks_above_max":  # outputs ~1e-17 there: every emulated digit is P's rounding
        assert SHARE_RANGE[0] <= share <= SHARE_RANGE[1], (name, share)


def test_fp16_query_and_caches():
    c = _case(**CASES["hca"])
    c = {**c, "q": c["q"].astype(np.float16), "ori": [r.astype(np.float16) for r in c["ori"]],
         "cmp": [r.astype(np.float16) for r in c["cmp"]]}
    q, kw = _call_args(c)
    kw["ori_kv"], kw["cmp_kv"] = kw["ori_kv"].astype(np.float16), kw["cmp_kv"].astype(np.float16)
    out = ops.npu_sparse_attn_sharedkv(q, **kw)[0]
    assert out.dtype == np.float16
    assert dual_threshold_ok(out, _golden(c), 0.005)


def test_sinks_above_the_max_score_shrink_the_output():
    c = _case(**CASES["swa_sinks_above_max"])
    q, kw = _call_args(c)
    out = ops.npu_sparse_attn_sharedkv(q, **kw)[0].astype(np.float32)
    kw0 = dict(kw, sinks=None)
    plain = ops.npu_sparse_attn_sharedkv(q, **kw0)[0].astype(np.float32)
    gold = _golden(c)
    assert np.abs(out).max() < 1e-3 * np.abs(plain).max()   # exp(40 - max) dominates the denominator
    assert dual_threshold_ok(out, gold, 0.005)


def test_output_does_not_depend_on_the_physical_block_order():
    """vllm-ascend #14013: the same logical kv in other physical blocks gives the same bytes."""
    for name in ("hca", "csa", "swa"):
        c = _case(**CASES[name])
        q, a = _call_args(c, perm_seed=1)
        _, b = _call_args(c, perm_seed=99)
        assert not np.array_equal(a["ori_block_table"], b["ori_block_table"])
        assert_same_bytes(ops.npu_sparse_attn_sharedkv(q, **a)[0], ops.npu_sparse_attn_sharedkv(q, **b)[0], name)


def test_a_token_gives_the_same_bytes_alone_as_among_others(monkeypatch):
    """The CPU kernel runs the call's tokens together, padding each tile to 128 places: a token's
    output does not depend on the others (HCA, and CSA with 2 and 4 tiles in one call; the
    indices' -1 entries anywhere)."""
    from dataclasses import replace

    from ascend_emu.emu import sparse_attn_sharedkv as emu_skv

    real, seen = skv.prepare, []

    def capture(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    for name, case in (("hca", CASES["hca"]), ("csa", dict(kind="csa", q_lens=[2, 1], kv_lens=[1100, 90]))):
        c = _case(**case)
        if name == "csa":  # token 0 (position 1098, 274 visible rows) names 270 of them: 3 tiles
            c["idx"][0] = -1
            c["idx"][0, 100:370] = np.arange(270)
        q, kw = _call_args(c)
        monkeypatch.setattr(skv, "prepare", capture)
        together = ops.npu_sparse_attn_sharedkv(q, **kw)[0].reshape(-1, 64, D)
        monkeypatch.setattr(skv, "prepare", real)
        args = seen[-1]
        if name == "csa":  # 3 compressed tiles against 1
            assert len(set(-(-(args.cmp_indices >= 0).sum(axis=1) // 128))) > 1
        for i in range(together.shape[0]):
            one = replace(args, q=args.q[i:i + 1], token_batch=args.token_batch[i:i + 1],
                          token_pos=args.token_pos[i:i + 1],
                          cmp_indices=None if args.cmp_indices is None else args.cmp_indices[i:i + 1])
            assert_same_bytes(emu_skv.sparse_attn_sharedkv(one).out[0], together[i], f"{name} token {i}")


def test_table_entries_before_every_window_are_not_read():
    """Blocks no window reaches (freed SWA blocks) may hold any id; the ones a window reads are checked."""
    c = _case(**CASES["swa"])  # request 0: kv 200, 3 queries: positions 70.. read, blocks 0 and 1 not
    q, kw = _call_args(c)
    base = ops.npu_sparse_attn_sharedkv(q, **kw)[0]
    table = kw["ori_block_table"].copy()
    table[0, :2] = -1
    assert_same_bytes(ops.npu_sparse_attn_sharedkv(q, **{**kw, "ori_block_table": table})[0], base)
    table[0, 2] = -1
    with pytest.raises(IndexRangeError, match=r"^ori_block_table\[0, 2\] = -1"):
        ops.npu_sparse_attn_sharedkv(q, **{**kw, "ori_block_table": table})


def test_window_is_127_back_and_compressed_rows_are_causal():
    """Changing a row just outside the window changes nothing; changing the oldest window row, the
    newest, or the last visible compressed row does; (p + 1) // 128 rows are visible."""
    c = _case(kind="hca", q_lens=[1], kv_lens=[256 + 127], seed=3)  # p = 382: window 255..382, cmp rows 0, 1
    q, kw = _call_args(c)
    base = ops.npu_sparse_attn_sharedkv(q, **kw)[0]

    def changed(which, row):
        c2 = {**c, "ori": [c["ori"][0].copy()], "cmp": [c["cmp"][0].copy()]}
        c2[which][0][row] = np.full(D, 7.0, np.float32).astype(BF16)
        q2, kw2 = _call_args(c2)
        return not np.array_equal(ops.npu_sparse_attn_sharedkv(q2, **kw2)[0], base)

    assert not changed("ori", 254) and changed("ori", 255) and changed("ori", 382)
    assert changed("cmp", 1)
    c3 = _case(kind="hca", q_lens=[1], kv_lens=[384], seed=3)  # p = 383: (383 + 1) // 128 = 3 rows
    assert len(c3["cmp"][0]) == 3
    q3, kw3 = _call_args(c3)
    gold = _golden(c3)
    assert dual_threshold_ok(ops.npu_sparse_attn_sharedkv(q3, **kw3)[0].reshape(gold.shape), gold, 0.005)


def test_arguments_without_effect_are_accepted_and_ignored():
    c = _case(**CASES["csa"])
    q, kw = _call_args(c)
    base = ops.npu_sparse_attn_sharedkv(q, **kw)[0]
    t = q.shape[0]
    extra = dict(cu_seqlens_ori_kv=np.array([0, 260, 350], np.int32), cu_seqlens_cmp_kv=np.array([0, 65, 87], np.int32),
                 seqused_q=np.array([4, 1], np.int32), ori_sparse_indices=np.zeros((t, 1, 512), np.int32))
    assert_same_bytes(ops.npu_sparse_attn_sharedkv(q, **kw, **extra)[0], base)


def test_metadata_plan_words():
    cu = np.array([0, 3, 5], np.int32)
    kv = np.array([200, 60], np.int32)
    plan = ops.npu_sparse_attn_sharedkv_metadata(64, 1, 512, cu_seqlens_q=cu, seqused_kv=kv, batch_size=2,
                                                 max_seqlen_q=3, max_seqlen_kv=300, cmp_topk=512, cmp_ratio=4,
                                                 layout_q="TND", device="npu:0")
    assert plan.dtype == np.int32 and plan.shape == (1024,)
    words = dict(zip(skv.PLAN_FIELDS, plan[:len(skv.PLAN_FIELDS)].tolist(), strict=True))
    assert words["magic"] == 0x534B5631 and words["batch_size"] == 2 and words["cmp_ratio"] == 4
    assert words["cmp_topk"] == 512 and words["layout_q"] == 1 and words["max_seqlen_kv"] == 300
    assert not plan[len(skv.PLAN_FIELDS):].any()
    again = ops.npu_sparse_attn_sharedkv_metadata(64, 1, 512, cu_seqlens_q=cu, seqused_kv=kv, batch_size=2,
                                                  max_seqlen_q=3, max_seqlen_kv=300, cmp_topk=512, cmp_ratio=4,
                                                  layout_q="TND")
    assert_same_bytes(plan, again)


def _rejects(kw_change, exc, match, name="csa"):
    c = _case(**CASES[name])
    q, kw = _call_args(c)
    q, kw = kw_change(q, dict(kw))
    with pytest.raises(exc, match=match):
        ops.npu_sparse_attn_sharedkv(q, **kw)


def _cu_bad(q, kw):
    kw["cu_seqlens_q"] = np.array([0, 4, 3], np.int32)
    return q, kw


def _plan_other(q, kw):
    kw["metadata"] = ops.npu_sparse_attn_sharedkv_metadata(
        64, 1, 512, cu_seqlens_q=kw["cu_seqlens_q"], seqused_kv=np.array([260, 91], np.int32), batch_size=2,
        max_seqlen_q=4, max_seqlen_kv=300, cmp_topk=512, cmp_ratio=4, layout_q="TND")
    return q, kw


def _plan_hca(q, kw):
    kw["metadata"] = ops.npu_sparse_attn_sharedkv_metadata(
        64, 1, 512, cu_seqlens_q=kw["cu_seqlens_q"], seqused_kv=kw["seqused_kv"], batch_size=2,
        max_seqlen_q=4, max_seqlen_kv=300, cmp_topk=0, cmp_ratio=128, layout_q="TND")
    return q, kw


def _idx(change):
    def f(q, kw):
        idx = kw["cmp_sparse_indices"].copy()
        change(idx)
        kw["cmp_sparse_indices"] = idx
        return q, kw
    return f


def _set(**changes):
    return lambda q, kw: (q, {**kw, **changes})


def _table_bad(q, kw):
    table = kw["ori_block_table"].copy()
    table[1, 0] = kw["ori_kv"].shape[0]
    return q, {**kw, "ori_block_table": table}


REJECTIONS = [
    (_set(ori_win_left=128), ModeError, r"^ori_win_left: expected 127 \(the only value the README supports"),
    (_set(ori_win_right=1), ModeError, "^ori_win_right: expected 0"),
    (_set(ori_mask_mode=3), ModeError, "^ori_mask_mode: expected 4"),
    (_set(cmp_mask_mode=4), ModeError, "^cmp_mask_mode: expected 3"),
    (_set(layout_kv="BSND"), ModeError, "^layout_kv: expected 'PA_ND'"),
    (_set(layout_q="BNSD"), ModeError, "^layout_q: expected one of"),
    (_set(return_softmax_lse=True), ModeError, "^return_softmax_lse: expected False"),
    (_set(softmax_scale=0.0), ModeError, "^softmax_scale: expected a scale > 0"),
    (_set(cmp_ratio=128), ModeError, r"^cmp_ratio: expected 4"),
    (_set(metadata=None), ShapeError, r"^metadata: expected the int32 \[1024\] plan"),
    (_set(metadata=np.zeros(1024, np.int32)), ModeError, "^metadata: expected a plan made by"),
    (_set(metadata=np.zeros(512, np.int32)), ShapeError, r"^metadata: expected shape \[1024\]"),
    (_plan_other, ModeError, "^metadata: expected a plan built for this call's crc_seqused_kv"),
    (_plan_hca, ModeError, "^metadata: expected a plan built for this call's cmp_ratio = 4"),
    (_cu_bad, ShapeError, r"^cu_seqlens_q\[2\]: expected a non-decreasing prefix sum \(the NPU reads out of bounds"),
    (_set(cu_seqlens_q=None), ShapeError, "^cu_seqlens_q: expected a tensor"),
    (_set(seqused_kv=np.array([260, 0], np.int32)), ShapeError, r"^seqused_kv\[1\]: expected a kv count"),
    (_set(sinks=np.zeros(32, np.float32)), ShapeError, r"^sinks: expected shape \[64\]"),
    (_set(sinks=np.full(64, np.inf, np.float32)), ModeError, "^sinks: expected finite"),
    (_set(ori_kv=None), ShapeError, "^ori_kv: expected a tensor"),
    (_table_bad, IndexRangeError, r"^ori_block_table\[1, 0\]"),
    (_set(cmp_block_table=None), ShapeError, "^cmp_block_table: expected an int32"),
    (_idx(lambda i: i.__setitem__((4, 0, 0), 22)), IndexRangeError, r"^cmp_sparse_indices\[token 4, 0, 0\] = 22"),
    (_idx(lambda i: i.__setitem__((0, 0, 0), -2)), IndexRangeError, r"^cmp_sparse_indices\[token 0"),
    (_idx(lambda i: i[0, 0].__setitem__(slice(0, 2), 5)), IndexRangeError, "expected distinct compressed rows"),
    (_set(cmp_sparse_indices=np.zeros((5, 1, 256), np.int32)), ShapeError, r"^cmp_sparse_indices: expected shape"),
    (lambda q, kw: (q[:, :32], kw), ShapeError, r"^q: expected shape \[T, 64, 512\]"),
    (lambda q, kw: (q.astype(np.float32), kw), DTypeError, "^q: expected dtype bfloat16 or float16"),
    (lambda q, kw: (q, {**kw, "ori_kv": kw["ori_kv"].astype(np.float16)}), DTypeError, "^ori_kv: expected q's dtype"),
    (lambda q, kw: (q, {**kw, "ori_kv": np.ascontiguousarray(kw["ori_kv"][:, :24])}), ShapeError,
     r"^ori_kv block_size \(shape\[1\]\): expected a multiple of 16"),
    (_set(cu_seqlens_ori_kv=np.zeros(3, np.int64)), DTypeError, "^cu_seqlens_ori_kv: expected dtype int32"),
]


@pytest.mark.parametrize("change,exc,match", REJECTIONS, ids=[m[:32] for _, _, m in REJECTIONS])
def test_every_argument_is_honoured_or_rejected_by_name(change, exc, match):
    _rejects(change, exc, match)


def test_swa_rejects_compressed_arguments():
    _rejects(_set(cmp_ratio=4), ModeError, r"^cmp_ratio: expected 0 or 1", name="swa")
    _rejects(_set(cmp_sparse_indices=np.zeros((6, 1, 512), np.int32)), ShapeError,
             "^cmp_sparse_indices: expected None without cmp_kv", name="swa")


@pytest.mark.parametrize("kw,exc,match", [
    (dict(num_heads_q=32), ModeError, "^num_heads_q: expected 64"),
    (dict(ori_win_left=128), ModeError, "^ori_win_left: expected 127"),
    (dict(cmp_topk=2048), ModeError, "^cmp_topk: expected 512"),
    (dict(cmp_ratio=16), ModeError, "^cmp_ratio: expected 4 or 128"),
    (dict(ori_topk=512), ModeError, "^ori_topk: expected 0"),
    (dict(batch_size=3), ModeError, "^batch_size: expected 2"),
    (dict(max_seqlen_kv=100), ModeError, "^max_seqlen_kv: expected an int in"),
    (dict(cu_seqlens_q=np.array([0, 3, 2], np.int32)), ShapeError, r"^cu_seqlens_q\[2\]: expected a non-decreasing"),
    (dict(has_ori_kv=False), ModeError, "^has_ori_kv: expected True"),
    (dict(layout_kv="BSND"), ModeError, "^layout_kv"),
])
def test_metadata_rejects_by_name(kw, exc, match):
    base = dict(num_heads_q=64, num_heads_kv=1, head_dim=512, cu_seqlens_q=np.array([0, 3, 5], np.int32),
                seqused_kv=np.array([200, 60], np.int32), batch_size=2, max_seqlen_q=3, max_seqlen_kv=300,
                cmp_topk=512, cmp_ratio=4, layout_q="TND")
    with pytest.raises(exc, match=match):
        ops.npu_sparse_attn_sharedkv_metadata(**{**base, **kw})


def test_rejected_on_the_ascend950(monkeypatch):
    """README: Atlas A2 / A3 only; the 950 has npu_kv_quant_sparse_attn_sharedkv."""
    c = _case(**CASES["swa"])
    q, kw = _call_args(c)
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    with pytest.raises(ModeError, match="not supported on the Ascend 950 .*npu_kv_quant_sparse_attn_sharedkv"):
        ops.npu_sparse_attn_sharedkv(q, **kw)


def test_hw_backend_says_it_is_not_a_torch_npu_op():
    c = _case(**CASES["swa"])
    q, kw = _call_args(c)
    with ops.backend("hw"), pytest.raises(BackendUnavailable, match="not a torch_npu op"):
        ops.npu_sparse_attn_sharedkv(q, **kw)


# ------------------------------------------------------------------------------ torch namespaces
@pytest.fixture(scope="module")
def tnpu():
    import ascend_emu.torch_npu  # noqa: F401  (registers the namespaces)

    return torch.ops


def _t(a):
    if a is None:
        return None
    a = np.asarray(a)
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == BF16 else torch.from_numpy(a)


def _n(t):
    return t.view(torch.int16).numpy().view(BF16) if t.dtype == torch.bfloat16 else t.numpy()


def test_namespaces_run_the_op(tnpu):
    c = _case(**CASES["csa"])
    q, kw = _call_args(c)
    want = ops.npu_sparse_attn_sharedkv(q, **kw)[0]
    tk = {k: _t(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    for ns in (tnpu._C_ascend, tnpu.custom):
        meta = ns.npu_sparse_attn_sharedkv_metadata(
            64, 1, 512, cu_seqlens_q=tk["cu_seqlens_q"], seqused_kv=tk["seqused_kv"], batch_size=2, max_seqlen_q=4,
            max_seqlen_kv=260, cmp_topk=512, cmp_ratio=4, ori_win_left=127, layout_q="TND")
        out, lse = ns.npu_sparse_attn_sharedkv(_t(q), **{**tk, "metadata": meta})
        assert_same_bytes(_n(out), want)
        assert tuple(lse.shape) == (0,) and lse.dtype == torch.float32
    tk.pop("ori_win_left")
    with pytest.raises(ModeError, match="^ori_win_left: expected 127"):  # _C_ascend's default is 128
        tnpu._C_ascend.npu_sparse_attn_sharedkv(_t(q), **tk)
    with pytest.raises(ModeError, match="^ori_win_left: expected 127"):
        tnpu._C_ascend.npu_sparse_attn_sharedkv_metadata(64, 1, 512, seqused_kv=tk["seqused_kv"], batch_size=2,
                                                         max_seqlen_q=4, max_seqlen_kv=260, cmp_topk=512)
    assert tnpu.custom.npu_sparse_attn_sharedkv.default._schema.arguments[-5].default_value == 127


def test_fake_kernels_give_the_output_shapes(tnpu):
    q = torch.empty(5, 64, 512, dtype=torch.bfloat16, device="meta")
    out, lse = tnpu._C_ascend.npu_sparse_attn_sharedkv(q, ori_win_left=127)
    assert tuple(out.shape) == (5, 64, 512) and out.dtype == torch.bfloat16 and tuple(lse.shape) == (0,)
    kv = torch.empty(2, dtype=torch.int32, device="meta")
    meta = tnpu.custom.npu_sparse_attn_sharedkv_metadata(64, 1, 512, seqused_kv=kv)
    assert tuple(meta.shape) == (1024,) and meta.dtype == torch.int32
