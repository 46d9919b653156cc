"""A synthetic msprobe ``task: "tensor"`` dump of an N-layer decode step, with chosen calls corrupted.

The layout is msprobe's (research notes msprobe.md §2): ``ROOT/step{S}/rank{R}/dump.json`` and
``dump_tensor_data/{key}.{input|kwargs|output}.{i}.pt``, keys ``NPU.{api}.{n}.forward`` with
``n`` counting the API's calls within the step. Each layer calls ``npu_kv_rmsnorm_rope_cache``
(PA mode, ``is_output_kv=False``: its two extra outputs hold random bytes, as the device's
uninitialised memory does) and ``npu_lightning_indexer`` on tiny shapes, plus one ``Torch.matmul``
entry that replay skips. Outputs are the drop-in's (``ascend_emu.torch_npu``), so an uncorrupted
dump replays identical; a corrupted call has one element of its first compared output moved
(caches: one written row; indexer: one index).

    python -m tests.synthetic_msprobe DIR [--layers 61] [--steps 2] [--ranks 2] [--corrupt S:R:L:OP ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KV_OP, LI_OP = "npu_kv_rmsnorm_rope_cache", "npu_lightning_indexer"
#: The ops of one layer, in call order.
LAYER_OPS = (KV_OP, LI_OP)


def _node(torch, v, name, data_dir: Path):
    if isinstance(v, torch.Tensor):
        torch.save(v.clone(), data_dir / name)
        f = v.float()
        is_float = v.dtype.is_floating_point
        return {"type": "torch.Tensor", "dtype": str(v.dtype), "shape": list(v.shape),
                "Max": f.max().item(), "Min": f.min().item(), "Mean": f.mean().item() if is_float else None,
                "Norm": f.norm().item() if is_float else None, "requires_grad": False, "data_name": name}
    if v is None:
        return None
    return {"type": type(v).__name__, "value": v}


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


_MAKERS = {KV_OP: _kv_call, LI_OP: _li_call}


def write_dump(root: str | Path, *, layers: int = 61, steps: int = 2, ranks: int = 2,
               corrupt: frozenset | set = frozenset(), seed: int = 0) -> list[tuple[int, int, int, str]]:
    """Write the dump under ``root``.

    Args:
        layers, steps, ranks: the decode steps' size.
        corrupt: ``(step, rank, layer, op)`` calls whose device output is altered.
        seed: the generator seed (the same arguments write the same bytes).

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
            for layer in range(layers):
                for op in LAYER_OPS:
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
    ns = p.parse_args(argv)
    bad = set()
    for c in ns.corrupt:
        s, r, layer, op = c.split(":")
        bad.add((int(s), int(r), int(layer), op))
    calls = write_dump(ns.root, layers=ns.layers, steps=ns.steps, ranks=ns.ranks, corrupt=bad)
    print(f"wrote {len(calls)} emulated calls under {ns.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
