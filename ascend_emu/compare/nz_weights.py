"""FRACTAL_NZ weights that msprobe does not save, rebuilt for a dump replay.

msprobe writes no file for a FRACTAL_NZ tensor (docs/sources.md#msprobe_dump: a ``data_name``
without a file, null statistics, no format field), so the NZ weights of ``npu_mla_prolog`` /
``_v2`` / ``_v3`` and ``npu_mla_preprocess`` are missing from every dump. Their ND values come
from one of two places, tried in this order, and each call's report says which
(:attr:`.calls.CallReport.weights`):

1. ``--weights FILE``: a ``torch.save``-d dict of name -> tensor (a state dict), looked up through
   a name map (``--weight-map MAP.json``: argument name -> key template, ``{layer}`` replaced by
   the call's number among its op's calls in the step, the layer index when every layer calls
   the op once; default :data:`DEFAULT_TEMPLATE`). A tensor whose shape is the recorded one
   transposed (a ``[out, in]`` checkpoint matrix) is used transposed, said in the source.
2. The dump itself: the ``npu_format_cast(w, 29)`` call that made the weight, whose ND input
   msprobe saved (model loading, when the dump covers it). Its output's shape and dtype must be
   the weight's; inputs with the same recorded statistics (Max, Min, Mean, Norm) count as one
   tensor; where the weight's own statistics are recorded (not by msprobe today) they must match
   too. One such tensor in the rank: that one. As many as the op has calls in the step: the
   n-th (first cast first) for the op's n-th call, as a model casts its layers' weights in layer
   order. Otherwise the weight is ambiguous and stays missing (the call is not replayable; the
   report says how many matched).

This reading of "the cast that produced it" is a choice where msprobe records no link between a
cast and its use; the layer-order rule is what vllm-ascend's weight loading does (each layer's
``process_weights_after_loading`` in order).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

#: Ops whose weights may be FRACTAL_NZ.
NZ_OPS = ("npu_mla_prolog", "npu_mla_prolog_v2", "npu_mla_prolog_v3", "npu_mla_preprocess")
#: The key of an argument's tensor in ``--weights`` without a name map.
DEFAULT_TEMPLATE = "layers.{layer}.{arg}"
#: Where the tensors taken from ``--weights`` are written, under the emulator's dump directory
#: (one file each, so a call loads only its own).
WEIGHTS_DIR = "nz_weights"
_STATS = ("Max", "Min", "Mean", "Norm")


@dataclass(frozen=True)
class Cast:
    """One ``npu_format_cast(x, 29)`` entry of a dump: its output's shape and dtype, its input's
    statistics and file, and where it is."""

    shape: tuple
    dtype: str
    stats: tuple
    path: str
    where: str


def _is_tensor(node) -> bool:
    return isinstance(node, dict) and node.get("type") == "torch.Tensor" and bool(node.get("data_name"))


def _format_of(rec: dict):
    args = rec.get("input_args") or []
    node = args[1] if len(args) > 1 else (rec.get("input_kwargs") or {}).get("acl_format")
    return node.get("value") if isinstance(node, dict) else node


def casts_of(rel: str, data: dict, data_dir: Path) -> list[Cast]:
    """The FRACTAL_NZ casts of one rank directory's ``dump.json`` ``data``, in call order (those
    whose ND input file is there)."""
    out = []
    for key, rec in data.items():
        parts = key.split(".")
        if len(parts) < 4 or parts[-3] != "npu_format_cast" or parts[-1] != "forward" or _format_of(rec) != 29:
            continue
        args, outs = rec.get("input_args") or [], rec.get("output")
        outs = outs[0] if isinstance(outs, list) and outs else outs
        if not (args and _is_tensor(args[0]) and isinstance(outs, dict)):
            continue
        src = data_dir / args[0]["data_name"]
        if src.is_file():
            out.append(Cast(tuple(outs.get("shape") or ()), str(outs.get("dtype")),
                            tuple(args[0].get(k) for k in _STATS), str(src), f"{rel} {key}"))
    return out


def nz_arguments(op: str, rec: dict, data_dir: Path, names: list[str]) -> list[tuple[str, dict]]:
    """``(argument name, node)`` of each tensor of an :data:`NZ_OPS` call that msprobe did not
    save (a ``data_name`` without a file and no statistics)."""
    if op not in NZ_OPS:
        return []
    pairs = [(names[i] if i < len(names) else f"args[{i}]", n) for i, n in enumerate(rec.get("input_args") or [])]
    pairs += list((rec.get("input_kwargs") or {}).items())
    return [(name, n) for name, n in pairs if _is_tensor(n) and n.get("Max") is None
            and not (data_dir / n["data_name"]).is_file()]


class WeightsFile:
    """``--weights FILE`` with its name map: ``lookup(arg, layer, shape)`` -> ``(path of a file
    holding that tensor alone, source)`` or None. The file is opened once (``mmap``), each tensor
    written out once, under ``out_dir``.

    Raises:
        OSError: a file cannot be opened.
        ValueError: the file is not a ``torch.save``-d dict of tensors, or the map is not a JSON
            object of strings.
    """

    def __init__(self, path: str | os.PathLike, weight_map: str | os.PathLike | None, out_dir: str | os.PathLike):
        import torch

        self.path = str(path)
        try:
            try:
                self.tensors = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # a legacy (non-zip) file cannot be mapped
                self.tensors = torch.load(self.path, map_location="cpu", weights_only=True)
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001  (pickle / zip errors: not a torch.save-d file)
            raise ValueError(f"--weights {self.path}: not readable by torch.load(weights_only=True): "
                             f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(self.tensors, dict) or not all(isinstance(v, torch.Tensor) for v in self.tensors.values()):
            raise ValueError(f"--weights {self.path}: expected a torch.save-d dict of name -> tensor")
        self.map: dict[str, str] = {}
        if weight_map is not None:
            with open(weight_map) as f:
                self.map = json.load(f)
            if not isinstance(self.map, dict) or not all(isinstance(v, str) for v in self.map.values()):
                raise ValueError(f"--weight-map {weight_map}: expected a JSON object of argument name -> key "
                                 "template, e.g. {\"weight_dq\": \"model.layers.{layer}.q_a_proj.weight\"}")
        self.out_dir = Path(out_dir)
        self.written: dict[tuple[str, bool], str] = {}

    def lookup(self, arg: str, layer: int, shape: list) -> tuple[str, str] | None:
        import torch

        key = self.map.get(arg, DEFAULT_TEMPLATE).format(layer=layer, arg=arg)
        t = self.tensors.get(key)
        if t is None:
            return None
        if list(t.shape) == list(shape):
            transpose = False
        elif t.dim() == 2 and list(t.shape[::-1]) == list(shape):
            transpose = True
        else:
            raise ValueError(f"--weights {self.path}: {key} has shape {list(t.shape)}, the call's {arg} "
                             f"{list(shape)}")
        if (key, transpose) not in self.written:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            dest = self.out_dir / f"{key}{'.T' if transpose else ''}.pt"
            torch.save((t.T if transpose else t).contiguous().clone(), dest)
            self.written[(key, transpose)] = str(dest)
        return self.written[(key, transpose)], f"--weights {self.path}[{key}]" + (" transposed" if transpose else "")


def choose_cast(casts: list[Cast], node: dict, n: int, calls_per_step: int) -> tuple[Cast | None, str]:
    """The cast whose input is the FRACTAL_NZ ``node`` of the op's ``n``-th call in its step (the
    module doc's rule), and the source text (or why none)."""
    shape, dtype = tuple(node.get("shape") or ()), str(node.get("dtype"))
    own = tuple(node.get(k) for k in _STATS)
    distinct: dict[tuple, Cast] = {}
    for c in casts:
        if c.shape == shape and c.dtype == dtype and (all(v is None for v in own) or c.stats == own):
            distinct.setdefault(c.stats, c)
    found = list(distinct.values())
    what = f"npu_format_cast(x, 29) of shape {list(shape)} {dtype.removeprefix('torch.')}"
    if len(found) == 1:
        return found[0], f"the input of {found[0].where} (the only {what} in the rank)"
    if found and len(found) == calls_per_step:
        return found[n], (f"the input of {found[n].where} (the {what} number {n} of {len(found)} distinct ones, "
                          f"for the op's call {n} in the step: layer order)")
    if not found:
        return None, f"not rebuilt: no {what} with a saved input in the rank; name it with --weights"
    return None, (f"not rebuilt: {len(found)} distinct {what} in the rank for {calls_per_step} call(s) of the op "
                  "per step (ambiguous); name it with --weights")
