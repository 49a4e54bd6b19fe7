"""python -m vramswap: the `vramswap` command line (status, trace)."""

import sys

from ._launch import cli

sys.exit(cli())
