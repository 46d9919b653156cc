"""The deterministic mode gives the same bytes on every host (docs/numerics.md#deterministic): a
fixed set of small calls of every op family (tests/test_deterministic.py's ``FAMILY_CALLS``, seeded
inputs) runs in subprocesses under other OpenBLAS kernel families (``OPENBLAS_CORETYPE``) and
thread counts, 1 and 2 Numba threads (with every threaded kernel split, so the parallel variants
run), Numba code generated for a generic x86-64 CPU (``NUMBA_CPU_NAME=generic``, in its own kernel
cache) and NumPy without its AVX-512 code paths (``NPY_DISABLE_CPU_FEATURES``); every output and
every cache written must hash the same in all of them and in this process.

One subprocess per configuration; a configuration whose OpenBLAS kernel this CPU cannot run is left
out (the rest still run). About 25 s with warm kernel caches; the first run compiles the generic
CPU's kernels (about 3 minutes on 2 cores), kept beside the other kernels for later runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
#: CPU flags each forced OpenBLAS kernel family needs (Linux ``/proc/cpuinfo`` names).
CORETYPE_FLAGS = {
    "Haswell": {"avx2", "fma"},
    "SkylakeX": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"},
    "Zen": {"avx2", "fma"},
}


def _digest(value, h) -> None:
    if isinstance(value, np.ndarray):
        h.update(str(value.dtype).encode() + str(value.shape).encode())
        h.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8).tobytes())
    elif isinstance(value, (tuple, list)):
        for v in value:
            _digest(v, h)
    else:
        h.update(repr(value).encode())


#: A product large enough that OpenBLAS's kernel families and thread counts sum it in other orders
#: (``[32, 1024] x [1024, 256]``, 8M multiply-adds: above ``SMALL_PRODUCT_MACS``, so two threads).
ENGINE_SHAPE = (32, 1024, 256)


def engine_hash() -> str:
    """sha256 of :data:`ENGINE_SHAPE`'s product through ``emu.matmul.matmul_f32`` on seeded values."""
    from ascend_emu.emu.matmul import matmul_f32

    m, k, n = ENGINE_SHAPE
    rng = np.random.default_rng(7)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    return hashlib.sha256(matmul_f32(a, b).tobytes()).hexdigest()


def call_hashes(deterministic: bool = True, calls: bool = True) -> dict[str, str]:
    """sha256 of :func:`engine_hash`'s product and (``calls``) of each family call's outputs and
    array arguments after the call (the caches it wrote), in the deterministic mode (or the fast
    one); each call run twice, the second time with every threaded kernel split across threads,
    which must give the same hash (else a ``<name> split`` entry)."""
    from ascend_emu import _deterministic

    with _deterministic.scope(deterministic):  # off: ASCEND_EMU_DETERMINISTIC decides (0 in _run)
        return _hashes(calls)


def _hashes(calls: bool) -> dict[str, str]:
    from ascend_emu import warmup
    from tests.test_deterministic import FAMILY_CALLS

    hashes = {"emu.matmul.matmul_f32 " + "x".join(map(str, ENGINE_SHAPE)): engine_hash()}
    for split in (False, True) if calls else ():
        made = {c.name: c for c in warmup._calls()}  # fresh seeded inputs and caches
        for name in FAMILY_CALLS:
            call = made[name]
            h = hashlib.sha256()
            if split:
                with warmup.split_every_kernel():
                    out = call()
            else:
                out = call()
            _digest(out, h)
            _digest([v for v in (*call.args, *call.kwargs.values()) if isinstance(v, np.ndarray)], h)
            hashes.setdefault(name, h.hexdigest())
            if hashes[name] != h.hexdigest():
                hashes[f"{name} split"] = h.hexdigest()
    return hashes


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _avx512_features() -> str:
    """NumPy's dispatched AVX-512 features by this NumPy's names (``X86_V4`` / ``AVX512_*`` in 2.4,
    ``AVX512F`` / ``AVX512_SKX`` ... before)."""
    from numpy._core import _multiarray_umath as umath

    return " ".join(f for f in umath.__cpu_dispatch__ if "512" in f or f == "X86_V4")


def _generic_cache_parent(tmp: Path) -> Path:
    """Where the ``NUMBA_CPU_NAME=generic`` kernels are cached, kept between runs (compiling them
    takes minutes, loading them seconds): beside the other kernels (``NUMBA_CACHE_DIR``, else
    ``$XDG_CACHE_HOME`` or ``~/.cache``), or ``tmp`` where that is not writable."""
    parent = Path(os.environ.get("NUMBA_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
                  or Path.home() / ".cache")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return tmp
    return parent if os.access(parent, os.W_OK) else tmp


def configurations(tmp: Path) -> dict[str, dict[str, str]]:
    flags = _cpu_flags()
    generic_cache = _generic_cache_parent(tmp) / "numba-cpu-generic"
    configs = {}
    for core, threads in (("Haswell", "1"), ("SkylakeX", "2"), ("Zen", "2")):
        if flags and not CORETYPE_FLAGS[core] <= flags:
            continue  # this CPU cannot run the family's kernels
        configs[f"OpenBLAS {core}, {threads} BLAS thread(s), {threads} Numba thread(s)"] = {
            "OPENBLAS_CORETYPE": core, "OPENBLAS_NUM_THREADS": threads, "NUMBA_NUM_THREADS": threads}
    configs["NUMBA_CPU_NAME=generic, NumPy without AVX-512"] = {
        "NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(generic_cache),
        "NPY_DISABLE_CPU_FEATURES": _avx512_features(), "OPENBLAS_NUM_THREADS": "2", "NUMBA_NUM_THREADS": "2"}
    return configs


def _run(env_changes: dict[str, str], deterministic: bool = True, calls: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env.update(env_changes)
    env["ASCEND_EMU_DETERMINISTIC"] = "1" if deterministic else "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    code = ("import json; from tests.test_deterministic_hosts import call_hashes; "
            f"print('HASHES ' + json.dumps(call_hashes({deterministic}, {calls})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, f"{env_changes}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("HASHES ")][-1]
    return json.loads(line[len("HASHES "):])


def test_same_bytes_on_every_configuration(tmp_path):
    here = call_hashes()
    assert not [k for k in here if k.endswith(" split")], f"split kernels changed bytes: {here}"
    configs = configurations(tmp_path)
    if len(configs) < 2:
        pytest.skip("this CPU runs none of the forced OpenBLAS kernel families")
    for label, changes in configs.items():
        got = _run(changes)
        differ = sorted(k for k in set(got) | set(here) if got.get(k) != here.get(k))
        assert not differ, f"{label}: other bytes than this process for {differ}"


def test_the_fast_path_moves_with_the_blas_kernel_family():
    """The harness can see a difference: in the fast mode the engine's product differs between two
    OpenBLAS kernel families or thread counts (the measured behaviour the mode removes)."""
    flags = _cpu_flags()
    if not CORETYPE_FLAGS["SkylakeX"] <= flags:
        pytest.skip("this CPU cannot run OpenBLAS's SkylakeX kernels")
    one = _run({"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"}, deterministic=False, calls=False)
    two = _run({"OPENBLAS_CORETYPE": "SkylakeX", "OPENBLAS_NUM_THREADS": "2"}, deterministic=False, calls=False)
    assert one != two
