"""torch_npu.npu_fused_infer_attention_score_v2, C8 decode: vllm-ascend's int8 MLA path on Atlas A2 / A3.

Run on a laptop with:  ascend-emu run examples/fused_infer_attention_score_c8.py
(on an Atlas A2/A3 machine the same script runs against the real torch_npu).

The chain of vllm-ascend's ``fa_quant_layer`` decode (``device_op.py``
``mla_preprocess_only_decode``, ``mla_v1.py`` ``_forward_decode``):

1. npu_mla_prolog_v2 in full quant with a per-tensor quantized kv cache: int8 token_x and
   weights, ``quant_scale_ckv = 1 / k_scale`` repeated to ``[1, 512]``; it writes the int8 ckv
   cache in PA_NZ and the bf16 rope cache, and returns the int8 query with its per-token-head
   ``dequant_scale_q_nope`` and a query_rope already divided by ``q_scale * k_scale``. Here one
   call writes the history of three sequences; the last token of each is its decode token.
2. FIA v2 over the caches viewed as vllm-ascend views them (int8 ``[nb, 1, 512/32, bs, 32]``,
   bf16 ``[nb, 1, 64/16, bs, 16]``), BSND_NBSD, ``query_quant_mode=3`` with the query scales,
   ``k_scale`` (fp32 ``[1]``) as both dequant_scale_key and dequant_scale_value.

The output is checked against float32 attention over the dequantized cache rows with the
kernel's int8 P (``round(127 * e)``: every sequence fits one 512-token kv block); the script fails
on a wrong value. The distance to the unquantized float attention (about 3% of a row's largest
value here) is printed too: that is the int8 P of the C8 kernel, not an emulation error.
"""

import sys

import torch
import torch_npu

torch.npu.config.allow_internal_format = True
torch.manual_seed(0)
He, Hcq, Hckv, N, D, Dr = 7168, 1536, 512, 32, 128, 64
block_num, block_size = 6, 128
seq_lens = [130, 7, 260]  # tokens per sequence, the last one being the decode token
block_table = torch.tensor([[0, 3, 0], [1, 0, 0], [2, 5, 4]], dtype=torch.int32)  # unused entries 0
T = sum(seq_lens)


def quant_per_channel(w):
    scale = w.abs().amax(dim=0, keepdim=True) / 127
    return torch.round(w / scale).to(torch.int8), scale.to(torch.float32).npu()


x = torch.randn(T, He)
dequant_scale_x = (x.abs().amax(dim=-1, keepdim=True) / 127).npu()  # [T, 1]
token_x = torch.round(x / dequant_scale_x.cpu()).to(torch.int8).npu()  # [T, He]
w_dq, s_dq = quant_per_channel(torch.randn(He, Hcq) * He ** -0.5)
w_uq_qr, s_uq_qr = quant_per_channel(torch.randn(Hcq, N * (D + Dr)) * Hcq ** -0.5)
w_dkv_kr, s_dkv_kr = quant_per_channel(torch.randn(He, Hckv + Dr) * He ** -0.5)
w_uk = (torch.randn(N, D, Hckv) * D ** -0.5).to(torch.bfloat16).npu()
w_dq, w_uq_qr, w_dkv_kr = (torch_npu.npu_format_cast(w.npu(), 29) for w in (w_dq, w_uq_qr, w_dkv_kr))
gamma_cq = torch.ones(Hcq, dtype=torch.bfloat16).npu()
gamma_ckv = torch.ones(Hckv, dtype=torch.bfloat16).npu()
positions = torch.cat([torch.arange(n) for n in seq_lens]).float()
theta = torch.outer(positions, 10000.0 ** (-torch.arange(0, Dr, 2).float() / Dr)).repeat(1, 2)  # [T, Dr]
rope_cos, rope_sin = theta.cos().to(torch.bfloat16).npu(), theta.sin().to(torch.bfloat16).npu()
slots = torch.cat([block_table[b, torch.arange(n) // block_size].long() * block_size + torch.arange(n) % block_size
                   for b, n in enumerate(seq_lens)]).npu()  # [T]

k_scale = torch.tensor([6.0 / 127], dtype=torch.float32).npu()  # vllm-ascend's fak_descale_float, [1]
quant_scale_ckv = (1.0 / k_scale).repeat(Hckv).view(1, Hckv)  # its quant_kscale
ckv_cache = torch.zeros(block_num, block_size, 1, Hckv, dtype=torch.int8).npu()
kpe_cache = torch.zeros(block_num, block_size, 1, Dr, dtype=torch.bfloat16).npu()
q_nope, q_pe, ckv_cache, kpe_cache, dequant_scale_q_nope = torch_npu.npu_mla_prolog_v2(
    token_x, w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv, rope_sin, rope_cos, slots, ckv_cache, kpe_cache,
    dequant_scale_x=dequant_scale_x, dequant_scale_w_dq=s_dq, dequant_scale_w_uq_qr=s_uq_qr,
    dequant_scale_w_dkv_kr=s_dkv_kr, quant_scale_ckv=quant_scale_ckv, cache_mode="PA_NZ")
print("prolog: query", tuple(q_nope.shape), q_nope.dtype, " dequant_scale_q_nope", tuple(dequant_scale_q_nope.shape))

# the decode token of each sequence: BSND_NBSD as vllm-ascend lays it out
last = torch.tensor(seq_lens).cumsum(0) - 1
batch = len(seq_lens)
q = q_nope[last].view(batch, 1, N, Hckv).contiguous()
q_rope = q_pe[last].view(batch, 1, N, Dr).contiguous()
q_scale = dequant_scale_q_nope[last].view(batch, 1, N)
k_nope = ckv_cache.view(-1, 1, Hckv // 32, block_size, 32)
k_pe = kpe_cache.view(-1, 1, Dr // 16, block_size, 16)
scale = (D + Dr) ** -0.5
attn_out, _ = torch_npu.npu_fused_infer_attention_score_v2(
    q, k_nope, k_nope, query_rope=q_rope, key_rope=k_pe, num_query_heads=N, num_key_value_heads=1,
    input_layout="BSND_NBSD", atten_mask=None, sparse_mode=0, softmax_scale=scale,
    block_table=block_table.npu(), block_size=block_size, actual_seq_qlen=None, actual_seq_kvlen=seq_lens,
    query_quant_mode=3, key_quant_mode=0, value_quant_mode=0, dequant_scale_query=q_scale,
    dequant_scale_key=k_scale, dequant_scale_value=k_scale)
print("attn_out:", tuple(attn_out.shape), attn_out.dtype)  # [N, B, 1, 512]

# the check: float32 attention over the dequantized rows (the rope was divided by q_scale * k_scale)
ckv = ckv_cache.cpu().view(block_num, Hckv // 32, block_size, 32).permute(0, 2, 1, 3).reshape(-1, Hckv).float()
kpe = kpe_cache.cpu().view(block_num, Dr // 16, block_size, 16).permute(0, 2, 1, 3).reshape(-1, Dr).float()
ks = float(k_scale)
worst = 0.0
for b, length in enumerate(seq_lens):
    pos = torch.arange(length)
    rows = block_table[b, pos // block_size].long() * block_size + pos % block_size
    k, kr = ckv[rows], kpe[rows]  # [L, 512] int values, [L, 64]
    qs = q_scale[b, 0].cpu()[:, None]  # [N, 1]
    s = (q[b, 0].cpu().float() @ k.T + q_rope[b, 0].cpu().float() @ kr.T) * qs * ks * scale  # [N, L]
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))  # [N, L]
    golden = (e / e.sum(dim=-1, keepdim=True)) @ (k * ks)  # [N, 512]
    # the kernel's P: int8 of 127 * e against the block max (one 512-token block here, max 1)
    golden_p8 = (torch.round(127 * e) / 127) @ (k * ks) / e.sum(dim=-1, keepdim=True)
    out = attn_out[:, b, 0].cpu().float()
    err = ((out - golden_p8).abs().amax(dim=-1) / golden_p8.abs().amax(dim=-1)).max().item()
    err_float = ((out - golden).abs().amax(dim=-1) / golden.abs().amax(dim=-1)).max().item()
    worst = max(worst, err)
    print(f"seq {b}: {length} tokens; max |out - golden with int8 P| = {err:.2e}, |out - float golden| = "
          f"{err_float:.2e} (of the row's largest value)")
if worst > 2 ** -6:  # a P one step off at a rounding tie, the fp16 staging of P @ V, the bf16 output
    sys.exit(f"C8 attention differs from the dequantized golden (worst relative error {worst:.3e})")
print("matches the dequantized float32 golden with int8 P within the fp16 / bf16 roundings")
