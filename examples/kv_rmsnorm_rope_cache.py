"""torch_npu.npu_kv_rmsnorm_rope_cache, the single-op example of its doc, in a decode step.

Run on a laptop with:  ascend-emu run examples/kv_rmsnorm_rope_cache.py
(on an Atlas A2/A3 machine the same script runs against the real torch_npu).

Four sequences decode one token each into a PA_NZ paged cache (block_size 128). Each sequence
owns blocks through a block table; the new token's global slot is
``block_table[b, pos // block_size] * block_size + pos % block_size``.
"""

import torch
import torch_npu


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, kv, gamma, cos, sin, index, k_cache, ckv_cache,
                k_rope_scale=None, c_kv_scale=None, k_rope_offset=None, c_kv_offset=None,
                epsilon=1e-05, cache_mode="Norm", is_output_kv=False):
        k_cache, v_cache, k_rope, c_kv = torch_npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index,
                                                                             k_cache, ckv_cache,
                                                                             k_rope_scale=k_rope_scale,
                                                                             c_kv_scale=c_kv_scale,
                                                                             k_rope_offset=k_rope_offset,
                                                                             c_kv_offset=c_kv_offset,
                                                                             epsilon=epsilon,
                                                                             cache_mode=cache_mode,
                                                                             is_output_kv=is_output_kv)
        return k_cache, v_cache, k_rope, c_kv


torch.manual_seed(0)
batch_size, seq_len = 4, 1
rms_size, rope_size = 512, 64
block_num, block_size = 16, 128
cache_mode = "PA_NZ"
is_output_kv = True

# MLA's compressed kv for the new token of every sequence: [512 latent | 64 rope] per token
kv = torch.randn(batch_size, 1, seq_len, rms_size + rope_size, dtype=torch.bfloat16).npu()
gamma = torch.ones(rms_size, dtype=torch.bfloat16).npu()

# rotary tables for each sequence's position (half layout: the 32 frequencies twice)
positions = torch.tensor([5, 130, 17, 300])  # current length of each sequence = new token's position
inv_freq = 1.0 / (10000 ** (torch.arange(0, rope_size, 2, dtype=torch.float32) / rope_size))
angles = positions[:, None].float() * inv_freq[None, :]  # [B, 32]
angles = torch.cat([angles, angles], dim=-1).view(batch_size, 1, seq_len, rope_size)
cos = angles.cos().to(torch.bfloat16).npu()
sin = angles.sin().to(torch.bfloat16).npu()

# paged cache: every sequence owns blocks through its block table
block_table = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]])
blocks = block_table[torch.arange(batch_size), positions // block_size]
index = (blocks * block_size + positions % block_size).to(torch.int64).npu()  # [B*S] global slots
k_cache = torch.zeros(block_num, block_size, 1, rope_size, dtype=torch.bfloat16).npu()
ckv_cache = torch.zeros(block_num, block_size, 1, rms_size, dtype=torch.bfloat16).npu()

model = Model().npu()
_, _, k_rope, c_kv = model(kv, gamma, cos, sin, index, k_cache, ckv_cache, None, None, None, None, 1e-5,
                           cache_mode, is_output_kv)

print("k_rope:", k_rope.shape, k_rope.dtype)
print(k_rope[:, 0, 0, :8])
print("c_kv:", c_kv.shape, c_kv.dtype)
print(c_kv[:, 0, 0, :8])

# PA_NZ stores each block as [D/16, block_size, 16]: read token b's row back from that layout
k_nz = k_cache.cpu().view(block_num, rope_size // 16, block_size, 16)
ckv_nz = ckv_cache.cpu().view(block_num, rms_size // 16, block_size, 16)
held = []
for b in range(batch_size):
    slot = int(index[b])
    blk, row = divmod(slot, block_size)
    k_row = k_nz[blk, :, row, :].reshape(rope_size)
    ckv_row = ckv_nz[blk, :, row, :].reshape(rms_size)
    held += [torch.equal(k_row, k_rope[b, 0, 0].cpu()), torch.equal(ckv_row, c_kv[b, 0, 0].cpu())]
    print(f"seq {b}: position {int(positions[b])} -> slot {slot} (block {blk}, row {row}); "
          f"cache holds k_rope: {held[-2]}, c_kv: {held[-1]}")
written = (k_nz != 0).any(dim=3).any(dim=1)  # [block_num, block_size] token rows of the NZ layout
print("token rows written:", int(written.sum()), "of", block_num * block_size)
if not all(held) or int(written.sum()) != batch_size:
    raise SystemExit("the PA_NZ cache does not hold the returned rows where the slots point")
