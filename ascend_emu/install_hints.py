"""How to install what an optional feature needs (torch, matplotlib, the real torch_npu): the one
text of each hint, imported wherever a message names it.

PyPI's default torch wheel on Linux x86-64 is the CUDA build (about 0.5 GB plus several GB of
``nvidia-*`` packages, also for ``pip install -e ".[torch]"`` and pinned ``torch==X``); the
emulator runs on the CPU and needs only the CPU wheel, which PyTorch serves from its own index
(:data:`TORCH_CPU_INDEX`). Installing that wheel first makes the ``[torch]`` extra (``torch>=2.1``)
already satisfied, so pip adds nothing from CUDA. Source: pytorch.org "Get Started" (Linux, pip,
CPU).
"""

from __future__ import annotations

#: PyTorch's index of CPU-only wheels.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: The command that installs the CPU-only torch wheel (add ``==X.Y.Z`` after ``torch`` to pin it).
TORCH_CPU_INSTALL = f"pip install torch --index-url {TORCH_CPU_INDEX}"
#: How to get torch when it is missing (then the ``[torch]`` extra of this package adds nothing).
TORCH_HINT = (f"install the CPU-only wheel: {TORCH_CPU_INSTALL}   (PyPI's default torch on Linux is the "
              'CUDA build, GBs of packages; then pip install -e ".[torch]" adds nothing more)')

#: How to get Ray when ``ascend-emu replay --ray`` needs it: the ``[ray]`` extra.
RAY_HINT = "pip install 'ascend-emu[ray]'   (or: pip install 'ray>=2.9')"

#: How to get matplotlib when it is missing (PNG output).
PLOT_HINT = 'install it with:  pip install -e ".[plot]"   (or: pip install matplotlib)'

#: The torch_npu release whose API the drop-in emulates (its schemas are read from that wheel,
#: :mod:`ascend_emu.torch_npu.schemas`): the drop-in's ``torch_npu.__version__`` and the version
#: the hw backend's hint names. Defined here, not in the drop-in, so that messages can name it
#: without importing torch.
TORCH_NPU_VERSION = "2.14.0"
#: How to get the real torch_npu (the hw backend, ``ascend-emu record / compare``): torch_npu runs
#: on top of the CPU torch wheel of the matching version (Ascend's install guide), never the CUDA one.
TORCH_NPU_HINT = ("on an Atlas A2 / A3 machine with CANN installed (source .../ascend-toolkit/set_env.sh): "
                  "the CPU-only torch wheel of torch_npu's version "
                  f"(pip install torch==2.x --index-url {TORCH_CPU_INDEX}), "
                  f"then pip install torch-npu==2.x (matching versions, e.g. torch-npu {TORCH_NPU_VERSION})")
