"""The console scripts of the package (pyproject.toml, [project.scripts]) and `python -m
vramswap`: `vramswap` and `vramswapd` exec the binaries the wheel carries beside this file,
`vramswap-preload-path` prints where the LD_PRELOAD shim is.

The binaries live in the package directory rather than on PATH because the session finds
vramswapd next to the module that carries its code (pool/pool_connection.cpp); the
launchers replace themselves with them (os.execv), so the binary gets this process's pid,
its exit status is the command's and signals reach it directly.
"""

import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SHIM_NAME = "libvramswap_preload.so"


def binary_path(name):
    """The path of the bundled binary `name` ("vramswap", "vramswapd")."""
    return os.path.join(PACKAGE_DIR, name)


def _exec(name, args):
    path = binary_path(name)
    if not os.path.isfile(path):
        sys.stderr.write(
            f"{name}: the binary {path} is missing from the installed vramswap package; "
            f"reinstall it (pip install --force-reinstall vramswap)\n"
        )
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, [path, *args])
    except OSError as e:
        sys.stderr.write(f"{name}: cannot run {path}: {e.strerror}; reinstall the vramswap package\n")
        return 126


def cli(args=None):
    """`vramswap` (and `python -m vramswap`): the command line, status and trace."""
    return _exec("vramswap", sys.argv[1:] if args is None else args)


def server(args=None):
    """`vramswapd`: the pool server (sessions start it on demand; this is for running it
    yourself, under systemd or by hand)."""
    return _exec("vramswapd", sys.argv[1:] if args is None else args)


def shim_path():
    """The LD_PRELOAD shim's path, or None when this package was built without it."""
    path = os.path.join(PACKAGE_DIR, SHIM_NAME)
    return path if os.path.isfile(path) else None


def preload_path(args=None):
    """`vramswap-preload-path` (and `python -m vramswap.preload`): print the shim's path, for
    LD_PRELOAD=$(vramswap-preload-path) program ...; exit 1, saying why, where there is none."""
    args = sys.argv[1:] if args is None else args
    if args:
        asked = args[0] in ("-h", "--help")
        (sys.stdout if asked else sys.stderr).write(
            "usage: vramswap-preload-path\n"
            "prints the path of libvramswap_preload.so, for LD_PRELOAD=$(vramswap-preload-path) program ...\n"
        )
        return 0 if asked else 2
    path = shim_path()
    if path is None:
        sys.stderr.write(
            f"vramswap-preload-path: this vramswap package has no LD_PRELOAD shim ({SHIM_NAME} "
            f"is not in {PACKAGE_DIR}): it was built without the CUDA driver's header cuda.h. "
            f"Build the wheel on a machine with the CUDA toolkit's headers "
            f"(/usr/local/cuda/include/cuda.h) to get it.\n"
        )
        return 1
    print(path)
    return 0
