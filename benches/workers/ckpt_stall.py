"""Benchmark worker (benches/ckpt.rs part 4): the training's stall per save through drun, against
``torch.save`` + fsync to ``--ckpt-dir`` in the same worker, and the training steps' time while
the agent persists a staged step behind them against steps with nothing persisting.

Arguments: MB per rank, SAVES, HOW (``atomic``: ``drun.atomic_save`` + ``drun.commit``;
``dcp``: ``drun.dcp.save`` with gloo). Rank 0 prints one JSON line. Without torch the state is
raw bytes (``dcp`` exits at once) and no steps are timed. ``copy`` is the floor of a save that
copies the state once: the time to copy its bytes through a buffer already in memory (a quarter
of the state at a time, so as not to hold a second copy), measured before each save (none for
raw bytes); ``cpu`` the CPU time the training's thread spent in the save (its wall time less
the waits: for the CPU on a loaded machine, for the other ranks in the commit); ``persist_cpu``
the CPU time of the agent's persister thread (``drun-persist``, read from ``/proc``) and
``kernel_cpu`` that of the kernel's worker threads (writeback, journal, soft interrupts) while
the ranks' steps were timed beside the persistence, in seconds per save; ``early_mean`` and
``late_mean`` the busy steps' mean within the first 5 s after a save returned and after,
``steady_mean`` the busy steps' mean from the third save on (by then each rank's spare is a
released step's file: :mod:`drun._stage`, ``launcher/src/ckpt/memory/spare.rs``), and
``lost_per_save`` the training time the busy steps took beyond the quiet steps' mean, per save;
``longest_busy`` and ``longest_quiet`` this rank's longest step while persisting and with nothing
persisting (a training stopped after a save returned shows there, not in the save's stall);
``ranks`` each rank's ``busy_mean`` and ``quiet_mean`` (the persister runs on one core at a time:
the rank beside it loses more). The quiet steps are timed before the first save and for at least
5 s after each step was persisted, so that the baseline brackets the busy steps and a few
seconds of a shared machine's noise move it no more than them. With ``DRUN_BENCH_TRACE=PREFIX``
each rank writes every step to ``PREFIX.<rank>`` (``<save> <seconds since it returned>
<step seconds>``; quiet steps as ``q<save>``, ``q0`` before the first).
The node's ranks start each drun save together (a file barrier), as a training's collectives
keep them: the stall is the save's, not the time one rank's commit waits for a rank that was
still finishing its ``torch.save`` + fsync baseline."""

import json
import os
import sys
import time
from typing import Tuple

sys.path.insert(0, os.environ["DRUN_BENCH_HELPER"])
import drun  # noqa: E402

mb, saves, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
try:
    import torch
    torch.set_num_threads(1)  # one core per rank, as a training that keeps the node busy
    state = {"w": torch.randn(mb * (1 << 18))}
    quarter = torch.empty(state["w"].numel() // 4)
    quarter.zero_()

    def copy_floor() -> float:
        t = time.perf_counter()
        for part in state["w"].chunk(4):
            quarter[:part.numel()].copy_(part)
        return time.perf_counter() - t
    dump, kind = (lambda f: torch.save(state, f)), "torch.save"
    a = torch.randn(384, 384)
    sync = os.environ.get("DRUN_BENCH_SYNC", "1") != "0"
    if sync or how == "dcp":
        import torch.distributed as dist
        dist.init_process_group("gloo")
    flag = torch.zeros(1)

    def step(stop: bool) -> Tuple[float, bool]:
        """One training step, and whether to stop after it: ``stop`` of this rank, or with the
        ranks in step (``DRUN_BENCH_SYNC``, the default), of any rank: the all-reduce that
        keeps them together, as DDP's gradient all-reduce does, carries it."""
        t = time.perf_counter()
        for _ in range(8):
            a.copy_(torch.tanh(a @ a) * 0.5)
        if sync:
            flag.fill_(1.0 if stop else 0.0)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        return time.perf_counter() - t, stop
except ImportError:
    if how == "dcp":
        sys.exit(0)
    blob = os.urandom(mb << 20)
    dump, kind, step = (lambda f: f.write(blob)), "bytes", None

    copy_floor = None
if how == "dcp":
    import drun.dcp
rank, gen = int(os.environ["RANK"]), int(os.environ["DRUN_GENERATION"])


def barrier(tag: str) -> None:
    """Waits (up to 60 s) until every local rank reached ``tag``."""
    d = os.environ["DRUN_CKPT_DIR"]
    mine = os.path.join(d, "barrier-%s-%d" % (tag, rank))
    open(mine, "w").close()
    world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    names = [os.path.join(d, "barrier-%s-%d" % (tag, r)) for r in range(world)]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(n) for n in names) and time.monotonic() < deadline:
        time.sleep(0.0005)


def thread_cpu(pred) -> float:
    """CPU seconds (user + system) of the threads whose /proc stat matches ``pred(pid, comm)``."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for tid in os.listdir("/proc/%s/task" % pid):
                with open("/proc/%s/task/%s/stat" % (pid, tid)) as f:
                    st = f.read()
                comm = st[st.index("(") + 1:st.rindex(")")]
                if pred(int(pid), comm):
                    cols = st[st.rindex(")") + 2:].split()
                    total += (int(cols[11]) + int(cols[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            continue
    return total


def persister_cpu() -> float:
    return thread_cpu(lambda pid, comm: comm == "drun-persist")


def kernel_cpu() -> float:
    return thread_cpu(lambda pid, comm: comm.startswith(("kworker", "jbd2", "ksoftirqd")))


trace = open("%s.%d" % (os.environ["DRUN_BENCH_TRACE"], rank), "w") \
    if os.environ.get("DRUN_BENCH_TRACE") else None
persist_cpu, kernel = [], []
base, ours, lag, busy, quiet, floor, cpu = [], [], [], [], [], [], []
# Whether each busy step ended within EARLY seconds of its save's return (the rank's spare
# staging file is allocated then, and the agent frees the step the save released).
early: list = []
EARLY = 5.0
# Which save each busy step followed.
after: list = []
QUIET = 5.0


def quiet_steps(s: int) -> None:
    """The steps with nothing persisting: at least 10, for at least QUIET seconds."""
    began, n, stop = time.perf_counter(), 0, step is None
    while not stop:
        d, stop = step(n >= 10 and time.perf_counter() - began >= QUIET)
        quiet.append(d)
        n += 1
        if trace is not None:
            trace.write("q%d %.4f %.6f\n" % (s, time.perf_counter() - began, d))


quiet_steps(0)
for s in range(1, saves + 1):
    p = os.path.join(os.environ["DRUN_CKPT_DIR"], "baseline-%d.pt" % rank)
    t = time.perf_counter()
    with open(p, "wb") as f:
        dump(f)
        f.flush()
        os.fsync(f.fileno())
    base.append(time.perf_counter() - t)
    os.unlink(p)
    if copy_floor is not None:
        floor.append(copy_floor())
    path = drun.shard_path(s)
    barrier("save-%d" % s)
    t, c = time.perf_counter(), time.thread_time()
    if how == "dcp":
        drun.dcp.save(state, s)
    else:
        drun.atomic_save(path, dump)
        drun.commit(s, [path])
    done = time.perf_counter()
    ours.append(done - t)
    cpu.append(time.thread_time() - c)
    manifest = os.path.join(os.path.dirname(path), "drun-manifest-%d-%d.json" % (s, gen))
    cpu_before = (persister_cpu(), kernel_cpu()) if rank == 0 else None
    # Training steps while the agent persists the staged step (none when it is already on disk).
    # A step begun once the manifest is there ran with nothing persisting: not counted.
    while True:
        over = os.path.exists(manifest) or time.perf_counter() - done >= 300
        if step is None:
            if over:
                break
            time.sleep(0.005)
            continue
        d, stop = step(over)
        if stop:
            break
        busy.append(d)
        early.append(time.perf_counter() - done < EARLY)
        after.append(s)
        if trace is not None:
            trace.write("%d %.4f %.6f\n" % (s, time.perf_counter() - done, d))
    lag.append(time.perf_counter() - done)
    if cpu_before is not None:
        persist_cpu.append(persister_cpu() - cpu_before[0])
        kernel.append(kernel_cpu() - cpu_before[1])
    quiet_steps(s)


def med(v):
    return sorted(v)[len(v) // 2] if v else None


def mean(v):
    return sum(v) / len(v) if v else None


# Each rank's means, for rank 0 to report.
means = {"busy_mean": mean(busy), "quiet_mean": mean(quiet)}
with open(os.path.join(os.environ["DRUN_CKPT_DIR"], "means-%d.json.tmp" % rank), "w") as f:
    json.dump(means, f)
os.rename(os.path.join(os.environ["DRUN_CKPT_DIR"], "means-%d.json.tmp" % rank),
          os.path.join(os.environ["DRUN_CKPT_DIR"], "means-%d.json" % rank))
barrier("means")
ranks = []
for r in range(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))):
    try:
        with open(os.path.join(os.environ["DRUN_CKPT_DIR"], "means-%d.json" % r)) as f:
            ranks.append(json.load(f))
    except (OSError, ValueError):
        ranks.append(None)

if rank == 0:
    print(json.dumps({"ranks": ranks,"base": med(base), "ours": med(ours), "first": ours[0], "cpu": med(cpu),
                      "lag": med(lag), "kind": kind, "copy": med(floor),
                      "busy_step": med(busy), "quiet_step": med(quiet),
                      "busy_steps": len(busy), "busy_mean": mean(busy), "quiet_mean": mean(quiet),
                      "early_mean": mean([b for b, e in zip(busy, early) if e]),
                      "late_mean": mean([b for b, e in zip(busy, early) if not e]),
                      "steady_mean": mean([b for b, a in zip(busy, after) if a >= 3]),
                      "lost_per_save": (sum(busy) - len(busy) * mean(quiet)) / saves
                      if busy and quiet else None,
                      "longest_busy": max(busy) if busy else None,
                      "longest_quiet": max(quiet) if quiet else None,
                      "persist_cpu": med(persist_cpu), "kernel_cpu": med(kernel),
                      "load": os.getloadavg()[0]}), flush=True)
if trace is not None:
    trace.close()
# gloo's threads can outlive the interpreter's exit and abort it (pytorch/pytorch#179291): the
# results are printed and flushed, and every save was committed.
sys.stdout.flush()
os._exit(0)
