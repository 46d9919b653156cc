"""vllm-ascend's DeepSeek-V3.2 sparse attention layer (``vllm_ascend/attention/sfa_v1.py``,
``AscendSFAImpl.forward``) as a CPU unit test with data flowing through the ops.

vllm-ascend's own ``tests/ut/attention/test_sfa_v1.py`` runs with a ``MagicMock`` torch_npu
(``tests/ut/conftest.py``): it can check that ``npu_sparse_flash_attention`` was called with
``layout_query="TND"``, never what came back. Here ``conftest.py`` loads
``ascend_emu.pytest_plugin``, so ``import torch_npu`` is the emulator and the test asserts values:
the caches the layer writes, the indexer's selection and the attention output, each against a
torch computation written from the ops' documented math.

:class:`SFALayer` is a reduction of ``AscendSFAImpl`` to the A2 / A3 path a bf16 model takes
(``PreprocessType.NATIVE``, no C8, no context parallel, no triton): the same op calls with the same
arguments, in the same order; vLLM's config, linear layers and distributed groups reduced to
plain weights. Where vllm-ascend calls ``torch.ops._C_ascend.<op>`` (its own binding of the same
kernel) this file calls ``torch_npu.<op>`` and says so in a ``# vllm-ascend:`` comment.

Run: ``python -m pytest examples/vllm_ascend_ut -q`` (a few seconds).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch_npu

# DeepSeek-V3.2 MLA dims (fixed by the kernels) and small model dims.
KV_LORA_RANK, QK_NOPE_HEAD_DIM, QK_ROPE_HEAD_DIM, V_HEAD_DIM = 512, 128, 64, 128
HIDDEN, Q_LORA_RANK, NUM_HEADS = 256, 128, 8
INDEX_N_HEADS, INDEX_HEAD_DIM = 16, 128  # DeepSeek-V3.2: 64 heads; the A2 / A3 indexer takes N1 <= 64
BLOCK_SIZE = 128  # AscendSFABackend.get_supported_kernel_block_sizes()
#: npu_kv_rmsnorm_rope_cache takes each token as a batch (vllm-ascend: kv [T, 1, 1, 576], cache_mode PA)
#: and asks for block_num >= ceil(S / block_size) * B = T blocks: at least the largest step's tokens.
NUM_BLOCKS = 96
EPS = 1e-6
ACL_FORMAT_FRACTAL_ND, ACL_FORMAT_FRACTAL_NZ = 2, 29  # vllm_ascend.utils


def rms_norm(x, gamma, eps=EPS):
    """RMSNorm in fp32, as vLLM's RMSNorm layer (q_a_layernorm) computes it on CPU."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()).to(x.dtype)


class SFALayer:
    """``AscendSFAImpl`` reduced to its native A2 / A3 forward (sfa_v1.py); method names are
    vllm-ascend's. Weights are ``[in, out]`` matrices (vLLM's linear layers hold ``[out, in]`` and
    multiply by the transpose: the same product)."""

    def __init__(self, nz_weight, *, sparse_count: int = 2048):
        self.num_heads = NUM_HEADS
        self.scale = (QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM) ** -0.5
        self.sparse_count = sparse_count  # vllm-ascend passes 2048
        self.fused_qkv_a_proj = nz_weight([HIDDEN, Q_LORA_RANK + KV_LORA_RANK + QK_ROPE_HEAD_DIM])
        self.q_a_layernorm = torch.ones(Q_LORA_RANK, dtype=torch.bfloat16).npu()
        self.kv_a_layernorm = (1 + 0.1 * torch.randn(KV_LORA_RANK)).to(torch.bfloat16).npu()
        self.q_proj = nz_weight([Q_LORA_RANK, NUM_HEADS * (QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM)])
        # kv_b_proj as vLLM stores it: [N * (P + V), L], cast to NZ at load time
        self.kv_b_proj = nz_weight([NUM_HEADS * (QK_NOPE_HEAD_DIM + V_HEAD_DIM), KV_LORA_RANK])
        self.o_proj = nz_weight([NUM_HEADS * V_HEAD_DIM, HIDDEN])
        # indexer (vllm_ascend's Indexer module): wq_b, wk_weights_proj = [wk | weights_proj], k_norm
        self.wq_b = nz_weight([Q_LORA_RANK, INDEX_N_HEADS * INDEX_HEAD_DIM])
        self.wk_weights_proj = nz_weight([HIDDEN, INDEX_HEAD_DIM + INDEX_N_HEADS])
        self.k_norm = (torch.ones(INDEX_HEAD_DIM), torch.zeros(INDEX_HEAD_DIM))  # LayerNorm weight, bias
        self.record = SimpleNamespace()  # the intermediate tensors, for the assertions
        self.process_weights_after_loading()

    def process_weights_after_loading(self):
        kv_b_proj_weight = torch_npu.npu_format_cast(self.kv_b_proj, ACL_FORMAT_FRACTAL_ND).T
        kv_b_proj_weight = kv_b_proj_weight.view(KV_LORA_RANK, self.num_heads, QK_NOPE_HEAD_DIM + V_HEAD_DIM)
        W_UK, W_UV = kv_b_proj_weight.split([QK_NOPE_HEAD_DIM, V_HEAD_DIM], dim=-1)
        self.W_UV = W_UV.transpose(0, 1).contiguous()  # (N, L, V)
        self.W_UK_T = W_UK.permute(1, 2, 0).contiguous()  # (N, P, L)

    def rope_single(self, x, cos, sin):
        B, N, D = x.shape
        x = x.view(B, N, 1, D)
        x = torch_npu.npu_interleave_rope(x, cos, sin)
        return x.view(B, N, D)

    def exec_kv(self, kv_no_split, cos, sin, kv_cache, slots):
        B = kv_no_split.shape[0]
        kv_no_split = kv_no_split.view(B, 1, 1, KV_LORA_RANK + QK_ROPE_HEAD_DIM)  # [B, N, S, D]
        torch_npu.npu_kv_rmsnorm_rope_cache(
            kv_no_split, self.kv_a_layernorm, cos, sin, slots.to(torch.int64), kv_cache[1], kv_cache[0],
            epsilon=EPS, cache_mode="PA")

    def _q_proj_and_k_up_proj(self, x):
        q_nope, q_pe = (x @ self.q_proj).view(-1, self.num_heads, QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM).split(
            [QK_NOPE_HEAD_DIM, QK_ROPE_HEAD_DIM], dim=-1)
        ql_nope = torch.bmm(q_nope.transpose(0, 1), self.W_UK_T)  # (N, B, P) x (N, P, L) -> (N, B, L)
        return ql_nope.transpose(0, 1), q_pe

    def _v_up_proj(self, x):
        # vllm-ascend: torch.ops._C_ascend.batch_matmul_transpose / torch_npu.npu_transpose_batchmatmul
        # when present; neither is emulated, so its torch.bmm fallback branch
        x = x.view(-1, self.num_heads, KV_LORA_RANK).transpose(0, 1)
        x = torch.bmm(x, self.W_UV)  # (N, B, L) x (N, L, V) -> (N, B, V)
        return x.transpose(0, 1).reshape(-1, self.num_heads * V_HEAD_DIM)

    def indexer_select_pre_process(self, x, cos, sin):
        kw = x @ self.wk_weights_proj
        k_li = torch.nn.functional.layer_norm(kw[:, :INDEX_HEAD_DIM].float(), (INDEX_HEAD_DIM,), *self.k_norm)
        k_li = k_li.to(x.dtype).view(-1, 1, INDEX_HEAD_DIM)
        # not HAS_TRITON: rope on the first 64 dims with npu_rotary_mul
        k_li_pe, k_li_nope = torch.split(k_li, [QK_ROPE_HEAD_DIM, INDEX_HEAD_DIM - QK_ROPE_HEAD_DIM], dim=-1)
        k_li_pe = torch_npu.npu_rotary_mul(k_li_pe.unsqueeze(2), cos.view(-1, 1, 1, QK_ROPE_HEAD_DIM),
                                           sin.view(-1, 1, 1, QK_ROPE_HEAD_DIM)).squeeze(2)
        return torch.cat([k_li_pe, k_li_nope], dim=-1)  # [T, 1, 128]

    def indexer_select_post_process(self, x, q_c, kv_cache, attn_metadata, cos, sin, actual_seq_lengths_query,
                                    actual_seq_lengths_key):
        # vllm-ascend passes kw[:, head_dim:], a strided view; the indexer's doc takes contiguous
        # inputs only and the emulator holds to it
        weights = (x @ self.wk_weights_proj)[:, INDEX_HEAD_DIM:].contiguous()
        q_li = (q_c @ self.wq_b).view(-1, INDEX_N_HEADS, INDEX_HEAD_DIM)
        q_li_pe, q_li_nope = torch.split(q_li, [QK_ROPE_HEAD_DIM, INDEX_HEAD_DIM - QK_ROPE_HEAD_DIM], dim=-1)
        q_li_pe = torch_npu.npu_rotary_mul(q_li_pe.unsqueeze(2), cos, sin).squeeze(2)
        q_li = torch.cat([q_li_pe, q_li_nope], dim=-1)
        self.record.q_li, self.record.weights = q_li, weights
        # vllm-ascend: torch.ops._C_ascend.npu_lightning_indexer
        topk_indices, _ = torch_npu.npu_lightning_indexer(
            query=q_li, key=kv_cache[2], weights=weights, actual_seq_lengths_query=actual_seq_lengths_query,
            actual_seq_lengths_key=actual_seq_lengths_key, block_table=attn_metadata.block_table,
            layout_query="TND", layout_key="PA_BSND", sparse_count=self.sparse_count, sparse_mode=3)
        return topk_indices

    def forward(self, hidden_states, kv_cache, attn_metadata, output):
        cos, sin = attn_metadata.cos, attn_metadata.sin
        slot_mapping = attn_metadata.slot_mapping
        actual_seq_lengths_query = attn_metadata.cum_query_lens
        actual_seq_lengths_key = attn_metadata.seq_lens

        qkv_lora = hidden_states @ self.fused_qkv_a_proj
        q_c, kv_no_split = qkv_lora.split([Q_LORA_RANK, KV_LORA_RANK + QK_ROPE_HEAD_DIM], dim=-1)
        q_c = rms_norm(q_c, self.q_a_layernorm)
        k_li = self.indexer_select_pre_process(hidden_states, cos, sin)
        self.exec_kv(kv_no_split, cos, sin, kv_cache, slot_mapping)
        ql_nope, q_pe = self._q_proj_and_k_up_proj(q_c)
        # vllm-ascend passes q_pe, a view of the q_proj split; npu_interleave_rope's doc rules out
        # non-contiguous tensors and the emulator holds to it, so the view is made contiguous here
        q_pe = self.rope_single(q_pe.contiguous(), cos, sin)
        # vllm-ascend: torch_npu.npu_scatter_nd_update_(kv_cache[2].view(-1, 128), slot_mapping.view(-1, 1),
        # k_li.view(-1, 128)) (not emulated: the same row scatter in torch)
        kv_cache[2].view(-1, INDEX_HEAD_DIM)[slot_mapping.long()] = k_li.view(-1, INDEX_HEAD_DIM)
        topk_indices = self.indexer_select_post_process(hidden_states, q_c, kv_cache, attn_metadata, cos, sin,
                                                        actual_seq_lengths_query, actual_seq_lengths_key)
        # vllm-ascend: torch.ops._C_ascend.npu_sparse_flash_attention (returns three tensors, as torch_npu's)
        attn_output, _, _ = torch_npu.npu_sparse_flash_attention(
            query=ql_nope, key=kv_cache[0], value=kv_cache[0], sparse_indices=topk_indices,
            scale_value=self.scale, sparse_block_size=1, block_table=attn_metadata.block_table,
            actual_seq_lengths_query=actual_seq_lengths_query, actual_seq_lengths_kv=actual_seq_lengths_key,
            query_rope=q_pe, key_rope=kv_cache[1], layout_query="TND", layout_kv="PA_BSND", sparse_mode=3,
            attention_mode=2, return_softmax_lse=False)
        self.record.__dict__.update(kv_no_split=kv_no_split, k_li=k_li, ql_nope=ql_nope, q_pe=q_pe,
                                    topk_indices=topk_indices, attn_output=attn_output)
        output[...] = self._v_up_proj(attn_output) @ self.o_proj
        return output


def rope_tables(positions):
    """cos / sin ``[T, 1, 1, 64]`` in the half layout (``get_cos_and_sin_mla``: theta base 10000)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, QK_ROPE_HEAD_DIM, 2).float() / QK_ROPE_HEAD_DIM)
    angles = positions.float()[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1).view(-1, 1, 1, QK_ROPE_HEAD_DIM)
    return angles.cos().to(torch.bfloat16).npu(), angles.sin().to(torch.bfloat16).npu()


def metadata(table, query_lens, kv_lens):
    """``AscendSFAMetadata`` of a step: each request's last ``query_lens[b]`` of ``kv_lens[b]`` tokens."""
    positions = torch.cat([torch.arange(k - q, k) for q, k in zip(query_lens, kv_lens)])
    slot_mapping = torch.cat([table.slots[b, k - q:k] for b, (q, k) in enumerate(zip(query_lens, kv_lens))])
    cos, sin = rope_tables(positions)
    return SimpleNamespace(
        slot_mapping=slot_mapping.npu(), block_table=table.block_table, cos=cos, sin=sin, positions=positions,
        cum_query_lens=torch.tensor(query_lens).cumsum(0).to(torch.int32).npu(),
        seq_lens=torch.tensor(kv_lens, dtype=torch.int32).npu())


def assert_close(got, want, *, rtol, atol):
    """``|got - want| <= atol + rtol * |want|`` everywhere (fp32 tensors of one shape)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    bad = (got - want).abs() > atol + rtol * want.abs()
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} elements differ, first at {bad.nonzero()[0].tolist()}"


def interleave_rope(x, cos, sin):
    """The interleaved RoPE of npu_kv_rmsnorm_rope_cache / npu_interleave_rope, fp32: de-interleave
    the pairs, then ``q * cos + rotate_half(q) * sin``."""
    q = x.float().unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
    half = q.shape[-1] // 2
    return q * cos.float() + torch.cat([-q[..., half:], q[..., :half]], dim=-1) * sin.float()


@pytest.fixture
def sfa_setup(nz_weight, mla_caches, paged_cache, block_table):
    """The block table and the three caches of vllm-ascend's SFA tuple (c_kv, k_rope, indexer k)
    for two requests with room for 71 and 24 tokens."""
    torch.manual_seed(0)
    table = block_table([71, 24], BLOCK_SIZE, num_blocks=NUM_BLOCKS)
    ckv_cache, k_rope_cache = mla_caches(table.num_blocks, BLOCK_SIZE)
    kv_cache = (ckv_cache, k_rope_cache, paged_cache(table.num_blocks, BLOCK_SIZE, INDEX_HEAD_DIM))
    return table, kv_cache


def run_step(layer, table, kv_cache, query_lens, kv_lens):
    meta = metadata(table, query_lens, kv_lens)
    hidden_states = torch.randn(sum(query_lens), HIDDEN).to(torch.bfloat16).npu()
    output = torch.empty(sum(query_lens), HIDDEN, dtype=torch.bfloat16).npu()
    layer.forward(hidden_states, kv_cache, meta, output)
    return meta, output


def check_caches(layer, meta, kv_cache):
    """The rows the step wrote: RmsNorm(c_kv) * gamma and the interleaved RoPE of k_pe (fp32, one
    bf16 rounding: at most one bf16 ulp apart from the kernel's summation order)."""
    slots = meta.slot_mapping.cpu().long()
    kv = layer.record.kv_no_split.cpu().view(-1, KV_LORA_RANK + QK_ROPE_HEAD_DIM).float()
    c_kv = kv[:, :KV_LORA_RANK]
    want_ckv = c_kv * torch.rsqrt(c_kv.pow(2).mean(-1, keepdim=True) + EPS) * layer.kv_a_layernorm.cpu().float()
    want_rope = interleave_rope(kv[:, KV_LORA_RANK:], meta.cos.cpu().view(-1, 64), meta.sin.cpu().view(-1, 64))
    got_ckv = kv_cache[0].cpu().view(-1, KV_LORA_RANK)[slots].float()
    got_rope = kv_cache[1].cpu().view(-1, QK_ROPE_HEAD_DIM)[slots].float()
    assert_close(got_ckv, want_ckv.to(torch.bfloat16).float(), rtol=8e-3, atol=1e-3)
    assert_close(got_rope, want_rope.to(torch.bfloat16).float(), rtol=8e-3, atol=1e-3)
    idx = kv_cache[2].cpu().view(-1, INDEX_HEAD_DIM)[slots]
    assert torch.equal(idx, layer.record.k_li.cpu().view(-1, INDEX_HEAD_DIM))


def check_selection_and_attention(layer, meta, table, kv_cache, query_lens, kv_lens):
    """Per query token: the indexer picked the highest-scoring causal positions
    (``score_j = sum_h w_h * relu(q_h . k_j)``), and the sparse attention output is a dense
    softmax over exactly the picked tokens, computed in torch from the cache rows (P and the
    output rounded to bf16 as the op documents)."""
    rec = layer.record
    ckv = kv_cache[0].cpu().view(-1, KV_LORA_RANK).float()
    krope = kv_cache[1].cpu().view(-1, QK_ROPE_HEAD_DIM).float()
    kidx = kv_cache[2].cpu().view(-1, INDEX_HEAD_DIM).float()
    topk = rec.topk_indices.cpu().view(sum(query_lens), -1)  # [T, sparse_count] (N2 = 1)
    t = 0
    for b, (q_len, kv_len) in enumerate(zip(query_lens, kv_lens)):
        for s in range(q_len):
            visible = kv_len - q_len + s + 1  # sparse_mode 3: right-down causal
            slots = table.slots[b, :visible]
            row = topk[t]
            picked = row[row >= 0].long()
            assert len(picked) == min(layer.sparse_count, visible), (t, len(picked))
            assert (row[len(picked):] == -1).all() and len(set(picked.tolist())) == len(picked)
            score = (torch.relu(rec.q_li[t].cpu().float() @ kidx[slots].T) * rec.weights[t].cpu().float()[:, None]
                     ).sum(0)  # [visible]
            rest = torch.ones(visible, dtype=torch.bool)
            rest[picked] = False
            if rest.any():  # the selection is the top of the scores (up to bf16 noise in the score)
                assert score[rest].max() <= score[picked].min() + 2e-2 * score.abs().max(), t
            q = torch.cat([rec.ql_nope[t].cpu().float(), rec.q_pe[t].cpu().float()], dim=-1)  # [N, 576]
            k = torch.cat([ckv[slots[picked]], krope[slots[picked]]], dim=-1)  # [K, 576]
            p = torch.softmax(q @ k.T * layer.scale, dim=-1).to(torch.bfloat16).float()  # P in the query dtype
            want = (p @ ckv[slots[picked]]).to(torch.bfloat16).float()  # [N, 512]
            assert_close(rec.attn_output[t].cpu().float(), want, rtol=1e-2, atol=1e-3)
            t += 1


class TestAscendSFAImplForward:
    def test_prefill_then_decode(self, sfa_setup, nz_weight):
        """A chunked-prefill step writes both prompts into the caches, a decode step adds one
        token each; every written row, every selection and every output is checked."""
        table, kv_cache = sfa_setup
        layer = SFALayer(nz_weight)
        meta, out = run_step(layer, table, kv_cache, [70, 23], [70, 23])
        check_caches(layer, meta, kv_cache)
        check_selection_and_attention(layer, meta, table, kv_cache, [70, 23], [70, 23])
        assert out.shape == (93, HIDDEN) and torch.isfinite(out.cpu().float()).all()
        meta, out = run_step(layer, table, kv_cache, [1, 1], [71, 24])
        check_caches(layer, meta, kv_cache)
        check_selection_and_attention(layer, meta, table, kv_cache, [1, 1], [71, 24])
        # value up-projection straight from kv_b_proj [N * (P + V), L] (its V rows of each head), then o_proj
        w_uv = layer.kv_b_proj.cpu().float().view(NUM_HEADS, QK_NOPE_HEAD_DIM + V_HEAD_DIM, KV_LORA_RANK)
        v = torch.einsum("tnl,nvl->tnv", layer.record.attn_output.cpu().float(), w_uv[:, QK_NOPE_HEAD_DIM:])
        want = v.reshape(2, -1).to(torch.bfloat16).float() @ layer.o_proj.cpu().float()
        assert_close(out.cpu().float(), want, rtol=2e-2, atol=2e-2)

    def test_decode_attends_to_the_indexer_top_k(self, sfa_setup, nz_weight):
        """With a longer context (70 tokens) and a top-32 indexer the attention sees only the
        selected tokens: the output matches the softmax over them and not the dense one."""
        table, kv_cache = sfa_setup
        layer = SFALayer(nz_weight, sparse_count=32)
        run_step(layer, table, kv_cache, [70, 23], [70, 23])
        meta, _ = run_step(layer, table, kv_cache, [1, 1], [71, 24])
        check_selection_and_attention(layer, meta, table, kv_cache, [1, 1], [71, 24])
        rec = layer.record
        slots = table.slots[0, :71]
        q = torch.cat([rec.ql_nope[0].cpu().float(), rec.q_pe[0].cpu().float()], dim=-1)
        k = torch.cat([kv_cache[0].cpu().view(-1, 512)[slots], kv_cache[1].cpu().view(-1, 64)[slots]], -1).float()
        dense = torch.softmax(q @ k.T * layer.scale, dim=-1) @ k[:, :KV_LORA_RANK]
        assert not torch.allclose(rec.attn_output[0].cpu().float(), dense, rtol=2e-2, atol=2e-3)

    def test_cache_layout_is_pa_bsnd(self, sfa_setup):
        """The caches are ``[num_blocks, block_size, 1, D]`` (AscendSFABackend.get_kv_cache_shape)
        on the npu device."""
        _, kv_cache = sfa_setup
        assert [tuple(c.shape) for c in kv_cache] == [(NUM_BLOCKS, BLOCK_SIZE, 1, d) for d in (512, 64, 128)]
        assert all(c.device.type == "npu" for c in kv_cache)
