"""Per-tensor comparison metrics in the vocabulary of Ascend's accuracy tools.

Two sources define the vocabulary (docs/sources.md#msprobe_metrics and
docs/sources.md#assert_rtol_equal):

- msprobe compare (``msprobe/core/compare/algorithm/builtin_algorithm``): Cosine
  ``N.B / (|N| |B|)`` (both norms ~0 -> 1.0, one zero -> NaN), MaxAbsErr ``max|N - B|``, relative
  error ``RE = |(N - B) / B|`` (where B == 0 both sides get +eps of fp32), MaxRelativeErr
  ``max RE``, One Thousandth Err Ratio ``count(RE < 0.001) / size``, Five Thousandths Err Ratio
  ``count(RE < 0.005) / size``.
- torch_npu's ``assertRtolEqual(npu, golden, prec=0.005, prec16=0.005)``, the criterion of the
  official op tests: two bf16 tensors pass when ``allclose(rtol=prec16, atol=prec16)``; any other
  float pair fails only when BOTH ``count(rel > prec) > size * prec`` and
  ``count(err > prec) > size * prec`` (``err = |x - y|``, ``rel = err / (max(|x|, |y|) + 1e-9)``).

Integers and caches are judged by exact equality (bytes; float elements that are NaN on both
sides count as equal, whatever their payload).

Non-finite floats (the -inf scores of masked positions in ``npu_lightning_indexer``'s output,
NaN): a pair NaN on both sides, or the same infinity on both sides, counts as equal and is left
out of msprobe's metrics, which are taken over the pairs finite on both sides (a tensor whose
pairs are all equal gives cosine 1, errors 0 and ratios 1, without NumPy warnings). A pair NaN
on one side only (``nan_mismatch``), or infinite on one side only or with opposite signs
(``inf_mismatch``), fails the tensor whatever the criterion.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import ModeError, arg_error
from ..layouts import CacheLayout
from ..quant import ulp_distance  # noqa: F401  (re-exported: compare.metrics.ulp_distance)
from ..quant.combined import NOPE_BYTE_ORDINALS, NOPE_BYTE_VALUES

#: ``prec`` / ``prec16`` of assertRtolEqual in the official MLA op tests (docs/sources.md#assert_rtol_equal).
RTOL_PREC = 0.005
#: The msprobe error-ratio thresholds (One Thousandth / Five Thousandths Err Ratio).
THOUSANDTH, FIVE_THOUSANDTHS = 0.001, 0.005
#: ulp-distance histogram bins of bf16 tensors: label -> (lo, hi) inclusive.
ULP_BINS = {"0": (0, 0), "1": (1, 1), "2": (2, 2), "3-4": (3, 4), "5-8": (5, 8), "9-16": (9, 16),
            ">16": (17, None)}
#: At most this many mismatching element coordinates are listed per tensor.
MAX_LISTED = 32


@dataclass
class TensorComparison:
    """The comparison of one tensor (an output, or a cache after the call) of one op call.

    Attributes:
        name: argument / output name (``query``, ``kv_cache``, ``out[2]``).
        role: ``output`` or ``cache`` (an input the op updates in place).
        dtype, shape: of the expected (device) tensor.
        status: ``identical`` (bytes equal, NaN-aware), ``pass`` (differs, within the criterion;
            for a cache judged on its written slots only: differs only outside them),
            ``fail`` (outside it, or a dtype / shape mismatch), ``missing`` (one side absent).
        criterion: the rule ``status`` was judged by.
        mismatched: number of differing elements.
        cosine, max_abs_err, max_rel_err, one_thousandth_ratio, five_thousandths_ratio: msprobe's
            metrics over the finite pairs (None for integers / empty tensors).
        max_int_delta: integers: largest |a - b|.
        nan_mismatch: elements NaN on one side only.
        inf_mismatch: elements (NaN on neither side) infinite on one side only, or +inf against -inf.
        ulp_hist: bf16, FP8 and HiF8: ulp distances of the differing elements in the element
            type's own ulps (its representable values in order), binned (:data:`ULP_BINS`).
        mismatches: up to :data:`MAX_LISTED` mismatching locations: outputs ``{"index": [..],
            "expected": x, "actual": y}``; caches in logical coordinates ``{"block", "row", "slot",
            "head", "field", "elements": [...]}`` (one per slot and field).
        note: why a comparison could not be made, if so.
    """

    name: str
    role: str
    dtype: str
    shape: list
    status: str
    criterion: str
    mismatched: int = 0
    size: int = 0
    cosine: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    one_thousandth_ratio: float | None = None
    five_thousandths_ratio: float | None = None
    max_int_delta: int | None = None
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    ulp_hist: dict | None = None
    mismatches: list = field(default_factory=list)
    cache: dict | None = None
    note: str | None = None

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        return asdict(self)


def _dtype_name(dt: np.dtype) -> str:
    return "bfloat16" if dt.name == "bfloat16" else dt.name


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt.name.startswith(("bfloat16", "float8"))


#: Element types whose ulp histogram is kept: bf16 and the Ascend 950's 8-bit floats.
ULP_HIST_TYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "hifloat8")


def _element_ulps(actual: np.ndarray, expected: np.ndarray, element: str) -> np.ndarray:
    """ulp distances in the element type's own ulps: HiF8 / E4M3FN by their place in value order
    (:data:`~ascend_emu.quant.combined.NOPE_BYTE_ORDINALS`; HiF8 bit patterns are not in value
    order), other floats by :func:`ulp_distance`."""
    if element in NOPE_BYTE_ORDINALS:
        order = NOPE_BYTE_ORDINALS[element]
        return np.abs(order[_bits(actual)] - order[_bits(expected)])
    return ulp_distance(actual, expected)


def _bits(a: np.ndarray) -> np.ndarray:
    """Unsigned integer view of the elements' bytes."""
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def msprobe_metrics(actual: np.ndarray, expected: np.ndarray) -> dict:
    """msprobe's Cosine, MaxAbsErr, MaxRelativeErr and error ratios of two fp32 arrays.

    ``expected`` plays msprobe's bench (B), ``actual`` its NPU side (N); both finite (the caller
    leaves non-finite pairs out, :func:`compare_tensor`). Empty inputs give None.
    Source: msprobe ``core/compare/algorithm/builtin_algorithm``, ``core/compare/utils.py::
    get_relative_err`` (docs/sources.md#msprobe_metrics).
    """
    n = actual.astype(np.float64).reshape(-1)
    b = expected.astype(np.float64).reshape(-1)
    if n.size == 0:
        return {"cosine": None, "max_abs_err": None, "max_rel_err": None, "one_thousandth_ratio": None,
                "five_thousandths_ratio": None}
    eps = float(np.finfo(np.float32).eps)
    nn, nb = float(np.linalg.norm(n)), float(np.linalg.norm(b))
    if nn <= eps and nb <= eps:
        cos = 1.0
    elif nn <= eps or nb <= eps:
        cos = float("nan")
    else:
        cos = float(np.dot(n, b) / (nn * nb))
        cos = round(cos, 6) if cos > 0.9999 else cos
    abs_err = np.abs(n - b)
    zero = b == 0
    rel = np.abs(np.where(zero, n + eps, n) - np.where(zero, b + eps, b)) / np.abs(np.where(zero, b + eps, b))
    return {"cosine": cos, "max_abs_err": float(abs_err.max()), "max_rel_err": float(rel.max()),
            "one_thousandth_ratio": float(np.count_nonzero(rel < THOUSANDTH) / rel.size),
            "five_thousandths_ratio": float(np.count_nonzero(rel < FIVE_THOUSANDTHS) / rel.size)}


def rtol_equal(actual: np.ndarray, expected: np.ndarray, prec: float = RTOL_PREC, *, both_bf16: bool) -> bool:
    """torch_npu ``assertRtolEqual``'s verdict (docs/sources.md#assert_rtol_equal) on two float arrays (finite
    pairs; NaN pairs must be removed by the caller).

    Both bf16: ``|a - b| <= prec + prec * |b|`` everywhere (``torch.allclose(rtol=atol=prec16)``).
    Otherwise the dual threshold: fails only if both ``count(rel > prec)`` and
    ``count(err > prec)`` exceed ``size * prec``.
    """
    x = actual.astype(np.float64).reshape(-1)
    y = expected.astype(np.float64).reshape(-1)
    err = np.abs(x - y)
    if both_bf16:
        return bool(np.all(err <= prec + prec * np.abs(y)))
    rel = err / (np.maximum(np.abs(x), np.abs(y)) + 1e-9)
    limit = x.size * prec
    return not (np.count_nonzero(rel > prec) > limit and np.count_nonzero(err > prec) > limit)


def _float_pairs(actual: np.ndarray, expected: np.ndarray):
    """fp32 copies, masks: both-NaN, one-side NaN, infinite-pair mismatch (one side infinite or
    opposite infinities, NaN on neither side), finite on both sides, bitwise different (NaN-aware)."""
    fa = actual.astype(np.float32).reshape(-1)
    fe = expected.astype(np.float32).reshape(-1)
    na, ne = np.isnan(fa), np.isnan(fe)
    both, one = na & ne, na ^ ne
    ia, ie = np.isinf(fa), np.isinf(fe)
    finite = ~(na | ne | ia | ie)
    inf_bad = (ia | ie) & ~(na | ne) & ~(ia & ie & (np.signbit(fa) == np.signbit(fe)))
    differ = (_bits(actual.reshape(-1)) != _bits(expected.reshape(-1))) & ~both
    return fa, fe, both, one, inf_bad, finite, differ


def compare_tensor(name: str, actual, expected, *, role: str = "output",
                   cache_mode: str | CacheLayout | None = None,
                   expect_slots=None, judge_expected_only: bool = False,
                   element: str | None = None) -> TensorComparison:
    """Compare one emulated tensor with the device's (``expected``).

    Args:
        name: what the tensor is (output or argument name).
        actual: the emulator's array (NumPy; bf16 as ``ml_dtypes.bfloat16``), or None.
        expected: the device's array, or None.
        role: ``output`` (judged by :func:`rtol_equal` for floats, exactly for integers) or
            ``cache`` (judged exactly; mismatches listed in logical coordinates when
            ``cache_mode`` is given, through :func:`ascend_emu.inspect.diff`).
        cache_mode: for caches, the :class:`~ascend_emu.layouts.CacheLayout` the op's contract
            describes it with (a read or a written cache alike), or its mode (``PA_NZ``, ...),
            the geometry then read from the array's shape.
        expect_slots: slots the op writes (listed as ``expected`` in the cache diff).
        judge_expected_only: with ``expect_slots`` and ``cache_mode``: only bytes of those slots
            decide the status (the rest is memory the device leaves uninitialised); differences
            elsewhere are counted in ``note``.
        element: ``"hifloat8"``: both arrays are uint8 HiF8 codes (torch_npu carries hifloat8 as
            uint8): compared as floats, decoded exactly, ulps in HiF8's value order. Default:
            the dtype decides.

    Returns:
        A :class:`TensorComparison`.
    """
    if actual is None or expected is None:
        if actual is None and expected is None:
            return TensorComparison(name, role, "none", [], "identical", "both absent")
        present = expected if expected is not None else actual
        return TensorComparison(name, role, _dtype_name(np.asarray(present).dtype), list(np.shape(present)),
                                "missing", "both present",
                                note=f"{'emulator' if actual is None else 'device'} returned nothing")
    actual, expected = np.asarray(actual), np.asarray(expected)
    dt = expected.dtype
    base = dict(name=name, role=role, dtype=_dtype_name(dt), shape=list(expected.shape), size=int(expected.size))
    if actual.dtype != dt or actual.shape != expected.shape:
        return TensorComparison(**base, status="fail", criterion="same dtype and shape",
                                note=f"emulator gave {_dtype_name(actual.dtype)} {list(actual.shape)}")
    if element not in (None, "hifloat8") or (element == "hifloat8" and dt != np.uint8):
        raise arg_error(ModeError, "element", "None, or 'hifloat8' with uint8 arrays",
                        f"{element!r} with {_dtype_name(dt)}")
    out = TensorComparison(**base, status="identical", criterion="")
    kind = element or _dtype_name(dt)
    if element == "hifloat8":
        out.dtype = "hifloat8"
    if _is_float(dt) or element == "hifloat8":
        if element == "hifloat8":  # decoded copies; the codes stay for the bitwise test and the ulps
            fa, fe, both, one, inf_bad, ok, differ = _float_pairs(NOPE_BYTE_VALUES[element][actual],
                                                                  NOPE_BYTE_VALUES[element][expected])
            differ = (actual.reshape(-1) != expected.reshape(-1)) & ~both
        else:
            fa, fe, both, one, inf_bad, ok, differ = _float_pairs(actual, expected)
        out.nan_mismatch, out.inf_mismatch = int(one.sum()), int(inf_bad.sum())
        if ok.any() or not expected.size or out.nan_mismatch or out.inf_mismatch:
            out.__dict__.update(msprobe_metrics(fa[ok], fe[ok]))
        else:  # every pair NaN / the same infinity on both sides: all equal
            out.__dict__.update(cosine=1.0, max_abs_err=0.0, max_rel_err=0.0, one_thousandth_ratio=1.0,
                                five_thousandths_ratio=1.0)
        diff_idx = np.flatnonzero(differ)
        if kind in ULP_HIST_TYPES:
            u = _element_ulps(actual.reshape(-1)[diff_idx], expected.reshape(-1)[diff_idx], kind)
            u = u[~one[diff_idx]]
            out.ulp_hist = {k: int(np.count_nonzero((u >= lo) & ((u <= hi) if hi is not None else True)))
                            for k, (lo, hi) in ULP_BINS.items()}
            out.ulp_hist["nan"] = int(one.sum())
        within = out.nan_mismatch == 0 and out.inf_mismatch == 0 and rtol_equal(fa[ok], fe[ok], both_bf16=dt.name == "bfloat16")
        out.criterion = (f"allclose(rtol=atol={RTOL_PREC}) (both bf16)" if dt.name == "bfloat16"
                         else f"dual threshold prec={RTOL_PREC}")
    else:
        diff_idx = np.flatnonzero(actual.reshape(-1) != expected.reshape(-1))
        if diff_idx.size:
            d = np.abs(actual.reshape(-1)[diff_idx].astype(np.int64) - expected.reshape(-1)[diff_idx].astype(np.int64))
            out.max_int_delta = int(d.max())
        else:
            out.max_int_delta = 0
        within = False
        out.criterion = "exact (integers)"
    if role == "cache":
        within = False
        out.criterion = "exact (cache bytes, NaN-aware)"
    out.mismatched = int(diff_idx.size)
    if diff_idx.size:
        out.status = "pass" if within else "fail"
    if role == "cache" and cache_mode is not None:
        only = judge_expected_only and expect_slots is not None
        d = _cache_mismatches(out, actual, expected, cache_mode, expect_slots, only_expected=only)
        if d is not None and judge_expected_only and expect_slots is not None:
            inside = d.summary["bytes"] - d.summary["outside_expected_bytes"]
            if d.summary["outside_expected_bytes"]:
                out.note = (f"{d.summary['outside_expected_bytes']} byte(s) differ outside the written slots "
                            "(uninitialised on the device; not judged)")
            out.status = "fail" if inside else ("pass" if d.summary["bytes"] else "identical")
    elif diff_idx.size:
        shown_e, shown_a = ((NOPE_BYTE_VALUES[element][expected], NOPE_BYTE_VALUES[element][actual])
                            if element == "hifloat8" else (expected, actual))  # HiF8: values, not codes
        for flat in diff_idx[:MAX_LISTED]:
            idx = [int(i) for i in np.unravel_index(flat, expected.shape)]
            out.mismatches.append({"index": idx, "expected": _scalar(shown_e.reshape(-1)[flat]),
                                   "actual": _scalar(shown_a.reshape(-1)[flat])})
    return out


def _scalar(v) -> float | int:
    return int(v) if np.asarray(v).dtype.kind in "iub" else float(np.float32(v))


def _cache_mismatches(out: TensorComparison, actual, expected, cache_mode, expect_slots, *, only_expected=False):
    """Fill ``out.mismatches`` / ``out.cache`` with :func:`ascend_emu.inspect.diff` in logical
    coordinates (block, row, head, field, elements); returns the diff (None when the cache's
    geometry is not one inspect knows)."""
    from .. import inspect

    try:
        a = inspect.Cache.from_array(np.ascontiguousarray(actual), cache_mode, name=out.name)
        e = inspect.Cache.from_array(np.ascontiguousarray(expected), cache_mode, name=out.name)
    except (ValueError, TypeError) as exc:
        out.note = f"no logical coordinates: {exc}"
        return None
    d = inspect.diff(e, a, expect_slots=expect_slots)
    out.cache = {"spec": d.cache, "summary": d.summary}
    for s in d.slots:
        if only_expected and not s.expected:
            continue
        for f in s.fields:
            count = e.spec.field(f.field).count
            heads = sorted({el // count for el in f.elements})
            for h in heads:
                elems = [el % count for el in f.elements if el // count == h]
                if len(out.mismatches) >= MAX_LISTED:
                    out._diff = d  # noqa: SLF001
                    return d
                out.mismatches.append({"block": s.block, "row": s.row, "slot": s.slot, "head": h, "field": f.field,
                                       "elements": elems, "bytes": f.bytes, "max_ulp": f.max_ulp,
                                       "max_int_delta": f.max_int_delta, "expected_slot": s.expected})
    out._diff = d  # noqa: SLF001  (kept for the heat-map picture, not serialised)
    return d
