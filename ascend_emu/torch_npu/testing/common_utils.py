"""``torch_npu.testing.common_utils``: device gating and input helpers of op-plugin's tests.

Behaviour as torch_npu documents / uses it: the device string comes from ``SET_NPU_DEVICE``
(``npu:<n>``, default ``npu:0``); :class:`SupportedDevices` skips a test unless the SoC family
(:func:`device_family` of ``torch_npu.npu.get_device_name()``, set with ``ASCEND_EMU_SOC_NAME``)
is listed.
"""

from __future__ import annotations

import functools
import os
import unittest
from typing import Callable, Sequence

import numpy as np
import torch

from ...soc import device_family
from .. import npu


def get_npu_device() -> str:
    """``npu:<SET_NPU_DEVICE>``, default ``npu:0``."""
    index = os.environ.get("SET_NPU_DEVICE")
    return "npu:0" if index is None else f"npu:{index}"


def set_npu_device() -> str:
    """Select :func:`get_npu_device` and return it."""
    device = get_npu_device()
    npu.set_device(device)
    return device


class SupportedDevices:
    """Decorator: run the test only on the listed SoC families (else ``unittest.SkipTest``)."""

    def __init__(self, supported_devices: Sequence[str]) -> None:
        self.supported_devices = list(supported_devices)

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def gated(slf, *args, **kwargs):
            family = device_family(npu.get_device_name(0))
            if family not in self.supported_devices:
                raise unittest.SkipTest(f"Only run on {self.supported_devices!r}, current device is {family}.")
            return fn(slf, *args, **kwargs)

        return gated


def create_common_tensor(item, min_value, max_value, device=None):
    """A random host tensor and its NPU copy.

    Args:
        item: ``[numpy dtype, acl_format, shape]``; ``acl_format`` -1 leaves the NPU copy ND,
            else it is ``npu_format_cast`` to it.
        min_value, max_value: uniform range (``np.random``).
        device: default :func:`get_npu_device`.

    Returns:
        ``(cpu_tensor, npu_tensor)`` with equal values.
    """
    dtype, acl_format, shape = item[0], item[1], item[2]
    values = np.random.uniform(min_value, max_value, shape).astype(dtype)
    cpu_input = torch.from_numpy(values)
    npu_input = torch.from_numpy(values).to(device or get_npu_device())
    if acl_format != -1:
        npu_input = torch.ops.npu.npu_format_cast(npu_input, acl_format)
    return cpu_input, npu_input


__all__ = ["SupportedDevices", "create_common_tensor", "device_family", "get_npu_device", "set_npu_device"]
