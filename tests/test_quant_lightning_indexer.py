"""npu_quant_lightning_indexer (A2 / A3 int8 path) against the plain-loop reference
(tests/reference/quant_lightning_indexer.py).

Every score is computed with the kernel's fp16 staging (``fp16(w * qs)``, ``fp16(relu(dot) /
1024)``) and an fp32 head sum in head order on both sides, so indices must equal the reference
exactly. Some cases are built so that the staging decides the order: the reference run without
one of the two roundings selects other positions there, which the test asserts first, so an
emulator that skipped a rounding would fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DTypeError, IndexRangeError, ModeError, ShapeError
from tests.reference.quant_lightning_indexer import quant_lightning_indexer as qli_ref

D = 128
F16 = np.dtype(np.float16)
LAYOUTS = [("BSND", "BSND"), ("TND", "TND"), ("BSND", "PA_BSND"), ("TND", "PA_BSND")]


# ---------------------------------------------------------------------- cases
def make_case(rng, layout_q, layout_k, q_lens, kv_lens, *, n1=8, s1=None, s2=None, block_size=16, qrange=128,
              wrange=(0.0, 0.01), srange=(0.0, 10.0)):
    """Inputs and kwargs of one call (the golden's distributions by default: int8 in [-128, 127],
    weights in [0, 0.01), scales in [0, 10)). BSND pads each batch to s1 / s2 rows; PA_BSND
    scatters every batch's blocks over a shuffled cache with two spare blocks, -1 past the needed
    table entries."""
    b = len(q_lens)
    kw = dict(layout_query=layout_q, layout_key=layout_k)

    def ints(shape):
        return rng.integers(-qrange, qrange, shape).astype(np.int8)

    if layout_q == "BSND":
        lead = (b, s1 or max(q_lens))
        kw["actual_seq_lengths_query"] = np.array(q_lens, np.int32)
    else:
        lead = (sum(q_lens),)
        kw["actual_seq_lengths_query"] = np.cumsum(q_lens).astype(np.int32)
    query = ints((*lead, n1, D))
    weights = rng.uniform(*wrange, (*lead, n1)).astype(F16)
    qs = rng.uniform(*srange, (*lead, n1)).astype(F16)
    if layout_k == "BSND":
        key = ints((b, s2 or max(kv_lens), 1, D))
        kw["actual_seq_lengths_key"] = np.array(kv_lens, np.int32)
    elif layout_k == "TND":
        key = ints((sum(kv_lens), 1, D))
        kw["actual_seq_lengths_key"] = np.cumsum(kv_lens).astype(np.int32)
    else:
        need = [-(-n // block_size) for n in kv_lens]
        blocks = sum(need) + 2
        key = ints((blocks, block_size, 1, D))
        perm = rng.permutation(blocks)
        table = np.full((b, max(need) + 1), -1, np.int32)
        used = 0
        for i, n in enumerate(need):
            table[i, :n] = perm[used:used + n]
            used += n
        kw["block_table"] = table
        kw["actual_seq_lengths_key"] = np.array(kv_lens, np.int32)
    ks = rng.uniform(*srange, key.shape[:-1]).astype(F16)
    return [query, key, weights, qs, ks], kw


def run(inputs, kw, sparse_count, sparse_mode):
    return ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=sparse_count, sparse_mode=sparse_mode, **kw)


def check(out, ref):
    idx, scores = ref
    assert out.dtype == np.int32 and out.shape == idx.shape
    k = out.shape[-1]
    flat, want = out.reshape(-1, k), idx.reshape(-1, k)
    for t in range(flat.shape[0]):
        np.testing.assert_array_equal(flat[t], want[t], err_msg=f"token {t}")
        if scores[t] is None:
            assert (flat[t] == -1).all()
        else:
            n = min(k, len(scores[t]))
            assert (flat[t, n:] == -1).all() and (flat[t, :n] >= 0).all()


# ---------------------------------------------------------------------- sweeps
# (q_lens, kv_lens, sparse_count): decode, MTP, k past every kv length, an empty batch, kv shorter
# than q (causal rows with no visible key).
SHAPES = [
    ([1, 1], [37, 70], 24),
    ([3, 1], [40, 25], 16),
    ([2, 0, 3], [20, 30, 0], 8),
    ([4, 2], [3, 48], 64),
]


@pytest.mark.parametrize("layout_q,layout_k", LAYOUTS)
@pytest.mark.parametrize("sparse_mode", [0, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"q{s[0]}-kv{s[1]}-k{s[2]}")
def test_matches_reference(layout_q, layout_k, sparse_mode, shape):
    q_lens, kv_lens, k = shape
    rng = np.random.default_rng(len(q_lens) * 100 + sum(kv_lens) + sparse_mode)
    inputs, kw = make_case(rng, layout_q, layout_k, q_lens, kv_lens)
    check(run(inputs, kw, k, sparse_mode), qli_ref(*inputs, sparse_count=k, sparse_mode=sparse_mode, **kw))


def test_64_heads_decode_matches_reference():
    """DeepSeek-V3.2's 64 indexer heads, the golden's PA_BSND block size 128."""
    rng = np.random.default_rng(1)
    inputs, kw = make_case(rng, "BSND", "PA_BSND", [1, 1], [130, 60], n1=64, block_size=128)
    check(run(inputs, kw, 32, 3), qli_ref(*inputs, sparse_count=32, sparse_mode=3, **kw))


@pytest.mark.parametrize("stage,n1,seed", [("s", 4, 4), ("ws", 2, 3)])
def test_fp16_staging_decides_the_order_on_golden_like_data(stage, n1, seed):
    """Golden-like random data (seeds picked) where skipping the fp16 rounding of
    ``relu(dot) / 1024`` (s) or of ``w * qs`` (ws) selects other positions (checked on the
    reference first): the op must select what the staged chain selects."""
    rng = np.random.default_rng(seed)
    inputs, kw = make_case(rng, "TND", "PA_BSND", [2, 1], [120, 90], n1=n1)
    staged = qli_ref(*inputs, sparse_count=40, sparse_mode=0, **kw)
    unstaged = qli_ref(*inputs, sparse_count=40, sparse_mode=0, **kw, **{f"stage_{stage}": False})
    assert not np.array_equal(staged[0], unstaged[0])  # the data tells the two chains apart
    check(run(inputs, kw, 40, 0), staged)


def test_fp16_product_of_weights_and_query_scale_decides_the_order():
    """Head 0 alone scores key 0, head 1 alone key 1, with the same exact fp16 staged dot 6.25.
    w * qs is 1 for head 0 and (1 + 2**-10) * (1 - 2**-11) = 1 + 2**-11 - 2**-21 for head 1, which
    rounds to 1 in fp16: the keys tie (position order); without the rounding key 1 would lead."""
    query = np.zeros((1, 1, 2, D), np.int8)
    query[0, 0, 0, :64] = 1
    query[0, 0, 1, 64:] = 1
    key = np.zeros((1, 2, 1, D), np.int8)
    key[0, 0, 0, :64] = 100
    key[0, 1, 0, 64:] = 100
    w = np.array([1.0, 1.0 + 2.0 ** -10], F16).reshape(1, 1, 2)
    qs = np.array([1.0, 1.0 - 2.0 ** -11], F16).reshape(1, 1, 2)
    inputs = [query, key, w, qs, np.ones((1, 2, 1), F16)]
    assert qli_ref(*inputs, sparse_count=2, sparse_mode=0)[0].reshape(-1).tolist() == [0, 1]
    assert qli_ref(*inputs, sparse_count=2, sparse_mode=0, stage_ws=False)[0].reshape(-1).tolist() == [1, 0]
    out = ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=2, sparse_mode=0)
    assert out.reshape(-1).tolist() == [0, 1]


def test_fp16_rounding_of_the_dot_makes_ties_lower_index_first():
    """One head, w = qs = ks = 1, query all ones: dots 12000, 12003 and 12001 all round to the
    fp16 11.71875 (spacing 2**-7 = 8 / 1024 there), so the three keys tie and keep position order;
    without the rounding 12003 and 12001 would lead. Key 3's dot 16000 leads either way."""
    query = np.ones((1, 1, 1, D), np.int8)
    key = np.zeros((1, 4, 1, D), np.int8)
    for p, dot in enumerate((12000, 12003, 12001, 16000)):
        full, rest = divmod(dot, 127)  # the key row sums to dot
        key[0, p, 0, :full] = 127
        key[0, p, 0, full] = rest
    one = np.ones((1, 1, 1), F16)
    inputs = [query, key, one, one.copy(), np.ones((1, 4, 1), F16)]
    assert qli_ref(*inputs, sparse_count=4, sparse_mode=0)[0].reshape(-1).tolist() == [3, 0, 1, 2]
    assert qli_ref(*inputs, sparse_count=4, sparse_mode=0, stage_s=False)[0].reshape(-1).tolist() == [3, 1, 2, 0]
    out = ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=4, sparse_mode=0)
    assert out.reshape(-1).tolist() == [3, 0, 1, 2]


def test_the_compiled_fp16_staging_is_the_fp16_cast_for_every_integer_dot():
    """The kernel's branch-free staging of an exact dot (emu ``_stage_f16``) against NumPy's fp16
    cast of ``relu(d) * 2**-10``, for every integer ``d`` from -2**21 to 2**24 (D <= 1024 int8
    products stay within it): the same fp32 bits, ties to even included."""
    from numba import njit

    from ascend_emu.emu.quant_lightning_indexer import _stage_f16

    @njit(cache=False)
    def stage_all(d, out):
        for i in range(d.size):
            out[i] = _stage_f16(d[i])

    d = np.arange(-2**21, 2**24 + 1, dtype=np.int64).astype(np.float32)  # exact in fp32
    got = np.empty_like(d)
    stage_all(d, got)
    want = (np.maximum(d, np.float32(0)) * np.float32(2.0 ** -10)).astype(np.float16).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_negative_dots_relu_to_zero_and_tie():
    """relu: keys with negative dots all score 0 and follow the positive ones in position order."""
    query = np.ones((1, 1, 2, D), np.int8)
    key = np.zeros((1, 6, 1, D), np.int8)
    for p, v in enumerate((-3, 5, -1, 0, 2, -7)):
        key[0, p, 0, :] = v
    w = np.ones((1, 1, 2), F16)
    inputs = [query, key, w, w.copy(), np.full((1, 6, 1), 0.5, F16)]
    out = ops.npu_quant_lightning_indexer(*inputs, 0, 0, sparse_count=8, sparse_mode=0)
    assert out.reshape(-1).tolist() == [1, 4, 0, 2, 3, 5, -1, -1]
    check(out, qli_ref(*inputs, sparse_count=8, sparse_mode=0))


def test_key_scale_reorders_after_the_head_sum():
    """Equal dots, key scales 1, 3, 2: the key scale alone orders the keys."""
    query = np.ones((1, 1, 1, D), np.int8)
    key = np.ones((1, 3, 1, D), np.int8)
    one = np.ones((1, 1, 1), F16)
    ks = np.array([1, 3, 2], F16).reshape(1, 3, 1)
    out = ops.npu_quant_lightning_indexer(query, key, one, one.copy(), ks, 0, 0, sparse_count=3, sparse_mode=0)
    assert out.reshape(-1).tolist() == [1, 2, 0]


def test_causal_rows_and_padding():
    """sparse_mode 3 with more query tokens than kv: the first rows see nothing (-1 rows)."""
    rng = np.random.default_rng(3)
    inputs, kw = make_case(rng, "BSND", "BSND", [4], [2], s1=5)
    out = run(inputs, kw, 4, 3)
    check(out, qli_ref(*inputs, sparse_count=4, sparse_mode=3, **kw))
    rows = out.reshape(5, 4)
    assert (rows[:2] == -1).all() and (rows[4] == -1).all()  # no visible key; past act_q
    assert (rows[2, 1:] == -1).all() and rows[2, 0] == 0 and sorted(rows[3, :2]) == [0, 1]


def test_default_lengths_bsnd():
    rng = np.random.default_rng(4)
    inputs, kw = make_case(rng, "BSND", "BSND", [2, 2], [9, 9])
    del kw["actual_seq_lengths_query"], kw["actual_seq_lengths_key"]
    check(run(inputs, kw, 5, 3), qli_ref(*inputs, sparse_count=5, sparse_mode=3, **kw))


def test_query_chunks_do_not_change_the_result(monkeypatch):
    import ascend_emu.emu.lightning_indexer as emu_indexer

    rng = np.random.default_rng(5)
    inputs, kw = make_case(rng, "BSND", "BSND", [5, 3], [40, 25])
    whole = run(inputs, kw, 16, 3)
    monkeypatch.setattr(emu_indexer, "CHUNK_BYTES", 1)
    assert np.array_equal(run(inputs, kw, 16, 3), whole)


def test_parallel_path_matches_reference(monkeypatch):
    """The per-token parallel kernel (taken above PARALLEL_MIN_SCORES) selects what the serial one does."""
    import ascend_emu.emu.quant_lightning_indexer as emu_qli

    rng = np.random.default_rng(6)
    inputs, kw = make_case(rng, "TND", "PA_BSND", [4, 3], [50, 30])
    monkeypatch.setattr(emu_qli, "PARALLEL_MIN_SCORES", 1)
    check(run(inputs, kw, 20, 3), qli_ref(*inputs, sparse_count=20, sparse_mode=3, **kw))


# ---------------------------------------------------------------------- bad input
def _good():
    rng = np.random.default_rng(9)
    inputs, kw = make_case(rng, "BSND", "PA_BSND", [2, 1], [20, 40], s1=2)
    names = ("query", "key", "weights", "query_dequant_scale", "key_dequant_scale")
    return dict(zip(names, inputs, strict=True), query_quant_mode=0, key_quant_mode=0, sparse_count=16, **kw)


def _with(**changes):
    args = _good()
    for name, value in changes.items():
        args[name] = value(args) if callable(value) else value
    return args


BAD = [
    ("query_quant_mode", ModeError, "query_quant_mode", dict(query_quant_mode=1)),
    ("key_quant_mode", ModeError, "key_quant_mode", dict(key_quant_mode=2)),
    ("quant_mode_type", DTypeError, "key_quant_mode", dict(key_quant_mode=0.0)),
    ("query_dtype_tag", ModeError, "query_dtype", dict(query_dtype=1)),
    ("key_dtype_tag", ModeError, "key_dtype", dict(key_dtype=290)),
    ("query_bf16", DTypeError, "query", dict(query=lambda a: a["query"].astype(np.float16))),
    ("key_fp16", DTypeError, "key", dict(key=lambda a: a["key"].astype(np.float16))),
    ("weights_fp32", DTypeError, "weights", dict(weights=lambda a: a["weights"].astype(np.float32))),
    ("qs_fp32", DTypeError, "query_dequant_scale",
     dict(query_dequant_scale=lambda a: a["query_dequant_scale"].astype(np.float32))),
    ("ks_fp32", DTypeError, "key_dequant_scale",
     dict(key_dequant_scale=lambda a: a["key_dequant_scale"].astype(np.float32))),
    ("qs_shape", ShapeError, "query_dequant_scale",
     dict(query_dequant_scale=lambda a: a["query_dequant_scale"][:, :1].copy())),
    ("ks_shape", ShapeError, "key_dequant_scale", dict(key_dequant_scale=lambda a: a["key_dequant_scale"][:-1].copy())),
    ("ks_missing", ShapeError, "key_dequant_scale", dict(key_dequant_scale=None)),
    ("ks_strided", ShapeError, "key_dequant_scale",
     dict(key_dequant_scale=lambda a: np.repeat(a["key_dequant_scale"], 2, axis=1)[:, ::2])),
    ("ws_overflow", ModeError, r"weights: .*fp16 range.*weights\[1, 0, 3\]",
     dict(weights=lambda a: _set(a["weights"], (1, 0, 3), 300.0),
          query_dequant_scale=lambda a: _set(a["query_dequant_scale"], (1, 0, 3), 300.0))),
    ("sparse_count_3072", ModeError, "sparse_count", dict(sparse_count=3072)),  # [1, 2048] only
    ("sparse_count_zero", ModeError, "sparse_count", dict(sparse_count=0)),
    ("sparse_mode", ModeError, "sparse_mode", dict(sparse_mode=1)),
    ("layout_key", ModeError, "layout_key", dict(layout_key="PA_NZ")),
    ("query_heads_65", ShapeError, r"query: .*N1", dict(query=lambda a: np.concatenate([a["query"]] * 9, axis=2))),
    ("block_table_entry", IndexRangeError, r"block_table\[1, 2\] = 99",
     dict(block_table=lambda a: np.where(np.arange(a["block_table"].shape[1]) == 2, 99,
                                         a["block_table"]).astype(np.int32))),
    ("act_k_missing", ModeError, "actual_seq_lengths_key", dict(actual_seq_lengths_key=None)),
]


def _set(a, at, v):
    a = a.copy()
    a[at] = v
    return a


@pytest.mark.parametrize("name,error,fragment,changes", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument(name, error, fragment, changes):
    args = _with(**changes)
    before = {k: v.copy() for k, v in args.items() if isinstance(v, np.ndarray)}
    with pytest.raises(error, match=fragment):
        ops.npu_quant_lightning_indexer(**args)
    for k, v in before.items():  # nothing written
        assert np.array_equal(args[k].view(np.uint8), v.view(np.uint8)), k


def test_plain_indexer_still_rejects_int8_and_takes_large_counts():
    """The shared checks keep each op's own dtypes: int8 is the quant op's, 3072 the plain one's."""
    args = _good()
    with pytest.raises(DTypeError, match="query"):
        ops.npu_lightning_indexer(args["query"], args["key"], args["weights"], block_table=args["block_table"],
                                  actual_seq_lengths_key=args["actual_seq_lengths_key"], layout_key="PA_BSND")


def test_numpy_signature_is_the_schema():
    """torch_npu 2.14 (yaml): npu_quant_lightning_indexer(Tensor query, Tensor key, Tensor weights,
    Tensor query_dequant_scale, Tensor key_dequant_scale, int query_quant_mode, int key_quant_mode, *, ...)."""
    import inspect

    big = 9223372036854775807
    pos = ["query", "key", "weights", "query_dequant_scale", "key_dequant_scale", "query_quant_mode",
           "key_quant_mode"]
    kw = [("actual_seq_lengths_query", None), ("actual_seq_lengths_key", None), ("block_table", None),
          ("layout_query", "BSND"), ("layout_key", "BSND"), ("sparse_count", 2048), ("sparse_mode", 3),
          ("pre_tokens", big), ("next_tokens", big), ("query_dtype", None), ("key_dtype", None)]
    params = list(inspect.signature(ops.npu_quant_lightning_indexer).parameters.values())
    assert [p.name for p in params] == pos + [n for n, _ in kw]
    assert all(p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params[:7])
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in params[7:])
    assert [p.default for p in params[7:]] == [d for _, d in kw]


# ---------------------------------------------------------------------- torch_npu drop-in
def test_torch_npu_drop_in_matches_numpy_op_and_meta():
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu as torch_npu

    rng = np.random.default_rng(13)
    inputs, kw = make_case(rng, "TND", "PA_BSND", [1, 2], [30, 50])
    want = run(inputs, kw, 16, 3)
    t = [torch.from_numpy(a).npu() for a in inputs]
    got = torch_npu.npu_quant_lightning_indexer(
        *t, query_quant_mode=0, key_quant_mode=0,
        actual_seq_lengths_query=torch.from_numpy(kw["actual_seq_lengths_query"]).npu(),
        actual_seq_lengths_key=torch.from_numpy(kw["actual_seq_lengths_key"]).npu(),
        block_table=torch.from_numpy(kw["block_table"]).npu(), layout_query="TND", layout_key="PA_BSND",
        sparse_count=16, sparse_mode=3)
    assert got.dtype == torch.int32
    np.testing.assert_array_equal(got.cpu().numpy(), want)
    with pytest.raises(ModeError, match="query_quant_mode"):
        torch_npu.npu_quant_lightning_indexer(*t, 1, 0, block_table=torch.from_numpy(kw["block_table"]).npu(),
                                              actual_seq_lengths_key=torch.from_numpy(kw["actual_seq_lengths_key"]).npu(),
                                              layout_key="PA_BSND")
    meta = [torch.empty(a.shape, dtype=x.dtype, device="meta") for a, x in zip(inputs, t, strict=True)]
    for lq, shape in (("BSND", (2, 3, 1, 7)), ("TND", (2, 1, 7))):
        q = torch.empty((2, 3, 64, D) if lq == "BSND" else (2, 64, D), dtype=torch.int8, device="meta")
        out = torch.ops.npu.npu_quant_lightning_indexer(q, *meta[1:], 0, 0, layout_query=lq, layout_key="PA_BSND",
                                                        sparse_count=7)
        assert out.device.type == "meta" and out.dtype == torch.int32 and tuple(out.shape) == shape


def test_recorded_call_replays_and_compares_identical():
    """compare / replay know the op: a recorded call replays to the op's indices, and a device
    output equal to them compares identical (one index off does not)."""
    from ascend_emu import compare
    from ascend_emu.compare.calls import Call, TensorValue

    rng = np.random.default_rng(21)
    inputs, kw = make_case(rng, "TND", "PA_BSND", [2, 1], [30, 20])
    want = run(inputs, kw, 8, 3)

    def call(out):
        return Call(index=0, op="npu_quant_lightning_indexer", api="torch_npu.npu_quant_lightning_indexer",
                    args=[TensorValue(a.copy()) for a in inputs] + [0, 0],
                    kwargs={k: TensorValue(v.copy()) if isinstance(v, np.ndarray) else v
                            for k, v in dict(kw, sparse_count=8, sparse_mode=3).items()},
                    outputs=[TensorValue(out)])

    got = compare.replay(call(want))
    assert got.error is None and got.unavailable is None
    np.testing.assert_array_equal(got.outputs[0].array, want)
    assert compare.compare_call(call(want.copy())).status == "identical"
    off = want.copy()
    off.reshape(-1)[0] += 1
    assert compare.compare_call(call(off)).status != "identical"


def test_checked_mode_reports_an_unwritten_key_slot():
    """Checked mode: the int8 key cache is read through the same reader hook as the plain indexer's."""
    import ascend_emu
    from ascend_emu import checked_mode
    from ascend_emu.errors import UninitializedReadError

    rng = np.random.default_rng(22)
    inputs, kw = make_case(rng, "BSND", "PA_BSND", [1], [20])
    key, table = inputs[1], kw["block_table"]
    checked_mode.mark_written(key, [int(table[0, p // 16]) * 16 + p % 16 for p in range(20) if p != 5])
    with ascend_emu.checked(), pytest.raises(UninitializedReadError,
                                             match="npu_quant_lightning_indexer: key read before written: batch 0, "
                                                   "query token 0, kv token 5"):
        run(inputs, kw, 8, 3)
    checked_mode.mark_written(key, [int(table[0, 0]) * 16 + 5])
    with ascend_emu.checked():
        run(inputs, kw, 8, 3)
