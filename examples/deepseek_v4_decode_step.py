"""A DeepSeek-V4-Flash decode step in vllm-ascend's op calls (A2 / A3, bf16 caches).

Run on a laptop with:  ascend-emu run examples/deepseek_v4_decode_step.py
(on an Atlas A3 machine with vllm-ascend's _C_ascend library the same script runs on the NPU).

Two requests (contexts of 135 and 9 tokens) are prefilled, then decoded by one token each, through
the attention half of two V4 blocks: a CSA block (compress ratio 4, the indexer's top-512) and an
HCA block (ratio 128). Each block calls the ops as vllm-ascend's ``vllm_ascend/attention/dsa_v1.py``
and ``vllm_ascend/models/deepseek_v4/`` do:

1. ``npu_hc_pre_v2`` mixes the 4 residual copies; RMSNorm;
2. q / kv projections (plain torch here: ``npu_quant_matmul`` in a W8A8 deployment), the
   weightless per-head q RMS, ``inplace_partial_rotary_mul`` on dims 448..512 of q and kv;
   ``npu_scatter_nd_update_v2`` writes the kv rows into the SWA cache at ``(block, offset)``;
3. ``compressor_metadata`` + ``compressor`` (the fp32 state cache carries unfinished groups over
   steps) + ``npu_scatter_nd_update_v2`` into the compressed cache; for CSA also the indexer:
   its own compressor (D 128), the Hadamard rotation, int8 keys with fp16 scales, and
   ``npu_vllm_quant_lightning_indexer`` (+ ``_metadata``);
4. ``npu_sparse_attn_sharedkv`` (+ ``_metadata``) with the per-head sinks, window 127 left;
5. the inverse RoPE (``inplace_partial_rotary_mul`` with the negated sin), the grouped output
   projection (``npu_transpose_batchmatmul`` there, einsum here), ``npu_hc_post``.

The FFN / MoE half is not run. A torch golden recomputes the decode step's attention output from
the caches the ops wrote (window rows and compressed rows through the block tables, the sink in
the denominator) and the script exits non-zero unless it agrees within the dual criterion (0.005).
"""

import sys

import torch
import torch_npu  # noqa: F401  (the emulator's drop-in under ascend-emu run)

torch.manual_seed(0)
C = torch.ops._C_ascend
HIDDEN, HEADS, HEAD_DIM, ROPE, WINDOW = 4096, 64, 512, 64, 128  # DeepSeek-V4-Flash
Q_RANK, O_GROUPS, O_RANK = 1024, 8, 1024
IDX_HEADS, IDX_DIM, TOPK, HC, EPS = 64, 128, 512, 4, 1e-6
BS = 128  # block size of every paged cache (vllm-ascend --block-size 128)
STATE_BS = {4: 8, 128: 32}  # state-cache block sizes on A2 / A3 (DSV4_BLOCK_SIZES)
context = [135, 9]
B, MAX_LEN = len(context), 256
bf = torch.bfloat16


def mat(out_dim, in_dim):
    return (torch.randn(out_dim, in_dim) * in_dim ** -0.5).to(bf)


def rms(x, w=None):
    x = x.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
    return (y if w is None else y * w.float()).to(bf)


def rope_table(theta):
    inv = 1.0 / theta ** (torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)
    ang = (torch.arange(MAX_LEN, dtype=torch.float64)[:, None] * inv).repeat_interleave(2, -1)
    return ang.cos().to(bf), ang.sin().to(bf)


def hadamard(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def block_table(rows, block_size=BS):
    """Each request's blocks for ``rows`` rows, shuffled, ids from 1 (block id 0 tells the
    compressor not to update a state row)."""
    per = -(-rows // block_size)
    return (torch.randperm(B * per) + 1).view(B, per).int()


class Block:
    """The attention half of one V4 block with its weights and caches."""

    def __init__(self, ratio):
        self.ratio, coff = ratio, 2 if ratio == 4 else 1
        self.hc_fn = torch.randn(2 * HC + HC * HC, HC * HIDDEN) * (HC * HIDDEN) ** -0.5
        self.hc_scale, self.hc_base = torch.ones(3), torch.randn(2 * HC + HC * HC) * 0.1
        self.attn_norm, self.q_norm, self.kv_norm = (torch.ones(n, dtype=bf) for n in (HIDDEN, Q_RANK, HEAD_DIM))
        self.wq_a, self.wq_b, self.wkv = mat(Q_RANK, HIDDEN), mat(HEADS * HEAD_DIM, Q_RANK), mat(HEAD_DIM, HIDDEN)
        self.wo_a = mat(O_GROUPS * O_RANK, HEADS * HEAD_DIM // O_GROUPS).view(O_GROUPS, O_RANK, -1)
        self.wo_b, self.sinks = mat(HIDDEN, O_GROUPS * O_RANK), torch.randn(HEADS)
        self.cos, self.sin = rope_table(40000.0)  # compressed layers: compress_rope_theta
        self.swa_table = block_table(MAX_LEN)
        self.swa = torch.zeros(int(self.swa_table.max()) + 1, BS, 1, HEAD_DIM, dtype=bf)
        self.cmp_table = block_table(MAX_LEN // ratio)
        self.cmp = torch.zeros(int(self.cmp_table.max()) + 1, BS, 1, HEAD_DIM, dtype=bf)
        self.state_table = block_table(MAX_LEN, STATE_BS[ratio])
        nstate = int(self.state_table.max()) + 1
        self.comp = self.compressor_weights(HEAD_DIM, coff)
        self.state = torch.zeros(nstate, STATE_BS[ratio], 2 * coff * HEAD_DIM)
        if ratio == 4:
            self.idx_wq_b, self.idx_w = mat(IDX_HEADS * IDX_DIM, Q_RANK), mat(IDX_HEADS, HIDDEN)
            self.idx_comp = self.compressor_weights(IDX_DIM, coff)
            self.idx_state = torch.zeros(nstate, STATE_BS[ratio], 2 * coff * IDX_DIM)
            self.idx_k = torch.zeros(self.cmp.shape[0], BS, 1, IDX_DIM, dtype=torch.int8)
            self.idx_k_scale = torch.zeros(self.cmp.shape[0], BS, 1, dtype=torch.float16)

    def compressor_weights(self, d, coff):
        return dict(wkv=mat(coff * d, HIDDEN), wgate=mat(coff * d, HIDDEN), ape=torch.randn(self.ratio, coff * d) * 0.5,
                    norm=torch.ones(d, dtype=bf))

    def compress(self, x, w, state, cu, start_pos, n):
        cos, sin, slots = C.compressor_metadata(self.cos, self.sin, cu, start_pos, self.cmp_table, BS, 2, self.ratio,
                                                n, B)
        rows = C.compressor(x, w["wkv"], w["wgate"], state, w["ape"], w["norm"], sin.view(n, ROPE),
                            cos.view(n, ROPE), self.state_table, cu, None, start_pos, ROPE, self.ratio,
                            2 if self.ratio == 4 else 1, EPS, 2, 1)
        return rows, slots

    def forward(self, h, positions, cu, seq_lens):
        t = h.shape[0]
        start_pos = (seq_lens - (cu[1:] - cu[:-1])).int()
        y, post, comb = C.npu_hc_pre_v2(h, self.hc_fn, self.hc_scale, self.hc_base, HC, 20, EPS, EPS)
        x = rms(y, self.attn_norm)
        qr = rms(x @ self.wq_a.T, self.q_norm)
        q = rms((qr @ self.wq_b.T).view(t, HEADS, HEAD_DIM)).view(t, 1, HEADS, HEAD_DIM).contiguous()
        kv = rms(x @ self.wkv.T, self.kv_norm).view(t, 1, 1, HEAD_DIM).contiguous()
        cos, sin = self.cos[positions].view(t, 1, 1, ROPE), self.sin[positions].view(t, 1, 1, ROPE)
        C.inplace_partial_rotary_mul(q, cos, sin, "interleave", [HEAD_DIM - ROPE, HEAD_DIM])
        C.inplace_partial_rotary_mul(kv, cos, sin, "interleave", [HEAD_DIM - ROPE, HEAD_DIM])
        req = torch.repeat_interleave(torch.arange(B), cu[1:] - cu[:-1])
        slots = torch.stack([self.swa_table[req, positions // BS], positions % BS], 1).int()
        C.npu_scatter_nd_update_v2(self.swa, slots, kv.view(t, 1, HEAD_DIM))
        n = min(t, t // self.ratio + B)
        rows, cslots = self.compress(x, self.comp, self.state, cu, start_pos, n)
        C.npu_scatter_nd_update_v2(self.cmp, cslots, rows.view(n, 1, HEAD_DIM))
        indices = None
        if self.ratio == 4:
            keys, kslots = self.compress(x, self.idx_comp, self.idx_state, cu, start_pos, n)
            keys = (keys.float() @ hadamard(IDX_DIM).T).to(bf)
            kq, ks = torch_npu.npu_dynamic_quant(keys)
            C.npu_scatter_nd_update_v2(self.idx_k, kslots, kq.view(n, 1, IDX_DIM))
            C.npu_scatter_nd_update_v2(self.idx_k_scale, kslots, ks.half().view(n, 1))
            iq = (qr @ self.idx_wq_b.T).view(t, 1, IDX_HEADS, IDX_DIM).contiguous()
            C.inplace_partial_rotary_mul(iq, cos, sin, "interleave", [IDX_DIM - ROPE, IDX_DIM])
            iq = (iq.view(t * IDX_HEADS, IDX_DIM).float() @ hadamard(IDX_DIM).T).to(bf)
            qq, qs = torch_npu.npu_dynamic_quant(iq)
            weights = ((x @ self.idx_w.T).float() * (IDX_DIM ** -0.5 * IDX_HEADS ** -0.5)).half()
            meta = C.npu_vllm_quant_lightning_indexer_metadata(
                IDX_HEADS, 1, IDX_DIM, 0, 0, actual_seq_lengths_query=cu[1:], actual_seq_lengths_key=seq_lens,
                batch_size=B, max_seqlen_q=int((cu[1:] - cu[:-1]).max()), max_seqlen_k=int(seq_lens.max()),
                layout_query="TND", layout_key="PA_BSND", sparse_count=TOPK, sparse_mode=3, cmp_ratio=4)
            indices, _ = C.npu_vllm_quant_lightning_indexer(
                qq.view(t, IDX_HEADS, IDX_DIM), self.idx_k, weights, qs.half().view(t, IDX_HEADS), self.idx_k_scale,
                0, 0, cu[1:], seq_lens, self.cmp_table, meta, "TND", "PA_BSND", TOPK, 3, cmp_ratio=4)
        meta = C.npu_sparse_attn_sharedkv_metadata(
            HEADS, 1, HEAD_DIM, cu_seqlens_q=cu, seqused_kv=seq_lens, batch_size=B,
            max_seqlen_q=int((cu[1:] - cu[:-1]).max()), max_seqlen_kv=int(seq_lens.max()),
            cmp_topk=TOPK if self.ratio == 4 else 0, cmp_ratio=self.ratio, ori_win_left=WINDOW - 1,
            layout_q="TND", has_cmp_kv=True)
        o = C.npu_sparse_attn_sharedkv(
            q.view(t, HEADS, HEAD_DIM), ori_kv=self.swa, cmp_kv=self.cmp, cmp_sparse_indices=indices,
            ori_block_table=self.swa_table, cmp_block_table=self.cmp_table, cu_seqlens_q=cu, seqused_kv=seq_lens,
            sinks=self.sinks, metadata=meta, softmax_scale=HEAD_DIM ** -0.5, cmp_ratio=self.ratio, ori_mask_mode=4,
            cmp_mask_mode=3, ori_win_left=WINDOW - 1, ori_win_right=0, layout_q="TND", layout_kv="PA_ND")[0]
        self.last = (q.view(t, HEADS, HEAD_DIM).clone(), o.clone(), indices)
        o = o.view(t, 1, HEADS, HEAD_DIM).contiguous()
        C.inplace_partial_rotary_mul(o, cos, -sin, "interleave", [HEAD_DIM - ROPE, HEAD_DIM])
        og = torch.einsum("tgd,grd->tgr", o.view(t, O_GROUPS, -1).float(), self.wo_a.float()).to(bf)
        a = (og.reshape(t, -1) @ self.wo_b.T).to(bf)
        return C.npu_hc_post(a.unsqueeze(0), h.unsqueeze(0), post.unsqueeze(0), comb.unsqueeze(0))[0]


def golden(block, seq_lens):
    """The decode tokens' attention output from the caches the ops wrote (float64)."""
    q, _, indices = block.last
    out = []
    for b in range(B):
        p = int(seq_lens[b]) - 1
        win = [block.swa[block.swa_table[b, i // BS], i % BS, 0] for i in range(max(0, p - WINDOW + 1), p + 1)]
        n = (p + 1) // block.ratio
        sel = range(n) if indices is None else [int(i) for i in indices[b, 0] if i >= 0]
        rows = torch.stack(win + [block.cmp[block.cmp_table[b, c // BS], c % BS, 0] for c in sel]).double()
        s = q[b].double() @ rows.T * HEAD_DIM ** -0.5
        m = torch.maximum(s.max(-1, keepdim=True).values, block.sinks.double()[:, None])
        e = (s - m).exp()
        out.append((e / (e.sum(-1, keepdim=True) + (block.sinks.double()[:, None] - m).exp())) @ rows)
    return torch.stack(out)


def dual_ok(actual, expected, prec=0.005):
    err = (actual.double() - expected).abs()
    rel = err / expected.abs().clamp_min(1e-9)
    limit = actual.numel() * prec
    return not (int((rel > prec).sum()) > limit and int((err > prec).sum()) > limit)


blocks = [Block(4), Block(128)]
lens = torch.tensor(context, dtype=torch.int32)
cu = torch.tensor([0, *torch.cumsum(lens, 0).tolist()], dtype=torch.int32)
positions = torch.cat([torch.arange(n) for n in context])
h = torch.randn(int(cu[-1]), HC, HIDDEN).to(bf)
for blk in blocks:  # prefill
    h = blk.forward(h, positions, cu, lens)
lens = lens + 1  # one decode token per request
h = torch.randn(B, HC, HIDDEN).to(bf)
for blk in blocks:
    h = blk.forward(h, (lens - 1).long(), torch.arange(B + 1, dtype=torch.int32), lens)
ok = True
for blk in blocks:
    name = "CSA" if blk.ratio == 4 else "HCA"
    _, o, idx = blk.last
    good = dual_ok(o, golden(blk, lens))
    ok &= good
    extra = f", indexer picked {int((idx >= 0).sum(-1).max())} compressed rows" if idx is not None else ""
    print(f"{name} block: decode attention output {list(o.shape)} vs torch golden from the caches: "
          f"{'ok' if good else 'MISMATCH'}{extra}")
print(f"stream after the step: {list(h.shape)} {h.dtype}, finite: {bool(h.isfinite().all())}")
sys.exit(0 if ok and bool(h.isfinite().all()) else 1)
