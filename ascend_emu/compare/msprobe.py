"""msprobe tensor dumps: read a device dump, replay it on the emulator, write the emulator's dump.

msprobe (``mindstudio-probe``, Ascend's accuracy tool) dumps a run with ``task: "tensor"`` as
``{step}/{rank|proc}/dump.json`` plus ``dump_tensor_data/*.pt`` (research notes msprobe.md §2):

- ``dump.json``: ``{"task", "level", "framework", "dump_data_dir", "data"}``; ``data[
  "NPU.npu_mla_prolog_v3.0.forward"] = {"input_args": [...], "input_kwargs": {...}, "output":
  [...]}``; a tensor is ``{"type": "torch.Tensor", "dtype": "torch.bfloat16", "shape": [...],
  "Max", "Min", "Mean", "Norm", "requires_grad", "data_name": FILE}``; other values ``{"type":
  "int", "value": 3}``, ``null``, lists; ``torch.dtype`` only under the keys dtype / output_dtype /
  device (else ``{}``, the value is lost).
- inputs are saved before the call, outputs after it: an in-place cache's update is in the dump
  only where the op returns the cache (``npu_kv_rmsnorm_rope_cache`` returns both, ``npu_mla_prolog``
  / ``_v2`` return them, ``npu_mla_prolog_v3`` does not);
- FRACTAL_NZ tensors are not saved (their ``data_name`` points at a missing file, stats null):
  every MLA prolog / MlaPreprocess call misses its NZ weights and cannot be replayed.

:func:`replay_dump` turns each forward entry of an emulated op into a :class:`~.calls.Call`,
replays it on the emulator and writes an msprobe-format dump of the emulator's results with the
same keys (inputs copied), so ``msprobe compare -tp DUMP -gp EMU_DUMP`` pairs them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from ..layouts import FRACTAL_NZ, ND
from .calls import OPS, Call, EmuResult, TensorValue, arg_names, compare_call, replay
from .record import to_host
from .report import Report

#: Sub-directory of tensor files in a rank directory.
DATA_DIR = "dump_tensor_data"


def parse_key(key: str) -> tuple[str, str, int, str] | None:
    """``"NPU.npu_mla_prolog_v3.0.forward"`` -> ``("NPU", "npu_mla_prolog_v3", 0, "forward")``;
    None for keys of another shape."""
    parts = key.split(".")
    if len(parts) < 4 or not parts[-2].isdigit():
        return None
    return parts[0], ".".join(parts[1:-2]), int(parts[-2]), parts[-1]


def _load_tensor(node: dict, data_dir: Path) -> TensorValue:
    import torch

    name = node.get("data_name")
    path = data_dir / name if name else None
    if path is None or not path.is_file():
        # msprobe writes data_name but no file (and null stats) for FRACTAL_NZ tensors
        nz = node.get("Max") is None
        return TensorValue(None, FRACTAL_NZ if nz else ND, node.get("dtype", "").removeprefix("torch."),
                           node.get("shape"))
    t = torch.load(path, map_location="cpu", weights_only=True)
    return TensorValue(to_host(t))


def _value(node, data_dir: Path):
    if node is None:
        return None
    if isinstance(node, list):
        return [_value(x, data_dir) for x in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "torch.Tensor":
        return _load_tensor(node, data_dir)
    if kind == "torch.dtype":
        return {"dtype": node.get("value")}
    if kind in ("int", "float", "bool", "str", "slice", "torch.Size"):
        return node.get("value")
    if not node:
        return {"unsupported": "a value msprobe did not record"}
    return {"unsupported": str(kind)}


def read_dump(rank_dir: str | os.PathLike) -> tuple[dict, list[tuple[str, Call | None, str | None]]]:
    """Read one msprobe rank directory.

    Returns:
        ``(dump_json, entries)``: entries are ``(key, call, note)`` for every forward entry;
        ``call`` is None (``note`` the reason) for APIs the emulator does not model; else
        ``note`` names in-place arguments whose final state is not in the dump.

    Raises:
        FileNotFoundError: no ``dump.json``.
        ValueError: not a ``task: "tensor"`` dump.
    """
    rank_dir = Path(rank_dir)
    with open(rank_dir / "dump.json") as f:
        dump = json.load(f)
    if dump.get("task") != "tensor":
        raise ValueError(f"{rank_dir / 'dump.json'}: task {dump.get('task')!r}, expected 'tensor' (tensor data is "
                         "needed to replay; set \"task\": \"tensor\" in msprobe's config.json)")
    data_dir = rank_dir / DATA_DIR
    entries = []
    for i, (key, rec) in enumerate(dump.get("data", {}).items()):
        parsed = parse_key(key)
        if parsed is None or parsed[3] != "forward":
            continue
        api = parsed[1].split(".")[-1]
        if api not in OPS:
            entries.append((key, None, f"{api} is not an emulated op"))
            continue
        info = OPS[api]
        names = arg_names(api)
        call = Call(index=i, op=api, api=key, arg_names=names,
                    args=[_value(v, data_dir) for v in rec.get("input_args", [])],
                    kwargs={k: _value(v, data_dir) for k, v in (rec.get("input_kwargs") or {}).items()})
        outputs = rec.get("output")
        outputs = outputs if isinstance(outputs, list) else [outputs]
        named = call.named()
        for j, node in enumerate(outputs):
            v = _value(node, data_dir)
            name = info.outputs[j] if j < len(info.outputs) else None
            if name in info.inplace and isinstance(named.get(name), TensorValue) and isinstance(v, TensorValue):
                call.after[name] = v.array
                call.outputs.append(f"={name}")
            else:
                call.outputs.append(v)
        missing = [n for n in info.inplace if isinstance(named.get(n), TensorValue) and n not in call.after]
        note = (f"{', '.join(missing)}: updated in place but not returned by {api}, so not in the dump: not "
                "compared" if missing else None)
        entries.append((key, call, note))
    return dump, entries


def _torch_dtype(a: np.ndarray) -> str:
    return f"torch.{'bfloat16' if a.dtype.name == 'bfloat16' else a.dtype.name}"


def _tensor_node(a: np.ndarray, data_name: str, data_dir: Path) -> dict:
    import torch

    if a.dtype.name == "bfloat16":
        tensor = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(np.ascontiguousarray(a))
    torch.save(tensor.clone(), data_dir / data_name)
    f = a.astype(np.float64) if a.size else None
    is_float = a.dtype.kind == "f" or a.dtype.name == "bfloat16"
    return {"type": "torch.Tensor", "dtype": _torch_dtype(a), "shape": list(a.shape),
            "Max": None if f is None else float(np.nanmax(f)) if is_float else (int(a.max()) if a.size else None),
            "Min": None if f is None else float(np.nanmin(f)) if is_float else (int(a.min()) if a.size else None),
            "Mean": float(np.nanmean(f)) if is_float and f is not None else None,
            "Norm": float(np.linalg.norm(np.nan_to_num(f))) if is_float and f is not None else None,
            "requires_grad": False, "data_name": data_name}


def write_emu_entry(key: str, rec: dict, emu: EmuResult, src_data: Path, out_data: Path) -> dict:
    """The emulator's dump entry for ``key``: the device's input records (their files copied) and
    the emulator's outputs (saved as ``{key}.output.{i}.pt``)."""
    for node in _tensor_nodes(rec.get("input_args", [])) + _tensor_nodes(list((rec.get("input_kwargs") or {}).values())):
        src = src_data / node["data_name"]
        if src.is_file():
            shutil.copyfile(src, out_data / node["data_name"])
    outputs = []
    for i, v in enumerate(emu.outputs):
        if isinstance(v, str) and v.startswith("="):
            v = TensorValue(emu.after[v[1:]])
        if isinstance(v, TensorValue):
            outputs.append(_tensor_node(v.array, f"{key}.output.{i}.pt", out_data))
        elif v is None:
            outputs.append(None)
        else:
            outputs.append({"type": type(v).__name__, "value": v})
    return {"input_args": rec.get("input_args", []), "input_kwargs": rec.get("input_kwargs", {}), "output": outputs}


def _tensor_nodes(nodes) -> list[dict]:
    out = []
    for n in nodes:
        if isinstance(n, list):
            out += _tensor_nodes(n)
        elif isinstance(n, dict) and n.get("type") == "torch.Tensor" and n.get("data_name"):
            out.append(n)
    return out


def find_rank_dirs(root: str | os.PathLike) -> list[Path]:
    """Every directory holding a ``dump.json`` at or under ``root``, sorted."""
    root = Path(root)
    if (root / "dump.json").is_file():
        return [root]
    return sorted(p.parent for p in root.rglob("dump.json"))


def replay_dump(dump_root: str | os.PathLike, out_root: str | os.PathLike,
                progress: Callable | None = None) -> Report:
    """Replay every emulated call of an msprobe tensor dump on the emulator.

    Args:
        dump_root: a rank directory (with ``dump.json``) or any parent (``dump_path``, a step).
        out_root: where the emulator's dump goes, with the same relative layout.
        progress: ``progress(items, description)`` wrapper (e.g. a rich progress bar).

    Returns:
        The :class:`Report` over the replayed calls; calls that cannot be replayed are listed as
        ``not replayable`` with the reason (e.g. FRACTAL_NZ weights missing from the dump).
        Entries of APIs that are not emulated are skipped (not listed).

    Raises:
        FileNotFoundError: no ``dump.json`` under ``dump_root``.
        ValueError: a dump that is not ``task: "tensor"``.
    """
    ranks = find_rank_dirs(dump_root)
    if not ranks:
        raise FileNotFoundError(f"{dump_root}: no dump.json found (expected an msprobe dump directory)")
    report = Report()
    for rank in ranks:
        dump, entries = read_dump(rank)
        rel = rank.relative_to(Path(dump_root)) if rank != Path(dump_root) else Path(".")
        out_dir = Path(out_root) / rel
        out_data = out_dir / DATA_DIR
        out_data.mkdir(parents=True, exist_ok=True)
        data = {}
        items = [e for e in entries if e[1] is not None]
        for key, call, note in (progress(items, f"replaying {len(items)} call(s)") if progress else items):
            emu = replay(call)
            rep = compare_call(call, emu)
            rep.api = key
            rep.reason = rep.reason or note
            report.calls.append(rep)
            if not (emu.unavailable or emu.error):
                data[key] = write_emu_entry(key, dump["data"][key], emu, rank / DATA_DIR, out_data)
        with open(out_dir / "dump.json", "w") as f:
            json.dump({"task": "tensor", "level": dump.get("level", "L1"), "framework": "pytorch",
                       "dump_data_dir": str(out_data), "data": data}, f, indent=1)
    return report
