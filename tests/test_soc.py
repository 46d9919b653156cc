"""The emulated SoC (ascend_emu.soc): one setting read by the drop-in and by ascend_emu.ops."""

from __future__ import annotations

import pytest

from ascend_emu import soc
from ascend_emu.errors import ModeError


@pytest.mark.parametrize("name, family, is950", [
    ("Ascend910B2", "Ascend910B", False), ("Ascend910_9391", "Ascend910_93", False),
    ("Ascend950PR_9599", "Ascend950", True), ("Ascend950DT_9591", "Ascend950", True),
])
def test_soc_name_family_and_950(monkeypatch, name, family, is950):
    monkeypatch.setenv(soc.SOC_NAME_ENV, name)
    assert soc.soc_name() == name and soc.device_family(name) == family and soc.is_ascend950() is is950


def test_default_soc_is_an_a2(monkeypatch):
    monkeypatch.delenv(soc.SOC_NAME_ENV, raising=False)
    assert soc.soc_name() == "Ascend910B2" and not soc.is_ascend950()


def test_settings_read_per_call_see_every_change(monkeypatch):
    from ascend_emu import _env
    from ascend_emu.ops import backend_name

    name = "ASCEND_EMU_TEST_GETENV"
    monkeypatch.delenv(name, raising=False)
    assert _env.getenv(name) is None and _env.getenv(name, "x") == "x"  # the key is now remembered
    monkeypatch.setenv(name, "")
    assert _env.getenv(name, "x") == ""
    monkeypatch.setenv(name, "v")
    assert _env.getenv(name) == "v"
    monkeypatch.delenv(name)
    assert _env.getenv(name, "x") == "x"
    for value in ("Ascend950PR_9599", "Ascend910B2"):  # set and unset between two calls
        monkeypatch.setenv(soc.SOC_NAME_ENV, value)
        assert soc.soc_name() == value
        monkeypatch.delenv(soc.SOC_NAME_ENV)
        assert soc.soc_name() == soc.DEFAULT_SOC_NAME
    monkeypatch.setenv("ASCEND_EMU_BACKEND", "nonexistent")
    with pytest.raises(ModeError, match="ASCEND_EMU_BACKEND"):
        backend_name()
    monkeypatch.delenv("ASCEND_EMU_BACKEND")
    assert backend_name() == "emu"


def test_drop_in_reads_the_same_setting(monkeypatch):
    torch = pytest.importorskip("torch")
    import ascend_emu.torch_npu  # noqa: F401
    from ascend_emu.torch_npu.testing import common_utils

    monkeypatch.setenv("ASCEND_EMU_SOC_NAME", "Ascend950PR_9599")
    assert torch.npu.get_device_name() == "Ascend950PR_9599" and soc.is_ascend950()
    assert common_utils.device_family is soc.device_family


@pytest.mark.parametrize("name", ["Ascend910B2", "Ascend910_9391"])
def test_require_ascend950_rejects_a2_a3_naming_soc_and_mode(monkeypatch, name):
    monkeypatch.setenv(soc.SOC_NAME_ENV, name)
    with pytest.raises(ModeError, match=rf"^dtype: When dtype is 290 \(hifloat8\), not support on this soc "
                                        rf"version {name} \(Ascend 950 only"):
        soc.require_ascend950("dtype", 290, "hifloat8")


def test_require_ascend950_passes_on_950(monkeypatch):
    monkeypatch.setenv(soc.SOC_NAME_ENV, "Ascend950PR_9599")
    soc.require_ascend950("dtype", 290, "hifloat8")
