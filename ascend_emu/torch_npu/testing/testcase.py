"""``torch_npu.testing.testcase``: ``TestCase`` and ``run_tests`` as op-plugin's tests use them.

Written from the documented behaviour of torch_npu's own (docs/sources.md#assert_rtol_equal):

- :meth:`TestCase.setUp` seeds torch and ``random`` with ``$SEED`` (default 666), as torch_npu's
  does (NumPy is not seeded there either); :meth:`TestCase.setUpClass` selects the device.
- :meth:`TestCase.assertRtolEqual`: both bf16 -> ``torch.allclose(rtol=prec16, atol=prec16)``;
  otherwise the dual criterion: with ``err = |x - y|`` and ``rel = err / (max(|x|, |y|) + m)``
  (``m`` = :data:`MIN_DENOM_FP16` for fp16, :data:`MIN_DENOM` otherwise; ``prec16`` for fp16,
  ``prec`` for the others), the check fails only if more than ``size * prec`` elements exceed
  ``rel > prec`` **and** more than ``size * prec`` exceed ``err > prec``. NaNs must sit at the
  same places. Shapes and dtypes must match (a bf16 tensor against a non-bf16 one is compared
  as fp32: NumPy has no bf16).
- :meth:`TestCase.assertEqual`: tensors / arrays / numbers within ``prec`` (default
  :attr:`TestCase.precision`, 1e-5) in max absolute difference; sequences element by element;
  anything else as ``unittest``.
"""

from __future__ import annotations

import math
import os
import random
import unittest
from numbers import Number
from typing import Sequence

import numpy as np
import torch

from .common_utils import set_npu_device

#: Denominator guards of the relative error.
MIN_DENOM = 1e-9
MIN_DENOM_FP16 = 6e-8
#: Seed when ``$SEED`` is unset.
DEFAULT_SEED = 666


def run_tests() -> None:
    """``unittest.main()`` on the calling script's ``sys.argv``."""
    unittest.main()


def _as_numpy(t) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


class TestCase(unittest.TestCase):
    """op-plugin's test base class for the emulated NPU (see module doc)."""

    _precision = 1e-5
    maxDiff = None
    exact_dtype = False

    @property
    def precision(self) -> float:
        return self._precision

    @precision.setter
    def precision(self, prec: float) -> None:
        self._precision = prec

    @classmethod
    def setUpClass(cls) -> None:
        cls.npu_device = set_npu_device()

    def setUp(self) -> None:
        seed = int(os.getenv("SEED", str(DEFAULT_SEED)))
        torch.manual_seed(seed)
        random.seed(seed)

    # ------------------------------------------------------------------ assertRtolEqual
    def assertRtolEqual(self, x, y, prec=1.e-4, prec16=1.e-3, auto_trans_dtype=False, message=None):
        """Dual-threshold comparison (module doc); sequences are compared pairwise."""
        if isinstance(x, Sequence) and isinstance(y, Sequence) and not isinstance(x, str):
            super().assertEqual(len(x), len(y), message or None)
            for x_, y_ in zip(x, y, strict=True):
                self.assertRtolEqual(x_, y_, prec, prec16, auto_trans_dtype, message)
            return
        if isinstance(x, torch.Tensor) and isinstance(y, Sequence):
            y = torch.as_tensor(y, dtype=x.dtype)
        elif isinstance(y, torch.Tensor) and isinstance(x, Sequence):
            x = torch.as_tensor(x, dtype=y.dtype)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if auto_trans_dtype:
                x = x.to(y.dtype)
            if x.dtype == torch.bfloat16 and y.dtype == torch.bfloat16:
                if x.shape != y.shape:
                    self.fail(message or f"shape error: {tuple(x.shape)} vs {tuple(y.shape)}")
                if not torch.allclose(x.detach().cpu(), y.detach().cpu(), rtol=prec16, atol=prec16):
                    self.fail(message or f"result error: bf16 values differ beyond rtol = atol = {prec16}")
                return
            x, y = _as_numpy(x), _as_numpy(y)
        elif isinstance(x, Number) and isinstance(y, Number):
            x, y = np.array(x), np.array(y)
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape:
            self.fail(message or f"shape error: {x.shape} vs {y.shape}")
        if x.dtype != y.dtype:
            self.fail(message or f"dtype error: {x.dtype} vs {y.dtype}")
        if x.dtype == np.bool_:
            if not np.array_equal(x, y):
                self.fail(message or "result error: bool values differ")
            return
        if x.dtype == np.float16:
            tol, guard = prec16, MIN_DENOM_FP16
        elif x.dtype.kind in "fiu":
            tol, guard = prec, MIN_DENOM
        else:
            self.fail(message or f"dtype error: {x.dtype} is not compared")
        xf, yf = x.astype(np.float64), y.astype(np.float64)
        nan_x, nan_y = np.isnan(xf), np.isnan(yf)
        if not np.array_equal(nan_x, nan_y):
            self.fail(message or "result error: NaNs at different places")
        err = np.abs(yf - xf)
        err[nan_x] = 0.0
        rel = err / (np.maximum(np.abs(xf), np.abs(yf)) + guard)
        bad_abs, bad_rel = int(np.count_nonzero(~(err <= tol))), int(np.count_nonzero(~(rel <= tol)))
        limit = x.size * tol
        if bad_abs > limit and bad_rel > limit:
            self.fail(message or f"result error: {bad_rel} elements beyond relative {tol} and {bad_abs} beyond "
                      f"absolute {tol} (allowed: {limit:g} of {x.size})")

    # ------------------------------------------------------------------ assertEqual
    def assertEqual(self, x, y, prec=None, message="", allow_inf=False, exact_dtype=None):
        """Equal within ``prec`` (module doc)."""
        prec = self.precision if prec is None else prec
        exact_dtype = self.exact_dtype if exact_dtype is None else exact_dtype
        if isinstance(x, np.ndarray) and isinstance(y, (torch.Tensor, np.ndarray)):
            x = torch.from_numpy(x)
        if isinstance(y, np.ndarray) and isinstance(x, torch.Tensor):
            y = torch.from_numpy(y)
        if isinstance(x, torch.Tensor) and isinstance(y, Number) and not isinstance(y, bool):
            return self.assertEqual(x.item(), y, prec, message, allow_inf, exact_dtype)
        if isinstance(y, torch.Tensor) and isinstance(x, Number) and not isinstance(x, bool):
            return self.assertEqual(x, y.item(), prec, message, allow_inf, exact_dtype)
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return self._assert_tensors_close(x, y, prec, message, allow_inf, exact_dtype)
        if isinstance(x, (str, bytes)) or isinstance(y, (str, bytes)):
            return super().assertEqual(x, y, message or None)
        if isinstance(x, Sequence) and isinstance(y, Sequence):
            super().assertEqual(len(x), len(y), message or None)
            for x_, y_ in zip(x, y, strict=True):
                self.assertEqual(x_, y_, prec, message, allow_inf, exact_dtype)
            return None
        if isinstance(x, Number) and isinstance(y, Number) and not isinstance(x, bool) and not isinstance(y, bool):
            if math.isinf(x) or math.isinf(y):
                if not allow_inf:
                    self.fail(message or f"Expected finite numeric values - x={x}, y={y}")
                return super().assertEqual(x, y, message or None)
            return self.assertLessEqual(abs(x - y), prec, message or None)
        return super().assertEqual(x, y, message or None)

    def _assert_tensors_close(self, a, b, prec, message, allow_inf, exact_dtype):
        super().assertEqual(tuple(a.shape), tuple(b.shape), message or None)
        if exact_dtype:
            super().assertEqual(a.dtype, b.dtype, message or None)
        if a.numel() == 0:
            return
        a, b = a.detach().cpu(), b.detach().cpu()
        if (a.dtype == torch.bool) != (b.dtype == torch.bool):
            raise TypeError("Was expecting both tensors to be bool type.")
        if a.dtype == b.dtype and torch.equal(a, b):
            return  # exact (no float64 copies of multi-GB caches)
        a, b = a.reshape(-1), b.reshape(-1)
        worst = 0.0
        for start in range(0, a.numel(), _CHUNK):  # float64 pieces: bounded memory
            x = a[start:start + _CHUNK].to(torch.float64)
            y = b[start:start + _CHUNK].to(torch.float64)
            nan_x = torch.isnan(x)
            self.assertTrue(torch.equal(nan_x, torch.isnan(y)), message or "NaNs at different places")
            diff = (x - y).abs()
            diff[nan_x] = 0
            if allow_inf:
                inf_x = torch.isinf(x)
                self.assertTrue(torch.equal(torch.where(inf_x, x, 0), torch.where(torch.isinf(y), y, 0)),
                                message or "infinities differ")
                diff[inf_x] = 0
            worst = max(worst, diff.max().item())
        self.assertLessEqual(worst, prec, message or None)


#: Elements per float64 piece in :meth:`TestCase.assertEqual` of tensors.
_CHUNK = 1 << 22


__all__ = ["TestCase", "run_tests"]
