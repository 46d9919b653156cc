"""vllm-ascend's DeepSeek-V4 attention (``vllm_ascend/attention/dsa_v1.py``, ``AscendDSAImpl`` on
its A2 / A3 bf16 path) as a CPU unit test with data flowing through the ops.

With a ``MagicMock`` torch_npu a test of this layer can check that ``npu_sparse_attn_sharedkv``
was called with ``ori_win_left=127``, never what came back. Here ``conftest.py`` loads
``ascend_emu.pytest_plugin``: ``torch.ops._C_ascend`` holds the emulated ops with vllm-ascend's
schemas, and the tests assert values: the rows the layer scatters into its SWA, compressed and
indexer caches, the indexer's selection, and the attention output against a softmax (with the
sink) over the rows read back from the caches through the block tables, in float64 torch.

:class:`DSAV4Layer` keeps the op calls of the V4 path in order (``inplace_partial_rotary_mul``,
``npu_scatter_nd_update_v2``, ``compressor_metadata``, ``compressor``, the indexer's
``npu_vllm_quant_lightning_indexer`` (+ ``_metadata``), ``npu_sparse_attn_sharedkv`` (+
``_metadata``), the inverse RoPE); vLLM's config, linear layers (``npu_quant_matmul``), the grouped
``npu_transpose_batchmatmul`` and the Hadamard ``hadamard_linear`` are plain torch. Hidden size,
q rank and o rank are small (the attention ops do not see them); the attention's own shapes are
DeepSeek-V4-Flash's (64 heads x 512, window 128, indexer 64 x 128, top-512).

Run: ``python -m pytest examples/vllm_ascend_ut -q`` (a few seconds).
"""

from __future__ import annotations

import torch
import torch_npu

HIDDEN, Q_RANK, O_GROUPS, O_RANK = 1024, 128, 8, 64  # the compressor takes H >= 1024
HEADS, HEAD_DIM, ROPE, WINDOW = 64, 512, 64, 128
IDX_HEADS, IDX_DIM, TOPK = 64, 128, 512
BLOCK_SIZE, EPS, MAX_LEN = 16, 1e-6, 160
STATE_BLOCK_SIZE = {4: 8, 128: 32}  # vllm-ascend DSV4_BLOCK_SIZES, A2 / A3
bf = torch.bfloat16


def C():
    return torch.ops._C_ascend


def rms(x, w=None):
    xf = x.float()
    y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS)
    return (y if w is None else y * w.float()).to(bf)


def hadamard(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def paged(num_reqs, rows, block_size):
    """Shuffled block ids from 1 (0 is the compressor's 'do not update')."""
    per = -(-rows // block_size)
    return (torch.randperm(num_reqs * per) + 1).view(num_reqs, per).int()


class DSAV4Layer:
    """``AscendDSAImpl`` (V4) reduced to its A2 / A3 op calls for ``compress_ratio`` 0 / 4 / 128."""

    def __init__(self, ratio, num_reqs):
        self.ratio, self.num_reqs, coff = ratio, num_reqs, 2 if ratio == 4 else 1

        def mat(o, i):
            return (torch.randn(o, i) * i ** -0.5).to(bf)

        self.wq_a, self.wq_b, self.wkv = mat(Q_RANK, HIDDEN), mat(HEADS * HEAD_DIM, Q_RANK), mat(HEAD_DIM, HIDDEN)
        self.q_norm, self.kv_norm = torch.ones(Q_RANK, dtype=bf), torch.ones(HEAD_DIM, dtype=bf)
        self.wo_a = mat(O_GROUPS * O_RANK, HEADS * HEAD_DIM // O_GROUPS).view(O_GROUPS, O_RANK, -1)
        self.wo_b, self.attn_sink = mat(HIDDEN, O_GROUPS * O_RANK), torch.randn(HEADS)
        theta = 40000.0 if ratio else 10000.0
        inv = 1.0 / theta ** (torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)
        ang = (torch.arange(MAX_LEN, dtype=torch.float64)[:, None] * inv).repeat_interleave(2, -1)
        self.cos, self.sin = ang.cos().to(bf), ang.sin().to(bf)
        self.swa_table = paged(num_reqs, MAX_LEN, BLOCK_SIZE)
        self.swa_cache = torch.zeros(int(self.swa_table.max()) + 1, BLOCK_SIZE, 1, HEAD_DIM, dtype=bf)
        if ratio:
            self.cmp_table = paged(num_reqs, MAX_LEN // ratio, BLOCK_SIZE)
            self.cmp_cache = torch.zeros(int(self.cmp_table.max()) + 1, BLOCK_SIZE, 1, HEAD_DIM, dtype=bf)
            self.state_table = paged(num_reqs, MAX_LEN, STATE_BLOCK_SIZE[ratio])
            n_state = int(self.state_table.max()) + 1
            self.compressor = self._compressor_weights(HEAD_DIM, coff)
            self.state_cache = torch.zeros(n_state, STATE_BLOCK_SIZE[ratio], 2 * coff * HEAD_DIM)
        if ratio == 4:
            self.idx_wq_b, self.idx_weights_proj = mat(IDX_HEADS * IDX_DIM, Q_RANK), mat(IDX_HEADS, HIDDEN)
            self.idx_compressor = self._compressor_weights(IDX_DIM, coff)
            self.idx_state_cache = torch.zeros(n_state, STATE_BLOCK_SIZE[ratio], 2 * coff * IDX_DIM)
            self.idx_k_cache = torch.zeros(self.cmp_cache.shape[0], BLOCK_SIZE, 1, IDX_DIM, dtype=torch.int8)
            self.idx_k_scale_cache = torch.zeros(self.cmp_cache.shape[0], BLOCK_SIZE, 1, dtype=torch.float16)
        self.record = {}

    def _compressor_weights(self, d, coff):
        return {"wkv": (torch.randn(coff * d, HIDDEN) * HIDDEN ** -0.5).to(bf),
                "wgate": (torch.randn(coff * d, HIDDEN) * HIDDEN ** -0.5).to(bf),
                "ape": torch.randn(self.ratio, coff * d) * 0.5, "norm": torch.ones(d, dtype=bf)}

    def _compress(self, x, w, state, cu, start_pos):
        """compressor_metadata -> compressor (models/deepseek_v4/compressor.py): rows and slots."""
        t = x.shape[0]
        n = min(t, t // self.ratio + self.num_reqs)
        cos, sin, slots = C().compressor_metadata(self.cos, self.sin, cu, start_pos, self.cmp_table, BLOCK_SIZE, 2,
                                                  self.ratio, n, self.num_reqs)
        rows = C().compressor(x, w["wkv"], w["wgate"], state, w["ape"], w["norm"], sin.view(n, ROPE),
                              cos.view(n, ROPE), self.state_table, cu, None, start_pos, ROPE, self.ratio,
                              2 if self.ratio == 4 else 1, EPS, 2, 1)
        return rows, slots

    def forward(self, x, positions, cu, seq_lens):
        """x bf16 [T, HIDDEN] (after input_layernorm) -> bf16 [T, HIDDEN]."""
        t = x.shape[0]
        q_lens = cu[1:] - cu[:-1]
        start_pos = (seq_lens - q_lens).int()
        cos, sin = self.cos[positions].view(t, 1, 1, ROPE), self.sin[positions].view(t, 1, 1, ROPE)
        qr = rms(x @ self.wq_a.T, self.q_norm)
        q = rms((qr @ self.wq_b.T).view(t, HEADS, HEAD_DIM)).view(t, 1, HEADS, HEAD_DIM).contiguous()
        C().inplace_partial_rotary_mul(q, cos, sin, "interleave", [HEAD_DIM - ROPE, HEAD_DIM])
        kv = rms(x @ self.wkv.T, self.kv_norm).view(t, 1, 1, HEAD_DIM).contiguous()
        C().inplace_partial_rotary_mul(kv, cos, sin, "interleave", [HEAD_DIM - ROPE, HEAD_DIM])
        # DeviceOperator.dsa_kv_compress_scatter: slot [T, 2] = (block, offset)
        req = torch.repeat_interleave(torch.arange(self.num_reqs), q_lens)
        slots = torch.stack([self.swa_table[req, positions // BLOCK_SIZE], positions % BLOCK_SIZE], 1).int()
        C().npu_scatter_nd_update_v2(self.swa_cache, slots, kv.view(t, 1, HEAD_DIM))
        self.record.update(kv=kv.view(t, HEAD_DIM), slots=slots)
        indices = None
        if self.ratio:  # _update_compressed_caches_and_select_topk
            rows, cslots = self._compress(x, self.compressor, self.state_cache, cu, start_pos)
            C().npu_scatter_nd_update_v2(self.cmp_cache, cslots, rows.view(-1, 1, HEAD_DIM))
            self.record.update(cmp_rows=rows, cmp_slots=cslots)
        if self.ratio == 4:  # the indexer (models/deepseek_v4/indexer.py)
            keys, kslots = self._compress(x, self.idx_compressor, self.idx_state_cache, cu, start_pos)
            keys = (keys.float() @ hadamard(IDX_DIM).T).to(bf)
            kq, ks = torch_npu.npu_dynamic_quant(keys)
            C().npu_scatter_nd_update_v2(self.idx_k_cache, kslots, kq.view(-1, 1, IDX_DIM))
            C().npu_scatter_nd_update_v2(self.idx_k_scale_cache, kslots, ks.half().view(-1, 1))
            iq = (qr @ self.idx_wq_b.T).view(t, 1, IDX_HEADS, IDX_DIM).contiguous()
            C().inplace_partial_rotary_mul(iq, cos, sin, "interleave", [IDX_DIM - ROPE, IDX_DIM])
            iq = (iq.view(-1, IDX_DIM).float() @ hadamard(IDX_DIM).T).to(bf)
            qq, qs = torch_npu.npu_dynamic_quant(iq)
            weights = ((x @ self.idx_weights_proj.T).float() * (IDX_DIM ** -0.5 * IDX_HEADS ** -0.5)).half()
            meta = C().npu_vllm_quant_lightning_indexer_metadata(
                IDX_HEADS, 1, IDX_DIM, 0, 0, actual_seq_lengths_query=cu[1:], actual_seq_lengths_key=seq_lens,
                batch_size=self.num_reqs, max_seqlen_q=int(q_lens.max()), max_seqlen_k=int(seq_lens.max()),
                layout_query="TND", layout_key="PA_BSND", sparse_count=TOPK, sparse_mode=3, cmp_ratio=4)
            indices, _ = C().npu_vllm_quant_lightning_indexer(
                qq.view(t, IDX_HEADS, IDX_DIM), self.idx_k_cache, weights, qs.half().view(t, IDX_HEADS),
                self.idx_k_scale_cache, 0, 0, cu[1:], seq_lens, self.cmp_table, meta, "TND", "PA_BSND", TOPK, 3,
                cmp_ratio=4)
        sas_metadata = C().npu_sparse_attn_sharedkv_metadata(
            HEADS, 1, HEAD_DIM, cu_seqlens_q=cu, seqused_kv=seq_lens, batch_size=self.num_reqs,
            max_seqlen_q=int(q_lens.max()), max_seqlen_kv=int(seq_lens.max()), cmp_topk=TOPK if indices is not None
            else 0, cmp_ratio=self.ratio if self.ratio else 1, ori_win_left=WINDOW - 1, layout_q="TND",
            has_cmp_kv=bool(self.ratio))
        o = C().npu_sparse_attn_sharedkv(
            q.view(t, HEADS, HEAD_DIM), ori_kv=self.swa_cache, cmp_kv=self.cmp_cache if self.ratio else None,
            cmp_sparse_indices=indices, ori_block_table=self.swa_table,
            cmp_block_table=self.cmp_table if self.ratio else None, cu_seqlens_q=cu, seqused_kv=seq_lens,
            sinks=self.attn_sink, metadata=sas_metadata, softmax_scale=HEAD_DIM ** -0.5,
            cmp_ratio=self.ratio if self.ratio else 1, ori_mask_mode=4, cmp_mask_mode=3, ori_win_left=WINDOW - 1,
            ori_win_right=0, layout_q="TND", layout_kv="PA_ND")[0]
        self.record.update(q=q.view(t, HEADS, HEAD_DIM).clone(), o=o.clone(), indices=indices)
        o = o.view(t, 1, HEADS, HEAD_DIM).contiguous()
        C().inplace_partial_rotary_mul(o, cos, -sin, "interleave", [HEAD_DIM - ROPE, HEAD_DIM])  # inverse rope
        og = torch.einsum("tgd,grd->tgr", o.view(t, O_GROUPS, -1).float(), self.wo_a.float()).to(bf)
        return (og.reshape(t, -1).float() @ self.wo_b.float().T).to(bf)


def expected_attention(layer, seq_lens, q_lens):
    """float64 softmax (with the sink) over the rows read back from the caches, per query token."""
    q, idx = layer.record["q"], layer.record["indices"]
    out, tok = [], 0
    for b in range(layer.num_reqs):
        for i in range(int(q_lens[b])):
            p = int(seq_lens[b]) - int(q_lens[b]) + i
            rows = [layer.swa_cache[layer.swa_table[b, j // BLOCK_SIZE], j % BLOCK_SIZE, 0]
                    for j in range(max(0, p - WINDOW + 1), p + 1)]
            if layer.ratio:
                sel = range((p + 1) // layer.ratio) if idx is None else [int(c) for c in idx[tok, 0] if c >= 0]
                rows += [layer.cmp_cache[layer.cmp_table[b, c // BLOCK_SIZE], c % BLOCK_SIZE, 0] for c in sel]
            k = torch.stack(rows).double()
            s = q[tok].double() @ k.T * HEAD_DIM ** -0.5
            sink = layer.attn_sink.double()[:, None]
            m = torch.maximum(s.max(-1, keepdim=True).values, sink)
            e = (s - m).exp()
            out.append(e / (e.sum(-1, keepdim=True) + (sink - m).exp()) @ k)
            tok += 1
    return torch.stack(out)


def assert_dual(actual, expected, prec=0.005):
    """torch_npu's dual criterion: fails only if both more than size*prec elements exceed the
    relative error prec and more than size*prec exceed the absolute error prec."""
    err = (actual.double() - expected).abs()
    rel = err / expected.abs().clamp_min(1e-9)
    limit = actual.numel() * prec
    assert not (int((rel > prec).sum()) > limit and int((err > prec).sum()) > limit), float(err.max())


def run_steps(layer, prompt_lens, decode_steps):
    """Prefill the prompts (one TND batch), then decode_steps tokens per request; checks each step."""
    lens = torch.tensor(prompt_lens, dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(lens, 0).int()])
    positions = torch.cat([torch.arange(n) for n in prompt_lens])
    steps = [(torch.randn(int(cu[-1]), HIDDEN).to(bf), positions, cu, lens)]
    for _ in range(decode_steps):
        lens = lens + 1
        steps.append((torch.randn(len(prompt_lens), HIDDEN).to(bf), (lens - 1).long(),
                      torch.arange(len(prompt_lens) + 1, dtype=torch.int32), lens))
    for x, pos, cu, seq in steps:
        out = layer.forward(x, pos, cu, seq)
        assert out.shape == (x.shape[0], HIDDEN) and bool(out.isfinite().all())
        # the kv rows landed in the SWA cache at their (block, offset) slots, bit for bit
        slots = layer.record["slots"].long()
        assert torch.equal(layer.swa_cache[slots[:, 0], slots[:, 1], 0], layer.record["kv"])
        assert_dual(layer.record["o"], expected_attention(layer, seq, cu[1:] - cu[:-1]))
    return lens


class TestAscendDSAImplV4:
    def test_swa_prefill_then_decode(self):
        torch.manual_seed(0)
        run_steps(DSAV4Layer(0, 2), [130, 7], 3)

    def test_hca_decode_crosses_a_compression_boundary(self):
        """Request 0 reaches 128 tokens during decode: its first compressed row appears."""
        torch.manual_seed(1)
        layer = DSAV4Layer(128, 2)
        run_steps(layer, [126, 20], 3)
        slots = layer.record["cmp_slots"]
        assert slots.shape == (2, 2) and int(slots[1, 0]) == -1  # request 1 completes no group
        row = layer.cmp_cache[layer.cmp_table[0, 0], 0, 0]
        assert row.abs().sum() > 0

    def test_csa_indexer_selects_the_visible_compressed_rows(self):
        """Fewer than 512 compressed rows: the indexer's top-512 is every visible row, once."""
        torch.manual_seed(2)
        layer = DSAV4Layer(4, 2)
        lens = run_steps(layer, [37, 10], 4)
        idx = layer.record["indices"]
        for b in range(2):
            got = sorted(int(c) for c in idx[b, 0] if c >= 0)
            assert got == list(range(int(lens[b]) // 4))
