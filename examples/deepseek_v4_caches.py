"""One DeepSeek-V4 CSA layer's caches written from a prefill and a decode token, then inspected.

A request of 11 tokens is prefilled, then one decode token (position 11) arrives. Each call runs
what vllm-ascend runs for a CSA layer's caches: the SWA writer puts each token's latent in the SWA
cache; ``compressor_metadata`` gives the rope rows and slots of the compressed rows the call
completes; ``compressor`` (c4, overlapping groups) turns the tokens' hidden states into those rows
and keeps every token's kv / score state in the fp32 state cache (the decode call reads the
prefill's state back); a second ``compressor`` (D 128) gives the indexer keys; the writers put the
rows in the c4 and indexer caches. The inspector then answers, for the decode token: its SWA slot,
its compressed row and the tokens that row covers, its state row; and draws the layer's three caches.

Hidden states, latents and weights are random (hidden size 1024, the compressor's smallest). Run:
``ascend-emu run examples/deepseek_v4_caches.py [--soc 950]`` (docs/v4.md, "Worked example").
"""

import argparse
import os

import ml_dtypes
import numpy as np

from ascend_emu import inspect, ops
from ascend_emu.layouts import V4_CMP_ROPE_THETA, V4LayerCaches, v4_rope_tables

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--soc", choices=["a2a3", "950"], default="a2a3", help="cache family (default a2a3)")
args = parser.parse_args()
if args.soc == "950":
    os.environ.setdefault("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")  # the 950 writers run on a 950 only

bf16, rng = ml_dtypes.bfloat16, np.random.default_rng(0)
H, RATIO, COFF = 1024, 4, 2                   # hidden size; c4 compressor with overlapping groups
layer = V4LayerCaches(args.soc, RATIO, block_size=16, num_blocks=3, cmp_block_size=16, cmp_num_blocks=2,
                      state_num_blocks=4)
caches = layer.new()
swa_table = np.array([2, 0])     # the request's SWA blocks (block 2 holds positions 0..15)
cmp_table = np.array([1])        # its compressed (and indexer) block
state_table = np.array([3, 1])   # state blocks of 8 positions; an entry 0 would mean "do not update"
cos_table, sin_table = v4_rope_tables(16, V4_CMP_ROPE_THETA)


def weights(d):
    """One compressor's weights: wkv / wgate bf16 [2 * d, H], ape fp32 [4, 2 * d], norm [d]."""
    mat = lambda: (rng.standard_normal((COFF * d, H)) / np.sqrt(H)).astype(bf16)  # noqa: E731
    norm = 1 + 0.1 * rng.standard_normal(d)  # the 950's compressor takes an fp32 norm weight
    return {"wkv": mat(), "wgate": mat(), "ape": (0.5 * rng.standard_normal((RATIO, COFF * d))).astype(np.float32),
            "norm": norm.astype(np.float32) if args.soc == "950" else norm.astype(bf16)}


w_kv, w_idx = weights(512), weights(128)


def write_tokens(positions):
    """The SWA writer: one latent row per token."""
    kv = rng.standard_normal((len(positions), 512)).astype(bf16)
    slots = swa_table[np.asarray(positions) // 16] * 16 + np.asarray(positions) % 16
    if args.soc == "950":
        ops.kv_compress_epilog(caches["swa"].reshape(-1, 1, 640), kv, slots.astype(np.int32))  # layout 1: 640-byte fp8 rows
    else:
        ops.npu_scatter_nd_update_v2(caches["swa"], np.stack([slots // 16, slots % 16], 1), kv)


def compress(x, start):
    """The call's compressed rows: metadata, the two compressors (state carried in the caches), the writers."""
    t = x.shape[0]
    cu, sp, n = np.array([0, t], np.int32), np.array([start], np.int32), min(t, t // RATIO + 1)
    fmt = 1 if args.soc == "950" else 2  # flat slots for the 950 writers, (block, offset) for the scatter
    cos, sin, slots = ops.compressor_metadata(cos_table, sin_table, cu, sp, cmp_table[None].astype(np.int32), 16,
                                              fmt, RATIO, n, 1)

    def run(w, state):
        return ops.compressor(x, w["wkv"], w["wgate"], state.reshape(state.shape[0], state.shape[1], -1), w["ape"],
                              w["norm"], sin.reshape(n, 64), cos.reshape(n, 64), state_table[None].astype(np.int32),
                              cu, None, sp, 64, RATIO, COFF, 1e-6, 2, 1)
    rows, keys = run(w_kv, caches["state"]), run(w_idx, caches["indexer_state"])
    if args.soc == "950":
        ops.kv_compress_epilog(caches["compressed"].reshape(-1, 1, 640), rows, slots)  # slot -1: padding row
        ops.indexer_compress_epilog_v2(caches["indexer_packed"], keys, slots, layout=2)
    else:
        ops.npu_scatter_nd_update_v2(caches["compressed"], slots, rows)  # [-1, 15]: padding row, skipped
        valid = slots[:, 0] >= 0
        q, scale = ops.npu_dynamic_quant(keys[valid])                # per-token int8, as vllm-ascend does
        ops.npu_scatter_nd_update_v2(caches["indexer_key"], slots[valid], q)
        ops.npu_scatter_nd_update_v2(caches["indexer_scale"], slots[valid], scale.astype(np.float16).reshape(-1, 1))
    return rows[(slots >= 0) if fmt == 1 else (slots[:, 0] >= 0)]


hidden = rng.standard_normal((12, H)).astype(bf16)
# prefill: positions 0..10 -> groups 0 and 1 complete; every position's state row is kept
write_tokens(range(11))
print(f"prefill: compressor gave {compress(hidden[:11], 0).shape[0]} compressed rows (groups 0, 1)")
# decode: position 11 completes group 2 (tokens 8..11, drawing on group 1's state rows 4..7 too)
write_tokens([11])
row2 = compress(hidden[11:], 11)
print(f"decode: compressed row 2 starts {row2[0, :3].astype(np.float32)}")

layer.check(caches)
print(f"{layer.kind} layer, {layer.soc}: " + "; ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in caches.items()))
t = inspect.v4_token(layer, 11, swa_table, cmp_block_table_row=cmp_table, state_block_table_row=state_table,
                     seq_len=12)
print(f"decode token 11: SWA block {t.swa.block} row {t.swa.row} (slot {t.swa.slot}); compressed row "
      f"{t.compressed_row} at slot {t.compressed.slot} covers tokens {list(t.covers)} (overlapping "
      f"{list(t.overlap)}), written: {t.complete}; state block {t.state.block} row {t.state.row}")
if args.soc == "950":
    row = inspect.v4_cache_row(caches["swa"], t.swa.slot)
    print(f"its 640-byte SWA row: E8M0 scale bytes {row.scale_bytes}, first values {np.round(row.values[:3], 3)}, "
          f"rope {np.round(row.rope[:2], 3)}, padding all zero: {row.pad_zero}")
else:
    print(f"its bf16 SWA row starts {caches['swa'].reshape(-1, 512)[t.swa.slot, :3].astype(np.float32)}")
view = inspect.v4_blocks(layer, swa_table[None], [12], cmp_block_table=cmp_table[None],
                         state_block_table=state_table[None])
print(f"SWA slots of the 12 tokens: {view.swa.slots[0].tolist()}")
print(f"compressed slots of rows 0..2: {view.compressed.slots[0].tolist()}")
print("state: " + "; ".join(f"positions [{r.first}, {r.stop}) -> block {r.block} rows from {r.row}" for r in view.state[0]))
print("the same from the command line:\n  ascend-emu inspect v4-token --v4-ratio 4 --soc " + args.soc +
      " --block-size 16 --num-blocks 3 --block-table '[2,0]' --cmp-block-table '[1]' --cmp-num-blocks 2"
      " --state-block-table '[3,1]' --state-num-blocks 4 --position 11 --seq-len 12")
