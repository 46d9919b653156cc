"""The package version, defined once: ``ascend_emu.__version__``, the kernel cache's key, ``ascend-emu
--version`` and the drop-in's ``torch_npu.__version__`` suffix all read it from here (a module with no
imports, so the floors below the package's ``__init__`` can use it)."""

__version__ = "0.1.0"
