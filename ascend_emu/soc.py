"""The emulated SoC: one setting for the drop-in and for :mod:`ascend_emu.ops`.

The SoC is named by the environment variable :data:`SOC_NAME_ENV` (``ASCEND_EMU_SOC_NAME``),
read at every call, default :data:`DEFAULT_SOC_NAME` (``Ascend910B2``, an Atlas A2 800I / 800T
A2 chip). ``torch.npu.get_device_name()`` reports it, op-plugin's test gating
(``SupportedDevices``) reads its :func:`device_family`, and the ops of the Ascend 950 (its
HiFloat8 / FP8 / MX casts and quantizers) run only when it names an Ascend 950
(:func:`is_ascend950`: a name starting with ``Ascend950``, e.g. ``Ascend950PR_9599``); on any
other SoC they are rejected by :func:`require_ascend950`, before anything is written, with
torch_npu's own kind of message (op-plugin: "When weight_quant_mode is 3, not support on this soc
version"), naming the SoC and the mode.

Names: ``Ascend910B1`` .. ``Ascend910B4`` (Atlas A2), ``Ascend910_93xx`` (Atlas A3),
``Ascend950PR_xxxx`` / ``Ascend950DT_xxxx`` (Ascend 950), as ``aclrtGetSocName`` returns them;
op-plugin gates on the family (``Ascend910B``, ``Ascend910_93``, ``Ascend950``; Ascend/pytorch
``torch_npu/testing/common_utils.py``, ``SupportedDevices``).
"""

from __future__ import annotations


from ._env import getenv
from .errors import ModeError

#: Environment variable naming the emulated SoC.
SOC_NAME_ENV = "ASCEND_EMU_SOC_NAME"
#: SoC when :data:`SOC_NAME_ENV` is unset (or empty): an Atlas A2 (800I A2 / 800T A2) chip.
DEFAULT_SOC_NAME = "Ascend910B2"
#: Prefix of every Ascend 950 (PR / DT) SoC name.
ASCEND950_PREFIX = "Ascend950"
#: An Ascend 950 name to set in :data:`SOC_NAME_ENV` (the one error messages suggest).
ASCEND950_EXAMPLE = "Ascend950PR_9599"


def soc_name() -> str:
    """The emulated SoC's name: ``$ASCEND_EMU_SOC_NAME`` or :data:`DEFAULT_SOC_NAME`."""
    return getenv(SOC_NAME_ENV) or DEFAULT_SOC_NAME


def device_family(name: str) -> str:
    """SoC family a test gates on: ``Ascend910B2`` -> ``Ascend910B``, ``Ascend910_9391`` ->
    ``Ascend910_93``, ``Ascend950PR_...`` -> ``Ascend950``; else the first 10 characters."""
    if name.startswith("Ascend910_"):
        return name[:12]
    if name.startswith(ASCEND950_PREFIX):
        return name[:len(ASCEND950_PREFIX)]
    return name[:10]


def is_ascend950(name: str | None = None) -> bool:
    """Whether ``name`` (default: the emulated SoC, :func:`soc_name`) is an Ascend 950."""
    return (soc_name() if name is None else name).startswith(ASCEND950_PREFIX)


def require_ascend950(argument: str, value: object, meaning: str = "") -> None:
    """Reject an Ascend 950 mode on any other SoC (call it before anything is written).

    Args:
        argument: the argument selecting the mode (``"dtype"``, ``"dst_type"``).
        value: its value, shown as given (an int code, a dtype).
        meaning: what the value is, shown after it (``"hifloat8"``).

    Raises:
        ModeError: the emulated SoC is not an Ascend 950: ``"<argument>: When <argument> is
            <value> (<meaning>), not support on this soc version <SoC> (Ascend 950 only: set
            ASCEND_EMU_SOC_NAME=Ascend950PR_9599 to emulate one)"``.
    """
    name = soc_name()
    if not is_ascend950(name):
        what = f"{value!r}" + (f" ({meaning})" if meaning else "")
        raise ModeError(f"{argument}: When {argument} is {what}, not support on this soc version {name} "
                        f"(Ascend 950 only: set {SOC_NAME_ENV}={ASCEND950_EXAMPLE} to emulate one)")


def require_ascend950_op(op: str) -> None:
    """Reject an Ascend 950-only op on another emulated SoC (first, before anything is read).

    Raises:
        ModeError: ``"<op>: an Ascend 950 op (...), not supported on this soc version <SoC>: set
            ASCEND_EMU_SOC_NAME=Ascend950PR_9599 to emulate one"``.
    """
    name = soc_name()
    if not is_ascend950(name):
        raise ModeError(f"{op}: an Ascend 950 op (its kernel is built for ascend950 only), not supported on this "
                        f"soc version {name}: set {SOC_NAME_ENV}={ASCEND950_EXAMPLE} to emulate one")


__all__ = ["ASCEND950_EXAMPLE", "ASCEND950_PREFIX", "DEFAULT_SOC_NAME", "SOC_NAME_ENV", "device_family",
           "is_ascend950", "require_ascend950", "require_ascend950_op", "soc_name"]
