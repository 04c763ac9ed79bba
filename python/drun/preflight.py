"""``drun --preflight``: measure the job's interconnect, then run the training script.

The agent starts every worker of the run's first generation as
``python -u preflight.py MODE TARGET ARGS...`` (MODE: ``script``, ``module`` or ``run-path``).
Each rank joins a process group of its own — the job's backend (NCCL on GPU, gloo on CPU), on the
worker store under the ``drun-preflight/`` key prefix, so the script's own
``init_process_group`` finds the store untouched — and together they measure:

1. an ``all_reduce`` over all ranks (bus bandwidth as nccl-tests defines it:
   ``size / time * 2 (n - 1) / n``), its buffer grown from 64 KiB (up to 8 MiB on CPU, 64 MiB
   on GPU) while five runs of the next size fit in its 1.5 s budget;
2. a ring of node-to-node links: local rank 0 of node ``i`` sends to local rank 0 of node
   ``i + 1`` (the last to the first): latency from small ping-pongs, one link at a time; then
   bandwidth with every link sending at once, until it moved 3 largest all_reduce buffers or
   its 1.5 s slot is over, each measured from what it moved. Whatever the links, the check
   measures for under 5 s (``measure_seconds`` in the report; well under 1 s on fast links): a
   slow link is named from what it moved in its slot, not waited for.
3. on every node with 2 ranks or more, an ``all_reduce`` among the node's own ranks (its GPUs,
   over NVLink or PCIe), all nodes at once, in a budget of 1 s: the agent
   names a node under half the median node, or under half what its GPU model reaches.

Local rank 0 of every node reports the whole job's results to its agent over the worker API
(``{"op": "preflight", ...}``); the agent judges the links and prints the table. Then the
process destroys the group and runs TARGET in place with ``runpy`` (the interpreter and torch
are already loaded, so the check costs its own time only), with ``sys.argv`` and ``sys.path[0]``
as ``python TARGET`` or ``python -m TARGET`` would set them. Standard library and torch only;
without torch it reports that it skipped and runs the script.

Test hook: ``DRUN_PREFLIGHT_TEST_DELAY=RANK:SECONDS`` makes that rank wait that long before each
chunk it sends on its ring link (a slow link, for tests).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

# The check measures for a bounded time whatever the links: the all_reduce grows its buffer
# while five runs of the next size would fit in its budget, and every ring link sends for one
# time slot at once, measured from what it moved. A slow link costs its slot, not its transfer.
_MAX_CPU_BYTES = 8 << 20  # largest all_reduce buffer
_MAX_GPU_BYTES = 64 << 20
_FIRST_BYTES = 64 << 10  # first all_reduce buffer and first chunk of a link
_ALL_REDUCE_ITERS = 5
_ALL_REDUCE_BUDGET = 1.5  # seconds for the all_reduce's sizing and timed runs
_WITHIN_BUDGET = 1.0  # ... for the all_reduce within each node
_LINK_SLOT = 1.5  # seconds every link sends for at most
_LINK_SENDS = 3  # ... or until it moved this many largest all_reduce buffers (a fast link)
_MAX_CPU_CHUNK = 1 << 20  # a link's chunks grow while they take under _FAST_CHUNK
_MAX_GPU_CHUNK = 16 << 20
_FAST_CHUNK = 0.02
_PINGS = 10
# Seconds a collective of the check may take before it gives up (a dead peer).
_TIMEOUT = 60


def _env_int(name: str, default: int = 0) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _tell(msg: Dict[str, Any]) -> None:
    """Sends one worker-API request to the agent and waits for its answer."""
    path = os.environ.get("DRUN_AGENT_SOCK")
    if not path:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(path)
            s.sendall(json.dumps(msg).encode() + b"\n")
            s.makefile("rb").readline()
    except OSError as e:
        print("drun preflight: cannot report to the agent: %s" % e, file=sys.stderr)


def _test_delay(rank: int) -> float:
    spec = os.environ.get("DRUN_PREFLIGHT_TEST_DELAY", "")
    who, _, secs = spec.partition(":")
    try:
        return float(secs) if who and int(who) == rank else 0.0
    except ValueError:
        return 0.0


def _measure(rank: int, local_rank: int, world: int, node: int) -> Dict[str, Any]:
    import datetime

    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=_TIMEOUT)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    started = time.monotonic()
    store: dist.Store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    store = dist.PrefixStore("drun-preflight/", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        dist.barrier()  # every rank connected: what follows is measurement
        measuring = time.monotonic()
        ar_bytes, ar_secs = _all_reduce(torch, dist, device, sync, _MAX_GPU_BYTES if cuda else _MAX_CPU_BYTES)

        peers: List[Any] = [None] * world  # (node, local rank, host) of every rank
        dist.all_gather_object(peers, (node, local_rank, socket.gethostname()))
        leaders: Dict[int, Tuple[int, str]] = {}
        for r, (n, lr, host) in enumerate(peers):
            if lr == 0:
                leaders[n] = (r, host)
        nodes = sorted(leaders)
        ring = [(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]
        if len(nodes) < 2:
            ring = []
        measured: List[Dict[str, Any]] = []
        latency: Dict[int, float] = {}
        tiny = torch.zeros(1, dtype=torch.float32, device=device)
        for src, dst in ring:
            rs, rd = leaders[src][0], leaders[dst][0]
            if rank == rs:
                for _ in range(_PINGS):
                    dist.recv(tiny, rd)
                    dist.send(tiny, rd)
                sync()
            elif rank == rd:
                rtts: List[float] = []
                for _ in range(_PINGS):
                    t = time.perf_counter()
                    dist.send(tiny, rs)
                    dist.recv(tiny, rs)
                    sync()
                    rtts.append(time.perf_counter() - t)
                latency[src] = statistics.median(rtts) / 2 * 1e6
            dist.barrier()
        me = next((n for n, (r, _) in leaders.items() if r == rank), None)
        dist.barrier()  # every link's slot starts together
        if ring and me is not None:
            i = nodes.index(me)
            prev, nxt = nodes[i - 1], nodes[(i + 1) % len(nodes)]
            moved, secs = _ring_slot(
                torch,
                dist,
                device,
                sync,
                to_rank=leaders[nxt][0],
                from_rank=leaders[prev][0],
                max_chunk=_MAX_GPU_CHUNK if cuda else _MAX_CPU_CHUNK,
                enough=_LINK_SENDS * (_MAX_GPU_BYTES if cuda else _MAX_CPU_BYTES),
                delay=_test_delay(rank),
            )
            measured.append({
                "src": prev,
                "dst": me,
                "src_host": leaders[prev][1],
                "dst_host": leaders[me][1],
                "gbps": moved * 8 / secs / 1e9,
                "latency_us": latency[prev],
                "bytes": moved,
                "seconds": secs,
            })
        dist.barrier()
        within = _within_node(torch, dist, device, sync, cuda, peers, node, local_rank)
        measure_secs = time.monotonic() - measuring
        links: List[Any] = [None] * world  # every rank's measured links
        dist.all_gather_object(links, measured)
        nodes_within: List[Any] = [None] * world  # every node's own all_reduce (its local rank 0)
        dist.all_gather_object(nodes_within, within)
    finally:
        dist.destroy_process_group()
    del store
    algbw = ar_bytes * 8 / ar_secs / 1e9
    return {
        "backend": backend,
        "world_size": world,
        "nodes": len(nodes),
        "all_reduce": {
            "bytes": ar_bytes,
            "seconds": ar_secs,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (world - 1) / world if world > 1 else algbw,
        },
        "links": sorted((l for per_rank in links for l in per_rank), key=lambda l: l["src"]),
        "within": sorted((w for w in nodes_within if w is not None), key=lambda w: w["node"]),
        "seconds": time.monotonic() - started,
        "measure_seconds": measure_secs,
    }


def _within_node(
    torch: Any,
    dist: Any,
    device: Any,
    sync: Callable[[], None],
    cuda: bool,
    peers: List[Any],
    node: int,
    local_rank: int,
) -> Any:
    """Every node's all_reduce among its own ranks (its GPUs, over NVLink or PCIe), all nodes at
    once: this node's result from its local rank 0, else None. Skipped (None everywhere) unless
    every node has at least 2 ranks: one rank has nothing to reduce with.
    """
    by_node: Dict[int, List[int]] = {}
    for r, (n, _lr, _host) in enumerate(peers):
        by_node.setdefault(n, []).append(r)
    if min(len(r) for r in by_node.values()) < 2:
        return None
    # Every rank creates every group, in the same order (torch's rule for new_group).
    groups = {n: dist.new_group(ranks) for n, ranks in sorted(by_node.items())}
    ranks = len(by_node[node])
    size, secs = _all_reduce(
        torch,
        dist,
        device,
        sync,
        _MAX_GPU_BYTES if cuda else _MAX_CPU_BYTES,
        groups[node],
        _WITHIN_BUDGET,
    )
    dist.barrier()
    if local_rank != 0:
        return None
    algbw = size * 8 / secs / 1e9
    return {
        "node": node,
        "host": socket.gethostname(),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "ranks": ranks,
        "bytes": size,
        "seconds": secs,
        "busbw_gbps": algbw * 2 * (ranks - 1) / ranks,
    }


def _all_reduce(
    torch: Any,
    dist: Any,
    device: Any,
    sync: Callable[[], None],
    max_bytes: int,
    group: Any = None,
    budget: float = _ALL_REDUCE_BUDGET,
) -> Tuple[int, float]:
    """The all_reduce test within its budget: (buffer bytes, median seconds of the timed runs).

    Starts at a small buffer and quadruples it while the slowest rank says five runs of the next
    size fit in what is left of the budget, so a slow link shrinks the buffer, not the budget.
    Over ``group`` (default: all ranks); disjoint groups measure side by side.
    """
    began = time.perf_counter()
    size = _FIRST_BYTES
    x = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(x, group=group)  # warm-up: connections, buffers
    sync()
    while True:
        t = time.perf_counter()
        dist.all_reduce(x, group=group)
        sync()
        slowest = torch.tensor([time.perf_counter() - t], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)  # every rank takes the same decision
        one = float(slowest.item())
        left = budget - (time.perf_counter() - began)
        bigger = min(size * 4, max_bytes)
        if bigger == size or one * bigger / size * (_ALL_REDUCE_ITERS + 1) > left:
            break
        size = bigger
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
    times: List[float] = []
    for _ in range(_ALL_REDUCE_ITERS):
        t = time.perf_counter()
        dist.all_reduce(x, group=group)
        sync()
        times.append(time.perf_counter() - t)
    return size, statistics.median(times)


def _ring_slot(
    torch: Any,
    dist: Any,
    device: Any,
    sync: Callable[[], None],
    to_rank: int,
    from_rank: int,
    max_chunk: int,
    enough: int,
    delay: float,
) -> Tuple[int, float]:
    """Every node's leader sends to the next node and receives from the previous one, all links
    at once, until it sent ``enough`` bytes or its time slot is over: (bytes received, seconds
    until the last chunk arrived).

    Chunks grow while they go fast; the first element of each chunk says how many elements the
    next one has (0: it was the last), so the receiver needs no other message. A thread sends
    while this one receives, so a slow incoming link does not slow the outgoing one (the two
    directions are different peers: gloo pairs, NCCL's per-pair communicators).
    """
    import threading

    most = max_chunk // 4
    sent: List[BaseException] = []
    begin = time.perf_counter()

    def send() -> None:
        size = _FIRST_BYTES // 4  # elements of the chunk to send now
        fast = True  # the previous chunk went out fast: the next may be larger
        total = 0
        try:
            while True:
                if delay:
                    time.sleep(delay)
                total += size * 4
                last = time.perf_counter() - begin >= _LINK_SLOT or total >= enough
                out = torch.ones(size, dtype=torch.float32, device=device)
                following = 0 if last else (min(size * 2, most) if fast else size)
                out[0] = float(following)
                sync()
                t = time.perf_counter()
                dist.send(out, to_rank)
                sync()
                fast = time.perf_counter() - t < _FAST_CHUNK
                if last:
                    return
                size = following
        except BaseException as e:  # re-raised by the receiving thread
            sent.append(e)

    sender = threading.Thread(target=send, name="drun-preflight-send", daemon=True)
    sender.start()
    moved = 0
    arrived = begin
    following = _FIRST_BYTES // 4
    while following:
        inbox = torch.zeros(following, dtype=torch.float32, device=device)
        dist.recv(inbox, from_rank)
        sync()
        arrived = time.perf_counter()
        moved += following * 4
        following = int(inbox[0].item())
    sender.join()
    if sent:
        raise sent[0]
    return moved, max(arrived - begin, 1e-9)


def _preflight() -> None:
    rank = _env_int("RANK")
    local_rank = _env_int("LOCAL_RANK")
    reply: Dict[str, Any] = {"op": "preflight", "rank": rank}
    try:
        import torch.distributed as dist

        if not dist.is_available():
            raise ImportError("torch.distributed is not available in this build")
    except ImportError as e:
        reply["skipped"] = "torch is not importable by %s (%s)" % (sys.executable, e)
    else:
        try:
            reply["report"] = _measure(
                rank, local_rank, _env_int("WORLD_SIZE", 1), _env_int("GROUP_RANK")
            )
        except Exception as e:  # never stands between the user and the script
            reply["error"] = "%s: %s" % (type(e).__name__, e)
    if local_rank == 0 or "error" in reply:
        _tell(reply)


def _hand_over(mode: str, target: str, args: Sequence[str]) -> None:
    """Runs the training script in this process, as ``python [-m] TARGET ARGS`` would."""
    import runpy

    sys.argv = [target] + list(args)
    if mode == "module":
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target)) if mode == "script" else ""
        runpy.run_path(target, run_name="__main__")


def main(argv: List[str]) -> None:
    if len(argv) < 3 or argv[1] not in ("script", "module", "run-path"):
        sys.exit("usage: preflight.py script|module|run-path TARGET [ARGS...]")
    _preflight()
    _hand_over(argv[1], argv[2], argv[3:])


if __name__ == "__main__":
    main(sys.argv)
