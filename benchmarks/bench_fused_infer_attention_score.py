"""npu_fused_infer_attention_score_v2 (absorbed MLA decode) against its matmul floor and a plain torch golden.

Shapes of the DeepSeek-V3 decode (vllm-ascend ``mla_v1.py`` ``_forward_decode``): one query token
per request, N = 128 query heads (TP-1) or 16 (TP-8), D = 512 + 64 rope, one kv head (the ckv
cache passed as key and value), BNSD_NBSD, paged cache ``[nb, 1, 128, 512]`` (block_size 128),
every request ``--kv`` tokens long. Measured in one run, best of alternating rounds
(``_timing.best_times``) after a warm-up, each after a short untimed pause:

- floor: the two products per request, ``Q [N, 576] @ K^T [576, L]`` and ``P [N, L] @ V [L, 512]``,
  on pre-widened, pre-gathered fp32 operands through the project's exact fp32 path
  (:func:`ascend_emu.emu.matmul.matmul_f32`, BLAS sgemm); with ``--c8`` the int8 products
  through :func:`ascend_emu.emu.matmul.matmul_int8` (the project's fastest exact int8 engine) plus
  the fp32 rope product;
- machine floor (``benchmarks/_floor.py``): the same products on the operands' own dtypes (bf16;
  with ``--c8`` int8 and the bf16 rope product), each on the fastest engine this machine has for
  it (sgemm, oneDNN bf16 or the int8 engine, chosen by timing at set-up); printed with the engine
  each product took;
- torch golden (if torch is installed): what a developer would write per request: gather through
  block_table, fp32 scores, fp32 softmax, bf16 P, fp32 P @ V, bf16 output (with ``--c8``: the
  int8 values dequantised to fp32 first).

Targets: op <= 1.5x the floor; op faster than the torch golden.

Usage: ``python benchmarks/bench_fused_infer_attention_score.py [--cases 16x128x1024 ...] [--c8]
[--repeat 3] [--threads N]`` (a case is ``BxNxL``).
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numba
import numpy as np
from _floor import MachineFloor, floor_line, product, ratio_line
from _timing import best_times, have_torch, run_with_threads

import ascend_emu.emu  # noqa: F401  (sets OMP_WAIT_POLICY before torch starts its OpenMP pool)
from ascend_emu.emu.matmul import matmul_f32, matmul_int8
from ascend_emu.mla import D_ROPE, HCKV
from ascend_emu.ops import npu_fused_infer_attention_score_v2

BF16 = np.dtype(ml_dtypes.bfloat16)
BLOCK_SIZE = 128
#: Default cases ``(B, N, L)``: TP-1 (N = 128) and TP-8 (N = 16) decode, kv 1k-8k.
CASES = ((16, 128, 1024), (16, 128, 4096), (32, 16, 8192), (64, 16, 2048))
TARGET_FLOOR_RATIO = 1.5
SETTLE_S = 0.05


def make_inputs(rng, b, n, kv, c8):
    per = kv // BLOCK_SIZE
    nb = b * per
    table = rng.permutation(nb).reshape(b, per).astype(np.int32)  # [B, per]
    kw = dict(block_table=table, actual_seq_kvlen=[kv] * b, num_query_heads=n, num_key_value_heads=1,
              softmax_scale=(HCKV + D_ROPE) ** -0.5, input_layout="BNSD_NBSD", block_size=BLOCK_SIZE)
    kw["query_rope"] = (rng.standard_normal((b, n, 1, D_ROPE)) * 0.05).astype(BF16)  # [B, N, 1, 64]
    kw["key_rope"] = (rng.standard_normal((nb, 1, BLOCK_SIZE, D_ROPE)) * 0.05).astype(BF16)  # [nb, 1, bs, 64]
    if c8:
        query = rng.integers(-127, 128, (b, n, 1, HCKV)).astype(np.int8)  # [B, N, 1, 512]
        cache = rng.integers(-127, 128, (nb, 1, BLOCK_SIZE, HCKV)).astype(np.int8)  # [nb, 1, bs, 512]
        kw.update(query_quant_mode=3, dequant_scale_query=(rng.random((b, n, 1)) * 0.01 + 1e-3).astype(np.float32),
                  dequant_scale_key=np.array([0.02], np.float32), dequant_scale_value=np.array([0.02], np.float32))
    else:
        query = rng.standard_normal((b, n, 1, HCKV)).astype(BF16)
        cache = rng.standard_normal((nb, 1, BLOCK_SIZE, HCKV)).astype(BF16)
    return query, cache, kw


def op_call(query, cache, kw):
    return lambda: npu_fused_infer_attention_score_v2(query, cache, cache, **kw)


def floor_call(query, cache, kw, c8):
    b, n = query.shape[0], query.shape[1]
    table, kv = kw["block_table"], kw["actual_seq_kvlen"][0]
    k = [cache[table[i]].reshape(-1, HCKV)[:kv] for i in range(b)]  # [L, 512] in the cache dtype
    kr = [kw["key_rope"][table[i]].reshape(-1, D_ROPE)[:kv].astype(np.float32) for i in range(b)]  # [L, 64]
    qr = [kw["query_rope"][i, :, 0].astype(np.float32) for i in range(b)]  # [N, 64]
    if c8:
        q = [np.ascontiguousarray(query[i, :, 0]) for i in range(b)]  # [N, 512] int8
        p = [np.ones((n, kv), np.int8) for _ in range(b)]

        def run():
            for i in range(b):
                matmul_int8(q[i], k[i], w_nk=True)
                matmul_f32(qr[i], kr[i].T)
                matmul_int8(p[i], k[i])
        return run
    kk = [np.concatenate([k[i].astype(np.float32), kr[i]], axis=1) for i in range(b)]  # [L, 576]
    vv = [k[i].astype(np.float32) for i in range(b)]  # [L, 512]
    q = [np.concatenate([query[i, :, 0].astype(np.float32), qr[i]], axis=1) for i in range(b)]  # [N, 576]
    pp = [np.ones((n, kv), np.float32) for _ in range(b)]

    def run():
        for i in range(b):
            matmul_f32(q[i], kk[i].T)
            matmul_f32(pp[i], vv[i])
    return run


def machine_floor(query, cache, kw, c8) -> MachineFloor:
    """The machine floor (module doc): the floor's products per request on the operands' dtypes."""
    b, n = query.shape[0], query.shape[1]
    table, kv = kw["block_table"], kw["actual_seq_kvlen"][0]
    parts = []
    for i in range(b):
        k = np.ascontiguousarray(cache[table[i]].reshape(-1, HCKV)[:kv])  # [L, 512] in the cache dtype
        kr = np.ascontiguousarray(kw["key_rope"][table[i]].reshape(-1, D_ROPE)[:kv])  # [L, 64] bf16
        qr = np.ascontiguousarray(kw["query_rope"][i, :, 0])  # [N, 64] bf16
        if c8:
            parts += [product("q@K", np.ascontiguousarray(query[i, :, 0]), k.T), product("qr@Kr", qr, kr.T),
                      product("P@V", np.ones((n, kv), np.int8), k)]
        else:
            q = np.concatenate([query[i, :, 0], qr], axis=1)  # [N, 576] bf16
            parts += [product("q@K", q, np.concatenate([k, kr], axis=1).T),
                      product("P@V", np.ones((n, kv), BF16), k)]
    return MachineFloor(parts)


def torch_call(query, cache, kw, c8):
    import torch

    b = query.shape[0]
    table = torch.from_numpy(kw["block_table"]).long()
    kv = kw["actual_seq_kvlen"][0]

    def t(x):
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) if x.dtype == BF16 else torch.from_numpy(x)

    q, c, qr, kr = t(query), t(cache), t(kw["query_rope"]), t(kw["key_rope"])
    scale = kw["softmax_scale"]
    if c8:
        qs = torch.from_numpy(kw["dequant_scale_query"])
        ks, vs = float(kw["dequant_scale_key"][0]), float(kw["dequant_scale_value"][0])

    def run():
        outs = []
        for i in range(b):
            k = c[table[i]].reshape(-1, HCKV)[:kv].float()  # [L, 512]
            k_r = kr[table[i]].reshape(-1, D_ROPE)[:kv].float()  # [L, 64]
            qi, qri = q[i, :, 0].float(), qr[i, :, 0].float()  # [N, 512], [N, 64]
            if c8:
                s = (qi @ k.T + qri @ k_r.T) * (qs[i] * ks * scale)
            else:
                s = (qi @ k.T + qri @ k_r.T) * scale
            p = torch.softmax(s, dim=-1).to(torch.bfloat16).float()
            o = p @ k
            outs.append((o * vs if c8 else o).to(torch.bfloat16))
        return outs
    return run


def settle() -> None:
    time.sleep(SETTLE_S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=[f"{b}x{n}x{kv}" for b, n, kv in CASES], help="BxNxL cases")
    ap.add_argument("--c8", action="store_true", help="the int8 C8 decode (query_quant_mode 3)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="threads of OpenBLAS, Numba and torch (default: theirs)")
    a = ap.parse_args()
    threads = run_with_threads(a.threads)
    torch_golden = have_torch()
    print(f"threads: {threads} (Numba uses {numba.get_num_threads()}); {'C8 int8' if a.c8 else 'bf16'} decode")
    rng = np.random.default_rng(0)
    for case in a.cases:
        b, n, kv = (int(x) for x in case.split("x"))
        query, cache, kw = make_inputs(rng, b, n, kv, a.c8)
        machine = machine_floor(query, cache, kw, a.c8)
        fns = [floor_call(query, cache, kw, a.c8), machine, op_call(query, cache, kw)]
        if torch_golden:
            fns.append(torch_call(query, cache, kw, a.c8))
        times = best_times(fns, a.repeat, before=[settle] * len(fns))
        t_floor, t_machine, t_op = times[:3]
        ratio = t_op / t_floor
        line = (f"B={b:3d} N={n:3d} kv={kv:5d}: floor {t_floor * 1e3:8.1f} ms, op {t_op * 1e3:8.1f} ms, "
                f"op/floor {ratio:5.2f} ({'meets' if ratio <= TARGET_FLOOR_RATIO else 'misses'} <= "
                f"{TARGET_FLOOR_RATIO})")
        if torch_golden:
            line += f", golden {times[3] * 1e3:8.1f} ms, golden/op {times[3] / t_op:5.2f}"
        print(line)
        print(f"    {floor_line(machine, t_machine)}; {ratio_line('op', t_op, t_machine)}", flush=True)


if __name__ == "__main__":
    main()
