"""Cache files: save a cache with its layout metadata; load it, or a bare dump made on hardware.

File format written by :func:`save_cache` (``.npz``, read with ``numpy.load``):

- ``data``: uint8 ``[nbytes]``, the cache's memory from its first byte (bf16 and every other
  dtype stored as raw little-endian bytes, so no reader needs ml_dtypes).
- ``meta``: a 0-d unicode array holding one JSON object: ``format`` (``"ascend_emu.cache"``),
  ``version`` (1), ``cache_mode``, ``shape`` (as the cache was given: declared or NZ storage),
  ``dtype`` (``bfloat16`` / ``float16`` / ``float32`` / ``int8``), ``num_blocks``,
  ``block_size``, ``heads``, ``dim``, ``storage_shape`` and ``row_format`` (``null``, or
  ``{"d_nope", "d_rope", "tile_size", "row_bytes"}`` for 656-byte combined rows).

Bare dumps (:func:`load_cache`): ``torch.save(kv_cache.cpu(), "kv.pt")`` (read with
``torch.load(map_location="cpu", weights_only=True)``; needs torch), ``numpy.save`` ``.npy``, or a
raw ``.bin`` (``tensor.numpy().tofile``) with the shape and dtype given. Their cache mode must be
given; the shape may be the declared or the NZ storage shape.
"""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

import numpy as np

from ..errors import DTypeError, FormatError, ShapeError, arg_error
from ..install_hints import TORCH_HINT
from ..quant import CombinedRowFormat
from .cache import CACHE_DTYPES, Cache, CacheSpec, dtype_name, resolve_dtype

#: ``meta["format"]`` of files written by :func:`save_cache`.
FILE_FORMAT = "ascend_emu.cache"
#: ``meta["version"]`` written; files of a higher version are refused.
FILE_VERSION = 1


def save_cache(path: str | os.PathLike, cache: Cache) -> str:
    """Write ``cache`` and its layout metadata to an ``.npz`` file (format in the module doc).

    Args:
        path: destination; ``.npz`` is appended when missing (as ``numpy.savez`` does).
        cache: the cache (e.g. ``Cache.from_array(kv_cache, "PA_NZ")``).

    Returns:
        The path written.
    """
    meta = {"format": FILE_FORMAT, "version": FILE_VERSION, "shape": list(cache.shape), **cache.spec.describe()}
    meta.setdefault("row_format", None)
    path = os.fspath(path)
    if not path.endswith(".npz"):
        path += ".npz"
    np.savez_compressed(path, data=np.asarray(cache.raw), meta=np.array(json.dumps(meta)))
    return path


def load_cache(path: str | os.PathLike, *, cache_mode: str | None = None, shape: Sequence[int] | None = None,
               dtype=None, combined: bool | None = None) -> Cache:
    """Read a cache file.

    Args:
        path: ``.npz`` written by :func:`save_cache` (its metadata is used; arguments given
            must agree with it), or a bare dump: ``.pt`` / ``.pth`` (a tensor saved with
            ``torch.save``), ``.npy``, or ``.bin`` / anything else (raw bytes).
        cache_mode: required for bare dumps.
        shape: required for raw bytes; for ``.pt`` / ``.npy`` it re-reads the array's bytes in
            this shape (e.g. a flat dump).
        dtype: required for raw bytes; for ``.pt`` / ``.npy`` it re-reads the bytes as this dtype
            (e.g. a bf16 cache that was saved as int16).
        combined: see :meth:`CacheSpec.from_shape`.

    Returns:
        A :class:`Cache`.

    Raises:
        FormatError: not a cache file of this format, or metadata disagreeing with the arguments.
        ShapeError / DTypeError / ModeError: a missing or wrong cache mode, shape or dtype (a
            bare dump whose elements are no cache dtype, e.g. the int16 view of a bf16 cache, needs
            ``dtype``), or a byte count that does not match them (the message gives the file's
            bytes and what the shape and dtype come to).
        ModuleNotFoundError: a ``.pt`` file without torch installed (with the install hint).
    """
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npz":
        return _load_npz(path, cache_mode, shape, dtype, combined)
    if cache_mode is None:
        raise arg_error(ShapeError, "cache_mode", f"the cache mode of bare dump {path!r} (--cache-mode)", None)
    if ext in (".pt", ".pth"):
        arr = _load_pt(path)
    elif ext == ".npy":
        arr = np.load(path, allow_pickle=False)
    else:
        if shape is None or dtype is None:
            raise arg_error(ShapeError, "shape/dtype", f"--shape and --dtype for raw bytes {path!r}", (shape, dtype))
        arr = np.fromfile(path, dtype=np.uint8)
    if dtype is None and arr.dtype not in CACHE_DTYPES.values():
        raise arg_error(DTypeError, "dtype", f"a cache dtype ({' / '.join(CACHE_DTYPES)}), or --dtype to re-read "
                        f"the bytes as one", f"{_dtype_text(arr.dtype)} elements in {path!r}; "
                        f"{_dtype_hint(arr.dtype.itemsize)}")
    if dtype is not None or shape is not None:
        dt = resolve_dtype(dtype) if dtype is not None else arr.dtype
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        want = tuple(int(s) for s in shape) if shape is not None else None
        count = raw.size // dt.itemsize
        if raw.size % dt.itemsize or (want is not None and int(np.prod(want)) != count):
            given = (f"shape {list(want)} of {dtype_name(dt)} = {int(np.prod(want)) * dt.itemsize} bytes"
                     if want is not None else f"{dtype_name(dt)} ({dt.itemsize} bytes per element)")
            holds = (f"it holds {count} {dtype_name(dt)} elements" if not raw.size % dt.itemsize
                     else f"not a whole number of {dtype_name(dt)} elements")
            raise arg_error(ShapeError, "shape/dtype", f"a shape and dtype of exactly the {raw.size} bytes "
                            f"in {path!r}", f"{given}; {holds}")
        arr = raw.view(dt).reshape(want if want is not None else arr.shape)
    return Cache.from_array(arr, cache_mode, combined=combined, name=os.path.basename(path))


def _dtype_text(dt: np.dtype) -> str:
    if dt.kind == "V":  # how numpy.save stores ml_dtypes' bfloat16 (no reader knows the type)
        return f"untyped {dt.itemsize}-byte ({dt.str})"
    return dtype_name(dt)


def _dtype_hint(itemsize: int) -> str:
    """Which ``--dtype`` a bare dump of ``itemsize``-byte elements most likely needs."""
    if itemsize == 2:
        return ("a bf16 cache (saved through an int16 view, or by numpy.save as untyped elements) needs "
                "--dtype bfloat16, an fp16 one --dtype float16")
    names = [n for n, dt in CACHE_DTYPES.items() if dt.itemsize == itemsize]
    return f"give --dtype {' or '.join(names)}" if names else "no cache dtype has elements of that size"


def torch_or_hint(what: str):
    """The torch module, or ModuleNotFoundError naming ``what`` needs it, with the install hint."""
    try:
        import torch
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        raise ModuleNotFoundError(f"reading {what} needs torch; {TORCH_HINT}", name="torch") from None
    return torch


def _load_pt(path: str) -> np.ndarray:
    torch = torch_or_hint(f"{path!r} (a torch.save file)")

    from ..torch_npu._convert import to_numpy

    obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, torch.Tensor):
        raise FormatError(f"{path}: expected one tensor saved with torch.save(kv_cache.cpu(), ...), got "
                          f"{type(obj).__name__}")
    return np.array(to_numpy(obj.contiguous(), os.path.basename(path)), copy=True)


def _load_npz(path, cache_mode, shape, dtype, combined) -> Cache:
    with np.load(path, allow_pickle=False) as z:
        if "meta" not in z or "data" not in z:
            raise FormatError(f"{path}: expected an {FILE_FORMAT} .npz (arrays 'data' and 'meta'), got arrays "
                              f"{sorted(z.files)}")
        meta = json.loads(str(z["meta"]))
        data = z["data"]
    if meta.get("format") != FILE_FORMAT or int(meta.get("version", 0)) > FILE_VERSION:
        raise FormatError(f"{path}: expected format {FILE_FORMAT} version <= {FILE_VERSION}, got "
                          f"{meta.get('format')!r} version {meta.get('version')!r}")
    given = {"cache_mode": cache_mode, "shape": list(shape) if shape is not None else None,
             "dtype": dtype_name(resolve_dtype(dtype)) if dtype is not None else None}
    for key, value in given.items():
        if value is not None and value != meta[key] and not (key == "cache_mode" and _same_mode(value, meta[key])):
            raise FormatError(f"{path}: {key} given as {value!r} but the file says {meta[key]!r}")
    row_format = meta.get("row_format")
    if combined is None:
        combined = row_format is not None
    dt = resolve_dtype(meta["dtype"])
    arr = np.ascontiguousarray(data).view(dt).reshape(meta["shape"])
    cache = Cache.from_array(arr, meta["cache_mode"], combined=combined, name=os.path.basename(path))
    if row_format is not None and combined:
        fmt = CombinedRowFormat(d_nope=row_format["d_nope"], d_rope=row_format["d_rope"],
                                tile_size=row_format["tile_size"])
        if fmt != cache.spec.row_format:
            cache = Cache(spec=CacheSpec(layout=cache.layout, dtype=cache.spec.dtype, row_format=fmt), raw=cache.raw,
                          shape=cache.shape)
    return cache


def _same_mode(a: str, b: str) -> bool:
    from ..layouts import canonical_cache_mode

    return canonical_cache_mode(a) == canonical_cache_mode(b)


def jsonable(obj):
    """``obj`` with non-finite floats replaced by strings ("nan", "inf", "-inf"), so that
    ``json.dumps`` writes strict JSON (the ``--json`` outputs of ``inspect`` and ``compare``)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj
