"""DeepSeek-V4 decode attention: the compressed-key indexer and both shared-KV attentions against
the machine floor, in one run.

One decode step of ``--batch`` requests (one query token each, ``--context`` kv tokens each,
DeepSeek-V4-Flash's attention shapes: 64 query heads, latent 512, window 128; a CSA layer with
ratio 4 and the indexer's top-512):

- ``npu_vllm_quant_lightning_indexer`` (A2 / A3 int8, ``cmp_ratio`` 4): floor, per request, the
  int8 product ``q [64, 128] @ K^T [128, S / 4]`` on the fastest engine (``benchmarks/_floor.py``),
  the top-512 ``np.argpartition`` of its score row, and the key bytes read at the copy bandwidth;
- ``npu_sparse_attn_sharedkv`` (A2 / A3, bf16 caches) and ``npu_kv_quant_sparse_attn_sharedkv``
  (Ascend 950, 640-byte FP8 rows): floor, per token, the two products ``q [64, 512] @ K^T`` and
  ``P [64, L] @ K`` over its ``L = 128 + 512`` rows (window and top-512) and the rows' bytes
  gathered at the copy bandwidth (bf16: 1024 bytes a row; the 950: 640).

Two last lines time the attentions' products alone: on sgemm (fp32 on widened operands: one
``q @ K^T`` over a token's 640 rows, one ``P @ K`` per 128-row tile), and as the op runs them now
(``emu.matmul.matmul_bf16_f32``: oneDNN's fp32 matmul in bf16 mode where the engine's rule takes
them, batched over the tokens, sgemm otherwise; the engine it ran is printed): the op over them is
what the emulator adds to its products, they over the machine floor the engine's gap.

Time per call: the best average over ``--rounds`` alternating rounds of ``--calls`` calls after
a warm-up round (``benchmarks/_timing.py``).

Usage: ``python benchmarks/bench_v4_attention.py [--batch 4] [--context 4096] [--calls 3] [--rounds 5]
[--threads N]`` (``--threads``: OpenBLAS / Numba / OpenMP threads, ``benchmarks/_timing.py``).
"""

from __future__ import annotations

import argparse
import os

import ascend_emu  # noqa: F401  (before torch, as the other benchmarks: docs/performance.md "Threads")
import ml_dtypes
import numpy as np
from _floor import MachineFloor, floor_line, movement, other, product, ratio_line
from _timing import best_times, run_with_threads

from ascend_emu import ops
from ascend_emu.emu.matmul import bf16_engines_used, matmul_bf16_f32, one_blas_thread, span

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
N1, D, DI, WINDOW, TOPK, RATIO, BS = 64, 512, 128, 128, 512, 4, 128


def _paged(rows: int, width: int, dtype, rng, batch: int):
    """A cache holding ``rows`` rows per request in consecutive blocks, and its block table."""
    per = -(-rows // BS)
    if dtype == FP8:
        cache = np.zeros((batch * per, BS, 1, width), np.uint8)
        cache[..., :128] = rng.uniform(-1, 1, (batch * per, BS, 1, 64)).astype(BF16).view(np.uint8)
        cache[..., 128:576] = rng.uniform(-8, 8, (batch * per, BS, 1, 448)).astype(FP8).view(np.uint8)
        cache[..., 576:583] = 124
        cache = cache.view(FP8)
    else:
        cache = rng.uniform(-1, 1, (batch * per, BS, 1, width)).astype(dtype)
    return cache, np.arange(batch * per, dtype=np.int32).reshape(batch, per)


def _set_soc(name: str | None) -> None:
    """Restore ``ASCEND_EMU_SOC_NAME`` (unset when it was)."""
    if name is None:
        os.environ.pop("ASCEND_EMU_SOC_NAME", None)
    else:
        os.environ["ASCEND_EMU_SOC_NAME"] = name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4, help="requests (one decode token each)")
    parser.add_argument("--context", type=int, default=4096, help="kv tokens per request (>= 2048 for 512 rows)")
    parser.add_argument("--calls", type=int, default=3, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--threads", type=int, default=None, help="thread count of every library (restarts)")
    args = parser.parse_args()
    threads = run_with_threads(args.threads)
    b, s = args.batch, args.context
    rng = np.random.default_rng(0)
    seq = np.full(b, s, np.int32)
    cu = np.arange(b + 1, dtype=np.int32)
    print(f"DeepSeek-V4 decode attention  batch={b} context={s} N1={N1} D={D} window={WINDOW} "
          f"CSA ratio={RATIO} top-{TOPK}  ({threads})")

    # ---- the compressed-key indexer (A2 / A3 int8)
    s3 = s // RATIO
    q8 = rng.integers(-128, 128, (b, N1, DI), dtype=np.int8)
    w = rng.uniform(0, 0.01, (b, N1)).astype(np.float16)
    qs = rng.uniform(0, 10, (b, N1)).astype(np.float16)
    key, ktab = _paged(s3, DI, np.int8, rng, b)
    key = rng.integers(-128, 128, key.shape, dtype=np.int8)
    kscale = rng.uniform(0, 10, key.shape[:3]).astype(np.float16)
    qli_meta = ops.npu_vllm_quant_lightning_indexer_metadata(
        N1, 1, DI, 0, 0, actual_seq_lengths_query=cu[1:], actual_seq_lengths_key=seq, batch_size=b, max_seqlen_q=1,
        max_seqlen_k=s, layout_query="TND", layout_key="PA_BSND", sparse_count=TOPK, cmp_ratio=RATIO)
    qli_kw = dict(actual_seq_lengths_query=cu[1:], actual_seq_lengths_key=seq, block_table=ktab, metadata=qli_meta,
                  layout_query="TND", layout_key="PA_BSND", sparse_count=TOPK, sparse_mode=3, cmp_ratio=RATIO)

    def indexer():
        return ops.npu_vllm_quant_lightning_indexer(q8, key, w, qs, kscale, **qli_kw)[0]

    idx = indexer().reshape(b, 1, TOPK)
    k_rows = key.reshape(-1, DI)[:s3]
    score = np.zeros(s3, np.float32)
    qli_prod = product("q@K^T int8", q8[0], np.ascontiguousarray(k_rows.T))
    qli_floor = MachineFloor([qli_prod, other("top-512", "argpartition", lambda: np.argpartition(score, -TOPK)),
                              movement("keys", s3 * (DI + 2))] * b)

    # ---- the two shared-KV attentions (CSA: window + top-512)
    q = rng.uniform(-3, 3, (b, N1, D)).astype(BF16)
    sinks = rng.uniform(-2, 2, N1).astype(np.float32)
    common = dict(cu_seqlens_q=cu, seqused_kv=seq, cmp_sparse_indices=idx, sinks=sinks, softmax_scale=D ** -0.5,
                  cmp_ratio=RATIO, layout_q="TND")
    ori16, otab = _paged(s, D, BF16, rng, b)
    cmp16, ctab = _paged(s3, D, BF16, rng, b)
    meta16 = ops.npu_sparse_attn_sharedkv_metadata(N1, 1, D, cu_seqlens_q=cu, seqused_kv=seq, batch_size=b,
                                                   max_seqlen_q=1, max_seqlen_kv=s, cmp_topk=TOPK, cmp_ratio=RATIO,
                                                   layout_q="TND")
    kw16 = dict(common, ori_kv=ori16, ori_block_table=otab, cmp_kv=cmp16, cmp_block_table=ctab, metadata=meta16)
    ori8, _ = _paged(s, 640, FP8, rng, b)
    cmp8, _ = _paged(s3, 640, FP8, rng, b)
    soc = os.environ.get("ASCEND_EMU_SOC_NAME")
    os.environ["ASCEND_EMU_SOC_NAME"] = "Ascend950PR_9599"  # the 950 op's calls only (the indexer runs int8)
    meta8 = ops.npu_kv_quant_sparse_attn_sharedkv_metadata(N1, 1, D, 1, cu_seqlens_q=cu, seqused_kv=seq, batch_size=b,
                                                          max_seqlen_q=1, max_seqlen_kv=s, cmp_topk=TOPK,
                                                          cmp_ratio=RATIO, layout_q="TND")
    kw8 = dict(common, ori_kv=ori8, ori_block_table=otab, cmp_kv=cmp8, cmp_block_table=ctab, metadata=meta8,
               tile_size=64, rope_head_dim=64)
    _set_soc(soc)

    def a2a3():
        return ops.npu_sparse_attn_sharedkv(q, **kw16)

    def a950():
        os.environ["ASCEND_EMU_SOC_NAME"] = "Ascend950PR_9599"
        try:
            return ops.npu_kv_quant_sparse_attn_sharedkv(q, 1, **kw8)
        finally:
            _set_soc(soc)

    rows = WINDOW + TOPK
    kv = rng.uniform(-1, 1, (rows, D)).astype(BF16)
    qk = product("q@K^T", q[0], np.ascontiguousarray(kv.T))
    pv = product("P@K", rng.uniform(0, 1, (N1, rows)).astype(BF16), kv)
    floor16 = MachineFloor([qk, pv, movement("rows", rows * D * 2)] * b)
    floor8 = MachineFloor([qk, pv, movement("rows", rows * 640)] * b)
    # the emulator's own floor: its products on its engine (fp32 sgemm on widened operands, one
    # q @ K^T over the token's rows, one P @ K per 128-row tile, one OpenBLAS thread)
    q32, k32 = q[0].astype(np.float32), kv.astype(np.float32)
    p32 = rng.uniform(0, 1, (N1, 128)).astype(BF16).astype(np.float32)

    def own_products():
        with one_blas_thread():
            for _ in range(b):
                np.matmul(q32, k32.T)
                for j in range(0, rows, 128):
                    np.matmul(p32, k32[j:j + 128])

    own = MachineFloor([other("products", "sgemm", own_products)])
    q3, k3, p3 = (np.repeat(v[None], b, axis=0) for v in (q32, k32, np.tile(p32, (1, rows // 128))))
    spans = [span(v) for v in (q3, k3, p3)]

    def engine_products():  # as the op runs them: one batched S, one batched P @ K per tile
        with one_blas_thread():
            matmul_bf16_f32(q3, k3.transpose(0, 2, 1), a_span=spans[0], b_span=spans[1])
            for j in range(0, rows, 128):
                matmul_bf16_f32(p3[:, :, j:j + 128], k3[:, j:j + 128], a_span=spans[2], b_span=spans[1])

    engine_products()
    eng = ", ".join(sorted({e for key, e in bf16_engines_used().items() if key[0] == "f32"})) or "sgemm"
    t_qli, f_qli, t16, f16, t8, f8, t_own, t_eng = best_times(
        [indexer, qli_floor, a2a3, floor16, a950, floor8, own, engine_products], args.rounds, number=args.calls)
    for name, t, f, fl in (("npu_vllm_quant_lightning_indexer", t_qli, f_qli, qli_floor),
                           ("npu_sparse_attn_sharedkv", t16, f16, floor16),
                           ("npu_kv_quant_sparse_attn_sharedkv", t8, f8, floor8)):
        print(f"{name:34s} {t * 1e3:8.2f} ms/step  {floor_line(fl, f)}  {ratio_line(name, t, f)}")
    print(f"{'attention products on sgemm':34s} {t_own * 1e3:8.2f} ms/step  (the emulator's engine; / machine floor "
          f"{t_own / f16:.2f}): npu_sparse_attn_sharedkv / them {t16 / t_own:.2f}, "
          f"npu_kv_quant_sparse_attn_sharedkv / them {t8 / t_own:.2f}")
    print(f"{'attention products, op engine':34s} {t_eng * 1e3:8.2f} ms/step  ({eng}: matmul_bf16_f32, the fp32-output "
          f"bf16 engine's rule; / machine floor {t_eng / f16:.2f}): npu_sparse_attn_sharedkv / them {t16 / t_eng:.2f}, "
          f"npu_kv_quant_sparse_attn_sharedkv / them {t8 / t_eng:.2f}")


if __name__ == "__main__":
    main()
