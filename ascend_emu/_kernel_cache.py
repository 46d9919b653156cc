"""Where the compiled Numba kernels are cached: a directory keyed on this package's own sources.

Why: Numba checks a cached kernel only against the source file of the kernel itself, but the
kernels inline helpers and freeze constants from other modules (``emu.kernels``,
``quant.rounding``, ``ops.*``, ``mla``). An edit there, or an in-place upgrade that leaves the old
``.nbi`` / ``.nbc`` files behind, would load stale machine code. So every kernel of this package is
cached under a directory named after the package version and a hash of all the sources the kernels
are built from (:data:`KERNEL_SOURCES`): any change to them selects a new, empty directory and the
next run recompiles. Hashing them takes about a millisecond, once per process.

Where (:func:`kernel_cache_dir`): ``<parent>/ascend_emu/<version>-<hash>/<sub-package>/``, the
parent being ``NUMBA_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME`` (default ``~/.cache``); when
that is not writable, ``<temp dir>/ascend_emu-<uid>`` replaces ``<parent>/ascend_emu``. The
directories of other versions and sources are left in place (several checkouts or versions may
share the parent; pruning would make them evict each other): delete ``<parent>/ascend_emu`` to
clear them all.

Only this package's functions are affected: :class:`KernelCacheLocator` sits at the front of
Numba's locator list and claims only files inside this package; every other function is cached
where Numba puts it (a ``NUMBA_CACHE_LOCATOR_CLASSES`` you set replaces the list, this locator
included). Each sub-package that defines kernels imports this module before any kernel.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path

from numba.core import caching, config

from ._version import __version__

#: The package directory (symlinks resolved).
PACKAGE_DIR = Path(__file__).resolve().parent

#: What the compiled kernels are built from, relative to :data:`PACKAGE_DIR`: the sub-packages that
#: define kernels or the helpers and constants they use (every ``.py`` file in them), and the
#: top-level modules those import (``_version.py`` gives the version, which is in the key anyway).
#: ``tests/test_kernel_cache.py`` checks that this holds every cached kernel and is closed under the
#: imports.
KERNEL_SOURCES = ("emu", "layouts", "quant", "ops", "_env.py", "_kernel_cache.py", "_threads.py", "checked_mode.py", "errors.py", "mla.py",
                  "soc.py", "_version.py", "_deterministic.py", "input_contracts.py")


def source_files() -> list[Path]:
    """Every file of :data:`KERNEL_SOURCES`, in a fixed order."""
    files = []
    for name in KERNEL_SOURCES:
        path = PACKAGE_DIR / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def source_hash() -> str:
    """The first 16 hex digits of the SHA-256 of :func:`source_files` (their paths and bytes)."""
    h = hashlib.sha256()
    for path in source_files():
        data = path.read_bytes()
        h.update(f"{path.relative_to(PACKAGE_DIR).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def _roots() -> list[tuple[Path, bool]]:
    """Candidate ``ascend_emu`` cache folders, in order, each with whether it must be ours."""
    if config.CACHE_DIR:
        parent = Path(config.CACHE_DIR).expanduser()
    else:
        parent = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    uid = f"-{os.getuid()}" if hasattr(os, "getuid") else ""  # (Windows: the temp dir is per user)
    return [(parent / "ascend_emu", False), (Path(tempfile.gettempdir()) / f"ascend_emu{uid}", True)]


def _usable(root: Path, key: str, own: bool) -> bool:
    try:
        (root / key).mkdir(parents=True, exist_ok=True)
        if own and hasattr(os, "getuid") and root.stat().st_uid != os.getuid():
            return False  # a shared temp dir: never load code from a folder someone else made
        tempfile.TemporaryFile(dir=root / key).close()
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=None)
def kernel_cache_dir() -> Path:
    """The directory this process caches its compiled kernels in (module doc), created.

    ``<root>/<version>-<source hash>`` where ``<root>`` is ``<parent>/ascend_emu`` (parent:
    ``NUMBA_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or ``~/.cache``), or ``<temp dir>/ascend_emu-<uid>``
    when that is not writable; deleting ``kernel_cache_dir().parent`` clears every version's kernels.
    Resolved once per process, when the first kernel is defined. Raises nothing: when no candidate
    is writable it returns the first one, and Numba's own locators then cache the kernels.
    """
    key = f"{__version__}-{source_hash()}"
    roots = _roots()
    for root, own in roots:
        if _usable(root, key, own):
            return root / key
    return roots[0][0] / key


class KernelCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Numba cache locator for the functions defined in this package: ``kernel_cache_dir() /
    <sub-package>`` (module doc). Declines every other file."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(kernel_cache_dir() / Path(py_file).resolve().parent.relative_to(PACKAGE_DIR))

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        if not Path(py_file).resolve().is_relative_to(PACKAGE_DIR):
            return None
        return super().from_function(py_func, py_file)


_locators = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # older Numba: _CacheImpl
if KernelCacheLocator not in _locators._locator_classes:
    _locators._locator_classes.insert(0, KernelCacheLocator)
