"""The LD_PRELOAD shim (libvramswap_preload.so, docs/oversubscription.md), when the package
has one (it is built only where cuda.h is found).

    LD_PRELOAD=$(python -m vramswap.preload) python train.py    # or $(vramswap-preload-path)
    vramswap.preload.path()                                      # the path, or None
"""

import sys

from ._launch import preload_path as _main
from ._launch import shim_path as path

__all__ = ["path"]

if __name__ == "__main__":
    sys.exit(_main())
