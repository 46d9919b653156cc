"""The compiled-kernel cache (:mod:`ascend_emu._kernel_cache`) is keyed on the package's sources:
an edit to a helper a kernel inlines from another file recompiles the kernel, the user's
``NUMBA_CACHE_DIR`` is the parent, and every kernel of the package is cached there."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numba
import numpy as np
from numba.core.caching import FunctionCache

import ascend_emu
from ascend_emu import _kernel_cache as kc

# bf16 ulp at 1 is 2**-7: 1 + 0.75 ulp rounds up to 1 + 2**-7 (RNE) and truncates to 1.
_VALUES = (1.0 + 3 * 2.0 ** -9, -3.0 - 3 * 2.0 ** -8, 300.0)

# Runs the small kernel ``_dequant_round_rows`` (emu/mla_preprocess.py), which inlines
# ``f32_bits_to_bf16_bits`` from quant/rounding.py: each value * 1 rounded to bf16, as fp32.
_PROBE = f"""
import json
import numpy as np
import ascend_emu
from ascend_emu._kernel_cache import kernel_cache_dir
from ascend_emu.emu import mla_preprocess as m

k = m._dequant_round_rows
acc = np.array([{list(_VALUES)}], dtype=np.float64)
out = np.empty(acc.shape, dtype=np.float32)
k(0, 1, acc, np.zeros(0, np.int32), np.ones(acc.shape[1], np.float32), np.zeros((0, 1), np.float32), True, out)
print(json.dumps(dict(package=ascend_emu.__file__, cache=str(kernel_cache_dir()), out=out[0].tolist(),
                      hits=sum(k.stats.cache_hits.values()), misses=sum(k.stats.cache_misses.values()))))
"""

# The helper's rounding: round to nearest even -> truncate (u + 0 * lsb), an edit of the same
# length: a cache key built on the files' lengths (or sizes / line counts) alone would miss it.
_RNE = "np.uint16((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16))"
_TRUNCATE = "np.uint16((u + np.uint32(0x0000) * lsb) >> np.uint32(16))"


def _bf16(values) -> list[float]:
    """Reference: fp32 -> bf16 (RNE) -> fp32 by ml_dtypes."""
    return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32).tolist()


def _truncated(values) -> list[float]:
    bits = np.asarray(values, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return bits.view(np.float32).tolist()


def _probe(root: Path, cache_parent: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CACHE")}
    env.update(NUMBA_CACHE_DIR=str(cache_parent), PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_editing_an_inlined_helper_recompiles_the_kernel(tmp_path):
    root, parent = tmp_path / "src", tmp_path / "numba cache"
    shutil.copytree(kc.PACKAGE_DIR, root / "ascend_emu", ignore=shutil.ignore_patterns("__pycache__"))
    assert _bf16(_VALUES) != _truncated(_VALUES)  # the probe tells the two roundings apart

    cold = _probe(root, parent)
    assert Path(cold["package"]).resolve() == (root / "ascend_emu" / "__init__.py").resolve()
    assert cold["out"] == _bf16(_VALUES) and cold["misses"] == 1 and cold["hits"] == 0
    cache = Path(cold["cache"])
    assert cache.parent == parent / "ascend_emu"  # NUMBA_CACHE_DIR is the parent
    assert cache.name.startswith(f"{ascend_emu.__version__}-")
    assert list((cache / "emu").glob("mla_preprocess._dequant_round_rows-*.nbi"))

    warm = _probe(root, parent)
    assert warm == dict(cold, hits=1, misses=0)  # loaded from the cache, not compiled again

    helper = root / "ascend_emu" / "quant" / "rounding.py"
    text = helper.read_text()
    assert text.count(_RNE) == 1 and len(_RNE) == len(_TRUNCATE)
    helper.write_text(text.replace(_RNE, _TRUNCATE))
    assert len(helper.read_bytes()) == len(text.encode())
    edited = _probe(root, parent)
    assert edited["out"] == _truncated(_VALUES) and edited["misses"] == 1 and edited["hits"] == 0
    assert Path(edited["cache"]).parent == parent / "ascend_emu" and edited["cache"] != cold["cache"]


def test_default_parent_is_the_user_cache_dir_then_a_private_temp_dir(tmp_path, monkeypatch):
    resolve = kc.kernel_cache_dir.__wrapped__  # uncached
    key = f"{ascend_emu.__version__}-{kc.source_hash()}"
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve() == tmp_path / "xdg" / "ascend_emu" / key and resolve().is_dir()

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # not a directory: unwritable
    fallback = resolve()
    assert fallback.parent.parent == tmp_path / "tmp" and fallback.name == key and fallback.is_dir()
    assert fallback.parent.name == (f"ascend_emu-{os.getuid()}" if hasattr(os, "getuid") else "ascend_emu")

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba"))
    assert resolve() == tmp_path / "numba" / "ascend_emu" / key


def test_only_files_of_the_package_are_claimed(tmp_path):
    outside = tmp_path / "user_module.py"
    outside.write_text("def f():\n    return 1\n")
    spec = importlib.util.spec_from_file_location("user_module", outside)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert kc.KernelCacheLocator.from_function(mod.f, str(outside)) is None
    assert kc.KernelCacheLocator.from_function(kc.source_hash, kc.__file__) is not None


def test_every_cached_kernel_of_the_package_uses_the_keyed_directory():
    for name in ("ascend_emu.emu", "ascend_emu.ops", "ascend_emu.layouts", "ascend_emu.quant"):
        importlib.import_module(name)
    cached = []
    for name, module in list(sys.modules.items()):
        if name == "ascend_emu" or name.startswith("ascend_emu."):
            for obj in vars(module).values():
                if isinstance(obj, numba.core.dispatcher.Dispatcher) and isinstance(obj._cache, FunctionCache):
                    cached.append(obj)
    assert len({id(k) for k in cached}) >= 50  # (about 80 kernels and helpers)
    for kernel in cached:
        locator = kernel._cache._impl.locator
        assert isinstance(locator, kc.KernelCacheLocator), kernel
        assert Path(locator.get_cache_path()).parent == kc.kernel_cache_dir(), kernel


def _module_path(parts: list[str]) -> Path:
    path = kc.PACKAGE_DIR.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _import_time_nodes(tree: ast.AST):
    """Every node run when the module is imported: function bodies left out (a kernel freezes the
    module globals it reads when it compiles, and those come from import-time code; an import
    inside a plain function feeds no kernel)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.extend(child.decorator_list if not isinstance(child, ast.Lambda) else [])
                continue
            stack.append(child)


def test_hashed_sources_hold_every_kernel_and_everything_they_import():
    hashed = set(kc.source_files())
    package = sorted(kc.PACKAGE_DIR.rglob("*.py"))
    for path in package:
        tree = ast.parse(path.read_text(), str(path))
        rel = list(path.relative_to(kc.PACKAGE_DIR).with_suffix("").parts)
        here = rel[:-1]  # the module's package
        for node in _import_time_nodes(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                    "njit", "jit") and any(kw.arg == "cache" for kw in node.keywords):
                assert path in hashed, f"{path} defines a cached kernel but is not in KERNEL_SOURCES"
            if path not in hashed or not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = here[:len(here) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == "ascend_emu":
                base = node.module.split(".")[1:]
            else:
                continue
            targets = [base + [alias.name] for alias in node.names]
            targets = [t for t in targets if _module_path(t).exists()] or ([base] if base else [])  # (version)
            for target in targets:
                assert _module_path(target) in hashed, f"{path} imports {'.'.join(target)}, not in KERNEL_SOURCES"
