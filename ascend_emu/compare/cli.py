"""``ascend-emu record``, ``ascend-emu compare`` and ``ascend-emu replay`` (msprobe dumps).

- ``record [-o DIR] SCRIPT [ARGS...]``: run SCRIPT under the installed torch_npu (the real one on
  an Atlas machine) and write every emulated op call to DIR (:mod:`.record`).
- ``compare SCRIPT [ARGS...]``: the same run, each call replayed at once on the emulator from the
  inputs snapshotted before it (shadowing); the report is printed at the end.
- ``compare --replay DIR``: replay a recording on the emulator and report.
- ``replay DUMP_DIR -o EMU_DUMP_DIR``: re-run an msprobe tensor dump's calls on the emulator, write
  an msprobe-format dump with the same API names, print the report (:mod:`.msprobe`); ``-n N``
  worker processes or ``--ray [ADDRESS]`` (Ray tasks), ``--timeout``, ``--filter`` / ``--steps``
  / ``--ranks``, ``--dedup``, ``--weights`` / ``--weight-map``, ``--resume``, ``--msprobe-csv``,
  ``--export-repro`` (docs/compare.md, "Replaying a whole model's dump"); a call that timed out
  or failed exits 1, a deduplicated one does not.

Options of ``record`` / ``compare`` go before SCRIPT: what follows SCRIPT is the script's own
arguments, and one spelled like an option of the command (``compare SCRIPT --png-dir d``) is
refused (exit 2, "put --png-dir before the script name") unless the script's arguments start
with ``--`` (``compare SCRIPT -- --png-dir d`` hands it to the script). A run that records or
compares no call (a script calling none of the emulated ops) exits 1 saying so; ``record``
without a real torch_npu writes nothing; ``compare --replay`` of a recording holding no call
exits 2.

Report options: ``--json PATH`` / ``--csv PATH`` (``-`` for stdout), ``--png-dir DIR`` (heat maps
of mismatching caches, needs the ``[plot]`` extra). Exit status: 0 when every compared call is
identical or within the criterion, 1 when one fails or cannot be replayed (``--allow-skipped``
ignores the latter), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from pathlib import Path

from ..install_hints import PLOT_HINT, TORCH_NPU_HINT
from .report import Report

#: Default per-call timeout of ``replay``, seconds: far above a call of a real model's size,
#: the first call's kernel compilation included.
DEFAULT_TIMEOUT = 600.0


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


def _option_after_script(ns) -> str | None:
    """The first argument after SCRIPT spelled like one of the command's own options
    (``ns.own_options``), unless the script's arguments were given after ``--`` (``ns.argv``:
    the raw command line, where ``main`` recorded it)."""
    args = list(getattr(ns, "args", None) or [])
    raw = getattr(ns, "argv", None)
    if not args or (raw is not None and len(raw) > len(args) and raw[-len(args) - 1] == "--"):
        return None
    own = set(getattr(ns, "own_options", ()))
    return next((a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in own), None)


def _check_script(ns, command: str) -> int:
    """0 when SCRIPT can run; else the exit status after the message (2): no such file, or one
    of ``command``'s options after the script name."""
    if not os.path.isfile(ns.script):
        _err(f"can't open file {ns.script!r}: no such file")
        return 2
    opt = _option_after_script(ns)
    if opt is not None:
        _err(f"{command}: {opt} comes after the script name, where it would be the script's argument: put {opt} "
             f"before the script name (ascend-emu {command} {opt} ... {ns.script}), or pass the script's own "
             f"arguments after `--` ({ns.script} -- {opt} ...)")
        return 2
    return 0


def _run_script(ns, on_call, tnpu) -> int:
    """Run SCRIPT (checked by :func:`_check_script`) under the real torch_npu ``tnpu``, every
    emulated op call passed to ``on_call``; the script's exit status."""
    from .._script import run_as_main, show_script_exception
    from .record import Recorder

    path = os.path.join(os.getcwd(), ns.script)
    saved_argv, saved_path0 = sys.argv, sys.path[0]
    sys.argv = [ns.script, *ns.args]
    sys.path[0] = os.path.dirname(os.path.realpath(ns.script))
    rc = 0
    try:
        with Recorder(tnpu, on_call):
            run_as_main(path)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001
        show_script_exception(path, exc, full=True)  # the real torch_npu's frames stay
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
    if "-" not in (getattr(ns, "json", None), getattr(ns, "csv", None), getattr(ns, "msprobe_csv", None)):
        from ..textview import console

        report.render(console(), verbose=getattr(ns, "verbose", False))
    bad = [c for c in report.calls if c.status not in ("identical", "pass", "deduplicated")]
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


#: Why a script run records no call, in the messages of ``record`` and ``compare SCRIPT``.
NO_CALLS = ("the script called none of the emulated ops ({ops}) through torch_npu "
            "(calls made through torch.ops.npu.* directly are not seen)")


def _no_calls_reason() -> str:
    from .calls import OPS

    return NO_CALLS.format(ops=", ".join(sorted(OPS)))


def cmd_record(ns) -> int:
    """``ascend-emu record``."""
    from .record import RecordWriter

    rc = _check_script(ns, "record")
    if rc:
        return rc
    tnpu = _real_torch_npu()  # before the directory is made: no empty recording is left behind
    if tnpu is None:
        return 2
    try:
        writer = RecordWriter(ns.output)
    except FileExistsError as exc:
        _err(str(exc))
        return 2
    try:
        rc = _run_script(ns, writer, tnpu)
    finally:
        writer.version = getattr(tnpu, "__version__", None)
        writer.close()
    if not writer.count:
        _err(f"record: no call recorded in {ns.output}: {_no_calls_reason()}")
        return rc or 1
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
        if not calls:
            _err(f"compare --replay: {ns.replay} holds no recorded call, so nothing can be compared (made by a "
                 "run in which " + _no_calls_reason() + ")")
            return 2
        for call in _progress(calls, f"replaying {len(calls)} call(s)"):
            report.calls.append(compare_call(call))
        return _emit(report, ns)
    if not ns.script:
        _err("compare: give SCRIPT (shadow run on the NPU) or --replay DIR")
        return 2
    rc = _check_script(ns, "compare")
    if rc:
        return rc
    tnpu = _real_torch_npu()
    if tnpu is None:
        return 2
    rc = _run_script(ns, lambda call: report.calls.append(compare_call(call)), tnpu)
    if not report.calls:
        _err(f"compare: nothing compared: {_no_calls_reason()}")
        return rc or 1
    out = _emit(report, ns)
    return rc or out


def _numbers(text: str, option: str) -> list[int]:
    """``"0,2-4"`` -> ``[0, 2, 3, 4]``; ValueError naming ``option`` otherwise."""
    out = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or (sep and int(hi) < int(lo)):
            raise ValueError(f"{option}: expected numbers and ranges such as 0,2-4, got {text!r}")
        out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return sorted(set(out))


class _ReplayProgress:
    """A rich progress bar on stderr (when it is a terminal): calls done / total, failures so
    far and the estimated time left; ``self(done, total, failures)`` updates it."""

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[failures]} failed"), TextColumn("ETA"), TimeRemainingColumn(),
                            console=Console(stderr=True), transient=True, disable=not sys.stderr.isatty())
        self.bar.__enter__()
        self.task = self.bar.add_task("replaying", total=None, failures=0)
        return self

    def __call__(self, done: int, total: int, failures: int) -> None:
        self.bar.update(self.task, completed=done, total=total, failures=failures)

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)


def cmd_replay(ns) -> int:
    """``ascend-emu replay`` (msprobe dumps)."""
    from . import msprobe

    try:
        steps = None if ns.steps is None else _numbers(ns.steps, "--steps")
        ranks = None if ns.ranks is None else _numbers(ns.ranks, "--ranks")
        ops = None if ns.filter is None else sorted({o.strip() for o in ns.filter.split(",") if o.strip()})
        if ns.workers is not None and ns.workers < 1:
            raise ValueError(f"-n: expected a number of processes >= 1, got {ns.workers}")
        if ns.timeout is not None and not ns.timeout > 0:
            raise ValueError(f"--timeout: expected seconds > 0, got {ns.timeout}")
        if ns.weight_map and not ns.weights:
            raise ValueError("--weight-map: give --weights FILE too")
        if ns.resume and not (Path(ns.output) / msprobe.RESULTS_FILE).is_file():
            raise ValueError(f"--resume: {Path(ns.output) / msprobe.RESULTS_FILE} does not exist (no run to resume)")
        if ns.png_dir and importlib.util.find_spec("matplotlib") is None:
            _err(f"--png-dir needs matplotlib; {PLOT_HINT}")
            return 2
        engine, started = None, None
        if ns.ray is not None:
            from ..install_hints import RAY_HINT
            from ..workers import RayEngine, init_ray

            if importlib.util.find_spec("ray") is None:
                _err(f"replay --ray needs Ray, which is not installed: {RAY_HINT}")
                return 2
            engine = RayEngine(ns.ray or None, workers=ns.workers)
            import ray

            if not ray.is_initialized():  # connect before any file is written
                started = init_ray(ns.ray or None, ns.workers)
        # Ray's driver prints its workers' deaths to sys.stdout: to stderr here, so that stdout
        # holds only the report (--json - / --csv - / --msprobe-csv -)
        quiet = contextlib.redirect_stdout(sys.stderr) if engine is not None else contextlib.nullcontext()
        try:
            with quiet, _ReplayProgress() as progress:
                report = msprobe.replay_dump(ns.dump_dir, ns.output, progress, workers=ns.workers, engine=engine,
                                             timeout=ns.timeout, ops=ops, steps=steps, ranks=ranks, resume=ns.resume,
                                             png_dir=ns.png_dir, dedup=ns.dedup, repro_dir=ns.export_repro,
                                             weights=ns.weights, weight_map=ns.weight_map)
        finally:
            if started is not None:
                with quiet:
                    started.shutdown()
    except (OSError, ValueError) as exc:
        _err(f"replay: {exc}")
        return 2
    if getattr(ns, "msprobe_csv", None):
        _write(ns.msprobe_csv, report.to_msprobe_csv())
    print(f"wrote the emulator's dump to {ns.output}; msprobe's table: msprobe compare -tp {ns.dump_dir} "
          f"-gp {ns.output}", file=sys.stderr)
    if ns.png_dir:
        for p in sorted(str(p) for p in Path(ns.png_dir).glob("*.png")):
            print(f"wrote {p}")
        ns.png_dir = None  # written by the calls themselves
    return _emit(report, ns)


def _report_options(p) -> None:
    p.add_argument("--json", metavar="PATH", help="write the report as JSON (- for stdout)")
    p.add_argument("--csv", metavar="PATH", help="write one CSV row per compared tensor (- for stdout)")
    p.add_argument("--png-dir", metavar="DIR", help="heat maps of mismatching caches (needs the [plot] extra)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="list every call in the text report (default: a summary and the calls that did not pass, "
                        "the first divergence first)")
    p.add_argument("--allow-skipped", action="store_true",
                   help="exit 0 even if some calls could not be replayed (they are still listed)")


def _own_options(p: argparse.ArgumentParser) -> tuple[str, ...]:
    """Every option string of parser ``p`` but ``-h`` / ``--help`` (the options refused after
    SCRIPT; a script's own ``--help`` goes to the script)."""
    return tuple(s for a in p._actions for s in a.option_strings if s not in ("-h", "--help"))  # noqa: SLF001


def add_compare_parsers(sub) -> None:
    """Register ``record``, ``compare`` and ``replay`` on the ``ascend-emu`` subparsers ``sub``."""
    p = sub.add_parser("record", help="run a torch_npu script on the NPU and record every emulated op call",
                       description="Run SCRIPT under the installed (real) torch_npu and write each emulated op "
                                   "call (arguments, caches before and after, outputs) to a directory.")
    p.add_argument("-o", "--output", default="ascend_emu_record", help="record directory (default %(default)s)")
    p.add_argument("script", help="the Python script to run (record's options go before it)")
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="the script's arguments (after `--` when one is spelled like an option of record)")
    p.set_defaults(func=cmd_record, own_options=_own_options(p))

    p = sub.add_parser("compare", help="compare the NPU with the emulator: shadow a script, or replay a recording",
                       description="SCRIPT: run it on the real NPU and replay every emulated op call on the "
                                   "emulator from the same inputs. --replay DIR: replay a recording made with "
                                   "`ascend-emu record`. Prints cosine, max abs / rel error, the 1/1000 and "
                                   "5/1000 error ratios, the assertRtolEqual verdict, bf16 ulp histograms and "
                                   "cache mismatches in logical coordinates.")
    p.add_argument("--replay", metavar="DIR", help="a recording directory")
    p.add_argument("script", nargs="?", help="the Python script to shadow (compare's options go before it)")
    p.add_argument("args", nargs=argparse.REMAINDER,
                   help="the script's arguments (after `--` when one is spelled like an option of compare)")
    _report_options(p)
    p.set_defaults(func=cmd_compare, own_options=_own_options(p))

    p = sub.add_parser("replay", help="replay an msprobe tensor dump on the emulator (writes an msprobe dump)",
                       description="Read an msprobe `task: tensor` dump (dump.json + dump_tensor_data/), re-run "
                                   "every call of an emulated op on the emulator and write an msprobe-format dump "
                                   "with the same API names (for `msprobe compare -tp DUMP -gp EMU_DUMP`); also "
                                   "prints the emulator's own report.")
    p.add_argument("dump_dir", help="msprobe dump: a rank directory holding dump.json, or any parent of one")
    p.add_argument("-o", "--output", required=True,
                   help="directory for the emulator's dump and its result file")
    p.add_argument("-n", "--workers", type=int, default=None, metavar="N",
                   help="worker processes (default: one per core; 1 replays in this process); with --ray: calls "
                        "in flight at once (default: the cluster's CPUs)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the calls as Ray tasks (the [ray] extra) on the cluster at ADDRESS (ray.init's "
                        "address, e.g. auto or ray://head:10001), or on a local Ray when none is given; the dump "
                        "and -o must be paths every node sees")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help="a call running longer fails with status timeout (default %(default)g)")
    p.add_argument("--filter", metavar="OP[,OP]", help="replay only these ops")
    p.add_argument("--steps", metavar="LIST", help="replay only these steps (0,2-4)")
    p.add_argument("--ranks", metavar="LIST", help="replay only these ranks (0,2-4)")
    p.add_argument("--dedup", action="store_true",
                   help="replay one call per distinct signature (shapes, dtypes, other arguments)")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from the result file in the output directory")
    p.add_argument("--weights", metavar="FILE",
                   help="a torch.save-d dict of name -> tensor holding the FRACTAL_NZ weights msprobe does not "
                        "save (npu_mla_prolog*, npu_mla_preprocess); else they are rebuilt from the dump's "
                        "npu_format_cast inputs where it holds them")
    p.add_argument("--weight-map", metavar="MAP.json",
                   help="argument name -> key template in --weights ({layer}: the call's layer; default "
                        "layers.{layer}.ARG)")
    p.add_argument("--export-repro", metavar="DIR",
                   help="for each failing call, a standalone torch_npu script with its tensors in DIR (runs with "
                        "`ascend-emu run` and, unchanged, on the NPU)")
    p.add_argument("--msprobe-csv", metavar="PATH",
                   help="write msprobe's accuracy-check table, one row per output (- for stdout)")
    _report_options(p)
    p.set_defaults(func=cmd_replay)
