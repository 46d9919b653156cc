"""The files here are torch_npu test scripts (op-plugin style, ``import torch_npu``): they run
unmodified through ``ascend-emu run`` (tests/test_torch_npu_suite.py), not under pytest."""

collect_ignore_glob = ["test_*.py"]
