"""Small but real PyTorch DDP training job (gloo, CPU) used to exercise drun.

Runs unchanged under torchrun or drun, e.g.:

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py
    drun --standalone --nproc-per-node 2 --ckpt-dir ckpt examples/train_ddp.py

It fits an MLP to a deterministic synthetic regression dataset, prints the
all-reduced loss from rank 0, and saves a final checkpoint to <out>/final.pt.

Under drun it also checkpoints every --ckpt-every steps through drun's ledger
and, after any re-form (a node lost or added, a worker restarted), resumes from
the checkpoint drun names, at the same global sample, whatever the new world
size: the data order and the model trajectory are those of a run without
faults. Under torchrun it simply starts fresh.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

try:
    import drun
except ImportError:  # running from a checkout without `pip install .` (or the wheel)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import drun

NUM_SAMPLES = 4096
NUM_FEATURES = 16
DATA_SEED = 1234
MODEL_SEED = 0
LOG_EVERY = 20


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10,
                        help="number of passes over the dataset")
    parser.add_argument("--global-batch", type=int, default=96,
                        help="samples per optimizer step over all ranks (kept across world sizes; "
                             "the world size must divide it: 96 suits 1, 2, 3, 4, 6, 8, 12 and 16 "
                             "ranks)")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="SGD learning rate")
    parser.add_argument("--out", default="checkpoints",
                        help="directory for the final checkpoint")
    parser.add_argument("--ckpt-every", type=int, default=50,
                        help="steps between checkpoints committed to drun (0: never)")
    parser.add_argument("--step-sleep", type=float, default=0.0,
                        help="seconds to sleep per step (to watch elasticity at work)")
    parser.add_argument("--fail-at-step", type=int, default=0,
                        help="demo of recovery: the last rank exits 1 at this step in the first "
                             "generation (DRUN_GENERATION=1)")
    parser.add_argument("--exact-sums", action="store_true",
                        help="average gradients across ranks in float64, so that the model does "
                             "not depend on the order of the sum: a run restarted at 3 ranks or "
                             "more then ends with the fault-free run's model exactly (tests)")
    parser.add_argument("--record-indices", default=None,
                        help="append '<step> <sample indices>' lines per rank to "
                             "<prefix>[.r<SLURM_RESTART_COUNT>].rank<R>.gen<G> (data-order tests)")
    return parser.parse_args()


def make_dataset():
    """Deterministic regression targets from a fixed nonlinear function plus noise."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(NUM_SAMPLES, NUM_FEATURES, generator=gen)
    w = torch.randn(NUM_FEATURES, 1, generator=gen) / NUM_FEATURES ** 0.5
    y = torch.tanh(x @ w) * 2.0 + 0.5 * (x[:, :1] * x[:, 1:2])
    y = y + 0.05 * torch.randn(NUM_SAMPLES, 1, generator=gen)
    return TensorDataset(x, y, torch.arange(NUM_SAMPLES))


def make_model():
    torch.manual_seed(MODEL_SEED)  # identical init on every rank
    return nn.Sequential(
        nn.Linear(NUM_FEATURES, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 1),
    )


def exact_mean(_state, bucket):
    """DDP communication hook: the mean of the ranks' gradients, summed in float64. A float32 sum
    of three or more ranks depends on its order, which changes with DDP's bucket layout (rebuilt
    after a (re)start's first step) and gloo's ring. In float64 the sum of a few float32 values is
    exact (unless their magnitudes lie 2^29 apart, and then the difference is rounded away on the
    way back to float32), so the mean is the same whatever the order."""
    grads = bucket.buffer()
    wide = grads.to(torch.float64)

    def mean(fut):
        return (fut.value()[0] / dist.get_world_size()).to(grads.dtype)

    return dist.all_reduce(wide, async_op=True).get_future().then(mean)


@record
def main():
    args = parse_args()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)

    dist.init_process_group(backend="gloo", init_method="env://")
    rank = dist.get_rank()
    world_size = dist.get_world_size()

    dataset = make_dataset()
    # Same indices as DistributedSampler(shuffle=True, seed=DATA_SEED), but it starts at drun's
    # global cursor and re-splits what remains over the current world size.
    sampler = drun.ElasticSampler(len(dataset), seed=DATA_SEED, global_batch=args.global_batch)
    loader = DataLoader(dataset, batch_size=sampler.local_batch, sampler=sampler,
                        drop_last=True)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    resume = drun.resume_info()  # None under torchrun or before the first checkpoint
    if resume is not None:
        state = torch.load(os.path.join(resume["path"], "rank0.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = resume["step"]
        if rank == 0:
            print(f"resumed at step={step} epoch={sampler.epoch} sample={sampler.start} "
                  f"(saved at world size {resume['world_size']}, now {world_size})", flush=True)
    model = DistributedDataParallel(model)
    if args.exact_sums:
        model.register_comm_hook(None, exact_mean)
    loss_fn = nn.MSELoss()
    record = None
    if args.record_indices:
        gen = os.environ.get("DRUN_GENERATION", "0")
        prefix = args.record_indices
        if os.environ.get("SLURM_RESTART_COUNT"):  # a requeued job numbers generations anew
            prefix += ".r" + os.environ["SLURM_RESTART_COUNT"]
        record = open(f"{prefix}.rank{rank}.gen{gen}", "a")

    first_loss = None
    last_loss = None
    for epoch in range(sampler.epoch, args.epochs):
        sampler.set_epoch(epoch)
        batches = 0  # global batches of this epoch done since the sampler's start
        for x, y, idx in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            batches += 1
            if record is not None:
                record.write(f"{step} {','.join(map(str, idx.tolist()))}\n")
                record.flush()
            drun.progress(step)
            if (args.fail_at_step and step == args.fail_at_step and rank == world_size - 1
                    and os.environ.get("DRUN_GENERATION") == "1"):
                print(f"rank {rank}: simulated failure at step {step}", file=sys.stderr, flush=True)
                sys.exit(1)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            # A preemption warning (drun --on-preempt checkpoint) asks every rank to save now;
            # should_save() agrees across ranks (all_reduce), so all save the same step.
            if drun.available() and args.ckpt_every and (
                    step % args.ckpt_every == 0 or drun.should_save()):
                # Every rank writes its file (the model is replicated; rank 0's is loaded on
                # resume) and commits it with the same global cursor.
                path = drun.shard_path(step)
                drun.atomic_save(path, lambda f: torch.save(
                    {"model": model.module.state_dict(),
                     "optimizer": optimizer.state_dict(), "step": step}, f))
                drun.commit(step, [path], sampler.cursor(batches))

            is_first = first_loss is None
            if is_first or step % LOG_EVERY == 0:
                mean_loss = loss.detach().clone()
                dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
                value = mean_loss.item() / world_size
                if is_first:
                    first_loss = value
                last_loss = value
                if rank == 0:
                    print(f"step={step} epoch={epoch} loss={value:.6f}", flush=True)

    # Final loss: all-reduced mean of the last batch loss, whatever the step.
    if first_loss is not None and step % LOG_EVERY != 0:
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
        last_loss = mean_loss.item() / world_size

    if rank == 0:
        first = float("nan") if first_loss is None else first_loss
        last = float("nan") if last_loss is None else last_loss
        print(f"done steps={step} first_loss={first:.6f} last_loss={last:.6f} "
              f"world_size={world_size}", flush=True)
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "final.pt")
        tmp = path + ".tmp"
        torch.save({"model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step}, tmp)
        os.replace(tmp, path)

    dist.barrier()
    dist.destroy_process_group()
    if record is not None:
        record.close()


if __name__ == "__main__":
    main()
    # Everything is saved and flushed: end here. A torch background thread (gloo's) can outlive
    # the interpreter's own exit and abort it (pytorch/pytorch#179291; drun names it when it
    # happens), which would fail a rank that finished its work.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
