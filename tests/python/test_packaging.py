"""The package's commands and vramswap.status() in the build tree (build/<dir>/python/vramswap,
which holds the same files as the wheel, the binaries as links): `python -m vramswap`,
the launchers' exit codes, and status() as the dict of `vramswap status --json` against a
live host-backend device. tests/wheel checks the same on the installed wheel."""

import os
import subprocess
import sys

import pytest

import vramswap
from vramswap import _launch

PKG = os.path.dirname(vramswap.__file__)


def test_python_m_vramswap_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "vramswap", "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "usage: vramswap status" in r.stdout
    r = subprocess.run([sys.executable, "-m", "vramswap", "status", "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2  # the CLI's usage error, passed through the launcher
    assert "vramswap status: The following argument was not expected: --bogus" in r.stderr


def test_status_without_devices_is_empty():
    assert vramswap.status() == {"version": 2, "devices": []}


def test_status_shows_the_holder_and_this_process():
    ptr = vramswap.malloc(4 << 20)
    try:
        with vramswap.gpu_lock():
            report = vramswap.status()
            assert report["version"] == 2
            (dev,) = report["devices"]
            assert dev["key"] == "host-0" and dev["index"] == 0
            assert dev["server"]["state"] == "running" and dev["server"]["pid"] > 0
            assert dev["holder"]["pid"] == os.getpid()
            assert dev["holder"]["phase"] == "running"
            assert dev["holder"]["held_seconds"] >= 0
            (me,) = [p for p in dev["processes"] if p["pid"] == os.getpid()]
            assert me["holding"] is True and me["resident_bytes"] >= 4 << 20
            # Named by its command line (this interpreter and pytest), and its job name: none.
            assert "py" in me["command"] and "/" not in me["command"].split()[0] and me["job"] is None
            assert isinstance(me["lock_wait_seconds"], float) and "lock_wait_ns" not in me
            (only,) = vramswap.status("host-0")["devices"]
            assert only["key"] == "host-0" and only["holder"]["pid"] == os.getpid()
            (by_number,) = vramswap.status(0)["devices"]
            assert by_number["key"] == "host-0"
        assert vramswap.status("host-0")["devices"][0]["holder"] is None
    finally:
        vramswap.free(ptr)


def test_status_errors_name_what_failed():
    with pytest.raises(vramswap.Error, match=r"`vramswap status --json --device host-9` exited with status 1: .*host-9"):
        vramswap.status("host-9")
    with pytest.raises(vramswap.Error, match=r'exited with status 1: .*no device "7"'):
        vramswap.status(7)
    with pytest.raises(ValueError, match="device must be a device number such as 0 or a key"):
        vramswap.status(1.5)


def test_status_reports_a_bad_setting(monkeypatch):
    monkeypatch.setenv("VRAMSWAP_POOL_SIZE", "lots")
    with pytest.raises(vramswap.Error, match="exited with status 1: .*VRAMSWAP_POOL_SIZE"):
        vramswap.status()


def test_preload_path_matches_the_package():
    shim = os.path.join(PKG, "libvramswap_preload.so")
    r = subprocess.run([sys.executable, "-m", "vramswap.preload"], capture_output=True, text=True)
    if os.path.exists(shim):
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == shim
    else:
        assert r.returncode == 1
        assert "built without the CUDA driver's header cuda.h" in r.stderr


def test_launcher_names_a_missing_binary(tmp_path, monkeypatch):
    monkeypatch.setattr(_launch, "PACKAGE_DIR", str(tmp_path))
    assert _launch.server(["--help"]) == 127
    with pytest.raises(vramswap.Error, match=f"the command-line binary {tmp_path}/vramswap is missing"):
        vramswap.status()
