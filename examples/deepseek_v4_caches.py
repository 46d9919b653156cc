"""One DeepSeek-V4 CSA layer's caches written from a prefill and a decode token, then inspected.

A request of 11 tokens is prefilled, then one decode token (position 11) arrives. The writers put
each token's latent in the SWA cache, each completed group of 4 tokens' compressed row in the c4
cache and its indexer key in the indexer caches, and the positions the compressor still needs in
the state caches. The inspector then answers, for the decode token: its SWA slot, its compressed row
and the tokens that row covers, its state row; and draws the layer's three caches.

The compressed rows and state rows stand for the ``compressor`` op's output (drawn here, so the
example shows the writers and the geometry alone). Run: ``ascend-emu run
examples/deepseek_v4_caches.py [--soc 950]`` (docs/v4.md, "Worked example").
"""

import argparse
import os

import ml_dtypes
import numpy as np

from ascend_emu import inspect, ops
from ascend_emu.layouts import V4LayerCaches

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--soc", choices=["a2a3", "950"], default="a2a3", help="cache family (default a2a3)")
args = parser.parse_args()
if args.soc == "950":
    os.environ.setdefault("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")  # the 950 writers run on a 950 only

bf16, rng = ml_dtypes.bfloat16, np.random.default_rng(0)
layer = V4LayerCaches(args.soc, 4, block_size=16, num_blocks=3, cmp_block_size=16, cmp_num_blocks=2,
                      state_num_blocks=4)
caches = layer.new()
swa_table = np.array([2, 0])     # the request's SWA blocks (block 2 holds positions 0..15)
cmp_table = np.array([1])        # its compressed (and indexer) block
state_table = np.array([3, 1])   # state blocks of 8 positions; an entry 0 would mean "do not update"
sbs = layer.state_block_size


def write_tokens(positions):
    """The SWA writer: one latent row per token."""
    kv = rng.standard_normal((len(positions), 512)).astype(bf16)
    slots = swa_table[np.asarray(positions) // 16] * 16 + np.asarray(positions) % 16
    if args.soc == "950":
        ops.kv_compress_epilog(caches["swa"].reshape(-1, 1, 640), kv, slots.astype(np.int32))  # layout 1: 640-byte fp8 rows
    else:
        ops.npu_scatter_nd_update_v2(caches["swa"], np.stack([slots // 16, slots % 16], 1), kv)


def write_groups(rows):
    """The compressed-cache and indexer writers: one row per completed group of 4 tokens."""
    cmp_kv = rng.standard_normal((len(rows), 512)).astype(bf16)   # stands for the compressor's rows
    key = rng.standard_normal((len(rows), 128)).astype(bf16)      # and the indexer compressor's keys
    slots = cmp_table[np.asarray(rows) // 16] * 16 + np.asarray(rows) % 16
    pairs = np.stack([slots // 16, slots % 16], 1)
    if args.soc == "950":
        ops.kv_compress_epilog(caches["compressed"].reshape(-1, 1, 640), cmp_kv, slots.astype(np.int32))
        ops.indexer_compress_epilog_v2(caches["indexer_packed"], key, slots.astype(np.int32), layout=2)
    else:
        ops.npu_scatter_nd_update_v2(caches["compressed"], pairs, cmp_kv)
        q, scale = ops.npu_dynamic_quant(key)                      # per-token int8, as vllm-ascend does
        ops.npu_scatter_nd_update_v2(caches["indexer_key"], pairs, q)
        ops.npu_scatter_nd_update_v2(caches["indexer_scale"], pairs, scale.astype(np.float16).reshape(-1, 1))


def write_state(positions):
    """The state rows the compressor keeps for positions whose groups are not finished."""
    pos = np.asarray(positions)
    pairs = np.stack([state_table[pos // sbs], pos % sbs], 1)
    ops.npu_scatter_nd_update_v2(caches["state"], pairs, rng.standard_normal((len(pos), 2048)).astype(np.float32))
    ops.npu_scatter_nd_update_v2(caches["indexer_state"], pairs,
                                 rng.standard_normal((len(pos), 512)).astype(np.float32))


# prefill: positions 0..10 -> groups 0 and 1 complete; 8..10 (and, coff 2, group 1: 4..7) stay in the state
write_tokens(range(11))
write_groups([0, 1])
write_state(range(4, 11))
# decode: position 11 completes group 2 (tokens 8..11); the state now holds 8..11
write_tokens([11])
write_groups([2])
write_state([11])

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
