"""``ascend-emu replay`` of a multi-step, multi-rank msprobe dump (tests/synthetic_msprobe.py):
the same report and emulator dump in process and on two worker processes, only the corrupted
calls failing, the first divergence named, resume, selection flags, per-call timeout, msprobe's
accuracy-check CSV."""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import shutil
import time

import pytest

from tests.synthetic_msprobe import KV_OP, LI_OP, write_dump

pytest.importorskip("torch")

LAYERS, STEPS, RANKS = 3, 2, 2
#: (step, rank, layer, op) of the corrupted calls; the first in execution order is (0, 1, 1, KV).
CORRUPT = {(0, 1, 1, KV_OP), (1, 0, 2, LI_OP), (1, 1, 0, KV_OP)}


def _key(layer, op):
    return f"NPU.{op}.{layer}.forward"


def _index(layer, op):
    """The call's position in its rank's dump.json: per layer the two ops, then Torch.matmul."""
    return 3 * layer + (0 if op == KV_OP else 1)


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("msprobe") / "dump"
    calls = write_dump(root, layers=LAYERS, steps=STEPS, ranks=RANKS, corrupt=CORRUPT)
    return root, calls


def _replay(capsys, dump_root, out, *extra):
    from ascend_emu.cli import main

    rc = main(["replay", str(dump_root), "-o", str(out), "--json", str(out) + ".json", "--msprobe-csv",
               str(out) + ".acc.csv", *extra])
    text = capsys.readouterr().out
    return rc, json.loads((out.parent / (out.name + ".json")).read_text()), text


@pytest.fixture(scope="module")
def sequential(dump, tmp_path_factory):
    """The in-process run (-n 1), shared by the tests below."""
    from ascend_emu.cli import main

    out = tmp_path_factory.mktemp("seq") / "emu"
    rc = main(["replay", str(dump[0]), "-o", str(out), "-n", "1", "--json", str(out) + ".json",
               "--msprobe-csv", str(out) + ".acc.csv"])
    return rc, out


def _files(root):
    """Every file under root by relative path (dump.json's absolute dump_data_dir left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "dump.json":
                data = json.loads(data)
                assert data.pop("dump_data_dir") == str(p.parent / "dump_tensor_data")
            if p.name == "replay_results.jsonl":  # a log in finishing order
                data = sorted(data.splitlines())
            out[str(p.relative_to(root))] = data
    return out


def test_only_the_corrupted_calls_fail(dump, sequential):
    rc, out = sequential
    rep = json.loads((out.parent / "emu.json").read_text())
    assert rc == 1
    _, calls = dump
    assert [(c["where"]["step"], c["where"]["rank"], c["index"], c["api"]) for c in rep["calls"]] == calls
    failed = {(c["where"]["step"], c["where"]["rank"], c["where"]["layer"], c["op"])
              for c in rep["calls"] if c["status"] != "identical"}
    assert failed == CORRUPT
    assert all(c["status"] == "fail" for c in rep["calls"] if c["status"] != "identical")
    kv = [c for c in rep["calls"] if c["op"] == KV_OP]
    assert all(set(c["not_compared"]) == {"k_embed_out", "y_out"} for c in kv)


def test_first_divergence_and_per_op_table(dump, sequential):
    _, out = sequential
    summary = json.loads((out.parent / "emu.json").read_text())["summary"]
    first = min(CORRUPT)
    assert summary["first_divergence"] == {"step": first[0], "rank": first[1], "call": _index(first[2], first[3]),
                                           "layer": first[2], "op": first[3], "api": _key(first[2], first[3])}
    n = LAYERS * STEPS * RANKS
    corrupt_per_op = {op: sum(c[3] == op for c in CORRUPT) for op in (KV_OP, LI_OP)}
    assert summary["per_op"] == {op: {"identical": n - k, "fail": k} if k else {"identical": n}
                                 for op, k in corrupt_per_op.items()}
    assert summary["selection"] == {"filter": None, "steps": None, "ranks": None, "dedup": False,
                                    "calls": 2 * n}


def test_two_workers_give_the_same_bytes(dump, sequential, tmp_path, capsys):
    rc1, out1 = sequential
    rc2, rep2, _ = _replay(capsys, dump[0], tmp_path / "emu", "-n", "2")
    assert rc2 == rc1 == 1
    for suffix in (".json", ".acc.csv"):
        assert (tmp_path / ("emu" + suffix)).read_bytes() == (out1.parent / ("emu" + suffix)).read_bytes()
    assert _files(tmp_path / "emu") == _files(out1)


def test_the_text_report_names_the_first_divergence_at_the_top(dump, tmp_path, capsys):
    rc, rep, text = _replay(capsys, dump[0], tmp_path / "emu", "-n", "1", "--steps", "0")
    first = min(CORRUPT)
    lines = text.splitlines()
    assert lines[0] == (f"first divergence: step {first[0]}, rank {first[1]}, call {_index(first[2], first[3])} "
                        f"{_key(first[2], first[3])} (layer {first[2]})")
    assert "per op" in text and "selection: steps 0" in text


def test_resume_after_an_interrupted_run(dump, sequential, tmp_path, capsys):
    _, out1 = sequential
    out = tmp_path / "emu"
    shutil.copytree(out1, out)
    results = out / "replay_results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    results.write_text("".join(lines[:7]) + lines[7][:40])  # killed while writing the 8th line
    for f in (out / "step1").rglob("*.pt"):
        f.unlink()  # the emulator's outputs of the calls not judged yet are gone too
    rc, rep, _ = _replay(capsys, dump[0], out, "-n", "1", "--resume")
    assert rc == 1
    assert (tmp_path / "emu.json").read_bytes() == (out1.parent / "emu.json").read_bytes()
    assert _files(out) == _files(out1) | {"replay_results.jsonl": _files(out)["replay_results.jsonl"]}
    resumed = [json.loads(x)["unit"] for x in (out / "replay_results.jsonl").read_text().splitlines()[8:]]
    assert len(resumed) == len(lines) - 7  # the cut line's call is replayed, the others kept


def test_resume_without_a_result_file_is_a_usage_error(dump, tmp_path, capsys):
    from ascend_emu.cli import main

    assert main(["replay", str(dump[0]), "-o", str(tmp_path / "none"), "--resume"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_filter_steps_ranks(dump, tmp_path, capsys):
    rc, rep, _ = _replay(capsys, dump[0], tmp_path / "emu", "-n", "1", "--filter", LI_OP, "--steps", "1",
                         "--ranks", "0")
    assert rc == 1
    assert [(c["where"]["step"], c["where"]["rank"], c["op"]) for c in rep["calls"]] == [(1, 0, LI_OP)] * LAYERS
    assert [c["status"] for c in rep["calls"]] == ["identical", "identical", "fail"]
    assert rep["summary"]["selection"] == {"filter": [LI_OP], "steps": [1], "ranks": [0], "dedup": False,
                                              "calls": LAYERS}
    assert sorted(p.parent.name for p in (tmp_path / "emu").rglob("dump.json")) == ["rank0"]


@pytest.mark.parametrize("args, message", [(["--filter", "npu_nonesuch"], "npu_nonesuch"),
                                           (["--steps", "2-1"], "--steps"), (["-n", "0"], "-n"),
                                           (["--timeout", "0"], "--timeout")])
def test_bad_selection_is_a_usage_error(dump, tmp_path, capsys, args, message):
    from ascend_emu.cli import main

    assert main(["replay", str(dump[0]), "-o", str(tmp_path / "emu"), *args]) == 2
    assert message in capsys.readouterr().err


def test_msprobe_accuracy_csv(dump, sequential):
    _, out = sequential
    rows = list(csv.DictReader(io.StringIO((out.parent / "emu.acc.csv").read_text())))
    from ascend_emu.compare.report import MSPROBE_CSV_COLUMNS

    assert tuple(rows[0]) == MSPROBE_CSV_COLUMNS
    error = {r["API Name"] for r in rows if r["Status"] == "error"}
    # the corrupted outputs: ckv_cache (output 1) of the KV calls, the indices (output 0) of the indexer
    assert error == {f"{_key(layer, op)}.output.{1 if op == KV_OP else 0}" for _, _, layer, op in CORRUPT}
    skip = [r for r in rows if r["Status"] == "SKIP"]
    assert {r["API Name"].rsplit(".", 1)[1] for r in skip} == {"2", "3"}  # k_embed_out, y_out
    assert all("is_output_kv=False" in r["Message"] for r in skip)
    assert all(r["Status"] == "pass" for r in rows if r["Status"] not in ("error", "SKIP"))
    ok = next(r for r in rows if r["Status"] == "pass")
    assert float(ok["Cosine"]) == 1.0 and float(ok["MaxAbsErr"]) == 0.0


def test_a_call_past_the_timeout_is_reported_and_the_run_goes_on(dump, tmp_path, monkeypatch):
    from ascend_emu.compare import msprobe

    real = msprobe.replay

    def slow(call):
        if call.api == _key(1, LI_OP):
            time.sleep(30)
        return real(call)

    monkeypatch.setattr(msprobe, "replay", slow)
    t0 = time.monotonic()
    rep = msprobe.replay_dump(dump[0], tmp_path / "emu", workers=1, timeout=1.0, steps=[0], ranks=[0])
    assert time.monotonic() - t0 < 25
    status = {c.api: c.status for c in rep.calls}
    assert status.pop(_key(1, LI_OP)) == "timeout"
    assert set(status.values()) == {"identical"}
    (late,) = [c for c in rep.calls if c.status == "timeout"]
    assert "timeout of 1 s" in late.reason


def test_process_pool_timeout_and_order():
    """The pool stops an item past the timeout (its worker replaced) and yields every item once."""
    from ascend_emu.workers import ProcessPool, TaskFailure

    got = dict(ProcessPool(2).run(time.sleep, [0.01, 30, 0.01, 0.01], timeout=2.0))
    assert sorted(got) == [0, 1, 2, 3]
    assert isinstance(got[1], TaskFailure) and got[1].kind == "timeout"
    assert [got[i] for i in (0, 2, 3)] == [None] * 3


def test_tensors_are_loaded_per_call_and_only_then(dump, tmp_path, monkeypatch):
    """Planning reads dump.json files only; each call loads its own tensor files, once, while it
    runs (memory bounded by the largest call)."""
    import torch

    from ascend_emu.compare import msprobe

    real_load, real_run = torch.load, msprobe.run_unit
    loaded, running = [], []

    def refuse(*a, **k):
        raise AssertionError("plan_units loaded a tensor")

    monkeypatch.setattr(torch, "load", refuse)
    units, _ = msprobe.plan_units(dump[0], tmp_path / "emu", steps=[0], ranks=[1])
    assert [u.key for u in units] == [_key(layer, op) for layer in range(LAYERS) for op in (KV_OP, LI_OP)]

    def load(path, *a, **k):
        loaded.append((running[-1], pathlib.Path(path).name))
        return real_load(path, *a, **k)

    def run(unit):
        running.append(unit.key)
        return real_run(unit)

    monkeypatch.setattr(torch, "load", load)
    monkeypatch.setattr(msprobe, "run_unit", run)
    msprobe.replay_dump(dump[0], tmp_path / "emu", workers=1, steps=[0], ranks=[1])
    assert running == [u.key for u in units]
    rank_data = dump[0] / "step0" / "rank1" / "dump_tensor_data"
    for key in running:
        mine = sorted(name for k, name in loaded if k == key)
        assert mine and all(name.startswith(key + ".") for name in mine)
        assert mine == sorted(p.name for p in rank_data.glob(key + ".*"))  # each file once


def test_heat_maps_are_written_by_the_calls(dump, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    rc, _, text = _replay(capsys, dump[0], tmp_path / "emu", "-n", "1", "--filter", KV_OP, "--steps", "0",
                          "--png-dir", str(tmp_path / "png"))
    first = min(CORRUPT)
    name = f"step{first[0]}_rank{first[1]}_call{_index(first[2], first[3]):05d}_{KV_OP}_ckv_cache.png"
    assert rc == 1 and sorted(p.name for p in (tmp_path / "png").iterdir()) == [name]
    assert f"wrote {tmp_path / 'png' / name}" in text


def test_dedup_replays_one_call_per_signature(dump, tmp_path, capsys):
    """Every layer's call of an op has the same shapes, dtypes and other arguments: one replay per
    op, the first in execution order; the others name it."""
    rc, rep, text = _replay(capsys, dump[0], tmp_path / "emu", "-n", "1", "--dedup")
    assert rc == 0  # the corrupted calls are not the first of their signature
    replayed = [(c["where"]["step"], c["where"]["rank"], c["api"]) for c in rep["calls"] if c["status"] != "deduplicated"]
    assert replayed == [(0, 0, _key(0, KV_OP)), (0, 0, _key(0, LI_OP))]
    assert all(c["status"] == "identical" for c in rep["calls"] if c["status"] != "deduplicated")
    n = LAYERS * STEPS * RANKS
    assert rep["summary"]["per_op"] == {op: {"identical": 1, "deduplicated": n - 1} for op in (KV_OP, LI_OP)}
    assert rep["summary"]["first_divergence"] is None and rep["summary"]["selection"]["dedup"] is True
    last = rep["calls"][-1]
    assert last["reason"].startswith(f"same signature (shapes, dtypes, other arguments) as step 0, rank 0, call "
                                     f"{_index(0, last['op'])} {_key(0, last['op'])}")
    assert f"dedup: {2 * n - 2} call(s) not replayed" in text
    emu = json.loads((tmp_path / "emu" / "step0" / "rank0" / "dump.json").read_text())
    assert list(emu["data"]) == [_key(0, KV_OP), _key(0, LI_OP)]


def test_progress_counts_the_calls_to_replay(dump, tmp_path):
    from ascend_emu.compare import msprobe

    seen = []
    msprobe.replay_dump(dump[0], tmp_path / "emu", lambda *a: seen.append(a), workers=1, dedup=True)
    assert seen == [(0, 2, 0), (1, 2, 0), (2, 2, 0)]
    seen.clear()
    msprobe.replay_dump(dump[0], tmp_path / "emu2", lambda *a: seen.append(a), workers=1, steps=[0], ranks=[1])
    n = 2 * LAYERS
    failures = [sum(1 for s, r, layer, op in CORRUPT if (s, r) == (0, 1) and 2 * layer + (op == LI_OP) < k)
                for k in range(n + 1)]
    assert seen == [(k, n, failures[k]) for k in range(n + 1)]


def test_export_repro_reproduces_the_emulator_and_runs_on_a_torch_npu(dump, tmp_path, capsys):
    """``--export-repro``: one directory per failing call; its script, run by ``ascend-emu run``,
    returns the emulator's outputs byte for byte and exits 1 naming the output the replay failed;
    the same script runs unchanged under a torch_npu package (the stand-in, as on the NPU)."""
    import runpy
    import subprocess
    import sys

    import torch

    from tests.standin_torch_npu import standin

    repro = tmp_path / "repro"
    rc, rep, _ = _replay(capsys, dump[0], tmp_path / "emu", "-n", "1", "--filter", KV_OP, "--steps", "0",
                         "--export-repro", str(repro))
    step, rank, layer, op = min(CORRUPT)
    name = f"step{step}_rank{rank}_call{_index(layer, op):05d}_{op}"
    assert rc == 1 and [p.name for p in repro.iterdir()] == [name]  # the failing call only
    root = pathlib.Path(__file__).resolve().parent.parent
    expected = ["k_cache: identical to the device's",
                "ckv_cache: 1 of 16384 element(s) differ from the device's (replay: fail)"]
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", "run", "repro.py"], cwd=repro / name,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stdout.splitlines() == expected, proc.stdout + proc.stderr[-3000:]
    capsys.readouterr()
    with standin(), pytest.raises(SystemExit) as exit_:  # a torch_npu package, as on the NPU
        runpy.run_path(str(repro / name / "repro.py"), run_name="__main__")
    assert exit_.value.code == 1 and capsys.readouterr().out.splitlines() == expected
    emu_data = tmp_path / "emu" / f"step{step}" / f"rank{rank}" / "dump_tensor_data"
    key = _key(layer, op)
    for device in ("emu", "npu"):  # the drop-in under ascend-emu run, the stand-in torch_npu
        result = torch.load(repro / name / f"result_{device}.pt", weights_only=True)
        assert len(result) == 4
        for j, t in enumerate(result):
            mine = torch.load(emu_data / f"{key}.output.{j}.pt", weights_only=True)
            assert t.dtype == mine.dtype and torch.equal(t.view(torch.int16), mine.view(torch.int16))


# ------------------------------------------------------------------------------------------ Ray
@pytest.fixture(scope="module")
def ray_session():
    """One local Ray (2 CPUs, no dashboard, workers' logs kept off the test output) for the Ray
    tests of this module, shut down after them. CI installs the [ray] extra: there a missing Ray
    fails instead of skipping."""
    from ascend_emu.workers import init_ray

    if not os.environ.get("CI"):
        pytest.importorskip("ray")
    ray = init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def test_ray_gives_the_same_bytes(dump, sequential, ray_session, tmp_path, capsys):
    """``--ray`` on a local Ray: the report, the CSVs and the emulator's dump are byte-identical to
    the in-process run's (and so to -n 2's)."""
    rc1, out1 = sequential
    rc2, _, _ = _replay(capsys, dump[0], tmp_path / "emu", "--ray")
    assert rc2 == rc1 == 1
    for suffix in (".json", ".acc.csv"):
        assert (tmp_path / ("emu" + suffix)).read_bytes() == (out1.parent / ("emu" + suffix)).read_bytes()
    assert _files(tmp_path / "emu") == _files(out1)
    assert ray_session.is_initialized()  # a Ray the engine did not start is left running


def test_ray_timeouts_and_a_lost_worker(ray_session, tmp_path):
    """A task past the timeout stops itself (Python code) or, stuck where the timer cannot reach
    it, has its worker killed at timeout + grace; a task whose worker dies is retried (a lost
    worker after the last retry is a ``crash``: ``RayEngine._result``); every item is yielded
    once."""
    import signal

    from ascend_emu.workers import RayEngine, TaskFailure

    marker = str(tmp_path / "died-once")

    def work(item):
        if item == "sleep":
            time.sleep(30)
        elif item == "stuck":  # the worker's timer cannot interrupt it
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(30)
        elif item == "die once" and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)
        return item

    t0 = time.monotonic()
    got = dict(RayEngine(grace=1.0).run(work, ["ok", "sleep", "stuck"], timeout=2.0))
    assert time.monotonic() - t0 < 20
    assert sorted(got) == [0, 1, 2] and got[0] == "ok"
    assert isinstance(got[1], TaskFailure) and got[1].kind == "timeout" and "timeout of 2 s" in got[1].message
    assert isinstance(got[2], TaskFailure) and got[2].kind == "timeout" and "Ray worker was stopped" in got[2].message
    # a retry starts a new worker: no timeout here, as it counts from the first submission
    assert list(RayEngine(max_retries=1).run(work, ["die once"], timeout=None)) == [(0, "die once")]
    assert os.path.exists(marker)


def test_ray_missing_names_the_extra(dump, tmp_path, capsys, monkeypatch):
    import importlib.util

    from ascend_emu.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main(["replay", str(dump[0]), "-o", str(tmp_path / "emu"), "--ray"]) == 2
    assert "pip install 'ascend-emu[ray]'" in capsys.readouterr().err


def test_the_core_never_imports_ray():
    import subprocess
    import sys

    code = ("import sys, ascend_emu, ascend_emu.compare.msprobe, ascend_emu.workers, ascend_emu.cli; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=pathlib.Path(__file__).parent.parent, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
