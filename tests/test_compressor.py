"""DeepSeek-V4's KV compressor (``ascend_emu.ops.compressor``, the ``_C_ascend`` / ``custom``
bindings) against the independent float64 reference ``tests/reference/compressor.py``.

Exact: which output rows hold which group (the packed order, the padding rows), which state rows
are written (block-table entry 0 skipped, untouched rows byte-identical), rejected calls writing
nothing. Values: the dual criterion at 0.005 against float64 (fp32 GEMMs with K = H, softmax,
RMSNorm), with the bit-identical share of the bf16 output against float64 rounded once measured
and asserted with a margin. The reference sees each request's whole history, so calls in steps
(prefill, decode, chunked prefill) check the state the op carried between them.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_emu import checked_mode, ops
from ascend_emu.errors import (DTypeError, IndexRangeError, InputContractError, InputContractWarning, ModeError,
                               ShapeError)
from tests.helpers import assert_same_bytes, bit_identical_share, dual_threshold_ok, poisoned
from tests.reference import compressor as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
H = 1024
#: The README's three scenarios: (name, D, coff, ratio).
SCENARIOS = (("C4A", 512, 2, 4), ("C4Li", 128, 2, 4), ("C128A", 512, 1, 128))


class Model:
    """One compressor layer's weights, and requests whose tokens are fed in steps."""

    def __init__(self, d, coff, r, *, seed=0, nreq=2, block_size=8, blocks=None, dtype=BF16, rotary_mode=2,
                 cache_mode=1):
        rng = np.random.default_rng(seed)
        self.cache_mode = cache_mode
        self.d, self.coff, self.r, self.bs, self.dtype, self.rotary = d, coff, r, block_size, dtype, rotary_mode
        self.rng = rng
        self.wkv = (rng.standard_normal((coff * d, H)) / 32).astype(dtype)
        self.wgate = (rng.standard_normal((coff * d, H)) / 16).astype(dtype)
        self.ape = rng.standard_normal((r, coff * d)).astype(np.float32)
        # the 950's tiling takes fp32 norm_weight and rope tables (A2 / A3: x's dtype)
        self.aux = np.float32 if cache_mode == 2 else dtype
        self.norm_weight = (1 + rng.standard_normal(d) / 4).astype(self.aux)
        self.hist = [np.zeros((0, H), dtype) for _ in range(nreq)]
        self.max_pos = 400
        cols = -(-self.max_pos // block_size)
        self.table = (1 + np.arange(nreq * cols, dtype=np.int32)).reshape(nreq, cols)
        if cache_mode == 2:  # the ring: one block per request
            self.table = np.arange(1, nreq + 1, dtype=np.int32)
        nblocks = blocks or self.table.size + 1
        self.state = poisoned((nblocks, block_size, 2 * coff * d), np.float32)

    def step(self, chunks, *, seqused=None, bsh=False, check=True, table=None):
        """Feed ``chunks[b]`` new tokens to request b (start: its history length); returns the
        output and the expected rows (from the reference) with their output indices."""
        rng, nreq = self.rng, len(self.hist)
        if bsh and seqused is None:
            seqused = list(chunks)  # each request's first chunks[b] tokens of its S
        xs = [(rng.standard_normal((n, H))).astype(self.dtype) for n in chunks]
        start = np.array([h.shape[0] for h in self.hist], np.int32)
        used = list(chunks) if seqused is None else list(seqused)
        r = self.r
        ngroups = [len(ref.completed_groups(int(start[b]), used[b], r)) for b in range(nreq)]
        if bsh:
            s = max(chunks)
            per = -(-s // r)
            x = np.zeros((nreq, s, H), self.dtype)
            for b in range(nreq):
                x[b, :chunks[b]] = xs[b]
            rope_shape, cu = (nreq, per, 64), None
            rows_at = [b * per + np.arange(ngroups[b]) for b in range(nreq)]
        else:
            x = np.concatenate(xs) if xs else np.zeros((0, H), self.dtype)
            t = x.shape[0]
            rope_shape = (min(t, t // r + nreq), 64)
            cu = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int32)
            offs = np.concatenate([[0], np.cumsum(ngroups)])
            rows_at = [offs[b] + np.arange(ngroups[b]) for b in range(nreq)]
        # each group's rope row from its first position (pad rows: noise the op must not use)
        sin = rng.uniform(-1, 1, rope_shape).astype(self.aux)
        cos = rng.uniform(-1, 1, rope_shape).astype(self.aux)
        freq = 1e4 ** (-np.repeat(np.arange(32), 2) / 32)
        for b in range(nreq):
            for i, g in enumerate(ref.completed_groups(int(start[b]), used[b], r)):
                sin.reshape(-1, 64)[rows_at[b][i]] = np.sin(g * r * freq).astype(self.aux)
                cos.reshape(-1, 64)[rows_at[b][i]] = np.cos(g * r * freq).astype(self.aux)
        before = self.state.copy()
        out = ops.compressor(x, self.wkv, self.wgate, self.state, self.ape, self.norm_weight, sin, cos,
                             self.table if table is None else table, cu,
                             None if seqused is None else np.array(seqused, np.int32), start, 64, r, self.coff,
                             1e-6, self.rotary, self.cache_mode)
        expected, written = [], []
        for b in range(nreq):
            hist = np.concatenate([self.hist[b], xs[b][:used[b]]])
            groups = ref.completed_groups(int(start[b]), used[b], r)
            flat_sin, flat_cos = sin.reshape(-1, 64), cos.reshape(-1, 64)
            rows = ref.group_rows(hist, self.wkv, self.wgate, self.ape, self.norm_weight, groups,
                                  flat_sin[rows_at[b]], flat_cos[rows_at[b]], r=r, coff=self.coff, eps=1e-6,
                                  rotary_mode=self.rotary)
            expected.append((rows_at[b], rows))
            tb = (self.table if table is None else table)[b]
            if self.cache_mode == 2:
                written += [(b, *w) for w in ref.ring_rows_written(int(tb), int(start[b]), used[b], r, self.coff,
                                                                   self.bs)]
            else:
                written += [(b, *w) for w in ref.state_rows_written(tb, int(start[b]), used[b], self.bs)]
            # the history keeps every token given (unused ones were never seen by the op, so the
            # next step's start must come from the caller: here, used tokens only)
            self.hist[b] = hist
        if check:
            self.check_state(before, written)
        return out, expected

    def check_state(self, before, written):
        """Rows written: the reference's set exactly, values kv ‖ score + ape; all others untouched."""
        touched = np.zeros(self.state.shape[:2], bool)
        want = np.zeros_like(self.state, dtype=np.float64)
        proj = {b: ref.projections(self.hist[b], self.wkv, self.wgate, self.ape, self.r)
                for b in {w[0] for w in written}}
        for b, p, blk, row in written:
            kv, score = proj[b]
            want[blk, row] = np.concatenate([kv[p], score[p]])
            touched[blk, row] = True
        assert_same_bytes(self.state[~touched], before[~touched], "state rows not written")
        assert dual_threshold_ok(self.state[touched], want[touched], 0.005) if touched.any() else True
        if touched.any():
            err = np.abs(self.state[touched] - want[touched]) / (1 + np.abs(want[touched]))
            assert err.max() < 1e-5, err.max()


def _check_rows(out, expected, share_floor):
    flat = out.reshape(-1, out.shape[-1])
    got, want, seen = [], [], np.zeros(flat.shape[0], bool)
    for idx, rows in expected:
        got.append(flat[idx])
        want.append(rows)
        seen[idx] = True
    got, want = np.concatenate(got), np.concatenate(want)
    assert dual_threshold_ok(got, want, 0.005)
    share = bit_identical_share(got, want.astype(np.float32).astype(BF16))
    assert share >= share_floor, share
    assert not flat[~seen].astype(np.float32).any(), "padding rows are zero"
    return share


@pytest.mark.parametrize("name,d,coff,r", SCENARIOS)
def test_prefill_then_decode_across_group_boundaries(name, d, coff, r):
    """Prefill of uneven lengths, decode steps crossing group boundaries, then a chunked prefill;
    every call's rows against the reference over the whole history."""
    m = Model(d, coff, r, seed=len(name))
    steps = [[r + 3, 2 * r - 1]] + [[1, 1]] * 3 + [[r // 2 + 1, r + 2], [1, 1]]
    shares = []
    for chunks in steps:
        out, expected = m.step(chunks)
        if sum(len(i) for i, _ in expected):
            shares.append(_check_rows(out, expected, 0.95))
    assert shares


def test_shapes_and_packed_order_th():
    """TH: ``[min(T, T // r + B), D]``, request 0's groups, then request 1's, then padding."""
    m = Model(128, 2, 4, nreq=3)
    out, expected = m.step([9, 0, 6])
    assert out.shape == (min(15, 15 // 4 + 3), 128) and out.dtype == BF16
    assert [list(i) for i, _ in expected] == [[0, 1], [], [2]]
    _check_rows(out, expected, 0.5)


def test_bsh_matches_th_bit_for_bit():
    """A BSH call (``[B, ceil(S / r), D]``, padding per request) gives the TH call's rows."""
    outs = []
    for bsh in (False, True):
        m = Model(128, 2, 4, seed=3)
        m.step([5, 3], bsh=bsh)
        out, expected = m.step([6, 6], bsh=bsh)
        _check_rows(out, expected, 0.5)
        outs.append((out.reshape(-1, 128), expected, m.state.copy()))
    (th, eth, sth), (bs, ebs, sbs) = outs
    for (i, _), (j, _) in zip(eth, ebs, strict=True):
        assert_same_bytes(bs[j], th[i], "BSH rows")
    assert_same_bytes(sbs, sth, "state")
    assert bs.shape[0] == 2 * -(-6 // 4)


@pytest.mark.parametrize("rotary_mode", [1, 2])
def test_rotary_modes(rotary_mode):
    m = Model(512, 1, 4, rotary_mode=rotary_mode, seed=5)
    out, expected = m.step([8, 4])
    _check_rows(out, expected, 0.5)


def test_block_table_zero_skips_the_state_write():
    """Entry 0: the rows of those positions are not written (the rest are)."""
    m = Model(128, 2, 4, block_size=4)
    table = m.table.copy()
    table[0, 1] = 0  # positions 4..7 of request 0
    m.step([10, 3], table=table)  # check_state compares against the reference's set


def test_a_group_read_through_entry_zero_reads_block_zero_and_breaks_the_input_contract():
    """Request 0's positions 0..3 were written (entry 1); the next call's table has 0 there: the
    kernel reads block 0 (kept as it is: poison here); the emulator warns (checked mode: an error,
    nothing written)."""
    m = Model(128, 2, 4, block_size=4, nreq=1)
    m.step([2])
    table = m.table.copy()
    table[0, 0] = 0
    before = m.state.copy()
    with checked_mode.checked(), pytest.raises(InputContractError,
                                               match=r"state_block_table\[0, 0\].*state_block_zero"):
        m.step([2], table=table, check=False)
    assert_same_bytes(m.state, before, "state after a rejected call")
    m.hist[0] = m.hist[0][:2]
    m.state[0] = 0.0  # block 0 as the group reads it: kv 0, score 0
    with pytest.warns(InputContractWarning, match="state_block_zero"):
        out, _ = m.step([2], table=table, check=False)
    hist = m.hist[0]
    kv, score = ref.projections(hist, m.wkv, m.wgate, m.ape, 4)
    kv[:2], score[:2] = 0.0, 0.0  # positions 0, 1 read from block 0
    w = np.exp(score[:4, 128:] - score[:4, 128:].max(0))  # group 0: the overlap half is empty
    c = (w / w.sum(0) * kv[:4, 128:]).sum(0)
    y = c / np.sqrt(np.mean(c * c) + 1e-6) * ref.f64(m.norm_weight)
    assert dual_threshold_ok(out[0, :64], y[:64], 0.005)  # the nope part (no rope)


def test_seqused_limits_the_tokens_taken():
    m = Model(128, 2, 4)
    out, expected = m.step([9, 6], seqused=[5, 6])
    assert [len(i) for i, _ in expected] == [1, 1]
    _check_rows(out, expected, 0.5)


def test_norm_weight_and_rope_dtypes_per_soc(monkeypatch):
    """A2 / A3 (arch32): norm_weight of x's dtype, rope x's dtype or fp32; the 950 (arch35): fp32."""
    m = Model(128, 2, 4)
    with pytest.raises(DTypeError, match="norm_weight"):
        _call(m, norm_weight=m.norm_weight.astype(np.float32))
    rope32 = np.zeros((min(8, 8 // 4 + 2), 64), np.float32)
    _call(m, rope_sin=rope32, rope_cos=rope32)  # fp32 rope on an A2: taken
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    before = m.state.copy()
    for over, name in ((dict(), "norm_weight"), (dict(norm_weight=m.norm_weight.astype(np.float32)), "rope_sin")):
        with pytest.raises(DTypeError, match=name):
            _call(m, **over)
    assert_same_bytes(m.state, before, "state after a rejected call")
    _call(m, norm_weight=m.norm_weight.astype(np.float32), rope_sin=rope32, rope_cos=rope32)


def test_fp16():
    m = Model(128, 2, 4, dtype=np.float16)
    out, expected = m.step([8, 5])
    assert out.dtype == np.float16
    flat = out.reshape(-1, 128)
    for idx, rows in expected:
        assert dual_threshold_ok(flat[idx], rows, 0.005)


@pytest.mark.parametrize("name,d,coff,r", SCENARIOS[:2] + (("C8-coff1", 128, 1, 8),))
def test_ring_state_cache_on_the_950(monkeypatch, name, d, coff, r):
    """cache_mode 2: one ring block per request (rows ``p % block_size``, a block of twice the rows a
    group reads: the positions wrap), only the tail rows written; prefill, decode and chunked steps."""
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    m = Model(d, coff, r, seed=11, block_size=2 * coff * r, cache_mode=2)
    for chunks in ([r + 3, 2 * r - 1], [1, 1], [1, 1], [1, 1], [r + 1, 3], [2, 1]):
        out, expected = m.step(chunks)
        if sum(len(i) for i, _ in expected):
            _check_rows(out, expected, 0.95)


def test_ring_is_ascend950_only_and_needs_a_group_per_block(monkeypatch):
    m = Model(128, 2, 4, cache_mode=2, block_size=8)
    with pytest.raises(ModeError, match="cache_mode.*Ascend950"):
        m.step([4, 4], check=False)
    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    small = Model(128, 2, 4, cache_mode=2, block_size=7)
    before = small.state.copy()
    with pytest.raises(ShapeError, match="block_size >= coff"):
        small.step([4, 4], check=False)
    assert_same_bytes(small.state, before, "state after a rejected call")
    with pytest.raises(ShapeError, match="state_block_table"):
        m.step([4, 4], table=np.ones((2, 2), np.int32), check=False)
    # a chunk whose tail would overwrite ring rows its first group still reads
    ring = Model(128, 1, 8, cache_mode=2, block_size=12)
    ring.step([14, 1])
    before = ring.state.copy()
    with pytest.raises(IndexRangeError, match="both read and written"):
        ring.step([9, 1], check=False)
    assert_same_bytes(ring.state, before, "state after a rejected call")


@settings(max_examples=12, deadline=None)
@given(coff=st.sampled_from([1, 2]), r=st.sampled_from([2, 4, 8]), bs=st.sampled_from([2, 4, 8, 16]),
       steps=st.lists(st.lists(st.tuples(st.integers(0, 19), st.integers(0, 3)), min_size=1, max_size=3),
                      min_size=1, max_size=3).map(lambda s: [row + [row[-1]] * (3 - len(row)) for row in s]))
def test_random_steps_against_the_reference(coff, r, bs, steps):
    """Random chunk sizes, seqused (up to 3 tokens short) and block sizes: the state rows written
    are exactly the reference's, every completed group's row within the dual criterion, the
    padding rows zero."""
    m = Model(128, coff, r, nreq=3, block_size=bs, seed=r * bs + coff)
    for row in steps:
        chunks = [n for n, _ in row]
        used = [max(n - short, 0) for n, short in row]
        out, expected = m.step(chunks, seqused=used)
        flat = out.reshape(-1, 128)
        seen = np.zeros(flat.shape[0], bool)
        for idx, rows in expected:
            assert dual_threshold_ok(flat[idx], rows, 0.005)
            seen[idx] = True
        assert not flat[~seen].astype(np.float32).any()


# ------------------------------------------------------------------- rejected calls write nothing
def _call(m, **over):
    t = 8
    x = np.ones((t, H), BF16)
    kw = dict(x=x, wkv=m.wkv, wgate=m.wgate, state_cache=m.state, ape=m.ape, norm_weight=m.norm_weight,
              rope_sin=np.zeros((min(t, t // m.r + 2), 64), BF16), rope_cos=np.zeros((min(t, t // m.r + 2), 64), BF16),
              state_block_table=m.table, cu_seqlens=np.array([0, 4, 8], np.int32), seqused=None,
              start_pos=np.array([0, 4], np.int32), rope_head_dim=64, cmp_ratio=m.r, coff=m.coff, norm_eps=1e-6,
              rotary_mode=2, cache_mode=1)
    kw.update(over)
    return ops.compressor(**kw)


REJECTED = [
    (dict(cu_seqlens=np.array([0, 6, 4], np.int32)), IndexRangeError, "cu_seqlens[2]"),
    (dict(cu_seqlens=np.array([1, 4, 8], np.int32)), IndexRangeError, "cu_seqlens[0]"),
    (dict(cu_seqlens=np.array([0, 4, 9], np.int32)), IndexRangeError, "cu_seqlens[2]"),
    (dict(start_pos=np.array([0, -1], np.int32)), IndexRangeError, "start_pos[1]"),
    (dict(start_pos=np.array([0], np.int32)), ShapeError, "start_pos"),
    (dict(seqused=np.array([5, 1], np.int32)), IndexRangeError, "seqused[0]"),
    (dict(start_pos=np.array([0, 1000], np.int32)), IndexRangeError, "state_block_table"),
    (dict(state_block_table=np.full((2, 50), 10 ** 6, np.int32)), IndexRangeError, "state_block_table[0, 0]"),
    (dict(state_block_table=None), ShapeError, "state_block_table"),
    (dict(cmp_ratio=3), ModeError, "cmp_ratio"),
    (dict(coff=3), ModeError, "coff"),
    (dict(rope_head_dim=32), ModeError, "rope_head_dim"),
    (dict(rotary_mode=0), ModeError, "rotary_mode"),
    (dict(cache_mode=2), ModeError, "cache_mode"),
    (dict(cache_mode=3), ModeError, "cache_mode"),
    (dict(norm_eps=-1.0), DTypeError, "norm_eps"),
    (dict(rope_sin=np.zeros((3, 64), BF16)), ShapeError, "rope_sin"),
    (dict(x=np.ones((8, 1000), BF16)), ShapeError, "x"),
    (dict(x=np.ones((8, H), np.float32)), DTypeError, "x"),
    (dict(ape=np.zeros((3, 256), np.float32)), ShapeError, "ape"),
    (dict(cu_seqlens=None), ShapeError, "cu_seqlens"),
]


@pytest.mark.parametrize("over,err,name", REJECTED, ids=[r[2] + "-" + str(i) for i, r in enumerate(REJECTED)])
def test_rejected_calls_name_the_argument_and_write_nothing(over, err, name):
    m = Model(128, 2, 4)
    before = m.state.copy()
    with pytest.raises(err, match=name.replace("[", r"\[").replace("]", r"\]")):
        _call(m, **over)
    assert_same_bytes(m.state, before, "state after a rejected call")


@pytest.mark.parametrize("bad,named", [([(0, 1), (1, 0)], "[0, 1]"), ([(0, 1), (0, 0)], "[0, 0]"),
                                       ([(1, 1), (1, 0)], "[1, 0]")])
def test_the_first_bad_table_entry_in_request_order_is_named(bad, named):
    """Both requests write positions 4..7 (column 1) and read 0..3 (column 0, the overlap half):
    the error names the first bad entry request after request, a request's reads before its
    writes, whichever entries of later requests are bad too."""
    m = Model(128, 2, 4, block_size=4)
    table = m.table.copy()
    for at in bad:
        table[at] = 10 ** 6
    before = m.state.copy()
    with pytest.raises(IndexRangeError, match=re.escape(f"state_block_table{named}")):
        _call(m, state_block_table=table, start_pos=np.array([4, 4], np.int32))
    assert_same_bytes(m.state, before, "state after a rejected call")


def test_a_state_row_both_read_and_written_is_rejected():
    """Request 1's table names request 0's block: request 1 would write the row request 0 reads."""
    m = Model(128, 2, 4, block_size=4)
    m.step([2, 4])
    table = m.table.copy()
    table[1, 1] = table[0, 0]  # request 1's positions 4..7 in the block of request 0's 0..3
    before = m.state.copy()
    with pytest.raises(IndexRangeError, match="both read and written"):
        m.step([2, 2], table=table, check=False)
    assert_same_bytes(m.state, before, "state after a rejected call")


# ------------------------------------------------------------------ torch.ops._C_ascend / custom
def _torch_case(torch, padded_page: bool):
    m = Model(128, 2, 4, block_size=8, nreq=1)
    x = np.random.default_rng(7).standard_normal((9, H)).astype(BF16)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16) \
        if a.dtype == BF16 else torch.from_numpy(np.ascontiguousarray(a))
    blocks, bs, w = m.state.shape
    if padded_page:  # vllm-ascend's padded page: [blocks, page] storage, the state a view with a larger block stride
        page = torch.zeros(blocks, bs * w + 64)
        state = page.as_strided((blocks, bs, 1, w), (bs * w + 64, w, w, 1))
    else:
        state = torch.zeros(blocks, bs, 1, w)
    rope = np.random.default_rng(8).uniform(-1, 1, (min(9, 9 // 4 + 1), 64)).astype(BF16)
    args = dict(x=t(x), wkv=t(m.wkv), wgate=t(m.wgate), ape=t(m.ape), norm_weight=t(m.norm_weight),
                rope_sin=t(rope), rope_cos=t(rope[::-1].copy()), state_block_table=torch.from_numpy(m.table),
                cu_seqlens=torch.tensor([0, 9], dtype=torch.int32), start_pos=torch.tensor([0], dtype=torch.int32))
    st0 = np.zeros((blocks, bs, w), np.float32)
    want = ops.compressor(x, m.wkv, m.wgate, st0, m.ape, m.norm_weight, rope, rope[::-1].copy(), m.table,
                          np.array([0, 9], np.int32), None, np.array([0], np.int32), 64, 4, 2, 1e-6, 2, 1)
    return args, state, want, st0


@pytest.mark.parametrize("padded_page", [False, True])
def test_namespaces_as_vllm_ascend_and_the_recipes_call_them(padded_page):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu  # noqa: F401  (registers the namespaces)

    args, state, want, st0 = _torch_case(torch, padded_page)
    a = args
    # vllm-ascend: state_cache.squeeze(-2), the rest by keyword as Compressor.forward passes them
    out = torch.ops._C_ascend.compressor(a["x"], a["wkv"], a["wgate"], state.squeeze(-2), a["ape"], a["norm_weight"],
                                         a["rope_sin"], a["rope_cos"], state_block_table=a["state_block_table"],
                                         cu_seqlens=a["cu_seqlens"], seqused=None, start_pos=a["start_pos"],
                                         rope_head_dim=64, cmp_ratio=4, coff=2, norm_eps=1e-6, rotary_mode=2,
                                         cache_mode=1)
    assert_same_bytes(out.view(torch.int16).numpy(), want.view(np.int16), "_C_ascend cmp_kv")
    assert_same_bytes(state.squeeze(-2).contiguous().numpy(), st0, "_C_ascend state")
    state.zero_()
    out2 = torch.ops.custom.compressor(a["x"], a["wkv"], a["wgate"], state.squeeze(-2), a["ape"], a["norm_weight"],
                                       a["rope_sin"], a["rope_cos"], 64, 4, state_block_table=a["state_block_table"],
                                       cu_seqlens=a["cu_seqlens"], start_pos=a["start_pos"], coff=2, rotary_mode=2)
    assert_same_bytes(out2.view(torch.int16).numpy(), want.view(np.int16), "custom cmp_kv")
    assert_same_bytes(state.squeeze(-2).contiguous().numpy(), st0, "custom state")


def test_namespace_fake_kernel_shapes():
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import ascend_emu.torch_npu  # noqa: F401

    args, state, want, _ = _torch_case(torch, False)
    with FakeTensorMode(allow_non_fake_inputs=True):
        out = torch.ops.custom.compressor(args["x"], args["wkv"], args["wgate"], state.squeeze(-2), args["ape"],
                                          args["norm_weight"], args["rope_sin"], args["rope_cos"], 64, 4,
                                          state_block_table=args["state_block_table"], cu_seqlens=args["cu_seqlens"],
                                          start_pos=args["start_pos"], coff=2, rotary_mode=2)
        assert list(out.shape) == list(want.shape) and out.dtype == torch.bfloat16


def test_deterministic_mode_takes_the_fixed_order_product(monkeypatch):
    """ASCEND_EMU_DETERMINISTIC=1: the projections run in the project's fixed order (no library
    product: np.matmul refused) and still match the reference."""
    from ascend_emu import _deterministic

    def refuse(*args, **kwargs):
        raise AssertionError("np.matmul called in the deterministic mode")

    m = Model(128, 2, 4, seed=9)
    monkeypatch.setenv(_deterministic.ENV, "1")
    monkeypatch.setattr(np, "matmul", refuse)
    out, expected = m.step([6, 3])
    monkeypatch.undo()
    _check_rows(out, expected, 0.95)


def test_groups_computed_in_chunks_give_the_same_bytes(monkeypatch):
    """The group passes run a chunk of groups at a time (emu ``GROUP_BYTES``): one group per chunk
    and all groups in one give the same output and state bytes."""
    from ascend_emu.emu import compressor as emu_compressor

    results = []
    for group_bytes in (1, 1 << 30):
        monkeypatch.setattr(emu_compressor, "GROUP_BYTES", group_bytes)
        m = Model(128, 2, 4, seed=5)
        outs = [m.step(chunks)[0] for chunks in ([13, 21], [1, 1], [9, 3])]
        results.append((outs, m.state.copy()))
    (outs_a, state_a), (outs_b, state_b) = results
    for a, b in zip(outs_a, outs_b, strict=True):
        assert_same_bytes(a, b, "cmp_kv")
    assert_same_bytes(state_a, state_b, "state")


def test_weights_cast_to_fractal_nz_keep_their_widening_and_give_the_same_bytes():
    """wkv / wgate cast to FRACTAL_NZ (vllm-ascend's linear weights with weight_nz_mode 2) are
    multiplied on their fp32 widening kept on them (emu.matmul's keep limit), with the bytes of
    the plain weights' 256-row blocks."""
    from ascend_emu.emu import matmul
    from ascend_emu.layouts import as_nz

    m = Model(512, 2, 4, seed=4, nreq=1)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((37, H)).astype(BF16)
    rope = rng.uniform(-1, 1, (37 // 4 + 1, 64)).astype(BF16)
    results = []
    for wkv, wgate in ((m.wkv, m.wgate), (as_nz(m.wkv), as_nz(m.wgate))):
        state = np.zeros_like(m.state)
        kept = matmul.kept_bytes()
        out = ops.compressor(x, wkv, wgate, state, m.ape, m.norm_weight, rope, rope[::-1].copy(), m.table,
                             np.array([0, 37], np.int32), None, np.array([0], np.int32), 64, 4, 2, 1e-6, 2, 1)
        results.append((out, state, matmul.kept_bytes() - kept))
    (out_a, state_a, kept_a), (out_b, state_b, kept_b) = results
    assert kept_a == 0 and kept_b == 2 * m.wkv.size * 4
    assert_same_bytes(out_a, out_b, "cmp_kv")
    assert_same_bytes(state_a, state_b, "state")


def test_checked_mode_tracks_the_state_rows():
    """Checked mode: steps whose groups read rows the op wrote run; a group reading a row never
    written (a call starting mid-group on a fresh cache) raises before anything is written."""
    from ascend_emu.errors import UninitializedReadError

    with checked_mode.checked():
        m = Model(128, 2, 4, seed=4)
        for chunks in ([5, 2], [1, 1], [3, 3]):
            out, expected = m.step(chunks)
        fresh = Model(128, 2, 4, seed=4)
        fresh.hist = [np.zeros((2, H), BF16), np.zeros((0, H), BF16)]  # request 0 starts at position 2
        before = fresh.state.copy()
        with pytest.raises(UninitializedReadError, match=r"compressor: state_cache read before written: request 0, "
                                                         r"position 0 .* at block 1, row 0"):
            fresh.step([2, 1], check=False)
        assert_same_bytes(fresh.state, before, "state after a rejected call")


def test_with_compressor_metadata_as_vllm_ascend_chains_them():
    """vllm-ascend's Compressor.forward: compressor_metadata gives each compressed row its rope row
    (the group's first position) in the compressor's packed order; the rows match the reference
    roped at ``g * r``."""
    r, d = 4, 128
    m = Model(d, 2, r, nreq=2, seed=12)
    freq = 1e4 ** (-np.repeat(np.arange(32), 2) / 32)
    table_cos = np.cos(np.arange(64)[:, None] * freq).astype(BF16)
    table_sin = np.sin(np.arange(64)[:, None] * freq).astype(BF16)
    m.step([3, 6])  # positions 0..2 and 0..5
    chunks = [6, 3]
    start = np.array([h.shape[0] for h in m.hist], np.int32)
    rng = np.random.default_rng(13)
    xs = [rng.standard_normal((n, H)).astype(BF16) for n in chunks]
    x = np.concatenate(xs)
    cu = np.array([0, 6, 9], np.int32)
    n = min(9, 9 // r + 2)
    cos, sin, _ = ops.compressor_metadata(table_cos, table_sin, cu, start, np.ones((2, 4), np.int32), 16, 2, r, n, 2)
    out = ops.compressor(x, m.wkv, m.wgate, m.state, m.ape, m.norm_weight, sin.reshape(n, 64), cos.reshape(n, 64),
                         m.table, cu, None, start, 64, r, 2, 1e-6, 2, 1)
    row = 0
    for b in range(2):
        hist = np.concatenate([m.hist[b], xs[b]])
        groups = ref.completed_groups(int(start[b]), chunks[b], r)
        want = ref.group_rows(hist, m.wkv, m.wgate, m.ape, m.norm_weight, groups,
                              table_sin[[g * r for g in groups]], table_cos[[g * r for g in groups]],
                              r=r, coff=2, eps=1e-6, rotary_mode=2)
        assert dual_threshold_ok(out[row:row + len(groups)], want, 0.005)
        row += len(groups)
    assert row == 3  # request 0: groups 0 (at 3) and 1 (at 7); request 1: group 1 (at 7)
