"""``ascend-emu record``, ``ascend-emu compare`` and ``ascend-emu replay`` (msprobe dumps).

- ``record [-o DIR] SCRIPT [ARGS...]``: run SCRIPT under the installed torch_npu (the real one on
  an Atlas machine) and write every emulated op call to DIR (:mod:`.record`).
- ``compare SCRIPT [ARGS...]``: the same run, each call replayed at once on the emulator from the
  inputs snapshotted before it (shadowing); the report is printed at the end.
- ``compare --replay DIR``: replay a recording on the emulator and report.
- ``replay DUMP_DIR -o EMU_DUMP_DIR``: re-run an msprobe tensor dump's calls on the emulator, write
  an msprobe-format dump with the same API names, print the report (:mod:`.msprobe`).

Report options: ``--json PATH`` / ``--csv PATH`` (``-`` for stdout), ``--png-dir DIR`` (heat maps
of mismatching caches, needs the ``[plot]`` extra). Exit status: 0 when every compared call is
identical or within the criterion, 1 when one fails or cannot be replayed (``--allow-skipped``
ignores the latter), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..install_hints import PLOT_HINT, TORCH_NPU_HINT
from .report import Report


def _err(msg: str) -> None:
    print(f"ascend-emu: {msg}", file=sys.stderr)


def _real_torch_npu():
    """The installed torch_npu module (never the drop-in), or None with a message."""
    mod = sys.modules.get("torch_npu")
    if mod is not None and mod.__name__.startswith("ascend_emu"):
        _err("torch_npu is the ascend_emu drop-in in this process; run `ascend-emu record/compare` with the real "
             "torch_npu (on an Atlas machine), not under `ascend-emu run`")
        return None
    if importlib.util.find_spec("torch_npu") is None:
        _err("no torch_npu is installed: `record` and `compare SCRIPT` run the script on the real NPU, "
             f"{TORCH_NPU_HINT}; on a laptop use `ascend-emu compare --replay DIR` on a recording made there")
        return None
    return importlib.import_module("torch_npu")


def _run_script(ns, on_call) -> int:
    from ..cli import _run_as_main, _show_script_exception
    from .record import Recorder

    if not os.path.isfile(ns.script):
        _err(f"can't open file {ns.script!r}: no such file")
        return 2
    tnpu = _real_torch_npu()
    if tnpu is None:
        return 2
    path = os.path.join(os.getcwd(), ns.script)
    saved_argv, saved_path0 = sys.argv, sys.path[0]
    sys.argv = [ns.script, *ns.args]
    sys.path[0] = os.path.dirname(os.path.realpath(ns.script))
    rc = 0
    try:
        with Recorder(tnpu, on_call):
            _run_as_main(path)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001
        _show_script_exception(path, exc)
        rc = 1
    finally:
        sys.argv, sys.path[0] = saved_argv, saved_path0
    return rc


def _emit(report: Report, ns) -> int:
    if getattr(ns, "json", None):
        _write(ns.json, report.to_json())
    if getattr(ns, "csv", None):
        _write(ns.csv, report.to_csv())
    if getattr(ns, "png_dir", None):
        try:
            paths = report.heatmaps(ns.png_dir)
        except ModuleNotFoundError:
            _err(f"--png-dir needs matplotlib; {PLOT_HINT}")
            return 2
        for p in paths:
            print(f"wrote {p}")
    if not (getattr(ns, "json", None) == "-" or getattr(ns, "csv", None) == "-"):
        from ..textview import console

        report.render(console())
    bad = [c for c in report.calls if c.status not in ("identical", "pass")]
    if ns.allow_skipped:
        bad = [c for c in bad if c.status != "not replayable"]
    return 1 if bad else 0


def _write(dest: str, text: str) -> None:
    if dest == "-":
        sys.stdout.write(text)
    else:
        with open(dest, "w") as f:
            f.write(text)


def _progress(items, description: str):
    from rich.progress import track

    return track(items, description=description, transient=True, disable=not sys.stderr.isatty(),
                 console=None)


def cmd_record(ns) -> int:
    """``ascend-emu record``."""
    from .record import RecordWriter

    try:
        writer = RecordWriter(ns.output)
    except FileExistsError as exc:
        _err(str(exc))
        return 2
    try:
        rc = _run_script(ns, writer)
    finally:
        tnpu = sys.modules.get("torch_npu")
        writer.version = getattr(tnpu, "__version__", None)
        writer.close()
    print(f"ascend-emu record: {writer.count} call(s) written to {ns.output}: "
          + ", ".join(f"{v} {k}" for k, v in writer.ops.items()), file=sys.stderr)
    return rc


def cmd_compare(ns) -> int:
    """``ascend-emu compare``."""
    from .calls import compare_call
    from .record import read_record

    report = Report()
    if ns.replay:
        if ns.script:
            _err("compare: give either SCRIPT or --replay DIR")
            return 2
        try:
            calls = read_record(ns.replay)
        except (OSError, ValueError) as exc:
            _err(f"compare --replay: {exc}")
            return 2
        for call in _progress(calls, f"replaying {len(calls)} call(s)"):
            report.calls.append(compare_call(call))
        return _emit(report, ns)
    if not ns.script:
        _err("compare: give SCRIPT (shadow run on the NPU) or --replay DIR")
        return 2
    rc = _run_script(ns, lambda call: report.calls.append(compare_call(call)))
    out = _emit(report, ns)
    return rc or out


def cmd_replay(ns) -> int:
    """``ascend-emu replay`` (msprobe dumps)."""
    from . import msprobe

    try:
        report = msprobe.replay_dump(ns.dump_dir, ns.output, progress=_progress)
    except (OSError, ValueError) as exc:
        _err(f"replay: {exc}")
        return 2
    print(f"wrote the emulator's dump to {ns.output}; msprobe's table: msprobe compare -tp {ns.dump_dir} "
          f"-gp {ns.output}", file=sys.stderr)
    return _emit(report, ns)


def _report_options(p) -> None:
    p.add_argument("--json", metavar="PATH", help="write the report as JSON (- for stdout)")
    p.add_argument("--csv", metavar="PATH", help="write one CSV row per compared tensor (- for stdout)")
    p.add_argument("--png-dir", metavar="DIR", help="heat maps of mismatching caches (needs the [plot] extra)")
    p.add_argument("--allow-skipped", action="store_true",
                   help="exit 0 even if some calls could not be replayed (they are still listed)")


def add_compare_parsers(sub) -> None:
    """Register ``record``, ``compare`` and ``replay`` on the ``ascend-emu`` subparsers ``sub``."""
    p = sub.add_parser("record", help="run a torch_npu script on the NPU and record every emulated op call",
                       description="Run SCRIPT under the installed (real) torch_npu and write each emulated op "
                                   "call (arguments, caches before and after, outputs) to a directory.")
    p.add_argument("-o", "--output", default="ascend_emu_record", help="record directory (default %(default)s)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_record)

    p = sub.add_parser("compare", help="compare the NPU with the emulator: shadow a script, or replay a recording",
                       description="SCRIPT: run it on the real NPU and replay every emulated op call on the "
                                   "emulator from the same inputs. --replay DIR: replay a recording made with "
                                   "`ascend-emu record`. Prints cosine, max abs / rel error, the 1/1000 and "
                                   "5/1000 error ratios, the assertRtolEqual verdict, bf16 ulp histograms and "
                                   "cache mismatches in logical coordinates.")
    p.add_argument("--replay", metavar="DIR", help="a recording directory")
    p.add_argument("script", nargs="?")
    p.add_argument("args", nargs=argparse.REMAINDER)
    _report_options(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("replay", help="replay an msprobe tensor dump on the emulator (writes an msprobe dump)",
                       description="Read an msprobe `task: tensor` dump (dump.json + dump_tensor_data/), re-run "
                                   "every call of an emulated op on the emulator and write an msprobe-format dump "
                                   "with the same API names (for `msprobe compare -tp DUMP -gp EMU_DUMP`); also "
                                   "prints the emulator's own report.")
    p.add_argument("dump_dir", help="msprobe dump: a rank directory holding dump.json, or any parent of one")
    p.add_argument("-o", "--output", required=True, help="directory for the emulator's dump")
    _report_options(p)
    p.set_defaults(func=cmd_replay)
