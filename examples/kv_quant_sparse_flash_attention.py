"""torch_npu.npu_kv_quant_sparse_flash_attention over the per-tile cache npu_mla_prolog_v3 writes.

Run on a laptop with:  ascend-emu run examples/kv_quant_sparse_flash_attention.py
(on an Atlas A2 / A3 machine the same script runs against the real torch_npu).

1. npu_mla_prolog_v3 (partial quant, kv_cache_quant_mode=3) prefills a PA_BSND cache of 656-byte
   rows ``[512 int8 k_nope | 64 bf16 k_rope | 4 fp32 tile scales]`` through a block table, and
   returns each token's absorbed query (query 512 + query_rope 64).
2. npu_kv_quant_sparse_flash_attention lets every token attend to a causal top-k subset of the
   cached tokens (``sparse_indices``, -1 padded), reading the int8 rows directly (key and value
   are the same cache tensor).
3. A small torch golden decodes the rows itself (int8 * scale -> bf16, rope bytes as bf16) and
   checks the op with the official criterion; the script exits non-zero on a wrong value.
"""

import sys

import torch
import torch_npu

torch.npu.config.allow_internal_format = True
torch.manual_seed(0)
B, S, He, Hcq, Hckv, N, D, Dr = 2, 20, 7168, 1536, 512, 16, 128, 64
BlockSize, BlockNum, Dtile, TopK = 16, 5, 656, 8

token_x = torch.randn(B, S, He, dtype=torch.bfloat16)
w_dq = (torch.randn(He, Hcq) * He ** -0.5).to(torch.bfloat16)
w_uq_qr = torch.randn(Hcq, N * (D + Dr)) * Hcq ** -0.5
scale_uq_qr = w_uq_qr.abs().amax(dim=0, keepdim=True) / 127  # per-channel int8 weight
w_uq_qr_int8 = torch.round(w_uq_qr / scale_uq_qr).to(torch.int8)
w_uk = (torch.randn(N, D, Hckv) * D ** -0.5).to(torch.bfloat16)
w_dkv_kr = (torch.randn(He, Hckv + Dr) * He ** -0.5).to(torch.bfloat16)
inv_freq = 1.0 / 10000 ** (torch.arange(0, Dr, 2).float() / Dr)
angles = torch.arange(S).float()[:, None] * inv_freq
angles = torch.cat([angles, angles], dim=-1).expand(B, S, Dr)
rope_sin, rope_cos = angles.sin().to(torch.bfloat16), angles.cos().to(torch.bfloat16)

# ---- 1. prefill: pages of each sequence anywhere in the cache
block_table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32)
cache_index = torch.stack([block_table[b, torch.arange(S) // BlockSize].long() * BlockSize + torch.arange(S) % BlockSize
                           for b in range(B)])  # [B, S] slots
kv_cache = torch.zeros(BlockNum, BlockSize, 1, Dtile, dtype=torch.int8).npu()
query, query_rope, _, _, _ = torch_npu.npu_mla_prolog_v3(
    token_x.npu(), torch_npu.npu_format_cast(w_dq.npu(), 29), torch_npu.npu_format_cast(w_uq_qr_int8.npu(), 29),
    w_uk.npu(), torch_npu.npu_format_cast(w_dkv_kr.npu(), 29), torch.ones(Hcq, dtype=torch.bfloat16).npu(),
    torch.ones(Hckv, dtype=torch.bfloat16).npu(), rope_sin.npu(), rope_cos.npu(), kv_cache,
    torch.empty(0, dtype=torch.bfloat16).npu(), cache_index=cache_index.npu(),
    dequant_scale_w_uq_qr=scale_uq_qr.npu(), k_nope_clip_alpha=torch.ones(1).npu(), cache_mode="PA_BSND",
    weight_quant_mode=1, kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1, tile_size=128)
q_full = torch.cat([query.cpu(), query_rope.cpu()], dim=-1)  # [B, S, N, 576]
print("prolog v3: query", tuple(q_full.shape), q_full.dtype, "| kv_cache", tuple(kv_cache.shape), kv_cache.dtype)

# ---- 2. sparse attention: each token picks up to TopK earlier tokens (sparse_block_size 1)
sparse_indices = torch.full((B, S, 1, TopK), -1, dtype=torch.int32)
for b in range(B):
    for s in range(S):
        picks = torch.randperm(s + 1)[:TopK]
        sparse_indices[b, s, 0, :picks.numel()] = picks.to(torch.int32)
act_q = torch.full((B,), S, dtype=torch.int32)
act_kv = torch.full((B,), S, dtype=torch.int32)
scale_value = (Hckv + Dr) ** -0.5
out = torch_npu.npu_kv_quant_sparse_flash_attention(
    q_full.npu(), kv_cache, kv_cache, sparse_indices.npu(), scale_value, 2, 2, block_table=block_table.npu(),
    actual_seq_lengths_query=act_q.npu(), actual_seq_lengths_kv=act_kv.npu(), sparse_block_size=1,
    layout_query="BSND", layout_kv="PA_BSND", sparse_mode=3, attention_mode=2, quant_scale_repo_mode=1,
    tile_size=128, rope_head_dim=64).cpu()
print("attention_out:", tuple(out.shape), out.dtype)

# ---- 3. torch golden from the cache bytes
rows = kv_cache.cpu().view(-1, Dtile)  # [slots, 656] int8
k_nope = (rows[:, :Hckv].float() * rows[:, Hckv + 2 * Dr:].contiguous().view(torch.float32)
          .repeat_interleave(128, dim=-1)).to(torch.bfloat16)  # [slots, 512]
k_rope = rows[:, Hckv:Hckv + 2 * Dr].contiguous().view(torch.bfloat16)  # [slots, 64]
ref = torch.zeros(B, S, N, Hckv)
for b in range(B):
    for s in range(S):
        picks = [p for p in sparse_indices[b, s, 0].tolist() if p >= 0]  # -1 padding is last
        slots = cache_index[b, picks]
        k = torch.cat([k_nope[slots], k_rope[slots]], dim=-1).float()  # [L, 576]
        p = torch.softmax(q_full[b, s].float() @ k.T * scale_value, dim=-1).to(torch.bfloat16).float()  # [N, L]
        ref[b, s] = p @ k_nope[slots].float()
ref = ref.to(torch.bfloat16)
close = torch.isclose(out.float(), ref.float(), rtol=5e-3, atol=1e-4).float().mean().item()
print(f"elements within isclose(rtol=5e-3, atol=1e-4) of the torch golden: {close:.4%}")
if close <= 0.99:
    print("FAILED: npu_kv_quant_sparse_flash_attention differs from the golden")
    sys.exit(1)
