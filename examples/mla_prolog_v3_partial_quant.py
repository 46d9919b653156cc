"""torch_npu.npu_mla_prolog_v3, partial quant: int8 weight_uq_qr, with and without int8 kv_cache.

Run on a laptop with:  ascend-emu run examples/mla_prolog_v3_partial_quant.py
(on an Atlas A3 machine the same script runs against the real torch_npu).

The two partial-quant rows of the doc's scenario table (weight_quant_mode=1, only weight_uq_qr
is int8, with its per-channel dequant scale; cq is quantized per token on the fly):

1. kv_cache non-quant: bf16 kv_cache / kr_cache, query_norm comes out int8 with its scale.
2. kv_cache per-channel quant: int8 kv_cache and kr_cache, written as
   ``int8 = round(kv * quant_scale_ckv[c])`` and ``round(k_rope * quant_scale_ckr[c])``.
"""

import torch
import torch_npu

torch.npu.config.allow_internal_format = True
torch.manual_seed(0)
B, S, He, Hcq, Hckv, N, D, Dr = 8, 2, 7168, 1536, 512, 32, 128, 64
Nkv, BlockSize, BlockNum = 1, 128, 4
T = B * S

# bf16 activations and weights (scaled like a trained layer); weight_uq_qr quantized per output channel
token_x = torch.randn(B, S, He, dtype=torch.bfloat16).npu()
w_dq = (torch.randn(He, Hcq) * He ** -0.5).to(torch.bfloat16).npu()
w_uq_qr_fp = torch.randn(Hcq, N * (D + Dr)) * Hcq ** -0.5
w_uq_qr_scale = w_uq_qr_fp.abs().amax(dim=0, keepdim=True) / 127  # [1, N*(D+Dr)]
w_uq_qr = torch.round(w_uq_qr_fp / w_uq_qr_scale).to(torch.int8).npu()
w_uk = (torch.randn(N, D, Hckv) * D ** -0.5).to(torch.bfloat16).npu()
w_dkv_kr = (torch.randn(He, Hckv + Dr) * He ** -0.5).to(torch.bfloat16).npu()
w_dq_cast = torch_npu.npu_format_cast(w_dq.contiguous(), 29)
w_uq_qr_cast = torch_npu.npu_format_cast(w_uq_qr.contiguous(), 29)
w_dkv_kr_cast = torch_npu.npu_format_cast(w_dkv_kr.contiguous(), 29)
rmsnorm_gamma_cq = torch.ones(Hcq, dtype=torch.bfloat16).npu()
rmsnorm_gamma_ckv = torch.ones(Hckv, dtype=torch.bfloat16).npu()
angles = torch.arange(T).float()[:, None] * (1.0 / 10000 ** (torch.arange(0, Dr, 2).float() / Dr))[None, :]
angles = torch.cat([angles, angles], dim=-1).view(B, S, Dr)
rope_sin = angles.sin().to(torch.bfloat16).npu()
rope_cos = angles.cos().to(torch.bfloat16).npu()
cache_index = torch.arange(T, dtype=torch.int64).view(B, S).npu()  # token t -> cache row t
dequant_scale_w_uq_qr = w_uq_qr_scale.to(torch.float32).npu()
smooth_scales_cq = torch.ones(1, Hcq, dtype=torch.float32).npu()

# ---- 1. partial quant, kv_cache non-quant
kv_cache = torch.zeros(BlockNum, BlockSize, Nkv, Hckv, dtype=torch.bfloat16).npu()
kr_cache = torch.zeros(BlockNum, BlockSize, Nkv, Dr, dtype=torch.bfloat16).npu()
query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm = torch_npu.npu_mla_prolog_v3(
    token_x, w_dq_cast, w_uq_qr_cast, w_uk, w_dkv_kr_cast, rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin,
    rope_cos, kv_cache, kr_cache, cache_index=cache_index, dequant_scale_w_uq_qr=dequant_scale_w_uq_qr,
    smooth_scales_cq=smooth_scales_cq, cache_mode="PA_BSND", query_norm_flag=True, weight_quant_mode=1,
    kv_cache_quant_mode=0, query_quant_mode=0)
print("partial quant, kv_cache non-quant")
print("  query:", tuple(query.shape), query.dtype, " query_rope:", tuple(query_rope.shape), query_rope.dtype)
print("  query_norm:", tuple(query_norm.shape), query_norm.dtype, query_norm[0, 0, :8].tolist())
print("  dequant_scale_q_norm:", tuple(dequant_scale_q_norm.shape), dequant_scale_q_norm[:2, 0].tolist())
print("  dequant_scale_q_nope:", tuple(dequant_scale_q_nope.shape), "(not produced)")
print("  kv_cache row 0:", kv_cache[0, 0, 0, :6].tolist())

# ---- 2. partial quant, kv_cache per-channel quant (int8 kv_cache and kr_cache)
kv_q = torch.zeros(BlockNum, BlockSize, Nkv, Hckv, dtype=torch.int8).npu()
kr_q = torch.zeros(BlockNum, BlockSize, Nkv, Dr, dtype=torch.int8).npu()
quant_scale_ckv = torch.full((1, Hckv), 127 / 6.0, dtype=torch.float32).npu()  # |kv| up to 6 -> int8
quant_scale_ckr = torch.full((1, Dr), 127 / 6.0, dtype=torch.float32).npu()
query, query_rope, _, _, _ = torch_npu.npu_mla_prolog_v3(
    token_x, w_dq_cast, w_uq_qr_cast, w_uk, w_dkv_kr_cast, rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin,
    rope_cos, kv_q, kr_q, cache_index=cache_index, dequant_scale_w_uq_qr=dequant_scale_w_uq_qr,
    quant_scale_ckv=quant_scale_ckv, quant_scale_ckr=quant_scale_ckr, cache_mode="PA_BSND",
    weight_quant_mode=1, kv_cache_quant_mode=2, query_quant_mode=0)
print("partial quant, kv_cache per-channel quant")
print("  query:", tuple(query.shape), query.dtype)
print("  kv_cache row 0 (int8):", kv_q[0, 0, 0, :6].tolist(),
      " dequantized:", (kv_q[0, 0, 0, :6].float() / quant_scale_ckv[0, :6]).tolist())
print("  bf16 run's row 0:     ", kv_cache[0, 0, 0, :6].float().tolist())
print("  kr_cache row 0 (int8):", kr_q[0, 0, 0, :6].tolist())
