"""``torch_npu.testing``: the test helpers op-plugin's operator tests import.

:mod:`.testcase` (``TestCase`` with ``assertRtolEqual`` / ``assertEqual(prec=...)``,
``run_tests``) and :mod:`.common_utils` (``SupportedDevices``, ``create_common_tensor``,
``get_npu_device``) and :mod:`.common_distributed` (``skipIfUnsupportMultiNPU``, ``with_comms``,
``init_pg``, ``TEST_SKIPS``), written from the documented behaviour of torch_npu's own
(docs/sources.md#assert_rtol_equal) for the emulated NPU.
"""

from . import common_distributed, common_utils, testcase  # noqa: F401

__all__ = ["common_distributed", "common_utils", "testcase"]
