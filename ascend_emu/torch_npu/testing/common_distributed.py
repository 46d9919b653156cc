"""``torch_npu.testing.common_distributed``: the multi-device gates of torch_npu's distributed tests.

Written from the behaviour of torch_npu 2.14's module of the same name for the emulated NPU, which
has :data:`~ascend_emu.torch_npu.npu.DEVICE_COUNT` (one) device and no HCCL:

- :func:`skipIfUnsupportMultiNPU` skips a test (``unittest.SkipTest``) unless that many NPUs
  exist, so a test needing 2 or more is skipped here, as on a one-card machine;
- :func:`with_comms` runs the test inside a process group of ``self.world_size`` ranks
  (``self.rank``, ``self.file_name``), on ``gloo`` unless the NPUs suffice for ``hccl``;
- :func:`init_pg` creates that group; ``hccl`` has too few devices (``RuntimeError`` with
  torch_npu's message, :data:`TEST_SKIPS`) or, with enough, is not emulated: the test is
  skipped with the ``"hccl"`` entry's message.
"""

from __future__ import annotations

import functools
import unittest
from collections import namedtuple

import torch

#: ``(exit_code, message)`` of a skipped distributed test.
TestSkip = namedtuple("TestSkip", "exit_code, message")
#: torch_npu's skip reasons: ``multi-npu[-N]`` (exit code 75), ``hccl`` (76), ``known_issues`` (77).
TEST_SKIPS = {
    "multi-npu": TestSkip(75, "Multi-NPU condition not satisfied"),
    **{f"multi-npu-{n}": TestSkip(75, f"Need at least {n} ASCEND devices") for n in range(1, 9)},
    "hccl": TestSkip(76, "c10d not compiled with HCCL support"),
    "known_issues": TestSkip(77, "Test skipped due to known issues"),
}
#: Process-group backends :func:`init_pg` accepts.
BACKENDS = ("hccl", "gloo")


def skipIfUnsupportMultiNPU(npu_number_needed: int):  # noqa: N802  (torch_npu's name)
    """Decorator: skip the test method unless ``npu_number_needed`` NPUs are available."""
    def skip_dec(func):
        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            if not torch.npu.is_available() or torch.npu.device_count() < npu_number_needed:
                raise unittest.SkipTest(f"Multi-NPU {npu_number_needed} condition not satisfied")
            return func(self, *args, **kwargs)
        return wrapper
    return skip_dec


def _device_type(world_size: int) -> str:
    return "npu" if torch.npu.is_available() and torch.npu.device_count() >= world_size else "cpu"


def with_comms(func):
    """Decorator of a test method of a multi-process test case (``world_size``, ``rank``,
    ``file_name``, ``destroy_pg``): run it in a fresh process group, seeded with 0.

    Raises:
        RuntimeError: ``func`` is None.
    """
    if func is None:
        raise RuntimeError("Test function is None.")

    @functools.wraps(func)
    def wrapper(self, *args, **kwargs) -> None:
        backend = "hccl" if _device_type(self.world_size) == "npu" else "gloo"
        init_pg(backend=backend, world_size=self.world_size, rank=self.rank, file_name=self.file_name)
        torch.npu.manual_seed(0)
        func(self, *args, **kwargs)
        self.destroy_pg()

    return wrapper


def init_pg(backend: str = "hccl", world_size: int = 1, rank: int = 0, file_name: str = "file://") -> None:
    """Initialise the default process group through the file ``file_name``.

    Raises:
        RuntimeError: ``hccl`` with fewer NPUs than ``world_size`` (torch_npu's message), or a
            backend other than ``hccl`` / ``gloo``.
        unittest.SkipTest: ``hccl`` otherwise (collectives over HCCL are not emulated).
    """
    if backend == "hccl" and torch.npu.device_count() < world_size:
        raise RuntimeError(TEST_SKIPS[f"multi-npu-{world_size}"].message)
    if backend not in BACKENDS:
        raise RuntimeError(f"Backend {backend} not supported!")
    if backend == "hccl":
        raise unittest.SkipTest(TEST_SKIPS["hccl"].message)
    torch.distributed.init_process_group(backend=backend, world_size=world_size, rank=rank,
                                         init_method=f"file://{file_name}")


__all__ = ["BACKENDS", "TEST_SKIPS", "TestSkip", "init_pg", "skipIfUnsupportMultiNPU", "with_comms"]
