"""How to install what an optional feature needs (torch, matplotlib, the real torch_npu): the one
text of each hint, imported wherever a message names it.

PyPI's default torch wheel on Linux x86-64 is the CUDA build (about 0.5 GB plus several GB of
``nvidia-*`` packages, also for ``pip install -e ".[torch]"`` and pinned ``torch==X``); the
emulator runs on the CPU and needs only the CPU wheel, which PyTorch serves from its own index
(:data:`TORCH_CPU_INDEX`). Naming the pinned version and that index in the same command
(:data:`TORCH_CPU_INSTALL`, :data:`TEST_COMMAND`) makes pip take the CPU wheel; naming the index
in one command and the pin in the next does not (the second replaces the CPU wheel by the CUDA
one). Source: pytorch.org "Get Started" (Linux, pip, CPU).
"""

from __future__ import annotations

#: The torch release the test suite is pinned to (the README's test command, ``.ci/run``).
TORCH_VERSION = "2.13.0"
#: PyTorch's index of CPU-only wheels.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: The pinned torch from the CPU index. An *extra* index, so the rest still comes from PyPI; the
#: CPU wheel's version (``2.13.0+cpu``) sorts above PyPI's CUDA ``2.13.0``, so pip takes it. Where
#: the CPU index cannot be reached pip retries it for a few seconds and goes on with the others.
TORCH_CPU_INSTALL = f"pip install torch=={TORCH_VERSION} --extra-index-url {TORCH_CPU_INDEX}"
#: The extras the test suite needs.
TEST_EXTRAS = "torch,test,ray,dev"
#: The README's second command, the one ``.ci/run`` runs: the pinned CPU torch, the package with
#: its test extras, then the suite, in one line.
TEST_COMMAND = (f'pip install torch=={TORCH_VERSION} -e ".[{TEST_EXTRAS}]" --extra-index-url {TORCH_CPU_INDEX}'
                " && python -m pytest -q")
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
                  f"(pip install torch==2.x --extra-index-url {TORCH_CPU_INDEX}), "
                  f"then pip install torch-npu==2.x (matching versions, e.g. torch-npu {TORCH_NPU_VERSION})")
