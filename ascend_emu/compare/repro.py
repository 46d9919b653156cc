"""``ascend-emu replay --export-repro DIR``: one standalone torch_npu script per failing call.

For a call of an msprobe dump that the replay judged ``fail`` or ``emu error``, :func:`write_repro`
writes ``DIR/step{S}_rank{R}_call{N}_{op}/`` holding ``repro.py`` and ``tensors/`` (the call's
input files and the device's output files, hard-linked or copied from the dump; a FRACTAL_NZ
weight that msprobe did not save is the ND tensor it was rebuilt from). The script is a plain torch_npu
program: it loads the inputs (``map_location="cpu", weights_only=True``), moves them to the NPU
(``.npu()``), casts the NZ weights with ``torch_npu.npu_format_cast(w, 29)``, makes the call as
the model did (``torch_npu.<api>(*args, **kwargs)``), saves what it returned to
``result_{emu|npu}.pt`` and compares each output the replay judged with the device's, bit for bit
(NaN equal to NaN). So it runs on a laptop with ``ascend-emu run repro.py`` (the emulator,
``ASCEND_EMU_BACKEND=emu``) and, unchanged, with ``python repro.py`` on an Atlas machine (the
real torch_npu). Exit status: 1 when an output the replay failed differs from the device's
(the divergence reproduced), else 0.

Outputs the replay did not judge (undefined on the device, :func:`.calls.undefined_outputs`) and
the cache copies of functional forms, of which only the written slots are defined, are saved but
not checked (the script says so).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

#: Call statuses that get a repro.
REPRO_STATUSES = ("fail", "emu error")


def repro_name(step: int, rank: int, call: int, op: str) -> str:
    """The repro's directory name: ``step{S}_rank{R}_call{N:05d}_{op}``."""
    return f"step{step}_rank{rank}_call{call:05d}_{op}"


def _place(src: str | Path, dest: Path) -> None:
    """``dest`` holds ``src``'s bytes: a hard link where the file system allows, else a copy."""
    dest.unlink(missing_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def _literal(node, load) -> str:
    """Python source for one msprobe value node (tensors through ``load(node)``)."""
    if node is None:
        return "None"
    if isinstance(node, list):
        return "[" + ", ".join(_literal(x, load) for x in node) + "]"
    if not isinstance(node, dict):
        return repr(node)
    kind = node.get("type")
    if kind == "torch.Tensor":
        return load(node)
    if kind == "torch.dtype":
        return str(node.get("value"))  # torch.int8
    if kind == "slice":
        return f"slice(*{node.get('value')!r})"
    if kind in ("int", "float", "bool", "str", "torch.Size"):
        value = node.get("value")
        if isinstance(value, float) and not math.isfinite(value):
            return f"float({repr(value)!r})"
        return repr(value)
    raise ValueError(f"a value of type {kind!r} that msprobe did not record cannot be written into a repro")


def write_repro(dest: str | Path, *, api: str, key: str, where: dict, status: str, rec: dict, data_dir: Path,
                nz_sources: dict[str, tuple[str, str]], checks: list[tuple[int, str, str]],
                unchecked: dict[str, str]) -> Path:
    """Write one repro directory.

    Args:
        dest: the directory (made; files in it are replaced).
        api: the torch_npu attribute path (``npu_kv_rmsnorm_rope_cache``, ``atb.npu_mla_preprocess``).
        key: the dump entry's key; ``where``: its step, rank, call and layer; ``status``: the
            replay's verdict.
        rec: the dump entry (``input_args``, ``input_kwargs``, ``output``).
        data_dir: the rank's ``dump_tensor_data``.
        nz_sources: ``data_name`` of an FRACTAL_NZ tensor msprobe did not save -> (path of the ND
            tensor file it is rebuilt from, where that came from).
        checks: ``(output position, name, replay status)`` of each output to compare.
        unchecked: output name -> why it is saved but not compared.

    Returns:
        The script's path.

    Raises:
        ValueError: the entry holds a value msprobe did not record (``{}``).
    """
    dest = Path(dest)
    tensors = dest / "tensors"
    tensors.mkdir(parents=True, exist_ok=True)
    notes = []

    def load(node: dict) -> str:
        name = node.get("data_name")
        if name in nz_sources:
            src, why = nz_sources[name]
            _place(src, tensors / name)
            notes.append(f"{name}: FRACTAL_NZ, not saved by msprobe; rebuilt from {why}")
            return f"load({name!r}, nz=True)"
        _place(data_dir / name, tensors / name)
        return f"load({name!r})"

    args = [_literal(v, load) for v in rec.get("input_args", [])]
    kwargs = {k: _literal(v, load) for k, v in (rec.get("input_kwargs") or {}).items()}
    outputs = rec.get("output")
    outputs = outputs if isinstance(outputs, list) else [outputs]
    check_lines = []
    for j, name, verdict in checks:
        node = outputs[j] if j < len(outputs) else None
        if not (isinstance(node, dict) and node.get("type") == "torch.Tensor" and node.get("data_name")):
            continue
        src = data_dir / node["data_name"]
        if not src.is_file():
            continue
        _place(src, tensors / node["data_name"])
        check_lines.append(f"    ({j}, {name!r}, {node['data_name']!r}, {verdict!r}),")
    call_args = "".join(f"    {a},\n" for a in args)
    call_kwargs = "".join(f"    {k!r}: {v},\n" for k, v in kwargs.items())
    unchecked_lines = "".join(f"#   {n}: {why}\n" for n, why in unchecked.items())
    note_lines = "".join(f"#   {n}\n" for n in notes)
    layer = f", layer {where.get('layer')}" if where.get("layer") is not None else ""
    place = f"step {where.get('step')}, rank {where.get('rank')}, call {where.get('call')}{layer}"
    script = f'''"""Reproduces one call of an msprobe dump: {place}: {key}
(ascend-emu replay: {status}).

On a laptop (the emulator):   ascend-emu run repro.py     (ASCEND_EMU_BACKEND=emu, the default)
On an Atlas machine, as is:   python repro.py             (the real torch_npu)

Loads the call's inputs from tensors/, calls torch_npu.{api} as the model did, saves what it
returned to result_emu.pt (the emulator) or result_npu.pt (the NPU) and compares the outputs the
replay judged with the device's dumped ones. Exit status 1 when an output the replay failed
differs from the device's.
"""

import os
import sys

import torch
import torch_npu

torch.npu.config.allow_internal_format = True
HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = "emu" if torch_npu.__name__.startswith("ascend_emu") else "npu"


def load(name, nz=False):
    t = torch.load(os.path.join(HERE, "tensors", name), map_location="cpu", weights_only=True).npu()
    return torch_npu.npu_format_cast(t, 29) if nz else t


# FRACTAL_NZ weights:
{note_lines or "#   none" + chr(10)}args = [
{call_args}]
kwargs = {{
{call_kwargs}}}
result = torch_npu.{api}(*args, **kwargs)
result = list(result) if isinstance(result, (tuple, list)) else [result]
torch.save([r.cpu() if isinstance(r, torch.Tensor) else r for r in result], os.path.join(HERE, f"result_{{DEVICE}}.pt"))

# (output position, name, device's output file, the replay's verdict); not compared:
{unchecked_lines or "#   none" + chr(10)}CHECKS = [
{"".join(x + chr(10) for x in check_lines)}]
reproduced = False
for j, name, expected_file, verdict in CHECKS:
    mine = result[j].cpu()
    expected = torch.load(os.path.join(HERE, "tensors", expected_file), map_location="cpu", weights_only=True)
    a, b = mine.double(), expected.double()
    same = mine.shape == expected.shape and mine.dtype == expected.dtype and bool(
        ((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    if same:
        print(f"{{name}}: identical to the device's")
        continue
    differ = int((~((a == b) | (torch.isnan(a) & torch.isnan(b)))).sum()) if a.shape == b.shape else a.numel()
    print(f"{{name}}: {{differ}} of {{b.numel()}} element(s) differ from the device's (replay: {{verdict}})")
    reproduced = reproduced or verdict in ("fail", "missing")
sys.exit(1 if reproduced else 0)
'''
    path = dest / "repro.py"
    path.write_text(script)
    (dest / "call.json").write_text(json.dumps({"key": key, "where": where, "status": status, "entry": rec},
                                               indent=1))
    return path
