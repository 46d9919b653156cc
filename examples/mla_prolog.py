"""torch_npu.npu_mla_prolog, the single-op example of its doc, as written there but for
``cache_index`` and the printing.

Run on a laptop with:  ascend-emu run examples/mla_prolog.py
(on an Atlas A2/A3 machine the same script runs against the real torch_npu).

The doc's ``cache_index = torch.rand(B, S).to(torch.int64)`` is all zeros, so every token writes
cache row 0: the hardware leaves that undefined, and the emulator keeps the last token and warns
(DuplicateSlotWarning). Here each token gets its own slot. The doc prints the whole outputs
(hundreds of lines); here their shapes and a few values.
"""

import torch
import torch_npu
# 生成随机数据, 并发送到npu
B = 8
He = 7168
Hcq = 1536
Hckv = 512
N = 32
D = 128
Dr = 64
Skv = 1024
S = 2
Nkv = 1
BlockSize = 128
BlockNum = 64
token_x = torch.rand(B, S, He, dtype=torch.bfloat16).npu()
w_dq = torch.rand(He, Hcq, dtype=torch.bfloat16).npu()
w_dq_cast = torch_npu.npu_format_cast(w_dq.contiguous(), 29)
w_uq_qr = torch.rand(Hcq, N * (D + Dr), dtype=torch.bfloat16).npu()
w_uq_qr_cast = torch_npu.npu_format_cast(w_uq_qr.contiguous(), 29)
w_uk = torch.rand(N, D, Hckv, dtype=torch.bfloat16).npu()
w_dkv_kr = torch.rand(He, Hckv + Dr, dtype=torch.bfloat16).npu()
w_dkv_kr_cast = torch_npu.npu_format_cast(w_dkv_kr.contiguous(), 29)
rmsnorm_gamma_cq = torch.rand(Hcq, dtype=torch.bfloat16).npu()
rmsnorm_gamma_ckv = torch.rand(Hckv, dtype=torch.bfloat16).npu()
rope_sin = torch.rand(B, S, Dr, dtype=torch.bfloat16).npu()
rope_cos = torch.rand(B, S, Dr, dtype=torch.bfloat16).npu()
# the doc: cache_index = torch.rand(B, S).to(torch.int64).npu()  (all zeros: every token on slot 0)
cache_index = torch.randperm(BlockNum * BlockSize)[:B * S].reshape(B, S).npu()  # [B, S] distinct slots
kv_cache = torch.rand(BlockNum, BlockSize, Nkv, Hckv, dtype=torch.bfloat16).npu()
kr_cache = torch.rand(BlockNum, BlockSize, Nkv, Dr, dtype=torch.bfloat16).npu()
rmsnorm_epsilon_cq = 1.0e-5
rmsnorm_epsilon_ckv = 1.0e-5
cache_mode = "PA_BSND"

# 调用MlaProlog算子
query_mla, query_rope_mla, kv_cache_out_mla, kr_cache_out_mla = torch_npu.npu_mla_prolog(token_x, w_dq_cast, w_uq_qr_cast, w_uk, w_dkv_kr_cast, rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, rmsnorm_epsilon_cq=rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv=rmsnorm_epsilon_ckv, cache_mode=cache_mode)

print("query:     ", tuple(query_mla.shape), query_mla.dtype, "first values", query_mla[0, 0, 0, :4].float().tolist())
print("query_rope:", tuple(query_rope_mla.shape), query_rope_mla.dtype, "first values",
      query_rope_mla[0, 0, 0, :4].float().tolist())
slot = int(cache_index[0, 0])  # where token (b=0, s=0) was written: block slot // BlockSize, row slot % BlockSize
print(f"token (0, 0) -> cache_index {slot} = block {slot // BlockSize}, row {slot % BlockSize}:")
print("  kv_cache row, first values", kv_cache_out_mla[slot // BlockSize, slot % BlockSize, 0, :4].float().tolist())
print("  kr_cache row, first values", kr_cache_out_mla[slot // BlockSize, slot % BlockSize, 0, :4].float().tolist())
