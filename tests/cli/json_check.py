#!/usr/bin/env python3
"""Checks for tests/cli/cli_test.cpp (the C++ side has no JSON parser).

  json_check.py flatten FILE      print every leaf as path=value, one per line
                                  (devices.0.holder.pid=123); exit 1 when FILE is not JSON
  json_check.py trace FILE PID... check a `vramswap trace` file: valid JSON with traceEvents;
                                  for each PID, on its lock track: "acquire asked", "granted",
                                  "released" repeat in that order with growing timestamps; each
                                  "bring in" starts at a grant; every X event has a duration.
                                  Prints per-pid counts ("PID asked=N granted=N released=N
                                  bring_in=N evict=N evict_bytes=N"); exit 1 with the reason
"""
import json
import sys


def flatten(path, value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{path}.{k}" if path else k, v, out)
    elif isinstance(value, list):
        out.append(f"{path}.#={len(value)}")
        for i, v in enumerate(value):
            flatten(f"{path}.{i}", v, out)
    else:
        out.append(f"{path}={json.dumps(value) if isinstance(value, str) else value}")


def check_trace(doc, pids):
    events = doc["traceEvents"]
    for e in events:
        for key in ("name", "ph", "pid"):
            if key not in e:
                raise ValueError(f"event without {key}: {e}")
        if e["ph"] == "X" and ("dur" not in e or e["dur"] < 0):
            raise ValueError(f"complete event without a duration: {e}")
    for pid in pids:
        mine = [e for e in events if e["pid"] == pid and e["ph"] in ("X", "i")]
        if not mine:
            raise ValueError(f"no event of pid {pid}")
        lock = sorted((e for e in mine if e["name"] in ("acquire asked", "granted", "released")), key=lambda e: e["ts"])
        expect = ["acquire asked", "granted", "released"]
        for i, e in enumerate(lock):
            if e["name"] != expect[i % 3]:
                got = [x["name"] for x in lock]
                raise ValueError(f"pid {pid}: lock events out of order at {i}: {got}")
        grants = {round(e["ts"], 3) for e in lock if e["name"] == "granted"}
        bring_in = [e for e in mine if e["name"] == "bring in"]
        for b in bring_in:
            if round(b["ts"], 3) not in grants:
                raise ValueError(f"pid {pid}: bring in at {b['ts']} starts at no grant {sorted(grants)}")
        evict = [e for e in mine if e["name"] == "evict"]
        count = lambda n: sum(1 for e in lock if e["name"] == n)
        print(f"{pid} asked={count('acquire asked')} granted={count('granted')} released={count('released')} "
              f"bring_in={len(bring_in)} evict={len(evict)} evict_bytes={sum(e['args']['bytes'] for e in evict)} "
              f"bring_in_bytes={sum(e['args']['bytes'] for e in bring_in)}")


def main():
    mode, path = sys.argv[1], sys.argv[2]
    try:
        with open(path) as f:
            doc = json.load(f)
        if mode == "flatten":
            out = []
            flatten("", doc, out)
            print("\n".join(out))
        elif mode == "trace":
            check_trace(doc, [int(p) for p in sys.argv[3:]])
        else:
            raise ValueError(f"unknown mode {mode}")
    except (ValueError, KeyError, TypeError) as e:
        print(f"json_check: {path}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
