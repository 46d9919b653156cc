"""torch_npu.npu_mla_prolog_v3, full quant: int8 token_x and weights, with and without int8 kv_cache.

Run on a laptop with:  ascend-emu run examples/mla_prolog_v3_full_quant.py
(on an Atlas A3 machine the same script runs against the real torch_npu).

The full-quant rows of the doc's scenario table (weight_quant_mode=2: token_x quantized per
token, weight_dq / weight_uq_qr / weight_dkv_kr per output channel, each with its dequant scale):

1. kv_cache non-quant: bf16 caches and a bf16 query.
2. kv_cache per-tensor quant (PA_NZ cache): ``int8 kv = round(kv * quant_scale_ckv)``; the query
   is quantized per token and head (int8 query plus dequant_scale_q_nope [T, N, 1]) and
   query_rope is pre-multiplied by quant_scale_ckv / dequant_scale_q_nope, so that attention can
   take int8 q . k directly.
"""

import torch
import torch_npu

torch.npu.config.allow_internal_format = True
torch.manual_seed(0)
B, S, He, Hcq, Hckv, N, D, Dr = 8, 2, 7168, 1536, 512, 32, 128, 64
Nkv, BlockSize, BlockNum = 1, 128, 4
T = B * S


def quant_per_channel(w):
    """Symmetric int8 per output channel (last dim): int8 weight and its [1, C] dequant scale."""
    scale = w.abs().amax(dim=0, keepdim=True) / 127
    return torch.round(w / scale).to(torch.int8).npu(), scale.to(torch.float32).npu()


x = torch.randn(T, He).npu()
dequant_scale_x = (x.abs().amax(dim=-1, keepdim=True) / 127).npu()  # [T, 1] per token
token_x = torch.round(x / dequant_scale_x).to(torch.int8).view(B, S, He).npu()
w_dq, dequant_scale_w_dq = quant_per_channel(torch.randn(He, Hcq) * He ** -0.5)
w_uq_qr, dequant_scale_w_uq_qr = quant_per_channel(torch.randn(Hcq, N * (D + Dr)) * Hcq ** -0.5)
w_dkv_kr, dequant_scale_w_dkv_kr = quant_per_channel(torch.randn(He, Hckv + Dr) * He ** -0.5)
w_uk = (torch.randn(N, D, Hckv) * D ** -0.5).to(torch.bfloat16).npu()
w_dq_cast, w_uq_qr_cast, w_dkv_kr_cast = (torch_npu.npu_format_cast(w.contiguous(), 29)
                                         for w in (w_dq, w_uq_qr, w_dkv_kr))
rmsnorm_gamma_cq = (torch.rand(Hcq) + 0.5).to(torch.bfloat16).npu()
rmsnorm_gamma_ckv = (torch.rand(Hckv) + 0.5).to(torch.bfloat16).npu()
# decode: sequence b has its S new tokens at positions lengths[b] .. lengths[b] + S - 1
lengths = torch.randint(0, 1000, (B, 1))
positions = (lengths + torch.arange(S)).view(-1).float()  # [T]
theta = torch.outer(positions, 10000.0 ** (-torch.arange(0, Dr, 2).float() / Dr))  # [T, Dr/2]
theta = theta.repeat(1, 2).view(B, S, Dr)  # half layout: the 32 frequencies twice
rope_cos, rope_sin = theta.cos().to(torch.bfloat16).npu(), theta.sin().to(torch.bfloat16).npu()
cache_index = torch.randperm(BlockNum * BlockSize)[:T].view(B, S).npu()
scales = dict(dequant_scale_x=dequant_scale_x, dequant_scale_w_dq=dequant_scale_w_dq,
              dequant_scale_w_uq_qr=dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr=dequant_scale_w_dkv_kr)

# ---- 1. full quant, kv_cache non-quant
kv_cache = torch.zeros(BlockNum, BlockSize, Nkv, Hckv, dtype=torch.bfloat16).npu()
kr_cache = torch.zeros(BlockNum, BlockSize, Nkv, Dr, dtype=torch.bfloat16).npu()
query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm = torch_npu.npu_mla_prolog_v3(
    token_x, w_dq_cast, w_uq_qr_cast, w_uk, w_dkv_kr_cast, rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin,
    rope_cos, kv_cache, kr_cache, cache_index=cache_index, **scales, cache_mode="PA_BSND", query_norm_flag=True,
    weight_quant_mode=2, kv_cache_quant_mode=0, query_quant_mode=0, qc_qr_scale=1.0, kc_scale=1.0)
print("full quant, kv_cache non-quant")
print("  query:", tuple(query.shape), query.dtype, query[0, 0, 0, :4].tolist())
print("  query_norm:", tuple(query_norm.shape), query_norm.dtype, " dequant_scale_q_norm:",
      tuple(dequant_scale_q_norm.shape))
slot = int(cache_index[0, 0])
print(f"  kv_cache slot {slot}:", kv_cache.view(-1, Hckv)[slot, :4].tolist())

# ---- 2. full quant, kv_cache per-tensor quant, int8 query, PA_NZ cache
kv_q = torch.zeros(BlockNum, BlockSize, Nkv, Hckv, dtype=torch.int8).npu()
kr_bf16 = torch.zeros(BlockNum, BlockSize, Nkv, Dr, dtype=torch.bfloat16).npu()
quant_scale_ckv = torch.tensor([127 / 6.0], dtype=torch.float32).npu()  # |kv| up to 6 -> int8
q_int8, q_rope_scaled, dequant_scale_q_nope, _, _ = torch_npu.npu_mla_prolog_v3(
    token_x, w_dq_cast, w_uq_qr_cast, w_uk, w_dkv_kr_cast, rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin,
    rope_cos, kv_q, kr_bf16, cache_index=cache_index, **scales, quant_scale_ckv=quant_scale_ckv,
    cache_mode="PA_NZ", weight_quant_mode=2, kv_cache_quant_mode=1, query_quant_mode=1)
print("full quant, kv_cache per-tensor quant (PA_NZ)")
print("  query:", tuple(q_int8.shape), q_int8.dtype, " dequant_scale_q_nope:", tuple(dequant_scale_q_nope.shape))
back = q_int8[0, 0, 0, :4].float() * dequant_scale_q_nope[0, 0, 0]
print("  query[0,0,0,:4] int8:", q_int8[0, 0, 0, :4].tolist(), "-> dequantized", [round(v, 4) for v in back.tolist()],
      "vs bf16 run", query[0, 0, 0, :4].tolist())
print("  query_rope / bf16 run (= quant_scale_ckv / dequant_scale_q_nope):",
      round(float(q_rope_scaled[0, 0, 0, 0] / query_rope[0, 0, 0, 0]), 2), "~",
      round(float(quant_scale_ckv[0] / dequant_scale_q_nope[0, 0, 0]), 2))
# PA_NZ: block b of the int8 kv cache is stored [Hckv/32, BlockSize, 32]; gather slot's row back
blk, r = divmod(slot, BlockSize)
nz_block = kv_q.view(BlockNum, Hckv // 32, BlockSize, 32)[blk]  # raw bytes of the block
row = nz_block[:, r, :].reshape(Hckv)
print(f"  kv_cache slot {slot} (int8, read from the NZ block):", row[:4].tolist(), "-> dequantized",
      [round(v, 3) for v in (row[:4].float() / quant_scale_ckv[0]).tolist()])
