"""A synthetic msprobe ``task: "tensor"`` dump of an N-layer decode step, with chosen calls corrupted.

The layout is msprobe's (docs/sources.md#msprobe_dump): ``ROOT/step{S}/rank{R}/dump.json`` and
``dump_tensor_data/{key}.{input|kwargs|output}.{i}.pt``, keys ``NPU.{api}.{n}.forward`` with
``n`` counting the API's calls within the step. Each layer calls ``npu_kv_rmsnorm_rope_cache``
(PA mode, ``is_output_kv=False``: its two extra outputs hold random bytes, as the device's
uninitialised memory does) and ``npu_lightning_indexer`` on tiny shapes, plus one ``Torch.matmul``
entry that replay skips. Outputs are the drop-in's (``ascend_emu.torch_npu``), so an uncorrupted
dump replays identical; a corrupted call has one element of its first compared output moved
(caches: one written row; indexer: one index).

With ``prolog=True`` each layer also calls ``npu_mla_prolog_v3`` first (He = 7168, Hcq = 1536,
N = 1, two tokens; its FRACTAL_NZ weights recorded as msprobe records them: a ``data_name``
without a file, null statistics) and ``npu_sparse_flash_attention`` last, and step 0 of each
rank starts with the ``npu_format_cast(w, 29)`` calls that made those weights (the model
loading; their ND inputs saved, their NZ outputs not): one weight set shared by every layer, or
one per layer (``distinct_weights``, cast in layer order; 30 MB of weights per layer).

    python -m tests.synthetic_msprobe DIR [--layers 61] [--steps 2] [--ranks 2] [--corrupt S:R:L:OP ...]
        [--prolog [--distinct-weights]]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KV_OP, LI_OP = "npu_kv_rmsnorm_rope_cache", "npu_lightning_indexer"
PROLOG_OP, SFA_OP, CAST_OP = "npu_mla_prolog_v3", "npu_sparse_flash_attention", "npu_format_cast"
#: The ops of one layer, in call order (with ``prolog=True``: :data:`PROLOG_LAYER_OPS`).
LAYER_OPS = (KV_OP, LI_OP)
PROLOG_LAYER_OPS = (PROLOG_OP, KV_OP, LI_OP, SFA_OP)
#: The prolog's FRACTAL_NZ weights, in the order the model casts them.
NZ_WEIGHTS = ("weight_dq", "weight_uq_qr", "weight_dkv_kr")


class NZ:
    """A FRACTAL_NZ tensor: msprobe records its dtype and shape, a ``data_name`` whose file it
    does not write, and null statistics (docs/sources.md#msprobe_dump)."""

    def __init__(self, tensor):
        self.tensor = tensor


def _node(torch, v, name, data_dir: Path):
    if isinstance(v, NZ):
        return {"type": "torch.Tensor", "dtype": str(v.tensor.dtype), "shape": list(v.tensor.shape), "Max": None,
                "Min": None, "Mean": None, "Norm": None, "requires_grad": False, "data_name": name}
    if isinstance(v, torch.Tensor):
        torch.save(v.clone(), data_dir / name)
        f = v.float()
        is_float = v.dtype.is_floating_point
        if not v.numel():
            return {"type": "torch.Tensor", "dtype": str(v.dtype), "shape": list(v.shape), "Max": None, "Min": None,
                    "Mean": None, "Norm": None, "requires_grad": False, "data_name": name}
        return {"type": "torch.Tensor", "dtype": str(v.dtype), "shape": list(v.shape),
                "Max": f.max().item(), "Min": f.min().item(), "Mean": f.mean().item() if is_float else None,
                "Norm": f.norm().item() if is_float else None, "requires_grad": False, "data_name": name}
    if v is None:
        return None
    return {"type": type(v).__name__, "value": v}


def prolog_weights(torch, seed: int, rank: int, layer: int) -> dict:
    """The ND values of one layer's prolog weights (``weight_dq`` [7168, 1536], ``weight_uq_qr``
    [1536, 192], ``weight_dkv_kr`` [7168, 576], ``weight_uk`` [1, 128, 512], bf16), the same for
    every step."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * rank + 104_729 * (layer + 1))
    he, hcq, hckv, n, d, dr = 7168, 1536, 512, 1, 128, 64

    def r(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    return {"weight_dq": r(he, hcq, scale=he ** -0.5), "weight_uq_qr": r(hcq, n * (d + dr), scale=hcq ** -0.5),
            "weight_dkv_kr": r(he, hckv + dr, scale=he ** -0.5), "weight_uk": r(n, d, hckv, scale=d ** -0.5)}


def _prolog_call(torch, tnpu, g, weights):
    b, s, he, hcq, hckv, dr, blocks, block_size = 2, 1, 7168, 1536, 512, 64, 2, 16

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    x = r(b, s, he)
    gamma_cq, gamma_ckv = r(hcq, scale=0.1) + 1, r(hckv, scale=0.1) + 1
    sin, cos = r(b, s, dr), r(b, s, dr)
    kv_cache, kr_cache = r(blocks, block_size, 1, hckv), r(blocks, block_size, 1, dr)
    index = torch.randperm(blocks * block_size, generator=g)[:b * s].reshape(b, s).to(torch.int64)
    w = weights
    args = [x, NZ(w["weight_dq"]), NZ(w["weight_uq_qr"]), w["weight_uk"], NZ(w["weight_dkv_kr"]), gamma_cq,
            gamma_ckv, sin, cos, kv_cache.clone(), kr_cache.clone()]
    kwargs = {"cache_index": index, "cache_mode": "PA_BSND"}
    outs = [o.clone() for o in tnpu.npu_mla_prolog_v3(
        x, *(tnpu.npu_format_cast(w[n], 29) for n in ("weight_dq", "weight_uq_qr")), w["weight_uk"],
        tnpu.npu_format_cast(w["weight_dkv_kr"], 29), gamma_cq, gamma_ckv, sin, cos, kv_cache, kr_cache, **kwargs)]

    def corrupt():  # one element of query 256 bf16 ulps up (two binades)
        outs[0].view(torch.int16).view(-1)[5] += 256

    return args, kwargs, outs, corrupt


def _sfa_call(torch, tnpu, g):
    b, s1, n1, dn, dr, block_size, blocks, sbs, topk = 2, 1, 16, 512, 64, 16, 6, 2, 8
    act_kv = [30, 17]
    query = torch.randn(b, s1, n1, dn, generator=g).to(torch.bfloat16)
    query_rope = torch.randn(b, s1, n1, dr, generator=g).to(torch.bfloat16)
    key = torch.randn(blocks, block_size, 1, dn, generator=g).to(torch.bfloat16)
    key_rope = torch.randn(blocks, block_size, 1, dr, generator=g).to(torch.bfloat16)
    block_table = torch.randperm(blocks, generator=g).to(torch.int32)[:b * 2].view(b, 2)
    indices = torch.full((b, s1, 1, topk), -1, dtype=torch.int32)
    for i in range(b):
        n_blocks = (act_kv[i] + sbs - 1) // sbs
        indices[i, 0, 0, :topk] = torch.randperm(n_blocks, generator=g)[:topk].to(torch.int32)
    kwargs = {"block_table": block_table, "actual_seq_lengths_query": torch.ones(b, dtype=torch.int32),
              "actual_seq_lengths_kv": torch.tensor(act_kv, dtype=torch.int32), "query_rope": query_rope,
              "key_rope": key_rope, "sparse_block_size": sbs, "layout_query": "BSND", "layout_kv": "PA_BSND",
              "sparse_mode": 3, "attention_mode": 2}
    scale = (dn + dr) ** -0.5
    outs = [o.clone() for o in tnpu.npu_sparse_flash_attention(query, key, key, indices, scale, **kwargs)]

    def corrupt():  # one attention output element 256 bf16 ulps up (two binades)
        outs[0].view(torch.int16).view(-1)[3] += 256

    return [query, key, key, indices, scale], kwargs, outs, corrupt


def _kv_call(torch, tnpu, g):
    b, s = 2, 1
    kv = torch.randn(b, 1, s, 576, generator=g).to(torch.bfloat16)
    gamma = (torch.rand(512, generator=g) + 0.5).to(torch.bfloat16)
    cos = torch.randn(b, 1, s, 64, generator=g).to(torch.bfloat16)
    sin = torch.randn(b, 1, s, 64, generator=g).to(torch.bfloat16)
    index = torch.randperm(32, generator=g)[:b * s].to(torch.int64)
    k_cache = torch.randn(2, 16, 1, 64, generator=g).to(torch.bfloat16)
    ckv_cache = torch.randn(2, 16, 1, 512, generator=g).to(torch.bfloat16)
    args = [kv, gamma, cos, sin, index, k_cache.clone(), ckv_cache.clone()]
    kwargs = {"cache_mode": "PA", "is_output_kv": False}
    k_out, c_out, k_embed, y = tnpu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                                              **kwargs)

    def garbage(t):
        return torch.randint(-2 ** 15, 2 ** 15, t.shape, generator=g, dtype=torch.int16).view(torch.bfloat16)

    outs = [k_out.clone(), c_out.clone(), garbage(k_embed), garbage(y)]

    def corrupt():  # one written element of ckv_cache, one bf16 ulp up
        slot = int(index[0])
        outs[1].view(torch.int16).view(-1, 512)[slot, 7] += 1

    return args, kwargs, outs, corrupt


def _li_call(torch, tnpu, g):
    batch, heads, dim, block_size, blocks = 2, 64, 128, 16, 4
    kv_lens = torch.tensor([20, 9], dtype=torch.int32)
    block_table = torch.randperm(blocks, generator=g).to(torch.int32).view(batch, 2)
    key = torch.randn(blocks, block_size, 1, dim, generator=g).to(torch.bfloat16)
    query = torch.randn(batch, 1, heads, dim, generator=g).to(torch.bfloat16)
    weights = (torch.randn(batch, 1, heads, generator=g) * heads ** -0.5).to(torch.bfloat16)
    kwargs = {"actual_seq_lengths_query": torch.ones(batch, dtype=torch.int32), "actual_seq_lengths_key": kv_lens,
              "block_table": block_table, "layout_query": "BSND", "layout_key": "PA_BSND", "sparse_count": 8,
              "sparse_mode": 3, "return_value": True}
    indices, values = tnpu.npu_lightning_indexer(query, key, weights, **kwargs)
    outs = [indices.clone(), values.clone()]

    def corrupt():  # the best token of sequence 0 replaced by another one
        outs[0][0, 0, 0, 0] = (outs[0][0, 0, 0, 0] + 1) % int(kv_lens[0])

    return [query, key, weights], kwargs, outs, corrupt


_MAKERS = {KV_OP: _kv_call, LI_OP: _li_call, SFA_OP: _sfa_call}


def write_dump(root: str | Path, *, layers: int = 61, steps: int = 2, ranks: int = 2,
               corrupt: frozenset | set = frozenset(), seed: int = 0, prolog: bool = False,
               distinct_weights: bool = False) -> list[tuple[int, int, int, str]]:
    """Write the dump under ``root``.

    Args:
        layers, steps, ranks: the decode steps' size.
        corrupt: ``(step, rank, layer, op)`` calls whose device output is altered.
        seed: the generator seed (the same arguments write the same bytes).
        prolog: each layer also calls ``npu_mla_prolog_v3`` and ``npu_sparse_flash_attention``,
            step 0 of each rank starting with the casts of the prolog's weights.
        distinct_weights: one prolog weight set per layer (else one shared by every layer).

    Returns:
        The calls of emulated ops in execution order: ``(step, rank, call index in the rank's
        dump.json, key)``.
    """
    import torch

    import ascend_emu.torch_npu as tnpu

    root = Path(root)
    calls = []
    for step in range(steps):
        for rank in range(ranks):
            g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
            rank_dir = root / f"step{step}" / f"rank{rank}"
            data_dir = rank_dir / "dump_tensor_data"
            data_dir.mkdir(parents=True)
            data = {}
            weights = [prolog_weights(torch, seed, rank, layer if distinct_weights else 0)
                       for layer in range(layers if distinct_weights else 1)] if prolog else []
            if step == 0:  # the model loading: every NZ weight cast once, in layer order
                for n, w in enumerate(x[name] for x in weights for name in NZ_WEIGHTS):
                    key = f"NPU.{CAST_OP}.{n}.forward"
                    data[key] = {"input_args": [_node(torch, w, f"{key}.input.0.pt", data_dir),
                                                _node(torch, 29, "", data_dir)], "input_kwargs": {},
                                 "output": [_node(torch, NZ(w), f"{key}.output.0.pt", data_dir)]}
            for layer in range(layers):
                for op in (PROLOG_LAYER_OPS if prolog else LAYER_OPS):
                    if op == PROLOG_OP:
                        args, kwargs, outs, spoil = _prolog_call(torch, tnpu, g, weights[layer % len(weights)])
                    else:
                        args, kwargs, outs, spoil = _MAKERS[op](torch, tnpu, g)
                    if (step, rank, layer, op) in corrupt:
                        spoil()
                    key = f"NPU.{op}.{layer}.forward"
                    calls.append((step, rank, len(data), key))
                    data[key] = {
                        "input_args": [_node(torch, v, f"{key}.input.{i}.pt", data_dir) for i, v in enumerate(args)],
                        "input_kwargs": {k: _node(torch, v, f"{key}.kwargs.{k}.pt", data_dir)
                                         for k, v in kwargs.items()},
                        "output": [_node(torch, v, f"{key}.output.{i}.pt", data_dir) for i, v in enumerate(outs)]}
                x = torch.randn(2, 2, generator=g)
                key = f"Torch.matmul.{layer}.forward"
                data[key] = {"input_args": [_node(torch, x, f"{key}.input.0.pt", data_dir)], "input_kwargs": {},
                             "output": [_node(torch, x @ x, f"{key}.output.0.pt", data_dir)]}
            (rank_dir / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "framework": "pytorch",
                                                            "dump_data_dir": str(data_dir), "data": data}))
    return calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--corrupt", nargs="*", default=[], metavar="S:R:L:OP")
    p.add_argument("--prolog", action="store_true", help="add npu_mla_prolog_v3 and npu_sparse_flash_attention")
    p.add_argument("--distinct-weights", action="store_true", help="one prolog weight set per layer")
    ns = p.parse_args(argv)
    bad = set()
    for c in ns.corrupt:
        s, r, layer, op = c.split(":")
        bad.add((int(s), int(r), int(layer), op))
    calls = write_dump(ns.root, layers=ns.layers, steps=ns.steps, ranks=ns.ranks, corrupt=bad, prolog=ns.prolog,
                       distinct_weights=ns.distinct_weights)
    print(f"wrote {len(calls)} emulated calls under {ns.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
