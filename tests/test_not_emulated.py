"""An op the emulator does not have: ``torch_npu.<op>``, ``torch.ops.<ns>.<op>`` and
``ascend_emu.ops.<op>`` raise an ``AttributeError`` that says the op is not emulated, where the
emulated ones are listed and how to mock it (never torch's "object has no attribute")."""

from __future__ import annotations

import unittest.mock

import pytest

from ascend_emu import ops


def _message(owner, name) -> str:
    with pytest.raises(AttributeError) as exc:
        getattr(owner, name)
    assert exc.value.name == name
    return str(exc.value)


def test_numpy_api_names_the_missing_op_and_how_to_mock_it():
    msg = _message(ops, "npu_rms_norm")
    assert msg.startswith("ascend_emu.ops.npu_rms_norm is not emulated by ascend_emu; the ")
    assert "listed in ascend_emu.ops.__all__ and docs/ops.md" in msg
    assert "monkeypatch.setattr(ascend_emu.ops, 'npu_rms_norm', fake, raising=False)" in msg
    assert "did you mean 'npu_mla_prolog_v3'?" in _message(ops, "npu_mla_prolog_v4")
    assert not hasattr(ops, "npu_rms_norm") and getattr(ops, "npu_rms_norm", None) is None
    with pytest.raises(AttributeError, match="has no attribute '__wrapped__'"):
        ops.__wrapped__  # dunder lookups keep the plain message  # noqa: B018
    with unittest.mock.patch.object(ops, "npu_rms_norm", create=True) as fake:  # the suggested mock works
        ops.npu_rms_norm(1)
    fake.assert_called_once_with(1)
    assert not hasattr(ops, "npu_rms_norm")


def test_drop_in_and_torch_ops_name_the_missing_op():
    pytest.importorskip("torch")
    import torch

    import ascend_emu.torch_npu as torch_npu

    msg = _message(torch_npu, "npu_rms_norm")
    from ascend_emu.torch_npu.schemas import SCHEMAS

    n_ops = len({spec.name for spec in SCHEMAS if spec.namespace == "npu"})
    assert msg.startswith(f"torch_npu.npu_rms_norm is not emulated by ascend_emu; the {n_ops} emulated ops are "
                          "listed in torch_npu.__all__ and docs/torch_npu.md; to run code that calls it, mock it, "
                          "e.g. monkeypatch.setattr(torch_npu, 'npu_rms_norm', fake, raising=False)"), msg
    assert "no attribute" not in msg
    with pytest.raises(ImportError, match="npu_rms_norm"):
        exec("from ascend_emu.torch_npu import npu_rms_norm", {})
    msg = _message(torch.ops.npu, "npu_rms_norm")
    assert msg.startswith("torch.ops.npu.npu_rms_norm is not emulated by ascend_emu") and "'_OpNamespace'" not in msg
    assert "did you mean 'npu_mla_prolog_v3'?" in _message(torch.ops.npu, "npu_mla_prolog_v4")
    assert "is not emulated by ascend_emu" in _message(torch.ops._C_ascend, "npu_rms_norm")
    assert callable(torch.ops.npu.npu_mla_prolog_v3)  # the registered ops are unchanged
    assert torch.ops.npu.npu_mla_prolog_v3.default is not None
