"""Behaviour shared by every op contract: backend selection, format cast, where warnings point."""

import warnings

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import ops
from ascend_emu.errors import DuplicateSlotWarning, FormatError, ModeError
from ascend_emu.layouts import FRACTAL_NZ, ND, NZArray
from ascend_emu.ops._check import check_float, check_nz_weight

BF16 = ml_dtypes.bfloat16


def _kv_inputs(rng, index):
    b = len(index)
    kv = rng.random((b, 1, 1, 576), dtype=np.float32).astype(BF16)  # [B, 1, S, 576]
    gamma = rng.random(512, dtype=np.float32).astype(BF16)  # [512]
    cos = rng.random((b, 1, 1, 64), dtype=np.float32).astype(BF16)  # [B, 1, S, 64]
    sin = rng.random((b, 1, 1, 64), dtype=np.float32).astype(BF16)
    k_cache = np.zeros((4, 16, 1, 64), BF16)  # [block_num, block_size, 1, 64]
    ckv_cache = np.zeros((4, 16, 1, 512), BF16)  # [block_num, block_size, 1, 512]
    return kv, gamma, cos, sin, np.asarray(index, np.int64), k_cache, ckv_cache


def test_duplicate_slot_warning_points_at_the_callers_line(rng):
    args = _kv_inputs(rng, [3, 3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops.npu_kv_rmsnorm_rope_cache(*args, cache_mode="PA")
    dup = [w for w in caught if issubclass(w.category, DuplicateSlotWarning)]
    assert len(dup) == 1
    assert dup[0].filename == __file__
    assert "slot 3 <- tokens [0, 1]" in str(dup[0].message)


def test_duplicate_slot_warning_through_the_torch_drop_in_points_at_the_script(rng):
    torch = pytest.importorskip("torch")
    from ascend_emu import torch_npu
    from ascend_emu.torch_npu._convert import to_torch

    args = [to_torch(a) for a in _kv_inputs(rng, [5, 5])]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch_npu.npu_kv_rmsnorm_rope_cache(*args, cache_mode="PA")
    dup = [w for w in caught if issubclass(w.category, DuplicateSlotWarning)]
    assert len(dup) == 1 and dup[0].filename == __file__
    assert isinstance(args[5], torch.Tensor)


def test_format_cast_round_trip_and_tagging(rng):
    w = rng.standard_normal((48, 40), dtype=np.float32).astype(BF16)
    nz = ops.npu_format_cast(w, 29)
    assert isinstance(nz, NZArray) and ops.get_npu_format(nz) == FRACTAL_NZ
    assert np.array_equal(np.asarray(nz).view(np.uint16), w.view(np.uint16))
    before = w.copy()
    nz[0, 0] = 1.5  # a copy: the source is untouched
    assert np.array_equal(w.view(np.uint16), before.view(np.uint16))
    back = ops.npu_format_cast(nz, 2)
    assert type(back) is np.ndarray and ops.get_npu_format(back) == ND
    with pytest.raises(ModeError, match="acl_format"):
        ops.npu_format_cast(w, 3)


def test_nd_weight_error_names_the_fix():
    with pytest.raises(FormatError, match=r"weight_dq = npu_format_cast\(weight_dq, 29\)"):
        check_nz_weight(np.zeros((16, 16), BF16), "weight_dq")


def test_backend_selection(monkeypatch):
    assert ops.backend_name() == "emu"
    with pytest.raises(ModeError, match="backend"):
        ops.set_backend("gpu")
    monkeypatch.setenv("ASCEND_EMU_BACKEND", "nope")
    with pytest.raises(ModeError, match="ASCEND_EMU_BACKEND"):
        ops.backend_name()


def test_check_float_takes_exactly_the_values_finite_in_fp32():
    """The fp32 finiteness test is a float64 comparison: each value around the rounding threshold
    (the midpoint between fp32's largest value and 2**128) is taken exactly when NumPy's fp32
    cast of it is finite; NaN, inf, negatives under ``nonnegative`` and non-numbers are refused."""
    from ascend_emu.errors import DTypeError

    top = float(np.finfo(np.float32).max)
    edge = 2.0**128 - 2.0**103
    values = [0.0, -0.0, 1e-6, top, -top, edge, -edge, np.nextafter(edge, 0), np.nextafter(edge, np.inf),
              np.nextafter(-edge, 0), 1e39, -1e40, 2**200, np.float16(3), np.int64(5), float("nan"), float("inf")]
    for v in values:
        with np.errstate(over="ignore", invalid="ignore"):
            finite = bool(np.isfinite(np.float32(float(v))))
        if finite:
            assert check_float(v, "eps") == float(v)
        else:
            with pytest.raises(DTypeError, match="^eps: expected a float finite in fp32"):
                check_float(v, "eps")
    for bad in (True, "1.0", None, 10**400):
        with pytest.raises(DTypeError, match="^eps: expected"):
            check_float(bad, "eps")
    with pytest.raises(DTypeError, match=">= 0"):
        check_float(-1e-6, "eps", nonnegative=True)
