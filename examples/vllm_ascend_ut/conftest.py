# The one line a vllm-ascend / sglang test tree needs to run its unit tests against the emulated
# torch_npu (real op semantics on the CPU) instead of a MagicMock torch_npu:
pytest_plugins = ["ascend_emu.pytest_plugin"]
