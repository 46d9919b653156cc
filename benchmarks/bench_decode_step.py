"""The DeepSeek-V3.2 decode step of ``ascend-emu demo`` repeated over L layers, against its floor.

One decode step of the int8 path per layer: ``npu_mla_prolog_v3`` (partial quant, per-tile kv
cache) -> ``npu_lightning_indexer`` -> ``npu_kv_quant_sparse_flash_attention``, at the demo's
shapes (:mod:`ascend_emu.demo`: He 7168, 16 query heads of one TP-8 rank, top-2048 of a 4096-token
context by default). The floor of a layer is the bare work the step contains
(``DecodeStepReport.floor_int8``: the prolog's four fp32 BLAS products on pre-widened weights,
the indexer's q . k product and top-k ``argpartition``, the gather of the selected 656-byte rows
and the attention's two products). One layer's weights and caches serve every layer (61 layers'
weights widened to fp32 would take about 5 GB), so the figures are those of a model whose layers
all hit warm CPU caches equally. Printed: ms per step (L layers) for the emulator and the floor,
and their ratio, measured in one run (best of alternating rounds).

Usage: ``python benchmarks/bench_decode_step.py [--layers 61] [--context 4096] [--repeat 3]``
"""

from __future__ import annotations

import argparse

from _timing import best_times

from ascend_emu.demo import DecodeStepConfig, run_decode_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=61, help="decoder layers per step (DeepSeek-V3.2: 61)")
    parser.add_argument("--context", type=int, default=4096, help="tokens in the cache")
    parser.add_argument("--sparse-count", type=int, default=2048, help="indexer top-k")
    parser.add_argument("--heads", type=int, default=16, help="query heads N")
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds")
    ns = parser.parse_args()
    rep = run_decode_step(DecodeStepConfig(context=ns.context, sparse_count=ns.sparse_count, heads=ns.heads))

    def layers(fn):
        return lambda: [fn() for _ in range(ns.layers)]

    t_emu, t_floor = best_times([layers(rep.decode_int8), layers(rep.floor_int8)], ns.repeat)
    print(f"decode step, {ns.layers} layers, context {ns.context}, top-{ns.sparse_count}, N={ns.heads}:")
    print(f"  emulator {t_emu * 1e3:8.1f} ms per step ({t_emu / ns.layers * 1e3:.2f} ms per layer)")
    print(f"  floor    {t_floor * 1e3:8.1f} ms per step ({t_floor / ns.layers * 1e3:.2f} ms per layer)")
    print(f"  ratio    {t_emu / t_floor:8.2f}x")


if __name__ == "__main__":
    main()
