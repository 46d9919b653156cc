"""torch_npu.atb.npu_mla_preprocess, as its doc example writes it (cache_mode 'int8_nzcache',
quant_mode 'per_tensor_quant_asymm', out= form), then the other cache modes with bf16 input.

Run on a laptop with:  ascend-emu run examples/mla_preprocess.py
(on an Atlas A2/A3 machine the same script runs against the real torch_npu). The aclnn cacheMode 0
('kvcache') is not in the loop: torch_npu does not map it, and the emulator rejects it likewise.

Changes from the doc example: head_num 128 -> 16 and block_num 192 -> 4 (the doc's int8 cache
alone is 1.6 GB); distinct slots (the doc's randint(0, 7) lets tokens share a slot, which the
hardware leaves undefined and the emulator warns about); ``.npu()`` instead of ``device='npu'``
(torch refuses that device string unless the real torch_npu is loaded); fp16 descales that hold
real scales (fp32 bits in the low word of the int64, as the ATB kernel test packs them) instead
of randint(0, 7), whose bit patterns are denormals that zero every output.
"""

import torch
import torch_npu

torch.manual_seed(0)
token_num = 8
head_num = 16
N_7168 = 7168
block_num = 4
block_size = 128
dtype = torch.float16

input1 = torch.randn((token_num, N_7168), dtype=dtype).npu()

gamma0 = torch.randn((N_7168), dtype=dtype).npu()
beta0 = torch.randn((N_7168), dtype=dtype).npu()
quant_scale0 = torch.randn((1,), dtype=dtype).npu()
quant_offset0 = torch.randint(0, 7, (1,), dtype=torch.int8).npu()

wdqkv = torch.randint(0, 7, (1, 224, 2112, 32), dtype=torch.int8).npu()
wdqkv = torch_npu.npu_format_cast(wdqkv, 29)
de_scale0 = (torch.rand((2112, )) / 1000).view(torch.int32).to(torch.int64).npu()
bias0 = torch.randint(0, 7, (2112, ), dtype=torch.int32).npu()

gamma1 = torch.randn((1536), dtype=dtype).npu()
beta1 = torch.randn((1536), dtype=dtype).npu()
quant_scale1 = torch.randn((1,), dtype=dtype).npu()
quant_offset1 = torch.randint(0, 7, (1,), dtype=torch.int8).npu()

wuq = torch.randint(0, 7, (1, 48, head_num * 192, 32), dtype=torch.int8).npu()
wuq = torch_npu.npu_format_cast(wuq, 29)
de_scale1 = (torch.rand((head_num * 192, )) / 1000).view(torch.int32).to(torch.int64).npu()
bias1 = torch.randint(0, 7, (head_num * 192, ), dtype=torch.int32).npu()

gamma2 = torch.randn((512), dtype=dtype).npu()

cos = torch.randn((token_num, 64), dtype=dtype).npu()
sin = torch.randn((token_num, 64), dtype=dtype).npu()

wuk = torch.randn((head_num, 128, 512), dtype=dtype).npu()
wuk = torch_npu.npu_format_cast(wuk, 29)

kv_cache = torch.randint(0, 7, (block_num, head_num * 512 // 32, block_size, 32), dtype=torch.int8).npu()
kv_cache = torch_npu.npu_format_cast(kv_cache, 29)
kv_cache_rope = torch.randn((block_num, head_num * 64 // 16, block_size, 16), dtype=dtype).npu()
kv_cache_rope = torch_npu.npu_format_cast(kv_cache_rope, 29)

slotmapping = torch.randperm(block_num * block_size)[:token_num].to(torch.int32).npu()

ctkv_scale = torch.randn((1,), dtype=dtype).npu()
qnope_scale = torch.randn((head_num), dtype=dtype).npu()

q_out0 = torch.randint(0, 7, (token_num, head_num, 512), dtype=torch.int8).npu()
kv_cache_out0 = torch.randint(0, 7, (block_num, head_num * 512 // 32, block_size, 32), dtype=torch.int8).npu()
kv_cache_out0 = torch_npu.npu_format_cast(kv_cache_out0, 29)
q_out1 = torch.randn((token_num, head_num, 64), dtype=dtype).npu()
kv_cache_out1 = torch.randn((block_num, head_num * 64 // 16, block_size, 16), dtype=dtype).npu()
kv_cache_out1 = torch_npu.npu_format_cast(kv_cache_out1, 29)

outs = torch_npu.atb.npu_mla_preprocess(
    input1, gamma0, beta0, wdqkv, de_scale0,
    gamma1, beta1, wuq, de_scale1,
    gamma2, cos, sin, wuk, kv_cache, kv_cache_rope, slotmapping,
    quant_scale0=quant_scale0,
    quant_offset0=quant_offset0,
    bias0=bias0,
    quant_scale1=quant_scale0,
    quant_offset1=quant_offset1,
    bias1=bias1,
    ctkv_scale=ctkv_scale,
    q_nope_scale=qnope_scale,
    cache_mode="int8_nzcache",
    quant_mode="per_tensor_quant_asymm",
    q_out0=q_out0,
    kv_cache_out0=kv_cache_out0,
    q_out1=q_out1,
    kv_cache_out1=kv_cache_out1,
)
print("int8_nzcache / per_tensor_quant_asymm (out= form):")
returned = all(a is b for a, b in zip(outs, (q_out0, kv_cache_out0, q_out1, kv_cache_out1), strict=True))
print("  returned the out= tensors:", returned)
if not returned:
    raise SystemExit("the out= form must return the out= tensors themselves")
print("  q_out0", tuple(q_out0.shape), q_out0.dtype, "token 0, head 0:", q_out0[0, 0, :8].tolist())
print("  q_out1", tuple(q_out1.shape), q_out1.dtype, "token 0, head 0:", q_out1[0, 0, :4].tolist())
# The caches are raw memory in the kernel's NZ blocks of 128 rows: a slot's 512 int8 ckv values
# are 16 runs of 32 bytes at [slot // 128, j, slot % 128, :] (its 64 k_rope values: 4 runs of 16).
slot = int(slotmapping[0])
blk, row = divmod(slot, block_size)
ckv0 = kv_cache_out0.reshape(-1, 512 // 32, block_size, 32)[blk, :, row, :].reshape(-1)
krope0 = kv_cache_out1.reshape(-1, 64 // 16, block_size, 16)[blk, :, row, :].reshape(-1)
print(f"  token 0 -> slot {slot}: ckv int8 (first 8 of 512):", ckv0[:8].tolist())
print(f"  token 0 -> slot {slot}: k_rope {kv_cache_out1.dtype} (first 4 of 64):", krope0[:4].tolist())

# Every cache_mode x quant_mode pair with bf16 input, functional form (new tensors back; the
# caches passed in are left as they were).
dtype = torch.bfloat16
hidden = 2048
w_dqkv = torch_npu.npu_format_cast(torch.randint(-8, 8, (2112, hidden), dtype=torch.int8).npu(), 29)
w_uq = torch_npu.npu_format_cast(torch.randint(-8, 8, (head_num * 192, 1536), dtype=torch.int8).npu(), 29)
common = tuple(t.npu() for t in (torch.randn((token_num, hidden), dtype=dtype), torch.rand(hidden, dtype=dtype),
          torch.zeros(hidden, dtype=dtype), w_dqkv, torch.rand(2112) / 1000, torch.rand(1536, dtype=dtype),
          torch.zeros(1536, dtype=dtype), w_uq, torch.rand(head_num * 192) / 1000, torch.rand(512, dtype=dtype),
          torch.rand((token_num, 64), dtype=dtype), torch.rand((token_num, 64), dtype=dtype),
          torch.randn((head_num, 128, 512), dtype=dtype) / 8))
caches = {  # (kv_cache, kv_cache_rope) as each mode declares them
    "krope_ctkv": lambda: (torch.zeros((block_num, block_size, 1, 512), dtype=dtype),
                           torch.zeros((block_num, block_size, 1, 64), dtype=dtype)),
    "int8_nzcache": lambda: (torch.zeros((block_num, 512 // 32, block_size, 32), dtype=torch.int8),
                             torch.zeros((block_num, 64 // 16, block_size, 16), dtype=dtype)),
    "nzcache": lambda: (torch.zeros((block_num, 512 // 16, block_size, 16), dtype=dtype),
                        torch.zeros((block_num, 64 // 16, block_size, 16), dtype=dtype)),
}
per_tensor = dict(quant_scale0=torch.tensor([0.03], dtype=dtype, device="npu"),
                  quant_offset0=torch.tensor([0], dtype=torch.int8, device="npu"),
                  quant_scale1=torch.tensor([0.05], dtype=dtype, device="npu"),
                  quant_offset1=torch.tensor([0], dtype=torch.int8, device="npu"))
int8_scales = dict(ctkv_scale=torch.tensor([0.02], dtype=dtype, device="npu"),
                   q_nope_scale=torch.full((head_num,), 32.0, dtype=dtype, device="npu"))
for mode, make_caches in caches.items():
    for quant_mode in ("per_tensor_quant_asymm", "per_token_quant_symm"):
        kv, kr = (c.npu() for c in make_caches())
        kwargs = {**(per_tensor if quant_mode == "per_tensor_quant_asymm" else {}),
                  **(int8_scales if mode == "int8_nzcache" else {})}
        q0, kv_out, q1, kr_out = torch_npu.atb.npu_mla_preprocess(*common, kv, kr, slotmapping, cache_mode=mode,
                                                                  quant_mode=quant_mode, **kwargs)
        print(f"{mode} / {quant_mode}: q_out0 {tuple(q0.shape)} {q0.dtype}, kv_cache_out0 "
              f"{tuple(kv_out.shape)} {kv_out.dtype}, kv_cache_out1 {tuple(kr_out.shape)}; "
              f"q_out0[0, 0, :4] = {q0[0, 0, :4].tolist()}")
