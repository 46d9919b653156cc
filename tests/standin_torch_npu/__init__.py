"""Helpers for tests that use the stand-in ``torch_npu`` (the package in this directory)."""

from __future__ import annotations

import contextlib
import importlib
import pathlib
import sys

DIR = pathlib.Path(__file__).resolve().parent


@contextlib.contextmanager
def standin(fault: str = ""):
    """Make ``import torch_npu`` give the stand-in (with ``fault``) inside the block; restore after."""
    names = [k for k in sys.modules if k == "torch_npu" or k.startswith("torch_npu.")]
    saved = {k: sys.modules.pop(k) for k in names}
    sys.path.insert(0, str(DIR))
    try:
        mod = importlib.import_module("torch_npu")
        assert getattr(mod, "STANDIN", False), mod
        mod.FAULT = fault
        yield mod
    finally:
        sys.path.remove(str(DIR))
        for k in [k for k in sys.modules if k == "torch_npu" or k.startswith("torch_npu.")]:
            del sys.modules[k]
        sys.modules.update(saved)
