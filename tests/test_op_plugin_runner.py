"""scripts/run_op_plugin_tests.py: runs op-plugin-style unittest files under ``ascend-emu run``
with ``unittest.skip`` neutralised and reports per test. Checked on a test file written here in
op-plugin's style (nothing of op-plugin is in the repository); with ``ASCEND_EMU_OP_PLUGIN`` set
to an op-plugin checkout, one small upstream file is run as well, else that test is skipped."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_op_plugin_tests", ROOT / "scripts" / "run_op_plugin_tests.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)

_STYLE_FILE = r'''
import unittest
import torch
import torch_npu
from torch_npu.testing.testcase import TestCase, run_tests


class TestDeviceIdioms(TestCase):
    @unittest.skip("skip test")  # op-plugin's CI skip: neutralised by the runner
    def test_result_on_the_npu(self):
        x = torch.arange(12.0).reshape(3, 4)
        torch.testing.assert_close(x.npu() + 1, (x + 1).npu())

    def test_forgotten_npu_raises(self):
        with self.assertRaisesRegex(RuntimeError, "same device"):
            torch_npu.npu_dynamic_quant(torch.ones(2, 32).bfloat16().npu(), smooth_scales=torch.ones(32).bfloat16())

    def test_golden_on_the_host_fails(self):
        x = torch.arange(4.0)
        torch.testing.assert_close(x.npu() + 1, x + 1)

    @unittest.skipIf(True, "a condition of the file")
    def test_conditional_skip_stays(self):
        raise AssertionError("must not run")


if __name__ == "__main__":
    run_tests()
'''


def test_runner_neutralises_skip_and_reports_each_test(tmp_path):
    (tmp_path / "test" / "sub").mkdir(parents=True)
    (tmp_path / "test" / "sub" / "test_style.py").write_text(_STYLE_FILE)
    result = runner.run_file(tmp_path, "test/sub/test_style.py", "Ascend910B2", timeout=300)
    outcomes = {name.rsplit(".", 1)[-1]: outcome for name, (outcome, _) in result["tests"].items()}
    assert outcomes == {"test_result_on_the_npu": "passed", "test_forgotten_npu_raises": "passed",
                        "test_golden_on_the_host_fails": "failed", "test_conditional_skip_stays": "skipped"}
    reason = next(r for n, (o, r) in result["tests"].items() if o == "failed")
    assert "device" in reason
    assert runner.summary(result) == ("2 passed, 1 failed, 0 errors, 1 skipped", False)
    assert runner.run_file(tmp_path, "test/sub/test_absent.py", "Ascend910B2", timeout=60) == {"missing": True}
    assert runner.main(["--checkout", str(tmp_path / "nowhere")]) == 2


@pytest.mark.skipif(not os.environ.get("ASCEND_EMU_OP_PLUGIN"),
                    reason="ASCEND_EMU_OP_PLUGIN (a local op-plugin checkout) not set; nothing of op-plugin is vendored")
def test_upstream_dynamic_quant_file_passes():
    checkout = Path(os.environ["ASCEND_EMU_OP_PLUGIN"])
    result = runner.run_file(checkout, "test/test_custom_ops/test_npu_dynamic_quant.py", "Ascend910B2", timeout=600)
    line, ok = runner.summary(result)
    assert ok and "0 failed, 0 errors" in line, (line, result)
