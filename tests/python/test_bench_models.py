"""bench_models.py --interleave: the rows take turns of K steps on the GPU, one at a time, and a
row that dies does not stop the others. Checked with real worker processes that run the
benchmark's own turn-taking (bench_models.Turns) around steps that only record when they ran:
no GPU, so that a broken coordinator shows here and not on the GPU machine's time."""

import json
import os
import sys
import types

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "python")
sys.path.insert(0, os.path.abspath(BENCH))
import bench_models  # noqa: E402

# A worker as bench_models' own: ready once built, then Turns around every step. Its steps
# record (row, step, time) and take a moment, so that two rows running at once would overlap.
WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from bench_models import Turns
row, total, every = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fds = sys.argv[sys.argv.index("--turn-fds") + 1]  # as the coordinator passes it
turns = Turns(fds, every)
if row == "dies-before-ready":
    sys.exit("this row could not build its model")
turns.ready()
ran = []
for i in range(total):
    turns.before_step(i)
    if row == "dies-mid-run" and i == every + 1:
        sys.exit("this row failed in its second turn")
    start = time.monotonic()
    time.sleep(0.002)
    ran.append((row, i, start, time.monotonic()))
    turns.after_step(i, total)
print(json.dumps({"ran": ran}))
"""


def run(rows, warmup, steps, every):
    args = types.SimpleNamespace(warmup=warmup, steps=steps, interleave=every)

    def command(model, mode):
        return [sys.executable, "-c", WORKER, os.path.abspath(BENCH), mode, str(warmup + steps), str(every)]

    return {mode: (rc, out, err) for mode, rc, out, err, _ in bench_models.run_interleaved("m", rows, command, None, args)}


def steps_in_order(results):
    ran = [tuple(s) for rc, out, _ in results.values() if rc == 0 for s in json.loads(out)["ran"]]
    return sorted(ran, key=lambda s: s[2])


def test_rows_take_turns_of_k_steps_one_at_a_time():
    results = run(["plain", "vramswap"], warmup=2, steps=9, every=4)
    assert all(rc == 0 for rc, _, _ in results.values()), results
    ran = steps_in_order(results)
    # Turns of 4 of the 11 steps, alternating: 4 + 4 + 3 per row.
    assert [(row, i) for row, i, _, _ in ran] == (
        [("plain", i) for i in range(0, 4)] + [("vramswap", i) for i in range(0, 4)]
        + [("plain", i) for i in range(4, 8)] + [("vramswap", i) for i in range(4, 8)]
        + [("plain", i) for i in range(8, 11)] + [("vramswap", i) for i in range(8, 11)])
    for a, b in zip(ran, ran[1:]):
        assert a[3] <= b[2], f"{a} and {b} overlap: two rows had the GPU at once"


@pytest.mark.parametrize("failing", ["dies-before-ready", "dies-mid-run"])
def test_a_row_that_dies_leaves_the_others_to_finish(failing):
    results = run(["plain", failing, "vramswap"], warmup=1, steps=7, every=3)
    rc, _, err = results[failing]
    assert rc != 0 and ("failed in its second turn" in err or "could not build" in err), (rc, err)
    for row in ("plain", "vramswap"):
        rc, out, err = results[row]
        assert rc == 0, err
        assert [i for _, i, _, _ in json.loads(out)["ran"]] == list(range(8))
