"""Find a corrupted row in a PA_NZ cache with ascend_emu.inspect, and explain it.

npu_mla_prolog_v3 (bf16, cache_mode "PA_NZ") writes four tokens' compressed kv rows into a paged
kv_cache. Then a stray write (simulated here: the sign bits of eight k_nope elements of one
token's row are flipped) corrupts the cache. ``inspect.diff`` against a clean copy finds exactly
the slot and bytes that changed, ``inspect.dump`` shows them decoded, and ``inspect.what`` says
what the first bad byte is. The same steps on the command line are printed at the end, for the
two files this script writes (clean.npz and broken.npz, in --out DIR: default the current
directory).

Run with:  python examples/inspect_corrupted_cache.py [--out DIR]   (or: ascend-emu run examples/...)
Exits 1 unless the diff finds exactly the corrupted row.
"""

import argparse
import os
import shlex
import sys

import ml_dtypes
import numpy as np

from ascend_emu import inspect, ops

parser = argparse.ArgumentParser(description="Find a corrupted row in a PA_NZ cache with ascend_emu.inspect.")
parser.add_argument("--out", metavar="DIR", default=".",
                    help="directory for clean.npz and broken.npz (default: the current directory)")
out_dir = parser.parse_args().out
os.makedirs(out_dir, exist_ok=True)

bf16 = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
T, He, Hcq, N, Hckv, D, Dr = 4, 7168, 1536, 8, 512, 128, 64
BlockNum, BlockSize = 4, 16


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(bf16)


w_dq = ops.npu_format_cast(randn(He, Hcq, scale=He ** -0.5), 29)
w_uq_qr = ops.npu_format_cast(randn(Hcq, N * (D + Dr), scale=Hcq ** -0.5), 29)
w_dkv_kr = ops.npu_format_cast(randn(He, Hckv + Dr, scale=He ** -0.5), 29)
kv_cache = np.zeros((BlockNum, BlockSize, 1, Hckv), bf16)  # [BlockNum, BlockSize, 1, Hckv], PA_NZ bytes
kr_cache = np.zeros((BlockNum, BlockSize, 1, Dr), bf16)  # [BlockNum, BlockSize, 1, Dr]
cache_index = np.array([3, 17, 40, 63])  # [T] slots
ops.npu_mla_prolog_v3(randn(T, He), w_dq, w_uq_qr, randn(N, D, Hckv, scale=D ** -0.5), w_dkv_kr,
                      np.ones(Hcq, bf16), np.ones(Hckv, bf16), randn(T, Dr), randn(T, Dr),
                      kv_cache, kr_cache, cache_index=cache_index, cache_mode="PA_NZ")
clean = inspect.Cache.from_array(kv_cache, "PA_NZ")

# ---- the corruption: token 2's k_nope dims 40..47 get their sign bits flipped in place
token, bad_dims = 2, range(40, 48)
slot = int(cache_index[token])
raw = kv_cache.reshape(-1).view(np.uint8)  # the cache's memory
for d in bad_dims:
    raw[clean.layout.byte_offset(slot, d) + 1] ^= 0x80  # high byte of the little-endian bf16
broken = inspect.Cache.from_array(kv_cache, "PA_NZ")

# ---- find it: diff against the clean copy, with the op's cache_index as the expected slots
d = inspect.diff(clean, broken)
print(f"diff: {d.summary['bytes']} byte(s) differ, in slot(s) {d.summary['slots']}")
for s in d.slots:
    for f in s.fields:
        print(f"  block {s.block}, row {s.row} (slot {s.slot}): {f.field} elements {f.elements}, "
              f"max {f.max_ulp} ulp")
first = inspect.what(broken, int(d.changed[0]))
print(f"first bad byte {first.byte_offset}: block {first.block}, row {first.row}, dim {first.dim}, "
      f"byte {first.byte_in_element} of the bf16 (NZ C0 chunk {first.c0_chunk}, fractal {first.fractal})")

# ---- explain it: the dump lines of that slot whose bytes differ, clean vs broken
print(f"\ndump of slot {slot} (token {token}), lines that differ:")
for good, bad in zip(inspect.dump(clean, slot=slot).lines, inspect.dump(broken, slot=slot).lines, strict=True):
    if good.hex != bad.hex:
        print(f"  @{bad.offset} {bad.field}[{bad.first}:{bad.last}] (C0 chunk {bad.c0_chunk})")
        print(f"    clean  {good.hex}\n           {[round(v, 4) for v in good.values]}")
        print(f"    broken {bad.hex}\n           {[round(v, 4) for v in bad.values]}")

a = inspect.save_cache(os.path.join(out_dir, "clean.npz"), clean)
b = inspect.save_cache(os.path.join(out_dir, "broken.npz"), broken)
again = inspect.diff(inspect.load_cache(a), inspect.load_cache(b))
print(f"\nthe same from the files written: ascend-emu inspect diff {shlex.quote(a)} {shlex.quote(b)} --expect-slots "
      f"{','.join(map(str, cache_index))}  ->  {again.summary['bytes']} byte(s), slots {again.summary['slots']}")
print(f"                                ascend-emu inspect dump {shlex.quote(b)} --slot {slot}")

expected = sorted(clean.layout.byte_offset(slot, dd) + 1 for dd in bad_dims)
found = d.summary["slots"] == [slot] and d.changed.tolist() == expected and again.changed.tolist() == expected
print("\nfound exactly the corrupted row:", found)
sys.exit(0 if found else 1)
