"""torch_npu.npu_fused_infer_attention_score for DeepSeek-V3-style MLA decode, as vllm-ascend calls it.

Run on a laptop with:  ascend-emu run examples/fused_infer_attention_score.py
(on an Atlas A2/A3 machine the same script runs against the real torch_npu).

Three sequences of different lengths hold their compressed kv in a paged cache that
npu_kv_rmsnorm_rope_cache writes (PA_BNSD, block_size 128): 512 latent values per token in the
ckv cache, 64 rope values in the k_pe cache. One decode step then runs absorbed MLA attention
over it: the ckv cache is both key and value (viewed [blocks, 1, block_size, 512], vllm-ascend's
view), the k_pe cache is key_rope, one kv head for all 16 query heads. The result is checked
against a plain float32 softmax attention over the same gathered rows; the script fails on a
wrong value.
"""

import sys

import torch
import torch_npu

torch.manual_seed(0)
num_heads, kv_lora_rank, rope_dim = 16, 512, 64
block_num, block_size = 8, 128
seq_lens = [5, 200, 131]  # tokens already in the cache per sequence
batch = len(seq_lens)
block_table = torch.tensor([[0, 3, 6], [1, 4, 7], [2, 5, 0]], dtype=torch.int32)

# write every sequence's history with npu_kv_rmsnorm_rope_cache (one call per sequence)
ckv_cache = torch.zeros(block_num, block_size, 1, kv_lora_rank, dtype=torch.bfloat16).npu()
kpe_cache = torch.zeros(block_num, block_size, 1, rope_dim, dtype=torch.bfloat16).npu()
gamma = torch.ones(kv_lora_rank, dtype=torch.bfloat16).npu()
inv_freq = 1.0 / (10000 ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
for b, length in enumerate(seq_lens):
    pos = torch.arange(length)
    angles = pos[:, None].float() * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1).view(1, 1, length, rope_dim)
    kv = torch.randn(1, 1, length, kv_lora_rank + rope_dim, dtype=torch.bfloat16).npu()
    slots = (block_table[b, pos // block_size].long() * block_size + pos % block_size).npu()
    torch_npu.npu_kv_rmsnorm_rope_cache(kv, gamma, angles.cos().to(torch.bfloat16).npu(),
                                        angles.sin().to(torch.bfloat16).npu(), slots, kpe_cache, ckv_cache,
                                        epsilon=1e-6, cache_mode="PA_BNSD")

# one decode step: absorbed queries [B, N, 1, 512] and their rope part [B, N, 1, 64] (BNSD)
q_nope = torch.randn(batch, num_heads, 1, kv_lora_rank, dtype=torch.bfloat16).npu()
q_pe = torch.randn(batch, num_heads, 1, rope_dim, dtype=torch.bfloat16).npu()
scale = (128 + rope_dim) ** -0.5  # DeepSeek-V3's qk_head_dim 192
k_nope = ckv_cache.view(-1, 1, block_size, kv_lora_rank)
k_pe = kpe_cache.view(-1, 1, block_size, rope_dim)
attn_out, _ = torch_npu.npu_fused_infer_attention_score(
    q_nope, k_nope, k_nope, query_rope=q_pe, key_rope=k_pe, num_heads=num_heads, num_key_value_heads=1,
    input_layout="BNSD", atten_mask=None, sparse_mode=0, scale=scale, antiquant_mode=0, antiquant_scale=None,
    block_table=block_table.npu(), block_size=block_size, actual_seq_lengths_kv=seq_lens)
print("attn_out:", tuple(attn_out.shape), attn_out.dtype)

# the check: plain float32 softmax attention over the rows each block table names
worst = 0.0
ckv, kpe, out = ckv_cache.cpu().float(), kpe_cache.cpu().float(), attn_out.cpu().float()
for b, length in enumerate(seq_lens):
    pos = torch.arange(length)
    blk, row = block_table[b, pos // block_size].long(), pos % block_size
    k, kr = ckv[blk, row, 0], kpe[blk, row, 0]  # [L, 512], [L, 64]
    s = (q_nope[b, :, 0].cpu().float() @ k.T + q_pe[b, :, 0].cpu().float() @ kr.T) * scale  # [N, L]
    golden = torch.softmax(s, dim=-1) @ k  # [N, 512]
    err = ((out[b, :, 0] - golden).abs().amax(dim=-1) / golden.abs().amax(dim=-1)).max().item()  # per head row
    worst = max(worst, err)
    blocks = block_table[b, :(length + block_size - 1) // block_size].tolist()
    print(f"seq {b}: {length} cached tokens in blocks {blocks}; max |out - golden| = {err:.2e} "
          "of the row's largest value")
if worst > 2 ** -6:  # a bf16 output and bf16 P: a few 2^-8 roundings at most
    sys.exit(f"attention output differs from the golden (worst relative error {worst:.3e})")
print("matches the float32 golden within bf16 rounding")
