"""``drun --preflight``: measure the job's interconnect, then run the training script.

The agent starts every worker of the run's first generation as
``python -u preflight.py MODE TARGET ARGS...`` (MODE: ``script``, ``module`` or ``run-path``).
Each rank joins a process group of its own — the job's backend (NCCL on GPU, gloo on CPU), on the
worker store under the ``drun-preflight/`` key prefix, so the script's own
``init_process_group`` finds the store untouched — and together they measure:

1. an ``all_reduce`` of a fixed buffer over all ranks (bus bandwidth as nccl-tests defines it:
   ``size / time * 2 (n - 1) / n``);
2. a ring of node-to-node links: local rank 0 of node ``i`` sends to local rank 0 of node
   ``i + 1`` (the last to the first), one link at a time: latency from small ping-pongs,
   bandwidth from a few bulk transfers.

Local rank 0 of every node reports the whole job's results to its agent over the worker API
(``{"op": "preflight", ...}``); the agent judges the links and prints the table. Then the
process destroys the group and runs TARGET in place with ``runpy`` (the interpreter and torch
are already loaded, so the check costs its own time only), with ``sys.argv`` and ``sys.path[0]``
as ``python TARGET`` or ``python -m TARGET`` would set them. Standard library and torch only;
without torch it reports that it skipped and runs the script.

Test hook: ``DRUN_PREFLIGHT_TEST_DELAY=RANK:SECONDS`` makes that rank sleep before each bulk send
of a link it sends on (a slow link, for tests).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

# Buffer sizes in bytes: all_reduce and each bulk link transfer.
_CPU_BYTES = 8 << 20
_GPU_BYTES = 64 << 20
_ALL_REDUCE_ITERS = 5
_LINK_SENDS = 3
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
    size = _GPU_BYTES if cuda else _CPU_BYTES

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
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(x)  # warm-up: connections, buffers
        sync()
        times: List[float] = []
        for _ in range(_ALL_REDUCE_ITERS):
            t = time.perf_counter()
            dist.all_reduce(x)
            sync()
            times.append(time.perf_counter() - t)
        ar_secs = statistics.median(times)

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
        buf = torch.zeros(size // 4, dtype=torch.float32, device=device)
        tiny = torch.zeros(1, dtype=torch.float32, device=device)
        delay = _test_delay(rank)
        for src, dst in ring:
            rs, rd = leaders[src][0], leaders[dst][0]
            if rank == rs:
                for _ in range(_PINGS):
                    dist.recv(tiny, rd)
                    dist.send(tiny, rd)
                for _ in range(_LINK_SENDS):
                    if delay:
                        time.sleep(delay)
                    dist.send(buf, rd)
                sync()
            elif rank == rd:
                rtts: List[float] = []
                for _ in range(_PINGS):
                    t = time.perf_counter()
                    dist.send(tiny, rs)
                    dist.recv(tiny, rs)
                    sync()
                    rtts.append(time.perf_counter() - t)
                t = time.perf_counter()
                for _ in range(_LINK_SENDS):
                    dist.recv(buf, rs)
                sync()
                secs = time.perf_counter() - t
                measured.append({
                    "src": src,
                    "dst": dst,
                    "src_host": leaders[src][1],
                    "dst_host": leaders[dst][1],
                    "gbps": _LINK_SENDS * size * 8 / secs / 1e9,
                    "latency_us": statistics.median(rtts) / 2 * 1e6,
                })
            dist.barrier()
        links: List[Any] = [None] * world  # every rank's measured links
        dist.all_gather_object(links, measured)
    finally:
        dist.destroy_process_group()
    del store
    algbw = size * 8 / ar_secs / 1e9
    return {
        "backend": backend,
        "world_size": world,
        "nodes": len(nodes),
        "all_reduce": {
            "bytes": size,
            "seconds": ar_secs,
            "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (world - 1) / world if world > 1 else algbw,
        },
        "links": sorted((l for per_rank in links for l in per_rank), key=lambda l: l["src"]),
        "seconds": time.monotonic() - started,
    }


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
