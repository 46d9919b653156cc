"""``python -m ascend_emu``: the ``ascend-emu`` command line (see :mod:`ascend_emu.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
