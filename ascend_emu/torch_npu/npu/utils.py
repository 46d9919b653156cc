"""``torch_npu.npu.utils``: the device utilities op-plugin's tests import, for the emulated NPU.

The device functions are :mod:`ascend_emu.torch_npu.npu`'s own (one emulated device, index 0);
the CANN version is the one whose output conventions the emulator follows (torch_npu's meta
functions switch on ``_is_gte_cann_version("8.5.0.alpha003")``: empty ``[0]`` placeholders for
outputs a scenario does not produce).
"""

from __future__ import annotations

import re

from . import (current_device, current_stream, default_stream, device_count, get_device_name, is_available,
               set_device, stream, synchronize)

#: CANN version the emulated outputs follow (docs/sources.md#upstream; the ``[0]`` placeholders of v3).
CANN_VERSION = "8.5.0"


def get_cann_version(module: str = "CANN") -> str:
    """The emulated CANN version, :data:`CANN_VERSION`, for any ``module``."""
    return CANN_VERSION


def _parse(version: str) -> tuple:
    """``"8.5.0.alpha003"`` -> ``(8, 5, 0, -1, 3)``: a pre-release sorts before the release."""
    parts = []
    for piece in version.split("."):
        m = re.fullmatch(r"(\d+)|(alpha|beta|rc|RC)(\d*)", piece)
        if m is None:
            raise ValueError(f"version: expected dotted numbers (e.g. 8.5.0.alpha003), got {version!r}")
        parts += [int(m.group(1))] if m.group(1) else [-1, int(m.group(3) or 0)]
    return tuple(parts)


def _is_gte_cann_version(version: str, module: str = "CANN") -> bool:
    """Whether the emulated CANN version is at least ``version``."""
    have, want = _parse(get_cann_version(module)), _parse(version)
    width = max(len(have), len(want))  # 8.5.0 is 8.5.0.0.0: after 8.5.0.alpha003 (8.5.0.-1.3)
    return have + (0,) * (width - len(have)) >= want + (0,) * (width - len(want))


def is_bf16_supported(including_emulation: bool = False) -> bool:
    """True (the emulated Atlas A2 / A3 support bf16)."""
    return True


def is_support_inf_nan() -> bool:
    """True."""
    return True


__all__ = ["CANN_VERSION", "current_device", "current_stream", "default_stream", "device_count", "get_cann_version",
           "get_device_name", "is_available", "is_bf16_supported", "is_support_inf_nan", "set_device", "stream",
           "synchronize"]
