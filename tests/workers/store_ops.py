"""Test worker (needs torch): drives the store at MASTER_ADDR:MASTER_PORT with torch's own
TCPStore client through every operation that client exposes.

Usage: store_ops.py OUTDIR   (2 workers)

Both ranks connect as clients (is_master=False), as torch does under
TORCHELASTIC_USE_AGENT_STORE=True. Rank 0 runs the single-client checks, then the two ranks
check wake-ups across connections (wait, blocking queue_pop, barrier). Each rank writes
OUTDIR/ops_<RANK>.json with the operations checked, and exits 1 on the first mismatch.
"""

import datetime
import json
import os
import sys
import time

import torch.distributed as dist

T = datetime.timedelta


def expect(done, name, got, want):
    if got != want:
        raise AssertionError(f"{name}: got {got!r}, want {want!r}")
    done.append(name)


def expect_raises(done, name, exc, fn):
    try:
        fn()
    except exc:
        done.append(name)
        return
    raise AssertionError(f"{name}: no {exc.__name__}")


def single_client(s, done):
    s.set("k", b"v1")
    expect(done, "set+get", s.get("k"), b"v1")
    expect(done, "add", s.add("n", 5), 5)
    expect(done, "add again", s.add("n", -2), 3)
    expect(done, "compare_set match", s.compare_set("k", b"v1", b"v2"), b"v2")
    expect(done, "compare_set mismatch", s.compare_set("k", b"zz", b"v3"), b"v2")
    expect(done, "compare_set create", s.compare_set("new", b"", b"c"), b"c")
    expect(done, "check present", s.check(["k", "n"]), True)
    expect(done, "check missing", s.check(["k", "absent"]), False)
    s.wait(["k", "n"])
    done.append("wait present")
    # Times out client-side, which sends cancel_wait and expects WAIT_CANCELED.
    expect_raises(done, "wait timeout + cancel_wait", dist.DistStoreError,
                  lambda: s.wait(["absent"], T(milliseconds=300)))
    expect(done, "still usable after cancel", s.get("k"), b"v2")
    expect(done, "num_keys", s.num_keys(), 3)
    expect(done, "delete_key", s.delete_key("new"), True)
    expect(done, "delete_key absent", s.delete_key("new"), False)
    s.append("k", b"+x")
    s.append("fresh", b"a")
    expect(done, "append", s.get("k"), b"v2+x")
    expect(done, "append creates", s.get("fresh"), b"a")
    s.multi_set(["m1", "m2"], [b"1", b"2"])
    expect(done, "multi_set+multi_get", s.multi_get(["m1", "m2", "k"]), [b"1", b"2", b"v2+x"])
    expect(done, "list_keys", sorted(s.list_keys()), sorted(["k", "n", "fresh", "m1", "m2"]))
    s.queue_push("q", b"a")
    s.queue_push("q", b"b")
    expect(done, "queue_len", s.queue_len("q"), 2)
    expect(done, "queue_pop order", [s.queue_pop("q"), s.queue_pop("q", block=False)], [b"a", b"b"])
    expect_raises(done, "queue_pop empty", dist.QueueEmptyError,
                  lambda: s.queue_pop("q", block=False))
    s.barrier("solo", 1)
    done.append("barrier of one")
    c = s.clone()
    expect(done, "clone", c.get("k"), b"v2+x")
    expect_raises(done, "add on text", Exception, lambda: dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
        timeout=T(seconds=10)).add("k", 1))


def main():
    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False, timeout=T(seconds=30))
    done = []
    if rank == 0:
        single_client(s, done)
        s.set("x/ready", b"1")
        time.sleep(0.3)
        s.set("x/late", b"L")          # rank 1 is blocked in wait() on it
        time.sleep(0.3)
        s.queue_push("x/q", b"item")   # rank 1 is blocked in queue_pop() on it
    else:
        s.wait(["x/ready"])
        expect(done, "wait woken by another client", s.get("x/late"), b"L")
        expect(done, "blocking queue_pop woken by a push", s.queue_pop("x/q"), b"item")
    s.barrier("x/bar", 2)
    done.append("barrier of two")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"ops_{rank}.json"), "w") as f:
        json.dump({"rank": rank, "checked": done}, f)


if __name__ == "__main__":
    main()
