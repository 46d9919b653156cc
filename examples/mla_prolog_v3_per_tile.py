"""torch_npu.npu_mla_prolog_v3, kv_cache per-tile quant: 656-byte combined cache rows.

Run on a laptop with:  ascend-emu run examples/mla_prolog_v3_per_tile.py
(on an Atlas A3 machine the same script runs against the real torch_npu).

The per-tile rows of the doc's scenario table (kv_cache_quant_mode=3, ckvkr_repo_mode =
quant_scale_repo_mode = 1): each token's kv row is 656 bytes, ``[512 int8 k_nope | 64 bf16 k_rope
| 4 fp32 dequant scales]``, one scale per tile of 128 (``scale = k_nope_clip_alpha * amax / 127``),
and kr_cache is an empty tensor. This is the cache npu_kv_quant_sparse_flash_attention reads.

1. partial quant (int8 weight_uq_qr), PA_BSND paged cache; one token's row is decoded with
   ``ascend_emu.quant.read_combined_cache``.
2. full quant (int8 token_x and weights), BSND cache. The query stays bf16 in the per-tile modes
   (query_quant_mode=0; the doc's table prints 1 for this row, which torch_npu's own output
   declaration and the kernel's checks do not take; the emulator rejects it likewise).
"""

import torch
import torch_npu
from ascend_emu.quant import read_combined_cache

torch.npu.config.allow_internal_format = True
torch.manual_seed(0)
B, S, He, Hcq, Hckv, N, D, Dr = 8, 2, 7168, 1536, 512, 32, 128, 64
Nkv, BlockSize, BlockNum, Dtile = 1, 128, 4, 656
T = B * S


def quant_per_channel(w):
    """Symmetric int8 per output channel (last dim): int8 weight and its [1, C] dequant scale."""
    scale = w.abs().amax(dim=0, keepdim=True) / 127
    return torch.round(w / scale).to(torch.int8), scale.to(torch.float32)


token_x = torch.randn(B, S, He, dtype=torch.bfloat16)
w_dq = (torch.randn(He, Hcq) * He ** -0.5).to(torch.bfloat16)
w_uq_qr_int8, dequant_scale_w_uq_qr = quant_per_channel(torch.randn(Hcq, N * (D + Dr)) * Hcq ** -0.5)
w_uk = (torch.randn(N, D, Hckv) * D ** -0.5).to(torch.bfloat16).npu()
w_dkv_kr = (torch.randn(He, Hckv + Dr) * He ** -0.5).to(torch.bfloat16)
rmsnorm_gamma_cq, rmsnorm_gamma_ckv = (torch.ones(h, dtype=torch.bfloat16).npu() for h in (Hcq, Hckv))


def rope_tables(positions):
    """bf16 sin / cos in the half layout the MLA ops take (the 32 frequencies twice)."""
    inv_freq = 1.0 / 10000 ** (torch.arange(0, Dr, 2).float() / Dr)
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.sin().to(torch.bfloat16).npu(), angles.cos().to(torch.bfloat16).npu()


rope_sin, rope_cos = rope_tables(torch.arange(S).repeat(B, 1))  # [B, S, Dr]: each sequence's prefill 0..S-1
k_nope_clip_alpha = torch.tensor([1.0], dtype=torch.float32).npu()
kr_cache = torch.empty(0, dtype=torch.bfloat16).npu()  # per-tile: k_rope lives in the kv_cache rows
w_uq_qr_cast = torch_npu.npu_format_cast(w_uq_qr_int8.npu().contiguous(), 29)

# ---- 1. partial quant, kv_cache per-tile, PA_BSND
kv_cache = torch.zeros(BlockNum, BlockSize, Nkv, Dtile, dtype=torch.int8).npu()
cache_index = (torch.arange(T, dtype=torch.int64) + 3).view(B, S).npu()  # token t -> cache row t + 3
query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm = torch_npu.npu_mla_prolog_v3(
    token_x.npu(), torch_npu.npu_format_cast(w_dq.npu().contiguous(), 29), w_uq_qr_cast, w_uk,
    torch_npu.npu_format_cast(w_dkv_kr.npu().contiguous(), 29), rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin,
    rope_cos, kv_cache, kr_cache, cache_index=cache_index, dequant_scale_w_uq_qr=dequant_scale_w_uq_qr.npu(),
    k_nope_clip_alpha=k_nope_clip_alpha, cache_mode="PA_BSND", query_norm_flag=True, weight_quant_mode=1,
    kv_cache_quant_mode=3, query_quant_mode=0, ckvkr_repo_mode=1, quant_scale_repo_mode=1, tile_size=128)
print("partial quant, kv_cache per-tile (PA_BSND)")
print("  query:", tuple(query.shape), query.dtype, " query_norm:", tuple(query_norm.shape), query_norm.dtype)
slot = int(cache_index[1, 0])  # token (b=1, s=0)
row = kv_cache.view(-1, Dtile)[slot]
k_nope, k_rope, scales = read_combined_cache(kv_cache.cpu().numpy(), slot=slot)  # dequantized k_nope, bf16 k_rope
print(f"  token (b=1, s=0) -> slot {slot}: 656 bytes = 512 int8 | 64 bf16 | 4 fp32")
print("    int8 k_nope[:6]:      ", row[:6].tolist())
print("    dequantized k_nope[:6]:", [round(float(v), 4) for v in k_nope[0, :6]])
print("    k_rope[:4] (bf16):    ", [float(v) for v in k_rope[0, :4]])
print("    tile scales:          ", [float(v) for v in scales[0]])
print("    raw scale bytes 640..655:", bytes(row[640:].cpu().numpy().view("uint8")).hex())

# ---- 2. full quant, kv_cache per-tile, BSND, int8 query
x_scale = token_x.float().abs().amax(dim=-1, keepdim=True) / 127  # per token
x_int8 = torch.round(token_x.float() / x_scale).to(torch.int8)
w_dq_int8, dequant_scale_w_dq = quant_per_channel(w_dq.float())
w_dkv_kr_int8, dequant_scale_w_dkv_kr = quant_per_channel(w_dkv_kr.float())
kv_cache_bsnd = torch.zeros(B, S, Nkv, Dtile, dtype=torch.int8).npu()
query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm = torch_npu.npu_mla_prolog_v3(
    x_int8.npu(), torch_npu.npu_format_cast(w_dq_int8.npu().contiguous(), 29), w_uq_qr_cast, w_uk,
    torch_npu.npu_format_cast(w_dkv_kr_int8.npu().contiguous(), 29), rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
    rope_sin, rope_cos, kv_cache_bsnd, kr_cache, dequant_scale_x=x_scale.view(T, 1).npu(),
    dequant_scale_w_dq=dequant_scale_w_dq.npu(), dequant_scale_w_uq_qr=dequant_scale_w_uq_qr.npu(),
    dequant_scale_w_dkv_kr=dequant_scale_w_dkv_kr.npu(), k_nope_clip_alpha=k_nope_clip_alpha,
    cache_mode="BSND", query_norm_flag=True, weight_quant_mode=2, kv_cache_quant_mode=3, query_quant_mode=0,
    ckvkr_repo_mode=1, quant_scale_repo_mode=1)
print("full quant, kv_cache per-tile (BSND)")
print("  query:", tuple(query.shape), query.dtype, " dequant_scale_q_nope:", tuple(dequant_scale_q_nope.shape))
print("  query_norm:", tuple(query_norm.shape), query_norm.dtype, " dequant_scale_q_norm:",
      tuple(dequant_scale_q_norm.shape))
k_nope_full, _, scales_full = read_combined_cache(kv_cache_bsnd.cpu().numpy(), slot=1 * S + 0)  # BSND: slot b*S + s
print("  token (b=1, s=0) tile scales:", [float(v) for v in scales_full[0]])
print("  k_nope[:6] full vs partial quant:", [round(float(v), 3) for v in k_nope_full[0, :6]], "vs",
      [round(float(v), 3) for v in k_nope[0, :6]])
