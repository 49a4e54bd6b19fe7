"""Where a switch's time went, from `vramswap trace` (docs/observability.md).

A benchmark records the device's trace rings for its whole run (`recording`), then asks what
happened during one job's switch (`breakdown`): its bring-in (grant to memory resident) and
every eviction other processes ran for it while it waited, each with its bytes, its span
relative to the grant, and its rate. The trace's clock is CLOCK_MONOTONIC, Python's
time.monotonic_ns().
"""

import json
import os
import signal
import subprocess
import sys
import tempfile


class recording:
    """`with recording(env) as rec:` records the trace while the block runs; rec.events after."""

    def __init__(self, env):
        self.env = env
        self.events = []
        self.t0_ns = 0
        self.error = None

    def __enter__(self):
        fd, self.path = tempfile.mkstemp(prefix="vramswap-trace-", suffix=".json")
        os.close(fd)
        self.proc = subprocess.Popen([sys.executable, "-m", "vramswap", "trace", "--out", self.path], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        try:
            with open(self.path) as f:
                doc = json.load(f)
            self.t0_ns = doc["otherData"]["t0_ns"]
            self.events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        except (OSError, ValueError, KeyError) as e:
            # The benchmark's numbers stand without the breakdown; say why it is missing.
            self.error = f"vramswap trace gave no trace (exit {self.proc.returncode}: {err.strip() or e})"
        finally:
            os.unlink(self.path)
        return False

    def breakdown(self, pid, granted_before_ns):
        """The last bring-in of `pid` that began by `granted_before_ns`, and the evictions of
        other processes that overlapped it; None when the trace holds no such bring-in."""
        mine = [e for e in self.events if e["pid"] == pid and e["name"] == "bring in"
                and self.t0_ns + e["ts"] * 1e3 <= granted_before_ns]
        if not mine:
            return None
        bring_in = max(mine, key=lambda e: e["ts"])
        start, end = bring_in["ts"], bring_in["ts"] + bring_in["dur"]
        evictions = [{"pid": e["pid"], "bytes": e["args"]["bytes"], "frames": e["args"]["frames"],
                      "from_ms": (e["ts"] - start) / 1e3, "to_ms": (e["ts"] + e["dur"] - start) / 1e3,
                      "gb_per_s": e["args"]["GB_per_s"]}
                     for e in self.events
                     if e["name"] == "evict" and e["pid"] != pid and e["ts"] < end and e["ts"] + e["dur"] > start]
        return {"bytes": bring_in["args"]["bytes"], "ms": bring_in["dur"] / 1e3,
                "gb_per_s": bring_in["args"]["GB_per_s"], "evictions": sorted(evictions, key=lambda e: e["from_ms"])}


def describe(b, name_of):
    """One line: the bring-in, then each overlapping eviction (`name_of(pid)` names its job)."""
    parts = [f"memory in {b['bytes'] / 2**30:.1f} GiB over {b['ms']:.0f} ms ({b['gb_per_s']:.1f} GB/s)"]
    for e in b["evictions"]:
        parts.append(f"{name_of(e['pid'])} evicted {e['bytes'] / 2**30:.1f} GiB ({e['frames']} frames) from "
                     f"{e['from_ms']:+.0f} to {e['to_ms']:+.0f} ms ({e['gb_per_s']:.1f} GB/s)")
    if not b["evictions"]:
        parts.append("no eviction overlapped it")
    return "; ".join(parts)
