"""vllm-ascend's DeepSeek-V3.2 sparse attention layer (``vllm_ascend/attention/sfa_v1.py``,
``AscendSFAImpl.forward``) as a CPU unit test with data flowing through the ops.

vllm-ascend's own ``tests/ut/attention/test_sfa_v1.py`` runs with a ``MagicMock`` torch_npu
(``tests/ut/conftest.py``): it can check that ``npu_sparse_flash_attention`` was called with
``layout_query="TND"``, never what came back. Here ``conftest.py`` loads
``ascend_emu.pytest_plugin``, so ``import torch_npu`` is the emulator and the test asserts values:
the caches the layer writes, the indexer's selection and the attention output, each against a
torch computation written from the ops' documented math.

:class:`SFALayer` is a reduction of ``AscendSFAImpl`` to the A2 / A3 path a bf16 model takes
(``PreprocessType.NATIVE``, no context parallel, no triton, no sparse SFA C8), with or without
the C8 lightning indexer (``enable_sparse_li_c8``: int8 indexer keys and queries from
``npu_dynamic_quant``, an fp16 key-scale cache, ``npu_lightning_indexer_quant``): the same op
calls with the same arguments, in the same order; vLLM's config, linear layers and distributed
groups reduced to plain weights. vllm-ascend's own ops go through ``torch.ops._C_ascend.<op>``
(the emulator registers that namespace with vllm-ascend's schemas), called as
``vllm_ascend/device/device_op.py`` calls them, each marked ``# vllm-ascend:`` (read at
vllm-project/vllm-ascend@182b75ea, the snapshot of the ``_C_ascend`` schemas). Where it calls an
op the emulator does not have (``npu_scatter_nd_update_``, ``batch_matmul_transpose``), a
plain-torch stand-in says so in a comment.

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
#: The C8 test's prompts: the first spans two cache blocks, which the block table holds in
#: descending order (175 blocks, at least the prefill step's 173 tokens, and the fixtures' seed),
#: so the keys and their scales are read through the block table, not in slot order.
C8_PROMPT_LENS, C8_NUM_BLOCKS = [150, 23], 175
EPS = 1e-6
ACL_FORMAT_FRACTAL_ND, ACL_FORMAT_FRACTAL_NZ = 2, 29  # vllm_ascend.utils
#: AscendSFAImpl's C8 indexer dtypes on A2 / A3 (sfa_v1.py ``c8_k_cache_dtype`` / ``c8_k_scale_cache_dtype``)
C8_K_CACHE_DTYPE, C8_K_SCALE_CACHE_DTYPE = torch.int8, torch.float16


def hadamard(n):
    """The ``n x n`` Sylvester Hadamard matrix (what ``scipy.linalg.hadamard(n)`` returns), fp32."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rms_norm(x, gamma, eps=EPS):
    """RMSNorm in fp32, as vLLM's RMSNorm layer (q_a_layernorm) computes it on CPU."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()).to(x.dtype)


class SFALayer:
    """``AscendSFAImpl`` reduced to its native A2 / A3 forward (sfa_v1.py); method names are
    vllm-ascend's. Weights are ``[in, out]`` matrices (vLLM's linear layers hold ``[out, in]`` and
    multiply by the transpose: the same product)."""

    def __init__(self, nz_weight, *, sparse_count: int = 2048, enable_sparse_li_c8: bool = False):
        self.num_heads = NUM_HEADS
        self.head_dim = INDEX_HEAD_DIM
        self.enable_sparse_li_c8 = enable_sparse_li_c8
        # kv_cache tuple (AscendSFAImpl.kv_cache_indexer_k_idx / _scale_idx without sparse SFA C8):
        # (k_nope, k_pe, indexer_k[, indexer_scale])
        self.kv_cache_indexer_k_idx, self.kv_cache_indexer_scale_idx = 2, 3
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
        self.k_norm = (torch.ones(INDEX_HEAD_DIM).npu(), torch.zeros(INDEX_HEAD_DIM).npu())  # LayerNorm weight, bias
        self.record = SimpleNamespace()  # the intermediate tensors, for the assertions
        self.process_weights_after_loading()

    def process_weights_after_loading(self):
        kv_b_proj_weight = torch_npu.npu_format_cast(self.kv_b_proj, ACL_FORMAT_FRACTAL_ND).T
        kv_b_proj_weight = kv_b_proj_weight.view(KV_LORA_RANK, self.num_heads, QK_NOPE_HEAD_DIM + V_HEAD_DIM)
        W_UK, W_UV = kv_b_proj_weight.split([QK_NOPE_HEAD_DIM, V_HEAD_DIM], dim=-1)
        self.W_UV = W_UV.transpose(0, 1).contiguous()  # (N, L, V)
        self.W_UK_T = W_UK.permute(1, 2, 0).contiguous()  # (N, P, L)
        if self.enable_sparse_li_c8:  # AscendSFAImpl.q_hadamard / k_hadamard: bf16 hadamard(128) / sqrt(128)
            self.q_hadamard = (hadamard(INDEX_HEAD_DIM).to(torch.bfloat16) / INDEX_HEAD_DIM ** 0.5).npu()
            self.k_hadamard = (hadamard(INDEX_HEAD_DIM).to(torch.bfloat16) / INDEX_HEAD_DIM ** 0.5).npu()

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
        k_li = torch.cat([k_li_pe, k_li_nope], dim=-1)  # [T, 1, 128]
        if self.enable_sparse_li_c8:
            k_li = k_li @ self.k_hadamard
            self.record.k_li_rotated = k_li
            k_li, k_li_scale = torch_npu.npu_dynamic_quant(k_li.view(-1, self.head_dim), dst_type=C8_K_CACHE_DTYPE)
            k_li_scale = k_li_scale.to(C8_K_SCALE_CACHE_DTYPE)  # [T]
            k_li_scale = k_li_scale.unsqueeze(-1)  # [T, 1]
        else:
            k_li_scale = None
        return k_li, k_li_scale

    def indexer_select_post_process(self, x, q_c, kv_cache, attn_metadata, cos, sin, actual_seq_lengths_query,
                                    actual_seq_lengths_key):
        weights = (x @ self.wk_weights_proj)[:, INDEX_HEAD_DIM:]
        q_li = (q_c @ self.wq_b).view(-1, INDEX_N_HEADS, INDEX_HEAD_DIM)
        q_li_pe, q_li_nope = torch.split(q_li, [QK_ROPE_HEAD_DIM, INDEX_HEAD_DIM - QK_ROPE_HEAD_DIM], dim=-1)
        q_li_pe = torch_npu.npu_rotary_mul(q_li_pe.unsqueeze(2), cos, sin).squeeze(2)
        q_li = torch.cat([q_li_pe, q_li_nope], dim=-1)
        self.record.q_li = q_li
        if self.enable_sparse_li_c8:
            q_li_shape_ori = q_li.shape
            q_li = q_li @ self.q_hadamard
            self.record.q_li_rotated = q_li
            q_li, q_li_scale = torch_npu.npu_dynamic_quant(q_li.view(-1, self.head_dim), dst_type=C8_K_CACHE_DTYPE)
            q_li_scale = q_li_scale.to(C8_K_SCALE_CACHE_DTYPE)  # [T * N]
            # DeviceOperator.indexer_select_post_process, enable_sparse_li_c8 branch
            weights = weights.to(torch.float16)
            self.record.__dict__.update(q_li_int8=q_li.view(q_li_shape_ori),
                                        q_li_scale=q_li_scale.view(q_li_shape_ori[:-1]), weights=weights)
            # vllm-ascend: torch.ops._C_ascend.npu_lightning_indexer_quant (sparse_count 2048 there)
            return torch.ops._C_ascend.npu_lightning_indexer_quant(
                query=q_li.view(q_li_shape_ori), key=kv_cache[self.kv_cache_indexer_k_idx], weights=weights,
                query_dequant_scale=q_li_scale.view(q_li_shape_ori[:-1]),
                key_dequant_scale=kv_cache[self.kv_cache_indexer_scale_idx].squeeze(2),  # B S N D -> B S D
                actual_seq_lengths_query=actual_seq_lengths_query, actual_seq_lengths_key=actual_seq_lengths_key,
                block_table=attn_metadata.block_table, query_quant_mode=0, key_quant_mode=0, layout_query="TND",
                layout_key="PA_BSND", sparse_count=self.sparse_count, sparse_mode=3)
        # vllm-ascend passes kw[:, head_dim:], a strided view; the indexer's doc takes contiguous
        # inputs only and the emulator holds to it
        weights = weights.contiguous()
        self.record.weights = weights
        # vllm-ascend: torch.ops._C_ascend.npu_lightning_indexer (sparse_count 2048 there)
        topk_indices, _ = torch.ops._C_ascend.npu_lightning_indexer(
            query=q_li, key=kv_cache[self.kv_cache_indexer_k_idx], weights=weights,
            actual_seq_lengths_query=actual_seq_lengths_query, actual_seq_lengths_key=actual_seq_lengths_key,
            block_table=attn_metadata.block_table, layout_query="TND", layout_key="PA_BSND",
            sparse_count=self.sparse_count, sparse_mode=3)
        return topk_indices

    def forward(self, hidden_states, kv_cache, attn_metadata, output):
        cos, sin = attn_metadata.cos, attn_metadata.sin
        slot_mapping = attn_metadata.slot_mapping
        actual_seq_lengths_query = attn_metadata.cum_query_lens
        actual_seq_lengths_key = attn_metadata.seq_lens

        qkv_lora = hidden_states @ self.fused_qkv_a_proj
        q_c, kv_no_split = qkv_lora.split([Q_LORA_RANK, KV_LORA_RANK + QK_ROPE_HEAD_DIM], dim=-1)
        q_c = rms_norm(q_c, self.q_a_layernorm)
        k_li, k_li_scale = self.indexer_select_pre_process(hidden_states, cos, sin)
        self.exec_kv(kv_no_split, cos, sin, kv_cache, slot_mapping)
        ql_nope, q_pe = self._q_proj_and_k_up_proj(q_c)
        # vllm-ascend passes q_pe, a view of the q_proj split; npu_interleave_rope's doc rules out
        # non-contiguous tensors and the emulator holds to it, so the view is made contiguous here
        q_pe = self.rope_single(q_pe.contiguous(), cos, sin)
        # vllm-ascend: torch_npu.npu_scatter_nd_update_(kv_cache[dsa_k_cache_idx].view(-1, k_li.shape[-1]),
        # slot_mapping.view(-1, 1), k_li.view(-1, k_li.shape[-1])) (not emulated: the same row scatter in torch)
        kv_cache[self.kv_cache_indexer_k_idx].view(-1, k_li.shape[-1])[slot_mapping.long()] = k_li.view(
            -1, k_li.shape[-1])
        if self.enable_sparse_li_c8:
            # vllm-ascend: torch_npu.npu_scatter_nd_update_(kv_cache[dsa_k_scale_cache_idx].view(-1, 1),
            # slot_mapping.view(-1, 1), k_li_scale.view(-1, 1)) (not emulated: the same row scatter in torch)
            kv_cache[self.kv_cache_indexer_scale_idx].view(-1, k_li_scale.shape[-1])[slot_mapping.long()] = (
                k_li_scale.view(-1, k_li_scale.shape[-1]))
        topk_indices = self.indexer_select_post_process(hidden_states, q_c, kv_cache, attn_metadata, cos, sin,
                                                        actual_seq_lengths_query, actual_seq_lengths_key)
        # vllm-ascend: torch.ops._C_ascend.npu_sparse_flash_attention (DeviceOperator.
        # execute_sparse_flash_attention_process: three outputs, the first kept without return_lse)
        result = torch.ops._C_ascend.npu_sparse_flash_attention(
            query=ql_nope, key=kv_cache[0], value=kv_cache[0], sparse_indices=topk_indices,
            scale_value=self.scale, sparse_block_size=1, block_table=attn_metadata.block_table,
            actual_seq_lengths_query=actual_seq_lengths_query, actual_seq_lengths_kv=actual_seq_lengths_key,
            query_rope=q_pe, key_rope=kv_cache[1], layout_query="TND", layout_kv="PA_BSND", sparse_mode=3,
            attention_mode=2, return_softmax_lse=False)
        attn_output = result[0]
        self.record.__dict__.update(kv_no_split=kv_no_split, k_li=k_li, k_li_scale=k_li_scale, ql_nope=ql_nope,
                                    q_pe=q_pe, topk_indices=topk_indices, attn_output=attn_output)
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
    positions = torch.cat([torch.arange(k - q, k) for q, k in zip(query_lens, kv_lens, strict=True)])
    slot_mapping = torch.cat([table.slots[b, k - q:k] for b, (q, k) in enumerate(zip(query_lens, kv_lens, strict=True))])
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


@pytest.fixture
def sfa_c8_setup(mla_caches, paged_cache, block_table):
    """The block table and the four caches of vllm-ascend's SFA tuple with the C8 indexer
    (``_compose_sfa_kv_cache``, LI C8 only): c_kv, k_rope, int8 indexer k ``[.., 1, 128]``, fp16
    indexer scale ``[.., 1, 1]``, for two requests with room for :data:`C8_PROMPT_LENS` + 1 tokens."""
    torch.manual_seed(0)
    table = block_table([n + 1 for n in C8_PROMPT_LENS], BLOCK_SIZE, num_blocks=C8_NUM_BLOCKS)
    assert table.block_table[0, 0] > table.block_table[0, 1], table.block_table  # C8_NUM_BLOCKS's premise
    ckv_cache, k_rope_cache = mla_caches(table.num_blocks, BLOCK_SIZE)
    kv_cache = (ckv_cache, k_rope_cache,
                paged_cache(table.num_blocks, BLOCK_SIZE, INDEX_HEAD_DIM, dtype=C8_K_CACHE_DTYPE),
                paged_cache(table.num_blocks, BLOCK_SIZE, 1, dtype=C8_K_SCALE_CACHE_DTYPE))
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
    if layer.enable_sparse_li_c8:  # the int8 key and its fp16 scale: dynamic_quant of the rotated key
        want_k, want_scale = dynamic_quant_int8(layer.record.k_li_rotated.cpu().view(-1, INDEX_HEAD_DIM))
        assert torch.equal(idx, want_k)
        assert torch.equal(kv_cache[3].cpu().view(-1)[slots], want_scale.to(C8_K_SCALE_CACHE_DTYPE))


def dynamic_quant_int8(x):
    """npu_dynamic_quant's per-token int8 (its doc and op-plugin's golden: ``scale = max|x| / 127``),
    in torch with the kernel's steps: ``m = fp32(127 / max|x|)``, ``y = rint(x * m)`` (half to
    even), dequant scale ``max|x| * fp32(1 / 127)``. Returns (int8 y, fp32 scale ``[rows]``)."""
    v = x.float()
    amax = v.abs().amax(-1, keepdim=True)
    y = torch.round(v * (torch.tensor(127.0) / amax)).to(torch.int8)
    return y, (amax * torch.tensor(1 / 127, dtype=torch.float32)).squeeze(-1)


def selections(layer, table, query_lens, kv_lens):
    """Per query token, in order: ``(t, visible, slots, picked)``: its index, how many positions
    sparse_mode 3 (right-down causal) lets it see, their cache slots and the positions the
    indexer picked; checks that the pick is ``min(sparse_count, visible)`` distinct positions
    followed by -1 padding."""
    topk = layer.record.topk_indices.cpu().view(sum(query_lens), -1)  # [T, sparse_count] (N2 = 1)
    t = 0
    for b, (q_len, kv_len) in enumerate(zip(query_lens, kv_lens, strict=True)):
        for s in range(q_len):
            visible = kv_len - q_len + s + 1
            row = topk[t]
            picked = row[row >= 0].long()
            assert len(picked) == min(layer.sparse_count, visible), (t, len(picked))
            assert (row[len(picked):] == -1).all() and len(set(picked.tolist())) == len(picked)
            yield t, visible, table.slots[b, :visible], picked
            t += 1


def check_selection_and_attention(layer, meta, table, kv_cache, query_lens, kv_lens):
    """Per query token: the indexer picked the highest-scoring causal positions
    (``score_j = sum_h w_h * relu(q_h . k_j)``; the C8 indexer: :func:`check_c8_selection`), and
    the sparse attention output is a dense softmax over exactly the picked tokens, computed in
    torch from the cache rows (P and the output rounded to bf16 as the op documents)."""
    rec = layer.record
    if layer.enable_sparse_li_c8:
        check_c8_selection(layer, table, kv_cache, query_lens, kv_lens)
    ckv = kv_cache[0].cpu().view(-1, KV_LORA_RANK).float()
    krope = kv_cache[1].cpu().view(-1, QK_ROPE_HEAD_DIM).float()
    kidx = kv_cache[2].cpu().view(-1, INDEX_HEAD_DIM).float()
    for t, visible, slots, picked in selections(layer, table, query_lens, kv_lens):
        rest = torch.ones(visible, dtype=torch.bool)
        rest[picked] = False
        if rest.any() and not layer.enable_sparse_li_c8:  # the top of the scores (up to bf16 noise)
            score = (torch.relu(rec.q_li[t].cpu().float() @ kidx[slots].T) * rec.weights[t].cpu().float()[:, None]
                     ).sum(0)  # [visible]
            assert score[rest].max() <= score[picked].min() + 2e-2 * score.abs().max(), t
        q = torch.cat([rec.ql_nope[t].cpu().float(), rec.q_pe[t].cpu().float()], dim=-1)  # [N, 576]
        k = torch.cat([ckv[slots[picked]], krope[slots[picked]]], dim=-1)  # [K, 576]
        p = torch.softmax(q @ k.T * layer.scale, dim=-1).to(torch.bfloat16).float()  # P in the query dtype
        want = (p @ ckv[slots[picked]]).to(torch.bfloat16).float()  # [N, 512]
        assert_close(rec.attn_output[t].cpu().float(), want, rtol=1e-2, atol=1e-3)


def quant_indexer_scores(q, qs, w, k, ks):
    """The C8 indexer's score of every key row for one query token, in torch from the int8 data
    (npu_quant_lightning_indexer's doc and op-plugin's golden): ``sum_h fp16(w_h * qs_h) *
    fp16(relu(q_h . k_j) / 1024)``, summed in fp32, times the key's fp16 dequant scale ``ks_j``.
    q int8 ``[N, D]``, qs / w fp16 ``[N]``, k int8 ``[S, D]``, ks fp16 ``[S]``; fp32 ``[S]``."""
    ws = (w.float() * qs.float()).half().float()  # [N]
    s = (torch.relu(q.float() @ k.float().T) / 1024).half().float()  # [N, S], the int32 dots are exact in fp32
    return (ws[:, None] * s).sum(0) * ks.float()


def check_c8_selection(layer, table, kv_cache, query_lens, kv_lens):
    """Per query token: the C8 indexer picked the top-``sparse_count`` causal positions by the
    dequantised score computed in torch from the same int8 query / key and fp16 scales, in
    descending order. The kernel sums the heads in its cube's order (not public), so scores a few
    fp32 ulps apart may come in either order: the checks allow ``1e-5`` of the row's largest
    score. The query quantisation is checked too (dynamic_quant of the rotated query)."""
    rec = layer.record
    want_q, want_qs = dynamic_quant_int8(rec.q_li_rotated.cpu().view(-1, INDEX_HEAD_DIM))
    assert torch.equal(rec.q_li_int8.cpu().view(-1, INDEX_HEAD_DIM), want_q)
    assert torch.equal(rec.q_li_scale.cpu().view(-1), want_qs.to(C8_K_SCALE_CACHE_DTYPE))
    kidx = kv_cache[2].cpu().view(-1, INDEX_HEAD_DIM)
    kscale = kv_cache[3].cpu().view(-1)
    for t, visible, slots, picked in selections(layer, table, query_lens, kv_lens):
        score = quant_indexer_scores(rec.q_li_int8[t].cpu(), rec.q_li_scale[t].cpu(), rec.weights[t].cpu(),
                                     kidx[slots], kscale[slots])
        tol = 1e-5 * score.abs().max()
        got = score[picked]
        assert (got[1:] <= got[:-1] + tol).all(), f"token {t}: not in descending score order"
        rest = torch.ones(visible, dtype=torch.bool)
        rest[picked] = False
        if rest.any():
            assert score[rest].max() <= got.min() + tol, f"token {t}: a higher-scoring position was left out"


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

    def test_c8_indexer_prefill_then_decode(self, sfa_c8_setup, nz_weight):
        """The C8 indexer path (``enable_sparse_li_c8``): the rotated indexer key and query go
        through ``npu_dynamic_quant`` to int8 with fp16 scales, the key and its scale into their
        caches, ``_C_ascend.npu_lightning_indexer_quant`` picks the top 32, the sparse attention
        runs over them. Every cache row, quantisation, selection and output is checked, and the
        dequantised scores stay close to the unquantised ones (the query and key rotations
        cancel in the dot product)."""
        table, kv_cache = sfa_c8_setup
        layer = SFALayer(nz_weight, sparse_count=32, enable_sparse_li_c8=True)
        prompts = C8_PROMPT_LENS
        for query_lens, kv_lens in ((prompts, prompts), ([1, 1], [n + 1 for n in prompts])):
            meta, out = run_step(layer, table, kv_cache, query_lens, kv_lens)
            check_caches(layer, meta, kv_cache)
            check_selection_and_attention(layer, meta, table, kv_cache, query_lens, kv_lens)
            assert out.shape == (sum(query_lens), HIDDEN) and torch.isfinite(out.cpu().float()).all()
            if query_lens[0] > 1:  # prefill: each prompt's last token against the prompt's unquantised keys
                rec = layer.record
                for b, kv_len in enumerate(prompts):
                    t = sum(prompts[:b + 1]) - 1
                    slots = table.slots[b, :kv_len]
                    got = quant_indexer_scores(rec.q_li_int8[t].cpu(), rec.q_li_scale[t].cpu(), rec.weights[t].cpu(),
                                               kv_cache[2].cpu().view(-1, INDEX_HEAD_DIM)[slots],
                                               kv_cache[3].cpu().view(-1)[slots])
                    k = rec.k_li_rotated.cpu().float().view(-1, INDEX_HEAD_DIM)[t + 1 - kv_len:t + 1]
                    want = (torch.relu(rec.q_li_rotated[t].cpu().float() @ k.T) / 1024  # the op's 2**-10
                            * rec.weights[t].cpu().float()[:, None]).sum(0)
                    assert_close(got, want, rtol=0, atol=2e-2 * want.abs().max())

    def test_cache_layout_is_pa_bsnd(self, sfa_setup):
        """The caches are ``[num_blocks, block_size, 1, D]`` (AscendSFABackend.get_kv_cache_shape)
        on the npu device."""
        _, kv_cache = sfa_setup
        assert [tuple(c.shape) for c in kv_cache] == [(NUM_BLOCKS, BLOCK_SIZE, 1, d) for d in (512, 64, 128)]
        assert all(c.device.type == "npu" for c in kv_cache)
