"""Recording torch_npu op calls, and the on-disk record format.

:class:`Recorder` wraps the emulated ops of a torch_npu module (the real one on an Atlas
machine; any module with the same attributes) so every call is captured as a
:class:`~.calls.Call`: host copies of the arguments taken *before* the call (caches included),
of the in-place arguments after it, and of the outputs. A callback receives each call
(:class:`RecordWriter` writes it to a directory; ``ascend-emu compare`` replays it at once).

Record format (one directory, ``FORMAT`` / ``VERSION`` below)::

    DIR/index.json            {"format": "ascend_emu.record", "version": 1, "torch_npu": "...",
                               "calls": N, "ops": {"npu_mla_prolog_v3": 3, ...}}
    DIR/calls/00000.json      one call: {"index", "op", "api", "arg_names", "args": [node...],
                               "kwargs": {name: node}, "after": {name: node}, "outputs": [node...],
                               "error": null | "Type: message"}
    DIR/tensors/HASH.npy      tensor data, content-addressed (BLAKE2b of dtype, shape and bytes):
                               a weight passed to every call is stored once

A node is ``{"tensor": "tensors/HASH.npy", "dtype": "bfloat16", "shape": [...], "npu_format": 2 |
29}`` (bf16 and float8 arrays are stored as same-width unsigned integers), ``{"value": v}``
for None / bool / int / float / str, ``{"list": [node...]}``, ``{"dtype": "torch.int8"}``,
``{"alias": NAME}`` (an output that is the in-place argument NAME) or ``{"unsupported": TYPE}``.
Tensors hold logical ND values (an NZ tensor as ``.cpu()`` returns it) with ``npu_format`` 29.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

from ..layouts import FRACTAL_NZ, ND
from .calls import OPS, Call, TensorValue, arg_names

FORMAT = "ascend_emu.record"
VERSION = 1
_SPECIAL = {"bfloat16": ml_dtypes.bfloat16}
for _n in ("float8_e4m3fn", "float8_e5m2"):
    _SPECIAL[_n] = getattr(ml_dtypes, _n)


# ------------------------------------------------------------------------------ torch -> host
def to_host(t) -> np.ndarray:
    """A host NumPy copy of a torch tensor on any device (bf16 as ``ml_dtypes.bfloat16``,
    through an int16 view; NZ tensors as ``.cpu()`` returns them: logical ND values)."""
    import torch

    t = t.detach().cpu().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name in _SPECIAL:
        width = {1: torch.uint8, 2: torch.int16}[t.element_size()]
        return np.array(t.view(width).numpy().view(_SPECIAL[name]), copy=True)
    return np.array(t.numpy(), copy=True)


def capture(v, get_format: Callable | None = None):
    """A recorded value: tensors -> :class:`TensorValue` (host copy), lists element-wise,
    torch dtypes -> ``{"dtype": str}``, plain values as they are, anything else ``{"unsupported"}``."""
    import torch

    if isinstance(v, torch.Tensor):
        fmt = ND
        if get_format is not None:
            try:
                fmt = int(get_format(v))
            except Exception:  # noqa: BLE001  (a CPU tensor: the real get_npu_format may refuse it)
                fmt = ND
        return TensorValue(to_host(v), FRACTAL_NZ if fmt == FRACTAL_NZ else ND)
    if isinstance(v, (list, tuple)):
        return [capture(x, get_format) for x in v]
    if isinstance(v, torch.dtype):
        return {"dtype": str(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return {"unsupported": type(v).__name__}


def _resolve(module, api: str):
    obj = module
    for part in api.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None, None
    parent = module
    for part in api.split(".")[:-1]:
        parent = getattr(parent, part)
    return parent, obj


class Recorder:
    """Wraps the emulated ops of ``torch_npu`` (the module object) to capture every call.

    Args:
        torch_npu: the module whose op attributes are wrapped (``torch_npu``; ``atb`` ops on
            ``torch_npu.atb``). Only ops listed in :data:`~.calls.OPS` that the module has.
        on_call: called with each :class:`~.calls.Call` after the op returned (or raised).

    Use as a context manager, or :meth:`install` / :meth:`uninstall`. Calls made through
    ``torch.ops.npu.*`` directly are not seen.
    """

    def __init__(self, torch_npu, on_call: Callable[[Call], None]):
        self.torch_npu = torch_npu
        self.on_call = on_call
        self._saved: list[tuple[object, str, object]] = []
        self._counter = itertools.count()
        self.wrapped: list[str] = []

    def install(self) -> "Recorder":
        """Replace each op attribute by its recording wrapper."""
        get_format = getattr(self.torch_npu, "get_npu_format", None)
        for info in OPS.values():
            parent, fn = _resolve(self.torch_npu, info.api)
            if fn is None:
                continue
            leaf = info.api.split(".")[-1]
            self._saved.append((parent, leaf, fn))
            setattr(parent, leaf, self._wrap(info, fn, get_format))
            self.wrapped.append(info.api)
        return self

    def uninstall(self) -> None:
        """Put the original functions back."""
        for parent, leaf, fn in reversed(self._saved):
            setattr(parent, leaf, fn)
        self._saved.clear()

    def __enter__(self) -> "Recorder":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def _wrap(self, info, fn, get_format):
        import torch

        names = arg_names(info.name)

        def recorded(*args, **kwargs):
            call = Call(index=next(self._counter), op=info.name, api=f"torch_npu.{info.api}",
                        args=[capture(a, get_format) for a in args],
                        kwargs={k: capture(v, get_format) for k, v in kwargs.items()}, arg_names=names)
            bound = {(names[i] if i < len(names) else f"args[{i}]"): a for i, a in enumerate(args)}
            bound.update(kwargs)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                call.error = f"{type(exc).__name__}: {exc}"
                self.on_call(call)
                raise
            inplace = {n: bound[n] for n in info.inplace if isinstance(bound.get(n), torch.Tensor)}
            call.after = {n: to_host(t) for n, t in inplace.items()}
            results = result if isinstance(result, (tuple, list)) else [result]
            for r in results:
                alias = next((n for n, t in inplace.items() if r is t), None)
                call.outputs.append(f"={alias}" if alias else capture(r, get_format))
            self.on_call(call)
            return result

        recorded.__wrapped__ = fn
        recorded.__name__ = getattr(fn, "__name__", info.name)
        recorded.__doc__ = getattr(fn, "__doc__", None)
        return recorded


# ------------------------------------------------------------------------------ disk format
def _store(a: np.ndarray) -> np.ndarray:
    if a.dtype.name in _SPECIAL:
        return a.view(f"u{a.dtype.itemsize}")
    return a


def _encode(v, key: str, arrays: dict):
    if isinstance(v, TensorValue):
        node = {"tensor": key if v.array is not None else None, "dtype": v.dtype, "shape": v.shape,
                "npu_format": v.npu_format}
        if v.array is not None:
            arrays[key] = _store(v.array)
        return node
    if isinstance(v, np.ndarray):
        return _encode(TensorValue(v), key, arrays)
    if isinstance(v, str) and v.startswith("="):
        return {"alias": v[1:]}
    if isinstance(v, (list, tuple)):
        return {"list": [_encode(x, f"{key}.{i}", arrays) for i, x in enumerate(v)]}
    if isinstance(v, dict):
        return v
    return {"value": v}


def _decode(node, arrays):
    if "tensor" in node:
        a = None
        if node["tensor"] is not None and node["tensor"] in arrays:
            a = arrays[node["tensor"]]
            dt = node["dtype"]
            a = a.view(_SPECIAL[dt]) if dt in _SPECIAL else a
        return TensorValue(a, int(node.get("npu_format", ND)), node.get("dtype"), node.get("shape"))
    if "alias" in node:
        return "=" + node["alias"]
    if "list" in node:
        return [_decode(x, arrays) for x in node["list"]]
    if "value" in node:
        return node["value"]
    return node


def call_to_json(call: Call) -> tuple[dict, dict]:
    """``(json_object, arrays)`` of one call in the record format."""
    arrays: dict[str, np.ndarray] = {}
    obj = {"index": call.index, "op": call.op, "api": call.api, "arg_names": call.arg_names,
           "args": [_encode(v, f"args.{i}", arrays) for i, v in enumerate(call.args)],
           "kwargs": {k: _encode(v, f"kwargs.{k}", arrays) for k, v in call.kwargs.items()},
           "after": {k: _encode(v, f"after.{k}", arrays) for k, v in call.after.items()},
           "outputs": [_encode(v, f"outputs.{i}", arrays) for i, v in enumerate(call.outputs)],
           "error": call.error, "unavailable": call.unavailable}
    return obj, arrays


def call_from_json(obj: dict, arrays) -> Call:
    """Inverse of :func:`call_to_json` (``arrays``: node key -> array, any mapping)."""
    after = {k: _decode(v, arrays) for k, v in obj["after"].items()}
    return Call(index=obj["index"], op=obj["op"], api=obj["api"], arg_names=obj.get("arg_names", []),
                args=[_decode(v, arrays) for v in obj["args"]],
                kwargs={k: _decode(v, arrays) for k, v in obj["kwargs"].items()},
                after={k: (v.array if isinstance(v, TensorValue) else v) for k, v in after.items()},
                outputs=[_decode(v, arrays) for v in obj["outputs"]], error=obj.get("error"),
                unavailable=obj.get("unavailable"))


class RecordWriter:
    """Writes calls into a record directory (see the module doc); usable as ``on_call``.

    Args:
        path: the directory (created; must not hold another recording).
        torch_npu_version: written into ``index.json``.
    """

    def __init__(self, path: str | os.PathLike, torch_npu_version: str | None = None):
        self.path = Path(path)
        (self.path / "calls").mkdir(parents=True, exist_ok=True)
        if any((self.path / "calls").iterdir()):
            raise FileExistsError(f"{self.path}: already holds a recording (calls/ is not empty)")
        self.version = torch_npu_version
        self.ops: dict[str, int] = {}
        self.count = 0
        self.close()

    def __call__(self, call: Call) -> None:
        obj, arrays = call_to_json(call)
        files = {key: self._store(a) for key, a in arrays.items()}
        _rename_tensors(obj, files)
        with open(self.path / "calls" / f"{call.index:05d}.json", "w") as f:
            json.dump(obj, f)
        self.ops[call.op] = self.ops.get(call.op, 0) + 1
        self.count += 1

    def _store(self, a: np.ndarray) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data)
        name = f"tensors/{h.hexdigest()}.npy"
        path = self.path / name
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            np.save(path, a)
        return name

    def close(self) -> None:
        """Write ``index.json``."""
        with open(self.path / "index.json", "w") as f:
            json.dump({"format": FORMAT, "version": VERSION, "torch_npu": self.version, "calls": self.count,
                       "ops": self.ops}, f, indent=1)


def _rename_tensors(node, files: dict) -> None:
    """Point every tensor node at its file."""
    if isinstance(node, dict):
        if node.get("tensor") in files:
            node["tensor"] = files[node["tensor"]]
        for v in node.values():
            _rename_tensors(v, files)
    elif isinstance(node, list):
        for v in node:
            _rename_tensors(v, files)


class _TensorFiles:
    """Mapping ``tensors/HASH.npy`` -> array (memory-mapped, read-only) of a record directory."""

    def __init__(self, root: Path):
        self.root = root

    def __contains__(self, name) -> bool:
        return (self.root / name).is_file()

    def __getitem__(self, name) -> np.ndarray:
        try:
            return np.load(self.root / name, mmap_mode="r")
        except ValueError:  # empty arrays cannot be memory-mapped
            return np.load(self.root / name)


def read_record(path: str | os.PathLike) -> list[Call]:
    """All calls of a record directory, in order.

    Raises:
        FileNotFoundError: no ``index.json``.
        ValueError: not this format / version.
    """
    path = Path(path)
    with open(path / "index.json") as f:
        index = json.load(f)
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise ValueError(f"{path}: not an {FORMAT} v{VERSION} recording (format {index.get('format')!r}, "
                         f"version {index.get('version')!r})")
    files = _TensorFiles(path)
    calls = []
    for js in sorted((path / "calls").glob("*.json")):
        with open(js) as f:
            calls.append(call_from_json(json.load(f), files))
    return calls
