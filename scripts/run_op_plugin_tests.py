"""Run op-plugin's own test files (Ascend/op-plugin, ``test/...``) under ``ascend-emu run`` and
print per-file results, from a local op-plugin checkout whose path is given.

Nothing of op-plugin is part of this repository: the files are read from the checkout. Each file
runs once per SoC (``--soc``, default the Atlas A2 name and an Ascend 950 name; ``ASCEND_EMU_SOC_NAME``)
in a fresh ``python -m ascend_emu run`` process, which makes ``import torch_npu`` the emulator.
There the test module is imported (not as ``__main__``, so its ``run_tests()`` does not run),
with ``unittest.skip`` neutralised (op-plugin marks most device tests ``@unittest.skip`` for its
CPU CI; ``unittest.skipIf`` / ``SupportedDevices`` SoC gates stay in force), and its test cases
run with :mod:`unittest`. Per file and SoC the script prints passed / failed / errors / skipped,
then one line per test that did not pass with the first line of its reason; ``--json`` writes
every outcome. The emulator's results for the files of docs/op_plugin_tests.md and the exempt
tests are listed there.

Usage::

    python scripts/run_op_plugin_tests.py --checkout ~/op-plugin [--soc Ascend910B2 Ascend950PR_9599]
        [--json results.json] [--timeout 900] [FILE ...]

``FILE``: paths inside the checkout (default :data:`DEFAULT_FILES`; a default file missing from the
checkout, e.g. ``test_npu_interleave_rope.py`` outside the 7.0.0 branch, is reported as missing).
Exit status: 0 when every test that ran passed, 1 otherwise, 2 for a wrong checkout path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

#: op-plugin test files of the ops ascend_emu emulates (test/ of the op-plugin checkout).
DEFAULT_FILES = (
    "test/test_custom_ops/test_npu_fused_infer_attention_score.py",
    "test/test_custom_ops/test_npu_fused_infer_attention_score_with_workspace.py",
    "test/test_custom_ops/test_npu_fused_infer_attention_score_v2.py",
    "test/test_custom_ops/test_npu_fused_infer_attention_score_v2_with_workspace.py",
    "test/test_custom_ops/test_npu_dynamic_quant.py",
    "test/test_custom_ops/test_npu_dynamic_quant_asymmetric.py",
    "test/test_custom_ops/test_npu_dynamic_mx_quant_with_dual_axis.py",
    "test/test_base_ops/test_dtype_cast.py",
    "test/test_custom_ops/test_npu_gather_pa_kv_cache.py",
    "test/test_custom_ops/test_scatter_pa_kv_cache.py",
    "test/test_custom_ops/test_npu_interleave_rope.py",
    "test/test_custom_ops/test_npu_rotary_mul.py",
    "test/test_custom_ops/test_npu_quant_lightning_indexer.py",
)
#: SoC names run by default: Atlas A2 and an Ascend 950 (ascend_emu.soc).
DEFAULT_SOCS = ("Ascend910B2", "Ascend950PR_9599")
ROOT = Path(__file__).resolve().parents[1]


def child(path: str) -> None:
    """Inside ``ascend-emu run``: import the test file with ``unittest.skip`` neutralised, run
    its tests, print one JSON line ``{"tests": {id: [outcome, reason]}}``."""
    import importlib.util
    import traceback
    import unittest

    unittest.skip = lambda reason: (lambda obj: obj)  # op-plugin's CI skips; SoC gates stay
    outcomes: dict[str, list[str]] = {}
    name = "op_plugin_test_" + Path(path).stem
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    except BaseException:  # noqa: BLE001 - the import failure is the file's result
        print(json.dumps({"import_error": traceback.format_exc(limit=-3)}))
        return

    class Result(unittest.TestResult):
        def _first_line(self, err) -> str:
            text = "".join(traceback.format_exception_only(err[0], err[1])).strip()
            return text.splitlines()[-1][:300] if text else err[0].__name__

        def addSuccess(self, test):  # noqa: N802 - unittest's names
            outcomes[test.id()] = ["passed", ""]

        def addFailure(self, test, err):  # noqa: N802
            outcomes[test.id()] = ["failed", self._first_line(err)]

        def addError(self, test, err):  # noqa: N802
            outcomes[test.id()] = ["error", self._first_line(err)]

        def addSkip(self, test, reason):  # noqa: N802
            outcomes[test.id()] = ["skipped", str(reason)[:300]]

        def addExpectedFailure(self, test, err):  # noqa: N802
            outcomes[test.id()] = ["passed", "expected failure"]

        def addUnexpectedSuccess(self, test):  # noqa: N802
            outcomes[test.id()] = ["failed", "unexpected success"]

    suite.run(Result())
    print(json.dumps({"tests": outcomes}))


def run_file(checkout: Path, rel: str, soc: str, timeout: float) -> dict:
    """One file on one SoC in a fresh ``ascend-emu run`` process: ``{"tests": ...}``,
    ``{"import_error": ...}``, ``{"missing": True}`` or ``{"crash": ...}``."""
    path = checkout / rel
    if not path.is_file():
        return {"missing": True}
    env = {**os.environ, "ASCEND_EMU_SOC_NAME": soc,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    cmd = [sys.executable, "-m", "ascend_emu", "run", str(Path(__file__).resolve()), "--child", str(path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(path.parent), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"crash": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    return {"crash": f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['no output'])[-1][:300]}"}


def summary(result: dict) -> tuple[str, bool]:
    """(one line for a file's result, whether everything that ran passed)."""
    if result.get("missing"):
        return "not in this checkout", True
    if "crash" in result:
        return f"did not run: {result['crash']}", False
    if "import_error" in result:
        return f"import failed: {result['import_error'].strip().splitlines()[-1][:200]}", False
    counts = {k: 0 for k in ("passed", "failed", "error", "skipped")}
    for outcome, _ in result["tests"].values():
        counts[outcome] += 1
    ok = counts["failed"] == counts["error"] == 0
    return (f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
            f"{counts['skipped']} skipped"), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="test files inside the checkout (default: DEFAULT_FILES)")
    parser.add_argument("--checkout", type=Path, help="path of a local op-plugin checkout (git clone)")
    parser.add_argument("--soc", nargs="+", default=list(DEFAULT_SOCS), help="SoC names (ASCEND_EMU_SOC_NAME)")
    parser.add_argument("--json", type=Path, help="write every outcome to this file")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per file and SoC (default 900)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    if args.checkout is None or not (args.checkout / "test").is_dir():
        print(f"--checkout: expected an op-plugin checkout (a directory with test/), got {args.checkout}",
              file=sys.stderr)
        return 2
    everything: dict = {}
    all_ok = True
    for rel in args.files or DEFAULT_FILES:
        for soc in args.soc:
            result = run_file(args.checkout, rel, soc, args.timeout)
            everything.setdefault(rel, {})[soc] = result
            line, ok = summary(result)
            all_ok &= ok
            print(f"{rel} [{soc}]: {line}", flush=True)
            for test, (outcome, reason) in sorted(result.get("tests", {}).items()):
                if outcome in ("failed", "error"):
                    print(f"    {outcome}: {test.split('.', 1)[-1]}: {reason}")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
