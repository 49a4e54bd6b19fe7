"""A private vramswap deployment per test: its own segment prefix, socket directory, a small
host-backend device and pool; at the end this process's sessions are closed and the pool
servers the test started are stopped.

The backend reads VRAMSWAP_BACKEND / VRAMSWAP_HOST_DEVICES / VRAMSWAP_HOST_DEVICE_MEMORY
once per process, so they are set here, at import, before vramswap is first used.
"""

import os
import shutil
import tempfile

import pytest

os.environ["VRAMSWAP_BACKEND"] = "host"
os.environ["VRAMSWAP_HOST_DEVICES"] = "2"
os.environ["VRAMSWAP_HOST_DEVICE_MEMORY"] = "256MiB"
os.environ.setdefault("VRAMSWAP_LOG", "warn")

import vramswap  # noqa: E402

_counter = 0


@pytest.fixture(autouse=True)
def deployment():
    global _counter
    _counter += 1
    runtime_dir = tempfile.mkdtemp(prefix="vramswap-pytest-")
    env = {
        "VRAMSWAP_SHM_PREFIX": f"vsp{os.getpid()}x{_counter}-",
        "VRAMSWAP_RUNTIME_DIR": runtime_dir,
        "VRAMSWAP_FRAME_SIZE": "2MiB",
        "VRAMSWAP_POOL_SIZE": "64MiB",
        "VRAMSWAP_POOL_IDLE_EXIT": "5",
        "VRAMSWAP_SWAP_DIR": "/var/tmp",
    }
    # The server binary: given by the build (ctest, scripts/test.sh), else found next to
    # libvramswap (an installed package).
    if os.environ.get("VRAMSWAP_TEST_SERVER"):
        env["VRAMSWAP_SERVER"] = os.environ["VRAMSWAP_TEST_SERVER"]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    vramswap._testing.reread_options()  # the library reads the environment once per process
    try:
        yield env
    finally:
        vramswap._testing.reset()
        for device in (0, 1):
            vramswap._testing.stop_pool_server(device)
        shutil.rmtree(runtime_dir, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        vramswap._testing.reread_options()
