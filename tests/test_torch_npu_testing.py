"""``torch_npu.testing.common_distributed`` on the emulated NPU (one device, no HCCL): the
multi-device gates skip as on a one-card machine, ``init_pg`` rejects what torch_npu rejects."""

from __future__ import annotations

import sys
import unittest

import pytest

pytest.importorskip("torch")

import ascend_emu.torch_npu  # noqa: E402,F401  (installs torch.npu)
from ascend_emu.torch_npu.testing import common_distributed as cd  # noqa: E402


class _Case(unittest.TestCase):
    __test__ = False  # run by the tests below, not collected
    world_size, rank, file_name = 2, 0, "/nonexistent"

    @cd.skipIfUnsupportMultiNPU(1)
    def test_one(self):
        pass

    @cd.skipIfUnsupportMultiNPU(2)
    def test_two(self):
        raise AssertionError("must be skipped: the emulator has one NPU")

    @cd.with_comms
    def test_comms(self):
        raise AssertionError("must not run: two ranks need two NPUs or a gloo group")


def test_multi_npu_gate_runs_with_one_npu_and_skips_with_two():
    result = unittest.TestResult()
    _Case("test_one").run(result)
    _Case("test_two").run(result)
    assert result.testsRun == 2 and not result.failures and not result.errors
    assert [reason for _, reason in result.skipped] == ["Multi-NPU 2 condition not satisfied"]


def test_init_pg_rejects_as_torch_npu_does():
    with pytest.raises(RuntimeError, match="^Need at least 2 ASCEND devices$"):
        cd.init_pg("hccl", world_size=2)
    with pytest.raises(RuntimeError, match="^Backend nccl not supported!$"):
        cd.init_pg("nccl")
    with pytest.raises(unittest.SkipTest, match="HCCL"):
        cd.init_pg("hccl", world_size=1)
    with pytest.raises(RuntimeError, match="Test function is None"):
        cd.with_comms(None)
    assert cd.TEST_SKIPS["multi-npu-8"] == (75, "Need at least 8 ASCEND devices")


def test_module_resolves_as_torch_npu_testing_common_distributed():
    ascend_emu.torch_npu.install()
    assert sys.modules["torch_npu.testing.common_distributed"] is cd
