"""vramswap.status(): `vramswap status --json` as a dict."""

import json
import os
import subprocess
import warnings

from ._launch import binary_path
from ._vramswap import Error


def status(device=None):
    """Who holds each device, who waits, and what every process has where: the output of
    `vramswap status --json` (the bundled CLI, run with this process's environment, so
    VRAMSWAP_SHM_PREFIX and VRAMSWAP_RUNTIME_DIR pick the deployment) parsed into a dict.

    device: a device's number (0, as nvidia-smi numbers the GPUs; N for host-N) or key
    ("host-0", "GPU-<uuid>") for that device alone; None for every device with a pool. The
    dict is schema version 2 of docs/observability.md, sizes in bytes and times in seconds:
    {"version": 2, "devices": [{"key", "index", "server": {"state", "pid", ...}, "pool_bytes",
    "free_bytes", "frames", "holder" (None: nobody; else "pid", "user", "command", "job",
    "held_seconds", ...), "queue" (each waiter's "waiting_seconds" and "behind_pid"),
    "processes": [{"pid", "user", "command", "job", "phase", "resident_bytes", ...}], ...}]};
    "devices" is empty where no device has a pool.

    Raises ValueError for a device that is neither a number nor a string, vramswap.Error when
    the CLI is missing, fails (its message included: an unknown device, a bad VRAMSWAP_*
    setting) or prints no JSON. Devices the CLI skipped (unreadable segments) come as
    RuntimeWarnings.
    """
    if isinstance(device, bool) or (device is not None and not isinstance(device, (int, str))):
        raise ValueError(f"vramswap.status: device must be a device number such as 0 or a key such as 'host-0', not {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"vramswap.status: device must be a device number such as 0 or a key such as 'host-0', not {device!r}")
        device = str(device)
    cli = binary_path("vramswap")
    if not os.path.isfile(cli):
        raise Error(
            f"vramswap.status: the command-line binary {cli} is missing from the installed "
            f"vramswap package; reinstall it (pip install --force-reinstall vramswap)"
        )
    args = [cli, "status", "--json"] + (["--device", device] if device is not None else [])
    try:
        proc = subprocess.run(args, capture_output=True, text=True, check=False)
    except OSError as e:
        raise Error(f"vramswap.status: cannot run {cli}: {e.strerror}; reinstall the vramswap package") from e
    command = " ".join(["vramswap", *args[1:]])
    if proc.returncode != 0:
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
        raise Error(f"vramswap.status: `{command}` {how}: {proc.stderr.strip() or '(no message)'}")
    try:
        report = json.loads(proc.stdout)
    except ValueError as e:
        raise Error(f"vramswap.status: `{command}` printed no valid JSON ({e}); it began {proc.stdout[:200]!r}") from e
    for line in proc.stderr.splitlines():
        if line.strip():
            warnings.warn(f"vramswap.status: {line}", RuntimeWarning, stacklevel=2)
    return report
