"""``torch_npu.testing``: the test helpers op-plugin's operator tests import.

:mod:`.testcase` (``TestCase`` with ``assertRtolEqual`` / ``assertEqual(prec=...)``,
``run_tests``) and :mod:`.common_utils` (``SupportedDevices``, ``create_common_tensor``,
``get_npu_device``), written from the documented behaviour of torch_npu's own
(docs/sources.md#assert_rtol_equal) for the emulated NPU.
"""

from . import common_utils, testcase  # noqa: F401

__all__ = ["common_utils", "testcase"]
