"""Cost of ``tensor.device`` with the drop-in's property (``ascend_emu.torch_npu._device``):
an unmarked (host) tensor and a tensor on the emulated NPU, against torch's own getter
(``torch._C.TensorBase.device``), and of one ``torch_npu.npu_format_cast`` call with and without
the property installed (the drop-in path reads no ``.device`` of real tensors, so the two should
match within noise).

Figures are the best of ``--rounds`` rounds of ``--calls`` lookups each, the variants taking
turns round after round, in one process. Prints ns per lookup and ratios to torch's getter.

Usage: ``python benchmarks/bench_device.py [--calls 200000] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import timeit

import torch

import ascend_emu.torch_npu as torch_npu
from ascend_emu.torch_npu import _device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    host = torch.zeros(4)
    on_npu = torch.zeros(4, device="npu")
    weight = torch.zeros(64, 64, dtype=torch.bfloat16).npu()
    patched = torch.Tensor.device
    op_calls = max(args.calls // 1000, 50)

    def lookups(t, installed: bool) -> float:
        torch.Tensor.device = patched if installed else _device._TORCH_DEVICE
        try:
            return timeit.timeit("t.device", globals={"t": t}, number=args.calls) / args.calls
        finally:
            torch.Tensor.device = patched

    def op(installed: bool) -> float:
        torch.Tensor.device = patched if installed else _device._TORCH_DEVICE
        try:
            return timeit.timeit(lambda: torch_npu.npu_format_cast(weight, 29), number=op_calls) / op_calls
        finally:
            torch.Tensor.device = patched

    cases = {
        ".device, host tensor, torch's getter": lambda: lookups(host, False),
        ".device, host tensor, property": lambda: lookups(host, True),
        ".device, NPU tensor, property": lambda: lookups(on_npu, True),
        "npu_format_cast call, torch's getter": lambda: op(False),
        "npu_format_cast call, property": lambda: op(True),
    }
    best = {name: float("inf") for name in cases}
    for _ in range(args.rounds):
        for name, run in cases.items():
            best[name] = min(best[name], run())
    base = best[".device, host tensor, torch's getter"]
    for name in list(cases)[:3]:
        print(f"{name:40s} {best[name] * 1e9:8.1f} ns   x{best[name] / base:5.2f}")
    for name in list(cases)[3:]:
        print(f"{name:40s} {best[name] * 1e6:8.1f} us")
    ratio = best["npu_format_cast call, property"] / best["npu_format_cast call, torch's getter"]
    print(f"npu_format_cast call, property / torch's getter: {ratio:.3f}")

if __name__ == "__main__":
    main()
