"""msprobe tensor dumps: read a device dump, replay it on the emulator, write the emulator's dump.

msprobe (``mindstudio-probe``, Ascend's accuracy tool) dumps a run with ``task: "tensor"`` as
``{step}/{rank|proc}/dump.json`` plus ``dump_tensor_data/*.pt`` (docs/sources.md#msprobe_dump):

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
  every MLA prolog / MlaPreprocess call misses its NZ weights, rebuilt where the dump's
  ``npu_format_cast`` inputs or a ``--weights`` file hold them (:mod:`.nz_weights`).

:func:`replay_dump` turns each forward entry of an emulated op into a :class:`~.calls.Call`,
replays it on the emulator and writes an msprobe-format dump of the emulator's results with the
same keys (inputs copied), so ``msprobe compare -tp DUMP -gp EMU_DUMP`` pairs them. Each entry is
one work unit (:func:`plan_units`, :func:`run_unit`) that loads its own tensors when it runs, on
an :mod:`ascend_emu.workers` (in process, a process pool or Ray tasks); results come back in execution order (step,
rank, call index) and are logged to :data:`RESULTS_FILE` as they finish (``--resume``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Container, Sequence

import numpy as np

from ..layouts import FRACTAL_NZ, ND
from .calls import OPS, Call, CallReport, EmuResult, TensorValue, _written_slots, arg_names, compare_call, replay
from ..workers import Engine, TaskFailure, make_engine
from .nz_weights import WEIGHTS_DIR, WeightsFile, casts_of, choose_cast, nz_arguments
from .record import to_host
from .repro import REPRO_STATUSES, repro_name, write_repro
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


def _load_tensor(node: dict, data_dir: Path, nz: dict | None = None) -> TensorValue:
    import torch

    name = node.get("data_name")
    if nz and name in nz:  # a FRACTAL_NZ weight rebuilt from its ND values (.nz_weights)
        t = torch.load(nz[name], map_location="cpu", weights_only=True)
        return TensorValue(to_host(t), FRACTAL_NZ)
    path = data_dir / name if name else None
    if path is None or not path.is_file():
        # msprobe writes data_name but no file (and null stats) for FRACTAL_NZ tensors
        nz = node.get("Max") is None
        return TensorValue(None, FRACTAL_NZ if nz else ND, node.get("dtype", "").removeprefix("torch."),
                           node.get("shape"))
    t = torch.load(path, map_location="cpu", weights_only=True)
    return TensorValue(to_host(t))


def _value(node, data_dir: Path, nz: dict | None = None):
    if node is None:
        return None
    if isinstance(node, list):
        return [_value(x, data_dir, nz) for x in node]
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "torch.Tensor":
        return _load_tensor(node, data_dir, nz)
    if kind == "torch.dtype":
        return {"dtype": node.get("value")}
    if kind in ("int", "float", "bool", "str", "slice", "torch.Size"):
        return node.get("value")
    if not node:
        return {"unsupported": "a value msprobe did not record"}
    return {"unsupported": str(kind)}


def forward_api(key: str) -> str | None:
    """The API name of a forward entry's key (``"NPU.npu_mla_prolog_v3.0.forward"`` ->
    ``"npu_mla_prolog_v3"``; ``atb.`` prefixes dropped), None for other keys."""
    parsed = parse_key(key)
    if parsed is None or parsed[3] != "forward":
        return None
    return parsed[1].split(".")[-1]


def load_call(index: int, key: str, rec: dict, data_dir: Path, nz: dict | None = None) -> tuple[Call, str | None]:
    """The :class:`~.calls.Call` of one forward entry ``rec`` of an emulated op, its tensors
    loaded now from ``data_dir`` (``map_location="cpu", weights_only=True``), and a note naming
    in-place arguments whose final state is not in the dump (None when all are). ``nz``: the
    ``data_name`` of a FRACTAL_NZ tensor msprobe did not save -> the file of its ND values."""
    api = forward_api(key)
    info = OPS[api]
    call = Call(index=index, op=api, api=key, arg_names=arg_names(api),
                args=[_value(v, data_dir, nz) for v in rec.get("input_args", [])],
                kwargs={k: _value(v, data_dir, nz) for k, v in (rec.get("input_kwargs") or {}).items()})
    outputs = rec.get("output")
    outputs = outputs if isinstance(outputs, list) else [outputs]
    named = call.named()
    for j, node in enumerate(outputs):
        v = _value(node, data_dir, nz)
        name = info.outputs[j] if j < len(info.outputs) else None
        if name in info.inplace and isinstance(named.get(name), TensorValue) and isinstance(v, TensorValue):
            call.after[name] = v.array
            call.outputs.append(f"={name}")
        else:
            call.outputs.append(v)
    missing = [n for n in info.inplace if isinstance(named.get(n), TensorValue) and n not in call.after]
    note = (f"{', '.join(missing)}: updated in place but not returned by {api}, so not in the dump: not "
            "compared" if missing else None)
    return call, note


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


# ------------------------------------------------------------------------------ whole-dump replay
#: The result file in the emulator's dump directory: one JSON line per judged call, appended as
#: calls finish (``--resume`` reads it).
RESULTS_FILE = "replay_results.jsonl"
#: Call statuses that make a call a divergence (its outputs fail).
DIVERGENT = ("fail",)


@dataclass(frozen=True)
class Unit:
    """One work unit of a replay: a forward entry of an emulated op in one rank directory.

    Attributes:
        step, rank: the numbers of the ``step{N}`` / ``rank{N}`` (or ``proc{N}``) directories
            (-1 when the path has none).
        rel: the rank directory relative to the dump root (``"."`` for the root itself).
        call: the entry's position in its ``dump.json`` ``data`` (execution order).
        key: the entry's key (``NPU.npu_lightning_indexer.3.forward``).
        op: the emulated op.
        rec: the entry's record (metadata only; tensors stay on disk until the unit runs).
        layer: the module the call belongs to, from ``construct.json`` where msprobe recorded
            it, else ``None``.
        dump_root, out_root: the device dump and the emulator's dump (absolute paths).
        png_dir: where the unit writes heat maps of its mismatching caches (None: none).
        repro_dir: where the unit writes its repro when it fails (None: nowhere;
            :mod:`.repro`).
        nz: FRACTAL_NZ weights msprobe did not save, rebuilt (:mod:`.nz_weights`): ``(argument,
            data_name, file of the ND values, source)`` each.
        nz_missing: ``(argument, why)`` of those that could not be rebuilt.
    """

    step: int
    rank: int
    rel: str
    call: int
    key: str
    op: str
    rec: dict
    layer: str | None
    dump_root: str
    out_root: str
    png_dir: str | None = None
    repro_dir: str | None = None
    nz: tuple = ()
    nz_missing: tuple = ()

    @property
    def order(self) -> tuple:
        """The execution-order sort key: step, rank, rank directory, call index."""
        return (self.step, self.rank, self.rel, self.call)

    @property
    def uid(self) -> str:
        """A unique name (rank directory / key), the unit's name in the result file."""
        return f"{self.rel}/{self.key}"

    def where(self) -> dict:
        """``{"step", "rank", "call", "layer"}``: ``layer`` is the module from ``construct.json``,
        else the number msprobe gave the call of its API within the step (the layer index when
        every layer calls the op once)."""
        parsed = parse_key(self.key)
        return {"step": self.step, "rank": self.rank, "call": self.call,
                "layer": self.layer if self.layer is not None else parsed[2]}


def _number(part: str, prefix: str) -> int | None:
    rest = part[len(prefix):] if part.startswith(prefix) else ""
    return int(rest) if rest.isdigit() else None


def _step_rank(rel: Path) -> tuple[int, int]:
    step = rank = -1
    for part in rel.parts:
        n = _number(part, "step")
        step = n if n is not None else step
        for prefix in ("rank", "proc"):
            n = _number(part, prefix)
            rank = n if n is not None else rank
    return step, rank


def _layers(rank_dir: Path) -> dict:
    """``construct.json``: entry key -> the module it ran in (msprobe records the parent module
    of each node, null at level L1); {} when absent or unreadable."""
    try:
        with open(rank_dir / "construct.json") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def plan_units(dump_root: str | os.PathLike, out_root: str | os.PathLike, *, ops: Sequence[str] | None = None,
               steps: Container[int] | None = None, ranks: Container[int] | None = None,
               weights: str | os.PathLike | None = None, weight_map: str | os.PathLike | None = None
               ) -> tuple[list[Unit], list[tuple[Path, dict]]]:
    """The work units of a dump, in execution order, reading ``dump.json`` files only.

    Args:
        dump_root: a rank directory or any parent (``dump_path``, a step).
        out_root: the emulator's dump directory (recorded in the units).
        ops: keep only these emulated ops (None: all).
        steps, ranks: keep only these step / rank numbers (None: all).
        weights, weight_map: ``--weights FILE`` and its name map, the first source of the
            FRACTAL_NZ weights msprobe did not save (:mod:`.nz_weights`; the dump's
            ``npu_format_cast`` inputs are the second).

    Returns:
        ``(units, ranks)``: units sorted by (step, rank, rank directory, call index); ranks are
        ``(relative rank directory, dump.json header)`` of the selected rank directories.

    Raises:
        FileNotFoundError: no ``dump.json`` under ``dump_root``.
        ValueError: a dump that is not ``task: "tensor"``, ``ops`` naming an op the replay
            does not know, or a ``--weights`` / ``--weight-map`` file that is not what it should be.
    """
    if ops is not None:
        unknown = sorted(set(ops) - set(OPS))
        if unknown:
            raise ValueError(f"--filter: {', '.join(unknown)} is not an op replay knows (known: "
                             f"{', '.join(sorted(OPS))})")
    root = Path(dump_root).resolve()
    dirs = find_rank_dirs(root)
    if not dirs:
        raise FileNotFoundError(f"{dump_root}: no dump.json found (expected an msprobe dump directory)")
    units, chosen, casts = [], [], {}
    for rank_dir in dirs:
        rel = rank_dir.relative_to(root) if rank_dir != root else Path(".")
        step, rank = _step_rank(rel)
        if ranks is not None and rank not in ranks:
            continue
        with open(rank_dir / "dump.json") as f:
            dump = json.load(f)
        # the casts of every step (a weight is cast once, at loading), for the NZ weights
        casts.setdefault(rank, []).append((step, casts_of(str(rel), dump.get("data", {}), rank_dir / DATA_DIR)))
        if steps is not None and step not in steps:
            continue
        if dump.get("task") != "tensor":
            raise ValueError(f"{rank_dir / 'dump.json'}: task {dump.get('task')!r}, expected 'tensor' (tensor data "
                             "is needed to replay; set \"task\": \"tensor\" in msprobe's config.json)")
        layers = _layers(rank_dir)
        chosen.append((rel, {k: v for k, v in dump.items() if k != "data"}))
        for i, (key, rec) in enumerate(dump.get("data", {}).items()):
            api = forward_api(key)
            if api not in OPS or (ops is not None and api not in ops):
                continue
            units.append(Unit(step, rank, str(rel), i, key, api, rec, layers.get(key), str(root),
                              str(Path(out_root).resolve())))
    units.sort(key=lambda u: u.order)
    out = Path(out_root).resolve()
    wfile = None if weights is None else WeightsFile(weights, weight_map, out / WEIGHTS_DIR)
    by_rank = {r: [c for _, found in sorted(v, key=lambda x: x[0]) for c in found] for r, v in casts.items()}
    per_step: dict[tuple[str, str], int] = {}
    for u in units:
        per_step[(u.rel, u.op)] = per_step.get((u.rel, u.op), 0) + 1
    return [_with_nz(u, by_rank.get(u.rank, []), per_step[(u.rel, u.op)], wfile) for u in units], chosen


def _with_nz(unit: Unit, casts: list, calls_per_step: int, wfile) -> Unit:
    """``unit`` with its FRACTAL_NZ weights resolved (:mod:`.nz_weights`)."""
    data_dir = Path(unit.dump_root) / unit.rel / DATA_DIR
    missing = nz_arguments(unit.op, unit.rec, data_dir, arg_names(unit.op))
    if not missing:
        return unit
    n = parse_key(unit.key)[2]
    found, why_not = [], []
    for arg, node in missing:
        hit = None if wfile is None else wfile.lookup(arg, n, node.get("shape") or [])
        if hit is None:
            cast, text = choose_cast(casts, node, n, calls_per_step)
            hit = None if cast is None else (cast.path, text)
            if hit is None:
                why_not.append((arg, text))
                continue
        found.append((arg, node["data_name"], hit[0], hit[1]))
    return dataclasses.replace(unit, nz=tuple(found), nz_missing=tuple(why_not))


def run_unit(unit: Unit) -> dict:
    """Replay one unit and compare it: loads its tensors, runs the emulator, writes the
    emulator's output files into the emulator's dump (and its heat maps into ``unit.png_dir``,
    the cache diffs staying in the worker). Returns plain data: ``{"report":
    CallReport.to_dict(), "entry": the emulator's dump.json entry or None}`` (the engines send
    it between processes; :func:`replay_dump` writes it to the result file)."""
    rank_dir = Path(unit.dump_root) / unit.rel
    call, note = load_call(unit.call, unit.key, unit.rec, rank_dir / DATA_DIR, {d: p for _, d, p, _ in unit.nz})
    emu = replay(call)
    rep = compare_call(call, emu)
    rep.reason = rep.reason or note
    rep.where = unit.where()
    rep.weights = {arg: src for arg, _, _, src in unit.nz} | {arg: why for arg, why in unit.nz_missing}
    if unit.png_dir is not None:
        Report(calls=[rep]).heatmaps(unit.png_dir)
    if unit.repro_dir is not None and rep.status in REPRO_STATUSES:
        _export_repro(unit, call, emu, rep, rank_dir / DATA_DIR)
    entry = None
    if not (emu.unavailable or emu.error):
        out_data = Path(unit.out_root) / unit.rel / DATA_DIR
        entry = write_emu_entry(unit.key, unit.rec, emu, rank_dir / DATA_DIR, out_data)
    return {"report": rep.to_dict(), "entry": entry}


def _export_repro(unit: Unit, call: Call, emu: EmuResult, rep: CallReport, data_dir: Path) -> None:
    """Write the repro of a failing unit (:func:`.repro.write_repro`): every output the replay
    judged is checked, but the cache copies judged on their written slots only."""
    info = OPS[unit.op]
    checks, unchecked = [], dict(rep.not_compared)
    for t in rep.tensors:
        if t.name in info.outputs:
            j = info.outputs.index(t.name)
        elif t.name.startswith("out[") and t.name.endswith("]"):
            j = int(t.name[4:-1])
        else:
            continue  # an in-place argument the op does not return: not in the dump
        if not info.clones and (t.name in emu.written or _written_slots(call, t.name) is not None):
            unchecked[t.name] = "a cache copy of which only the written slots are defined on the device"
            continue
        checks.append((j, t.name, t.status))
    write_repro(Path(unit.repro_dir) / repro_name(unit.step, unit.rank, unit.call, unit.op), api=info.api,
                key=unit.key, where=unit.where(), status=rep.status, rec=unit.rec, data_dir=data_dir,
                nz_sources={d: (p, src) for _, d, p, src in unit.nz}, checks=checks, unchecked=unchecked)


def _failed_unit(unit: Unit, failure: TaskFailure) -> dict:
    status = "timeout" if failure.kind == "timeout" else "emu error"
    rep = CallReport(unit.call, unit.op, unit.key, status, failure.message, where=unit.where())
    return {"report": rep.to_dict(), "entry": None}


def _plain(obj):
    """JSON for the NumPy values a report may hold (scalars, arrays)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _read_results(path: Path) -> dict[str, dict]:
    """The result file's lines by unit name; a line cut short by an interrupted write is ignored."""
    done: dict[str, dict] = {}
    if not path.is_file():
        return done
    with open(path) as f:
        for line in f:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "unit" in obj:
                done[obj["unit"]] = obj
    return done


def replay_dump(dump_root: str | os.PathLike, out_root: str | os.PathLike, progress: Callable | None = None, *,
                workers: int | None = 1, engine: Engine | None = None, timeout: float | None = None,
                ops: Sequence[str] | None = None, steps: Container[int] | None = None,
                ranks: Container[int] | None = None, resume: bool = False, png_dir: str | None = None,
                dedup: bool = False, repro_dir: str | None = None, weights: str | os.PathLike | None = None,
                weight_map: str | os.PathLike | None = None) -> Report:
    """Replay every emulated call of an msprobe tensor dump on the emulator.

    Each call is a work unit (:func:`plan_units`, :func:`run_unit`) that loads only its own
    tensors, so memory is bounded by the largest call, never by the dump. The units run on
    ``engine`` (default :func:`ascend_emu.workers.make_engine` of ``workers``: in process for 1, else a
    process pool); the report, the result file and the emulator's dump are the same whatever
    the engine, in execution order (step, rank, call index).

    Args:
        dump_root: a rank directory (with ``dump.json``) or any parent (``dump_path``, a step).
        out_root: where the emulator's dump goes, with the same relative layout, and its result
            file :data:`RESULTS_FILE`.
        progress: ``progress(done, total, failures)``, called once before the first unit and
            after each (e.g. a rich progress bar); ``total`` counts the calls to replay.
        workers: processes (1: in this process; None: one per core).
        engine: an :class:`~ascend_emu.workers.Engine` (overrides ``workers``).
        timeout: seconds one call may take; a call past it is reported with status
            ``timeout`` (None: no limit).
        ops, steps, ranks: replay only these ops / step numbers / rank numbers.
        resume: keep the calls the result file already holds and replay the others only.
        png_dir: write a heat map per mismatching cache there (needs matplotlib, the ``[plot]``
            extra), named by step, rank, call, op and tensor.
        dedup: replay one call per distinct :func:`call_signature` (the first in execution
            order); the others are listed with status ``deduplicated``, naming that call.
        repro_dir: write a standalone torch_npu script with its tensors there for each call
            that fails or that the emulator rejects (:mod:`.repro`), by the unit running it.
        weights, weight_map: the ``--weights`` file and its name map for the FRACTAL_NZ weights
            msprobe did not save (:mod:`.nz_weights`); each call's ``weights`` in the report
            names the source of each.

    Returns:
        The :class:`Report`, calls in execution order; calls that cannot be replayed are listed
        as ``not replayable`` with the reason (e.g. FRACTAL_NZ weights missing from the dump).
        Entries of APIs that are not emulated are skipped (not listed). ``Report.meta`` holds
        the selection, the first divergence and the per-op counts.

    Raises:
        FileNotFoundError: no ``dump.json`` under ``dump_root``.
        ValueError: a dump that is not ``task: "tensor"``; an unknown op in ``ops``.
    """
    units, chosen = plan_units(dump_root, out_root, ops=ops, steps=steps, ranks=ranks, weights=weights,
                               weight_map=weight_map)
    if png_dir is not None:
        units = [dataclasses.replace(u, png_dir=str(Path(png_dir).resolve())) for u in units]
    if repro_dir is not None:
        units = [dataclasses.replace(u, repro_dir=str(Path(repro_dir).resolve())) for u in units]
    out_root = Path(out_root)
    for rel, _ in chosen:
        (out_root / rel / DATA_DIR).mkdir(parents=True, exist_ok=True)
    results_path = out_root / RESULTS_FILE
    done = _read_results(results_path) if resume else {}
    by_uid = {u.uid: u for u in units}
    same = _duplicates(units) if dedup else {}
    done = {k: v for k, v in done.items() if k in by_uid and k not in same}
    todo = [u for u in units if u.uid not in done and u.uid not in same]
    total = len(units) - len(same)
    failures = sum(r["report"]["status"] not in ("identical", "pass") for r in done.values())
    if progress:
        progress(len(done), total, failures)
    engine = engine if engine is not None else make_engine(workers)
    with open(results_path, "a" if resume else "w") as log:
        if resume and log.tell() and not results_path.read_bytes().endswith(b"\n"):
            log.write("\n")  # after a line cut short by the interruption
        for i, result in engine.run(run_unit, todo, timeout):
            unit = todo[i]
            if isinstance(result, TaskFailure):
                result = _failed_unit(unit, result)
            text = json.dumps({"unit": unit.uid, **result}, default=_plain)
            log.write(text + "\n")
            log.flush()
            done[unit.uid] = json.loads(text)  # as --resume reads it back: the same report either way
            failures += result["report"]["status"] not in ("identical", "pass")
            if progress:
                progress(len(done), total, failures)
    for u in units:
        if u.uid in same:
            first = same[u.uid]
            why = (f"same signature (shapes, dtypes, other arguments) as step {first.step}, rank {first.rank}, call "
                   f"{first.call} {first.key}: not replayed (--dedup)")
            done[u.uid] = {"report": CallReport(u.call, u.op, u.key, "deduplicated", why, where=u.where()).to_dict(),
                           "entry": None}
    report = Report(calls=[CallReport.from_dict(done[u.uid]["report"]) for u in units])
    for rel, header in chosen:
        data = {u.key: done[u.uid]["entry"] for u in units if u.rel == str(rel) and done[u.uid]["entry"] is not None}
        out_dir = out_root / rel
        with open(out_dir / "dump.json", "w") as f:
            json.dump({"task": "tensor", "level": header.get("level", "L1"), "framework": "pytorch",
                       "dump_data_dir": str(out_dir / DATA_DIR), "data": data}, f, indent=1)
    report.meta = summarize(report, units, ops=ops, steps=steps, ranks=ranks, dedup=dedup)
    return report


def call_signature(unit: Unit) -> str:
    """What ``--dedup`` compares (msprobe's ``-f``): the op and, for every input, a tensor's
    dtype and shape or another value as recorded, as one JSON string."""

    def norm(node):
        if isinstance(node, list):
            return [norm(x) for x in node]
        if isinstance(node, dict) and node.get("type") == "torch.Tensor":
            return ["tensor", node.get("dtype"), node.get("shape")]
        if isinstance(node, dict):
            return [node.get("type"), node.get("value")]
        return node

    rec = unit.rec
    return json.dumps([unit.op, norm(rec.get("input_args", [])),
                       {k: norm(v) for k, v in (rec.get("input_kwargs") or {}).items()}], sort_keys=True)


def _duplicates(units: list[Unit]) -> dict[str, Unit]:
    """Unit name -> the first unit (in execution order) with its signature, for every unit
    that is not that first one."""
    first: dict[str, Unit] = {}
    out = {}
    for u in units:
        sig = call_signature(u)
        if sig in first:
            out[u.uid] = first[sig]
        else:
            first[sig] = u
    return out


def summarize(report: Report, units: list[Unit], *, ops=None, steps=None, ranks=None, dedup=False) -> dict:
    """The replay's summary: ``selection`` (what was asked for), ``first_divergence`` (the
    earliest call by step, rank and call index whose status is in :data:`DIVERGENT`, with its
    layer; None if none) and ``per_op`` (op -> counts per status)."""
    first = next((c for c in report.calls if c.status in DIVERGENT), None)
    per_op: dict[str, dict[str, int]] = {}
    for c in report.calls:
        counts = per_op.setdefault(c.op, {})
        counts[c.status] = counts.get(c.status, 0) + 1
    return {"selection": {"filter": sorted(ops) if ops is not None else None,
                          "steps": sorted(steps) if steps is not None else None,
                          "ranks": sorted(ranks) if ranks is not None else None,
                          "dedup": bool(dedup), "calls": len(units)},
            "first_divergence": None if first is None else {**first.where, "op": first.op, "api": first.api},
            "per_op": {op: per_op[op] for op in sorted(per_op)}}
