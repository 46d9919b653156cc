"""Cost of checked mode (docs/inspect.md#checked-mode) on a DeepSeek-V3.2 decode step, measured in one run.

The step (int8 path of ``ascend-emu demo``, one TP-8 rank, one layer): ``npu_mla_prolog_v3``
(partial quant, per-tile kv quant into a PA_BSND cache of 656-byte rows) for the new token,
``npu_lightning_indexer`` (top-k over the context), ``npu_kv_quant_sparse_flash_attention``
over the selected tokens. Timed with checked mode off and on (best of alternating rounds,
:mod:`_timing`); printed: ms per step and the ratio on / off. The cache is filled once by a
prefill through ``npu_mla_prolog_v3`` in checked mode (so its written-slot map is complete) and
the indexer's key cache, a plain NumPy scatter as in DeepSeek-V3.2, is declared with
``ascend_emu.mark_written``.

Also printed: with checked mode off, what the hooks of one op call cost, called as the ops call
them (``--hooks-only`` prints just that): the writer pair of ``npu_mla_prolog_v3`` (with the
tuples it builds for them) and the reader pair of the sparse attention.

Usage: ``PYTHONPATH=. python benchmarks/bench_checked.py [--context 4096] [--repeat 5] [--hooks-only]``
"""

from __future__ import annotations

import argparse

import numpy as np
from _timing import best_times

import ascend_emu
from ascend_emu import checked_mode, ops
from ascend_emu.layouts import slots_from_block_table
from ascend_emu.mla import D_NOPE, D_ROPE, HCKV
from ascend_emu.quant import BF16, MLA_ROW


def hooks_off_us(repeat: int, number: int = 200_000) -> tuple[float, float]:
    """Checked mode off: the hooks of one op call, in us (best of ``repeat`` rounds of ``number``
    calls): ``npu_mla_prolog_v3``'s ``will_write`` / ``wrote`` with the tuples it passes, and the
    sparse attention's ``read_sparse_attention`` / ``check_finite``. Each hook returns at its
    flag test; the arrays are stand-ins (they are never looked at with checked mode off)."""
    assert not checked_mode.enabled(), "the hook cost is measured with checked mode off"
    kv, kr, out, slots = (np.zeros(4, np.float32) for _ in range(4))
    layout = object()

    def prolog_hooks():
        caches = ((kv, layout), (kr, layout))
        checked_mode.will_write(*caches)
        checked_mode.wrote("npu_mla_prolog_v3", slots, caches, (("query", out), ("query_rope", out),
                                                               ("query_norm", out)))

    def attention_hooks():
        op = "npu_kv_quant_sparse_flash_attention"
        checked_mode.read_sparse_attention(op, None, kv, None, None, slots, 2, "PA_BSND")
        checked_mode.check_finite(op, (("attention_out", out),))

    writer, reader = best_times([prolog_hooks, attention_hooks], repeat, number=number)
    return writer * 1e6, reader * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=4096, help="tokens in the cache before the step")
    p.add_argument("--heads", type=int, default=16, help="query heads N (128 / TP 8)")
    p.add_argument("--sparse-count", type=int, default=2048, help="indexer top-k")
    p.add_argument("--repeat", type=int, default=5, help="timed rounds")
    p.add_argument("--hooks-only", action="store_true", help="only the cost of the hooks with checked mode off")
    a = p.parse_args()
    writer, reader = hooks_off_us(a.repeat)
    print(f"checked mode off, hooks per op call: npu_mla_prolog_v3 {writer:.3f} us, "
          f"sparse attention {reader:.3f} us")
    if a.hooks_only:
        return
    rng = np.random.default_rng(0)
    he, hcq, n, bs, ctx = 7168, 1536, a.heads, 128, a.context

    def randn(*shape, scale=1.0):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(BF16)

    total = ctx + 1
    blocks_used = -(-total // bs)
    num_blocks = blocks_used + 8
    table = rng.permutation(num_blocks)[:blocks_used].astype(np.int32)[None, :]  # [1, blocks_used]
    slots = slots_from_block_table(table, [total], bs, num_blocks)[0]  # [total]
    w_uq = rng.integers(-127, 128, (hcq, n * (D_NOPE + D_ROPE))).astype(np.int8)  # [Hcq, N*192]
    w = dict(weight_dq=ops.npu_format_cast(randn(he, hcq, scale=he ** -0.5), 29),
             weight_uq_qr=ops.npu_format_cast(w_uq, 29), weight_uk=randn(n, D_NOPE, HCKV, scale=D_NOPE ** -0.5),
             weight_dkv_kr=ops.npu_format_cast(randn(he, HCKV + D_ROPE, scale=he ** -0.5), 29),
             rmsnorm_gamma_cq=np.ones(hcq, BF16), rmsnorm_gamma_ckv=np.ones(HCKV, BF16))
    x = randn(1, total, he)  # [1, total, He]
    ang = np.arange(total)[:, None] * 1e-3 * np.arange(1, D_ROPE + 1)[None, :]  # [total, Dr]
    sin, cos = np.sin(ang).astype(BF16), np.cos(ang).astype(BF16)
    kv = np.zeros((num_blocks, bs, 1, MLA_ROW.row_bytes), np.int8)  # [BlockNum, BlockSize, 1, 656]
    k_idx = randn(num_blocks, bs, 1, 128)  # [BlockNum, BlockSize, 1, 128] indexer keys

    def prolog(tok):
        return ops.npu_mla_prolog_v3(
            x[:, tok], rope_sin=sin[None, tok], rope_cos=cos[None, tok], kv_cache=kv, kr_cache=np.zeros(0, BF16),
            cache_index=slots[None, tok], dequant_scale_w_uq_qr=np.full((1, n * 192), 1e-3, np.float32),
            k_nope_clip_alpha=np.ones(1, np.float32), cache_mode="PA_BSND", weight_quant_mode=1,
            kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1, **w)

    with ascend_emu.checked():
        prolog(slice(0, ctx))
    ascend_emu.mark_written(k_idx, slots)
    seq_q, seq_kv = np.array([1], np.int32), np.array([total], np.int32)
    q_idx, w_idx = randn(1, 1, 64, 128), randn(1, 1, 64, scale=0.125)

    def step():
        q, q_rope, *_ = prolog(slice(ctx, total))
        idx, _ = ops.npu_lightning_indexer(q_idx, k_idx, w_idx, actual_seq_lengths_query=seq_q,
                                           actual_seq_lengths_key=seq_kv, block_table=table, layout_key="PA_BSND",
                                           sparse_count=a.sparse_count, sparse_mode=3)
        return ops.npu_kv_quant_sparse_flash_attention(
            np.concatenate([q, q_rope], axis=-1), kv, kv, idx, 0.07, 2, 2, block_table=table,
            actual_seq_lengths_query=seq_q, actual_seq_lengths_kv=seq_kv, layout_kv="PA_BSND", attention_mode=2)

    def step_checked():
        with ascend_emu.checked():
            return step()

    off, on = best_times([step, step_checked], a.repeat)
    print(f"decode step, context {ctx}, N={n}, top-{a.sparse_count}: checked off {off * 1e3:.2f} ms, "
          f"on {on * 1e3:.2f} ms, ratio on/off {on / off:.3f}")


if __name__ == "__main__":
    main()
