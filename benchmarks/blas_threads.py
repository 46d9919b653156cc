"""Which outputs depend on the OpenBLAS thread count: every op on fixed inputs, run in a fresh
process under ``OPENBLAS_NUM_THREADS=1`` and ``=2``, outputs (caches included) compared byte for
byte. OpenBLAS splits an sgemm's work differently with more threads, which can change the order
of fp32 sums in the last bit; Numba kernels give the same bytes for any thread count.

    python benchmarks/blas_threads.py            # both runs and the per-output table
    python benchmarks/blas_threads.py --child    # one run: a digest per output (internal)

Shapes: the warm-up scenarios (:mod:`ascend_emu.warmup`), the MLA ones with 16 tokens, and the attention ops at
a decode-like size (the top-2048 of 4096 kv positions, 64 / 128 heads) where their matmuls are
big enough for OpenBLAS to use more than one thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cases():
    from ascend_emu import warmup
    from ascend_emu.quant import BF16

    rng = np.random.default_rng(7)
    yield from warmup._kv_calls(rng)  # no matmul
    warmup.TOKENS = 16  # the prolog's and preprocess's caches hold 16 / 128 rows
    for family in (warmup._prolog_calls, warmup._preprocess_calls):
        yield from family(rng)
    # lightning indexer: 1 and 16 query rows over 4096 keys, bf16 and fp16
    b, n1, d, s2 = 1, 64, 128, 4096
    for s1, dtype in ((1, BF16), (16, np.dtype(np.float16))):
        query, key = warmup._rand(rng, (b, s1, n1, d), dtype), warmup._rand(rng, (b, s2, 1, d), dtype)
        weights = warmup._rand(rng, (b, s1, n1), dtype)
        yield warmup.Call(f"npu_lightning_indexer {np.dtype(dtype).name} S1={s1}", "npu_lightning_indexer",
                          (query, key, weights), dict(layout_query="BSND", layout_key="BSND", sparse_count=2048,
                                                      sparse_mode=0, return_value=True))
    # sparse attention: top-2048 of 4096 paged positions, 128 heads
    n1, bs, k, blocks = 128, 64, 2048, 64
    table = np.arange(blocks, dtype=np.int32).reshape(1, blocks)
    indices = np.stack([rng.permutation(s2)[:k] for _ in range(2)]).astype(np.int32).reshape(1, 2, 1, k)
    common = dict(actual_seq_lengths_query=np.array([2], np.int32), actual_seq_lengths_kv=np.array([s2], np.int32),
                  sparse_block_size=1, layout_query="BSND", sparse_mode=3, attention_mode=2)
    query, query_rope = warmup._rand(rng, (1, 2, n1, 512)), warmup._rand(rng, (1, 2, n1, 64))
    key, key_rope = warmup._rand(rng, (1, s2, 1, 512)), warmup._rand(rng, (1, s2, 1, 64))
    yield warmup.Call("npu_sparse_flash_attention bf16 BSND", "npu_sparse_flash_attention",
                      (query, key, key, indices, 0.04),
                      dict(common, layout_kv="BSND", query_rope=query_rope, key_rope=key_rope, return_softmax_lse=True))
    rows = np.zeros((blocks, bs, 1, 656), np.int8)
    rows[..., :512] = warmup._int8(rng, (blocks, bs, 1, 512))
    rows[..., 512:640] = warmup._rand(rng, (blocks, bs, 1, 64)).view(np.int8)
    rows[..., 640:] = np.full((blocks, bs, 1, 4), 1e-2, np.float32).view(np.int8)
    yield warmup.Call("npu_kv_quant_sparse_flash_attention per-tile PA_BSND", "npu_kv_quant_sparse_flash_attention",
                      (warmup._rand(rng, (1, 2, n1, 576), BF16), rows, rows, indices, 0.04, 2, 2),
                      dict(common, block_table=table, layout_kv="PA_BSND", quant_scale_repo_mode=1, tile_size=128,
                           rope_head_dim=64))


#: Output names per op, in the order the op returns them (caches written in place appended).
NAMES = {
    "npu_kv_rmsnorm_rope_cache": ("k_cache", "ckv_cache", "k_embed_out", "y_out"),
    "npu_mla_prolog_v3": ("query", "query_rope", "dequant_scale_q_nope", "query_norm", "dequant_scale_q_norm",
                          "kv_cache", "kr_cache"),
    "npu_mla_preprocess": ("q_out0", "kv_cache_out0", "q_out1", "kv_cache_out1"),
    "npu_lightning_indexer": ("sparse_indices", "sparse_values"),
    "npu_sparse_flash_attention": ("attention_out", "softmax_max", "softmax_sum"),
    "npu_kv_quant_sparse_flash_attention": ("attention_out",),
}


def child() -> None:
    result = {}
    for call in _cases():
        out = call()
        out = list(out) if isinstance(out, tuple) else [out]
        if call.op == "npu_mla_prolog_v3":
            out += [call.args[9], call.args[10]]  # the caches, written in place
        for name, value in zip(NAMES[call.op], out, strict=True):
            raw = np.ascontiguousarray(np.asarray(value)).view(np.uint8)
            result[f"{call.name}: {name}"] = hashlib.sha256(raw.tobytes()).hexdigest()
    json.dump(result, sys.stdout)


def main() -> None:
    runs = {}
    for threads in ("1", "2"):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, PYTHONPATH=ROOT)
        proc = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(proc.stderr)
        runs[threads] = json.loads(proc.stdout)
    for key in runs["1"]:
        print(f"{'DIFFERS' if runs['1'][key] != runs['2'][key] else 'same   '}  {key}")


if __name__ == "__main__":
    child() if "--child" in sys.argv else main()
